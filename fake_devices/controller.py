"""The control-plane half of the fake driver: keeps every node's ResourceSlices as its profile and
its injected faults say.

Three sources (nodes, this instance's slices, the fault ConfigMap), each listed once and then watched
from that list's resourceVersion (so a change made between the two is delivered, not lost), mark nodes
dirty; worker threads reconcile dirty nodes: render the desired slices (fake_devices.render), diff them against the
server's (fake_devices.plan), and write only the difference. Restart-safe: slices are found again by
their instance label and stable names, so a restarted driver rewrites nothing that is already right.
The same class runs as a long-lived process (python -m fake_devices) and inside tests as threads.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any, NamedTuple

from fake_devices import attacher, kube, render, variants
from fake_devices.config import PROFILE_LABEL, DriverConfig
from fake_devices.faults import parse_faults
from fake_devices.plan import dropped_fields, plan_pool

log = logging.getLogger("fake_devices")
INSTANCE_LABEL = render.INSTANCE_LABEL
RESYNC_SECONDS = 300  # a full pass now and then repairs anything a missed watch event left behind
RETRY_SECONDS = 1.0  # after a failure that may pass (connection, 5xx, conflict, throttling)
REJECTED_RETRY_SECONDS = 30.0  # after the API server refused a slice: retrying soon cannot help


class SliceRejected(Exception):
    """The API server refused a ResourceSlice: which slice, which field, and the server's words."""

    def __init__(self, node: str, body: dict, err: kube.ApiError):
        self.node = node
        self.slice_name = (body.get("metadata") or {}).get("name", "?")
        self.driver = (body.get("spec") or {}).get("driver", "?")
        self.status = err.status
        self.message, self.fields = _api_message(err)
        where = f" at {', '.join(self.fields)}" if self.fields else ""
        super().__init__(f"ResourceSlice {self.slice_name} (node {node}, driver {self.driver}) refused by the API "
                         f"server ({err.status} {err.reason}){where}: {self.message}")


class FieldsDropped(SliceRejected):
    """The API server stored a slice without some of its fields: their feature gate is off there. Writing it
    again would lose them again (and, compared with what the driver wants, forever look out of date)."""

    def __init__(self, node: str, body: dict, fields: list[str]):
        Exception.__init__(self, f"ResourceSlice {body['metadata']['name']} (node {node}, driver "
                                 f"{body['spec'].get('driver')}): the API server dropped {', '.join(fields[:8])}"
                                 f"{' ...' if len(fields) > 8 else ''} (a feature gate of these fields is off in the "
                                 "cluster; use a profile without them or turn the gate on)")
        self.node, self.slice_name, self.driver = node, body["metadata"]["name"], body["spec"].get("driver", "?")
        self.status, self.message, self.fields = None, str(self), fields


class PublishError(Exception):
    """The driver could not publish every node's slices; the text lists each node and why."""


class _Source(NamedTuple):
    """One kind of object the driver follows: how to list it, and what a list or a watch event changes."""
    name: str
    list_call: Callable[..., Any]
    kwargs: dict[str, str]
    on_list: Callable[[list], None]
    on_event: Callable[[str, Any], None]
    item_type: str | None = None  # the client's model of one item where a watch cannot derive it


def _api_message(err: kube.ApiError) -> tuple[str, list[str]]:
    """The message and field paths of a Kubernetes Status error body."""
    try:
        status = json.loads(err.body or "")
    except (TypeError, ValueError):
        return str(err.body or err.reason or "").strip()[:2000], []
    if not isinstance(status, dict):
        return str(status)[:2000], []
    causes = ((status.get("details") or {}).get("causes") or []) if isinstance(status.get("details"), dict) else []
    fields = [c["field"] for c in causes if isinstance(c, dict) and c.get("field")]
    return str(status.get("message") or err.reason or "")[:2000], fields


class FakeDriver:
    def __init__(self, config: DriverConfig, api_client: kube.ApiClient):
        self.config = config
        self.drivers = render.Drivers(config.domain)
        self.api = api_client
        self.core = kube.CoreV1Api(api_client)
        self.resource = kube.ResourceV1Api(api_client)
        self._lock = threading.Lock()
        self._nodes: dict[str, tuple[str, str]] = {}  # node -> (uid, profile name)
        # Explicit nodes (config.nodes) can change at run time (assign()); without them the node label decides.
        self._explicit = bool(config.nodes)
        self._assigned: dict[str, str] = dict(config.nodes)
        self._faults: dict[str, dict[str, str]] = {}  # node -> device -> fault kind
        self._slices: dict[str, dict[str, dict]] = defaultdict(dict)  # node -> slice name -> slice dict
        self._dirty: queue.Queue[str | None] = queue.Queue()
        self._queued: set[str] = set()  # waiting in the queue
        self._processing: set[str] = set()  # being reconciled by a worker right now
        self._redo: set[str] = set()  # marked while being reconciled: queue again afterwards
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._watches: set = set()  # open watch streams, closed by stop() so threads end at once
        self._idle = threading.Condition(self._lock)
        self._retrying: set[str] = set()  # failed for a passing reason, retry scheduled: not idle yet
        self.rejected: dict[str, SliceRejected] = {}  # node -> the API server's refusal of its newest try
        self.errors: list[str] = []
        # devices with binding conditions need their attach controller (fake_devices.attacher)
        self.attacher = attacher.Attacher(api_client, self._binding_of, self._stop) \
            if attacher.has_bindings(config.profiles) else None

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self) -> "FakeDriver":
        if self.config.device_classes:
            self.ensure_device_classes()
        sources = self._sources()
        versions = {source.name: self._list(source) for source in sources}
        for source in sources:
            self._spawn(lambda source=source: self._watch_forever(source, versions[source.name]),
                        f"watch-{source.name}")
        self._spawn(self._resync_loop, "resync")
        for i in range(self.config.workers):
            self._spawn(self._worker, f"worker-{i}")
        return self

    def stop(self, *, delete_slices: bool = False) -> None:
        self._stop.set()
        with self._lock:
            watches = list(self._watches)
        for watch in watches:
            watch.stop()  # shuts the stream's socket down, so a blocked read returns now
        for _ in range(self.config.workers):
            self._dirty.put(None)
        for thread in self._threads:
            thread.join(timeout=10)
        if delete_slices:
            self.delete_everything()

    def __enter__(self) -> "FakeDriver":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop(delete_slices=True)

    def _spawn(self, target, name: str) -> None:
        thread = threading.Thread(target=target, name=f"fake-devices-{name}", daemon=True)
        thread.start()
        self._threads.append(thread)

    # --- public helpers -------------------------------------------------------------------------

    def wait_idle(self, timeout: float = 60.0) -> bool:
        """Block until no node is queued, being reconciled or waiting for a retry after a passing failure
        (a node whose slices the API server refused counts as done: see `rejected`)."""
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._queued or self._processing or self._retrying:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._idle.wait(remaining)
        return True

    def publish(self, timeout: float) -> None:
        """Wait until every known node's slices are published; PublishError naming each node that is not
        (the API server refused a slice: which slice, field and message; or still failing at the deadline)."""
        idle = self.wait_idle(timeout)
        with self._lock:
            problems = [str(err) for _, err in sorted(self.rejected.items())]
            if not idle:
                pending = sorted(self._queued | self._processing | self._retrying)
                last = {line.split(":", 1)[0]: line for line in self.errors}
                problems += [f"node {n}: not published after {timeout:.0f}s" + (f" (last error: {last[n]})"
                                                                                 if n in last else "")
                             for n in pending]
        if problems:
            raise PublishError("\n".join(problems))

    def profile_for(self, node: str) -> str | None:
        if self._explicit:
            with self._lock:
                return self._assigned.get(node)
        return None  # label-selected: looked up from the node object

    def assign(self, node: str, profile: str | None) -> None:
        """Serve `node` with `profile` from now on (a driver rolled out to one more node), or stop
        serving it (None: its slices are deleted). Only for a driver started with explicit nodes; the
        profile must be one of its config's. Returns at once; `wait_idle()` waits for the writes."""
        if not self._explicit:
            raise ValueError(f"fake driver {self.config.instance} selects nodes by label; assign() needs explicit nodes")
        if profile is not None and profile not in self.config.profiles:
            raise ValueError(f"profile {profile!r} is not loaded by fake driver {self.config.instance} "
                             f"(loaded: {', '.join(sorted(self.config.profiles))})")
        with self._lock:
            if profile is None:
                self._assigned.pop(node, None)
            else:
                self._assigned[node] = profile
        try:
            self._remember_node(self.core.read_node(node))
        except kube.NotFound:
            with self._lock:
                self._nodes.pop(node, None)  # no such node: nothing to publish
        self._mark(node)

    def ensure_device_classes(self) -> list[str]:
        """One DeviceClass per device type present in the profiles (`<instance>-<type>`)."""
        names = []
        bare = {driver for prof in self.config.profiles.values() if prof.publish.attributes == "none"
                for driver in render.devices_by_driver(prof, "any", self.drivers)}
        for device_type, driver in self._device_types().items():
            name = f"{self.config.instance}-{device_type}"
            # a driver that publishes bare devices has no type attribute to select by: its class is the driver
            expression = (f'device.driver == "{driver}"' if driver in bare else
                          variants.class_expression(self.config.variant, driver, device_type))
            spec: dict = {"selectors": [{"cel": {"expression": expression}}]}
            if device_type in self.config.extended_resources:
                spec["extendedResourceName"] = self.config.extended_resources[device_type]
            body: dict[str, Any] = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                    "metadata": {"name": name, "labels": {INSTANCE_LABEL: self.config.instance}}, "spec": spec}
            try:
                self.resource.create_device_class(body)
            except kube.Conflict:  # it exists: replace it with this one
                current = self.resource.read_device_class(name)
                body["metadata"]["resourceVersion"] = current.metadata.resource_version
                self.resource.replace_device_class(name, body)
            names.append(name)
        return names

    def delete_everything(self) -> None:
        """Remove every slice and DeviceClass of this instance (clean shutdown of a test driver)."""
        selector = f"{INSTANCE_LABEL}={self.config.instance}"
        for item in self.resource.list_resource_slice(label_selector=selector).items:
            kube.ignore_missing(self.resource.delete_resource_slice, item.metadata.name)
        for item in self.resource.list_device_class(label_selector=selector).items:
            kube.ignore_missing(self.resource.delete_device_class, item.metadata.name)

    def _device_types(self) -> dict[str, str]:
        types: dict[str, str] = {}
        for prof in self.config.profiles.values():
            for group in prof.gpus:
                types["gpu"] = self.drivers.gpu
                if group.mig_mode != "none":
                    types["mig"] = self.drivers.gpu
            for storage in prof.storage:
                types[storage.kind] = self.drivers.storage
            if prof.nics:
                types["nic"] = self.drivers.nic
        return types

    # --- state from the API ---------------------------------------------------------------------

    def _binding_of(self, driver: str, pool: str, device: str):
        """The profile's binding settings of one of this instance's devices (pool = node name), or None."""
        if driver not in self.drivers.all():
            return None
        with self._lock:
            entry = self._nodes.get(pool)
        return attacher.binding_of(self.config.profiles[entry[1]], device) if entry else None

    def _node_profile(self, node) -> str | None:
        explicit = self.profile_for(node.metadata.name)
        if self._explicit:
            return explicit
        return (node.metadata.labels or {}).get(PROFILE_LABEL)

    def _remember_node(self, node) -> bool:
        name = node.metadata.name
        profile_name = self._node_profile(node)
        with self._lock:
            before = self._nodes.get(name)
            if profile_name in self.config.profiles:
                self._nodes[name] = (node.metadata.uid, profile_name)
            else:
                self._nodes.pop(name, None)
            return before != self._nodes.get(name)

    def _apply_faults(self, data: dict[str, str]) -> None:
        where = f"ConfigMap {self.config.namespace}/{self.config.faults_configmap} key"
        parsed = {node: parse_faults(text, f"{where} {node}") for node, text in data.items()}
        with self._lock:
            changed = {n for n in set(parsed) | set(self._faults) if parsed.get(n, {}) != self._faults.get(n, {})}
            self._faults = parsed
        for node in changed:
            self._mark(node)

    # --- watches --------------------------------------------------------------------------------

    def _sources(self) -> list["_Source"]:
        slices = {"label_selector": f"{INSTANCE_LABEL}={self.config.instance}"}
        faults = {"namespace": self.config.namespace, "field_selector": f"metadata.name={self.config.faults_configmap}"}
        return [_Source("nodes", self.core.list_node, {}, self._replace_nodes, self._on_node),
                _Source("slices", self.resource.list_resource_slice, slices, self._replace_slices, self._on_slice),
                _Source("faults", self.core.list_namespaced_config_map, faults, self._replace_faults,
                        self._on_faults)] + \
            ([_Source("claims", self.resource.list_resource_claim_for_all_namespaces, {}, self.attacher.on_list,
                      self.attacher.on_event, attacher.CLAIM_MODEL)] if self.attacher else [])

    def _list(self, source: "_Source") -> str:
        """List a source, take its items as the whole truth, and return the resourceVersion to watch from."""
        listed = source.list_call(**source.kwargs)
        source.on_list(listed.items or [])
        return listed.metadata.resource_version

    def _watch_forever(self, source: "_Source", resource_version: str | None) -> None:
        while not self._stop.is_set():
            watch = kube.Watch(return_type=source.item_type)
            with self._lock:
                self._watches.add(watch)
            try:
                if resource_version is None:
                    resource_version = self._list(source)
                for event in watch.stream(source.list_call, resource_version=resource_version, timeout_seconds=30,
                                          allow_watch_bookmarks=True, **source.kwargs):
                    if self._stop.is_set():
                        break
                    obj = event["object"]
                    if event["type"] == "BOOKMARK":  # the client leaves bookmarks as plain dicts
                        resource_version = (obj.get("metadata") or {}).get("resourceVersion", resource_version) \
                            if isinstance(obj, dict) else obj.metadata.resource_version
                        continue
                    resource_version = obj.metadata.resource_version
                    source.on_event(event["type"], obj)
            except kube.ApiError as err:
                if kube.expired(err):  # too old: list again (what the missed events changed is in the list)
                    resource_version = None
                elif not self._stop.is_set():
                    log.warning("watch %s failed: %s %s", source.name, err.status, err.reason)
                    self._stop.wait(1)
            except Exception as err:  # connection drops: retry after a pause
                if not self._stop.is_set():
                    log.warning("watch %s error: %s", source.name, err)
                    self._stop.wait(1)
            finally:
                watch.stop()
                with self._lock:
                    self._watches.discard(watch)

    def _replace_nodes(self, nodes: list) -> None:
        listed = {node.metadata.name for node in nodes}
        with self._lock:
            gone = set(self._nodes) - listed
            for name in gone:
                self._nodes.pop(name)
        changed = {node.metadata.name for node in nodes if self._remember_node(node)}
        for name in gone | changed:
            self._mark(name)

    def _on_node(self, kind: str, node) -> None:
        if kind == "DELETED":
            with self._lock:
                known = self._nodes.pop(node.metadata.name, None)
            if known:
                self._mark(node.metadata.name)
        elif self._remember_node(node):
            self._mark(node.metadata.name)

    def _replace_slices(self, items: list) -> None:
        listed: dict[str, dict[str, dict]] = defaultdict(dict)
        for item in items:
            obj = self.api.sanitize_for_serialization(item)
            listed[_node_of(obj)][obj["metadata"]["name"]] = obj
        with self._lock:
            touched = set(self._slices) | set(listed)
            self._slices = listed
        for node in touched:  # a slice that appeared, changed or went while nobody watched
            self._mark(node)

    def _on_slice(self, kind: str, item) -> None:
        obj = self.api.sanitize_for_serialization(item)
        node, name = _node_of(obj), obj["metadata"]["name"]
        with self._lock:
            known = self._slices[node].get(name)
            if kind == "DELETED":
                self._slices[node].pop(name, None)
            else:
                self._slices[node][name] = obj
        # A change we did not make ourselves (deleted, edited by someone): check the node again.
        # Echoes of our own writes carry the resourceVersion we stored, and are skipped.
        if kind == "DELETED" or known is None or known["metadata"].get("resourceVersion") != obj["metadata"]["resourceVersion"]:
            self._mark(node)

    def _replace_faults(self, configmaps: list) -> None:
        self._apply_faults(next((cm.data or {} for cm in configmaps
                                 if cm.metadata.name == self.config.faults_configmap), {}))

    def _on_faults(self, kind: str, cm) -> None:
        if cm.metadata.name == self.config.faults_configmap:
            self._apply_faults({} if kind == "DELETED" else (cm.data or {}))

    def _resync_loop(self) -> None:
        while not self._stop.wait(RESYNC_SECONDS):
            self._mark_all()

    # --- reconcile ------------------------------------------------------------------------------

    def _mark(self, node: str) -> None:
        """Queue a node for reconciliation. A node is never reconciled by two workers at once: one
        marked while in progress is queued again when its worker finishes (workqueue semantics)."""
        with self._lock:
            if node in self._queued:
                return
            if node in self._processing:
                self._redo.add(node)
                return
            self._queued.add(node)
        self._dirty.put(node)

    def _mark_all(self) -> None:
        with self._lock:
            nodes = set(self._nodes) | {n for n, s in self._slices.items() if s}
        for node in nodes:
            self._mark(node)

    def _worker(self) -> None:
        while True:
            node = self._dirty.get()
            if node is None:
                return
            with self._lock:
                self._queued.discard(node)
                self._processing.add(node)
            retry_after = None
            try:
                self.reconcile(node)
                with self._lock:
                    self.rejected.pop(node, None)
            except SliceRejected as err:
                log.error("%s", err)
                self.errors.append(f"{node}: {err}")
                with self._lock:
                    self.rejected[node] = err
                retry_after = REJECTED_RETRY_SECONDS  # a changed profile or fault may fix it; keep trying, slowly
            except Exception as err:
                detail = f"{err.status} {err.reason}" if isinstance(err, kube.ApiError) else str(err)
                log.warning("reconcile %s failed: %s", node, detail)
                self.errors.append(f"{node}: {detail}")
                retry_after = RETRY_SECONDS
            finally:
                with self._idle:
                    self._processing.discard(node)
                    again = node in self._redo
                    self._redo.discard(node)
                    if retry_after == RETRY_SECONDS and not again and not self._stop.is_set():
                        self._retrying.add(node)
                    self._idle.notify_all()
            if again:
                self._mark(node)
            elif retry_after is not None and not self._stop.is_set():
                timer = threading.Timer(retry_after, self._retry, args=(node,))
                timer.daemon = True
                timer.start()

    def _retry(self, node: str) -> None:
        with self._idle:
            self._retrying.discard(node)
        if not self._stop.is_set():
            self._mark(node)
        with self._idle:
            self._idle.notify_all()

    def desired(self, node: str) -> dict[str, list[dict]]:
        with self._lock:
            entry = self._nodes.get(node)
            faults = dict(self._faults.get(node, {}))
        if entry is None:
            return {}
        uid, profile_name = entry
        if self.config.variant in variants.IGNORES_FAULTS:
            faults = {}
        rendered = render.render_node(self.config.profiles[profile_name], node, self.drivers, faults=faults,
                                      node_uid=uid, instance=self.config.instance)
        return variants.apply(self.config.variant, rendered)

    def reconcile(self, node: str) -> None:
        desired = self.desired(node)
        with self._lock:
            actual_all = list(self._slices.get(node, {}).values())
        for driver in set(desired) | {s["spec"]["driver"] for s in actual_all}:
            actual = [s for s in actual_all if s["spec"]["driver"] == driver]
            plan = plan_pool(desired.get(driver, []), actual)
            for body in plan.create:
                with _refusal(node, body):
                    self._store(node, self.resource.create_resource_slice(body), sent=body)
            for body, resource_version in plan.update:
                body = {**body, "metadata": {**body["metadata"], "resourceVersion": resource_version}}
                try:
                    with _refusal(node, body):
                        self._store(node, self.resource.replace_resource_slice(body["metadata"]["name"], body),
                                    sent=body)
                except kube.Conflict:
                    self._refresh(node)  # someone wrote in between: re-read; the retry uses fresh state
                    raise
            for name in plan.delete:
                kube.ignore_missing(self.resource.delete_resource_slice, name)
                with self._lock:
                    self._slices[node].pop(name, None)

    def _store(self, node: str, item, sent: dict | None = None) -> None:
        obj = self.api.sanitize_for_serialization(item)
        with self._lock:
            self._slices[node][obj["metadata"]["name"]] = obj
        if sent is not None:
            missing = dropped_fields(sent.get("spec"), obj.get("spec"))
            if missing:
                raise FieldsDropped(node, sent, missing)

    def _refresh(self, node: str) -> None:
        # the instance's slices, then the node's among them: a network-attached pool's slices name no node
        found = [self.api.sanitize_for_serialization(i) for i in self.resource.list_resource_slice(
            label_selector=f"{INSTANCE_LABEL}={self.config.instance}").items]
        with self._lock:
            self._slices[node] = {obj["metadata"]["name"]: obj for obj in found if _node_of(obj) == node}


class _refusal:
    """Turn the API server's refusal of `body` (a 4xx that retrying cannot fix) into SliceRejected."""

    def __init__(self, node: str, body: dict):
        self.node, self.body = node, body

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, err, tb) -> None:
        if kube.refused(err):
            raise SliceRejected(self.node, self.body, err) from err


def _node_of(obj: dict) -> str:
    """The node whose reconcile owns a slice: its nodeName, or, for a broken variant's slice that
    claims another node, the node it was rendered for."""
    labels = obj["metadata"].get("labels") or {}
    return (labels.get(variants.RENDERED_FOR_LABEL) or obj["spec"].get("nodeName") or labels.get(render.RENDERED_FOR_LABEL)
            or "")

