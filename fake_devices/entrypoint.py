"""What every long-running fake_devices process (driver controller, kubelet plugin, health monitor)
does on start: an API client and a stop event."""

from __future__ import annotations

import signal
import threading

import kubernetes

from fake_devices import keyfiles


def api_client(kubeconfig: str | None, pool_size: int | None = None) -> kubernetes.client.ApiClient:
    """From `--kubeconfig` when given, else the pod's in-cluster configuration (a DaemonSet or
    Deployment). Raises kubernetes.config.ConfigException when neither is usable."""
    if kubeconfig:
        client = kubernetes.client.ApiClient(keyfiles.load_configuration(kubeconfig))
    else:
        kubernetes.config.load_incluster_config()
        client = kubernetes.client.ApiClient()
    if pool_size:
        # urllib3 keeps this many connections per host; the default (4) serialises parallel writers
        client.configuration.connection_pool_maxsize = pool_size
    return client


def stop_on_signals() -> threading.Event:
    """An event set by SIGTERM (the kubelet, `kubectl delete`, the harness) or SIGINT (Ctrl-C)."""
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGINT, lambda *_: stopping.set())
    return stopping
