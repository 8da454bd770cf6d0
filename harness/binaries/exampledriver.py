"""The reference third-party driver: dra-example-driver's kubelet plugin, built from the Go module proxy.

`go install sigs.k8s.io/dra-example-driver/cmd/dra-example-kubeletplugin@v0.4.0` is refused (the module
has replace directives), so the module is downloaded at its version (`go mod download`) and the
command built inside it with the module's own go.sum (-mod=readonly: nothing is re-resolved). The
binary is cached like the other binaries: a versioned directory with a checksummed manifest, filled
under a file lock, so a second `make` verifies it and builds nothing. A cold build compiles ~700
packages (about 2 minutes on two cores), with progress.
"""

from __future__ import annotations

import sys
from pathlib import Path

from harness.binaries import gobuild
from harness.binaries.gotool import CachedGoBinary
from harness.core.errors import HarnessError
from harness.core.progress import Reporter

MODULE = "sigs.k8s.io/dra-example-driver"
VERSION = "0.4.0"
PACKAGE = "./cmd/dra-example-kubeletplugin"
BINARY = "dra-example-kubeletplugin"
GROUP = "dra-example-driver"


def _build_in_module(work: Path, output: Path, reporter: Reporter) -> None:
    with reporter.step(f"downloading {MODULE}@v{VERSION} from the Go module proxy"):
        info = gobuild.download_module(f"{MODULE}@v{VERSION}", work)
    # the module cache is read-only: the module's go.sum must be complete as published
    gobuild.run_go_build([PACKAGE], ["-ldflags", "-s -w", "-o", str(output)], Path(info["Dir"]), work, reporter,
                         f"compiling {BINARY} v{VERSION}", extra_env={"GOFLAGS": "-mod=readonly -buildvcs=false"})


EXAMPLE_DRIVER = CachedGoBinary(group=GROUP, version=VERSION, binary=BINARY, space_needed=256 << 20,
                                build=_build_in_module)


def cache_dir() -> Path:
    """`{binaryCache}/dra-example-driver-v<version>_{platform}` in a vendor file's command."""
    return EXAMPLE_DRIVER.cache_dir()


def locate() -> Path | None:
    """The verified cached binary, or None when it is not built (nothing is built here)."""
    return EXAMPLE_DRIVER.locate()


def ensure(reporter: Reporter | None = None) -> Path:
    """The cached binary, built first if it is missing or fails verification."""
    return EXAMPLE_DRIVER.ensure(reporter)


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
