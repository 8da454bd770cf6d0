"""The reference third-party driver: dra-example-driver's kubelet plugin, built from the Go module proxy.

`go install sigs.k8s.io/dra-example-driver/cmd/dra-example-kubeletplugin@v0.4.0` is refused (the module
has replace directives), so the module is downloaded at its version (`go mod download`) and the
command built inside it with the module's own go.sum (-mod=readonly: nothing is re-resolved). The
binary is cached like the other binaries: a versioned directory with a checksummed manifest, filled
under a file lock, so a second `make` verifies it and builds nothing. A cold build compiles ~700
packages (about 2 minutes on two cores), with progress.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

from harness.binaries import cache_error, gobuild, host_platform, manifest, require_writable
from harness.core import paths
from harness.core.errors import BinariesError, HarnessError
from harness.core.progress import Reporter

MODULE = "sigs.k8s.io/dra-example-driver"
VERSION = "0.4.0"
PACKAGE = "./cmd/dra-example-kubeletplugin"
BINARY = "dra-example-kubeletplugin"
GROUP = "dra-example-driver"
SPACE_NEEDED = 256 << 20


def cache_dir(version: str = VERSION) -> Path:
    """`{binaryCache}/dra-example-driver-v<version>_{platform}` in a vendor file's command."""
    os_name, arch = host_platform()
    return paths.cache_root() / "binaries" / f"{GROUP}-v{version}_{os_name}-{arch}"


def locate(version: str = VERSION) -> Path | None:
    """The verified cached binary, or None when it is not built (nothing is built here)."""
    target = cache_dir(version)
    return target / BINARY if manifest.group_ok(target, manifest.load(target), GROUP, version) else None


def ensure(reporter: Reporter | None = None, version: str = VERSION) -> Path:
    """The cached binary, built first if it is missing or fails verification."""
    reporter = reporter or Reporter(quiet=True)
    target = cache_dir(version)
    if locate(version) is not None:
        return target / BINARY  # complete and verified: no lock needed
    try:
        target.mkdir(parents=True, exist_ok=True)
        with manifest.locked(target):
            recorded = manifest.load(target)
            if manifest.group_ok(target, recorded, GROUP, version):  # another process built it meanwhile
                return target / BINARY
            gobuild.require_go()
            require_writable(target, SPACE_NEEDED, f"{GROUP} v{version}")
            work = paths.cache_root() / "build" / f"{GROUP}-v{version}"
            work.mkdir(parents=True, exist_ok=True)
            with reporter.step(f"downloading {MODULE}@v{version} from the Go module proxy"):
                info = gobuild.download_module(f"{MODULE}@v{version}", work)
            module_dir = Path(info["Dir"])
            out = Path(tempfile.mkdtemp(dir=work, prefix="out-"))
            try:
                # the module cache is read-only: the module's go.sum must be complete as published
                gobuild.run_go_build([PACKAGE], ["-ldflags", "-s -w", "-o", str(out / BINARY)], module_dir, work,
                                     reporter, f"compiling {BINARY} v{version}",
                                     extra_env={"GOFLAGS": "-mod=readonly -buildvcs=false"})
                manifest.install_file(out / BINARY, target / BINARY)
            finally:
                shutil.rmtree(out, ignore_errors=True)
            manifest.record(target, recorded, GROUP, version, (BINARY,), "build")
    except OSError as err:
        raise cache_error(target, err) from None
    if locate(version) is None:
        raise BinariesError(f"{BINARY} v{version} was built but fails verification in {target}")
    return target / BINARY


def main() -> int:
    """`python -m harness.binaries.exampledriver` (make example-driver): build it now, or verify the cached
    binary (only this one file, so a second `make` takes well under a second)."""
    try:
        print(ensure(Reporter()))
    except HarnessError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
