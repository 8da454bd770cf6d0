"""The gRPC services, translating between the wire types and the version-neutral plugin logic.

Registration (pluginregistration), DRAPlugin v1 and v1beta1 (the same logic; v1beta1 has no share
IDs on the wire), DRAResourceHealth v1 and v1alpha1 (identical messages in two proto packages). An
unexpected exception becomes an INTERNAL status for that call, never a dead server; malformed or
oversize requests are refused by gRPC itself (INTERNAL / RESOURCE_EXHAUSTED) before they get here.
"""

from __future__ import annotations

import logging
import math
import threading
from typing import Any

import grpc

from fake_devices import unixgrpc
from fake_devices.kubeletplugin import startup
from fake_devices.kubeletplugin.cdi import ClaimRef
from fake_devices.kubeletplugin.generated import (
    dra_health_v1_pb2,
    dra_health_v1_pb2_grpc,
    dra_health_v1alpha1_pb2,
    dra_health_v1alpha1_pb2_grpc,
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    pluginregistration_v1_pb2,
    pluginregistration_v1_pb2_grpc,
)
from fake_devices.kubeletplugin.health import HealthMonitor
from fake_devices.kubeletplugin.prepare import Preparer

log = logging.getLogger("fake_devices.kubeletplugin")

PLUGIN_TYPE = "DRAPlugin"
DRA_V1, DRA_V1BETA1 = "v1.DRAPlugin", "v1beta1.DRAPlugin"
HEALTH_V1, HEALTH_V1ALPHA1 = "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"
# What GetInfo advertises, newest first within each service (the order of the upstream helper).
SUPPORTED_VERSIONS = (DRA_V1, DRA_V1BETA1, HEALTH_V1, HEALTH_V1ALPHA1)


_guard = unixgrpc.guard


def _refs(request) -> list[ClaimRef]:
    return [ClaimRef(namespace=c.namespace, name=c.name, uid=c.uid) for c in request.claims]


class Registration(pluginregistration_v1_pb2_grpc.RegistrationServicer):
    def __init__(self, driver: str, endpoint: str, versions=SUPPORTED_VERSIONS):
        self.driver, self.endpoint, self.versions = driver, endpoint, list(versions)
        self.status: tuple[bool, str] | None = None  # the kubelet's last verdict
        self.notified = threading.Event()

    @_guard
    def GetInfo(self, request, context):
        return pluginregistration_v1_pb2.PluginInfo(type=PLUGIN_TYPE, name=self.driver, endpoint=self.endpoint,
                                                    supported_versions=self.versions)

    @_guard
    def NotifyRegistrationStatus(self, request, context):
        self.status = (request.plugin_registered, request.error)
        if request.plugin_registered:
            log.info(startup.REGISTERED.format(driver=self.driver))
        else:
            log.error(startup.REFUSED.format(driver=self.driver, error=request.error))
        self.notified.set()
        return pluginregistration_v1_pb2.RegistrationStatusResponse()


class _DRAPlugin:
    pb2: Any = None  # the version's message module
    share_ids = True

    def __init__(self, preparer: Preparer):
        self.preparer = preparer

    @_guard
    def NodePrepareResources(self, request, context):
        pb2 = self.pb2
        response = pb2.NodePrepareResourcesResponse()
        for uid, result in self.preparer.prepare(_refs(request)).items():
            entry = response.claims[uid]  # map entries exist once touched, so failed claims are listed too
            if result.error:
                entry.error = result.error
                continue
            for device in result.devices:
                out = entry.devices.add(request_names=device.request_names, pool_name=device.pool_name,
                                        device_name=device.device_name, cdi_device_ids=device.cdi_device_ids)
                if self.share_ids and device.share_id:
                    out.share_id = device.share_id
        return response

    @_guard
    def NodeUnprepareResources(self, request, context):
        response = self.pb2.NodeUnprepareResourcesResponse()
        for uid, error in self.preparer.unprepare(_refs(request)).items():
            response.claims[uid].error = error
        return response


class DRAPluginV1(_DRAPlugin, dra_v1_pb2_grpc.DRAPluginServicer):
    pb2 = dra_v1_pb2


class DRAPluginV1beta1(_DRAPlugin, dra_v1beta1_pb2_grpc.DRAPluginServicer):
    pb2 = dra_v1beta1_pb2
    share_ids = False


class _Health:
    pb2: Any = None

    def __init__(self, monitor: HealthMonitor, interval: float, silent: bool = False):
        self.monitor, self.interval = monitor, interval
        self.timeout_seconds = int(math.ceil(3 * interval))  # three resends may be missed before the kubelet gives up
        self.silent = silent  # defect silent-health (self-tests): an open stream that never reports

    def _message(self, entries):
        pb2 = self.pb2
        return pb2.NodeWatchResourcesResponse(devices=[
            pb2.DeviceHealth(device=pb2.DeviceIdentifier(pool_name=e.pool, device_name=e.device),
                             health=pb2.HealthStatus.Value(e.health), last_updated_time=e.since,
                             health_check_timeout_seconds=self.timeout_seconds, message=e.message[:1024])
            for e in entries])

    def NodeWatchResources(self, request, context):
        """The complete list at once, then again on every change and at least every `interval`
        seconds, until the kubelet cancels or the plugin stops."""
        context.add_callback(self.monitor.wake)
        log.info("health stream opened (%s)", type(self).__name__)  # the kubelet is connected to this instance
        while context.is_active() and not self.monitor.closed:
            version, entries = self.monitor.snapshot()
            if not self.silent:
                yield self._message(entries)
            self.monitor.wait_change(version, self.interval, context.is_active)


class HealthV1(_Health, dra_health_v1_pb2_grpc.DRAResourceHealthServicer):
    pb2 = dra_health_v1_pb2


class HealthV1alpha1(_Health, dra_health_v1alpha1_pb2_grpc.DRAResourceHealthServicer):
    pb2 = dra_health_v1alpha1_pb2


def add_dra_services(server: grpc.Server, preparer: Preparer, monitor: HealthMonitor, interval: float,
                     silent_health: bool = False) -> None:
    dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(DRAPluginV1(preparer), server)
    dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(DRAPluginV1beta1(preparer), server)
    dra_health_v1_pb2_grpc.add_DRAResourceHealthServicer_to_server(HealthV1(monitor, interval, silent_health), server)
    dra_health_v1alpha1_pb2_grpc.add_DRAResourceHealthServicer_to_server(
        HealthV1alpha1(monitor, interval, silent_health), server)


def add_registration_service(server: grpc.Server, registration: Registration) -> None:
    pluginregistration_v1_pb2_grpc.add_RegistrationServicer_to_server(registration, server)
