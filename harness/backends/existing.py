"""`cluster up --backend existing`: a cluster the user owns (kind, a cloud cluster, bare metal).

    dra-harness cluster up --backend existing --kubeconfig K [--config clusters/x.yaml] [--driver-image REF]
    dra-harness cluster up --backend existing --kubeconfig K --no-deploy     # vendor mode: your own driver

With deploy (the default) the fake driver's manifests (deploy/kustomize, the overlay the cluster
definition calls for) are applied with every object labelled `dra-harness.x-k8s.io/deployed-by=<name>`,
and `up` returns once every node labelled `dra-harness.x-k8s.io/profile=<profile>` has its
ResourceSlices. Nodes are not labelled for you: on a cluster you own that is your decision.
`down` deletes exactly the labelled objects (and the slices the fake driver published); a namespace
that existed before `up` is left in place. With --no-deploy nothing is applied and `down` deletes
nothing from the cluster: the name only records which kubeconfig to use.

State (which kubeconfig, what was deployed) lives in `<state>/existing/<name>/`.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from harness.backends import manifests, state_file
from harness.backends.base import Backend, ClusterInfo, ClusterSpec, ClusterStatus, ComponentStatus
from harness.backends.commands import Runner, Step, action, command
from harness.backends.common import (
    api_ready,
    find_kubectl,
    kept_or_removed_on_failure,
    kubeconfig_endpoint,
    validate_name,
)
from harness.backends.kwok import in_cluster
from harness.core import paths
from harness.core.errors import ClusterNotFound, ConfigError, HarnessError, Problem
from harness.core.progress import Reporter
from harness.k8s import api, errors
from harness.k8s.client import Clients

KWOK_MANIFESTS = "kwok.yaml"
ROLLOUT_TIMEOUT = 300.0
PUBLISH_TIMEOUT = 300.0
NODE_TIMEOUT = 300.0


ExistingUpOptions = ClusterSpec  # the name callers used before every backend shared one spec


def state_dir(name: str) -> Path:
    return paths.state_root() / "existing" / name


def resolve_kubeconfig(value: str | None) -> Path:
    raw = value or os.environ.get("KUBECONFIG")
    if not raw:
        raise ConfigError([Problem("--kubeconfig", "''", "--backend existing needs the cluster's kubeconfig",
                                   "a kubeconfig file (or set $KUBECONFIG)")])
    path = Path(raw.split(os.pathsep)[0]).expanduser().resolve()
    if not path.is_file():
        raise ConfigError([Problem("--kubeconfig", raw, "no such file", "a kubeconfig file")])
    return path


def deploy_steps(directory: Path, kubectl: str, kubeconfig: Path) -> list[Step]:
    """What `up` runs to deploy (pure)."""
    base = [kubectl, f"--kubeconfig={kubeconfig}"]
    return [
        action("write-kustomization", "writing the kustomization of this cluster"),
        command("rendering the manifests (kustomize)", *base, "kustomize", directory / "deploy",
                stdout_file=directory / "manifests.yaml", timeout=120),
        command("applying the manifests", *base, "apply", f"--filename={directory / 'manifests.yaml'}", timeout=300),
        action("wait-rollout", "waiting for the fake driver's controller and kubelet plugins"),
        action("wait-slices", "waiting until every labelled node's ResourceSlices are published"),
    ]


class ExistingBackend(Backend):
    name = "existing"
    spec_flags = {"--kubeconfig": "kubeconfig", "--no-deploy": "deploy", "--driver-image": "driver_image",
                  "--simulated-nodes": "simulated_nodes", "--kwok-image": "kwok_image"}
    attaches = True

    def __init__(self, reporter: Reporter | None = None, *, kubectl_finder=None):
        super().__init__(reporter)
        self._kubectl_finder = kubectl_finder

    def _kubectl(self) -> str:
        found = (self._kubectl_finder or find_kubectl)()
        if not found:
            raise HarnessError("kubectl is not installed (needed for `kubectl kustomize` and `kubectl apply`)",
                               hint="`dra-harness binaries install` provides one, or install kubectl >= 1.30")
        return found

    # --- up ---------------------------------------------------------------------------------

    def check(self, options: ClusterSpec) -> None:
        validate_name(options.name)
        if options.deploy:
            manifests.check_definition(options.definition)
            if options.driver_image:
                manifests.check_image(options.driver_image)
        elif options.driver_image:
            raise ConfigError([Problem("--driver-image", options.driver_image, "has no effect with --no-deploy")])
        in_cluster.check_request(options.simulated_nodes or 0, options.kwok_image)
        resolve_kubeconfig(options.kubeconfig)

    def up(self, options: ClusterSpec) -> ClusterInfo:
        self.check(options)
        name = options.name
        kubeconfig = resolve_kubeconfig(options.kubeconfig)
        _, server = kubeconfig_endpoint(kubeconfig)
        directory = state_dir(name)
        if state_file.exists(directory):
            raise HarnessError(f"cluster name {name!r} is already in use for {self._load(name).kubeconfig}",
                               hint=f"pick another --name, or run `dra-harness cluster down --backend existing "
                                    f"--name {name}` first")
        if options.simulated_nodes:  # refused before anything is deployed
            clients = self._clients(kubeconfig)
            try:
                self._refuse_foreign_kwok(clients)
            finally:
                clients.close()
        data = {"name": name, "backend": self.name, "kubeconfig": str(kubeconfig), "server": server,
                "deployed": False, "phase": "running"}
        if not options.deploy:
            self._save(directory, data)
            self._add_simulated_nodes(name, data, options, kubeconfig)
            return self.info(name)

        kubectl = self._kubectl()
        clients = self._clients(kubeconfig)
        try:
            namespace = self._check_cluster(clients, name)
            deployment = manifests.Deployment.for_definition(options.definition, image=options.driver_image,
                                                             deployed_by=name,
                                                             include_namespace=namespace == "absent")
            data.update({"deployed": True, "phase": "deploying", "overlay": deployment.overlay,
                         "driverImage": deployment.image, "namespaceOwned": deployment.include_namespace,
                         "definition": options.definition.source if options.definition else None})
            self._save(directory, data)  # from here on `down` can clean up, whatever happens
            runner = Runner(self.reporter, {
                "write-kustomization": lambda: manifests.write_kustomization(deployment, directory / "deploy"),
                "wait-rollout": lambda: manifests.wait_rollout(clients, ROLLOUT_TIMEOUT),
                "wait-slices": lambda: self._wait_published(clients, deployment),
            })
            with self._removed_on_failure(name, data, options, kubectl, clients):
                runner.run_all(deploy_steps(directory, kubectl, kubeconfig))
        finally:
            clients.close()
        data["phase"] = "running"
        self._save(directory, data)
        self._add_simulated_nodes(name, data, options, kubeconfig)
        return self.info(name)

    def _add_simulated_nodes(self, name: str, data: dict, options: ClusterSpec, kubeconfig: Path) -> None:
        """With --simulated-nodes N: KWOK's controller deployed into your cluster (KWOK's own image, which
        your nodes pull) and N simulated nodes `<name>-kwok-<i>`; all of it removed again by `down`."""
        count = options.simulated_nodes or 0
        if not count:
            return
        directory = state_dir(name)
        kubectl = self._kubectl()
        clients = self._clients(kubeconfig)
        try:
            data.update({"kwok": True, "simulatedNodes": count, "phase": "deploying KWOK"})
            self._save(directory, data)  # from here on `down` removes what KWOK's part made
            image = options.kwok_image or in_cluster.UPSTREAM_IMAGE
            (directory / KWOK_MANIFESTS).write_text(in_cluster.manifests_yaml(
                image, {manifests.DEPLOYED_BY_LABEL: name}, on_control_plane=False))
            specs = in_cluster.node_specs(count, f"{name}-kwok", {manifests.DEPLOYED_BY_LABEL: name})
            runner = Runner(self.reporter, {
                "wait-kwok": lambda: in_cluster.wait_available(clients, ROLLOUT_TIMEOUT),
                "simulated-nodes": lambda: in_cluster.add_nodes(clients, specs, self.reporter, kubeconfig,
                                                                NODE_TIMEOUT),
            })
            with self._removed_on_failure(name, data, options, kubectl, clients):
                runner.run_all([
                    command(f"deploying KWOK's controller ({image})", kubectl, f"--kubeconfig={kubeconfig}", "apply",
                            f"--filename={directory / KWOK_MANIFESTS}", timeout=300),
                    action("wait-kwok", "waiting for KWOK's controller"),
                    action("simulated-nodes", f"creating {count} simulated (KWOK) nodes"),
                ])
        finally:
            clients.close()
        data["phase"] = "running"
        self._save(directory, data)

    def _removed_on_failure(self, name: str, data: dict, options: ClusterSpec, kubectl: str, clients):
        """What `up` deploys is removed again if a step fails (kept, marked failed, with --keep-on-failure)."""
        def keep() -> None:
            data["phase"] = "failed"
            self._save(state_dir(name), data)

        return kept_or_removed_on_failure(
            self.reporter, options.keep_on_failure, keep_it=keep,
            keep_note=f"keeping what was deployed for inspection; remove it with "
                      f"`dra-harness cluster down --backend existing --name {name}`",
            remove_it=lambda: self._undeploy(name, data, kubectl, clients))

    def _refuse_foreign_kwok(self, clients) -> None:
        """KWOK's controller of another `cluster up` (or not of dra-harness) on this cluster: two would
        fight over the same nodes."""
        role = errors.ignore_missing(clients.rbac.read_cluster_role, f"dra-harness:{in_cluster.NAME}")
        if role is not None:
            owner = (role.metadata.labels or {}).get(manifests.DEPLOYED_BY_LABEL)
            raise HarnessError("KWOK's controller is already deployed on this cluster "
                               + (f"(by `cluster up --name {owner}`)" if owner else "(not by dra-harness)"),
                               hint=(f"`dra-harness cluster down --backend existing --name {owner}` first, "
                                     if owner else f"remove ClusterRole dra-harness:{in_cluster.NAME} and its "
                                     f"namespace {in_cluster.NAMESPACE} first, ") + "or leave out --simulated-nodes")

    def _wait_published(self, clients, deployment: manifests.Deployment) -> None:
        pools = manifests.wait_published(clients, manifests.served_profiles(deployment.overlay), PUBLISH_TIMEOUT)
        self.reporter.info(f"{pools} device pools (node x driver) published")

    def _clients(self, kubeconfig: Path):
        clients = Clients(kubeconfig)
        try:
            clients.version.get_code()
        except Exception as err:
            clients.close()
            raise HarnessError(f"cannot reach the cluster of {kubeconfig}: {_short(err)}",
                               hint="check the kubeconfig's current context and that the API server is reachable") \
                from None
        return clients

    def _check_cluster(self, clients, name: str) -> str:
        """Refuse to deploy over a fake driver someone else installed; return the namespace's state."""
        try:
            role = errors.ignore_missing(clients.rbac.read_cluster_role, "dra-harness-fake-devices-controller")
        except errors.ApiError as err:
            raise HarnessError(f"cannot read ClusterRoles: {err.status} {err.reason}",
                               hint="deploying the fake driver needs cluster-admin rights") from None
        if role is not None:
            owner = (role.metadata.labels or {}).get(manifests.DEPLOYED_BY_LABEL)
            raise HarnessError(
                "the fake driver is already installed on this cluster "
                + (f"(by `cluster up --name {owner}`)" if owner else "(not by dra-harness cluster up)"),
                hint=(f"use that one, or `dra-harness cluster down --backend existing --name {owner}`" if owner else
                      "remove it (kubectl delete -k deploy/kustomize/overlays/<overlay>), or use --no-deploy"))
        return manifests.namespace_state(clients)

    # --- down / status / list ---------------------------------------------------------------

    def _load(self, name: str) -> state_file.ClusterState:
        return state_file.load(state_dir(validate_name(name)), lambda: ClusterNotFound(
            f"no existing-cluster entry named {name!r}", hint="`dra-harness cluster list --backend existing` shows them"))

    def _save(self, directory: Path, data: dict) -> None:
        state_file.ClusterState(directory, data).save()

    def down(self, name: str) -> list[str]:
        cluster = self._load(name)
        data = cluster.data
        leftovers: list[str] = []
        if data.get("deployed") or data.get("kwok"):
            kubeconfig = cluster.kubeconfig
            if not kubeconfig.is_file():
                raise HarnessError(f"the kubeconfig of {name!r} is gone: {kubeconfig}",
                                   hint="restore it to remove what was deployed; or delete by label: kubectl delete "
                                        f"... -l {manifests.DEPLOYED_BY_LABEL}={name}")
            clients = self._clients(kubeconfig)
            try:
                leftovers = self._undeploy(name, data, self._kubectl(), clients)
            finally:
                clients.close()
        if not leftovers:
            shutil.rmtree(state_dir(name), ignore_errors=True)
        return leftovers

    def _undeploy(self, name: str, data: dict, kubectl: str, clients) -> list[str]:
        steps = []
        if data.get("kwok"):  # first: KWOK's nodes while KWOK still runs, then KWOK
            steps += in_cluster.delete_steps(kubectl, Path(data["kubeconfig"]), name)
        if data.get("deployed"):
            steps += manifests.delete_steps(kubectl, Path(data["kubeconfig"]), name, bool(data.get("namespaceOwned")))
        Runner(self.reporter).run_all(steps)
        left = manifests.leftovers(clients, name) if data.get("deployed") else []
        if data.get("kwok"):
            left += [f"node {n.metadata.name}" for n in clients.core.list_node(
                label_selector=f"{manifests.DEPLOYED_BY_LABEL}={name}").items]
        return left

    def status(self, name: str) -> ClusterStatus:
        cluster = self._load(name)
        data, kubeconfig = cluster.data, cluster.kubeconfig
        ready = api_ready(kubeconfig)
        components = self._components(kubeconfig, bool(data.get("deployed")), bool(data.get("kwok"))) if ready else []
        healthy = ready and cluster.phase == "running" and all(c.alive for c in components)
        return ClusterStatus(name=name, backend=self.name, health="running" if healthy else "broken",
                             phase=cluster.phase, components=components, kubeconfig=str(kubeconfig),
                             directory=str(state_dir(name)),
                             details={k: data.get(k) for k in ("server", "deployed", "overlay", "driverImage",
                                                              "namespaceOwned", "definition", "simulatedNodes")})

    def _components(self, kubeconfig: Path, driver: bool, kwok: bool) -> list[ComponentStatus]:
        """The fake driver's controller and plugins (when deployed), KWOK's controller (when deployed)."""
        clients = Clients(kubeconfig)
        try:
            apps = api.AppsV1Api(clients.api_client)
            result = []
            wanted = ([("controller", manifests.NAMESPACE, manifests.CONTROLLER),
                       ("kubelet-plugin", manifests.NAMESPACE, manifests.PLUGIN)] if driver else [])
            wanted += [("kwok", in_cluster.NAMESPACE, in_cluster.NAME)] if kwok else []
            for kind, namespace, name in wanted:
                try:
                    if kind == "kubelet-plugin":
                        status = apps.read_namespaced_daemon_set(name, namespace).status
                        alive = (status.number_ready or 0) == (status.desired_number_scheduled or 0)
                    else:
                        alive = (apps.read_namespaced_deployment(name, namespace).status.available_replicas or 0) >= 1
                except Exception:
                    alive = False
                result.append(ComponentStatus(f"{kind} ({namespace}/{name})", None, alive))
            return result
        finally:
            clients.close()

    def list(self) -> list[str]:
        return state_file.names(paths.state_root() / "existing")

    def info(self, name: str) -> ClusterInfo:
        cluster = self._load(name)
        return ClusterInfo(name=name, backend=self.name, kubeconfig=cluster.kubeconfig,
                           server=cluster.data.get("server", ""), directory=cluster.directory)


def _short(err: Exception) -> str:
    text = str(err).strip().splitlines()
    return text[0][:300] if text else type(err).__name__
