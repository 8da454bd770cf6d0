"""The container runtime of a real node: containerd built from the Go module proxy, runc and the CNI
plugins from the machine (Debian packages), and the images it runs (built here, see realnode.images).

containerd 2.x is needed, not Debian's 1.6: the 1.37 kubelet uses the CRI `RuntimeConfig` call and
DRA needs CDI, which containerd 1.x lacks. It is a plain `go install` of three commands (no replace
directives), cached like the Kubernetes binaries in a directory named after the version.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.backends.local.realnode import images
from harness.binaries import cache_error, gobuild, host_platform, manifest
from harness.core import paths
from harness.core.errors import BinariesError
from harness.core.progress import Reporter

CONTAINERD_VERSION = "2.4.2"
CONTAINERD_MODULE = "github.com/containerd/containerd/v2"
CONTAINERD_BINARIES = ("containerd", "containerd-shim-runc-v2", "ctr")
# Storage drivers this node never uses; leaving them out avoids their C headers and kernel checks.
CONTAINERD_TAGS = "no_btrfs no_devmapper no_zfs"
PAUSE_BINARY = "pause"
GROUP = "containerd"
PAUSE_GROUP = "pause"

RUNC_CANDIDATES = ("/usr/sbin/runc", "/usr/bin/runc", "/usr/local/sbin/runc", "/usr/local/bin/runc")
CNI_DIR_CANDIDATES = ("/usr/lib/cni", "/opt/cni/bin", "/usr/libexec/cni")
CNI_PLUGINS = ("bridge", "host-local", "loopback")
DEBIAN_PACKAGES = "runc containernetworking-plugins busybox-static"


@dataclass(frozen=True)
class NodeRuntime:
    directory: Path  # containerd, containerd-shim-runc-v2, ctr, pause
    runc: Path
    cni_dir: Path
    busybox: Path

    def path(self, name: str) -> Path:
        return self.directory / name


def cache_dir(version: str = CONTAINERD_VERSION) -> Path:
    os_name, arch = host_platform()
    return paths.cache_root() / "binaries" / f"containerd-v{version}_{os_name}-{arch}"


# What find_host_tools() found of runc, the CNI plugin directory and a static busybox (None: not found).
HostTools = tuple[Path | None, Path | None, Path | None]


def find_runc(which: Callable[[str], str | None] = shutil.which,
              candidates: Sequence[str] = RUNC_CANDIDATES) -> Path | None:
    found = which("runc")
    on_path = [found] if found else []
    return next((Path(c) for c in [*on_path, *candidates] if c and Path(c).is_file()), None)


def find_cni_dir(candidates: Sequence[str] = CNI_DIR_CANDIDATES) -> Path | None:
    for candidate in candidates:
        if all((Path(candidate) / plugin).is_file() for plugin in CNI_PLUGINS):
            return Path(candidate)
    return None


def find_host_tools() -> HostTools:
    """Look for what the machine must provide (not built here)."""
    return find_runc(), find_cni_dir(), images.find_busybox()


def host_tools_missing(runc: Path | None, cni_dir: Path | None, busybox: Path | None) -> list[str]:
    """What of the machine's tools was not found (see find_host_tools), each with how to get it; empty
    when complete. Decided from what was found, so the real-node preflight and ensure() say the same."""
    missing = []
    if runc is None:
        missing.append("runc (the OCI runtime containerd starts containers with)")
    if cni_dir is None:
        missing.append(f"CNI plugins {', '.join(CNI_PLUGINS)} (in one of {', '.join(CNI_DIR_CANDIDATES)})")
    if busybox is None:
        missing.append("a statically linked busybox (the test image's shell)")
    return missing


def ensure_built(reporter: Reporter | None = None, version: str = CONTAINERD_VERSION) -> Path:
    """containerd, its shim, ctr and pause, built once into the cache; needs none of the host's tools
    (the kind node image takes them from here and runc and the CNI plugins from its own Debian packages)."""
    reporter = reporter or Reporter(quiet=True)
    target = cache_dir(version)
    try:
        target.mkdir(parents=True, exist_ok=True)
        with manifest.locked(target):
            recorded = manifest.load(target)
            if not manifest.group_ok(target, recorded, GROUP, version):
                gobuild.require_go()
                work = paths.cache_root() / "build" / f"containerd-v{version}"
                work.mkdir(parents=True, exist_ok=True)
                out = Path(tempfile.mkdtemp(dir=work, prefix="out-"))
                try:
                    packages = [f"{CONTAINERD_MODULE}/cmd/{name}@v{version}" for name in CONTAINERD_BINARIES]
                    # The shim and containerd use cgo only for optional features; static pure-Go builds
                    # run anywhere.
                    gobuild.run_go_build(packages, ["-tags", CONTAINERD_TAGS, "-ldflags", "-s -w"], work, work,
                                         reporter, f"compiling containerd v{version}", verb="install",
                                         extra_env={"GOBIN": str(out)})
                    for name in CONTAINERD_BINARIES:
                        manifest.install_file(out / name, target / name)
                finally:
                    shutil.rmtree(out, ignore_errors=True)
                recorded = manifest.record(target, recorded, GROUP, version, CONTAINERD_BINARIES, "build")
            if not manifest.group_ok(target, recorded, PAUSE_GROUP, images.RECIPE):
                with reporter.step("building the pause binary"):
                    built = images.build_pause(target / (PAUSE_BINARY + ".new"))
                    built.replace(target / PAUSE_BINARY)
                recorded = manifest.record(target, recorded, PAUSE_GROUP, images.RECIPE, (PAUSE_BINARY,), "build")
    except OSError as err:
        raise cache_error(target, err) from None
    return target


def ensure(reporter: Reporter | None = None, version: str = CONTAINERD_VERSION,
           find_tools: Callable[[], HostTools] = find_host_tools) -> NodeRuntime:
    """Build (once) and return the node runtime; host tools must already be installed (`find_tools`
    looks for them, before the build and again after it)."""
    missing = host_tools_missing(*find_tools())
    if missing:
        raise BinariesError("a real node needs tools this machine lacks: " + "; ".join(missing),
                            hint=f"on Debian/Ubuntu: apt-get install {DEBIAN_PACKAGES}")
    target = ensure_built(reporter, version)
    runc, cni_dir, busybox = find_tools()
    if runc is None or cni_dir is None or busybox is None:  # found above, gone while containerd was built
        raise BinariesError("a real node needs tools this machine lacks: "
                            + "; ".join(host_tools_missing(runc, cni_dir, busybox)),
                            hint=f"on Debian/Ubuntu: apt-get install {DEBIAN_PACKAGES}")
    return NodeRuntime(target, runc, cni_dir, busybox)
