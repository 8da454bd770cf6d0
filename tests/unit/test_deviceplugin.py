"""The legacy device plugin without a cluster: the v1beta1 DevicePlugin calls as a kubelet makes
them (over a real unix socket), both registration paths, the call journal, and bad settings refused."""

from __future__ import annotations

import shutil
import tempfile
import threading
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from fake_devices.deviceplugin import journal
from fake_devices.deviceplugin.devices import UNHEALTHY, Device, gpus_of_profile
from fake_devices.deviceplugin.plugin import DevicePluginConfig, FakeDevicePlugin
from fake_devices.deviceplugin.sockets import DevicePluginError
from fake_devices.errors import InvalidInput
from fake_devices.kubeletplugin.generated import deviceplugin_v1beta1_pb2 as api
from fake_devices.kubeletplugin.generated import deviceplugin_v1beta1_pb2_grpc as api_grpc
from fake_devices.kubeletplugin.generated import pluginregistration_v1_pb2, pluginregistration_v1_pb2_grpc

RESOURCE = "example.com/gpu"


@pytest.fixture
def short_dir():
    path = Path(tempfile.mkdtemp(prefix="dp-", dir="/tmp"))  # unix socket paths must stay short
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _config(base: Path, **overrides) -> DevicePluginConfig:
    settings = dict(resource=RESOURCE, node="node-a", devices=(Device("gpu-0", 0), Device("gpu-1", 1),
                                                               Device("gpu-10", 1)),
                    plugins_dir=base / "plugins", registry_dir=base / "registry", state_dir=base / "state",
                    pre_start_required=True)
    settings.update(overrides)
    return DevicePluginConfig(**settings)


def _stub(path: Path):
    channel = grpc.insecure_channel(f"unix:{path}")
    return channel, api_grpc.DevicePluginStub(channel)


def test_profile_gpus_are_the_dra_driver_names_without_partitions():
    assert gpus_of_profile("tiny", "n") == [Device("gpu-0", 0), Device("gpu-1", 1)]
    names = [d.id for d in gpus_of_profile("a100-mig", "n")]
    assert names and all("-mig-" not in n for n in names) and names[0] == "gpu-0"


def test_the_kubelets_calls_through_the_watcher_registration(short_dir):
    plugin = FakeDevicePlugin(_config(short_dir)).start()
    try:
        config = plugin.config
        # The plugin watcher's view: a DevicePlugin named after the resource, pointing at the plugin socket.
        with grpc.insecure_channel(f"unix:{config.registration_socket}") as channel:
            info = pluginregistration_v1_pb2_grpc.RegistrationStub(channel).GetInfo(
                pluginregistration_v1_pb2.InfoRequest(), timeout=5)
        assert (info.type, info.name, info.endpoint, list(info.supported_versions)) == (
            "DevicePlugin", RESOURCE, str(config.plugin_socket), ["v1beta1"])

        channel, stub = _stub(config.plugin_socket)
        with channel:
            options = stub.GetDevicePluginOptions(api.Empty(), timeout=5)
            assert options.pre_start_required and options.get_preferred_allocation_available
            stream = stub.ListAndWatch(api.Empty(), timeout=10)
            first = next(stream)
            assert [(d.ID, d.health, [n.ID for n in d.topology.nodes]) for d in first.devices] == [
                ("gpu-0", "Healthy", [0]), ("gpu-1", "Healthy", [1]), ("gpu-10", "Healthy", [1])]
            plugin.devices.set_health("gpu-1", UNHEALTHY)  # a change: the complete list again
            second = next(stream)
            assert [(d.ID, d.health) for d in second.devices] == [
                ("gpu-0", "Healthy"), ("gpu-1", "Unhealthy"), ("gpu-10", "Healthy")]
            stream.cancel()

            preferred = stub.GetPreferredAllocation(api.PreferredAllocationRequest(container_requests=[
                api.ContainerPreferredAllocationRequest(available_deviceIDs=["gpu-10", "gpu-0", "gpu-2"],
                                                        must_include_deviceIDs=["gpu-10"], allocation_size=2)]),
                timeout=5)
            assert [list(r.deviceIDs) for r in preferred.container_responses] == [["gpu-10", "gpu-0"]]

            allocated = stub.Allocate(api.AllocateRequest(container_requests=[
                api.ContainerAllocateRequest(devices_ids=["gpu-0"]),
                api.ContainerAllocateRequest(devices_ids=["gpu-10", "gpu-0"])]), timeout=5)
            assert [dict(r.envs) for r in allocated.container_responses] == [
                {"FAKE_DEVICE_PLUGIN_RESOURCE": RESOURCE, "FAKE_DEVICE_PLUGIN_NODE": "node-a",
                 "FAKE_DEVICE_PLUGIN_DEVICES": "gpu-0"},
                {"FAKE_DEVICE_PLUGIN_RESOURCE": RESOURCE, "FAKE_DEVICE_PLUGIN_NODE": "node-a",
                 "FAKE_DEVICE_PLUGIN_DEVICES": "gpu-10,gpu-0"}]
            # An unhealthy or unknown device is refused, naming it; the plugin keeps serving.
            with pytest.raises(grpc.RpcError) as refused:
                stub.Allocate(api.AllocateRequest(container_requests=[
                    api.ContainerAllocateRequest(devices_ids=["gpu-1", "gpu-9"])]), timeout=5)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "gpu-1, gpu-9 not among the healthy devices of node-a" in refused.value.details()
            stub.PreStartContainer(api.PreStartContainerRequest(devices_ids=["gpu-0"]), timeout=5)
    finally:
        plugin.stop()
    assert not config.plugin_socket.exists() and not config.registration_socket.exists()
    calls = journal.read(config.journal_file)
    assert [c["method"] for c in calls] == ["ListAndWatch", "GetPreferredAllocation", "Allocate", "Allocate",
                                            "PreStartContainer"]
    assert journal.allocated_ids(calls) == [["gpu-0"], ["gpu-10", "gpu-0"], ["gpu-1", "gpu-9"]]
    assert "error" in calls[3] and "error" not in calls[2]


def test_stop_ends_an_open_list_and_watch_stream(short_dir):
    plugin = FakeDevicePlugin(_config(short_dir)).start()
    channel, stub = _stub(plugin.config.plugin_socket)
    with channel:
        stream = stub.ListAndWatch(api.Empty(), timeout=30)
        next(stream)
        stopper = threading.Thread(target=plugin.stop)
        stopper.start()
        with pytest.raises((StopIteration, grpc.RpcError)):
            next(stream)  # the stream ends (or the server goes) instead of hanging for 30 s
        stopper.join(15)
        assert not stopper.is_alive()


class _FakeKubeletRegistration(api_grpc.RegistrationServicer):
    """The kubelet's side of the classic handshake, for the protocol only: records, accepts or refuses."""

    def __init__(self, refuse: str = ""):
        self.requests: list = []
        self.refuse = refuse

    def Register(self, request, context):
        self.requests.append(request)
        if self.refuse:
            context.set_code(grpc.StatusCode.UNKNOWN)
            context.set_details(self.refuse)
        return api.Empty()


def _kubelet(directory: Path, servicer: _FakeKubeletRegistration):
    directory.mkdir(parents=True, exist_ok=True)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    api_grpc.add_RegistrationServicer_to_server(servicer, server)
    server.add_insecure_port(f"unix:{directory / 'kubelet.sock'}")
    server.start()
    return server


def test_classic_registration_on_the_kubelet_socket(short_dir):
    kubelet = _FakeKubeletRegistration()
    server = _kubelet(short_dir / "device-plugins", kubelet)
    try:
        config = _config(short_dir, registration="kubelet-socket",
                         kubelet_socket=short_dir / "device-plugins" / "kubelet.sock")
        with FakeDevicePlugin(config):
            (request,) = kubelet.requests
            assert (request.version, request.endpoint, request.resource_name) == ("v1beta1", "example.com_gpu.sock",
                                                                                 RESOURCE)
            assert request.options.pre_start_required and request.options.get_preferred_allocation_available
            assert (short_dir / "device-plugins" / "example.com_gpu.sock").exists()  # beside kubelet.sock
            assert not config.registration_socket.exists()  # no watcher socket in this mode
    finally:
        server.stop(0)


def test_a_refused_registration_fails_start_and_leaves_no_socket(short_dir):
    server = _kubelet(short_dir / "device-plugins", _FakeKubeletRegistration(refuse="resource name taken"))
    try:
        config = _config(short_dir, registration="kubelet-socket",
                         kubelet_socket=short_dir / "device-plugins" / "kubelet.sock")
        with pytest.raises(DevicePluginError, match="refused example.com/gpu: UNKNOWN: resource name taken"):
            FakeDevicePlugin(config).start()
        assert not config.plugin_socket.exists()
    finally:
        server.stop(0)


@pytest.mark.parametrize(("overrides", "flag", "words"), [
    ({"resource": "gpu"}, "--resource", "not an extended resource name"),
    ({"resource": "kubernetes.io/gpu"}, "--resource", "not an extended resource name"),
    ({"devices": ()}, "--devices", "no devices to advertise"),
    ({"devices": (Device("x" * 64),)}, "--devices", "not a device ID"),
    ({"registration": "carrier-pigeon"}, "--registration", "unknown"),
    ({"plugins_dir": Path("/tmp/" + "d" * 120)}, "--plugins-dir", "socket path longer than 107 bytes"),
])
def test_bad_settings_are_refused_before_anything_listens(short_dir, overrides, flag, words):
    with pytest.raises(InvalidInput) as info:
        FakeDevicePlugin(_config(short_dir, **overrides))
    assert flag in str(info.value) and words in str(info.value)
    assert not list(short_dir.rglob("*.sock"))
