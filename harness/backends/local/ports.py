"""Free loopback ports for a cluster's components.

Ports come from 20000-31999, below Linux's ephemeral range (32768+), so an outgoing connection's
source port cannot grab one between our check and the component's bind. A port is free only if no
address of this machine has a listener on it: another cluster's real-node kubelet listens on its
bridge address, not on loopback, and a component of ours must not take its port number.

A chosen port is also reserved, machine-wide, for the cluster that chose it (reservations.py):
clusters of different state directories (parallel test workers) share one port space, and a
component binds its port seconds after it is chosen, or is down for a moment when a test restarts it.
"""

from __future__ import annotations

import contextlib
import random
import socket
import time
from pathlib import Path

import psutil

from harness.backends.local import reservations

LOW, HIGH = 20000, 32000


# The address every control-plane component binds; a listener on the wildcard address takes it too.
LOOPBACK = frozenset({"127.0.0.1", "0.0.0.0", "::"})


def is_free(port: int, host: str = "0.0.0.0") -> bool:
    """Whether `port` can be bound on `host`; on the wildcard address (the default) that fails while a
    listener holds the port on any IPv4 address, loopback or a bridge's."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def allocate(names: list[str], reserved: set[int] | frozenset[int] = frozenset(),
             rng: random.Random | None = None, holder: Path | None = None) -> dict[str, int]:
    """Free ports for `names`, none of `reserved`; with a `holder` (the cluster's directory) they are
    reserved for it machine-wide, and ports reserved for another cluster are skipped."""
    rng = rng or random.SystemRandom()
    chosen: dict[str, int] = {}
    taken = set(reserved)
    with (reservations.open_book() if holder else contextlib.nullcontext(reservations.Book(None))) as book:
        for name in names:
            for _ in range(1000):
                port = rng.randrange(LOW, HIGH)
                if port in taken or book.taken(f"port-{port}") or not is_free(port):
                    continue
                chosen[name] = port
                taken.add(port)
                if holder:
                    book.reserve(f"port-{port}", holder)
                break
            else:
                raise RuntimeError(f"no free loopback port found for {name} in {LOW}-{HIGH}")
    return chosen


def _listeners(ports: set[int], addresses: frozenset[str] | None) -> list:
    return [conn for conn in psutil.net_connections("tcp")
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port in ports
            and (addresses is None or conn.laddr.ip in addresses)]


def listening(ports: list[int], addresses: frozenset[str] | None = None) -> list[int]:
    """Which of `ports` a TCP socket on this machine is listening on, on any of `addresses` (all if
    None). Sockets in LISTEN state, read from the kernel's tables: a connect probe would leave
    connections behind and, when it races with a closing listener, answers for a socket that is
    already going."""
    return sorted({conn.laddr.port for conn in _listeners(set(ports), addresses)})


def holders(port: int, addresses: frozenset[str] | None = None) -> list[str]:
    """`pid N (name)` of every process with a listening socket on `port` (empty if unknown)."""
    found = set()
    for conn in _listeners({port}, addresses):
        if conn.pid:
            try:
                found.add(f"pid {conn.pid} ({psutil.Process(conn.pid).name()})")
            except psutil.Error:
                found.add(f"pid {conn.pid}")
    return sorted(found)


def wait_closed(ports: dict[str, int], timeout: float, addresses: frozenset[str] = LOOPBACK) -> list[str]:
    """Wait until none of the named `ports` is listening on `addresses` (those the components bound,
    where a listener left would stop the port's reuse); returns one line per port still listening at
    the deadline, with its owner and whoever holds it."""
    deadline = time.monotonic() + timeout
    while True:
        busy = listening(list(ports.values()), addresses)
        if not busy or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    owners = {port: name for name, port in ports.items()}
    lines = []
    for port in busy:
        held_by = holders(port, addresses)
        lines.append(f"port {port} ({owners[port]}) still listening after {timeout:.0f}s"
                     + (f", held by {', '.join(held_by)}" if held_by else ""))
    return lines
