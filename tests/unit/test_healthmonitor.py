"""The reference health monitor's decisions (fake_devices/healthmonitor.py), over recorded objects:
which devices get a rule with which effect, the bound on rules, stable names, and refused flags.
Its behaviour against a real cluster is judged by conformance/test_health_monitor.py."""

from __future__ import annotations

import pytest

from fake_devices import healthmonitor as hm

GPU, NIC = "gpu.x.example.com", "nic.x.example.com"


def slice_of(driver: str, node: str, *devices: str) -> dict:
    return {"spec": {"driver": driver, "nodeName": node, "pool": {"name": node},
                     "devices": [{"name": d} for d in devices]}}


SLICES = [slice_of(GPU, "n1", "gpu-0", "gpu-1", "gpu-1-mig-1g.10gb-0"), slice_of(NIC, "n1", "nic-0"),
          slice_of(GPU, "n2", "gpu-0"), slice_of("other.example.com", "n1", "gpu-0")]


def test_fault_kinds_map_to_states_on_exactly_the_faulty_devices():
    verdicts = hm.verdicts_from_faults(SLICES, {GPU, NIC}, {"n1": {"gpu-0": "degraded", "gpu-1": "unhealthy",
                                                                  "nic-0": "warning"}})
    assert {d: v.state for d, v in verdicts.items()} == {
        (GPU, "n1", "gpu-0"): hm.DEGRADED,
        (GPU, "n1", "gpu-1"): hm.FAILED,
        (GPU, "n1", "gpu-1-mig-1g.10gb-0"): hm.FAILED,  # a MIG device shares its GPU's fault
    }  # warning: healthy; same name on n2 or of a driver not watched: untouched
    assert "fault 'unhealthy' on node n1" in verdicts[(GPU, "n1", "gpu-1")].reason


def test_lost_is_failed_and_no_faults_is_nothing():
    assert {v.state for v in hm.verdicts_from_faults(SLICES, {GPU}, {"n2": {"gpu-0": "lost"}}).values()} == {hm.FAILED}
    assert hm.verdicts_from_faults(SLICES, {GPU, NIC}, {}) == {}


def test_worst_source_wins():
    assert hm.worst([hm.Verdict(hm.DEGRADED, "a"), hm.Verdict(hm.FAILED, "b")]).state == hm.FAILED
    assert hm.worst([]).state == hm.HEALTHY


def test_one_rule_per_unhealthy_device_selecting_exactly_it():
    device = (GPU, "n1", "gpu-0")
    rules, left_out = hm.desired_rules("hm", {device: hm.Verdict(hm.FAILED, "x"),
                                              (GPU, "n1", "gpu-1"): hm.Verdict(hm.HEALTHY, "")}, 10)
    assert left_out == 0 and list(rules) == [hm.rule_name("hm", device)]
    body = rules[hm.rule_name("hm", device)]
    assert body["spec"] == {"deviceSelector": {"driver": GPU, "pool": "n1", "device": "gpu-0"},
                            "taint": {"key": hm.TAINT_KEY, "value": "failed", "effect": "NoExecute"}}
    assert body["metadata"]["labels"] == {hm.MONITOR_LABEL: "hm"}
    degraded, _ = hm.desired_rules("hm", {device: hm.Verdict(hm.DEGRADED, "y")}, 10)
    assert degraded[hm.rule_name("hm", device)]["spec"]["taint"]["effect"] == "NoSchedule"
    # stable per monitor and device, distinct between devices and monitors
    assert hm.rule_name("hm", device) == hm.rule_name("hm", device) != hm.rule_name("hm", (GPU, "n1", "gpu-1"))
    assert hm.rule_name("hm", device) != hm.rule_name("other", device)


def test_rules_are_bounded_failed_devices_first():
    verdicts = {(GPU, "n1", f"gpu-{i}"): hm.Verdict(hm.DEGRADED, "") for i in range(5)}
    verdicts[(GPU, "n1", "gpu-9")] = hm.Verdict(hm.FAILED, "")
    rules, left_out = hm.desired_rules("hm", verdicts, 3)
    assert left_out == 3 and len(rules) == 3
    assert hm.rule_name("hm", (GPU, "n1", "gpu-9")) in rules


@pytest.mark.parametrize("argv, flag", [
    (["--name", "Bad_Name", "--faults", "ns/cm", "--driver", GPU], "--name"),
    (["--name", "hm"], "--faults/--health-socket"),
    (["--name", "hm", "--faults", "ns/cm"], "--faults"),  # faults without a driver to apply them to
    (["--name", "hm", "--faults", "no-slash", "--driver", GPU], "--faults"),
    (["--name", "hm", "--health-socket", f"{GPU}=relative/dra.sock"], "--health-socket"),
    (["--name", "hm", "--health-socket", f"{GPU}=/x", "--max-rules", "0"], "--max-rules"),
])
def test_bad_flags_exit_2_naming_the_flag_before_touching_anything(argv, flag, capsys):
    assert hm.main(argv) == 2  # no kubeconfig given: refused before any client is made
    err = capsys.readouterr().err
    assert err.startswith("error: invalid input") and f"{flag}:" in err and "Traceback" not in err
