"""The records that cross from one job to the next, as typed data in JSON files:

- the cluster record: what the job that started (or attached to) a cluster knows about it, written
  once to `cluster.json` and handed to the pytest plugin by path (`--dra-cluster-record`); fixtures
  and diagnostics read it instead of rediscovering the cluster;
- the test results: one `TestResult` per finished test, written by the pytest plugin to
  `results.json` and read by the report.

Neutral ground: the backends, the plugin, the report and the suite may all import this module.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.core.errors import ConfigError, Problem
from harness.core.files import write_atomic
from harness.core.schedulerprofiles import SchedulerProfile

# One order of maturities, for --dra-maturity and the report's rows ("-": a test of no feature).
MATURITY_ORDER = {"ga": 0, "beta": 1, "alpha": 2, "-": 3}
CLUSTER_RECORD_VERSION = 1


@dataclass(frozen=True)
class RealNode:
    """A node run by a real kubelet that the backend started, as the suite needs to know it."""

    name: str
    cdi_dir: Path | None = None  # where its drivers write CDI specs, when this machine can read it
    logs: tuple[Path, ...] = ()  # its kubelet's and container runtime's logs, when on this machine
    # argv that queries its container runtime from this machine (`ctr` on the local backend): what a
    # container was really given (its OCI spec after CDI injection); empty where the runtime is out of reach
    runtime_query: tuple[str, ...] = ()


@dataclass(frozen=True)
class ClusterInfo:
    name: str
    backend: str
    kubeconfig: Path
    server: str
    directory: Path | None = None
    metrics: dict[str, str] = field(default_factory=dict)  # component -> secure /metrics URL
    real_nodes: tuple[RealNode, ...] = ()  # nodes run by a real kubelet that the backend started
    real_nodes_reason: str = ""  # why the cluster has no real (kubelet) node, if it has none
    log_dir: Path | None = None  # the control plane's component logs, where the backend has them
    scheduler_profiles: tuple[SchedulerProfile, ...] = ()  # run beside default-scheduler (schedulerprofiles.py)

    def to_dict(self) -> dict[str, Any]:
        return {"version": CLUSTER_RECORD_VERSION, "name": self.name, "backend": self.backend,
                "kubeconfig": str(self.kubeconfig), "server": self.server,
                "directory": str(self.directory) if self.directory else None, "metrics": dict(self.metrics),
                "realNodes": [{"name": n.name, "cdiDir": str(n.cdi_dir) if n.cdi_dir else None,
                               "logs": [str(log) for log in n.logs], "runtimeQuery": list(n.runtime_query)}
                              for n in self.real_nodes],
                "realNodesReason": self.real_nodes_reason, "logDir": str(self.log_dir) if self.log_dir else None,
                "schedulerProfiles": [p.to_dict() for p in self.scheduler_profiles]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ClusterInfo:
        def path(value: str | None) -> Path | None:
            return Path(value) if value else None

        return cls(name=data["name"], backend=data["backend"], kubeconfig=Path(data["kubeconfig"]),
                   server=data["server"], directory=path(data.get("directory")), metrics=data.get("metrics") or {},
                   real_nodes=tuple(RealNode(n["name"], path(n.get("cdiDir")), tuple(Path(p) for p in n.get("logs", [])),
                                             tuple(n.get("runtimeQuery") or ()))
                                    for n in data.get("realNodes") or []),
                   real_nodes_reason=data.get("realNodesReason") or "", log_dir=path(data.get("logDir")),
                   scheduler_profiles=tuple(SchedulerProfile.from_dict(p) for p in data.get("schedulerProfiles") or []))

    def scheduler_profile(self, name: str) -> SchedulerProfile | None:
        return next((p for p in self.scheduler_profiles if p.name == name), None)


def write_cluster(info: ClusterInfo, path: Path) -> Path:
    return write_atomic(path, json.dumps(info.to_dict(), indent=2))


def read_cluster(path: Path, where: str = "--dra-cluster-record") -> ClusterInfo:
    """The cluster record at `path`; a ConfigError naming `where` and the field when it is unusable."""
    try:
        data = json.loads(path.read_text())
    except OSError as err:
        raise ConfigError([Problem(where, str(path), f"cannot read: {err.strerror}", "a cluster.json a "
                                   "dra-harness job wrote")]) from None
    except ValueError as err:
        raise ConfigError([Problem(where, str(path), f"not JSON: {err}", "a cluster.json a dra-harness job wrote")]) \
            from None
    if not isinstance(data, dict) or data.get("version") != CLUSTER_RECORD_VERSION:
        raise ConfigError([Problem(f"{where} {path}", "version", f"is {data.get('version') if isinstance(data, dict) else data!r}",
                                   str(CLUSTER_RECORD_VERSION))])
    missing = [key for key in ("name", "backend", "kubeconfig", "server") if not isinstance(data.get(key), str)]
    if missing:
        raise ConfigError([Problem(f"{where} {path}", key, "missing or not a string") for key in missing])
    return ClusterInfo.from_dict(data)


OUTCOMES = ("passed", "failed", "skipped", "xfailed", "xpassed", "not applicable")


@dataclass
class TestResult:
    """One finished test in results.json: outcome, time, skip reason or failure message, and the
    properties the plugin recorded (feature, maturity, drivers allocated, ...)."""

    __test__ = False  # not a pytest test class, despite the name

    id: str
    outcome: str = "passed"  # one of OUTCOMES
    seconds: float = 0.0
    message: str = ""
    properties: dict[str, Any] = field(default_factory=dict)
    phase: str | None = None  # setup | call | teardown: where a failed test failed

    def to_dict(self) -> dict[str, Any]:
        data = {"id": self.id, "outcome": self.outcome, "seconds": self.seconds, "message": self.message,
                "properties": self.properties}
        return data if self.phase is None else {**data, "phase": self.phase}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TestResult:
        return cls(id=str(data["id"]), outcome=str(data.get("outcome", "passed")),
                   seconds=float(data.get("seconds", 0.0)), message=str(data.get("message", "")),
                   properties=dict(data.get("properties") or {}), phase=data.get("phase"))


def write_results(results: list[TestResult], path: Path) -> None:
    write_atomic(path, json.dumps([r.to_dict() for r in sorted(results, key=lambda r: r.id)], indent=2))


def read_results(path: Path) -> list[TestResult]:
    """The results at `path`; none when there is no file or it was cut short (only a crash can: it is
    written atomically) or is not a list of records."""
    try:
        data = json.loads(path.read_text()) if path.exists() else []
    except ValueError:
        return []
    if not isinstance(data, list):
        return []
    return [TestResult.from_dict(item) for item in data if isinstance(item, dict) and "id" in item]
