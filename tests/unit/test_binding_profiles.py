"""Devices with binding conditions in profiles (`gpus[].binding`): what they publish, and which answer the
fake driver's attach controller (fake_devices/attacher.py) gives. Pure logic: the claim status writes are
checked against a real cluster in conformance/test_binding_conditions.py."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from fake_devices import attacher, profile, render

DOC = """apiVersion: dra-harness.x-k8s.io/v1alpha1
kind: NodeProfile
metadata: {name: attach}
spec:
  numaNodes: [{id: 0, cpus: "0-15", memory: 64Gi, pcieRoots: [pci0000:10]}]
  gpus:
  - model: A100-SXM4-80GB
    count: 1
    attach: [{pcieRoot: pci0000:10}]
    mig: {mode: dynamic}
    binding: {conditions: [example.com/attached], failureConditions: [Failed], attach: fails-once, attachSeconds: 0}
  - model: T4
    count: 2
    namePrefix: plain
    attach: [{pcieRoot: pci0000:10}]
"""


def _profile(tmp_path, text: str = DOC):
    path = tmp_path / "attach.yaml"
    path.write_text(text)
    return profile.load(str(path))


def test_binding_devices_publish_their_conditions_and_plain_ones_do_not(tmp_path):
    prof = _profile(tmp_path)
    drivers = render.Drivers("example.com")
    (slices,) = render.render_node(prof, "n0", drivers).values()
    devices = {d["name"]: d for s in slices for d in s["spec"].get("devices", [])}
    bound = [name for name, d in devices.items() if "bindingConditions" in d]
    # the GPU and every one of its MIG placements, and nothing of the plain group
    assert "gpu-0" in bound and all(n == "gpu-0" or n.startswith("gpu-0-mig-") for n in bound) and len(bound) > 1
    assert devices["gpu-0"]["bindingConditions"] == ["example.com/attached"]
    assert devices["gpu-0"]["bindingFailureConditions"] == ["Failed"] and devices["gpu-0"]["bindsToNode"] is True
    assert not any(k in devices["plain-0"] for k in ("bindingConditions", "bindingFailureConditions", "bindsToNode"))
    assert attacher.binding_of(prof, "gpu-0-mig-1g10gb-0") is prof.gpus[0].binding
    assert attacher.binding_of(prof, "plain-1") is None and attacher.binding_of(prof, "gpu-1") is None


def test_binds_to_node_can_be_off(tmp_path):
    prof = _profile(tmp_path, DOC.replace("attach: fails-once", "bindsToNode: false, attach: never"))
    (slices,) = render.render_node(prof, "n0", render.Drivers("example.com")).values()
    gpu = next(d for s in slices for d in s["spec"].get("devices", []) if d["name"] == "gpu-0")
    assert "bindsToNode" not in gpu and gpu["bindingConditions"] == ["example.com/attached"]


class _Timers:
    """Stands in for threading.Timer: records what would run, runs nothing."""
    def __init__(self):
        self.started = []

    def __call__(self, seconds, function, args=()):
        timer = SimpleNamespace(daemon=False, start=lambda: self.started.append((seconds, args)))
        return timer


def _claim(uid: str, stamp: str, device: str = "gpu-0", conditions=("example.com/attached",)):
    result = SimpleNamespace(driver="gpu.example.com", pool="n0", device=device, binding_conditions=list(conditions),
                             binding_failure_conditions=["Failed"])
    allocation = SimpleNamespace(allocation_timestamp=stamp, devices=SimpleNamespace(results=[result]))
    return SimpleNamespace(metadata=SimpleNamespace(uid=uid, namespace="ns", name="c"),
                           status=SimpleNamespace(allocation=allocation))


def test_each_allocation_is_answered_once_and_fails_once_fails_only_the_first(tmp_path, monkeypatch):
    prof = _profile(tmp_path)
    timers = _Timers()
    monkeypatch.setattr(attacher.threading, "Timer", timers)
    watcher = object.__new__(attacher.Attacher)  # no API client needed for the decisions
    watcher.lookup = lambda d, p, dev: attacher.binding_of(prof, dev)
    watcher.stop = threading.Event()
    watcher._lock = threading.Lock()
    watcher._answered, watcher._failed_once, watcher.answers = set(), set(), []

    first = _claim("u1", "t1")
    watcher.on_event("ADDED", first)
    watcher.on_event("MODIFIED", first)  # the same allocation again (a status update): no second answer
    watcher.on_event("MODIFIED", _claim("u1", "t2"))  # allocated anew after a failure: answered again
    watcher.on_event("MODIFIED", _claim("u1", "t3", device="plain-0"))  # no binding settings: ignored
    watcher.on_event("MODIFIED", _claim("u1", "t4", conditions=()))  # the allocation carries none: ignored
    watcher.on_event("DELETED", _claim("u2", "t1"))
    assert [args[3] for _, args in timers.started] == ["t1", "t2"]
    result = first.status.allocation.devices.results[0]
    binding = prof.gpus[0].binding
    assert watcher._outcome("u1", result, binding) is False  # fails-once: the first attach fails
    assert watcher._outcome("u1", result, binding) is True
    assert watcher._outcome("u9", result, binding) is False  # another claim's first attach fails again
    watcher.on_event("DELETED", _claim("u1", "t2"))  # a deleted claim is forgotten
    assert {key[0] for key in watcher._answered | watcher._failed_once} == {"u9"}
