"""A reference node health monitor: device health in, one DeviceTaintRule per unhealthy device out.

    python -m fake_devices.healthmonitor --name hm --kubeconfig K \\
        --driver gpu.fd.example.com --faults dra-test/fd-faults \\
        --health-socket gpu.fd.example.com=/var/lib/kubelet/plugins/gpu.fd.example.com/dra.sock

What the 1.37 release asks SREs to build ("incorporate DeviceTaintRule definitions into automated
node health monitors to isolate degraded accelerator units"), small enough to read in one sitting,
and the monitor the conformance suite's health-monitor tests judge by default.

Sources (any combination; a device's state is the worst any source reports):
- the fake driver's fault ConfigMap (`--faults NAMESPACE/NAME`, fake_devices/faults.py), applied to
  the devices the `--driver`s publish on each node: `degraded` -> degraded; `unhealthy`, `lost` ->
  failed; `warning` -> healthy. A MIG device shares its GPU's fault, as in the slices.
- a kubelet plugin's DRAResourceHealth stream (`--health-socket DRIVER=PATH`, v1, else v1alpha1):
  UNHEALTHY -> failed; HEALTHY and UNKNOWN ("no opinion") -> healthy. While a stream is down its
  last report stands, so a restarting plugin does not make rules flap.

Output: per degraded device a rule with effect NoSchedule (no new allocations, running pods stay),
per failed device NoExecute (pods using it are evicted, after a toleration's tolerationSeconds);
the rule goes when the device recovers. Every rule selects exactly one device (driver, pool,
device: never an empty selector, which would select every device), carries the label
`dra-harness.x-k8s.io/health-monitor=<name>` and is the only kind of rule this monitor lists,
changes or deletes. At most `--max-rules` rules (failed devices first): a source gone mad must not
cordon a fleet. On SIGTERM/SIGINT the monitor deletes its rules and exits (`--keep-rules` keeps
them for a restart: names are stable, so a restarted monitor adopts them).
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import grpc

from fake_devices import entrypoint, faultkinds, kube
from fake_devices.errors import InvalidInput, Problem
from fake_devices.faults import parse_faults
from fake_devices.kubeletplugin.generated import (
    dra_health_v1_pb2,
    dra_health_v1_pb2_grpc,
    dra_health_v1alpha1_pb2,
    dra_health_v1alpha1_pb2_grpc,
)
from fake_devices.kubeletplugin.health import fault_kinds
from fake_devices.kubeletplugin.watch import ListWatch
from fake_devices.schema import DNS_LABEL, DNS_SUBDOMAIN

log = logging.getLogger("fake_devices.healthmonitor")

MONITOR_LABEL = "dra-harness.x-k8s.io/health-monitor"  # which monitor owns a rule
DEVICE_ANNOTATION = "dra-harness.x-k8s.io/device"  # driver/pool/device, for people reading the rule
REASON_ANNOTATION = "dra-harness.x-k8s.io/health-reason"
TAINT_KEY = "dra-harness.x-k8s.io/health"  # value: degraded | failed
HEALTHY, DEGRADED, FAILED = "healthy", "degraded", "failed"
SEVERITY = {HEALTHY: 0, DEGRADED: 1, FAILED: 2}
EFFECTS = {DEGRADED: "NoSchedule", FAILED: "NoExecute"}
# fault kind -> the monitor's verdict (kinds it calls healthy left out), from the one table of fault kinds
FAULT_STATES = {k.name: k.monitor_state for k in faultkinds.KINDS.values() if k.monitor_state != HEALTHY}
MAX_NAME = 40  # the monitor's name; its rules are `<name>-<12 hex digits>`
DEFAULT_MAX_RULES = 64
RESYNC_SECONDS = 30.0  # a full reconcile now and then repairs a rule someone else deleted or edited

Device = tuple[str, str, str]  # (driver, pool, device)


@dataclass(frozen=True)
class Verdict:
    state: str
    reason: str


def worst(verdicts: Iterable[Verdict]) -> Verdict:
    return max(verdicts, key=lambda v: SEVERITY[v.state], default=Verdict(HEALTHY, ""))


def rule_name(monitor: str, device: Device) -> str:
    """Stable per monitor and device, so a restarted monitor finds its rules again."""
    return f"{monitor}-{hashlib.sha256('/'.join(device).encode()).hexdigest()[:12]}"


def rule_body(monitor: str, device: Device, verdict: Verdict) -> dict:
    driver, pool, name = device
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule",
            "metadata": {"name": rule_name(monitor, device), "labels": {MONITOR_LABEL: monitor},
                         "annotations": {DEVICE_ANNOTATION: "/".join(device), REASON_ANNOTATION: verdict.reason[:1024]}},
            "spec": {"deviceSelector": {"driver": driver, "pool": pool, "device": name},
                     "taint": {"key": TAINT_KEY, "value": verdict.state, "effect": EFFECTS[verdict.state]}}}


def verdicts_from_faults(slices: Iterable[dict], drivers: set[str], faults_by_node: dict[str, dict[str, str]]
                         ) -> dict[Device, Verdict]:
    """The unhealthy devices among those `drivers` publish, by the fault ConfigMap (keyed by node)."""
    published: dict[tuple[str, str], set[tuple[str, str]]] = {}  # (driver, node) -> {(pool, device)}
    for item in slices:
        spec = item.get("spec") or {}
        if spec.get("driver") not in drivers or not spec.get("nodeName"):
            continue
        pool = (spec.get("pool") or {}).get("name", "")
        entry = published.setdefault((spec["driver"], spec["nodeName"]), set())
        entry.update((pool, d.get("name", "")) for d in spec.get("devices") or [])
    result = {}
    for (driver, node), devices in published.items():
        faults = faults_by_node.get(node) or {}
        if not faults:
            continue
        kinds = fault_kinds(sorted({name for _, name in devices}), faults)
        for pool, name in devices:
            state = FAULT_STATES.get(kinds.get(name) or "")
            if state:
                result[(driver, pool, name)] = Verdict(state, f"fault '{kinds[name]}' on node {node}")
    return result


def desired_rules(monitor: str, verdicts: dict[Device, Verdict], max_rules: int) -> tuple[dict[str, dict], int]:
    """The rule bodies by name for every unhealthy device, failed ones first, at most `max_rules`;
    and how many unhealthy devices were left without a rule because of the bound."""
    unhealthy = sorted(((d, v) for d, v in verdicts.items() if v.state != HEALTHY),
                       key=lambda item: (-SEVERITY[item[1].state], item[0]))
    kept = unhealthy[:max_rules]
    return {rule_name(monitor, d): rule_body(monitor, d, v) for d, v in kept}, len(unhealthy) - len(kept)


class HealthStream:
    """Follow one kubelet plugin's DRAResourceHealth stream (the same one the kubelet reads)."""

    def __init__(self, driver: str, socket_path: Path, on_change: Callable[[], None], stop: threading.Event):
        self.driver, self.socket_path = driver, Path(socket_path)
        self._on_change, self._stop = on_change, stop
        self._lock = threading.Lock()
        self._health: dict[tuple[str, str], tuple[str, str]] = {}  # (pool, device) -> (status, message)
        self._call: Any = None
        self.connected = threading.Event()  # has received at least one complete list
        self.last_error: str | None = None
        self._thread = threading.Thread(target=self._run, name=f"health-{driver}", daemon=True)

    def start(self) -> "HealthStream":
        self._thread.start()
        return self

    def close(self) -> None:
        call = self._call
        if call is not None:
            call.cancel()
        self._thread.join(timeout=10)

    def verdicts(self) -> dict[Device, Verdict]:
        with self._lock:
            return {(self.driver, pool, device): Verdict(FAILED, f"plugin reports UNHEALTHY: {message}")
                    for (pool, device), (status, message) in self._health.items() if status == "UNHEALTHY"}

    def _run(self) -> None:
        versions = [(dra_health_v1_pb2, dra_health_v1_pb2_grpc), (dra_health_v1alpha1_pb2, dra_health_v1alpha1_pb2_grpc)]
        choice = 0
        while not self._stop.is_set():
            pb2, pb2_grpc = versions[choice]
            try:
                with grpc.insecure_channel(f"unix:{self.socket_path.absolute()}") as channel:
                    self._call = pb2_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
                        pb2.NodeWatchResourcesRequest())
                    for response in self._call:
                        health = {(d.device.pool_name, d.device.device_name):
                                  (pb2.HealthStatus.Name(d.health), d.message) for d in response.devices}
                        with self._lock:
                            changed, self._health = health != self._health, health
                        self.last_error = None
                        self.connected.set()
                        if changed:
                            self._on_change()
            except grpc.RpcError as err:
                if self._stop.is_set():
                    return
                if err.code() == grpc.StatusCode.UNIMPLEMENTED:
                    choice = (choice + 1) % len(versions)  # an older plugin: try the other version
                self.last_error = f"{err.code().name}: {err.details()}"
                log.warning("health stream of %s at %s: %s; retrying in 1s", self.driver, self.socket_path,
                            self.last_error)
            finally:
                self._call = None
            self._stop.wait(1.0)


class HealthMonitor:
    def __init__(self, name: str, api_client: kube.ApiClient, *, drivers: Iterable[str] = (),
                 faults: tuple[str, str] | None = None, health_sockets: dict[str, Path] | None = None,
                 max_rules: int = DEFAULT_MAX_RULES, resync_seconds: float = RESYNC_SECONDS):
        self.name, self.drivers, self.faults = name, set(drivers), faults
        self.max_rules, self.resync_seconds = max_rules, resync_seconds
        self.resource = kube.ResourceV1Api(api_client)
        self.core = kube.CoreV1Api(api_client)
        self._stop = threading.Event()
        self._dirty = threading.Condition()
        self._pending = True
        self._watches: list[ListWatch] = []
        self._slices: list[ListWatch] = []
        self._faults_watch: ListWatch | None = None
        self._streams = [HealthStream(d, p, self._mark, self._stop) for d, p in (health_sockets or {}).items()]
        self._thread = threading.Thread(target=self._loop, name="reconcile", daemon=True)
        self.left_out = 0  # unhealthy devices without a rule because of max_rules
        self.errors: list[str] = []

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self, sync_timeout: float = 30.0) -> "HealthMonitor":
        """Start the sources, wait until each has been read once, reconcile once; then keep going."""
        if self.faults is not None:
            namespace, configmap = self.faults
            for driver in sorted(self.drivers):
                self._slices.append(ListWatch(f"slices of {driver}", self.resource.list_resource_slice,
                                              self._on_items, field_selector=f"spec.driver={driver}"))
            self._faults_watch = ListWatch(f"faults {namespace}/{configmap}", self.core.list_namespaced_config_map,
                                           self._on_items, namespace=namespace,
                                           field_selector=f"metadata.name={configmap}")
            self._watches = [*self._slices, self._faults_watch]
        for watch in self._watches:
            watch.start()
        for stream in self._streams:
            stream.start()
        for watch in self._watches:
            if not watch.wait_synced(sync_timeout):
                raise RuntimeError(f"could not read {watch.what} within {sync_timeout:.0f}s: "
                                   f"{watch.last_error or 'no answer'}")
        for stream in self._streams:
            if not stream.connected.wait(sync_timeout):
                raise RuntimeError(f"no health report from {stream.driver} at {stream.socket_path} within "
                                   f"{sync_timeout:.0f}s: {stream.last_error or 'no answer'}")
        self.reconcile()
        self._thread.start()
        return self

    def stop(self, delete_rules: bool = True) -> None:
        self._stop.set()
        self._mark()
        if self._thread.is_alive():
            self._thread.join(timeout=30)
        for watch in self._watches:
            watch.stop()
        for stream in self._streams:
            stream.close()
        if delete_rules:
            self.delete_own_rules()

    # --- state ----------------------------------------------------------------------------------

    def verdicts(self) -> dict[Device, Verdict]:
        sources: list[dict[Device, Verdict]] = [s.verdicts() for s in self._streams]
        if self._faults_watch is not None:
            data: dict[str, str] = {}
            for item in self._faults_watch.items().values():
                data = item.get("data") or {}
            slices = [s for watch in self._slices for s in watch.items().values()]
            sources.append(verdicts_from_faults(slices, self.drivers, {n: parse_faults(t, f"fault ConfigMap key {n}") for n, t in data.items()}))
        merged: dict[Device, Verdict] = {}
        for device in {d for source in sources for d in source}:
            merged[device] = worst(source[device] for source in sources if device in source)
        return merged

    def own_rules(self) -> dict[str, Any]:
        items = self.resource.list_device_taint_rule(label_selector=f"{MONITOR_LABEL}={self.name}").items
        return {r.metadata.name: r for r in items}

    def reconcile(self) -> None:
        """Make this monitor's rules exactly the desired ones (create, change the effect, delete)."""
        desired, self.left_out = desired_rules(self.name, self.verdicts(), self.max_rules)
        if self.left_out:
            log.warning("%d unhealthy devices left without a rule: at most %d rules (--max-rules)", self.left_out,
                        self.max_rules)
        actual = self.own_rules()
        for name, body in desired.items():
            current = actual.get(name)
            if current is None:
                log.info("isolating %s: %s (%s)", body["metadata"]["annotations"][DEVICE_ANNOTATION],
                         body["spec"]["taint"]["effect"], body["metadata"]["annotations"][REASON_ANNOTATION])
                _ignore(kube.Conflict, self.resource.create_device_taint_rule, body)
                continue
            taint, selector = current.spec.taint, current.spec.device_selector
            wanted_selector = body["spec"]["deviceSelector"]
            if (taint.key, taint.value, taint.effect) != (TAINT_KEY, body["spec"]["taint"]["value"],
                                                          body["spec"]["taint"]["effect"]) or \
                    selector is None or (selector.driver, selector.pool, selector.device) != (
                        wanted_selector["driver"], wanted_selector["pool"], wanted_selector["device"]):
                log.info("changing %s to %s", name, body["spec"]["taint"]["effect"])
                body["metadata"]["resourceVersion"] = current.metadata.resource_version
                # A new effect is a new taint: tolerationSeconds count from now.
                body["spec"]["taint"]["timeAdded"] = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
                _ignore(kube.Conflict, self.resource.replace_device_taint_rule, name, body)
        for name, current in actual.items():
            if name not in desired:
                log.info("recovered: deleting %s (%s)", name,
                         (current.metadata.annotations or {}).get(DEVICE_ANNOTATION, "?"))
                kube.ignore_missing(self.resource.delete_device_taint_rule, name)

    def delete_own_rules(self) -> list[str]:
        deleted = []
        for name in self.own_rules():
            kube.ignore_missing(self.resource.delete_device_taint_rule, name)
            deleted.append(name)
        return deleted

    # --- work -----------------------------------------------------------------------------------

    def _on_items(self, _items: dict) -> None:
        self._mark()

    def _mark(self) -> None:
        with self._dirty:
            self._pending = True
            self._dirty.notify_all()

    def _loop(self) -> None:
        while True:
            with self._dirty:
                self._dirty.wait_for(lambda: self._pending or self._stop.is_set(), self.resync_seconds)
                self._pending = False
            if self._stop.is_set():
                return
            try:
                self.reconcile()
            except Exception as err:  # API hiccup: note it and try again soon
                detail = f"{err.status} {err.reason}" if isinstance(err, kube.ApiError) else str(err)
                log.warning("reconcile failed: %s; retrying in 1s", detail)
                self.errors.append(detail)
                self._stop.wait(1.0)
                self._mark()


def _ignore(error: type[kube.ApiError], call, *args):
    """The call's result, None when it failed with `error` (a rule someone else wrote meanwhile: the next
    pass reads it)."""
    try:
        return call(*args)
    except error:
        return None


# --- command line -------------------------------------------------------------------------------

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m fake_devices.healthmonitor",
                                     description="keep one DeviceTaintRule per degraded (NoSchedule) or failed "
                                                 "(NoExecute) device; delete them on recovery and on exit")
    parser.add_argument("--name", required=True, help="this monitor's name: label value and prefix of its rules")
    parser.add_argument("--kubeconfig", default=None, help="default: in-cluster configuration")
    parser.add_argument("--driver", action="append", default=[], help="driver whose devices the faults apply to")
    parser.add_argument("--faults", default=None, metavar="NAMESPACE/NAME", help="the fake driver's fault ConfigMap")
    parser.add_argument("--health-socket", action="append", default=[], metavar="DRIVER=PATH",
                        help="a kubelet plugin's dra.sock serving DRAResourceHealth")
    parser.add_argument("--max-rules", type=int, default=DEFAULT_MAX_RULES)
    parser.add_argument("--keep-rules", action="store_true", help="leave the rules in place on exit")
    return parser.parse_args(argv)


def validate(args: argparse.Namespace) -> tuple[tuple[str, str] | None, dict[str, Path]]:
    """The parsed --faults and --health-socket values; InvalidInput naming every bad flag."""
    problems = []
    if not DNS_LABEL.match(args.name or "") or len(args.name) > MAX_NAME:
        problems.append(Problem("--name", args.name, "not a usable monitor name",
                                f"a DNS label of at most {MAX_NAME} characters"))
    for driver in args.driver:
        if not DNS_SUBDOMAIN.match(driver) or len(driver) > 63:
            problems.append(Problem("--driver", driver, "not a driver name", "a DNS subdomain of at most 63 characters"))
    faults = None
    if args.faults is not None:
        namespace, _, configmap = args.faults.partition("/")
        if not DNS_LABEL.match(namespace) or not DNS_SUBDOMAIN.match(configmap):
            problems.append(Problem("--faults", args.faults, "not NAMESPACE/NAME", "e.g. dra-test/fd0-faults"))
        elif not args.driver:
            problems.append(Problem("--faults", args.faults, "faults apply to the devices of the --driver names",
                                    "at least one --driver"))
        else:
            faults = (namespace, configmap)
    sockets: dict[str, Path] = {}
    for item in args.health_socket:
        driver, _, path = item.partition("=")
        if not DNS_SUBDOMAIN.match(driver) or not path.startswith("/"):
            problems.append(Problem("--health-socket", item, "not DRIVER=PATH", "a driver name, '=', an absolute path"))
        else:
            sockets[driver] = Path(path)
    if args.faults is None and not args.health_socket:
        problems.append(Problem("--faults/--health-socket", "(none)", "no health source", "at least one of them"))
    if not 1 <= args.max_rules <= 1000:
        problems.append(Problem("--max-rules", str(args.max_rules), "out of range", "1 to 1000"))
    if problems:
        raise InvalidInput(problems)
    return faults, sockets


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(threadName)s %(message)s")
    try:
        faults, sockets = validate(args)
    except InvalidInput as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    stopping = entrypoint.stop_on_signals()
    try:
        api_client = kube.api_client(args.kubeconfig)
    except kube.ConfigException as err:
        print(f"error: --kubeconfig: {err}", file=sys.stderr)
        return 2
    monitor = HealthMonitor(args.name, api_client, drivers=args.driver, faults=faults, health_sockets=sockets,
                            max_rules=args.max_rules)
    try:
        monitor.start()
    except Exception as err:
        print(f"error: {err}", file=sys.stderr)
        monitor.stop(delete_rules=not args.keep_rules)
        return 1
    print("ready", flush=True)  # callers wait for this line
    stopping.wait()
    monitor.stop(delete_rules=not args.keep_rules)
    api_client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
