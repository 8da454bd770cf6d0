"""One device plugin: serves DevicePlugin on its socket, then makes itself known to the kubelet.

Two ways to register, both kubelet v1.37 code paths:
- `watcher` (default): a pluginregistration socket in the node's plugins_registry directory, found
  by the kubelet's plugin watcher (type "DevicePlugin"; kubelet cm.GetPluginRegistrationHandlers).
  The directory is the kubelet's --root-dir, so it is per node even with several kubelets on one
  machine.
- `kubelet-socket`: the classic `Registration.Register` call on `<device-plugins dir>/kubelet.sock`,
  with the plugin's socket in the same directory. The kubelet hard-codes that directory
  (/var/lib/kubelet/device-plugins, pluginapi.KubeletSocket), so on a machine running several
  kubelets the newest one owns it: the harness's real nodes use `watcher`.
stop() removes the sockets; the kubelet then sees the stream end and the devices go unhealthy.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

import grpc

from fake_devices.deviceplugin import servicer
from fake_devices.deviceplugin.devices import MAX_ID_LENGTH, Device, DeviceList
from fake_devices.deviceplugin.journal import FILE_NAME, Journal
from fake_devices.deviceplugin.sockets import MAX_SOCKET_PATH, DevicePluginError, new_server, serve_unix, stop_server
from fake_devices.errors import InvalidInput, Problem
from fake_devices.kubeletplugin.generated import deviceplugin_v1beta1_pb2_grpc as api_grpc
from fake_devices.kubeletplugin.generated import pluginregistration_v1_pb2_grpc

log = logging.getLogger("fake_devices.deviceplugin")
REGISTRATIONS = ("watcher", "kubelet-socket")
EXTENDED_RESOURCE = r"^(?!kubernetes\.io/)(?!requests\.)[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
REGISTER_TIMEOUT = 10.0


def socket_stem(resource: str) -> str:
    """example.com/gpu -> example.com_gpu (a file name)."""
    return resource.replace("/", "_")


@dataclass(frozen=True)
class DevicePluginConfig:
    resource: str  # the extended resource, e.g. example.com/gpu
    node: str
    devices: tuple[Device, ...]
    registration: str = "watcher"
    plugins_dir: Path = Path("/var/lib/kubelet/plugins")  # watcher: the socket goes to <dir>/<stem>/
    registry_dir: Path = Path("/var/lib/kubelet/plugins_registry")  # watcher: <stem>-reg.sock goes here
    kubelet_socket: Path = Path("/var/lib/kubelet/device-plugins/kubelet.sock")  # kubelet-socket mode
    state_dir: Path | None = None  # the call journal; default: beside the plugin socket
    # Ask the kubelet to call PreStartContainer before each container start. Off by default, as in
    # common GPU plugins; on, a kubelet v1.37.2 bug blocks DRA pods of the same resource on the node
    # for 5 minutes after the plugin is gone (docs/migration.md, "Known kubelet bug").
    pre_start_required: bool = False

    @property
    def plugin_socket(self) -> Path:
        if self.registration == "kubelet-socket":
            return Path(self.kubelet_socket).parent / f"{socket_stem(self.resource)}.sock"
        return Path(self.plugins_dir) / f"dp-{socket_stem(self.resource)}" / "device-plugin.sock"

    @property
    def registration_socket(self) -> Path:
        return Path(self.registry_dir) / f"dp-{socket_stem(self.resource)}-reg.sock"

    @property
    def journal_file(self) -> Path:
        return (Path(self.state_dir) if self.state_dir else self.plugin_socket.parent) / FILE_NAME

    def validate(self) -> "DevicePluginConfig":
        problems = []
        if not re.match(EXTENDED_RESOURCE, self.resource or ""):
            problems.append(Problem("--resource", self.resource, "not an extended resource name",
                                    "domain/name outside kubernetes.io, e.g. example.com/gpu"))
        if self.registration not in REGISTRATIONS:
            problems.append(Problem("--registration", self.registration, "unknown", ", ".join(REGISTRATIONS)))
        if not self.devices:
            problems.append(Problem("--devices", "", "no devices to advertise", "a profile with GPUs, or IDs"))
        for device in self.devices:
            if not device.id or len(device.id) > MAX_ID_LENGTH:
                problems.append(Problem("--devices", device.id, "not a device ID", f"1 to {MAX_ID_LENGTH} characters"))
        sockets = [("--plugins-dir", self.plugin_socket)]
        if self.registration == "watcher":
            sockets.append(("--registry-dir", self.registration_socket))
        for flag, path in sockets:
            if len(str(Path(path).absolute()).encode()) > MAX_SOCKET_PATH:
                problems.append(Problem(flag, str(path), f"socket path longer than {MAX_SOCKET_PATH} bytes",
                                        "a shorter directory"))
        if problems:
            raise InvalidInput(problems)
        return self


class FakeDevicePlugin:
    def __init__(self, config: DevicePluginConfig):
        self.config = config.validate()
        self.devices = DeviceList(list(config.devices))
        self.journal = Journal(config.journal_file)
        self.service = servicer.DevicePlugin(config.resource, config.node, self.devices, self.journal,
                                             config.pre_start_required)
        self.registration = servicer.WatcherRegistration(config.resource, str(config.plugin_socket.absolute()))
        self._servers: list[tuple[grpc.Server, Path]] = []
        self._stopped = False

    def start(self) -> "FakeDevicePlugin":
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        config = self.config
        config.plugin_socket.parent.mkdir(parents=True, exist_ok=True)
        plugin = new_server(4 * 1024 * 1024, 8)
        api_grpc.add_DevicePluginServicer_to_server(self.service, plugin)
        self._servers.append((plugin, serve_unix(plugin, config.plugin_socket)))
        if config.registration == "watcher":
            config.registration_socket.parent.mkdir(parents=True, exist_ok=True)
            registration = new_server(1024 * 1024, 2)
            pluginregistration_v1_pb2_grpc.add_RegistrationServicer_to_server(self.registration, registration)
            self._servers.append((registration, serve_unix(registration, config.registration_socket)))
        else:
            self.register_with_kubelet()
        log.info("serving %s (%d devices) on %s", config.resource, len(config.devices), config.plugin_socket)

    def register_with_kubelet(self) -> None:
        """The classic handshake: Register on kubelet.sock, naming our socket relative to its directory."""
        config = self.config
        request = servicer.api.RegisterRequest(version=servicer.API_VERSION, endpoint=config.plugin_socket.name,
                                      resource_name=config.resource,
                                      options=self.service.options)
        with grpc.insecure_channel(f"unix:{Path(config.kubelet_socket).absolute()}") as channel:
            try:
                api_grpc.RegistrationStub(channel).Register(request, timeout=REGISTER_TIMEOUT)
            except grpc.RpcError as err:
                raise DevicePluginError(f"the kubelet at {config.kubelet_socket} refused {config.resource}: "
                                  f"{err.code().name}: {err.details()}") from None

    def stop(self, grace: float = 2.0) -> None:
        if self._stopped:
            return
        self._stopped = True
        self.devices.close()  # ends the ListAndWatch streams, so the servers can stop
        for server, path in reversed(self._servers):  # registration first
            stop_server(server, path, grace)
        self._servers.clear()

    def __enter__(self) -> "FakeDevicePlugin":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
