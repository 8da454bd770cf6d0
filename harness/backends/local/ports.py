"""Free loopback ports for a cluster's components.

Ports come from 20000-31999, below Linux's ephemeral range (32768+), so an outgoing connection's
source port cannot grab one between our check and the component's bind. Ports that another
cluster's state records are skipped even if momentarily free.
"""

from __future__ import annotations

import random
import socket
import time

import psutil

LOW, HIGH = 20000, 32000


def is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def allocate(names: list[str], reserved: set[int] | frozenset[int] = frozenset(),
             rng: random.Random | None = None) -> dict[str, int]:
    rng = rng or random.SystemRandom()
    chosen: dict[str, int] = {}
    taken = set(reserved)
    for name in names:
        for _ in range(1000):
            port = rng.randrange(LOW, HIGH)
            if port not in taken and is_free(port):
                chosen[name] = port
                taken.add(port)
                break
        else:
            raise RuntimeError(f"no free loopback port found for {name} in {LOW}-{HIGH}")
    return chosen


def listening(ports: list[int]) -> list[int]:
    """Which of `ports` a TCP socket on this machine is listening on (sockets in LISTEN state, read
    from the kernel's tables: a connect probe would leave connections behind and, when it races with
    a closing listener, answers for a socket that is already going)."""
    wanted = set(ports)
    return sorted({conn.laddr.port for conn in psutil.net_connections("tcp")
                   if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port in wanted})


def holders(port: int) -> list[str]:
    """`pid N (name)` of every process with a listening socket on `port` (empty if unknown)."""
    found = set()
    for conn in psutil.net_connections("tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
            try:
                found.add(f"pid {conn.pid} ({psutil.Process(conn.pid).name()})")
            except psutil.Error:
                found.add(f"pid {conn.pid}")
    return sorted(found)


def wait_closed(ports: dict[str, int], timeout: float) -> list[str]:
    """Wait until none of the named `ports` is listening; returns one line per port still listening
    at the deadline, with its owner and whoever holds it."""
    deadline = time.monotonic() + timeout
    while True:
        busy = listening(list(ports.values()))
        if not busy or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    owners = {port: name for name, port in ports.items()}
    return [f"port {port} ({owners[port]}) still listening after {timeout:.0f}s"
            + (f", held by {', '.join(holders(port))}" if holders(port) else "") for port in busy]
