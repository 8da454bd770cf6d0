"""What every long-running fake_devices process (driver controller, kubelet plugin, health monitor)
does on start besides its API client (kube.api_client): a stop event."""

from __future__ import annotations

import signal
import threading


def stop_on_signals() -> threading.Event:
    """An event set by SIGTERM (the kubelet, `kubectl delete`, the harness) or SIGINT (Ctrl-C)."""
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGINT, lambda *_: stopping.set())
    return stopping
