"""`cluster up --backend kind`: a kind cluster with real kubelets, the fake driver deployed in it.

    dra-harness cluster up --backend kind --config clusters/mixed.yaml

1. checks first (one message naming everything missing): the docker CLI, a reachable Docker engine
   >= 28 (for `docker save --platform`), kind >= v0.33.0 (the first kind with Kubernetes 1.37
   node images), kubectl (for kustomize and apply); and the cluster definition against the manifests;
2. writes the kind config (`kind_config()`, pure): one control-plane node and one worker per node of
   every pool, with the pool's labels and the profile label, the feature gates and runtime-config of
   the same matrix and preset as the local backend, and CDI switched on in containerd;
3. builds the driver image (project wheel + deploy/Dockerfile);
4. `kind create cluster`, then loads the image into every node by streaming `docker save --platform`
   into `ctr images import` in the node. Not `kind load docker-image`: that imports with
   `--all-platforms`, which fails on Docker 29's multi-platform image store with "content digest not
   found" (kind#4066), and older kind releases wrote containerd configs newer node images reject
   (kind#3946); see ../shared/reference/anchors.md section 4;
5. applies the kustomize overlay (harness.backends.manifests) and waits until every labelled node's
   ResourceSlices are published.

Everything `up` runs is built first as a list of Steps (harness.backends.commands), so the unit tests
check the exact command sequence without Docker. State lives in `<state>/kind/<name>/`.
"""

from __future__ import annotations

import builtins
import dataclasses
import os
import shutil
from dataclasses import replace
from pathlib import Path

from fake_devices.config import PROFILE_LABEL
from harness import binaries
from harness.backends import manifests, state_file
from harness.backends.base import Backend, ClusterInfo, ClusterSpec, ClusterStatus, ComponentStatus
from harness.backends.commands import Runner, command, run_quiet
from harness.backends.common import api_ready as _api_ready
from harness.backends.common import (
    kept_or_removed_on_failure,
    known_gates,
    kubeconfig_endpoint,
    validate_name,
)
from harness.backends.kind.config import (
    NODE_IMAGE,
    SCHEDULER_CONFIG,
    SCHEDULER_DIR,
    check_node_image,
    config_yaml,
    kind_config,
    node_names,
    scheduler_config,
    worker_specs,
)
from harness.backends.kind.host import docker, dockerd, driverbase, enginechoice, nodeimage
from harness.backends.kind.host.docker import Engine, Facts
from harness.backends.kind.node_plugins import KindNodePlugins, NodeDir
from harness.backends.kind.preflight import Tools, preflight, which_with_cached_kind
from harness.backends.kind.steps import KWOK_ARCHIVE, KWOK_MANIFESTS, Plan, down_steps, plan_steps
from harness.backends.kind.vendor_file import vendor_driver
from harness.backends.kwok import in_cluster
from harness.binaries import gobuild, kindtool
from harness.config import featuregates
from harness.config.cluster import MAX_NODES
from harness.core import paths, schedulerprofiles
from harness.core.errors import BinariesError, ClusterNotFound, ConfigError, HarnessError, Problem
from harness.core.files import write_atomic
from harness.core.progress import Reporter
from harness.k8s.client import Clients

KIND_CLUSTER_LABEL = "io.x-k8s.kind.cluster"  # kind's label on every node container of a cluster
SIMULATED_NODE_PREFIX = "kwok-node"
SIMULATED_NODES = 3  # the default (--simulated-nodes): the suite's tests that need simulated nodes use one or two
VENDOR_FILE = "vendor-driver.yaml"  # the deployed fake driver, described as a vendor's (the suite's kubelet checks)
NODE_TIMEOUT = 300.0
ROLLOUT_TIMEOUT = 300.0
PUBLISH_TIMEOUT = 300.0


KindUpOptions = ClusterSpec  # the name callers used before every backend shared one spec


def state_dir(name: str) -> Path:
    return paths.state_root() / "kind" / name


def engine_user_in_use(user: str) -> bool:
    """Whether a user of the harness's dockerd still needs it although the process that registered it
    is gone: a cluster with state (`cluster down` releases it). A killed `up` that got no further is not."""
    return state_dir(user).exists()


def _with_defaults(spec: ClusterSpec) -> ClusterSpec:
    if spec.simulated_nodes is None:
        spec = replace(spec, simulated_nodes=SIMULATED_NODES)
    return spec if spec.node_image else replace(spec, node_image=NODE_IMAGE)


class KindBackend(Backend):
    name = "kind"
    suite_definition = "kind-small"  # 1 control plane + 2 workers with devices: the kubelet checks run on each
    spec_flags = {"--nodes": "nodes", "--preset": "preset", "--feature-gates": "feature_gates",
                  "--runtime-config": "runtime_config", "--no-deploy": "deploy", "--node-image": "node_image",
                  "--driver-image": "driver_image", "--simulated-nodes": "simulated_nodes",
                  "--kwok-image": "kwok_image"}

    def __init__(self, reporter: Reporter | None = None, *, preflight=None):
        self.reporter = reporter or Reporter(quiet=True)
        # A given preflight (the tests') is used as it is; the machine's own may provide an engine.
        self._preflight = preflight or self._machine_preflight
        self._own_engine: dict[str, tuple[Engine, Facts]] = {}  # cluster name -> the harness's dockerd it uses
        self._look: Tools | None = None  # _tools_to_look's answer

    def _machine_preflight(self, name: str | None = None) -> Tools:
        """The machine's engine as it is; or, where there is none and the harness can provide one
        (harness.backends.kind.host.docker), its own dockerd, registered for cluster `name`."""
        if name is None:  # a look (status): our dockerd if it runs, else the machine's engine
            engine = docker.running()
            return preflight(which=which_with_cached_kind, env=engine.environ() if engine else None)
        facts = enginechoice.detect()
        decision = enginechoice.decide(facts)
        if decision.problems:  # no engine possible: say what is missing, build nothing
            return preflight(which=which_with_cached_kind)
        which = self._kind_provided()
        if decision.use_existing:
            return preflight(which=which)
        engine = docker.acquire(name, self.reporter, facts=facts, in_use=engine_user_in_use)
        self._own_engine[name] = (engine, facts)
        try:
            return preflight(which=which, env=engine.environ())
        except BaseException:
            self._release(name)
            raise

    def _kind_provided(self):
        """kind from PATH; else the cached build, made now when Go is there to build it (binaries.kindtool)."""
        if shutil.which("kind") is None and kindtool.locate() is None and gobuild.go_available():
            kindtool.ensure(self.reporter)
        return which_with_cached_kind

    def _release(self, name: str) -> None:
        if self._own_engine.pop(name, None) is not None:
            for problem in docker.release(name, self.reporter, in_use=engine_user_in_use):
                self.reporter.info(f"could not restore {problem}")

    def _tools(self, name: str) -> Tools:
        return self._preflight(name) if self._preflight == self._machine_preflight else self._preflight()

    def _offline_node_image(self, name: str, options: KindUpOptions) -> KindUpOptions:
        """With the harness's own engine and kind's default node image, which that engine does not have:
        the locally built offline node image instead (host.nodeimage)."""
        own = self._own_engine.get(name)
        if own is None or options.node_image != NODE_IMAGE:
            return options
        engine, facts = own
        if run_quiet([engine.docker, "image", "inspect", NODE_IMAGE], env=engine.environ()).returncode == 0:
            return options
        self.reporter.info(f"{NODE_IMAGE} is not in the harness's own Docker engine: using the offline node image")
        tag = nodeimage.build(engine, self.reporter, options.kubernetes_version, drops=facts.missing_caps)
        return dataclasses.replace(options, node_image=tag)

    def _kwok_image(self, options: KindUpOptions, tools: Tools) -> KindUpOptions:
        """KWOK's own image where the engine has it or pulls it (a hosted CI runner); else one built from
        the cached KWOK binary (kwok.in_cluster), once per binary."""
        if not options.simulated_nodes or options.kwok_image:
            return options
        if self._preflight != self._machine_preflight:  # the tests' tools: nothing is probed or built
            return dataclasses.replace(options, kwok_image=in_cluster.UPSTREAM_IMAGE)
        env = tools.env or dict(os.environ)
        why = driverbase.needs_offline_base(tools.docker, env, in_cluster.UPSTREAM_IMAGE)
        if why is None:
            return dataclasses.replace(options, kwok_image=in_cluster.UPSTREAM_IMAGE)
        binary = binaries.ensure(options.versions, binaries_dir=options.binaries_dir,
                                 reporter=self.reporter).path("kwok")
        tag = in_cluster.local_image(binary)
        if run_quiet([tools.docker, "image", "inspect", tag], timeout=60, env=env).returncode == 0:
            self.reporter.info(f"{why}: using {tag}, built before from the cached KWOK binary")
            return dataclasses.replace(options, kwok_image=tag)
        self.reporter.info(f"{why}: building KWOK's image from the cached binary")
        context = paths.cache_root() / f"kwok-image-{os.getpid()}"
        try:
            in_cluster.write_build_context(context, binary)
            # the classic builder: BuildKit may fetch a frontend image; FROM scratch needs nothing else
            Runner(self.reporter, env=env).run(command(
                f"building {tag}", "env", "DOCKER_BUILDKIT=0", tools.docker, "build", "--network=none",
                f"--tag={tag}", context, timeout=600))
        finally:
            shutil.rmtree(context, ignore_errors=True)
        return dataclasses.replace(options, kwok_image=tag)

    def _offline_driver_base(self, options: KindUpOptions, tools: Tools) -> KindUpOptions:
        """When the driver image is built and the engine can neither find nor pull deploy/Dockerfile's
        base (no registry): a base built from Debian's packages and pip (host.driverbase)."""
        if options.driver_image or options.driver_base or self._preflight != self._machine_preflight:
            return options  # a given image is loaded, not built; the tests' tools are not probed
        base = driverbase.dockerfile_base((manifests.deploy_dir() / "Dockerfile").read_text())
        why = driverbase.needs_offline_base(tools.docker, tools.env or dict(os.environ), base)
        if why is None:
            return options
        self.reporter.info(f"{why}: building the driver image on an offline base")
        tag = driverbase.build(tools.docker, {**(tools.env or os.environ), "DOCKER_BUILDKIT": "0"},
                               tools.platform.split("/")[-1], self.reporter)
        return dataclasses.replace(options, driver_base=tag)

    # --- up ---------------------------------------------------------------------------------

    def plan(self, options: KindUpOptions, tools: Tools) -> Plan:
        """Validate everything and compute the plan; nothing is written or started (nor is the KWOK image
        chosen: KWOK's own stands in)."""
        options = _with_defaults(options)
        if options.simulated_nodes and not options.kwok_image:
            options = replace(options, kwok_image=in_cluster.UPSTREAM_IMAGE)
        return self._plan(self._validate(options), options, tools)

    def _validate(self, options: KindUpOptions) -> tuple[str, featuregates.FeatureSettings,
                                                         tuple[schedulerprofiles.SchedulerProfile, ...]]:
        name = validate_name(options.name)
        check_node_image(options.node_image or NODE_IMAGE)
        if options.driver_image:
            manifests.check_image(options.driver_image)
        if not 0 <= options.nodes <= MAX_NODES:  # worker containers: the bound of any cluster request
            raise ConfigError([Problem("--nodes", str(options.nodes), "out of range", f"0 to {MAX_NODES}")])
        in_cluster.check_request(options.simulated_nodes or 0, options.kwok_image)
        definition = options.definition
        manifests.check_definition(definition)
        matrix = featuregates.load_matrix(options.kubernetes_version)
        features = featuregates.resolve(
            matrix, preset=options.preset or (definition.preset if definition else None),
            gate_overrides=",".join(filter(None, [definition.gates_flag() if definition else "",
                                                  options.feature_gates])),
            runtime_overrides=",".join(filter(None, [definition.runtime_flag() if definition else "",
                                                     options.runtime_config])),
            known_gates=_known_gates(options.kubernetes_version))
        # the suite's second scheduler profile, as the local backend runs it (for its effective gates)
        return name, features, schedulerprofiles.extra_profiles(features.effective(matrix))

    def _plan(self, checked: tuple, options: KindUpOptions, tools: Tools) -> Plan:
        name, features, profiles = checked
        workers = worker_specs(options.definition, options.nodes)
        directory = state_dir(name)
        nodes = node_names(name, len(workers))
        deployment = manifests.Deployment.for_definition(options.definition, image=options.driver_image,
                                                         deployed_by=name)
        build = not options.driver_image
        steps = plan_steps(name, directory, tools, nodes, deployment.image, build_image=build, deploy=options.deploy,
                           driver_base=options.driver_base, simulated_nodes=options.simulated_nodes or 0,
                           kwok_image=options.kwok_image)
        config = kind_config(name, workers, features, options.node_image or NODE_IMAGE,
                             scheduler_dir=directory / SCHEDULER_DIR if profiles else None)
        return Plan(name, directory, config, nodes, deployment, build, steps, profiles)

    def check(self, spec: ClusterSpec) -> None:
        self._validate(_with_defaults(spec))

    def up(self, options: KindUpOptions) -> ClusterInfo:
        options = _with_defaults(options)
        checked = self._validate(options)  # bad input is reported before anything else is looked at
        tools = self._tools(checked[0])
        try:
            options = self._offline_node_image(checked[0], options)
            options = self._offline_driver_base(options, tools)
            options = self._kwok_image(options, tools)
            plan = self._plan(checked, options, tools)
            self._refuse_existing(plan.name, tools)
        except BaseException:
            self._release(checked[0])
            raise
        runner = Runner(self.reporter, env=tools.env, actions={
            "write-files": lambda: self._write_files(plan, options),
            "drop-archive": lambda: self._drop_archives(plan),
            "wait-nodes": lambda: self._wait(plan, "nodes", tools),
            "wait-rollout": lambda: self._wait(plan, "rollout"),
            "wait-slices": lambda: self._wait(plan, "slices"),
            "wait-kwok": lambda: self._wait(plan, "kwok"),
            "simulated-nodes": lambda: self._simulated_nodes(plan, options.simulated_nodes or 0),
        })
        created = False

        def remove_failed() -> None:
            try:
                if created:  # from `kind create cluster` on, a failure must delete the cluster
                    Runner(Reporter(quiet=True), env=tools.env).run_all(down_steps(plan.name, plan.directory, tools))
                    self._remove_node_containers(plan.name, tools)
                shutil.rmtree(plan.directory, ignore_errors=True)
            except HarnessError as err:  # never hide the failure that got us here
                self.reporter.info(f"clean-up failed too: {err}; state kept in {plan.directory}")
            self._release(plan.name)

        with kept_or_removed_on_failure(self.reporter, options.keep_on_failure,
                                        keep_it=lambda: self._save(plan, options, phase="failed"),
                                        keep_note=f"keeping the failed cluster for inspection: {plan.directory}",
                                        remove_it=remove_failed):
            self._inotify_room(plan)
            for step in plan.steps:
                if step.argv[:3] == (tools.kind, "create", "cluster"):
                    created = True
                runner.run(step)
        self._save(plan, options, phase="running")
        return self.info(plan.name)

    def _inotify_room(self, plan: Plan) -> None:
        """Every kind node's kubelet needs inotify instances under root's limit; past it, it never gets
        Ready (measured: a 10-node cluster at the default 128 left two workers NotReady)."""
        raised, short = docker.room_for_nodes(len(plan.node_names), own=plan.name in self._own_engine)
        for change in raised:
            self.reporter.info(f"raised {change} for {len(plan.node_names)} kind nodes (restored when the "
                               "harness's dockerd stops)")
        for problem in short:
            self.reporter.info(f"warning: {problem}; nodes past the limit will not get Ready")

    def suite_driver_config(self, name: str) -> Path | None:
        return self.write_vendor_file(name)

    def write_vendor_file(self, name: str) -> Path:
        """`<state>/kind/<name>/vendor-driver.yaml`: the deployed fake driver as the cluster shows it
        (published slices, applied classes, the nodes' images), for the suite's vendor mode."""
        self._load(name)
        directory = state_dir(name)
        clients = Clients(directory / "kubeconfig")
        try:
            slices = [clients.api_client.sanitize_for_serialization(s)
                      for s in clients.resource.list_resource_slice().items]
            classes = {c.metadata.name: c.spec.extended_resource_name
                       for c in clients.resource.list_device_class(
                           label_selector=f"{manifests.INSTANCE_LABEL}={manifests.INSTANCE}").items}
            nodes = clients.core.list_node().items
        finally:
            clients.close()
        images = {n.metadata.name: {name for image in (n.status.images or []) for name in image.names or []}
                  for n in nodes}
        profiled = {n.metadata.name for n in nodes if PROFILE_LABEL in (n.metadata.labels or {})}
        path = directory / VENDOR_FILE
        write_atomic(path, "# Generated by dra-harness (harness/backends/kind/backend.py): the fake driver deployed on "
                           "this kind cluster.\n" + manifests.dump_yaml(vendor_driver(slices, classes, images, profiled)))
        return path

    def _remove_node_containers(self, name: str, tools: Tools) -> None:
        """The cluster's containers `kind delete` did not remove: those of `docker run`s the daemon was
        still serving when kind was interrupted (measured: Ctrl-C just after kind created the node
        containers left all three stored, "Created", in our dockerd's data root)."""
        problems = dockerd.remove_containers(
            [tools.docker], (f"label={KIND_CLUSTER_LABEL}={name}",),
            run=lambda argv, timeout: run_quiet(argv, timeout, env=tools.env))
        for problem in problems:
            self.reporter.info(f"could not remove the containers of {name}: {problem}")

    def _refuse_existing(self, name: str, tools: Tools) -> None:
        if name in self._kind_clusters(tools):
            raise HarnessError(f"a kind cluster named {name!r} already exists",
                               hint=f"pick another --name, or remove it: dra-harness cluster down --backend kind "
                                    f"--name {name} (or `kind delete cluster --name {name}` if dra-harness did not "
                                    "create it)")
        if state_dir(name).exists():  # a leftover of an interrupted up: kind has no such cluster
            shutil.rmtree(state_dir(name))

    def _write_files(self, plan: Plan, options: KindUpOptions) -> None:
        plan.directory.mkdir(parents=True, exist_ok=True)
        self._save(plan, options, phase="starting")
        (plan.directory / "kind-config.yaml").write_text(config_yaml(plan.config))
        if plan.scheduler_profiles:
            (plan.directory / SCHEDULER_DIR).mkdir(exist_ok=True)
            (plan.directory / SCHEDULER_DIR / SCHEDULER_CONFIG).write_text(
                "# Generated by dra-harness (harness/backends/kind/backend.py): kube-scheduler's --config.\n"
                + manifests.dump_yaml(scheduler_config(plan.scheduler_profiles)))
        if plan.build_image:
            deploy = manifests.deploy_dir()
            context = plan.directory / "image"
            shutil.rmtree(context, ignore_errors=True)
            (context / "dist").mkdir(parents=True)
            for name in ("Dockerfile", ".dockerignore", driverbase.REQUIREMENTS_FILE):
                shutil.copy2(deploy / name, context / name)
        manifests.write_kustomization(plan.deployment, plan.directory / "deploy")
        if options.simulated_nodes:
            assert options.kwok_image
            (plan.directory / KWOK_MANIFESTS).write_text(in_cluster.manifests_yaml(
                options.kwok_image, {manifests.DEPLOYED_BY_LABEL: plan.name}))

    def _wait(self, plan: Plan, what: str, tools: Tools | None = None) -> None:
        clients = Clients(plan.directory / "kubeconfig")
        try:
            if what == "nodes":
                manifests.wait_nodes_ready(clients, set(plan.node_names), NODE_TIMEOUT,
                                           explain=lambda waiting: _kubelet_logs(waiting, tools))
            elif what == "rollout":
                manifests.wait_rollout(clients, ROLLOUT_TIMEOUT)
            elif what == "kwok":
                in_cluster.wait_available(clients, ROLLOUT_TIMEOUT)
            else:
                pools = manifests.wait_published(clients, manifests.served_profiles(plan.deployment.overlay),
                                                 PUBLISH_TIMEOUT)
                self.reporter.info(f"{pools} device pools (node x driver) published")
        finally:
            clients.close()

    @staticmethod
    def _drop_archives(plan: Plan) -> None:
        for archive in ("driver-image.tar", KWOK_ARCHIVE):
            (plan.directory / archive).unlink(missing_ok=True)

    def _simulated_nodes(self, plan: Plan, count: int) -> None:
        """Plain simulated nodes (no devices: each test publishes what it needs), kept Ready by KWOK."""
        specs = in_cluster.node_specs(count, SIMULATED_NODE_PREFIX, {manifests.DEPLOYED_BY_LABEL: plan.name})
        clients = Clients(plan.directory / "kubeconfig")
        try:
            in_cluster.add_nodes(clients, specs, self.reporter, plan.directory / "kubeconfig", NODE_TIMEOUT)
        finally:
            clients.close()

    def _save(self, plan: Plan, options: KindUpOptions, phase: str) -> None:
        data = {"name": plan.name, "backend": self.name, "phase": phase, "nodeImage": options.node_image,
                "driverBase": options.driver_base, "kwokImage": options.kwok_image,
                "simulatedNodes": options.simulated_nodes,
                "schedulerProfiles": [p.to_dict() for p in plan.scheduler_profiles],
                "driverImage": plan.deployment.image, "overlay": plan.deployment.overlay if options.deploy else None,
                "nodes": list(plan.node_names),
                "definition": options.definition.source if options.definition else None}
        state_file.ClusterState(plan.directory, data).save()

    # --- down / status / list ---------------------------------------------------------------

    def _load(self, name: str) -> state_file.ClusterState:
        return state_file.load(state_dir(validate_name(name)), lambda: ClusterNotFound(
            f"no kind cluster named {name!r} was created by dra-harness",
            hint="`dra-harness cluster list --backend kind` shows them; clusters made with kind itself are removed "
                 "with `kind delete cluster`"))

    def down(self, name: str) -> list[str]:
        self._load(name)
        tools = self._tools(name)
        directory = state_dir(name)
        try:
            Runner(self.reporter, env=tools.env).run_all(down_steps(name, directory, tools))
            leftovers = [f"kind still lists cluster {name}"] if name in self._kind_clusters(tools) else []
        finally:
            self._release(name)  # the last cluster on the harness's own dockerd stops it
        if not leftovers:
            shutil.rmtree(directory, ignore_errors=True)
        return leftovers

    def status(self, name: str) -> ClusterStatus:
        cluster = self._load(name)
        data, directory, kubeconfig = cluster.data, cluster.directory, cluster.kubeconfig
        details: dict = {"nodeImage": data.get("nodeImage"), "driverImage": data.get("driverImage"),
                         "overlay": data.get("overlay"), "definition": data.get("definition")}
        components: list[ComponentStatus] = []
        health = "broken"
        try:
            tools = self._preflight()
        except HarnessError as err:
            details["error"] = str(err)
            return ClusterStatus(name, self.name, "broken", cluster.phase, [], str(kubeconfig),
                                 str(directory), details)
        if name not in self._kind_clusters(tools):
            details["error"] = f"`kind get clusters` does not list {name}"
        else:
            components = self._node_components(tools, data.get("nodes") or [])
            if cluster.phase == "running" and _api_ready(kubeconfig) and all(c.alive for c in components):
                health = "running"
            elif cluster.phase == "starting":
                health = "starting"
        return ClusterStatus(name, self.name, health, cluster.phase, components, str(kubeconfig),
                             str(directory), details)

    def list(self) -> list[str]:
        """Kind clusters this harness created (those with state); never other kind clusters, so that
        `cluster down --all --backend kind` cannot delete clusters dra-harness does not own."""
        return state_file.names(paths.state_root() / "kind")

    def info(self, name: str) -> ClusterInfo:
        cluster = self._load(name)
        _, server = kubeconfig_endpoint(cluster.kubeconfig)
        return ClusterInfo(name=name, backend=self.name, kubeconfig=cluster.kubeconfig, server=server,
                           directory=cluster.directory,
                           scheduler_profiles=tuple(schedulerprofiles.SchedulerProfile.from_dict(p)
                                                    for p in cluster.data.get("schedulerProfiles") or []))

    def node_plugins(self, info: ClusterInfo, node: str | None = None) -> KindNodePlugins | None:
        """The fake driver's kubelet plugins a test runs on a worker, as pods (node_plugins); None where `up`
        deployed no fake driver (--no-deploy: no ServiceAccount for them, and the nodes run a vendor's driver)."""
        cluster = self._load(info.name)
        if not cluster.data.get("overlay"):
            return None
        tools = self._tools_to_look()
        node = node or self._plugin_node(cluster)
        if node is None:
            return None
        return KindNodePlugins(Path(cluster.kubeconfig), node, cluster.data["driverImage"], [tools.docker], tools.env,
                               state_dir(info.name) / "node-locks" / node)

    def _node_tools(self, info: ClusterInfo, node: str) -> Tools | None:
        """The engine's tools where `node` is a node of this kind cluster (run by a real kubelet); else None."""
        cluster = self._load(info.name)
        if node not in (cluster.data.get("nodes") or []):
            return None
        return self._tools_to_look()

    def _tools_to_look(self) -> Tools:
        """The engine's tools for work on a running cluster (our dockerd if it runs), found once per backend object:
        the suite asks per node and per test, and each preflight runs `docker info` and `kind version`."""
        if self._look is None:
            self._look = self._preflight(None) if self._preflight == self._machine_preflight else self._preflight()
        return self._look

    def node_cdi_dir(self, info: ClusterInfo, node: str) -> NodeDir | None:
        tools = self._node_tools(info, node)
        return NodeDir(node, KindNodePlugins.cdi_dir, [tools.docker], tools.env) if tools else None

    def node_runtime_query(self, info: ClusterInfo, node: str) -> tuple[str, ...] | None:
        tools = self._node_tools(info, node)
        if tools is None:
            return None
        # the caller runs it without our environment: the harness's own dockerd is named on the command line
        engine = [f"--host={tools.env['DOCKER_HOST']}"] if tools.env and tools.env.get("DOCKER_HOST") else []
        return (tools.docker, *engine, "exec", node, "ctr", "--namespace=k8s.io")

    @staticmethod
    def _plugin_node(cluster: state_file.ClusterState) -> str | None:
        workers = list(cluster.data.get("nodes") or [])[1:]  # the first is the control plane
        if not workers:
            return None
        clients = Clients(Path(cluster.kubeconfig))
        try:
            labels = {n.metadata.name: n.metadata.labels or {} for n in clients.core.list_node().items}
        finally:
            clients.close()
        return plugin_node(workers, labels)

    def _kind_clusters(self, tools: Tools) -> set[str]:
        out = run_quiet([tools.kind, "get", "clusters"], timeout=60, env=tools.env)
        if out.returncode != 0:
            raise HarnessError(f"`kind get clusters` failed: {(out.stderr or '').strip()[-300:]}")
        return {line.strip() for line in out.stdout.splitlines() if line.strip()}

    def _node_components(self, tools: Tools, nodes: builtins.list[str]) -> builtins.list[ComponentStatus]:
        if not nodes:
            return []
        out = run_quiet([tools.docker, "inspect", "--format", "{{.Name}} {{.State.Running}} {{.State.Pid}}", *nodes],
                        timeout=60, env=tools.env)
        seen = {}
        for line in out.stdout.splitlines():
            parts = line.strip().lstrip("/").split()
            if len(parts) == 3:
                seen[parts[0]] = (parts[1] == "true", int(parts[2]) if parts[2].isdigit() else None)
        return [ComponentStatus(node, seen.get(node, (False, None))[1], seen.get(node, (False, None))[0],
                                f"docker logs {node}") for node in nodes]


def plugin_node(workers: list[str], labels: dict[str, dict]) -> str:
    """The worker for the tests' own plugins: the last one without a profile if there is one, where the deployed
    driver has no devices (the suite's vendor-mode tests allocate those) and a kubelet restart disturbs none of them;
    else the last worker. A worker the API does not list counts as one with a profile."""
    plain = [name for name in workers if PROFILE_LABEL not in labels.get(name, {PROFILE_LABEL: ""})]
    return (plain or workers)[-1]


def _known_gates(kubernetes_version: str) -> set[str] | None:
    """Gate names from the harness's own kube-apiserver of that version, if installed (kind's node
    image runs the same minor). None when it is not: unknown names then surface when kind starts the
    components (dependencies and locked gates are still checked against the matrix first)."""
    try:
        binset = binaries.locate(binaries.Versions(kubernetes=kubernetes_version))
    except BinariesError:
        return None
    return known_gates(binset) or None


def _kubelet_logs(nodes: list[str], tools: Tools | None, lines: int = 12) -> str:
    """The last lines of each node container's kubelet journal: why a kind node is not Ready."""
    if tools is None:
        return ""
    parts = []
    for node in nodes:
        done = run_quiet([tools.docker, "exec", node, "journalctl", "--unit=kubelet", "--no-pager", "--quiet",
                          f"--lines={lines}", "--output=cat"], timeout=30, env=tools.env)
        text = (done.stdout or done.stderr or "").strip() or "(empty)"
        parts.append(f"--- kubelet of {node} (docker exec {node} journalctl -u kubelet) ---\n{text}")
    return "\n".join(parts)
