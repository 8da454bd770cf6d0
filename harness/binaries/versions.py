"""Which Kubernetes, etcd and KWOK versions and binaries the harness uses, and where a set of them is
cached. A module of its own, below the package, so that the providers (`gobuild`, `download`) can use
these and the package (`ensure`, `locate`) can import the providers, without a cycle; the package
re-exports every name (`binaries.Versions`, `binaries.DEFAULT_KUBERNETES`, ...)."""

from __future__ import annotations

import platform
import re
from dataclasses import dataclass
from pathlib import Path

from harness.core import paths
from harness.core.errors import ConfigError, Problem

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
