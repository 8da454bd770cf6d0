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
