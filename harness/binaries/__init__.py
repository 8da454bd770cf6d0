"""Kubernetes, etcd and KWOK binaries: which versions, where they are cached, how they are provided.

`ensure()` is the one entry point: it returns a verified BinarySet, building or downloading only what
is missing or corrupt. Sources: `gobuild` (the Go module proxy, works offline from release sites),
`download` (official release binaries with their published checksums), or a user's `--binaries-dir`.
"""

from __future__ import annotations

import platform
import shutil
from dataclasses import dataclass
from pathlib import Path

from harness import paths
from harness.errors import BinariesError
from harness.progress import Reporter

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


def host_platform() -> tuple[str, str]:
    machine = platform.machine().lower()
    arch = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(machine, machine)
    return platform.system().lower(), arch


@dataclass(frozen=True)
class Versions:
    kubernetes: str = DEFAULT_KUBERNETES
    etcd: str = DEFAULT_ETCD
    kwok: str = DEFAULT_KWOK

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


def ensure(versions: Versions = Versions(), *, source: str = "auto", binaries_dir: Path | None = None,
           reporter: Reporter | None = None, force: bool = False) -> BinarySet:
    """Return verified binaries for `versions`, providing whatever is missing or corrupt."""
    from harness.binaries import download, gobuild, manifest

    reporter = reporter or Reporter(quiet=True)
    if binaries_dir is not None:
        return _user_binaries(Path(binaries_dir), versions)
    if source not in SOURCES:
        raise BinariesError(f"unknown binary source {source!r}", hint=f"use one of {', '.join(SOURCES)}")

    target = cache_dir(versions)
    target.mkdir(parents=True, exist_ok=True)
    with manifest.locked(target):
        recorded = manifest.load(target)
        for group, names in GROUPS.items():
            if not force and manifest.group_ok(target, recorded, group, versions.of_group(group)):
                continue
            provider = _pick_source(source, group)
            with reporter.step(f"{group} v{versions.of_group(group)}: {provider.DESCRIPTION}"):
                provider.provide(group, versions, target, reporter)
            recorded = manifest.record(target, recorded, group, versions.of_group(group), names,
                                       provider.NAME)
    return BinarySet(target, versions)


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
