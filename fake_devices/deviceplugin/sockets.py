"""gRPC servers on unix sockets for the device plugin, without the kubelet plugin's heavy imports (the
kubernetes client): a plugin process must start in well under the kubelet's patience on a busy machine.
The servers themselves are fake_devices.unixgrpc's; this module names their errors for the device plugin."""

from __future__ import annotations

from pathlib import Path

import grpc

from fake_devices import unixgrpc

MAX_SOCKET_PATH = unixgrpc.MAX_SOCKET_PATH


class DevicePluginError(Exception):
    pass


def new_server(max_message_bytes: int, workers: int) -> grpc.Server:
    return unixgrpc.new_server(max_message_bytes, workers, "deviceplugin-grpc")


def serve_unix(server: grpc.Server, path: Path) -> Path:
    try:
        return unixgrpc.serve_unix(server, path)
    except unixgrpc.SocketError as err:
        raise DevicePluginError(str(err)) from None


stop_server = unixgrpc.stop_server
