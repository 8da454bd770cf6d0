"""gRPC servers on unix sockets, shared by the kubelet DRA plugin and the legacy device plugin.

Light on purpose (grpc and the standard library only): a device plugin process must start well within
the kubelet's patience on a busy machine, without the kubernetes client's import time. A stale socket
(nobody listening, a crashed plugin's leftover) is replaced; a live one is refused."""

from __future__ import annotations

import functools
import logging
import os
import socket
import stat
from concurrent import futures
from pathlib import Path

import grpc

MAX_SOCKET_PATH = 107  # sun_path is 108 bytes including the terminating NUL
log = logging.getLogger(__name__)


class SocketError(Exception):
    """The socket path cannot be served: not a socket, served by another process, or no listener."""


def new_server(max_receive_bytes: int, workers: int, thread_name_prefix: str,
               max_send_bytes: int | None = None) -> grpc.Server:
    """A gRPC server that refuses requests over `max_receive_bytes` (RESOURCE_EXHAUSTED)."""
    options = [("grpc.max_receive_message_length", max_receive_bytes),
               ("grpc.max_send_message_length", max_send_bytes or max_receive_bytes)]
    executor = futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix=thread_name_prefix)
    return grpc.server(executor, options=options)


def serve_unix(server: grpc.Server, path: Path) -> Path:
    """Start `server` on the unix socket `path`; returns the absolute path."""
    path = Path(path).absolute()
    claim(path)
    try:
        server.add_insecure_port(f"unix:{path}")
    except RuntimeError as err:
        raise SocketError(f"cannot listen on {path}: {err}") from None
    server.start()
    return path


def stop_server(server: grpc.Server, path: Path, grace: float = 2.0) -> None:
    server.stop(grace).wait(grace + 5)
    remove_socket(path)


def claim(path: Path) -> None:
    """Remove a stale socket at `path`; refuse a live one or a file that is no socket."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise SocketError(f"{path} exists and is not a socket; remove it or choose another directory")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1)
    try:
        probe.connect(str(path))
    except OSError:
        os.unlink(path)  # nobody listens: a leftover of a crashed plugin
        return
    finally:
        probe.close()
    raise SocketError(f"another process is serving on {path}")


def remove_socket(path: Path) -> None:
    try:
        if stat.S_ISSOCK(path.lstat().st_mode):
            path.unlink()
    except FileNotFoundError:
        pass


def guard(method):
    """A servicer method whose unexpected error reaches the kubelet as INTERNAL naming the method and the
    error (and is logged with its traceback), instead of grpc's bare UNKNOWN."""
    @functools.wraps(method)
    def wrapper(self, request, context):
        try:
            return method(self, request, context)
        except Exception as err:
            log.exception("%s failed", method.__name__)
            context.abort(grpc.StatusCode.INTERNAL, f"{method.__name__}: {type(err).__name__}: {err}")

    return wrapper
