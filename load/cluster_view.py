"""What a locust process of a load run sees of the cluster: its API clients (made once, kept in STATE), the
scheduler's metrics and queues (and the wait for the queues to settle), and an API error as a message says it."""

from __future__ import annotations

import time

from fake_devices import keyfiles
from harness.k8s import api, errors
from harness.k8s.client import https_get, tls_context
from load import metrics
from load.processstate import STATE

QUEUE_SETTLE_TIMEOUT = 300.0  # bound of the wait for the scheduler to retry what the events requeued


def _clients(options):
    if STATE.api is None:
        configuration = keyfiles.load_configuration(options.kubeconfig)
        configuration.connection_pool_maxsize = 64  # before the ApiClient exists: it sizes its pool once
        client = api.ApiClient(configuration)
        STATE.api, STATE.core, STATE.resource = client, api.CoreV1Api(client), api.ResourceV1Api(client)
    return STATE.core, STATE.resource


def _scrape(options) -> dict:
    if not options.scheduler_metrics_url:
        return {}

    status, body = https_get(options.scheduler_metrics_url, tls_context(options.kubeconfig), timeout=10)
    return metrics.parse(body) if status == 200 else {}


def _error_text(err: Exception) -> str:
    if isinstance(err, errors.ApiError):
        return f"{err.status} {err.reason}" + (f" ({' '.join(str(err.body).split())[:200]})" if err.body else "")
    return f"{type(err).__name__}: {' '.join(str(err).split())[:300]}"


def _queues(options) -> dict[str, float]:
    """The scheduler's pending pods per queue (active, backoff, unschedulable, gated), if it can be asked."""
    try:
        pending = _scrape(options).get("scheduler_pending_pods", {})
    except Exception:  # noqa: BLE001 - only a diagnosis; the failure is reported either way
        return {}
    return {dict(labels).get("queue", "?"): value for labels, value in pending.items()}


def _wait_queue_settled(options) -> dict:
    """Wait (bounded) until the scheduler's active and backoff queues are empty. At the end of a run,
    the retries the events caused belong to their cost: measured, 20 freed devices with 1000 waiting
    pods left ~900 requeued pods in the active queue when the last event's pod was bound."""
    started = time.monotonic()
    # claim-shared: members of an incomplete PodGroup cycle through the backoff queue with or without
    # events (measured: 6 members in backoff for the whole 120 s of a run), so only the active queue counts
    drained = ("active",) if options.scenario == "claim-shared" else ("active", "backoff")
    queues = _queues(options)
    while _retrying(queues, drained) and time.monotonic() - started < QUEUE_SETTLE_TIMEOUT:
        time.sleep(0.2)
        queues = _queues(options)
    return {"seconds": round(time.monotonic() - started, 2), "drained": list(drained),
            "settled": None if not queues else not _retrying(queues, drained), "queues": queues}


def _retrying(queues: dict[str, float], drained: tuple[str, ...]) -> bool:
    return sum(queues.get(name, 0) for name in drained) > 0
