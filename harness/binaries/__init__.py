"""Kubernetes, etcd and KWOK binaries: which versions, where they are cached, how they are provided.

`ensure()` is the one entry point: it returns a verified BinarySet, building or downloading only what
is missing or corrupt. Sources: `gobuild` (the Go module proxy, works offline from release sites),
`download` (official release binaries with their published checksums), or a user's `--binaries-dir`.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from harness.binaries import download, gobuild, manifest
from harness.binaries.versions import (  # noqa: F401  (re-exported: the package's names)
    ALL_BINARIES,
    DEFAULT_ETCD,
    DEFAULT_KUBERNETES,
    DEFAULT_KWOK,
    ETCD_BINARIES,
    GROUPS,
    KUBE_BINARIES,
    KWOK_BINARIES,
    SOURCES,
    VERSION_ALLOWED,
    VERSION_PATTERN,
    BinarySet,
    Versions,
    cache_dir,
    check_version,
    host_platform,
    version_problem,
)
from harness.core import paths
from harness.core.errors import BinariesError
from harness.core.progress import Reporter

# Free space a group needs in the cache while it is provided (the binaries plus a staging copy);
# measured sizes of the stripped 1.37 binaries are ~390, ~25 and ~75 MB.
SPACE_NEEDED = {"kubernetes": 1 << 30, "etcd": 128 << 20, "kwok": 256 << 20}


def ensure(versions: Versions = Versions(), *, source: str = "auto", binaries_dir: Path | None = None,
           reporter: Reporter | None = None, force: bool = False) -> BinarySet:
    """Return verified binaries for `versions`, providing whatever is missing or corrupt."""
    reporter = reporter or Reporter(quiet=True)
    if binaries_dir is not None:
        return _user_binaries(Path(binaries_dir), versions)
    if source not in SOURCES:
        raise BinariesError(f"unknown binary source {source!r}", hint=f"use one of {', '.join(SOURCES)}")

    target = cache_dir(versions)
    recorded = manifest.load(target)
    if not force and all(manifest.group_ok(target, recorded, g, versions.of_group(g)) for g in GROUPS):
        return BinarySet(target, versions)  # complete and verified: no lock needed (a read-only cache works)
    try:
        target.mkdir(parents=True, exist_ok=True)
        with manifest.locked(target):
            recorded = manifest.load(target)
            for group, names in GROUPS.items():
                if not force and manifest.group_ok(target, recorded, group, versions.of_group(group)):
                    continue
                require_writable(target, SPACE_NEEDED[group], f"{group} v{versions.of_group(group)}")
                provider = _pick_source(source, group)
                with reporter.step(f"{group} v{versions.of_group(group)}: {provider.DESCRIPTION}"):
                    provider.provide(group, versions, target, reporter)
                recorded = manifest.record(target, recorded, group, versions.of_group(group), names,
                                           provider.NAME)
    except OSError as err:  # read-only, not a directory, full: the cache itself, not the build, failed
        raise cache_error(target, err) from None
    return BinarySet(target, versions)


def cache_error(directory: Path, err: OSError) -> BinariesError:
    detail = f"{err.strerror or err}" + (f" ({err.filename})" if err.filename else "")
    return BinariesError(f"binary cache {directory}: {detail}",
                         hint=f"point {paths.CACHE_ENV} at a writable directory with at least 1.5 GB free, or pass "
                              "--binaries-dir DIR with pre-built binaries")


def require_writable(directory: Path, needed: int, what: str) -> None:
    """Refuse before a long build rather than after it: the cache must take a file and have room."""
    probe = directory / f".write-test-{os.getpid()}"
    probe.write_bytes(b"")
    probe.unlink()
    free = shutil.disk_usage(directory).free
    if free < needed:
        raise BinariesError(f"binary cache {directory}: {free >> 20} MiB free, {what} needs about {needed >> 20} MiB",
                            hint=f"free some space, or point {paths.CACHE_ENV} at a directory with more room")


def locate(versions: Versions = Versions(), *, binaries_dir: Path | None = None) -> BinarySet:
    """Return already-installed, verified binaries without building anything."""
    if binaries_dir is not None:
        return _user_binaries(Path(binaries_dir), versions)
    target = cache_dir(versions)
    recorded = manifest.load(target)
    bad = [g for g in GROUPS if not manifest.group_ok(target, recorded, g, versions.of_group(g))]
    if bad:
        raise BinariesError(
            f"binaries for {', '.join(bad)} are not installed (or failed verification) in {target}",
            hint="run `dra-harness binaries install`, or pass --binaries-dir with pre-built binaries")
    return BinarySet(target, versions)


def _pick_source(source: str, group: str):
    if source == "build":
        gobuild.require_go()
        return gobuild
    if source == "download":
        return download
    if gobuild.go_available():
        return gobuild
    if download.reachable(group):
        return download
    raise BinariesError(
        "cannot provide Kubernetes binaries: Go is not installed and the official release site is not reachable",
        hint="install Go >= 1.26 (binaries are then built from the Go module proxy), or give a directory of "
             "pre-built binaries with --binaries-dir DIR (it must hold " + ", ".join(ALL_BINARIES) + ")")


def _user_binaries(directory: Path, versions: Versions) -> BinarySet:
    missing = [n for n in ALL_BINARIES if not (directory / n).is_file()]
    if not directory.is_dir() or missing:
        raise BinariesError(f"--binaries-dir {directory}: missing {', '.join(missing) or 'directory'}",
                            hint="the directory must hold " + ", ".join(ALL_BINARIES))
    not_exec = [n for n in ALL_BINARIES if not shutil.which(n, path=str(directory))]
    if not_exec:
        raise BinariesError(f"--binaries-dir {directory}: not executable: {', '.join(not_exec)}")
    return BinarySet(directory, versions)
