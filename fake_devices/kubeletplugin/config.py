"""Settings of one kubelet-plugin process: one driver name on one node.

A node runs one plugin process per driver name (for a fake-driver instance: `gpu.<domain>`,
`storage.<domain>` and `nic.<domain>`), exactly like real DRA drivers, each with its own sockets,
CDI spec files and checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fake_devices.errors import InvalidInput, Problem
from fake_devices.kubeletplugin import cdi
from fake_devices.schema import DNS_LABEL, DNS_SUBDOMAIN

MAX_SOCKET_PATH = 107  # sun_path is 108 bytes including the terminating NUL
DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024
# Deliberate defects (`--defect`), for the harness's own self-tests: each breaks one rule of the
# kubelet-plugin contract, so a check of that rule can be shown to fail. Never on in real use.
DEFECTS = (
    ("stale-cdi", "neither a start nor a repeated Prepare restores a missing CDI spec of a checkpointed claim"),
    ("keep-cdi", "Unprepare removes the checkpoint entry but leaves the claim's CDI spec"),
    ("unprepare-unknown-fails", "Unprepare of a claim that is not prepared fails with 'claim not prepared'"),
    ("drop-claim", "a Prepare of several claims leaves the last one out of the response"),
    ("any-node", "Prepare checks neither the claim's node nor that its devices are published here"),
    ("silent-health", "NodeWatchResources sends nothing, but keeps the stream open"),
    ("wrong-pool", "Prepare answers each device with pool '<pool>-x'"),
    ("all-requests", "Prepare answers each device with no request names, so it goes to every container of the claim"),
)
DEFECT_NAMES = frozenset(name for name, _ in DEFECTS)


@dataclass(frozen=True)
class PluginConfig:
    driver: str
    node: str
    plugins_dir: Path = Path("/var/lib/kubelet/plugins")  # dra.sock goes to <plugins_dir>/<driver>/
    registry_dir: Path = Path("/var/lib/kubelet/plugins_registry")  # where the kubelet looks for plugins
    cdi_dir: Path = Path("/var/run/cdi")
    state_dir: Path | None = None  # default: <plugins_dir>/<driver>
    instance: str | None = None  # fake-driver instance: its fault ConfigMap is the health source
    namespace: str = "dra-harness-system"  # where that ConfigMap lives
    profile: str | None = None  # node profile (name or file): health then also covers lost devices
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    health_interval: float = 10.0  # full health list resent at least this often (kubelet forgets after 30 s)
    workers: int = 16
    sync_timeout: float = 60.0  # how long start() waits for the first list of the driver's slices
    # Rolling update (upgrade with two instances registered at once, as the upstream helper's
    # RollingUpdate option does it): a per-instance suffix of both socket names, so the kubelet
    # knows the instances apart; they share the plugin directory, checkpoint and CDI files.
    rolling_update_id: str | None = None
    # Publish this node's slices of the driver from this profile (name or file) before serving, as a
    # vendor driver's plugin does; None: someone else publishes them (the control-plane half).
    publish_profile: str | None = None
    defects: frozenset[str] = frozenset()  # names from DEFECTS; self-tests only

    @property
    def plugin_dir(self) -> Path:
        return Path(self.plugins_dir) / self.driver

    @property
    def dra_socket(self) -> Path:
        suffix = f"-{self.rolling_update_id}" if self.rolling_update_id else ""
        return self.plugin_dir / f"dra{suffix}.sock"

    @property
    def registration_socket(self) -> Path:
        suffix = f"-{self.rolling_update_id}" if self.rolling_update_id else ""
        return Path(self.registry_dir) / f"{self.driver}{suffix}-reg.sock"

    @property
    def state_path(self) -> Path:
        return Path(self.state_dir) if self.state_dir else self.plugin_dir

    @property
    def faults_configmap(self) -> str | None:
        return f"{self.instance}-faults" if self.instance else None

    def validate(self) -> "PluginConfig":
        problems = []
        if not DNS_SUBDOMAIN.match(self.driver or "") or len(self.driver) > 63 or not cdi.valid_vendor(self.driver):
            problems.append(Problem("--driver", self.driver, "not a usable driver name",
                                    "a DNS subdomain of at most 63 characters starting with a letter"))
        if not DNS_SUBDOMAIN.match(self.node or ""):
            problems.append(Problem("--node", self.node, "not a node name", "a DNS subdomain"))
        if self.instance is not None and not DNS_LABEL.match(self.instance):
            problems.append(Problem("--instance", self.instance, "not an instance name", "a DNS label"))
        if self.rolling_update_id is not None and (not DNS_LABEL.match(self.rolling_update_id)
                                                   or len(self.rolling_update_id) > 36):
            problems.append(Problem("--rolling-update-id", self.rolling_update_id, "not an instance id",
                                    "a DNS label of at most 36 characters, e.g. the pod UID"))
        if not DNS_LABEL.match(self.namespace or ""):
            problems.append(Problem("--namespace", self.namespace, "not a namespace name", "a DNS label"))
        for flag, path in (("--plugins-dir", self.dra_socket), ("--registry-dir", self.registration_socket)):
            if len(str(Path(path).absolute()).encode()) > MAX_SOCKET_PATH:
                problems.append(Problem(flag, str(path), f"socket path longer than {MAX_SOCKET_PATH} bytes",
                                        "a shorter directory"))
        if not 1024 <= self.max_message_bytes <= 64 * 1024 * 1024:
            problems.append(Problem("--max-message-bytes", str(self.max_message_bytes), "out of range",
                                    "1024 to 67108864"))
        if not 0.1 <= self.health_interval <= 3600:
            problems.append(Problem("--health-interval", str(self.health_interval), "out of range", "0.1 to 3600 s"))
        for name in sorted(set(self.defects) - DEFECT_NAMES):
            problems.append(Problem("--defect", name, "not a known defect", ", ".join(sorted(DEFECT_NAMES))))
        if problems:
            raise InvalidInput(problems)
        return self
