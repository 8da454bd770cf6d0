"""`cluster up/down/status` for the local backend.

Why we supervise the processes ourselves instead of driving `kwokctl --runtime=binary`: kwokctl
(v0.8) rewrites feature gates and runtime-config from its own built-in table, which ends at
Kubernetes 1.36 and would drop or override the 1.37 gates this project exists to test; it also
decides ports, flags and certificates itself. We keep KWOK for what it is best at, the `kwok`
controller that simulates nodes and pods. See docs/local-backend.md.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from fake_devices.config import PROFILE_LABEL
from fake_devices.render import Drivers
from harness import binaries as binaries_mod
from harness.backends.base import Backend, ClusterInfo, ClusterSpec, ClusterStatus, ComponentStatus, RealNode
from harness.backends.common import kept_or_removed_on_failure, known_gates
from harness.backends.kwok import nodes
from harness.backends.local import components, health, kubeconfig, liveness, pki, ports, process, state, supervisor
from harness.backends.local.realnode import containerd, plugins, preflight, teardown
from harness.backends.local.realnode import node as realnode
from harness.binaries import noderuntime
from harness.config import featuregates
from harness.config.cluster import MAX_NODES, MAX_REAL_NODES
from harness.core import diskspace, paths, schedulerprofiles
from harness.core.errors import ClusterNotFound, ComponentError, ConfigError, HarnessError, Problem
from harness.core.nodelayout import records
from harness.k8s.client import Clients, https_get, tls_context

START_TIMEOUT = 90.0  # per component group; a cold 2-core machine starts the apiserver in ~10 s
PORT_CLOSE_TIMEOUT = 10.0  # after its process is gone, the kernel closes a listener at once: this is slack
# Free space a cluster needs under the state directory: a fresh one takes 123 MiB (etcd preallocates
# its 64 MiB write-ahead log), logs grow during a run.
STATE_ROOM = 256 << 20


UpOptions = ClusterSpec  # the name callers used before every backend shared one spec


def realnode_specs(options: ClusterSpec) -> list[realnode.RealNodeSpec]:
    """Real nodes of the definition's `kubelet: real` pools (named `<pool>-<i>`), then --real-nodes ones."""
    specs = []
    for pool in (options.definition.pools if options.definition else ()):
        if pool.kubelet == "real":
            labels = {**pool.labels, **({PROFILE_LABEL: pool.profile.name} if pool.profile else {})}
            specs += [realnode.RealNodeSpec(f"{pool.name}-{i}", pool=pool.name, labels=labels)
                      for i in range(pool.count)]
    return specs + realnode.default_specs(options.real_nodes)


def _scheduler_profiles(data: dict) -> tuple[schedulerprofiles.SchedulerProfile, ...]:
    return tuple(schedulerprofiles.SchedulerProfile.from_dict(p) for p in data.get("schedulerProfiles") or [])


def _abandoned_by(cluster: state.ClusterState) -> int | None:
    """The pid of the `cluster up` that was starting `cluster` and is gone (SIGKILLed), or None."""
    if cluster.data.get("phase") != "starting" or not cluster.data.get("startedBy"):
        return None
    starter = process.Running("cluster up", **process.identity_fields(cluster.data["startedBy"]))
    return None if process.alive(starter) else starter.pid


def orphaned_by(data: dict) -> int | None:
    """The pid of the owner (ClusterSpec.owner) of a cluster that is gone, or None. One still being
    started counts only once its `cluster up` is gone too."""
    if not isinstance(data.get("ownedBy"), dict):
        return None
    owner = process.Running("owner", **process.identity_fields(data["ownedBy"]))
    if process.alive(owner):
        return None
    if data.get("phase") == "starting" and isinstance(data.get("startedBy"), dict):
        starter = process.Running("cluster up", **process.identity_fields(data["startedBy"]))
        if process.alive(starter):
            return None
    return owner.pid


# KWOK makes nodes Ready at a rate, not at once: 10,000 nodes took 287-338 s on the 2-core machine
# uncontended and missed a 300 s bound beside other work (BENCHMARKS.md, "10,000 nodes").
READY_SECONDS_PER_NODE = 0.06


def ready_timeout(options: ClusterSpec, count: int) -> float:
    """How long `up` waits for `count` nodes to be Ready: the request's bound, longer for many nodes."""
    return max(options.node_timeout, count * READY_SECONDS_PER_NODE)


def _gate_args(options: ClusterSpec) -> dict[str, Any]:
    """featuregates.resolve's arguments for a request: the definition's gates and runtime config, then the flags'."""
    definition = options.definition
    return dict(preset=options.preset or (definition.preset if definition else None),
                gate_overrides=",".join(filter(None, [definition.gates_flag() if definition else "",
                                                      options.feature_gates])),
                runtime_overrides=",".join(filter(None, [definition.runtime_flag() if definition else "",
                                                         options.runtime_config])))


class LocalBackend(Backend):
    name = "local"
    spec_flags = {"--nodes": "nodes", "--real-nodes": "real_nodes", "--preset": "preset",
                  "--feature-gates": "feature_gates", "--runtime-config": "runtime_config",
                  "--binaries-dir": "binaries_dir", "--source": "binary_source", "--verbosity": "verbosity"}
    names_its_nodes = True

    def resolve_real_nodes(self, value: str, flag: str = "--real-nodes") -> tuple[int, str]:
        if value != "auto":
            try:
                count = int(value)
            except ValueError:
                raise ConfigError([Problem(flag, value, "not a number", "auto, 0, 1, ...")]) from None
            if not 0 <= count <= MAX_REAL_NODES:
                raise ConfigError([Problem(flag, value, "out of range", f"auto, or 0 to {MAX_REAL_NODES}")])
            return count, "" if count else "no real node was asked for (real nodes: 0)"
        problems = preflight.problems()
        return (0, "this machine cannot run a real node: " + "; ".join(problems)) if problems else (1, "")

    # --- up -----------------------------------------------------------------------------------

    def check(self, options: ClusterSpec) -> None:
        # What can be checked before any slow work (building binaries) or any process starts; the gates
        # again against the binaries' own list once they are there (`up`).
        state.validate_name(options.name)
        if not 0 <= options.nodes <= MAX_NODES:
            # The bound of a cluster definition's node pools. One local control plane takes 1000 nodes
            # in 24 s and 930 MiB, 10,000 in minutes and 13 GiB (BENCHMARKS.md); more is a typo.
            raise ConfigError([Problem("--nodes", str(options.nodes), "out of range", f"0 to {MAX_NODES}")])
        if not 0 <= options.real_nodes <= MAX_REAL_NODES:
            raise ConfigError([Problem("--real-nodes", str(options.real_nodes), "out of range",
                                       f"0 to {MAX_REAL_NODES} (each runs a kubelet and containerd on this machine)")])
        featuregates.resolve(featuregates.load_matrix(options.versions.kubernetes), **_gate_args(options))

    def up(self, options: ClusterSpec) -> ClusterInfo:
        self.check(options)
        name = options.name
        real_specs = realnode_specs(options)
        if real_specs:
            problems = preflight.problems(len(real_specs))
            if problems:
                raise HarnessError("this machine cannot run a real node:\n  - " + "\n  - ".join(problems),
                                   hint="use --real-nodes 0 (simulated nodes only) or the kind backend")
        matrix = featuregates.load_matrix(options.versions.kubernetes)
        definition = options.definition
        gate_args = _gate_args(options)
        self.remove_orphans()
        self._clear_stale(name)
        diskspace.require_room(paths.clusters_dir(), STATE_ROOM, "state directory",
                               hint=f"free some space, or point {paths.STATE_ENV} at a directory with more room")
        binset = binaries_mod.ensure(options.versions, source=options.binary_source,
                                     binaries_dir=options.binaries_dir, reporter=self.reporter)
        features = featuregates.resolve(matrix, **gate_args, known_gates=known_gates(binset))
        runtime = noderuntime.ensure(self.reporter) if real_specs else None

        started = time.monotonic()
        allocated = ports.allocate(components.PORT_NAMES, reserved=state.reserved_ports(except_name=name),
                                   holder=state.cluster_dir(name))
        node_specs = nodes.from_definition(definition) if definition else nodes.default_nodes(options.nodes)
        try:
            cluster = state.create(name, {"backend": self.name, "phase": "starting", "ports": allocated,
                                          "startedBy": process.identity(), "ownedBy": options.owner,
                                          "binaries": str(binset.directory),
                                          "kubernetesVersion": options.versions.kubernetes,
                                          "features": features.to_dict(), "nodes": len(node_specs),
                                          "schedulerProfiles": [p.to_dict() for p in schedulerprofiles.extra_profiles(
                                              features.effective(matrix))],
                                          "definition": definition.source if definition else None})
        except FileExistsError:
            raise HarnessError(f"cluster {name!r} was created by another `cluster up` meanwhile",
                               hint="use it, or pick another --name") from None

        def keep() -> None:
            cluster.data["phase"] = "failed"
            cluster.save()

        def remove() -> None:
            teardown.teardown_all(cluster.directory, cluster.data)
            process.stop_all(cluster.directory, components.STOP_ORDER)
            state.remove(cluster)

        with kept_or_removed_on_failure(self.reporter, options.keep_on_failure, keep_it=keep, remove_it=remove,
                                        keep_note=f"keeping the failed cluster for inspection: {cluster.directory}"):
            self._start(cluster, binset, features, allocated, options, node_specs, real_specs, runtime)
        cluster.data["phase"] = "running"
        cluster.data["startSeconds"] = round(time.monotonic() - started, 2)
        cluster.save()
        return self._info(cluster)

    def remove_orphans(self) -> list[str]:
        """Take down the clusters whose owner (a `run`, a pytest session: ClusterSpec.owner) is gone, which
        their supervisor did not get to (it was killed too). Returns their names."""
        removed = []
        for name in state.all_names():
            try:
                cluster = state.load(name)
            except HarnessError:
                continue
            owner = orphaned_by(cluster.data)
            if owner is None:
                continue
            self.reporter.info(f"removing cluster {name!r}: the run that owned it (pid {owner}) is gone")
            try:
                leftovers = self.down(name)
            except ClusterNotFound:
                continue  # its supervisor or another `up` got there first
            except (HarnessError, OSError) as err:  # racing another clean-up: never a reason to refuse this `up`
                self.reporter.info(f"clean-up of {name!r} did not finish ({err}); the next `up` tries again")
                continue
            if leftovers:
                self.reporter.info(f"clean-up of {name!r} left: {', '.join(leftovers)}")
            removed.append(name)
        return removed

    def _clear_stale(self, name: str) -> None:
        if not state.cluster_dir(name).exists():
            return
        existing = state.load(name)
        live = process.processes_of(existing.directory)
        abandoned_by = _abandoned_by(existing)
        if live and abandoned_by is None:
            raise HarnessError(f"cluster {name!r} already exists and is running ({process.describe(live)})",
                               hint=f"use it, pick another --name, or run `dra-harness cluster down --name {name}`")
        if live:
            self.reporter.info(f"removing cluster {name!r}: the `cluster up` that was starting it (pid {abandoned_by}) "
                               f"was killed, so it can never finish")
        else:
            self.reporter.info(f"removing stale state of cluster {name!r} (its processes are gone)")
        leftovers = teardown.teardown_all(existing.directory, existing.data)
        leftovers += process.stop_all(existing.directory, components.STOP_ORDER)
        if leftovers:
            raise HarnessError(f"cannot clean up the stale cluster {name!r}: {'; '.join(leftovers)}")
        state.remove(existing)

    def _start(self, cluster: state.ClusterState, binset, features, allocated, options: ClusterSpec,
               node_specs: list[nodes.NodeSpec], real_specs: list[realnode.RealNodeSpec], runtime) -> None:
        scheduler_profiles = _scheduler_profiles(cluster.data)
        with self.reporter.step("creating certificates and kubeconfigs"):
            keys = pki.create(cluster.directory / "pki", cluster.name)
            layout = components.ClusterLayout(cluster.name, cluster.directory, binset, features, allocated, keys,
                                              verbosity=options.verbosity, scheduler_profiles=scheduler_profiles,
                                              node_lease_seconds=options.node_lease_seconds)
            for client in pki.CLIENTS:
                kubeconfig.write(layout.kubeconfig(client), cluster.name, layout.server, keys, client)
        tls = tls_context(layout.kubeconfig("admin"))
        for group in components.plan(layout):
            names = ", ".join(c.name for c in group)
            with self.reporter.step(f"starting {names}"):
                running = []
                for component in group:
                    for rel, content in component.files.items():
                        (cluster.directory / rel).write_text(content)
                    running.append((component, process.start(component.name, component.argv, cluster.directory,
                                                             component.env, ready=component.readiness)))
                self._wait_healthy(running, tls)
        if real_specs:
            realnode.start_all(cluster, layout, real_specs, runtime, self.reporter)
        if node_specs or real_specs:
            clients = Clients(layout.kubeconfig("admin"))
            try:
                nodes.create(clients.core, node_specs, self.reporter)
                node_names = {s.name for s in node_specs} | {s.name for s in real_specs}
                nodes.wait_ready(clients.core, node_names, self.reporter, ready_timeout(options, len(node_names)),
                                 check_alive=lambda: self._check_alive(cluster.directory))
            finally:
                clients.close()
        if options.definition and options.definition.profiles:
            driver = components.fake_devices(layout, options.definition)
            with self.reporter.step(f"publishing devices ({', '.join(sorted(options.definition.profiles))})"):
                for rel, content in driver.files.items():
                    (cluster.directory / rel).write_text(content)
                driver_process = process.start(driver.name, driver.argv, cluster.directory, driver.env,
                                               ready=driver.readiness)
                self._wait_healthy([(driver, driver_process)], tls, timeout=options.node_timeout)
            self._start_node_plugins(cluster, options.definition, real_specs)
        # Last, once everything it watches is up: from here a component that dies is restarted.
        process.start(supervisor.NAME, supervisor.argv(cluster.directory), cluster.directory)

    def _start_node_plugins(self, cluster: state.ClusterState, definition, real_specs) -> None:
        """The kubelet plugins of the definition's driver on every real node that has a profile."""
        profiled = {s.name for s in real_specs if PROFILE_LABEL in s.labels}
        for record in records(cluster.data):
            if record.name in profiled:
                with self.reporter.step(f"{record.name}: starting the kubelet plugins of {definition.driver.domain}"):
                    for driver in Drivers(definition.driver.domain).all():
                        plugins.start(cluster.directory, record, driver, cluster.kubeconfig,
                                      definition.driver.instance)

    def _wait_healthy(self, running, tls, timeout: float = START_TIMEOUT) -> None:
        pending = {component.name: (component, proc) for component, proc in running}
        deadline = time.monotonic() + timeout
        while pending:
            for name, (component, proc) in list(pending.items()):
                if not process.alive(proc):
                    code = process.exit_code(proc)
                    full = diskspace.explain_no_space(process.tail(proc.log, lines=400), proc.log.parent.parent)
                    raise ComponentError(name, f"exited during start{'' if code is None else f' with code {code}'}"
                                         f"{full}", log_file=proc.log, log_tail=process.tail(proc.log))
                if health.is_ready(component.readiness, proc.log, tls):
                    del pending[name]
            if not pending:
                return
            if time.monotonic() > deadline:
                name, (component, proc) = next(iter(pending.items()))
                raise ComponentError(name, f"not ready after {timeout:.0f}s ({component.health_url or 'no ready line'})",
                                     log_file=proc.log, log_tail=process.tail(proc.log))
            time.sleep(0.1)

    def _check_alive(self, directory: Path) -> None:
        for running in process.recorded(directory).values():
            if not process.alive(running):
                raise ComponentError(running.name, "died while the cluster was starting", log_file=running.log,
                                     log_tail=process.tail(running.log))

    # --- down / status / list -----------------------------------------------------------------

    def down(self, name: str) -> list[str]:
        """Stop every process of the cluster and delete its state. Returns leftovers (normally none).

        Safe to interrupt and to repeat: every step undoes only what is still there, and the state
        (with the real nodes' records) goes last, so a second `down` finishes what the first began.
        A cluster that is already gone raises ClusterNotFound after a last sweep for strays."""
        name = state.validate_name(name)
        directory = state.cluster_dir(name)
        if not directory.exists():
            strays = process.processes_of(directory)
            if not strays:
                raise ClusterNotFound(f"cluster {name!r} is already down: there is no state in {directory} and no "
                                      f"process of it is running")
            survivors = process.terminate(strays, process.GRACE_SECONDS)
            return [f"{process.describe([p])} survived SIGKILL" for p in survivors]
        cluster = state.load(name)
        try:
            # The supervisor before anything: it would restart what is being stopped.
            stuck = process.stop_named(cluster.directory, [supervisor.NAME])
            # Real nodes first: their kubelets are API clients, and their pods must go before containerd.
            node_leftovers = teardown.teardown_all(cluster.directory, cluster.data)
            stuck += process.stop_all(cluster.directory, components.STOP_ORDER)
            # Ports: once every process is gone, a listener left is another program's (named).
            busy = [] if stuck else ports.wait_closed(cluster.ports, PORT_CLOSE_TIMEOUT)
        except KeyboardInterrupt:
            self.reporter.info(f"cluster {name!r} is only partly stopped; `dra-harness cluster down --name {name}` "
                               "again finishes the job")
            raise
        # Kept while anything of a real node is left, so that a repeated `down` still knows what to
        # remove (a machine setting that could not be restored is reported, but is no node's).
        if not stuck and not any(teardown.leftovers_of(node) for node in records(cluster.data)):
            state.remove(cluster)
        return stuck + node_leftovers + busy

    def status(self, name: str) -> ClusterStatus:
        cluster = state.load(state.validate_name(name))
        recorded = process.recorded(cluster.directory)
        restarts = supervisor.read_status(cluster.directory)
        comps = [ComponentStatus(r.name, r.pid, process.alive(r), str(r.log),
                                 int(restarts.get(r.name, {}).get("restarts", 0))) for r in recorded.values()]
        phase = cluster.data.get("phase", "incomplete")
        ready = False
        if phase == "running" and comps and all(c.alive for c in comps):
            try:
                code, _ = https_get(f"https://127.0.0.1:{cluster.ports['kube-apiserver']}/readyz",
                                    tls_context(cluster.kubeconfig), timeout=3)
                ready = code == 200
            except OSError:
                ready = False
        starting = phase == "starting" and any(c.alive for c in comps) and _abandoned_by(cluster) is None
        health = "running" if ready else ("starting" if starting else "broken")
        return ClusterStatus(name=cluster.name, backend=self.name, health=health, phase=phase, components=comps,
                             kubeconfig=str(cluster.kubeconfig), directory=str(cluster.directory),
                             details={"ports": cluster.ports, "nodes": cluster.data.get("nodes"),
                                      "features": cluster.data.get("features"),
                                      "startSeconds": cluster.data.get("startSeconds")})

    def list(self) -> list[str]:
        return state.all_names()

    def node_plugins(self, info: ClusterInfo, node: str | None = None) -> plugins.NodePlugins | None:
        if node is None:
            if not info.real_nodes:
                return None
            node = info.real_nodes[0].name
        cluster = state.load(state.validate_name(info.name))
        found = [record for record in records(cluster.data) if record.name == node]
        return plugins.NodePlugins(cluster.directory, found[0], cluster.kubeconfig) if found else None

    def component_watch(self, info: ClusterInfo) -> liveness.ComponentWatch:
        # A dead scheduler (or apiserver, etcd, ...) ends each wait within a second, naming it.
        return liveness.ComponentWatch(info.name, state.cluster_dir(info.name))

    def info(self, name: str) -> ClusterInfo:
        return self._info(state.load(state.validate_name(name)))

    def _info(self, cluster: state.ClusterState) -> ClusterInfo:
        logs = cluster.directory / "logs"  # process.start: every component, real nodes' too, logs here
        ctr = noderuntime.cache_dir() / "ctr"
        real_nodes = tuple(RealNode(node.name, cdi_dir=node.dirs.cdi,
                                    logs=(logs / f"{node.kubelet_process}.log", logs / f"{node.containerd_process}.log"),
                                    runtime_query=(str(ctr), f"--address={node.dirs.containerd_socket}",
                                                   f"--namespace={containerd.NAMESPACE}"))
                           for node in records(cluster.data))
        return ClusterInfo(name=cluster.name, backend=self.name, kubeconfig=cluster.kubeconfig,
                           server=f"https://127.0.0.1:{cluster.ports['kube-apiserver']}",
                           directory=cluster.directory, log_dir=logs, real_nodes=real_nodes,
                           scheduler_profiles=_scheduler_profiles(cluster.data),
                           metrics={"kube-scheduler": f"https://127.0.0.1:{cluster.ports['kube-scheduler']}/metrics",
                                    "kube-controller-manager":
                                        f"https://127.0.0.1:{cluster.ports['kube-controller-manager']}/metrics"})
