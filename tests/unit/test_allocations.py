"""The allocation record's watch decodes ResourceClaim events (the report's feature credit rests on
it): with the client's guessed model name every event failed and only claims still present at the
end of a test were counted (a pod's generated claim, deleted with the pod, never was)."""

from __future__ import annotations

import json

import kubernetes

from harness.pytest_plugin import allocations

EVENT = {"type": "MODIFIED", "object": {
    "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
    "metadata": {"name": "p-gpu-x", "namespace": "t", "resourceVersion": "42"},
    "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com"}}]}},
    "status": {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": "gpu.example.com", "pool": "real-node-0", "device": "gpu-3"}]}}}}}


def test_claim_events_decode_to_the_drivers_allocated():
    watch = kubernetes.watch.Watch(return_type=allocations.CLAIM_MODEL)
    event = watch.unmarshal_event(json.dumps(EVENT), watch.get_return_type(None))
    assert allocations._drivers(event["object"]) == {"gpu.example.com"}
    assert event["object"].metadata.resource_version == "42"


def test_a_bookmark_moves_the_watch_on():
    """Bookmarks arrive as plain dicts: the record must take their resourceVersion, not break."""
    from types import SimpleNamespace as NS

    events = [{"type": "BOOKMARK", "object": {"kind": "ResourceClaim", "metadata": {"resourceVersion": "77"}}}]
    watch_calls = []

    class FakeWatch:
        def __init__(self, return_type=None):
            assert return_type == allocations.CLAIM_MODEL

        def stream(self, func, namespace, resource_version, **kwargs):
            watch_calls.append(resource_version)
            if len(watch_calls) == 1:
                yield from events
            else:
                record._stop.set()  # second round: the watch resumed from the bookmark; end here
                return

        def stop(self):
            pass

    k8s = NS(resource=NS(list_namespaced_resource_claim=lambda *a, **k: None))
    record = allocations.AllocatedDrivers(k8s, "t")
    original = allocations.api.Watch
    allocations.api.Watch = FakeWatch  # type: ignore[misc]
    try:
        record._run("1")
    finally:
        allocations.api.Watch = original  # type: ignore[misc]
    assert watch_calls == ["1", "77"] and record.complete
