"""Kubernetes, etcd and KWOK binaries: which versions, where they are cached, how they are provided.

`ensure()` is the one entry point: it returns a verified BinarySet, building or downloading only what
is missing or corrupt. Sources: `gobuild` (the Go module proxy, works offline from release sites),
`download` (official release binaries with their published checksums), or a user's `--binaries-dir`.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from harness.core import paths
from harness.core.errors import BinariesError, ConfigError, Problem
from harness.core.progress import Reporter

DEFAULT_KUBERNETES = "1.37.2"
DEFAULT_ETCD = "3.6.16"
DEFAULT_KWOK = "0.8.0"

KUBE_BINARIES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kubectl")
ETCD_BINARIES = ("etcd",)
KWOK_BINARIES = ("kwok",)
ALL_BINARIES = KUBE_BINARIES + ETCD_BINARIES + KWOK_BINARIES

# Which binaries come from which upstream project: a group is built or downloaded as a whole.
GROUPS = {"kubernetes": KUBE_BINARIES, "etcd": ETCD_BINARIES, "kwok": KWOK_BINARIES}
SOURCES = ("auto", "build", "download")

# A version becomes part of cache paths, URLs and go.mod lines, so only plain semantic versions are
# accepted: X.Y.Z with an optional pre-release of letters, digits, dots and dashes (1.38.0-alpha.1).
# Nothing else (no "/", "..", spaces) can reach a path.
_NUMBER = r"(0|[1-9][0-9]{0,3})"
VERSION_PATTERN = re.compile(rf"{_NUMBER}\.{_NUMBER}\.{_NUMBER}(-[0-9A-Za-z][0-9A-Za-z.-]{{0,40}})?")
VERSION_ALLOWED = "X.Y.Z with an optional pre-release such as 1.37.2 or 1.38.0-alpha.1; a leading v is dropped"


def version_problem(value: str, where: str) -> Problem | None:
    """A Problem naming `where` (a flag or a field) when `value` is not a plain semantic version."""
    if isinstance(value, str) and VERSION_PATTERN.fullmatch(value):  # fullmatch: "$" would let "\n" through
        return None
    return Problem(where, str(value), "not a version", VERSION_ALLOWED)


def check_version(value: str, where: str) -> str:
    """`value` without a leading v, or ConfigError naming `where`."""
    version = value[1:] if isinstance(value, str) and value.startswith("v") else value
    if problem := version_problem(version, where):
        raise ConfigError([version_problem(value, where) or problem])  # the value as it was given
    return version


def host_platform() -> tuple[str, str]:
    machine = platform.machine().lower()
    arch = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(machine, machine)
    return platform.system().lower(), arch


@dataclass(frozen=True)
class Versions:
    kubernetes: str = DEFAULT_KUBERNETES
    etcd: str = DEFAULT_ETCD
    kwok: str = DEFAULT_KWOK

    def __post_init__(self) -> None:
        # Every Versions, whatever its source (flags, a cluster's state, a test), is checked here:
        # a version is used in cache paths, so it must never be able to leave the cache.
        problems = [p for group in GROUPS if (p := version_problem(getattr(self, group), f"--{group}-version"))]
        if problems:
            raise ConfigError(problems)

    def of_group(self, group: str) -> str:
        return getattr(self, group)

    @property
    def set_id(self) -> str:
        os_name, arch = host_platform()
        return f"kubernetes-v{self.kubernetes}_etcd-v{self.etcd}_kwok-v{self.kwok}_{os_name}-{arch}"


@dataclass(frozen=True)
class BinarySet:
    """A directory of verified binaries."""

    directory: Path
    versions: Versions

    def path(self, name: str) -> Path:
        return self.directory / name


def cache_dir(versions: Versions) -> Path:
    return paths.cache_root() / "binaries" / versions.set_id


# Free space a group needs in the cache while it is provided (the binaries plus a staging copy);
# measured sizes of the stripped 1.37 binaries are ~390, ~25 and ~75 MB.
SPACE_NEEDED = {"kubernetes": 1 << 30, "etcd": 128 << 20, "kwok": 256 << 20}


def ensure(versions: Versions = Versions(), *, source: str = "auto", binaries_dir: Path | None = None,
           reporter: Reporter | None = None, force: bool = False) -> BinarySet:
    """Return verified binaries for `versions`, providing whatever is missing or corrupt."""
    from harness.binaries import manifest

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
    from harness.binaries import manifest

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
    from harness.binaries import download, gobuild

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
