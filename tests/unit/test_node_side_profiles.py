"""Profile fields for three DRA features of 1.37, what they publish and what a profile may not say:
`nodeAllocatable` (DRANodeAllocatableResources), `mig.compatibilityGroups` (DRADeviceCompatibilityGroups) and
`publish.skipNodeOperations` (DRAOptionalNodeOperations). Pure logic: what the cluster does with them is
checked in conformance/test_node_allocatable_resources.py, test_compatibility_groups.py and
test_optional_node_operations.py."""

from __future__ import annotations

import pytest

from fake_devices import profile, render
from fake_devices.errors import InvalidInput

HEAD = """apiVersion: dra-harness.x-k8s.io/v1alpha1
kind: NodeProfile
metadata: {name: node-side}
spec:
  numaNodes: [{id: 0, cpus: "0-15", memory: 64Gi, pcieRoots: [pci0000:10]}]
"""
GPU = """  gpus:
  - model: A100-SXM4-80GB
    count: 1
    attach: [{pcieRoot: pci0000:10}]
"""
NIC = """  nics:
  - model: tiny-nic
    bandwidth: 25G
    attach: [{pcieRoot: pci0000:10}]
"""


def _load(tmp_path, body: str):
    path = tmp_path / "p.yaml"
    path.write_text(HEAD + body)
    return profile.load(str(path)), str(path)


def _devices(prof) -> dict[str, dict]:
    slices = [s for group in render.render_node(prof, "n0", render.Drivers("example.com")).values() for s in group]
    return {d["name"]: d for s in slices for d in s["spec"].get("devices", [])}


def _problems(tmp_path, body: str) -> list[tuple[str, str, str]]:
    path = tmp_path / "p.yaml"
    path.write_text(HEAD + body)
    with pytest.raises(InvalidInput) as info:
        profile.load(str(path))
    assert all(p.source == str(path) for p in info.value.problems)
    return [(p.field, p.problem, p.allowed or "") for p in info.value.problems]


# --- nodeAllocatable ------------------------------------------------------------------------

def test_node_allocatable_becomes_mapping_and_overhead_on_every_device_of_the_group(tmp_path):
    prof, _ = _load(tmp_path, GPU + "    mig: {mode: dynamic}\n"
                    "    nodeAllocatable: {cpu: {perDevice: 2}, memory: {perPod: 1Gi, perContainer: 256Mi},"
                    " hugepages-2Mi: {perPod: 0}}\n" + NIC)
    devices = _devices(prof)
    expected = {"cpu": {"mapping": {"deviceMultiplier": "2"}},
                "memory": {"overhead": {"perPod": "1Gi", "perContainer": "256Mi"}},
                "hugepages-2Mi": {"overhead": {"perPod": "0"}}}
    gpu_side = [d for name, d in devices.items() if name.startswith("gpu-0")]
    assert len(gpu_side) > 1  # the GPU and its MIG placements: a MIG instance needs the host memory too
    assert all(d["nodeAllocatableResources"] == expected for d in gpu_side)
    assert "nodeAllocatableResources" not in devices["nic-0"]


# --- compatibilityGroups ----------------------------------------------------------------------

def test_compatibility_groups_go_into_each_devices_counter_consumption(tmp_path):
    prof, _ = _load(tmp_path, GPU + "    mig: {mode: dynamic, compatibilityGroups: "
                    "{gpu: [whole], 1g.10gb: [small, any], 3g.40gb: [any]}}\n")
    devices = _devices(prof)

    def groups(name: str):
        (consumption,) = devices[name]["consumesCounters"]
        return consumption.get("compatibilityGroups")

    assert groups("gpu-0") == ["whole"]
    assert groups("gpu-0-mig-1g-10gb-0") == ["small", "any"] and groups("gpu-0-mig-3g-40gb-4") == ["any"]
    assert groups("gpu-0-mig-2g-20gb-0") is None  # a profile not named has no groups
    # without the field nothing changes: the golden files hold the plain form
    plain, _ = _load(tmp_path, GPU + "    mig: {mode: dynamic}\n")
    assert not any("compatibilityGroups" in c for d in _devices(plain).values() for c in d.get("consumesCounters", []))


# --- skipNodeOperations -----------------------------------------------------------------------

@pytest.mark.parametrize("skip", [["*"], ["NodeUnprepareResources"], ["NodePrepareResources", "NodeUnprepareResources"]])
def test_skip_node_operations_go_on_every_slice_with_devices(tmp_path, skip):
    prof, _ = _load(tmp_path, GPU + "    mig: {mode: dynamic}\n" + NIC + f"  publish: {{skipNodeOperations: {skip}}}\n")
    slices = [s for group in render.render_node(prof, "n0", render.Drivers("example.com")).values() for s in group]
    with_devices = [s for s in slices if s["spec"].get("devices")]
    assert with_devices and all(s["spec"]["skipNodeOperations"] == skip for s in with_devices)
    # a slice of counter sets holds no devices, so it has nothing to skip
    assert all("skipNodeOperations" not in s["spec"] for s in slices if "sharedCounters" in s["spec"])


# --- mig.partitionType (DRAPartitionableDevicesType) -------------------------------------------

def test_partition_type_labels_each_device_and_makes_costs_of_a_type_equal(tmp_path):
    prof, _ = _load(tmp_path, GPU + "    mig: {mode: dynamic, partitionType: true}\n")
    slices = [s for group in render.render_node(prof, "n0", render.Drivers("example.com")).values() for s in group]
    (counters,) = [s for s in slices if "sharedCounters" in s["spec"]]
    (with_devices,) = [s for s in slices if "devices" in s["spec"]]
    assert with_devices["spec"]["partitionTypeAttribute"] == "gpu.example.com/partitionType"
    assert "partitionTypeAttribute" not in counters["spec"]  # the API refuses it where no device consumes counters
    assert counters["spec"]["sharedCounters"][0]["counters"]["memory-slices"] == {"value": "8"}
    devices = {d["name"]: d for d in with_devices["spec"]["devices"]}
    assert devices["gpu-0"]["attributes"]["partitionType"] == {"string": "gpu"}
    # every placement of one profile: its type, and the very same counters (the contract's "same cost")
    by_type: dict[str, set[str]] = {}
    for name, device in devices.items():
        kind = device["attributes"]["partitionType"]["string"]
        by_type.setdefault(kind, set()).add(repr(device["consumesCounters"]))
    assert all(len(costs) == 1 for costs in by_type.values()), by_type
    assert len(by_type) == 1 + len(prof.gpus[0].mig_table())
    one = devices["gpu-0-mig-3g-40gb-4"]["consumesCounters"][0]["counters"]
    assert one["memory-slices"] == {"value": "4"} and "memory-slice-4" not in one


# --- what a profile may not say: each refused naming the field -------------------------------------

def _dynamic(mig: str, gpu: str = GPU) -> str:
    """A GPU group with dynamic MIG and `mig`'s further fields."""
    return gpu + "    mig: {mode: dynamic, " + mig + "}\n"


BAD_INPUT = {  # case: (the profile's device groups, the field named, a fragment of the problem)
    "extended resource": (NIC + "    nodeAllocatable: {nvidia.com/gpu: {perPod: 1}}\n",
                          "spec.nics[0].nodeAllocatable.nvidia.com/gpu", "not a node allocatable resource"),
    "ephemeral-storage": (NIC + "    nodeAllocatable: {ephemeral-storage: {perPod: 1}}\n",
                          "spec.nics[0].nodeAllocatable.ephemeral-storage", "not a node allocatable"),
    "allocatable nothing": (NIC + "    nodeAllocatable: {cpu: {}}\n", "spec.nics[0].nodeAllocatable.cpu", "sets nothing"),
    "zero per device": (NIC + "    nodeAllocatable: {cpu: {perDevice: 0}}\n",
                        "spec.nics[0].nodeAllocatable.cpu.perDevice", "must be greater than zero"),
    "negative overhead": (NIC + "    nodeAllocatable: {memory: {perPod: -1Gi}}\n",
                          "spec.nics[0].nodeAllocatable.memory.perPod", "is negative"),
    "allocatable typo": (NIC + "    nodeAllocatable: {memory: {perPod: 1Gi, perNode: 1}}\n",
                         "spec.nics[0].nodeAllocatable.memory.perNode", "unknown field"),
    "unknown group key": (_dynamic("compatibilityGroups: {9g.1gb: [x]}"),
                          "spec.gpus[0].mig.compatibilityGroups.9g.1gb", "neither the whole GPU nor a MIG profile"),
    "empty groups": (_dynamic("compatibilityGroups: {gpu: []}"),
                     "spec.gpus[0].mig.compatibilityGroups.gpu", "non-empty list"),
    "groups not a list": (_dynamic("compatibilityGroups: {gpu: whole}"),
                          "spec.gpus[0].mig.compatibilityGroups.gpu", "non-empty list"),
    "three groups": (_dynamic("compatibilityGroups: {1g.10gb: [a, b, c]}"),
                     "spec.gpus[0].mig.compatibilityGroups.1g.10gb", "names 3 groups"),
    "group twice": (_dynamic("compatibilityGroups: {1g.10gb: [a, a]}"),
                    "spec.gpus[0].mig.compatibilityGroups.1g.10gb", "names a group twice"),
    "group not a label": (_dynamic("compatibilityGroups: {1g.10gb: [Small]}"),
                          "spec.gpus[0].mig.compatibilityGroups.1g.10gb", "is not a group name"),
    "groups without counters": (GPU + "    mig: {mode: fixed, partitions: [{profile: 1g.10gb, start: 0}], "
                                "compatibilityGroups: {gpu: [whole]}}\n",
                                "spec.gpus[0].mig.compatibilityGroups", "needs mode dynamic"),
    "prepare without unprepare": (NIC + "  publish: {skipNodeOperations: [NodePrepareResources]}\n",
                                  "spec.publish.skipNodeOperations", "not NodeUnprepareResources"),
    "unknown operation": (NIC + "  publish: {skipNodeOperations: [Prepare]}\n",
                          "spec.publish.skipNodeOperations[0]", "unknown node operation"),
    "operation twice": (NIC + "  publish: {skipNodeOperations: ['*', '*']}\n",
                        "spec.publish.skipNodeOperations[1]", "listed twice"),
    "partition types of two GPUs": (_dynamic("partitionType: true", GPU.replace("count: 1", "count: 2")),
                                    "spec.gpus[0].mig.partitionType", "exactly one GPU"),
    "partition types without counters": (GPU + "    mig: {partitionType: true}\n",
                                         "spec.gpus[0].mig.partitionType", "needs mode dynamic"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUT))
def test_bad_input_is_refused_naming_its_field(tmp_path, case):
    body, field, fragment = BAD_INPUT[case]
    (problem,) = _problems(tmp_path, body)
    assert problem[0] == field and fragment in problem[1], problem
