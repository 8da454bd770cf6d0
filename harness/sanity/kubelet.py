"""The kubelet's side of the plugin sockets: what the 1.37 kubelet sends a DRA plugin, as plain calls.

Registration (`GetInfo`, `NotifyRegistrationStatus`) on the plugin's registration socket, then
`NodePrepareResources` / `NodeUnprepareResources` in the DRAPlugin version the kubelet would choose
(the first of v1, v1beta1 the plugin advertises: pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go at
v1.37.2) or one a check names, and the `NodeWatchResources` health stream. The stubs are the fake
driver's, generated from protos the unit tests keep equal to k8s.io/kubelet v0.37.2's.

Answers come back as plain records so a check can say what was wrong without knowing protobuf.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from fake_devices.kubeletplugin.generated import dra_health_v1_pb2 as health_v1
from fake_devices.kubeletplugin.generated import dra_health_v1_pb2_grpc as health_v1_grpc
from fake_devices.kubeletplugin.generated import dra_health_v1alpha1_pb2 as health_v1alpha1
from fake_devices.kubeletplugin.generated import dra_health_v1alpha1_pb2_grpc as health_v1alpha1_grpc
from fake_devices.kubeletplugin.generated import dra_v1_pb2 as dra_v1
from fake_devices.kubeletplugin.generated import dra_v1_pb2_grpc as dra_v1_grpc
from fake_devices.kubeletplugin.generated import dra_v1beta1_pb2 as dra_v1beta1
from fake_devices.kubeletplugin.generated import dra_v1beta1_pb2_grpc as dra_v1beta1_grpc
from fake_devices.kubeletplugin.generated import pluginregistration_v1_pb2 as registration
from fake_devices.kubeletplugin.generated import pluginregistration_v1_pb2_grpc as registration_grpc

PLUGIN_TYPE = "DRAPlugin"  # pkg/apis/pluginregistration/v1/constants.go
DRA_SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")  # the kubelet's order of preference
HEALTH_SERVICES = ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")
CALL_TIMEOUT = 45.0  # the kubelet's default plugin call timeout is 45 s (pluginClientTimeout)
_PROTOS = {"v1.DRAPlugin": (dra_v1, dra_v1_grpc), "v1beta1.DRAPlugin": (dra_v1beta1, dra_v1beta1_grpc)}
_HEALTH = {"v1.DRAResourceHealth": (health_v1, health_v1_grpc),
           "v1alpha1.DRAResourceHealth": (health_v1alpha1, health_v1alpha1_grpc)}


@dataclass(frozen=True)
class ClaimRef:
    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name} ({self.uid})"


@dataclass(frozen=True)
class PreparedDevice:
    pool: str
    device: str
    requests: tuple[str, ...]
    cdi_ids: tuple[str, ...]
    share_id: str | None = None


@dataclass
class Answer:
    """One call's answer: per claim UID its error ("" when it succeeded) and, for Prepare, its devices;
    or the error of the call as a whole (`call_error`, the gRPC status), with no claims."""

    claims: dict[str, str] = field(default_factory=dict)  # uid -> error
    devices: dict[str, list[PreparedDevice]] = field(default_factory=dict)  # uid -> devices (Prepare)
    call_error: str = ""

    def ok(self, uid: str) -> bool:
        return not self.call_error and uid in self.claims and not self.claims[uid]

    def refused(self, uid: str) -> bool:
        """The claim was not prepared: the call failed, or the claim's entry has an error."""
        return bool(self.call_error) or bool(self.claims.get(uid))

    def describe(self, uid: str) -> str:
        if self.call_error:
            return f"the call failed: {self.call_error}"
        if uid not in self.claims:
            return f"no entry for claim UID {uid} (entries: {', '.join(sorted(self.claims)) or 'none'})"
        return f"error {self.claims[uid]!r}" if self.claims[uid] else "succeeded"


@dataclass(frozen=True)
class PluginInfo:
    type: str
    name: str
    endpoint: str
    versions: tuple[str, ...]

    def dra_service(self) -> str | None:
        """The DRAPlugin version the 1.37 kubelet would pick, or None if it would refuse the plugin."""
        return next((s for s in DRA_SERVICES if s in self.versions), None)

    def health_service(self) -> str | None:
        return next((s for s in HEALTH_SERVICES if s in self.versions), None)


def registration_sockets(registry_dir: Path, driver: str) -> list[Path]:
    """The driver's registration sockets, newest first, as the plugin watcher would find them."""
    try:
        found = [p for p in Path(registry_dir).iterdir() if p.name.startswith(driver) and p.name.endswith("reg.sock")
                 and p.is_socket()]
    except FileNotFoundError:
        return []
    return sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)


def _channel(socket: str | Path) -> grpc.Channel:
    return grpc.insecure_channel(f"unix:{socket}")


def get_info(socket: Path, timeout: float = 10.0) -> PluginInfo:
    with _channel(socket) as channel:
        info = registration_grpc.RegistrationStub(channel).GetInfo(registration.InfoRequest(),  # type: ignore[attr-defined]
                                                                     timeout=timeout)
    return PluginInfo(info.type, info.name, info.endpoint, tuple(info.supported_versions))


def notify(socket: Path, registered: bool, error: str = "", timeout: float = 10.0) -> None:
    status = registration.RegistrationStatus(plugin_registered=registered, error=error)  # type: ignore[attr-defined]
    with _channel(socket) as channel:
        registration_grpc.RegistrationStub(channel).NotifyRegistrationStatus(status, timeout=timeout)


def _call(endpoint: str, service: str, method: str, claims: list[ClaimRef], timeout: float):
    """One DRAPlugin call with these claims: (response, "") or (None, the gRPC status of a failed call)."""
    proto, stubs = _PROTOS[service]
    request = getattr(proto, f"{method}Request")(claims=[proto.Claim(namespace=c.namespace, name=c.name, uid=c.uid)
                                                         for c in claims])
    with _channel(endpoint) as channel:
        try:
            return getattr(stubs.DRAPluginStub(channel), method)(request, timeout=timeout), ""
        except grpc.RpcError as err:
            return None, _status(err)


def prepare(endpoint: str, service: str, claims: list[ClaimRef], timeout: float = CALL_TIMEOUT) -> Answer:
    response, error = _call(endpoint, service, "NodePrepareResources", claims, timeout)
    if response is None:
        return Answer(call_error=error)
    answer = Answer()
    for uid, result in response.claims.items():
        answer.claims[uid] = result.error
        answer.devices[uid] = [PreparedDevice(d.pool_name, d.device_name, tuple(d.request_names),
                                              tuple(d.cdi_device_ids),
                                              d.share_id if service == "v1.DRAPlugin" and d.HasField("share_id")
                                              else None)
                               for d in result.devices]
    return answer


def unprepare(endpoint: str, service: str, claims: list[ClaimRef], timeout: float = CALL_TIMEOUT) -> Answer:
    response, error = _call(endpoint, service, "NodeUnprepareResources", claims, timeout)
    if response is None:
        return Answer(call_error=error)
    return Answer(claims={uid: result.error for uid, result in response.claims.items()})


def _status(err: grpc.RpcError) -> str:
    code = err.code() if hasattr(err, "code") else None
    details = err.details() if hasattr(err, "details") else str(err)
    return f"{code.name if code else 'UNKNOWN'}: {details}"


@dataclass(frozen=True)
class HealthReport:
    at: float  # monotonic seconds since the stream was opened
    devices: tuple[tuple[str, str, str, int, str], ...]  # (pool, device, health, timeout seconds, message)


def watch_health(endpoint: str, service: str, reports: int, within: float) -> tuple[list[HealthReport], str]:
    """Open NodeWatchResources and collect up to `reports` reports for at most `within` seconds.
    Returns (reports, the error that ended the stream early, or "")."""
    proto, stubs = _HEALTH[service]
    received: queue.Queue = queue.Queue()
    channel = _channel(endpoint)
    stream = stubs.DRAResourceHealthStub(channel).NodeWatchResources(proto.NodeWatchResourcesRequest())
    opened = time.monotonic()

    def read() -> None:  # in a thread: a stream that sends nothing must not block the deadline
        try:
            for message in stream:
                received.put(HealthReport(round(time.monotonic() - opened, 3), tuple(
                    (d.device.pool_name, d.device.device_name, proto.HealthStatus.Name(d.health),
                     d.health_check_timeout_seconds, d.message) for d in message.devices)))
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.CANCELLED:
                received.put(_status(err))
        received.put(None)

    reader = threading.Thread(target=read, name="health-stream", daemon=True)
    reader.start()
    got: list[HealthReport] = []
    error = ""
    deadline = opened + within
    try:
        while len(got) < reports:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                item = received.get(timeout=left)
            except queue.Empty:
                break
            if item is None:
                error = error or "the plugin ended the stream"
                break
            if isinstance(item, str):
                error = item
                continue
            got.append(item)
    finally:
        stream.cancel()
        channel.close()
        reader.join(5)
    return got, error
