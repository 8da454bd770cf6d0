"""What every cluster backend provides, and the records it returns."""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class ClusterInfo:
    name: str
    backend: str
    kubeconfig: Path
    server: str
    directory: Path | None = None
    metrics: dict[str, str] = field(default_factory=dict)  # component -> secure /metrics URL
    real_nodes_reason: str = ""  # local backend: why the cluster has no real (kubelet) node, if it has none


@dataclass(frozen=True)
class ComponentStatus:
    name: str
    pid: int | None
    alive: bool
    log: str | None = None


@dataclass(frozen=True)
class ClusterStatus:
    name: str
    backend: str
    health: str  # running | starting | broken
    phase: str
    components: list[ComponentStatus]
    kubeconfig: str
    directory: str | None = None
    details: dict = field(default_factory=dict)


class Backend(abc.ABC):
    name: str

    @abc.abstractmethod
    def up(self, options) -> ClusterInfo: ...

    @abc.abstractmethod
    def down(self, name: str) -> list[str]: ...

    @abc.abstractmethod
    def status(self, name: str) -> ClusterStatus: ...

    @abc.abstractmethod
    def list(self) -> list[str]: ...
