"""The one table of fault kinds (fake_devices/faultkinds.py) and the fault ConfigMap's codec: every
consumer's view is the table's, and an unknown kind is refused on write and reported on read."""

from __future__ import annotations

import logging

import pytest

from fake_devices import faultkinds, faults, healthmonitor, render
from fake_devices.errors import InvalidInput
from fake_devices.kubeletplugin import health


def test_every_kind_does_something_visible_in_the_slice():
    for kind in faultkinds.KINDS.values():
        assert (kind.taint_effect is not None) != kind.removes_device, kind  # a taint, or gone: exactly one
        assert kind.taint_effect in (None, "None", "NoSchedule", "NoExecute"), kind


def test_consumers_read_the_table():
    assert health.FAULT_HEALTH["unhealthy"] == (
        "UNHEALTHY", "fault 'unhealthy' injected: NoExecute taint, pods using the device are evicted")
    assert {k: h for k, (h, _) in health.FAULT_HEALTH.items()} == \
        {"warning": "HEALTHY", "degraded": "HEALTHY", "unhealthy": "UNHEALTHY", "lost": "UNHEALTHY"}
    assert healthmonitor.FAULT_STATES == {"degraded": "degraded", "unhealthy": "failed", "lost": "failed"}
    assert faults.FAULT_KINDS == faultkinds.NAMES == ("warning", "degraded", "unhealthy", "lost")
    assert render.FAULT_TAINT_KEY == faultkinds.TAINT_KEY


@pytest.mark.parametrize("kind", faultkinds.NAMES)
def test_render_applies_each_kind_as_the_table_says(kind):
    devices = [{"name": "gpu-0"}, {"name": "gpu-1"}]
    out = {d["name"]: d for d in render.apply_faults(devices, {"gpu-1": kind})}
    fault = faultkinds.KINDS[kind]
    assert out["gpu-0"] == {"name": "gpu-0"}
    if fault.removes_device:
        assert "gpu-1" not in out
    else:
        assert out["gpu-1"]["taints"] == [{"key": faultkinds.TAINT_KEY, "value": kind, "effect": fault.taint_effect}]


def test_codec_round_trips_and_sorts():
    text = faultkinds.encode({"gpu-1": "lost", "gpu-0": "warning"})
    assert text == "gpu-0=warning,gpu-1=lost"
    assert faultkinds.decode(text) == ({"gpu-0": "warning", "gpu-1": "lost"}, [])


def test_an_unknown_kind_is_refused_on_write():
    with pytest.raises(ValueError, match="unknown fault kind.*brokn.*allowed: warning, degraded, unhealthy, lost"):
        faultkinds.encode({"gpu-0": "brokn"})
    with pytest.raises(InvalidInput, match="--kind: brokn: unknown fault kind"):
        faults.set_fault(None, "ns", "cm", "node", "gpu-0", "brokn")  # type: ignore[arg-type]  # refused before any call


def test_an_unknown_kind_is_reported_on_read_and_the_rest_kept(caplog):
    found, problems = faultkinds.decode("gpu-0=brokn, gpu-1=degraded,=lost", "ConfigMap ns/cm key n1")
    assert found == {"gpu-1": "degraded"}
    assert [str(p) for p in problems] == [
        "ConfigMap ns/cm key n1: gpu-0=brokn: unknown fault kind 'brokn' (allowed: warning, degraded, unhealthy, lost)",
        "ConfigMap ns/cm key n1: =lost: no device before '=' (allowed: device=kind)"]
    with caplog.at_level(logging.WARNING, logger="fake_devices.faults"):
        assert faults.parse_faults("gpu-7=melted", "ConfigMap ns/cm key n2") == {}
        faults.parse_faults("gpu-7=melted", "ConfigMap ns/cm key n2")  # the same entry again: logged once
    warnings = [r.getMessage() for r in caplog.records if "gpu-7=melted" in r.getMessage()]
    assert warnings == ["ignoring a fault entry: ConfigMap ns/cm key n2: gpu-7=melted: unknown fault kind 'melted' "
                        "(allowed: warning, degraded, unhealthy, lost)"]
