"""`dra-harness migration rehearse`: one command for the whole rehearsal.

Reads a cluster definition (default clusters/migration.yaml) as the target state, checks it, and then
starts the *legacy* state: the same nodes without the DRA driver, each pool's profile GPUs advertised
by a device plugin (a real plugin process on real nodes, node status on simulated ones) as the
definition's `driver.extendedResources.gpu`. It runs the rehearsal (harness.migration.rehearsal),
writes `migration-report.json` and `migration-report.md`, prints the per-phase table, and stops the
cluster. Exit 0 when every pod of every phase ran, 1 otherwise, 2 for bad input (nothing started).
"""

from __future__ import annotations

import dataclasses
import json
import uuid

from fake_devices.config import DriverConfig
from fake_devices.controller import FakeDriver
from harness import backends, binaries
from harness.backends.base import ClusterSpec
from harness.backends.local import state
from harness.backends.local.realnode import images
from harness.backends.local.realnode.deviceplugins import NodeDevicePlugins
from harness.backends.local.realnode.plugins import NodePlugins
from harness.config import cluster as cluster_config
from harness.core.errors import ConfigError, HarnessError, Problem
from harness.core.nodelayout import records
from harness.core.progress import Reporter
from harness.k8s import wait
from harness.k8s.client import Clients
from harness.migration.local import LocalDra, LocalLegacy
from harness.migration.rehearsal import MigrationNode, Rehearsal

NAMESPACE = "migration-rehearsal"
MAX_PODS_PER_PHASE = 50


@dataclasses.dataclass(frozen=True)
class Plan:
    definition: cluster_config.ClusterDefinition
    resource: str
    nodes: list[MigrationNode]  # in migration order
    in_flight: int
    pods_per_phase: int
    pod_timeout: float


def plan(args) -> Plan:
    """Everything checked before anything starts (exit 2 on a problem)."""
    definition = cluster_config.validate(args.config, binaries.DEFAULT_KUBERNETES)
    problems = []
    resource = definition.driver.extended_resources.get("gpu")
    if not resource:
        problems.append(Problem(definition.source, "spec.driver.extendedResources.gpu", "not set",
                                "the extended resource the workload asks for, e.g. example.com/gpu"))
    nodes = []
    for pool in definition.pools:
        gpus = sum(group.count for group in pool.profile.gpus) if pool.profile else 0
        if gpus and pool.profile:
            nodes += [MigrationNode(f"{pool.name}-{i}", pool.profile.name, gpus, real=pool.kubelet == "real")
                      for i in range(pool.count)]
    if len(nodes) < 2:
        problems.append(Problem(definition.source, "spec.nodePools", f"{len(nodes)} node(s) with GPUs",
                                "at least 2 nodes whose profile has GPUs (the stream runs on the others while one "
                                "migrates)"))
    if not 1 <= args.pods_per_phase <= MAX_PODS_PER_PHASE:
        problems.append(Problem("--pods-per-phase", str(args.pods_per_phase), "out of range", f"1 to {MAX_PODS_PER_PHASE}"))
    if not 10 <= args.pod_timeout <= 600:
        problems.append(Problem("--pod-timeout", str(args.pod_timeout), "out of range", "10 to 600 seconds"))
    room = sum(n.devices for n in nodes) - max((n.devices for n in nodes), default=0)
    in_flight = room if args.in_flight is None else args.in_flight
    if nodes and len(nodes) >= 2 and not 1 <= in_flight <= room:
        problems.append(Problem("--in-flight", str(in_flight), "out of range",
                                f"1 to {room}: the GPUs left while the largest node migrates"))
    if args.report_dir.exists() and not args.report_dir.is_dir():
        problems.append(Problem("--report-dir", str(args.report_dir), "exists and is not a directory", "a directory"))
    if problems:
        raise ConfigError(problems)
    return Plan(definition, resource or "", nodes, in_flight, args.pods_per_phase, args.pod_timeout)


def legacy_definition(definition):
    """The same cluster before the migration: no profile on any pool, so no DRA driver runs at start
    (the pools' labels, the profile's node labels included, stay)."""
    pools = tuple(dataclasses.replace(pool, profile=None) for pool in definition.pools)
    return dataclasses.replace(definition, pools=pools)


def run(args, reporter: Reporter, out) -> int:
    chosen = plan(args)
    name = args.name or f"migration-{uuid.uuid4().hex[:6]}"
    backend = backends.get("local", reporter)  # the rehearsal drives the local backend's real nodes
    info = None
    try:
        info = backend.up(ClusterSpec(name=name, definition=legacy_definition(chosen.definition),
                                    preset=chosen.definition.preset))
        cluster = state.find_by_kubeconfig(info.kubeconfig)
        if cluster is None:
            raise HarnessError(f"cluster {name} is up but its state was not found")
        result = _rehearse(chosen, cluster, reporter)
    finally:
        if info is not None and not args.keep_cluster:
            leftovers = backend.down(name)
            if leftovers:
                reporter.console.print(f"cluster {name}: could not clean up: {', '.join(leftovers)}")
    args.report_dir.mkdir(parents=True, exist_ok=True)

    (args.report_dir / "migration-report.json").write_text(json.dumps(result.to_dict(), indent=2) + "\n")
    (args.report_dir / "migration-report.md").write_text(result.markdown())
    print(result.markdown(), file=out)
    print(f"report: {args.report_dir / 'migration-report.md'} (and .json)", file=out)
    return 0 if result.ok else 1


def _rehearse(chosen: Plan, cluster, reporter: Reporter):
    definition, settings = chosen.definition, chosen.definition.driver
    real = {r.name: r for r in records(cluster.data)}
    k8s = Clients(cluster.kubeconfig)
    drivers: list[FakeDriver] = []

    def start_driver(node):
        config = DriverConfig(instance=settings.instance, domain=settings.domain, profiles=definition.profiles,
                              nodes={node.name: node.profile}, namespace=NAMESPACE,
                              extended_resources=dict(settings.extended_resources), workers=4)
        driver = FakeDriver(config, k8s.api_client)
        drivers.append(driver)
        driver.start()
        if not driver.wait_idle(60) or driver.errors:
            raise HarnessError(f"the DRA driver did not publish node {node.name}: {driver.errors}")
        return driver

    legacy = LocalLegacy(k8s, chosen.resource, {n: NodeDevicePlugins(cluster.directory, r) for n, r in real.items()})
    dra = LocalDra(k8s, start_driver, {n: NodePlugins(cluster.directory, r, cluster.kubeconfig) for n, r in real.items()})
    rehearsal = None
    try:
        k8s.core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        wait.service_account_ready(k8s, NAMESPACE)
        rehearsal = Rehearsal(k8s, NAMESPACE, chosen.resource, images.SHELL_IMAGE, chosen.nodes, legacy, dra,
                              pods_per_phase=chosen.pods_per_phase, in_flight=chosen.in_flight,
                              pod_timeout=chosen.pod_timeout, log=reporter.info)
        with reporter.step(f"rehearsing the migration of {len(chosen.nodes)} nodes ({chosen.resource})"):
            return rehearsal.run()
    finally:
        if rehearsal is not None:
            rehearsal.close()
        dra.close()
        for driver in drivers:
            driver.stop(delete_slices=True)
        legacy.close()
        wait.ignore_not_found(k8s.core.delete_namespace, NAMESPACE)  # matters with --keep-cluster
        k8s.close()
