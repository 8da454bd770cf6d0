"""Profile -> ResourceSlices for one node: a pure, deterministic function.

Same inputs, same output, byte for byte (sorted devices, stable names, UUIDs hashed from node and
device name), so the output is golden-tested and a restarted driver recognises its own slices.

One pool per node and driver (pool name = node name). Devices are split across slices within the
API limits: 128 devices per slice, 64 when a slice's devices use taints, counters or list attributes
(ResourceSliceMaxDevicesWithAdvancedFeatures); counter sets
(MIG) go to slices of their own, at most 8 sets each. Every device gets the standard topology
attributes `resource.kubernetes.io/numaNode` (int), `.../pcieRoot` and `.../pciBusID`; everything
else is unqualified, i.e. in the driver's own domain.
"""

from __future__ import annotations

import copy
import hashlib
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fake_devices import faultkinds, mig
from fake_devices.errors import Problem
from fake_devices.hardware import WHOLE_GPU, Attachment, GpuGroup, NicGroup, NodeAllocatable, Profile, StorageGroup
from fake_devices.schema import DNS_LABEL

STD = "resource.kubernetes.io/"
MAX_DEVICES = 128
# k8s.io/api@v0.37.2 resource/v1 ResourceSliceMaxDevicesWithAdvancedFeatures: a slice with a tainted
# device, a device consuming counters or one with a list attribute (DRAListTypeAttributes) holds at most 64.
MAX_DEVICES_TAINTED_OR_COUNTED = 64
MAX_COUNTER_SETS = 8
MAX_ATTRIBUTES_AND_CAPACITIES = 32
# ResourceSliceMaxAttributeValuesPerDevice: scalars count 1, a list attribute one per item
MAX_ATTRIBUTE_VALUES = 48
LIST_KINDS = ("ints", "bools", "strings", "versions")
UUID_NAMESPACE = uuid.UUID("6f1c2b8e-52f4-4c55-9a38-6b2f0d7c9e11")
MANAGED_BY = "dra-harness-fake-devices"
LABEL_PROFILE = "dra-harness.x-k8s.io/profile"
INSTANCE_LABEL = "dra-harness.x-k8s.io/fake-driver-instance"  # which fake-driver instance published a slice
FAULT_TAINT_KEY = faultkinds.TAINT_KEY
PARTITION_TYPE = "partitionType"  # the attribute a slice names in partitionTypeAttribute (DRAPartitionableDevicesType)



@dataclass(frozen=True)
class Drivers:
    """The driver names of one fake-driver instance, all under one domain."""

    domain: str

    @property
    def gpu(self) -> str:
        return f"gpu.{self.domain}"

    @property
    def storage(self) -> str:
        return f"storage.{self.domain}"

    @property
    def nic(self) -> str:
        return f"nic.{self.domain}"

    def all(self) -> tuple[str, str, str]:
        return (self.gpu, self.storage, self.nic)


def device_uuid(node: str, device: str, prefix: str) -> str:
    return f"{prefix}-{uuid.uuid5(UUID_NAMESPACE, f'{node}/{device}')}"


def _pci_bus_id(root: str, index_under_root: int) -> str:
    domain, bus = root[3:].split(":")
    return f"{domain}:{(int(bus, 16) + 1 + index_under_root) % 256:02x}:00.0"


def _topology(attach: Attachment, index_under_root: int) -> dict:
    attributes: dict[str, dict[str, Any]] = {STD + "numaNode": {"int": attach.numa_node}}
    if attach.pcie_root:
        attributes[STD + "pcieRoot"] = {"string": attach.pcie_root}
        attributes[STD + "pciBusID"] = {"string": _pci_bus_id(attach.pcie_root, index_under_root)}
    return attributes


def _placements(group, count: int, per_root: dict[str | None, int]):
    """(index, attachment, index among devices behind the same PCIe root) for each device.

    `per_root` is shared by all groups of a node, so devices of different groups behind one root get
    different PCI bus IDs."""
    for i in range(count):
        attach = group.attach[i * len(group.attach) // count]
        key = attach.pcie_root
        yield i, attach, per_root.get(key, 0)
        per_root[key] = per_root.get(key, 0) + 1


# --- devices ----------------------------------------------------------------------------------

def _gpu_devices(node: str, group: GpuGroup, per_root: dict) -> tuple[list[dict], list[dict]]:
    devices, counter_sets = [], []
    table = group.mig_table()
    for i, attach, under_root in _placements(group, group.count, per_root):
        name = f"{group.prefix}-{i}"
        gpu_uuid = device_uuid(node, name, "GPU")
        topology = _topology(attach, under_root)
        common = {"model": {"string": group.model}, "architecture": {"string": group.architecture},
                  "computeCapability": {"string": group.compute_capability}, **topology, **group.attributes}
        if group.interconnect:
            common["interconnect"] = {"string": group.interconnect}
        full: dict[str, Any] = {"name": name, "attributes": {"type": {"string": "gpu"}, "uuid": {"string": gpu_uuid},
                                                        "index": {"int": i}, "migCapable": {"bool": bool(table)},
                                                        **common},
                                 "capacity": {"memory": {"value": group.memory},
                                              "multiprocessors": {"value": str(group.multiprocessors)}}}
        # fields every device of the group carries, the whole GPU and each MIG placement alike
        shared_fields = {**_binding_fields(group), **_node_allocatable_fields(group.node_allocatable)}
        full.update(copy.deepcopy(shared_fields))
        if group.mig_mode == "none":
            devices.append(full)
            continue
        if group.mig_mode == "fixed":
            placements = [(table[p.profile], p.start) for p in group.partitions]
        else:
            placements = [(p, start) for p in table.values() for start in p.starts]
        counter_set = f"{name}-slices" if group.mig_mode == "dynamic" else None
        if counter_set:
            counters = _memory_slice_counters(group)
            counters.update({"compute-slices": {"value": str(mig.COMPUTE_SLICES)}, "memory": {"value": group.memory},
                             "media-units": {"value": "1"}})
            counter_sets.append({"name": counter_set, "counters": counters})
            full["consumesCounters"] = [_consumption(counter_set, copy.deepcopy(counters),
                                                     group.compatibility_groups.get(WHOLE_GPU))]
            if group.partition_type:
                full["attributes"][PARTITION_TYPE] = {"string": WHOLE_GPU}
            devices.append(full)  # the whole GPU takes every slice, so it excludes all its partitions
        for profile, start in placements:
            mig_name = f"{name}-mig-{profile.device_suffix}-{start}"
            memory = f"{profile.memory_gb}Gi"
            attributes = {"type": {"string": "mig"}, "uuid": {"string": device_uuid(node, mig_name, "MIG")},
                          "parentUUID": {"string": gpu_uuid}, "parentIndex": {"int": i},
                          "profile": {"string": profile.name}, "placementStart": {"int": start},
                          "placementSize": {"int": profile.size}, **copy.deepcopy(common)}
            if not counter_set:
                # Fixed instances are no PCI functions of their own and share no counter set that would
                # mark them partitions of one device: their parent's bus ID is not theirs to publish
                # (pcieRoot stays, for alignment); the GPU itself is not published in fixed mode.
                attributes.pop(STD + "pciBusID", None)
            device = {"name": mig_name, "attributes": attributes,
                      "capacity": {"memory": {"value": memory},
                                   "multiprocessors": {"value": str(profile.multiprocessors)}}}
            if counter_set:
                used = ({"memory-slices": {"value": str(profile.size)}} if group.partition_type else
                        {f"memory-slice-{s}": {"value": "1"} for s in profile.memory_slices(start)})
                used.update({"compute-slices": {"value": str(profile.compute)}, "memory": {"value": memory}})
                if profile.media:
                    used["media-units"] = {"value": "1"}
                device["consumesCounters"] = [_consumption(counter_set, used,
                                                           group.compatibility_groups.get(profile.name))]
            if group.partition_type:
                attributes[PARTITION_TYPE] = {"string": profile.name}
            device.update(copy.deepcopy(shared_fields))
            devices.append(device)
    return devices, counter_sets


def _memory_slice_counters(group: GpuGroup) -> dict:
    """A MIG GPU's memory slices as counters: one per slice, so that a placement takes the very slices it
    occupies; or, with partition types, their number alone (all placements of a profile then cost the same,
    as the partition-type contract needs, and the allocator no longer tells placements apart)."""
    if group.partition_type:
        return {"memory-slices": {"value": str(mig.MEMORY_SLICES)}}
    return {f"memory-slice-{s}": {"value": "1"} for s in range(mig.MEMORY_SLICES)}


def _consumption(counter_set: str, counters: dict, groups: tuple[str, ...] | None) -> dict:
    """A device's use of its GPU's counter set, with its compatibility groups (DRADeviceCompatibilityGroups)."""
    consumption: dict = {"counterSet": counter_set, "counters": counters}
    if groups:
        consumption["compatibilityGroups"] = list(groups)
    return consumption


def _node_allocatable_fields(entries: tuple[NodeAllocatable, ...]) -> dict:
    """A device's nodeAllocatableResources (DRANodeAllocatableResources, k8s.io/api@v0.37.2 resource/v1
    NodeAllocatableResource): perDevice as mapping.deviceMultiplier, perPod/perContainer as overhead."""
    resources: dict = {}
    for entry in entries:
        value: dict = {}
        if entry.per_device is not None:
            value["mapping"] = {"deviceMultiplier": entry.per_device}
        overhead = {key: q for key, q in (("perPod", entry.per_pod), ("perContainer", entry.per_container))
                    if q is not None}
        if overhead:
            value["overhead"] = overhead
        resources[entry.resource] = value
    return {"nodeAllocatableResources": resources} if resources else {}


def _binding_fields(group: GpuGroup) -> dict:
    """A device's DRADeviceBindingConditions fields (k8s.io/api@v0.37.2 resource/v1 Device)."""
    if group.binding is None:
        return {}
    fields: dict = {"bindingConditions": list(group.binding.conditions),
                    "bindingFailureConditions": list(group.binding.failure_conditions)}
    if group.binding.binds_to_node:
        fields["bindsToNode"] = True
    return fields


def _storage_devices(node: str, group: StorageGroup, per_root: dict) -> list[dict]:
    devices = []
    for i, attach, under_root in _placements(group, group.count, per_root):
        name = f"{group.prefix}-{i}"
        capacity: dict = {"value": group.capacity}
        if group.shareable:
            policy: dict = {"default": group.request_default}
            if group.request_min or group.request_step:
                valid_range = {"min": group.request_min or group.request_step}
                if group.request_step:
                    valid_range["step"] = group.request_step
                policy["validRange"] = valid_range
            capacity["requestPolicy"] = policy
        device: dict[str, Any] = {"name": name,
                  "attributes": {"type": {"string": group.kind}, "model": {"string": group.model},
                                 "serial": {"string": device_uuid(node, name, "SN")}, "index": {"int": i},
                                 **_topology(attach, under_root), **group.attributes},
                  "capacity": {"size": capacity}}
        if group.io_share:
            share = group.io_share
            valid_range = {"min": share.minimum, "step": share.step}
            if share.maximum:
                valid_range["max"] = share.maximum
            device["capacity"]["ioShare"] = {"value": "1", "requestPolicy": {"default": share.default,
                                                                              "validRange": valid_range}}
        if group.shareable:
            device["allowMultipleAllocations"] = True
        device.update(_node_allocatable_fields(group.node_allocatable))
        devices.append(device)
    return devices


def _nic_devices(node: str, group: NicGroup, per_root: dict) -> list[dict]:
    devices = []
    for i, attach, under_root in _placements(group, group.count, per_root):
        name = f"{group.prefix}-{i}"
        digest = hashlib.sha256(f"{node}/{name}".encode()).digest()
        mac = "02:" + ":".join(f"{b:02x}" for b in digest[:5])  # locally administered, deterministic
        devices.append({"name": name,
                        "attributes": {"type": {"string": "nic"}, "model": {"string": group.model},
                                       "macAddress": {"string": mac}, "index": {"int": i},
                                       **_topology(attach, under_root), **group.attributes},
                        "capacity": {"bandwidth": {"value": group.bandwidth}},
                        **_node_allocatable_fields(group.node_allocatable)})
    return devices


def devices_by_driver(profile: Profile, node: str, drivers: Drivers) -> dict[str, tuple[list[dict], list[dict]]]:
    """driver -> (devices, counter sets), before faults are applied."""
    result: dict[str, tuple[list[dict], list[dict]]] = {}
    gpus, counters = [], []
    per_root: dict[str | None, int] = {}  # devices so far behind each PCIe root, for bus IDs
    for group in profile.gpus:
        d, c = _gpu_devices(node, group, per_root)
        gpus += d
        counters += c
    if gpus:
        result[drivers.gpu] = (gpus, counters)
    storage = [d for g in profile.storage for d in _storage_devices(node, g, per_root)]
    if storage:
        result[drivers.storage] = (storage, [])
    nics = [d for g in profile.nics for d in _nic_devices(node, g, per_root)]
    if nics:
        result[drivers.nic] = (nics, [])
    return result


# --- faults -----------------------------------------------------------------------------------

def _fault_of(device: dict, faults: dict[str, str]) -> str | None:
    """A device's fault: its own, or its physical GPU's (a MIG device shares its parent's fate)."""
    if device["name"] in faults:
        return faults[device["name"]]
    parent = device["name"].split("-mig-", 1)[0]
    return faults.get(parent) if parent != device["name"] else None


def apply_faults(devices: list[dict], faults: dict[str, str]) -> list[dict]:
    result = []
    for device in devices:
        fault = faultkinds.KINDS.get(_fault_of(device, faults) or "")
        if fault is not None and fault.removes_device:
            continue
        if fault is not None and fault.taint_effect is not None:
            device = {**device, "taints": [{"key": FAULT_TAINT_KEY, "value": fault.name, "effect": fault.taint_effect}]}
        result.append(device)
    return result


# --- slices -----------------------------------------------------------------------------------

def has_list_attribute(device: dict) -> bool:
    """Whether a device publishes a list attribute: it makes its slice one with advanced features (at most
    64 devices, k8s.io/kubernetes@v1.37.2 pkg/apis/resource/validation haveListAttributes)."""
    return any(kind in value for value in device.get("attributes", {}).values() for kind in LIST_KINDS)


def attribute_values(device: dict) -> int:
    """The API's count of a device's attribute values (validation numEntriesDeviceAttribute): one per
    scalar, one per item of a list."""
    total = 0
    for value in device.get("attributes", {}).values():
        items = [value[kind] for kind in LIST_KINDS if kind in value]
        total += sum(len(i) for i in items) if items else 1
    return total


def slice_name(node: str, driver: str, index: int) -> str:
    kind = driver.split(".", 1)[0]
    digest = hashlib.sha256(driver.encode()).hexdigest()[:6]
    return f"{node}-{kind}-{digest}-{index}"


def _chunks(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)] or [[]]


# The node a slice was rendered for: its nodeName says so only for node-local pools.
RENDERED_FOR_LABEL = "dra-harness.x-k8s.io/rendered-for"


def _access(pool: str, node: str) -> dict:
    """Where a pool's devices are reachable: the node itself, or (network-attached) through a node
    selector naming it, or from every node."""
    if pool == "allNodes":
        return {"allNodes": True}
    if pool == "nodeSelector":
        return {"nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}}
    return {"nodeName": node}


def render_node(profile: Profile, node: str, drivers: Drivers, *, generation: int = 1,
                faults: dict[str, str] | None = None, node_uid: str | None = None,
                instance: str = "default") -> dict[str, list[dict]]:
    """driver -> the ResourceSlice objects of that driver's pool on `node`."""
    output = {}
    shape = profile.publish
    for driver, (devices, counter_sets) in devices_by_driver(profile, node, drivers).items():
        devices = apply_faults(devices, faults or {})
        if shape.attributes == "none":  # bare names: nothing a selector could tell them apart by
            devices = [{k: v for k, v in d.items() if k not in ("attributes", "capacity")} for d in devices]
        limited = any("taints" in d or "consumesCounters" in d or has_list_attribute(d) for d in devices)
        groups: list[tuple[list, list]] = [(chunk, []) for chunk in
                                           _chunks(devices, MAX_DEVICES_TAINTED_OR_COUNTED if limited else MAX_DEVICES)]
        if counter_sets:
            groups = [([], chunk) for chunk in _chunks(counter_sets, MAX_COUNTER_SETS)] + groups
        slices = []
        for index, (chunk, sets) in enumerate(groups):
            spec: dict = {"driver": driver, **_access(shape.pool, node),
                          "pool": {"name": node, "generation": generation, "resourceSliceCount": len(groups)}}
            if sets:
                spec["sharedCounters"] = sets
            else:
                spec["devices"] = chunk
                if shape.skip_node_operations:  # DRAOptionalNodeOperations: copied into each allocation result
                    spec["skipNodeOperations"] = list(shape.skip_node_operations)
                if any(PARTITION_TYPE in d.get("attributes", {}) and "consumesCounters" in d for d in chunk):
                    spec["partitionTypeAttribute"] = f"{driver}/{PARTITION_TYPE}"
            metadata: dict = {"name": slice_name(node, driver, index),
                              "labels": {"app.kubernetes.io/managed-by": MANAGED_BY, LABEL_PROFILE: profile.name,
                                         INSTANCE_LABEL: instance}}
            if shape.pool != "node":
                metadata["labels"][RENDERED_FOR_LABEL] = node
            if node_uid:
                metadata["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid,
                                                "controller": True}]
            slices.append({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": metadata,
                           "spec": spec})
        output[driver] = slices
    return output


# Attributes the renderer sets itself (besides the standard topology ones): a profile's extra
# `attributes` must not redefine them.
GENERATED_ATTRIBUTES = {
    "gpus": {"type", "uuid", "index", "migCapable", "model", "architecture", "computeCapability", "interconnect",
             "parentUUID", "parentIndex", "profile", "placementStart", "placementSize", PARTITION_TYPE},
    "storage": {"type", "model", "serial", "index"},
    "nics": {"type", "model", "macAddress", "index"},
}


def _groups_by_kind(profile: Profile) -> tuple[tuple[str, Sequence[GpuGroup | StorageGroup | NicGroup]], ...]:
    return ("gpus", profile.gpus), ("storage", profile.storage), ("nics", profile.nics)


def check_limits(profile: Profile) -> list[Problem]:
    """API limits a profile could break through its own declarations (checked on a sample node)."""
    problems = []
    for kind, groups in _groups_by_kind(profile):
        for i, group in enumerate(groups):
            for name in sorted(set(group.attributes) & GENERATED_ATTRIBUTES[kind]):
                problems.append(Problem(profile.source, f"spec.{kind}[{i}].attributes.{name}",
                                        "is set by the fake driver itself and cannot be redefined",
                                        "another name"))
    drivers = Drivers("example.com")
    for driver, (devices, _) in devices_by_driver(profile, "node", drivers).items():
        too_long = next((d["name"] for d in devices if not DNS_LABEL.match(d["name"])), None)
        if too_long:  # device names are DNS labels; a long namePrefix plus -N or -mig-... can exceed 63
            problems.append(Problem(profile.source, f"{_group_of(profile, too_long)}.namePrefix",
                                    f"device name {too_long} would be longer than 63 characters",
                                    "a shorter namePrefix"))
        for device in devices:
            used = len(device["attributes"]) + len(device.get("capacity", {}))
            if used > MAX_ATTRIBUTES_AND_CAPACITIES:
                where = _group_of(profile, device["name"])
                problems.append(Problem(profile.source, f"{where}.attributes",
                                        f"device {device['name']} would have {used} attributes and capacities",
                                        f"at most {MAX_ATTRIBUTES_AND_CAPACITIES}"))
                break
            values = attribute_values(device)
            if values > MAX_ATTRIBUTE_VALUES:
                where = _group_of(profile, device["name"])
                problems.append(Problem(profile.source, f"{where}.attributes",
                                        f"device {device['name']} would have {values} attribute values "
                                        "(each item of a list counts)",
                                        f"at most {MAX_ATTRIBUTE_VALUES} in all, the fake driver's own included"))
                break
    return problems


def _group_of(profile: Profile, device_name: str) -> str:
    prefix = device_name.rsplit("-", 1)[0].split("-mig-", 1)[0]
    for kind, groups in _groups_by_kind(profile):
        for i, group in enumerate(groups):
            if device_name.startswith(group.prefix + "-"):
                return f"spec.{kind}[{i}]"
    return f"spec ({prefix})"
