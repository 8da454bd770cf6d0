"""The command lines of a local cluster's components, as pure data.

Nothing here starts a process: `plan()` turns a ClusterLayout into Components (argv + health
endpoint), so the flags can be unit-tested and printed by `cluster up --dry-run`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fake_devices import config as driver_config
from harness.backends.kwok import stages as kwok_stages
from harness.backends.kwok.nodes import KWOK_NODE_ANNOTATION
from harness.backends.local.health import Readiness
from harness.backends.local.pki import Pki
from harness.binaries import BinarySet
from harness.config.featuregates import FeatureSettings
from harness.core.schedulerprofiles import SchedulerProfile

SERVICE_CIDR = "10.96.0.0/16"
POD_CIDR = "10.128.0.1/9"  # KWOK hands out pod IPs from here; they are only strings in pod status
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"
PORT_NAMES = ["etcd", "etcd-peer", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"]
# API client rates high enough for 1000 nodes and bursts of thousands of pods (defaults are 20-50 qps).
CLIENT_QPS, CLIENT_BURST = 500, 1000
NODE_MONITOR_GRACE_SECONDS = 50  # kube-controller-manager's default (pkg/controller/nodelifecycle/config/v1alpha1)


@dataclass(frozen=True)
class ClusterLayout:
    name: str
    directory: Path
    binaries: BinarySet
    features: FeatureSettings
    ports: dict[str, int]
    pki: Pki
    verbosity: int = 1
    scheduler_profiles: tuple[SchedulerProfile, ...] = ()  # beside default-scheduler (schedulerprofiles.py)
    node_lease_seconds: int = kwok_stages.NODE_LEASE_SECONDS  # the KWOK nodes' (ClusterSpec.node_lease_seconds)

    def kubeconfig(self, client: str) -> Path:
        return self.directory / ("kubeconfig" if client == "admin" else f"{client}.kubeconfig")

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports['kube-apiserver']}"


@dataclass(frozen=True)
class Component:
    name: str
    argv: list[str]
    health_url: str | None  # polled until it answers 200 ...
    env: dict[str, str] = field(default_factory=dict)
    ready_line: str | None = None  # ... or, for components without an endpoint, a line in their log
    files: dict[str, str] = field(default_factory=dict)  # config files (relative path -> content) to write first

    @property
    def readiness(self) -> Readiness:
        return Readiness(self.health_url, self.ready_line)


def _gates(layout: ClusterLayout) -> list[str]:
    flags = []
    if layout.features.gates:
        flags.append(f"--feature-gates={layout.features.gates_flag()}")
    return flags


def _secure_serving(layout: ClusterLayout, port_name: str, client: str) -> list[str]:
    """Flags that make a component serve HTTPS on loopback and accept the cluster's client certs."""
    kubeconfig = str(layout.kubeconfig(client))
    return ["--bind-address=127.0.0.1", f"--secure-port={layout.ports[port_name]}",
            f"--tls-cert-file={layout.pki.serving_cert}", f"--tls-private-key-file={layout.pki.serving_key}",
            f"--client-ca-file={layout.pki.ca_cert}",
            f"--authentication-kubeconfig={kubeconfig}", f"--authorization-kubeconfig={kubeconfig}"]


def etcd(layout: ClusterLayout) -> Component:
    client, peer = layout.ports["etcd"], layout.ports["etcd-peer"]
    argv = [str(layout.binaries.path("etcd")), "--name=dra-harness", f"--data-dir={layout.directory / 'etcd'}",
            f"--listen-client-urls=http://127.0.0.1:{client}", f"--advertise-client-urls=http://127.0.0.1:{client}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}", f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=dra-harness=http://127.0.0.1:{peer}",
            # A test cluster is thrown away: skipping fsync makes it several times faster on slow disks.
            "--unsafe-no-fsync=true", "--quota-backend-bytes=8589934592", "--log-level=warn"]
    return Component("etcd", argv, f"http://127.0.0.1:{client}/health")


def kube_apiserver(layout: ClusterLayout) -> Component:
    p = layout.pki
    argv = [str(layout.binaries.path("kube-apiserver")),
            f"--etcd-servers=http://127.0.0.1:{layout.ports['etcd']}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
            f"--secure-port={layout.ports['kube-apiserver']}",
            f"--tls-cert-file={p.serving_cert}", f"--tls-private-key-file={p.serving_key}",
            f"--client-ca-file={p.ca_cert}",
            f"--service-account-issuer={SA_ISSUER}", f"--service-account-key-file={p.service_account_pub}",
            f"--service-account-signing-key-file={p.service_account_key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=Node,RBAC", "--allow-privileged=true",
            # As kubeadm (and so kind) clusters do: a node may write only its own objects, ResourceSlices
            # included (conformance/test_slice_permissions.py). Not among the API server's defaults.
            "--enable-admission-plugins=NodeRestriction",
            # Real nodes (see realnode/): reach their kubelet at its InternalIP, never by a DNS lookup.
            "--kubelet-preferred-address-types=InternalIP",
            f"--kubelet-client-certificate={p.client_cert('kube-apiserver-kubelet-client')}",
            f"--kubelet-client-key={p.client_key('kube-apiserver-kubelet-client')}",
            # The `kubernetes` Service cannot point at a loopback address, and nothing here needs it.
            "--endpoint-reconciler-type=none",
            "--max-requests-inflight=1000", "--max-mutating-requests-inflight=500",
            f"--v={layout.verbosity}"]
    argv += _gates(layout)
    if layout.features.runtime_config:
        argv.append(f"--runtime-config={layout.features.runtime_config_flag()}")
    return Component("kube-apiserver", argv, f"{layout.server}/readyz")


def kube_controller_manager(layout: ClusterLayout) -> Component:
    p = layout.pki
    argv = [str(layout.binaries.path("kube-controller-manager")),
            f"--kubeconfig={layout.kubeconfig('kube-controller-manager')}",
            *_secure_serving(layout, "kube-controller-manager", "kube-controller-manager"),
            f"--root-ca-file={p.ca_cert}", f"--service-account-private-key-file={p.service_account_key}",
            "--use-service-account-credentials=true",
            f"--cluster-signing-cert-file={p.ca_cert}", f"--cluster-signing-key-file={p.ca_key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}", "--leader-elect=false",
            f"--kube-api-qps={CLIENT_QPS}", f"--kube-api-burst={CLIENT_BURST}",
            f"--v={layout.verbosity}"]
    if layout.node_lease_seconds > kwok_stages.NODE_LEASE_SECONDS:
        # Leases renewed less often: a node counts as lost only once its lease is as old as the lease lasts
        # (the default grace, 50 s, is meant for renewals every 10 s).
        argv.append(f"--node-monitor-grace-period={max(NODE_MONITOR_GRACE_SECONDS, layout.node_lease_seconds)}s")
    argv += _gates(layout)
    return Component("kube-controller-manager", argv,
                     f"https://127.0.0.1:{layout.ports['kube-controller-manager']}/healthz")


def kube_scheduler(layout: ClusterLayout) -> Component:
    config: dict[str, Any] = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": str(layout.kubeconfig("kube-scheduler")),
                             "qps": CLIENT_QPS, "burst": CLIENT_BURST},
        "leaderElection": {"leaderElect": False},
    }
    if layout.scheduler_profiles:  # a profiles list replaces the default one: name default-scheduler too
        config["profiles"] = [{"schedulerName": "default-scheduler"}, *(p.config() for p in layout.scheduler_profiles)]
    argv = [str(layout.binaries.path("kube-scheduler")), f"--config={layout.directory / 'kube-scheduler.yaml'}",
            *_secure_serving(layout, "kube-scheduler", "kube-scheduler"), f"--v={layout.verbosity}"]
    argv += _gates(layout)
    return Component("kube-scheduler", argv, f"https://127.0.0.1:{layout.ports['kube-scheduler']}/healthz",
                     files={"kube-scheduler.yaml": yaml.safe_dump(config)})



def kwok(layout: ClusterLayout) -> Component:
    port = layout.ports["kwok"]
    argv = [str(layout.binaries.path("kwok")), f"--kubeconfig={layout.kubeconfig('kwok')}",
            # Our own configuration and stages, so a user's ~/.kwok/kwok.yaml cannot change behaviour.
            f"--config={layout.directory / 'kwok.yaml'}",
            "--manage-all-nodes=false", f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake",
            f"--server-address=127.0.0.1:{port}", f"--cidr={POD_CIDR}", "--node-ip=127.0.0.1",
            f"--node-port={port}"]
    return Component("kwok", argv, f"http://127.0.0.1:{port}/healthz",
                     files={"kwok.yaml": kwok_stages.config_yaml(layout.node_lease_seconds)})


def fake_devices(layout: ClusterLayout, definition) -> Component:
    """The fake DRA driver (control-plane half) publishing the definition's profiles."""
    settings = definition.driver
    config = driver_config.DriverConfig(instance=settings.instance, domain=settings.domain,
                                        profiles=definition.profiles,
                                        extended_resources=dict(settings.extended_resources))
    argv = [sys.executable, "-m", "fake_devices", f"--config={layout.directory / 'fake-driver.yaml'}",
            f"--kubeconfig={layout.kubeconfig('admin')}"]
    return Component("fake-devices", argv, None, ready_line="ready",
                     files={"fake-driver.yaml": driver_config.to_yaml(config)})


# Reverse of the start order: clients of the apiserver first, etcd last.
# The supervisor first: it must not restart what is being stopped.
STOP_ORDER = [["supervisor"], ["fake-devices", "kwok", "kube-scheduler", "kube-controller-manager"], ["kube-apiserver"],
              ["etcd"]]


def plan(layout: ClusterLayout) -> list[list[Component]]:
    """Components in start order: each inner list can start in parallel once the previous is healthy."""
    return [[etcd(layout)], [kube_apiserver(layout)],
            [kube_controller_manager(layout), kube_scheduler(layout), kwok(layout)]]
