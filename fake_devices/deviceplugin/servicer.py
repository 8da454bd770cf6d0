"""The gRPC services of the device plugin: DevicePlugin (what the kubelet's device manager calls)
and the plugin-watcher Registration (how the kubelet finds it). An unexpected exception becomes an
INTERNAL status for that call, never a dead server."""

from __future__ import annotations

import logging
import re
from typing import Any

import grpc

from fake_devices import unixgrpc
from fake_devices.deviceplugin.devices import HEALTHY, DeviceList
from fake_devices.deviceplugin.journal import Journal
from fake_devices.kubeletplugin.generated import (
    deviceplugin_v1beta1_pb2,
    pluginregistration_v1_pb2,
    pluginregistration_v1_pb2_grpc,
)
from fake_devices.kubeletplugin.generated import deviceplugin_v1beta1_pb2_grpc as api_grpc

api: Any = deviceplugin_v1beta1_pb2  # message classes are built at import time: invisible to mypy

log = logging.getLogger("fake_devices.deviceplugin")

API_VERSION = "v1beta1"  # deviceplugin/v1beta1 constants.go: Version, and the only SupportedVersions entry
PLUGIN_TYPE = "DevicePlugin"  # pluginregistration/v1 constants.go
ENV_PREFIX = "FAKE_DEVICE_PLUGIN_"  # what Allocate puts into the container's environment
STREAM_POLL_SECONDS = 1.0  # how often an idle ListAndWatch stream checks that the kubelet is still there


_guard = unixgrpc.guard


def _natural(device_id: str) -> tuple:
    """gpu-2 before gpu-10."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", device_id))


class DevicePlugin(api_grpc.DevicePluginServicer):
    def __init__(self, resource: str, node: str, devices: DeviceList, journal: Journal,
                 pre_start_required: bool = False):
        self.resource, self.node, self.devices, self.journal = resource, node, devices, journal
        self.options = api.DevicePluginOptions(pre_start_required=pre_start_required,
                                               get_preferred_allocation_available=True)

    @_guard
    def GetDevicePluginOptions(self, request, context):
        return self.options

    def ListAndWatch(self, request, context):
        """The complete list now and after every change, until the plugin stops or the kubelet goes."""
        self.journal.record("ListAndWatch")
        seen = None
        while context.is_active() and not self.devices.closed:
            version, listed = self.devices.snapshot()
            if version != seen:
                seen = version
                yield api.ListAndWatchResponse(devices=[self._wire(device, health) for device, health in listed])
            self.devices.wait_changed(seen, STREAM_POLL_SECONDS)

    @staticmethod
    def _wire(device, health: str):
        topology = None if device.numa_node is None else api.TopologyInfo(nodes=[api.NUMANode(ID=device.numa_node)])
        return api.Device(ID=device.id, health=health, topology=topology)

    @_guard
    def GetPreferredAllocation(self, request, context):
        """Deterministic: what must be included, then the lowest-numbered available devices."""
        responses = []
        for container in request.container_requests:
            chosen = list(container.must_include_deviceIDs)
            rest = sorted(set(container.available_deviceIDs) - set(chosen), key=_natural)
            chosen += rest[:max(0, container.allocation_size - len(chosen))]
            responses.append(api.ContainerPreferredAllocationResponse(deviceIDs=chosen))
        self.journal.record("GetPreferredAllocation", containers=[list(r.deviceIDs) for r in responses])
        return api.PreferredAllocationResponse(container_responses=responses)

    @_guard
    def Allocate(self, request, context):
        _, listed = self.devices.snapshot()
        healthy = {device.id for device, health in listed if health == HEALTHY}
        containers = [list(c.devices_ids) for c in request.container_requests]
        unknown = sorted({i for ids in containers for i in ids} - healthy)
        if unknown:
            self.journal.record("Allocate", containers=containers, error=f"not healthy devices: {unknown}")
            context.set_code(grpc.StatusCode.INVALID_ARGUMENT)  # not abort(): _guard would turn it into INTERNAL
            context.set_details(f"{self.resource}: {', '.join(unknown)} not among the healthy devices of {self.node}")
            return api.AllocateResponse()
        self.journal.record("Allocate", containers=containers)
        responses = [api.ContainerAllocateResponse(envs={f"{ENV_PREFIX}RESOURCE": self.resource,
                                                         f"{ENV_PREFIX}NODE": self.node,
                                                         f"{ENV_PREFIX}DEVICES": ",".join(ids)})
                     for ids in containers]
        return api.AllocateResponse(container_responses=responses)

    @_guard
    def PreStartContainer(self, request, context):
        self.journal.record("PreStartContainer", devices=list(request.devices_ids))
        return api.PreStartContainerResponse()


class WatcherRegistration(pluginregistration_v1_pb2_grpc.RegistrationServicer):
    """pluginregistration.Registration for a device plugin: the kubelet's plugin watcher finds the
    socket in its plugins_registry directory (per node, unlike the machine-wide device-plugins
    directory) and hands it to the device manager."""

    def __init__(self, resource: str, endpoint: str):
        self.resource, self.endpoint = resource, endpoint
        self.status: tuple[bool, str] | None = None  # the kubelet's last verdict

    @_guard
    def GetInfo(self, request, context):
        return pluginregistration_v1_pb2.PluginInfo(type=PLUGIN_TYPE, name=self.resource, endpoint=self.endpoint,
                                                    supported_versions=[API_VERSION])

    @_guard
    def NotifyRegistrationStatus(self, request, context):
        self.status = (request.plugin_registered, request.error)
        if request.plugin_registered:
            log.info("registered with the kubelet as %s", self.resource)
        else:
            log.error("the kubelet refused %s: %s", self.resource, request.error)
        return pluginregistration_v1_pb2.RegistrationStatusResponse()
