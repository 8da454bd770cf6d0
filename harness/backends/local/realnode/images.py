"""Container images for the real node, built here because there is no registry to pull from.

Each image is one uncompressed layer in an OCI image-layout archive, built byte-for-byte the same
from the same inputs (fixed mtimes and owners), and imported into containerd's `k8s.io` namespace.
Pods reference them by name with `imagePullPolicy: Never`.

- pause: the sandbox image, our own small static Go program (`pause.go` beside this file).
- shell: Debian's statically linked busybox with a link per applet, so tests have `sh`, `env`, `cat`.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from harness.backends.commands import Runner
from harness.core.errors import HarnessError
from harness.k8s.nodes import IMAGE_RECIPE, IMAGE_REGISTRY, PAUSE_IMAGE, SHELL_IMAGE  # noqa: F401

# the names live where the suite may read them too (harness.k8s.nodes)
REGISTRY, RECIPE = IMAGE_REGISTRY, IMAGE_RECIPE
BUSYBOX_CANDIDATES = ("/bin/busybox", "/usr/bin/busybox")

MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar"
NAME_ANNOTATION = "io.containerd.image.name"  # what `ctr images import` names the image after
REF_ANNOTATION = "org.opencontainers.image.ref.name"


@dataclass
class ImageSpec:
    name: str
    files: dict[str, tuple[bytes, int]] = field(default_factory=dict)  # path -> (content, mode)
    links: dict[str, str] = field(default_factory=dict)  # path -> symlink target
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    env: list[str] = field(default_factory=lambda: ["PATH=/bin"])


def _add(tar: tarfile.TarFile, info: tarfile.TarInfo, data: bytes | None = None) -> None:
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "root", "root"
    tar.addfile(info, io.BytesIO(data) if data is not None else None)


def layer_bytes(spec: ImageSpec) -> bytes:
    """The image's single layer: directories, files and links in sorted order, fixed metadata."""
    directories = {"tmp", "etc", "proc", "sys", "dev"}
    for path in [*spec.files, *spec.links]:
        parts = path.strip("/").split("/")[:-1]
        directories.update("/".join(parts[:i + 1]) for i in range(len(parts)))
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for directory in sorted(directories):
            info = tarfile.TarInfo(directory)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if directory == "tmp" else 0o755
            _add(tar, info)
        for path in sorted(spec.files):
            content, mode = spec.files[path]
            info = tarfile.TarInfo(path.strip("/"))
            info.size, info.mode = len(content), mode
            _add(tar, info, content)
        for path in sorted(spec.links):
            info = tarfile.TarInfo(path.strip("/"))
            info.type, info.linkname, info.mode = tarfile.SYMTYPE, spec.links[path], 0o777
            _add(tar, info)
    return buffer.getvalue()


def _blob(data: bytes) -> tuple[str, bytes]:
    return "sha256:" + hashlib.sha256(data).hexdigest(), data


def oci_archive(spec: ImageSpec) -> bytes:
    """An OCI image-layout tar holding `spec` under its name."""
    layer_digest, layer = _blob(layer_bytes(spec))
    config = {"architecture": "amd64", "os": "linux",
              "config": {"Env": spec.env, "Entrypoint": spec.entrypoint or None, "Cmd": spec.cmd or None},
              "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
              "history": [{"created_by": "dra-harness image builder", "comment": spec.name}]}
    config_digest, config_data = _blob(json.dumps(config, sort_keys=True).encode())
    manifest = {"schemaVersion": 2, "mediaType": MANIFEST_TYPE,
                "config": {"mediaType": CONFIG_TYPE, "digest": config_digest, "size": len(config_data)},
                "layers": [{"mediaType": LAYER_TYPE, "digest": layer_digest, "size": len(layer)}]}
    manifest_digest, manifest_data = _blob(json.dumps(manifest, sort_keys=True).encode())
    tag = spec.name.rsplit(":", 1)[1]
    index = {"schemaVersion": 2, "manifests": [
        {"mediaType": MANIFEST_TYPE, "digest": manifest_digest, "size": len(manifest_data),
         "platform": {"architecture": "amd64", "os": "linux"},
         "annotations": {NAME_ANNOTATION: spec.name, REF_ANNOTATION: tag}}]}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path, data in (("oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode()),
                           ("index.json", json.dumps(index, sort_keys=True).encode()),
                           *((f"blobs/sha256/{d.split(':')[1]}", b) for d, b in
                             ((layer_digest, layer), (config_digest, config_data),
                              (manifest_digest, manifest_data)))):
            info = tarfile.TarInfo(path)
            info.size, info.mode = len(data), 0o644
            _add(tar, info, data)
    return buffer.getvalue()


def find_busybox(candidates: Sequence[str] = BUSYBOX_CANDIDATES) -> Path | None:
    """The first statically linked busybox of `candidates` (a dynamic one cannot run in the image)."""
    for candidate in candidates:
        path = Path(candidate)
        if path.is_file() and is_static(path):
            return path
    return None


def is_static(path: Path) -> bool:
    """True for an ELF file without a program interpreter (a static binary runs in an empty image)."""
    try:
        data = path.read_bytes()[:4096]
    except OSError:
        return False
    return data[:4] == b"\x7fELF" and b"/lib64/ld-linux" not in data and b"/lib/ld-linux" not in data


def busybox_applets(busybox: Path, runner: Runner | None = None) -> list[str]:
    out = (runner or Runner()).query([busybox, "--list"], timeout=30).stdout
    return sorted({a.strip() for a in out.split() if a.strip() and "/" not in a and a.strip() != "busybox"})


def shell_spec(busybox: Path, runner: Runner | None = None) -> ImageSpec:
    links = {f"/bin/{applet}": "busybox" for applet in busybox_applets(busybox, runner)}
    return ImageSpec(SHELL_IMAGE, files={"/bin/busybox": (busybox.read_bytes(), 0o755)}, links=links,
                     cmd=["/bin/sh"])


def pause_spec(pause_binary: Path) -> ImageSpec:
    return ImageSpec(PAUSE_IMAGE, files={"/pause": (pause_binary.read_bytes(), 0o755)}, entrypoint=["/pause"])


def build_pause(out: Path, runner: Runner | None = None) -> Path:
    """Compile pause.go into a static binary at `out` (Go is already required for the other binaries)."""
    runner = runner or Runner()
    if not runner.which("go"):
        raise HarnessError("`go` is not on PATH: it builds the node's pause image",
                           hint="install Go >= 1.22 (the Kubernetes binaries need it too)")
    source = Path(__file__).with_name("pause.go")
    work = out.parent / "pause-build"
    work.mkdir(parents=True, exist_ok=True)
    shutil.copy(source, work / "main.go")
    (work / "go.mod").write_text("module dra-harness.local/pause\n\ngo 1.22\n")
    env = {"CGO_ENABLED": "0", "GOFLAGS": "-trimpath -buildvcs=false", "GO111MODULE": "on"}
    proc = runner.query(["go", "build", "-ldflags=-s -w", "-o", str(out), "."], cwd=work, env={**os.environ, **env},
                        timeout=600)
    shutil.rmtree(work, ignore_errors=True)
    if proc.returncode != 0:
        raise HarnessError(f"building the pause binary failed: {proc.stderr.strip()[-500:]}")
    return out


def write_archives(directory: Path, pause_binary: Path, busybox: Path, runner: Runner | None = None) -> dict[str, Path]:
    """Write both image archives into `directory`; returns image name -> archive path."""
    directory.mkdir(parents=True, exist_ok=True)
    result = {}
    for spec in (pause_spec(pause_binary), shell_spec(busybox, runner)):
        path = directory / (spec.name.split("/", 1)[1].replace(":", "-") + ".oci.tar")
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(oci_archive(spec))
        tmp.replace(path)
        result[spec.name] = path
    return result
