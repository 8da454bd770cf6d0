"""CT-CONTAINER-DEVICES's pure parts: what a container was given (OCI spec items), a claim's CDI devices,
which CDI device is whose, and the rule's verdict on made-up containers."""

from __future__ import annotations

import json
from pathlib import Path

from conformance import container_view

UID = "0243db12-0ede-40af-9d34-f45144bc9308"


def _spec(tmp_path: Path, devices: dict[str, list[str]], name: str = f"vendor-gpu_{UID}.json") -> Path:
    body = {"cdiVersion": "0.5.0", "kind": "vendor.example/gpu",
            "devices": [{"name": n, "containerEdits": {"env": env, "deviceNodes": [{"path": f"/dev/{n[-5:]}"}]}}
                        for n, env in devices.items()]}
    (tmp_path / name).write_text(json.dumps(body))
    return tmp_path / name


def test_oci_items_cover_env_devices_and_mounts():
    spec = {"process": {"env": ["A=1"]}, "linux": {"devices": [{"path": "/dev/x"}]},
            "mounts": [{"destination": "/data"}]}
    assert container_view.oci_items(spec) == {"env A=1", "device /dev/x", "mount /data"}
    assert container_view.oci_items({}) == set()


def test_claim_cdi_devices_reads_only_the_claims_specs(tmp_path):
    _spec(tmp_path, {f"{UID}-gpu-0": ["G0=gpu-0"], f"{UID}-gpu-1": ["G1=gpu-1"]})
    _spec(tmp_path, {"common": ["X=1"]}, name="vendor-gpu_common.json")  # mentions no claim
    (tmp_path / "notes.txt").write_text(UID)
    found = container_view.claim_cdi_devices(tmp_path, UID)
    assert [d.qualified for d in found] == [f"vendor.example/gpu={UID}-gpu-0", f"vendor.example/gpu={UID}-gpu-1"]
    assert found[0].items == {"env G0=gpu-0", "device /dev/gpu-0"}
    assert container_view.claim_cdi_devices(tmp_path / "missing", UID) == []


def test_named_after_takes_whole_tokens_only(tmp_path):
    device = container_view.CdiDevice("k=x", f"{UID}-gpu-10", frozenset({"env A=1"}), tmp_path)
    assert container_view.named_after(device, "gpu-10")
    assert not container_view.named_after(device, "gpu-1")


def test_given_needs_every_edit_and_one_beyond_the_baseline(tmp_path):
    device = container_view.CdiDevice("k=x", "x", frozenset({"env A=1", "env B=2"}), tmp_path)
    assert container_view.given(device, {"env A=1", "env B=2", "env PATH=/bin"}, {"env PATH=/bin"})
    assert not container_view.given(device, {"env A=1"}, set())
    assert not container_view.given(device, {"env A=1", "env B=2"}, {"env A=1", "env B=2"})  # every container has it


def _verdict(tmp_path, first: set[str], second: set[str]):
    cdi = container_view.claim_cdi_devices(_spec(tmp_path, {f"{UID}-gpu-0": ["G0=gpu-0"],
                                                            f"{UID}-gpu-1": ["G1=gpu-1"]}).parent, UID)
    results = {"first": ("node", "gpu-0"), "second": ("node", "gpu-1")}
    return container_view.isolation_problems("driver d", "c", results, {"c-first": first, "c-second": second}, set(), cdi)


def test_the_rule_passes_containers_that_got_their_own_device_only(tmp_path):
    own0, own1 = {"env G0=gpu-0", "device /dev/gpu-0"}, {"env G1=gpu-1", "device /dev/gpu-1"}
    assert _verdict(tmp_path, own0, own1) == ([], None)


def test_the_rule_names_a_device_that_reached_the_sibling_and_one_that_is_missing(tmp_path):
    own0, own1 = {"env G0=gpu-0", "device /dev/gpu-0"}, {"env G1=gpu-1", "device /dev/gpu-1"}
    problems, why_not = _verdict(tmp_path, own0 | own1, set())
    assert why_not is None and len(problems) == 2, problems
    assert problems[0].startswith("container c-first names request 'first' (device node/gpu-0) but was given CDI "
                                  f"device vendor.example/gpu={UID}-gpu-1 of request 'second': its device node/gpu-1")
    assert problems[1].startswith("container c-second names request 'second' but lacks CDI device "
                                  f"vendor.example/gpu={UID}-gpu-1")


def test_the_rule_is_not_applicable_where_cdi_devices_are_not_named_after_devices(tmp_path):
    spec = _spec(tmp_path, {f"{UID}-all": ["G=both"]})
    problems, why_not = container_view.isolation_problems("driver d", "c", {"first": ("n", "gpu-0"), "second": ("n", "gpu-1")},
                                            {}, set(), container_view.claim_cdi_devices(spec.parent, UID))
    assert problems == [] and "are not named after its devices (gpu-0, gpu-1)" in why_not
