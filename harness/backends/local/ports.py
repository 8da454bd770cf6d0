"""Free loopback ports for a cluster's components.

Ports come from 20000-31999, below Linux's ephemeral range (32768+), so an outgoing connection's
source port cannot grab one between our check and the component's bind. Ports that another
cluster's state records are skipped even if momentarily free.
"""

from __future__ import annotations

import random
import socket

LOW, HIGH = 20000, 32000


def is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def allocate(names: list[str], reserved: set[int] = frozenset(), rng: random.Random | None = None) -> dict[str, int]:
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
    """Which of `ports` something on this machine is listening on."""
    busy = []
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.settimeout(0.5)
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                busy.append(port)
    return busy
