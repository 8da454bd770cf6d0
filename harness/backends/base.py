"""What every cluster backend provides, and the records that cross its boundary.

A caller chooses a backend by name through the registry (`harness.backends.get`), describes the
cluster it wants with one frozen `ClusterSpec` (every backend reads the fields it uses and refuses
the ones it does not, see `Backend.spec_flags`), and gets a `ClusterInfo` back: the record that is
handed to the suite (`harness.core.records`) and read by fixtures and diagnostics.
"""

from __future__ import annotations

import abc
import builtins
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

from harness.binaries import Versions
from harness.config.cluster import ClusterDefinition
from harness.core.files import tail
from harness.core.progress import Reporter
from harness.core.records import ClusterInfo, RealNode  # noqa: F401  (backends build them; callers import them here)


@dataclass(frozen=True)
class ClusterSpec:
    """The cluster a caller asks for, shared by all backends (each uses the fields it understands)."""

    name: str = "dra-harness"
    nodes: int = 3  # simulated (local) or plain worker (kind) nodes without devices, when no definition
    preset: str | None = None
    feature_gates: str = ""
    runtime_config: str = ""
    definition: ClusterDefinition | None = None  # node pools, profiles, preset and fake driver (clusters/*.yaml)
    keep_on_failure: bool = False
    versions: Versions = field(default_factory=Versions)
    # local
    binaries_dir: Path | None = None
    binary_source: str = "auto"
    real_nodes: int = 0  # nodes run by a real kubelet + containerd, beside the KWOK ones
    node_timeout: float = 300.0
    verbosity: int = 1
    # How long a KWOK node's Lease lasts; KWOK renews it every quarter of that, as a kubelet (40 s: every 10 s).
    # The load runs ask for longer (load_runner.LOAD_NODE_LEASE_SECONDS): 500 nodes renewing every 10 s cost the
    # apiserver, etcd and KWOK about a quarter of a core, work upstream's scheduler_perf nodes never do.
    node_lease_seconds: int = 40
    # The process whose end ends the cluster (process.identity(): a `run`, a pytest session): once it is
    # gone, the cluster's supervisor tears the cluster down and the next `up` removes what is left.
    # None: the cluster stays until `cluster down` (`cluster up`, --keep-cluster).
    owner: dict | None = None
    # kind
    node_image: str | None = None  # default: the backend's pinned node image
    driver_base: str | None = None  # the offline base for deploy/Dockerfile (kind.host.driverbase); None: its own
    # kind, existing
    # KWOK nodes inside the cluster, beside its own (kwok.in_cluster; 0: KWOK is not deployed). None: the
    # backend's default, 3 on kind (its cluster), 0 on existing (yours: only when you ask)
    simulated_nodes: int | None = None
    kwok_image: str | None = None  # KWOK's controller image; None: the backend's choice
    driver_image: str | None = None
    deploy: bool = True  # deploy the fake driver (False: vendor mode, bring your own driver)
    # existing
    kubeconfig: str | None = None  # default: $KUBECONFIG

    @property
    def kubernetes_version(self) -> str:
        return self.versions.kubernetes


@dataclass(frozen=True)
class ComponentStatus:
    name: str
    pid: int | None
    alive: bool
    log: str | None = None
    restarts: int = 0  # by the local backend's supervisor


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


class NodePluginHandle(Protocol):
    """Kubelet plugins a test runs on a real node: the local backend's realnode.plugins.NodePlugins (host
    processes), the kind backend's node_plugins.KindNodePlugins (pods on a worker). The suite reaches the
    node's files only through `read` and `names` (paths on the node), never as files of this machine."""

    @property
    def name(self) -> str: ...

    # paths on the node: the kubelet's --root-dir, the plugins' registration sockets, <dir>/<driver>/dra.sock, CDI specs
    @property
    def kubelet_root(self) -> Any: ...

    @property
    def plugins_registry(self) -> Any: ...

    @property
    def plugins_dir(self) -> Any: ...

    @property
    def cdi_dir(self) -> Any: ...

    def device_plugins(self) -> Any:
        """Legacy device plugins on the node (run, stop, calls, close), the node held meanwhile."""

    def run_for(self, fake_driver: Any) -> Any: ...

    def stop(self, driver: str, kill: bool = False) -> None: ...

    def restart(self, driver: str, kill: bool = True) -> None: ...

    def run_instance(self, driver: str, rolling_update_id: str) -> None: ...

    def stop_instance(self, driver: str, rolling_update_id: str) -> None: ...

    def log(self, driver: str, rolling_update_id: str | None = None) -> Path:
        """A file of this machine with the plugin's log (for messages)."""

    def log_text(self, driver: str, rolling_update_id: str | None = None) -> str:
        """Everything the plugin printed so far, across restarts."""

    def read(self, path: Any) -> str: ...

    def names(self, directory: Any, pattern: str = "*") -> list[str]: ...

    def cdi_specs(self, driver: str | None = None) -> list:
        """The driver's CDI spec files on the node (each with `.name` and `.read_text()`)."""

    def plugin_socket(self, driver: str) -> Path | None:
        """The plugin's DRA socket where a client on this machine can reach it; None where it cannot."""

    @property
    def pod_resources_socket(self) -> Path | None:
        """The kubelet's PodResources socket where this machine reaches it; None: ask `pod_resources` instead."""

    def pod_resources(self, pod: str, namespace: str) -> bytes | None:
        """Where the socket is out of reach: the serialized PodResources `Get` answer, None for an unknown pod."""

    def hold(self) -> None: ...

    def restart_kubelet(self) -> None: ...

    def reboot(self) -> None: ...

    def will_disrupt(self) -> None:
        """Before anything runs on the node: this user will restart its kubelet or reboot it."""

    def close(self) -> None: ...


class ComponentWatchHandle(Protocol):
    """The suite's view of a cluster's components (the local backend's liveness.ComponentWatch): `check()`
    raises core.errors.ComponentDied once one the current test needs is gone for good."""

    nodes_needed: bool

    def check(self, look_now: bool = False) -> None: ...

    def deaths(self, look_now: bool = False, nodes: bool | None = None) -> list: ...

    def restarts(self) -> dict[str, int]: ...

    def restarting(self) -> list[str]: ...

    def restarted_since(self, before: dict[str, int], began: float | None = None) -> str: ...


class Backend(abc.ABC):
    name: ClassVar[str]
    # `cluster up` flags this backend understands: flag -> the ClusterSpec field it sets. A flag of
    # another backend given to this one is refused before anything starts.
    spec_flags: ClassVar[dict[str, str]] = {}
    # Whether `up` names the nodes of a definition's pool `<pool>-<i>` (callers such as the load
    # scenarios address them by those names); kind names its nodes itself, existing has its own.
    names_its_nodes: ClassVar[bool] = False
    # The cluster definition (clusters/<name>.yaml) the suite runs on with this backend when none is given.
    suite_definition: ClassVar[str | None] = None
    # Whether it works on a cluster the user gives (--kubeconfig) rather than starting one: such a backend
    # takes no cluster definition or name, and attaches instead of `up`.
    attaches: ClassVar[bool] = False

    def __init__(self, reporter: Reporter | None = None):
        self.reporter = reporter or Reporter(quiet=True)

    def check(self, spec: ClusterSpec) -> None:
        """Refuse a request this backend cannot serve (ConfigError naming the flag or field), before
        anything is built, started or written; `up` begins with it, and a job checks its request with it
        before it makes anything of its own (a report directory)."""

    @abc.abstractmethod
    def up(self, spec: ClusterSpec) -> ClusterInfo:
        """Start (or attach to) the cluster of `spec`, after `check(spec)`; on failure leave nothing unless
        keep_on_failure."""

    @abc.abstractmethod
    def down(self, name: str) -> builtins.list[str]:
        """Remove what `up` made; return what could not be removed (normally nothing)."""

    @abc.abstractmethod
    def status(self, name: str) -> ClusterStatus: ...

    @abc.abstractmethod
    def list(self) -> builtins.list[str]:
        """Names of the clusters of this backend that dra-harness made."""

    @abc.abstractmethod
    def info(self, name: str) -> ClusterInfo:
        """The record of a running cluster (what `up` returned)."""

    def resolve_real_nodes(self, value: str, flag: str = "--real-nodes") -> tuple[int, str]:
        """How many nodes run by a real kubelet on this machine to ask `up` for, for a `--real-nodes`
        value (auto, 0, 1, ...), and why none when none. Only the local backend starts such nodes."""
        return 0, f"the {self.name} backend starts no real node on this machine"

    def suite_driver_config(self, name: str) -> Path | None:
        """A vendor file naming the fake driver this backend deployed, where the suite must test it the
        way it tests a vendor's driver (kind: every node a real kubelet, the driver a DaemonSet); None
        where the suite drives the fake driver itself."""
        return None

    def node_plugins(self, info: ClusterInfo, node: str | None = None) -> NodePluginHandle | None:
        """A handle that runs the fake driver's kubelet plugins on `node` (a node run by a real kubelet;
        None: one the backend picks), for a test of the node half; None where the backend cannot (an
        existing cluster: the harness does not know what it may run on your nodes)."""
        return None

    def node_cdi_dir(self, info: ClusterInfo, node: str) -> Any | None:
        """The CDI spec directory of `node` (run by a real kubelet) as the suite reads it: a Path of this machine,
        or a read-only stand-in with `is_dir()`, `iterdir()` and entries' `read_text()`; None where unknown."""
        return next((real.cdi_dir for real in info.real_nodes if real.name == node and real.cdi_dir is not None), None)

    def node_runtime_query(self, info: ClusterInfo, node: str) -> tuple[str, ...] | None:
        """The argv prefix that asks `node`'s containerd about its containers (`... containers info ID`); None where
        this machine cannot ask it."""
        return next((tuple(real.runtime_query) for real in info.real_nodes if real.name == node and real.runtime_query),
                    None)

    def component_watch(self, info: ClusterInfo) -> ComponentWatchHandle | None:
        """A watch over the components the backend runs for `info`, for the suite to end waits and fail
        tests naming a dead one; None where it runs none itself (kind, existing)."""
        return None

    def collect_logs(self, info: ClusterInfo, lines: int = 30) -> dict[str, str]:
        """The last `lines` lines of each component log the backend keeps: log name -> text.
        Backends whose components log elsewhere (kind: `docker logs`, existing: the user's) have none."""
        found = sorted(info.log_dir.glob("*.log")) if info.log_dir and info.log_dir.is_dir() else []
        found += [log for node in info.real_nodes for log in node.logs if log not in found and log.is_file()]
        return {str(log): tail(log, lines) for log in found}
