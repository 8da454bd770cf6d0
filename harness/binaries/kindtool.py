"""kind itself, built from the Go module proxy into the cache when the machine has none on PATH.

kind has no replace directives, so `go install sigs.k8s.io/kind@v<version>` works (GOBIN pointed at a
temporary directory, the binary then moved into a versioned cache directory with a checksummed
manifest, like every other binary). The kind backend uses kind from PATH when there is one (a user's
or a CI runner's own kind) and this cached build otherwise; `binaries install --kind` builds it ahead.
"""

from __future__ import annotations

from pathlib import Path

from harness.binaries import gobuild
from harness.binaries.gotool import CachedGoBinary
from harness.core.progress import Reporter

MODULE = "sigs.k8s.io/kind"
VERSION = "0.33.0"  # the first release with Kubernetes 1.37 node images (backends.kind.preflight.KIND_MIN_VERSION)
BINARY = "kind"


def _go_install(work: Path, output: Path, reporter: Reporter) -> None:
    # kind has no replace directives: `go install module@version`, its GOBIN the output's directory
    gobuild.run_go_build([f"{MODULE}@v{VERSION}"], ["-ldflags", "-s -w"], work, work, reporter,
                         f"compiling kind v{VERSION}", verb="install", extra_env={"GOBIN": str(output.parent)})


# ~1 min of CPU; most of the wall time is downloading its modules
KIND = CachedGoBinary(group="kind", version=VERSION, binary=BINARY, space_needed=64 << 20, build=_go_install)


def cache_dir() -> Path:
    return KIND.cache_dir()


def locate() -> Path | None:
    """The verified cached kind, or None (nothing is built here)."""
    return KIND.locate()


def ensure(reporter: Reporter | None = None) -> Path:
    """The cached kind, built first when missing or failing verification."""
    return KIND.ensure(reporter)
