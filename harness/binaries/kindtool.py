"""kind itself, built from the Go module proxy into the cache when the machine has none on PATH.

kind has no replace directives, so `go install sigs.k8s.io/kind@v<version>` works (GOBIN pointed at a
temporary directory, the binary then moved into a versioned cache directory with a checksummed
manifest, like every other binary). The kind backend uses kind from PATH when there is one (a user's
or a CI runner's own kind) and this cached build otherwise; `binaries install --kind` builds it ahead.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from harness.binaries import cache_error, gobuild, host_platform, manifest, require_writable
from harness.core import paths
from harness.core.progress import Reporter

MODULE = "sigs.k8s.io/kind"
VERSION = "0.33.0"  # the first release with Kubernetes 1.37 node images (harness.backends.kind.KIND_MIN_VERSION)
BINARY = "kind"
GROUP = "kind"
SPACE_NEEDED = 64 << 20


def cache_dir(version: str = VERSION) -> Path:
    os_name, arch = host_platform()
    return paths.cache_root() / "binaries" / f"kind-v{version}_{os_name}-{arch}"


def locate(version: str = VERSION) -> Path | None:
    """The verified cached kind, or None (nothing is built here)."""
    target = cache_dir(version)
    return target / BINARY if manifest.group_ok(target, manifest.load(target), GROUP, version) else None


def ensure(reporter: Reporter | None = None, version: str = VERSION) -> Path:
    """The cached kind, built first when missing or failing verification (~1 min of CPU, most of the
    wall time is downloading its modules)."""
    reporter = reporter or Reporter(quiet=True)
    target = cache_dir(version)
    found = locate(version)
    if found is not None:
        return found
    try:
        target.mkdir(parents=True, exist_ok=True)
        with manifest.locked(target):
            recorded = manifest.load(target)
            if not manifest.group_ok(target, recorded, GROUP, version):  # not built by another process meanwhile
                gobuild.require_go()
                require_writable(target, SPACE_NEEDED, f"kind v{version}")
                work = paths.cache_root() / "build" / f"kind-v{version}"
                work.mkdir(parents=True, exist_ok=True)
                out = Path(tempfile.mkdtemp(dir=work, prefix="out-"))
                try:
                    gobuild.run_go_build([f"{MODULE}@v{version}"], ["-ldflags", "-s -w"], work, work, reporter,
                                         f"compiling kind v{version}", verb="install", extra_env={"GOBIN": str(out)})
                    manifest.install_file(out / BINARY, target / BINARY)
                finally:
                    shutil.rmtree(out, ignore_errors=True)
                manifest.record(target, recorded, GROUP, version, (BINARY,), "build")
    except OSError as err:
        raise cache_error(target, err) from None
    return target / BINARY
