"""Rendering profiles into ResourceSlices: golden files plus semantic checks that do not rely on them.

Regenerate the golden files after an intended change with

    DRA_HARNESS_UPDATE_GOLDEN=1 .venv/bin/pytest tests/unit/test_render_golden.py

and review the diff: it is exactly what running drivers will publish differently.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
import yaml

from fake_devices import mig, profile, render
from fake_devices.schema import DNS_LABEL

GOLDEN = Path(__file__).resolve().parent / "testdata" / "golden"
DRIVERS = render.Drivers("fake.example.com")
NODE = "node-a"
NODE_UID = "00000000-0000-0000-0000-000000000001"
STD = "resource.kubernetes.io/"
BUILTINS = profile.builtin_names()


def _render(name: str, **kwargs) -> dict[str, list[dict]]:
    return render.render_node(profile.load(name), NODE, kwargs.pop("drivers", DRIVERS), node_uid=NODE_UID,
                              instance="golden", **kwargs)


def _dump(slices: dict[str, list[dict]]) -> str:
    ordered = sorted((s for driver_slices in slices.values() for s in driver_slices),
                     key=lambda s: (s["spec"]["driver"], s["metadata"]["name"]))
    return yaml.safe_dump_all(ordered, sort_keys=False)


def _devices(slices: list[dict]) -> list[dict]:
    return [d for s in slices for d in s["spec"].get("devices", [])]


def _by_name(slices: list[dict]) -> dict[str, dict]:
    return {d["name"]: d for d in _devices(slices)}


def test_there_are_builtins():
    assert {"a100-mig", "dgx-h100", "mixed", "nvme-storage", "tiny"} <= set(BUILTINS)


@pytest.mark.parametrize("name", BUILTINS)
def test_golden(name):
    text = _dump(_render(name))
    path = GOLDEN / f"{name}.yaml"
    if os.environ.get("DRA_HARNESS_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.is_file(), f"no golden file {path}; generate it with DRA_HARNESS_UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{name} renders differently from {path}; if intended, regenerate it"


def test_no_stale_golden_files():
    # kind-*.yaml are the kind backend's golden configs (tests/unit/test_kind_backend.py)
    assert {p.stem for p in GOLDEN.glob("*.yaml") if not p.stem.startswith("kind-")} == set(BUILTINS)


# --- semantic checks --------------------------------------------------------------------------

@pytest.mark.parametrize("name", BUILTINS)
def test_deterministic(name):
    first, second = _render(name), _render(name)
    assert first == second
    assert _dump(first) == _dump(second)


@pytest.mark.parametrize("name", BUILTINS)
def test_slice_limits(name):
    for driver, slices in _render(name).items():
        for s in slices:
            spec = s["spec"]
            devices, sets = spec.get("devices", []), spec.get("sharedCounters", [])
            assert not (devices and sets), f"{s['metadata']['name']}: counter sets and devices in one slice"
            assert devices or sets, f"{s['metadata']['name']}: empty slice"
            assert len(devices) <= render.MAX_DEVICES
            if any("taints" in d or "consumesCounters" in d or render.has_list_attribute(d) for d in devices):
                assert len(devices) <= render.MAX_DEVICES_TAINTED_OR_COUNTED
            assert len(sets) <= render.MAX_COUNTER_SETS
            for counter_set in sets:
                assert len(counter_set["counters"]) <= 32
            for device in devices:
                assert len(device.get("attributes", {})) + len(device.get("capacity", {})) <= \
                    render.MAX_ATTRIBUTES_AND_CAPACITIES


@pytest.mark.parametrize("name", BUILTINS)
def test_pool_bookkeeping(name):
    slices = _render(name, generation=7)
    assert set(slices) <= set(DRIVERS.all())
    for driver, driver_slices in slices.items():
        pools = {(s["spec"]["pool"]["name"], s["spec"]["pool"]["resourceSliceCount"], s["spec"]["pool"]["generation"])
                 for s in driver_slices}
        assert pools == {(NODE, len(driver_slices), 7)}
        access = {"node": {"nodeName": NODE}, "allNodes": {"allNodes": True},
                  "nodeSelector": {"nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [
                      {"key": "kubernetes.io/hostname", "operator": "In", "values": [NODE]}]}]}}}[
            profile.load(name).publish.pool]
        for s in driver_slices:
            assert s["spec"]["driver"] == driver
            assert {k: s["spec"][k] for k in ("nodeName", "allNodes", "nodeSelector") if k in s["spec"]} == access
            assert s["metadata"]["ownerReferences"] == [{"apiVersion": "v1", "kind": "Node", "name": NODE,
                                                         "uid": NODE_UID, "controller": True}]
            assert s["metadata"]["labels"][render.LABEL_PROFILE] == name
        assert len({s["metadata"]["name"] for s in driver_slices}) == len(driver_slices)


@pytest.mark.parametrize("name", BUILTINS)
def test_topology_attributes(name):
    prof = profile.load(name)
    if prof.publish.attributes == "none":  # a bare shape: nothing but names
        assert all(set(d) <= {"name", "consumesCounters", "taints", "allowMultipleAllocations"}
                   for slices in _render(name).values() for d in _devices(slices))
        return
    root_numa = {root: n.id for n in prof.numa_nodes for root in n.pcie_roots}
    for driver, slices in _render(name).items():
        for device in _devices(slices):
            attrs = device["attributes"]
            numa = attrs[STD + "numaNode"]
            assert list(numa) == ["int"] and type(numa["int"]) is int, device["name"]
            assert numa["int"] in {n.id for n in prof.numa_nodes}
            pmem = attrs["type"] == {"string": "pmem"}
            if pmem:
                assert STD + "pcieRoot" not in attrs and STD + "pciBusID" not in attrs
                continue
            root = attrs[STD + "pcieRoot"]
            assert list(root) == ["string"] and isinstance(root["string"], str)
            assert root_numa[root["string"]] == numa["int"], f"{device['name']}: {root} is not on NUMA {numa}"
            fixed_mig = attrs["type"] == {"string": "mig"} and not device.get("consumesCounters")
            if fixed_mig:  # a fixed MIG instance is no PCI function of its own: it has no bus ID
                assert STD + "pciBusID" not in attrs, device["name"]
            else:
                assert isinstance(attrs[STD + "pciBusID"]["string"], str)
            assert not [a for a in attrs if a.startswith(STD) and a[len(STD):] not in
                        ("numaNode", "pcieRoot", "pciBusID")]


@pytest.mark.parametrize("name", BUILTINS)
def test_pci_bus_ids_unique_per_node(name):
    """One PCI function per physical device across all drivers; MIG devices share their GPU's."""
    owners: dict[str, set[str]] = {}
    if profile.load(name).publish.attributes == "none":
        pytest.skip(f"{name} publishes no attributes")
    for slices in _render(name).values():
        for device in _devices(slices):
            bus = device["attributes"].get(STD + "pciBusID")
            if bus:
                physical = device["name"].split("-mig-", 1)[0]
                owners.setdefault(bus["string"], set()).add(physical)
                root = device["attributes"][STD + "pcieRoot"]["string"]
                assert bus["string"].startswith(root[3:7] + ":")
    assert owners and all(len(o) == 1 for o in owners.values()), {b: o for b, o in owners.items() if len(o) > 1}


@pytest.mark.parametrize("name", BUILTINS)
def test_device_names(name):
    for driver, slices in _render(name).items():
        names = [d["name"] for d in _devices(slices)]
        assert len(names) == len(set(names)), f"{driver}: duplicate device names"
        for device_name in names:
            assert DNS_LABEL.match(device_name), device_name
        for s in slices:
            for counter_set in s["spec"].get("sharedCounters", []):
                assert DNS_LABEL.match(counter_set["name"])
                assert all(DNS_LABEL.match(c) for c in counter_set["counters"])


def test_device_counts():
    expected = {
        "tiny": {DRIVERS.gpu: 2, DRIVERS.storage: 2, DRIVERS.nic: 2},
        "dgx-h100": {DRIVERS.gpu: 8, DRIVERS.storage: 4, DRIVERS.nic: 8},
        "nvme-storage": {DRIVERS.storage: 7, DRIVERS.nic: 2},
        "mixed": {DRIVERS.gpu: 2 + 3, DRIVERS.storage: 2, DRIVERS.nic: 2},  # L40S x2 + three fixed MIG devices
        "a100-mig": {DRIVERS.gpu: 4 * (25 + 1)},
    }
    for name, counts in expected.items():
        assert {driver: len(_devices(s)) for driver, s in _render(name).items()} == counts, name


# --- MIG --------------------------------------------------------------------------------------

A100_TABLE = mig.TABLES["A100-SXM4-80GB"]


def test_a100_mig_devices_and_counters():
    slices = _render("a100-mig")[DRIVERS.gpu]
    devices = _by_name(slices)
    sets = {cs["name"]: cs["counters"] for s in slices for cs in s["spec"].get("sharedCounters", [])}
    assert len(sets) == 4
    all_slices = {f"memory-slice-{k}" for k in range(8)}
    for gpu in range(4):
        parent = f"gpu-{gpu}"
        set_name = f"{parent}-slices"
        counters = sets[set_name]
        assert {k: counters[k]["value"] for k in all_slices} == {k: "1" for k in all_slices}
        assert counters["compute-slices"] == {"value": "7"}
        assert counters["media-units"] == {"value": "1"}
        assert counters["memory"] == {"value": "80Gi"}

        full = devices[parent]
        (consumed,) = full["consumesCounters"]
        assert consumed["counterSet"] == set_name
        assert {k for k in consumed["counters"] if k.startswith("memory-slice-")} == all_slices
        assert consumed["counters"]["compute-slices"] == {"value": "7"}
        assert full["attributes"]["migCapable"] == {"bool": True}

        migs = {n: d for n, d in devices.items() if n.startswith(f"{parent}-mig-")}
        assert len(migs) == 25
        expected_names = {f"{parent}-mig-{p.device_suffix}-{start}" for p in A100_TABLE.values() for start in p.starts}
        assert set(migs) == expected_names
        for device in migs.values():
            attrs = device["attributes"]
            prof = A100_TABLE[attrs["profile"]["string"]]
            start = attrs["placementStart"]["int"]
            assert attrs["placementSize"]["int"] == prof.size
            assert attrs["parentUUID"] == full["attributes"]["uuid"]
            assert attrs[STD + "pcieRoot"] == full["attributes"][STD + "pcieRoot"]
            (consumed,) = device["consumesCounters"]
            assert consumed["counterSet"] == set_name
            used = consumed["counters"]
            assert {k for k in used if k.startswith("memory-slice-")} == \
                {f"memory-slice-{k}" for k in range(start, start + prof.size)}
            assert all(used[f"memory-slice-{k}"] == {"value": "1"} for k in range(start, start + prof.size))
            assert used["compute-slices"] == {"value": str(prof.compute)}
            assert ("media-units" in used) == prof.media
            assert set(used) <= set(counters)
            assert device["capacity"]["memory"] == {"value": f"{prof.memory_gb}Gi"}


def test_mig_table_cannot_oversubscribe_compute():
    """Placements with pairwise disjoint memory slices never need more than the 7 compute slices, so
    memory-slice counters alone already keep compute within bounds."""
    placements = [(p, s) for p in A100_TABLE.values() for s in p.starts]

    def best(free: frozenset, index: int) -> int:
        if index == len(placements):
            return 0
        p, start = placements[index]
        skip = best(free, index + 1)
        need = set(p.memory_slices(start))
        if need <= free:
            return max(skip, p.compute + best(free - need, index + 1))
        return skip

    assert best(frozenset(range(mig.MEMORY_SLICES)), 0) == mig.COMPUTE_SLICES


def test_fixed_mig_publishes_only_the_partitions():
    devices = _by_name(_render("mixed")[DRIVERS.gpu])
    assert "a100-0" not in devices
    assert {n for n in devices if n.startswith("a100-")} == {
        "a100-0-mig-3g-40gb-0", "a100-0-mig-2g-20gb-4", "a100-0-mig-1g-10gb-6"}
    assert not any("consumesCounters" in d for d in devices.values())
    assert devices["gpu-0"]["attributes"]["migCapable"] == {"bool": False}


# --- faults -----------------------------------------------------------------------------------

@pytest.mark.parametrize("kind,effect", [("unhealthy", "NoExecute"), ("degraded", "NoSchedule"), ("warning", "None")])
def test_fault_taints(kind, effect):
    clean = _by_name(_render("tiny")[DRIVERS.gpu])
    devices = _by_name(_render("tiny", faults={"gpu-1": kind})[DRIVERS.gpu])
    assert devices["gpu-1"]["taints"] == [{"key": "dra-harness.x-k8s.io/fault", "value": kind, "effect": effect}]
    assert "taints" not in devices["gpu-0"]
    assert {k: v for k, v in devices["gpu-1"].items() if k != "taints"} == clean["gpu-1"]


def test_lost_device_disappears():
    slices = _render("tiny", faults={"gpu-1": "lost", "nic-0": "lost"})
    assert set(_by_name(slices[DRIVERS.gpu])) == {"gpu-0"}
    assert set(_by_name(slices[DRIVERS.nic])) == {"nic-1"}
    assert set(_by_name(slices[DRIVERS.storage])) == {"nvme-0", "nvme-1"}


def test_apply_faults_does_not_mutate_its_input():
    prof = profile.load("tiny")
    devices, _ = render.devices_by_driver(prof, NODE, DRIVERS)[DRIVERS.gpu]
    before = copy.deepcopy(devices)
    render.apply_faults(devices, {"gpu-0": "unhealthy"})
    assert devices == before


def test_mig_devices_share_their_gpu_fault():
    slices = _render("a100-mig", faults={"gpu-0": "degraded"})[DRIVERS.gpu]
    devices = _by_name(slices)
    tainted = {n for n, d in devices.items() if "taints" in d}
    assert tainted == {"gpu-0"} | {n for n in devices if n.startswith("gpu-0-mig-")}
    assert len(tainted) == 26
    assert all(devices[n]["taints"][0]["effect"] == "NoSchedule" for n in tainted)
    assert all(len(s["spec"].get("devices", [])) <= render.MAX_DEVICES_TAINTED_OR_COUNTED for s in slices)

    lost = _by_name(_render("a100-mig", faults={"gpu-1": "lost"})[DRIVERS.gpu])
    assert not [n for n in lost if n == "gpu-1" or n.startswith("gpu-1-")]
    assert len(lost) == 3 * 26


def test_taints_switch_to_the_smaller_slice_limit(tmp_path):
    """100 NICs fit one slice; with one tainted device the pool needs slices of at most 64."""
    path = tmp_path / "many-nics.yaml"
    path.write_text("""apiVersion: dra-harness.x-k8s.io/v1alpha1
kind: NodeProfile
metadata: {name: many-nics}
spec:
  numaNodes: [{id: 0, cpus: "0-7", memory: 32Gi, pcieRoots: [pci0000:10]}]
  nics:
  - {model: a, count: 50, bandwidth: 25G, attach: [{pcieRoot: pci0000:10}]}
  - {model: b, namePrefix: nicb, count: 50, bandwidth: 25G, attach: [{pcieRoot: pci0000:10}]}
""")
    prof = profile.load(str(path))
    clean = render.render_node(prof, NODE, DRIVERS)[DRIVERS.nic]
    assert [len(s["spec"]["devices"]) for s in clean] == [100]
    tainted = render.render_node(prof, NODE, DRIVERS, faults={"nicb-7": "warning"})[DRIVERS.nic]
    assert [len(s["spec"]["devices"]) for s in tainted] == [64, 36]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in tainted} == {2}
    lost = render.render_node(prof, NODE, DRIVERS, faults={"nicb-7": "lost"})[DRIVERS.nic]
    assert [len(s["spec"]["devices"]) for s in lost] == [99]


def test_list_attributes_switch_to_the_smaller_slice_limit(tmp_path):
    """A list attribute is an advanced feature too (ResourceSliceMaxDevicesWithAdvancedFeatures): 100 NICs
    of which 50 publish `numas: [0, 1]` go to slices of at most 64; without it they fit one of 128."""
    path = tmp_path / "many-nics.yaml"
    head = """apiVersion: dra-harness.x-k8s.io/v1alpha1
kind: NodeProfile
metadata: {name: many-nics}
spec:
  numaNodes: [{id: 0, cpus: "0-7", memory: 32Gi, pcieRoots: [pci0000:10]}]
  nics:
  - {model: a, count: 50, bandwidth: 25G, attach: [{pcieRoot: pci0000:10}]}
"""
    path.write_text(head + "  - {model: b, namePrefix: nicb, count: 50, bandwidth: 25G, attach: [{pcieRoot: pci0000:10}],"
                           " attributes: {numas: [0, 1]}}\n")
    listed = render.render_node(profile.load(str(path)), NODE, DRIVERS)[DRIVERS.nic]
    assert [len(s["spec"]["devices"]) for s in listed] == [64, 36]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in listed} == {2}
    assert _by_name(listed)["nicb-0"]["attributes"]["numas"] == {"ints": [0, 1]}
    path.write_text(head + "  - {model: b, namePrefix: nicb, count: 50, bandwidth: 25G, attach: [{pcieRoot: pci0000:10}],"
                           " attributes: {numa: 0}}\n")
    scalar = render.render_node(profile.load(str(path)), NODE, DRIVERS)[DRIVERS.nic]
    assert [len(s["spec"]["devices"]) for s in scalar] == [100]


def test_attribute_values_count_list_items():
    device = {"name": "d", "attributes": {"a": {"int": 1}, "b": {"ints": [1, 2, 3]}, "c": {"versions": ["1.0.0"]}}}
    assert render.attribute_values(device) == 5
    assert render.has_list_attribute(device)
    assert not render.has_list_attribute({"name": "e", "attributes": {"a": {"string": "x"}}})
    assert not render.has_list_attribute({"name": "bare"})


# --- names ------------------------------------------------------------------------------------

def test_slice_names_stable_and_distinct():
    first = {d: [s["metadata"]["name"] for s in sl] for d, sl in _render("dgx-h100").items()}
    again = {d: [s["metadata"]["name"] for s in sl] for d, sl in _render("dgx-h100", generation=5).items()}
    assert first == again
    names = [n for sl in first.values() for n in sl]
    assert len(names) == len(set(names))
    other = render.Drivers("other.example.com")
    other_names = {s["metadata"]["name"] for sl in _render("dgx-h100", drivers=other).values() for s in sl}
    assert not other_names & set(names)
    assert render.slice_name(NODE, DRIVERS.gpu, 0) != render.slice_name(NODE, other.gpu, 0)
    assert render.slice_name(NODE, DRIVERS.gpu, 0) != render.slice_name("node-b", DRIVERS.gpu, 0)
    for name in names:
        assert len(name) <= 253 and name.startswith(f"{NODE}-")


def test_device_identity_depends_on_node():
    a = _by_name(_render("tiny")[DRIVERS.gpu])["gpu-0"]["attributes"]["uuid"]
    b = _by_name(render.render_node(profile.load("tiny"), "node-b", DRIVERS)[DRIVERS.gpu])["gpu-0"]
    assert a != b["attributes"]["uuid"]
    assert a == _by_name(_render("tiny", faults={"gpu-0": "unhealthy"})[DRIVERS.gpu])["gpu-0"]["attributes"]["uuid"]


SHAPES = Path(__file__).resolve().parents[2] / "clusters" / "shapes" / "profiles"


def test_bare_shape_publishes_names_only():
    slices = _render(str(SHAPES / "bare-4.yaml"))[DRIVERS.gpu]
    assert [d for s in slices for d in s["spec"]["devices"]] == [{"name": f"gpu-{i}"} for i in range(4)]
    assert slices[0]["spec"]["nodeName"] == NODE and render.RENDERED_FOR_LABEL not in slices[0]["metadata"]["labels"]


def test_network_shape_names_its_node_by_selector_and_label():
    (only,) = _render(str(SHAPES / "net-4.yaml"))[DRIVERS.gpu]
    assert "nodeName" not in only["spec"] and only["spec"]["nodeSelector"] == {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [NODE]}]}]}
    assert only["metadata"]["labels"][render.RENDERED_FOR_LABEL] == NODE
    assert len(only["spec"]["devices"]) == 4 and all(d["attributes"]["uuid"] for d in only["spec"]["devices"])


def test_shapes_all_nodes_and_refusals(tmp_path):
    """publish.pool allNodes: slices for every node, named by the label of the node they were rendered
    for; an unknown shape is refused naming the field."""
    text = (SHAPES / "gpu-1.yaml").read_text().replace("name: gpu-1", "name: everywhere")
    path = tmp_path / "everywhere.yaml"
    path.write_text(text + "  publish: {pool: allNodes}\n")
    slices = render.render_node(profile.load(str(path)), NODE, DRIVERS)[DRIVERS.gpu]
    assert slices[0]["spec"]["allNodes"] is True and "nodeName" not in slices[0]["spec"]
    assert slices[0]["metadata"]["labels"][render.RENDERED_FOR_LABEL] == NODE
    path.write_text(text + "  publish: {pool: fabric, attributes: some}\n")
    with pytest.raises(profile.InvalidInput) as err:
        profile.load(str(path))
    fields = {p.field for p in err.value.problems}
    assert fields == {"spec.publish.pool", "spec.publish.attributes"}, err.value.problems
