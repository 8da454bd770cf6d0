"""The fake driver's kubelet plugins a test runs on a kind worker: each one a pod there, made through the API.

The local backend runs a test's plugins as host processes on its real node (realnode.plugins). A kind worker
is a container whose kubelet sees only what runs inside it, so here each plugin is a pod of the deployed
driver's image, bound to the worker (`spec.nodeName`), with the kubelet's plugin directories and the CDI
directory mounted from the node, under the kubelet plugin's ServiceAccount (its ClusterRole reads claims,
slices and nodes; a RoleBinding in the test's namespace lets it read the fault ConfigMap there).

What a pod cannot give is done with the node container itself (`docker exec`, as kind's own commands do):
reading the node's files (CDI specs, the kubelet's checkpoint, the registry directory) and restarting its
kubelet. The kubelet's PodResources API is asked from inside a plugin pod (`pod_resources`). A node reboot
is out of reach (`reboot` raises NotOnThisNode), and so are the plugin's sockets for a client on this
machine (`plugin_socket` is None): the tests that need them skip saying so.

The migration tests' legacy device plugins run as pods the same way (KindDevicePlugins), and the suite's
vendor-mode CDI checks read any kind node's CDI directory through NodeDir (the backend's node_cdi_dir).
"""

from __future__ import annotations

import base64
import hashlib
import re
import shlex
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from fake_devices.deviceplugin import journal
from fake_devices.deviceplugin.plugin import socket_stem
from fake_devices.kubeletplugin import startup
from harness.backends.commands import run_quiet
from harness.backends.local.realnode.plugins import instance_args
from harness.backends.local.realnode.sharing import WAIT, NodeUse
from harness.backends.manifests import NAMESPACE, PLUGIN
from harness.core.errors import ComponentError, HarnessError
from harness.k8s import errors, wait
from harness.k8s.client import Clients

READY_TIMEOUT = 120.0  # a deadline: the image's Python imports grpc and kubernetes first
KUBELET_TIMEOUT = 120.0
PLUGIN_LABEL = "dra-harness.x-k8s.io/test-plugin"  # value: the pod's node; the pods a test ran there
FAULTS_BINDING = "dra-harness-test-plugin-faults"  # RoleBinding in a test's namespace: the plugin reads its faults
STATE_ROOT = PurePosixPath("/var/lib/dra-harness/test-plugins")  # checkpoints, one directory per driver
# Under a shell, so that a crash can be simulated: the plugin is not PID 1, which ignores a SIGKILL sent from
# inside its own PID namespace. SIGTERM (pod deletion) is passed on, and the pod ends with the plugin's status
# (the first `wait` also catches a plugin that ended before the loop could look at it).
WRAPPER = ('python -m "$PLUGIN_MODULE" "$@" & pid=$!; echo $pid > /run/plugin/pid; '
           'trap \'kill -TERM $pid\' TERM INT; '
           'wait $pid; status=$?; while kill -0 $pid 2>/dev/null; do wait $pid; status=$?; done; exit $status')

# Run by the image's Python in a plugin pod: the kubelet's PodResources API (k8s.io/kubelet podresources v1) for
# one pod, printed base64-encoded, or NOTFOUND.
POD_RESOURCES_QUERY = """
import base64, sys, grpc
from fake_devices.kubeletplugin.generated import podresources_v1_pb2 as api, podresources_v1_pb2_grpc as stubs
channel = grpc.insecure_channel("unix:///var/lib/kubelet/pod-resources/kubelet.sock")
try:
    answer = stubs.PodResourcesListerStub(channel).Get(
        api.GetPodResourcesRequest(pod_name=sys.argv[1], pod_namespace=sys.argv[2]), timeout=10)
    print(base64.b64encode(answer.SerializeToString()).decode())
except grpc.RpcError as err:
    if err.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNKNOWN) and "not found" in (err.details() or "").lower():
        print("NOTFOUND")
    else:
        raise
"""


class NotOnThisNode(HarnessError):
    """What a test asked of the node cannot be done on a kind worker (the message says what and why)."""


@dataclass(frozen=True)
class NodeFile:
    """A file read from the node container; compares by name and content (as Path's `.name`, `.read_text()`)."""

    name: str
    path: str
    text: str

    def read_text(self, errors: str | None = None) -> str:
        return self.text


@dataclass(frozen=True, order=True)
class NodeEntry:
    """An entry of a NodeDir (what the suite uses of a Path: name, suffix, is_file, read_text)."""

    name: str
    path: str = field(compare=False)
    regular: bool = field(compare=False)
    directory: NodeDir = field(compare=False, repr=False)

    @property
    def suffix(self) -> str:
        return PurePosixPath(self.name).suffix

    def is_file(self) -> bool:
        return self.regular

    def read_text(self, errors: str | None = None) -> str:
        return self.directory.read(self.name)

    def exists(self) -> bool:
        """Whether it is still there now (not when it was listed)."""
        return self.directory._run(["test", "-e", self.path]).returncode == 0

    def __str__(self) -> str:
        return f"{self.directory.node}:{self.path}"


class NodeDir:
    """A directory of a kind node, read through `docker exec` (the node's CDI directory, for the suite's vendor-mode
    checks): `is_dir()`, `iterdir()` and `str()` as the suite uses a Path's."""

    def __init__(self, node: str, path: PurePosixPath, docker: list[str], docker_env: dict | None):
        self.node, self.path = node, path
        self._docker, self._docker_env = docker, docker_env

    def _run(self, argv: list[str]):
        return run_quiet([*self._docker, "exec", self.node, *argv], timeout=60, env=self._docker_env)

    def is_dir(self) -> bool:
        return self._run(["test", "-d", str(self.path)]).returncode == 0

    def iterdir(self) -> list[NodeEntry]:
        script = f'cd {shlex.quote(str(self.path))} 2>/dev/null || exit 0; for f in * .[!.]*; do ' \
                 '[ -e "$f" ] || continue; if [ -f "$f" ]; then echo "f $f"; else echo "o $f"; fi; done; exit 0'
        done = self._run(["sh", "-c", script])
        return sorted(NodeEntry(line[2:], str(self.path / line[2:]), line[0] == "f", self)
                      for line in done.stdout.splitlines() if len(line) > 2)

    def read(self, name: str) -> str:
        done = self._run(["cat", str(self.path / name)])
        if done.returncode != 0:
            raise FileNotFoundError(f"{self.path / name} on node {self.node}: {(done.stderr or '').strip()}")
        return done.stdout

    def __str__(self) -> str:
        return f"{self.node}:{self.path}"


@dataclass
class _Running:
    pod: str
    instance: str | None
    namespace: str | None


def pod_name(node: str, driver: str, rolling_update_id: str | None) -> str:
    """DNS-safe and unique per (node, driver, instance): driver names run long."""
    digest = hashlib.sha1(f"{node}/{driver}/{rolling_update_id or ''}".encode()).hexdigest()[:10]
    readable = re.sub(r"[^a-z0-9-]+", "-", driver.split(".", 1)[0].lower())[:20].strip("-") or "plugin"
    return f"test-plugin-{readable}-{digest}"


def plugin_pod(node: str, driver: str, image: str, instance: str | None, namespace: str | None,
               rolling_update_id: str | None = None) -> dict:
    """The pod of one DRA kubelet plugin on `node` (pure)."""
    args = [f"--driver={driver}", f"--node={node}", "--plugins-dir=/var/lib/kubelet/plugins",
            "--registry-dir=/var/lib/kubelet/plugins_registry", "--cdi-dir=/var/run/cdi",
            f"--state-dir={STATE_ROOT / driver}", *instance_args(instance, namespace, rolling_update_id)]
    return _pod(pod_name(node, driver, rolling_update_id), node, image, "fake_devices.kubeletplugin", args, driver)


def device_plugin_pod(node: str, resource: str, profile: str, image: str, pre_start_required: bool = False) -> dict:
    """The pod of one legacy device plugin (fake_devices.deviceplugin) on `node`, registered through the kubelet's
    plugin watcher as on the local backend; its call journal in device_plugin_state(resource) on the node (pure)."""
    args = [f"--resource={resource}", f"--node={node}", f"--profile={profile}",
            "--plugins-dir=/var/lib/kubelet/plugins", "--registry-dir=/var/lib/kubelet/plugins_registry",
            f"--state-dir={device_plugin_state(resource)}", *(["--pre-start-required"] if pre_start_required else [])]
    return _pod(pod_name(node, resource, "device-plugin"), node, image, "fake_devices.deviceplugin", args, resource)


def device_plugin_state(resource: str) -> PurePosixPath:
    return STATE_ROOT / f"device-plugin-{socket_stem(resource)}"


def _pod(name: str, node: str, image: str, module: str, args: list[str], serves: str) -> dict:
    host = {"plugins-registry": "/var/lib/kubelet/plugins_registry", "plugins": "/var/lib/kubelet/plugins",
            "cdi": "/var/run/cdi", "state": str(STATE_ROOT),
            "pod-resources": "/var/lib/kubelet/pod-resources"}  # for pod_resources(): the kubelet's socket
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE,
                     "labels": {PLUGIN_LABEL: node, "app.kubernetes.io/name": "fake-devices",
                                "app.kubernetes.io/component": "test-kubelet-plugin"},
                     "annotations": {"dra-harness.x-k8s.io/serves": serves}},
        "spec": {
            "nodeName": node,  # bound by us: a node agent, whatever the scheduler would say
            "serviceAccountName": PLUGIN,
            "restartPolicy": "Never",  # a crash stays a crash until the test restarts the plugin
            "tolerations": [{"operator": "Exists"}],
            "terminationGracePeriodSeconds": 30,
            "securityContext": {"runAsUser": 0, "runAsGroup": 0, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "plugin", "image": image, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", WRAPPER, "plugin"], "args": args,
                "env": [{"name": "PLUGIN_MODULE", "value": module}],
                "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                    "capabilities": {"drop": ["ALL"]}},
                "volumeMounts": [{"name": name, "mountPath": path} for name, path in host.items()]
                + [{"name": "run", "mountPath": "/run/plugin"}],
            }],
            "volumes": [{"name": name, "hostPath": {"path": path, "type": "DirectoryOrCreate"}}
                        for name, path in host.items()] + [{"name": "run", "emptyDir": {}}],
        },
    }


def faults_binding(namespace: str) -> dict:
    """Lets the plugin's ServiceAccount read the ConfigMaps of a test's namespace (the fault ConfigMap)."""
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": FAULTS_BINDING, "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
            "subjects": [{"kind": "ServiceAccount", "name": PLUGIN, "namespace": NAMESPACE}]}


class KindNodePlugins:
    """The kubelet plugins one user (a test) runs on a kind worker; `close()` deletes their pods."""

    kubelet_root = PurePosixPath("/var/lib/kubelet")
    plugins_registry = PurePosixPath("/var/lib/kubelet/plugins_registry")
    plugins_dir = PurePosixPath("/var/lib/kubelet/plugins")
    cdi_dir = PurePosixPath("/var/run/cdi")
    pod_resources_socket = None  # inside the node container: pod_resources() asks from a plugin pod instead

    def __init__(self, kubeconfig: Path, node: str, image: str, docker: list[str], docker_env: dict | None,
                 lock_dir: Path):
        self.k8s = Clients(kubeconfig)
        self.node, self.image = node, image
        self._docker, self._docker_env = docker, docker_env
        self._running: dict[tuple[str, str | None], _Running] = {}  # (driver, rolling update id) -> its pod
        self._drivers: set[str] = set()  # every driver this user ran a plugin for
        self._logs = Path(tempfile.mkdtemp(prefix="dra-harness-plugin-logs-"))  # the text of pods gone
        lock_dir.mkdir(parents=True, exist_ok=True)
        self.use = NodeUse(name=node, lock_dir=lock_dir)

    @property
    def name(self) -> str:
        return self.node

    # --- the plugins --------------------------------------------------------------------------------------

    def hold(self) -> None:
        self.use.share()

    def will_disrupt(self) -> None:
        self.use.will_disrupt()

    def run(self, driver: str, instance: str | None = None, namespace: str | None = None,
            rolling_update_id: str | None = None, timeout: float = READY_TIMEOUT) -> None:
        name = self._create(driver, instance, namespace, rolling_update_id)
        self._wait_ready(name, driver, rolling_update_id, timeout)

    def run_for(self, fake_driver) -> tuple[str, ...]:
        """A plugin pod for every driver name of a fake_devices FakeDriver, all created before waiting for any."""
        config = fake_driver.config
        drivers = tuple(fake_driver.drivers.all())
        pods = [self._create(driver, config.instance, config.namespace) for driver in drivers]
        for driver, pod in zip(drivers, pods):
            self._wait_ready(pod, driver, None, READY_TIMEOUT)
        return drivers

    def _create(self, driver: str, instance: str | None, namespace: str | None,
                rolling_update_id: str | None = None) -> str:
        """Create the plugin's pod (and the fault RoleBinding of its namespace); its name."""
        self.use.share()
        if namespace:
            try:
                self.k8s.rbac.create_namespaced_role_binding(namespace, faults_binding(namespace))
            except errors.Conflict:  # one per namespace: a second plugin finds it there
                pass
        body = plugin_pod(self.node, driver, self.image, instance, namespace, rolling_update_id)
        name = body["metadata"]["name"]
        self._running[(driver, rolling_update_id)] = _Running(name, instance, namespace)  # close() deletes it
        self._drivers.add(driver)
        self.k8s.core.create_namespaced_pod(NAMESPACE, body)
        return name

    def stop(self, driver: str, kill: bool = False, rolling_update_id: str | None = None) -> None:
        """SIGTERM (the pod deleted), or SIGKILL to the plugin itself first to simulate a crash; the
        checkpoint stays on the node. Returns once the pod is gone."""
        running = self._running.get((driver, rolling_update_id))
        if running is None:
            return
        if kill:
            self._exec_in(running.pod, ["sh", "-c", "kill -KILL $(cat /run/plugin/pid)"])
            wait.until(f"the plugin of {driver} on {self.node} to end after SIGKILL", lambda: self._ended(running.pod),
                       30, diagnostics=lambda: self._describe(running.pod))
        self._keep_log(running.pod, driver, rolling_update_id)
        self._delete_pod(running.pod)
        del self._running[(driver, rolling_update_id)]

    def restart(self, driver: str, kill: bool = True) -> None:
        running = self._running[(driver, None)]
        self.stop(driver, kill=kill)
        self.run(driver, running.instance, running.namespace)

    def run_instance(self, driver: str, rolling_update_id: str, timeout: float = READY_TIMEOUT) -> None:
        running = self._running[(driver, None)]
        self.run(driver, running.instance, running.namespace, rolling_update_id, timeout)

    def stop_instance(self, driver: str, rolling_update_id: str) -> None:
        self.stop(driver, rolling_update_id=rolling_update_id)

    def log_text(self, driver: str, rolling_update_id: str | None = None) -> str:
        """Everything the plugin of `driver` printed so far, across its restarts."""
        kept = self._log_file(driver, rolling_update_id)
        text = kept.read_text(errors="replace") if kept.exists() else ""
        running = self._running.get((driver, rolling_update_id))
        return text + (self._pod_log(running.pod) if running else "")

    def log(self, driver: str, rolling_update_id: str | None = None) -> Path:
        """A local copy of log_text, written now (for a failure message)."""
        path = self._logs / f"{driver}{'-' + rolling_update_id if rolling_update_id else ''}.now.log"
        path.write_text(self.log_text(driver, rolling_update_id))
        return path

    # --- the node -----------------------------------------------------------------------------------------

    def read(self, path: PurePosixPath) -> str:
        return NodeDir(self.node, PurePosixPath(path).parent, self._docker, self._docker_env).read(PurePosixPath(path).name)

    def names(self, directory: PurePosixPath, pattern: str = "*") -> list[str]:
        """Names of the entries of a node directory matching a shell pattern (sorted; none if it is missing)."""
        script = f'cd {shlex.quote(str(directory))} 2>/dev/null || exit 0; for f in {pattern}; do ' \
                 '[ -e "$f" ] || [ -L "$f" ] && echo "$f"; done; exit 0'
        done = self._on_node(["sh", "-c", script])
        if done.returncode != 0:
            raise HarnessError(f"cannot list {directory} on node {self.node}: {(done.stderr or '').strip()}")
        return sorted(line for line in done.stdout.splitlines() if line)

    def plugin_socket(self, driver: str) -> Path | None:
        return None  # inside the node container: a client here cannot reach it

    def cdi_specs(self, driver: str | None = None) -> list[NodeFile]:
        pattern = f"{driver}-*.json" if driver else "*.json"
        return [NodeFile(name, str(self.cdi_dir / name), self.read(self.cdi_dir / name))
                for name in self.names(self.cdi_dir, pattern)]

    def pod_resources(self, pod: str, namespace: str) -> bytes | None:
        """The kubelet's PodResources `Get` for a pod, asked from inside one of this user's plugin pods (the socket
        is the node's): the serialized GetPodResourcesResponse, or None when the kubelet knows no such pod."""
        running = next(iter(self._running.values()), None)
        if running is None:
            raise HarnessError(f"pod_resources on {self.node} asks through a plugin pod: run a plugin first")
        out = self._exec_in(running.pod, ["python", "-c", POD_RESOURCES_QUERY, pod, namespace]).strip()
        return None if out == "NOTFOUND" else base64.b64decode(out)

    def device_plugins(self) -> KindDevicePlugins:
        """Legacy device plugins on this node, as pods too (the migration tests); the node held meanwhile."""
        self.use.share()
        return KindDevicePlugins(self)

    def restart_kubelet(self, wait_for_others: float = WAIT) -> None:
        """Restart the worker's kubelet (systemd in the node container), alone on the node as on the local
        backend; returns once a new kubelet process answers /healthz."""
        with self.use.alone(wait_for_others):
            before = self._kubelet_pid()
            done = self._on_node(["systemctl", "restart", "kubelet"], timeout=KUBELET_TIMEOUT)
            if done.returncode != 0:
                raise ComponentError(f"kubelet of {self.node}", f"`systemctl restart kubelet` failed: "
                                     f"{(done.stderr or done.stdout).strip()[-300:]}")
            wait.until(f"the restarted kubelet of {self.node} to answer /healthz (through the API server)",
                       lambda: self._kubelet_pid() not in ("", "0", before) and self._healthz() == "ok",
                       KUBELET_TIMEOUT, interval=0.5,
                       diagnostics=lambda: self._on_node(["journalctl", "--unit=kubelet", "--no-pager", "--quiet",
                                                          "--lines=20", "--output=cat"]).stdout)

    def reboot(self, wait_for_others: float = WAIT) -> None:
        raise NotOnThisNode(f"the harness does not reboot kind node {self.node}: restarting a kind node's container "
                            "is not a reboot the cluster is meant to survive")

    def close(self) -> None:
        try:
            # every pod deleted first, then waited for: the plugins end side by side
            pods = [running.pod for running in self._running.values()]
            for pod in pods:
                errors.ignore_missing(self.k8s.core.delete_namespaced_pod, pod, NAMESPACE)
            for pod in pods:
                self._delete_pod(pod)
            self._running.clear()
            # what the plugins left on the node (checkpoint, socket directory): the driver names were this test's own
            leftovers = [str(d / driver) for driver in sorted(self._drivers) for d in (STATE_ROOT, self.plugins_dir)]
            if leftovers:
                self._on_node(["rm", "-rf", "--", *leftovers])
        finally:
            self.use.release()
            self.k8s.close()
            for path in self._logs.iterdir():
                path.unlink(missing_ok=True)
            self._logs.rmdir()

    # --- helpers ------------------------------------------------------------------------------------------

    def _on_node(self, argv: list[str], timeout: float = 60):
        return run_quiet([*self._docker, "exec", self.node, *argv], timeout=timeout, env=self._docker_env)

    def _kubelet_pid(self) -> str:
        return self._on_node(["systemctl", "show", "--property=MainPID", "--value", "kubelet"]).stdout.strip()

    def _healthz(self) -> str:
        try:
            return str(self.k8s.core.connect_get_node_proxy_with_path(self.node, "healthz")).strip()
        except errors.ApiError:  # not answering yet
            return ""

    def _exec_in(self, pod: str, argv: list[str]) -> str:
        """Run a command in a plugin pod's container through the node's containerd (`ctr tasks exec`; kind's nodes
        have no crictl); its output."""
        found = self._pod(pod)
        statuses = (found.status.container_statuses or []) if found is not None else []
        container = (statuses[0].container_id or "").split("://", 1)[-1] if statuses else ""
        if not container:
            raise ComponentError(f"plugin pod {NAMESPACE}/{pod}", f"no running container on node {self.node}")
        exec_id = f"dra-harness-{uuid.uuid4().hex[:12]}"
        done = self._on_node(["ctr", "--namespace=k8s.io", "tasks", "exec", f"--exec-id={exec_id}", container, *argv])
        if done.returncode != 0:
            raise ComponentError(f"plugin pod {NAMESPACE}/{pod}", f"`{' '.join(argv)}` failed (exit {done.returncode}): "
                                 f"{(done.stderr or '').strip()[-1000:]}")
        return done.stdout

    def _pod(self, name: str):
        return errors.ignore_missing(self.k8s.core.read_namespaced_pod, name, NAMESPACE)

    def _ended(self, name: str) -> bool:
        pod = self._pod(name)
        return pod is None or pod.status.phase in ("Succeeded", "Failed")

    def _pod_log(self, name: str) -> str:
        try:
            return self.k8s.core.read_namespaced_pod_log(name, NAMESPACE) or ""
        except (errors.BadRequest, errors.NotFound):  # not started yet, or gone: no text
            return ""

    def _wait_ready(self, name: str, driver: str, rolling_update_id: str | None, timeout: float,
                    on_timeout: Callable[[], None] | None = None, device_plugin: bool = False) -> None:
        """Until the pod's plugin serves and (a DRA kubelet plugin) the kubelet registered it."""
        def ready() -> bool:
            pod = self._pod(name)
            if pod is not None and pod.status.phase in ("Succeeded", "Failed"):
                raise ComponentError(f"plugin {driver} on {self.node}", f"pod {NAMESPACE}/{name} ended during start",
                                     log_tail=self._pod_log(name)[-3000:])
            if pod is None or pod.status.phase != "Running":
                return False
            if device_plugin:  # registers itself with the kubelet, after `ready`
                return "ready\n" in self._pod_log(name)
            try:  # serving, and registered by the kubelet (fake_devices.kubeletplugin.startup)
                return startup.registered(self._pod_log(name), driver)
            except startup.RegistrationRefused as err:
                raise ComponentError(f"plugin {driver} on {self.node}", str(err),
                                     log_tail=self._pod_log(name)[-3000:]) from None

        try:
            wait.until(f"the plugin of {driver} on {self.node} (pod {NAMESPACE}/{name}) to serve and be registered", ready,
                       timeout, interval=0.3, diagnostics=lambda: self._describe(name))
        except wait.WaitTimeout:
            if on_timeout is not None:
                on_timeout()
            else:
                self.stop(driver, rolling_update_id=rolling_update_id)  # ours: never leave it running
            raise

    def _keep_log(self, name: str, driver: str, rolling_update_id: str | None) -> None:
        with open(self._log_file(driver, rolling_update_id), "a") as handle:
            handle.write(self._pod_log(name))

    def _log_file(self, driver: str, rolling_update_id: str | None) -> Path:
        return self._logs / f"{driver}{'-' + rolling_update_id if rolling_update_id else ''}.log"

    def _delete_pod(self, name: str, timeout: float = 90) -> None:
        errors.ignore_missing(self.k8s.core.delete_namespaced_pod, name, NAMESPACE)
        wait.until(f"plugin pod {NAMESPACE}/{name} to be gone (its sockets removed)", lambda: self._pod(name) is None,
                   timeout, diagnostics=lambda: self._describe(name))

    def _describe(self, name: str) -> str:
        pod = self._pod(name)
        if pod is None:
            return f"pod {NAMESPACE}/{name} does not exist"
        statuses = [(s.name, s.state.to_dict() if s.state else None) for s in pod.status.container_statuses or []]
        return (f"pod {NAMESPACE}/{name}: phase {pod.status.phase}, containers {statuses}\n"
                f"log:\n{self._pod_log(name)[-2000:]}")



class KindDevicePlugins:
    """The legacy device plugins one user runs on a kind worker (local: realnode.deviceplugins.NodeDevicePlugins):
    one pod per extended resource; `calls` reads its journal on the node; `close()` deletes the pods."""

    def __init__(self, node: KindNodePlugins):
        self.node = node
        self._pods: dict[str, str] = {}  # resource -> pod

    @property
    def name(self) -> str:
        return self.node.name

    def run(self, resource: str, profile: str, pre_start_required: bool = False) -> None:
        body = device_plugin_pod(self.node.name, resource, profile, self.node.image, pre_start_required)
        self._pods[resource] = body["metadata"]["name"]
        self.node.k8s.core.create_namespaced_pod(NAMESPACE, body)
        self.node._wait_ready(body["metadata"]["name"], f"device plugin {resource}", None, READY_TIMEOUT,
                              on_timeout=lambda: self.stop(resource), device_plugin=True)

    def stop(self, resource: str) -> None:
        """SIGTERM (the pod deleted): its sockets go, the kubelet withdraws the devices."""
        pod = self._pods.pop(resource, None)
        if pod is not None:
            self.node._delete_pod(pod)

    def calls(self, resource: str) -> list[dict]:
        """Every call the kubelet made into the plugin (fake_devices.deviceplugin.journal), read on the node."""
        path = device_plugin_state(resource) / journal.FILE_NAME
        try:
            return journal.parse(self.node.read(path))
        except FileNotFoundError:
            return []

    def close(self) -> None:
        started = list(self._pods)
        for resource in started:
            self.stop(resource)
        if started:
            self.node._on_node(["rm", "-rf", "--", *(str(device_plugin_state(r)) for r in started)])
