"""Images of a real node (harness/backends/local/realnode/images.py): layers and OCI archives built here.

containerd imports these archives by name with no registry behind them, so the archive must be a valid
OCI image layout carrying the name, and the same inputs must give the same bytes (a rebuilt image must
not look like a new one).
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile

import pytest

from harness.backends.commands import Runner
from harness.backends.local.realnode import images
from harness.backends.local.realnode.images import ImageSpec

SPEC = ImageSpec("dra-harness.local/tool:7",
                 files={"/bin/tool": (b"\x7fELF tool", 0o755), "/etc/conf/a.txt": (b"hello\n", 0o640)},
                 links={"/bin/sh": "tool", "/usr/bin/env": "../../bin/tool"},
                 entrypoint=["/bin/tool"], cmd=["--serve"])


def _members(data: bytes) -> dict[str, tuple[tarfile.TarInfo, bytes | None]]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name: (m, tar.extractfile(m).read() if m.isfile() else None) for m in tar.getmembers()}


def _archive(spec: ImageSpec) -> tuple[dict, dict[str, bytes]]:
    """index.json and the blobs (by digest) of an archive; also checks each blob's name is its sha256."""
    members = _members(images.oci_archive(spec))
    blobs = {}
    for name, (_, data) in members.items():
        if name.startswith("blobs/"):
            algorithm, digest = name.split("/")[1:]
            assert algorithm == "sha256"
            assert hashlib.sha256(data).hexdigest() == digest, name
            blobs[f"sha256:{digest}"] = data
    return json.loads(members["index.json"][1]), blobs


# --- oci_archive --------------------------------------------------------------------------------


def test_oci_archive_is_byte_for_byte_deterministic():
    """Same spec, same bytes: containerd then sees the same image (digest) after a rebuild."""
    first = images.oci_archive(SPEC)
    second = images.oci_archive(ImageSpec(SPEC.name, dict(SPEC.files), dict(SPEC.links), list(SPEC.entrypoint),
                                          list(SPEC.cmd)))
    assert first == second
    assert hashlib.sha256(first).digest() == hashlib.sha256(images.oci_archive(SPEC)).digest()


def test_oci_archive_changes_with_content():
    changed = ImageSpec(SPEC.name, {**SPEC.files, "/bin/tool": (b"\x7fELF tool2", 0o755)}, SPEC.links,
                        SPEC.entrypoint, SPEC.cmd)
    assert images.oci_archive(changed) != images.oci_archive(SPEC)


def test_oci_archive_layout_files():
    members = _members(images.oci_archive(SPEC))
    names = list(members)
    assert names[:2] == ["oci-layout", "index.json"]
    assert len(names) == 5 and all(n.startswith("blobs/sha256/") for n in names[2:])
    assert json.loads(members["oci-layout"][1]) == {"imageLayoutVersion": "1.0.0"}
    for info, _ in members.values():
        assert (info.mtime, info.uid, info.gid, info.mode) == (0, 0, 0, 0o644)


def test_oci_archive_index_names_the_image():
    """`ctr images import` names the image after io.containerd.image.name; the ref name is the tag."""
    index, blobs = _archive(SPEC)
    assert index["schemaVersion"] == 2
    [entry] = index["manifests"]
    assert entry["mediaType"] == images.MANIFEST_TYPE
    assert entry["annotations"] == {"io.containerd.image.name": "dra-harness.local/tool:7",
                                    "org.opencontainers.image.ref.name": "7"}
    assert entry["platform"] == {"architecture": "amd64", "os": "linux"}
    assert entry["size"] == len(blobs[entry["digest"]])


def test_oci_archive_manifest_and_config():
    index, blobs = _archive(SPEC)
    manifest = json.loads(blobs[index["manifests"][0]["digest"]])
    assert manifest["schemaVersion"] == 2
    assert manifest["mediaType"] == images.MANIFEST_TYPE
    assert manifest["config"]["mediaType"] == images.CONFIG_TYPE
    assert manifest["config"]["size"] == len(blobs[manifest["config"]["digest"]])
    [layer] = manifest["layers"]
    assert layer["mediaType"] == images.LAYER_TYPE
    assert layer["size"] == len(blobs[layer["digest"]])
    assert blobs[layer["digest"]] == images.layer_bytes(SPEC)
    assert set(blobs) == {index["manifests"][0]["digest"], manifest["config"]["digest"], layer["digest"]}

    config = json.loads(blobs[manifest["config"]["digest"]])
    # An uncompressed layer: its diff id is its digest.
    assert config["rootfs"] == {"type": "layers", "diff_ids": [layer["digest"]]}
    assert config["config"] == {"Env": ["PATH=/bin"], "Entrypoint": ["/bin/tool"], "Cmd": ["--serve"]}
    assert (config["architecture"], config["os"]) == ("amd64", "linux")


def test_oci_archive_empty_entrypoint_and_cmd_are_null():
    """An empty list would override the image default with nothing; null means 'not set'."""
    index, blobs = _archive(ImageSpec("r.local/x:1"))
    manifest = json.loads(blobs[index["manifests"][0]["digest"]])
    config = json.loads(blobs[manifest["config"]["digest"]])
    assert config["config"] == {"Env": ["PATH=/bin"], "Entrypoint": None, "Cmd": None}


# --- layer_bytes ---------------------------------------------------------------------------------


def test_layer_contents_and_order():
    """Directories first (parents before children), then files, then links, each sorted."""
    members = _members(images.layer_bytes(SPEC))
    assert list(members) == ["bin", "dev", "etc", "etc/conf", "proc", "sys", "tmp", "usr", "usr/bin",
                             "bin/tool", "etc/conf/a.txt", "bin/sh", "usr/bin/env"]
    assert members["bin/tool"][1] == b"\x7fELF tool"
    assert members["etc/conf/a.txt"][1] == b"hello\n"


def test_layer_modes_and_link_targets():
    members = _members(images.layer_bytes(SPEC))
    kinds = {name: (info.type, info.mode, info.linkname) for name, (info, _) in members.items()}
    assert kinds["tmp"] == (tarfile.DIRTYPE, 0o1777, "")
    for directory in ("bin", "dev", "etc", "etc/conf", "proc", "sys", "usr", "usr/bin"):
        assert kinds[directory] == (tarfile.DIRTYPE, 0o755, ""), directory
    assert kinds["bin/tool"] == (tarfile.REGTYPE, 0o755, "")
    assert kinds["etc/conf/a.txt"] == (tarfile.REGTYPE, 0o640, "")
    assert kinds["bin/sh"] == (tarfile.SYMTYPE, 0o777, "tool")
    assert kinds["usr/bin/env"] == (tarfile.SYMTYPE, 0o777, "../../bin/tool")


def test_layer_metadata_is_fixed():
    """mtime 0 and root ownership everywhere, whoever builds the image and when."""
    for name, (info, _) in _members(images.layer_bytes(SPEC)).items():
        assert (info.mtime, info.uid, info.gid, info.uname, info.gname) == (0, 0, 0, "root", "root"), name
    assert images.layer_bytes(SPEC) == images.layer_bytes(SPEC)


def test_layer_of_empty_spec_has_the_base_directories():
    assert list(_members(images.layer_bytes(ImageSpec("r.local/x:1")))) == ["dev", "etc", "proc", "sys", "tmp"]


# --- is_static, busybox, specs ------------------------------------------------------------------


def test_is_static(tmp_path):
    static = tmp_path / "static"
    static.write_bytes(b"\x7fELF\x02\x01\x01" + b"\0" * 200 + b"busybox")
    dynamic = tmp_path / "dynamic"
    dynamic.write_bytes(b"\x7fELF\x02\x01\x01" + b"\0" * 100 + b"/lib64/ld-linux-x86-64.so.2\0")
    dynamic_arm = tmp_path / "dynamic-arm"
    dynamic_arm.write_bytes(b"\x7fELF\x02\x01\x01" + b"\0" * 100 + b"/lib/ld-linux-aarch64.so.1\0")
    script = tmp_path / "script"
    script.write_bytes(b"#!/bin/sh\necho hi\n")
    assert images.is_static(static) is True
    assert images.is_static(dynamic) is False
    assert images.is_static(dynamic_arm) is False
    assert images.is_static(script) is False
    assert images.is_static(tmp_path / "absent") is False
    assert images.is_static(tmp_path) is False  # a directory: read_bytes fails


def test_find_busybox_takes_the_first_static_candidate(tmp_path):
    dynamic = tmp_path / "a"
    dynamic.write_bytes(b"\x7fELF" + b"/lib64/ld-linux-x86-64.so.2")
    static = tmp_path / "b"
    static.write_bytes(b"\x7fELF" + b"\0" * 64)
    assert images.find_busybox((str(tmp_path / "missing"), str(dynamic), str(static))) == static
    assert images.find_busybox((str(dynamic),)) is None


def test_busybox_applets_parses_the_list(tmp_path):
    """`busybox --list` prints one applet a line; the busybox name itself and paths are dropped."""
    calls = []

    def run(argv, **kwargs):
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 0, stdout="sh\nbusybox\n[\n[[\n  env \n/bin/x\ncat\nsh\n", stderr="")

    assert images.busybox_applets(tmp_path / "bb", Runner(run=run)) == ["[", "[[", "cat", "env", "sh"]
    assert calls == [[str(tmp_path / "bb"), "--list"]]


def _lists(*applets: str) -> Runner:
    """A Runner whose `busybox --list` prints `applets`."""
    return Runner(run=lambda argv, **kw: subprocess.CompletedProcess(argv, 0, stdout="\n".join(applets), stderr=""))


def test_shell_spec_links_every_applet_to_busybox(tmp_path):
    busybox = tmp_path / "busybox"
    busybox.write_bytes(b"\x7fELF fake busybox")
    spec = images.shell_spec(busybox, _lists("sh", "env"))
    assert spec.name == images.SHELL_IMAGE == "dra-harness.local/shell:1"
    assert spec.files == {"/bin/busybox": (b"\x7fELF fake busybox", 0o755)}
    assert spec.links == {"/bin/sh": "busybox", "/bin/env": "busybox"}
    assert spec.cmd == ["/bin/sh"]
    assert spec.entrypoint == []
    members = _members(images.layer_bytes(spec))
    assert members["bin/sh"][0].linkname == "busybox"
    assert members["bin/env"][0].linkname == "busybox"


def test_pause_spec(tmp_path):
    pause = tmp_path / "pause"
    pause.write_bytes(b"\x7fELF pause")
    spec = images.pause_spec(pause)
    assert spec.name == images.PAUSE_IMAGE == "dra-harness.local/pause:1"
    assert spec.files == {"/pause": (b"\x7fELF pause", 0o755)}
    assert (spec.entrypoint, spec.cmd, spec.links) == (["/pause"], [], {})


def test_write_archives(tmp_path):
    """One archive per image, named after it, written atomically (no .tmp left behind)."""
    pause = tmp_path / "pause"
    pause.write_bytes(b"\x7fELF pause")
    busybox = tmp_path / "busybox"
    busybox.write_bytes(b"\x7fELF busybox")
    out = tmp_path / "images"
    result = images.write_archives(out, pause, busybox, _lists("sh"))
    assert result == {images.PAUSE_IMAGE: out / "pause-1.oci.tar", images.SHELL_IMAGE: out / "shell-1.oci.tar"}
    assert sorted(p.name for p in out.iterdir()) == ["pause-1.oci.tar", "shell-1.oci.tar"]
    assert result[images.PAUSE_IMAGE].read_bytes() == images.oci_archive(images.pause_spec(pause))
    assert result[images.SHELL_IMAGE].read_bytes() == images.oci_archive(images.shell_spec(busybox, _lists("sh")))


def test_build_pause_without_go(tmp_path):
    with pytest.raises(images.HarnessError, match="`go` is not on PATH"):
        images.build_pause(tmp_path / "pause", Runner(which=lambda name: None))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(images.find_busybox() is None, reason="no statically linked busybox on this machine "
                                                           "(Debian: apt-get install busybox-static)")
def test_shell_image_from_the_real_busybox():
    """The machine's static busybox has the applets tests use, and its image is reproducible."""
    busybox = images.find_busybox()
    assert images.is_static(busybox)
    spec = images.shell_spec(busybox)
    assert {"/bin/sh", "/bin/env", "/bin/cat"} <= set(spec.links)
    assert set(spec.links.values()) == {"busybox"}
    assert "/bin/busybox" not in spec.links
    assert images.oci_archive(spec) == images.oci_archive(images.shell_spec(busybox))
