"""A node's hardware as data: NUMA nodes, PCIe attachments and the device groups a node profile
declares. `profile` reads and checks profile files into these; `render` turns them into devices.
(A module of its own so that `profile` can check its limits with `render` and `render` can read these
without the two importing each other.)"""

from __future__ import annotations

from dataclasses import dataclass, field

from fake_devices import mig


@dataclass(frozen=True)
class Attachment:
    numa_node: int
    pcie_root: str | None  # None for memory-bus devices (persistent memory)


@dataclass(frozen=True)
class NumaNode:
    id: int
    cpus: str
    memory: str
    pcie_roots: tuple[str, ...]


@dataclass(frozen=True)
class Binding:
    """Devices that need an external controller before a pod may bind (DRADeviceBindingConditions): the
    conditions they publish, and how the fake driver's attach controller acts them out."""
    conditions: tuple[str, ...]
    failure_conditions: tuple[str, ...]
    binds_to_node: bool = True
    attach: str = "succeeds"  # succeeds | fails-once | fails | never
    attach_seconds: float = 2.0  # from allocation to the controller's answer


WHOLE_GPU = "gpu"  # the key of a GPU group's compatibility groups for the whole GPU (MIG profiles are the others)


@dataclass(frozen=True)
class NodeAllocatable:
    """How much of one of the node's own allocatable resources (cpu, memory, hugepages-*) each device of a
    group takes when allocated (DRANodeAllocatableResources): `per_device` becomes the device's
    mapping.deviceMultiplier, `per_pod` and `per_container` its overhead."""
    resource: str
    per_device: str | None = None
    per_pod: str | None = None
    per_container: str | None = None


@dataclass(frozen=True)
class MigPartition:
    profile: str
    start: int


@dataclass(frozen=True)
class GpuGroup:
    model: str
    count: int
    memory: str
    multiprocessors: int
    architecture: str
    compute_capability: str
    attach: tuple[Attachment, ...]
    interconnect: str | None = None  # e.g. an NVLink/NVSwitch domain shared by the group
    mig_mode: str = "none"
    partitions: tuple[MigPartition, ...] = ()
    prefix: str = "gpu"
    attributes: dict = field(default_factory=dict)  # extra vendor attributes, already in API form
    binding: Binding | None = None
    node_allocatable: tuple[NodeAllocatable, ...] = ()
    # DRADeviceCompatibilityGroups, dynamic MIG only: "gpu" (the whole GPU) or a MIG profile -> its groups
    compatibility_groups: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # DRAPartitionableDevicesType, dynamic MIG only: each device names its partition type, and memory is
    # counted in slices (not which slices), so that all devices of one type cost the same
    partition_type: bool = False

    def mig_table(self) -> dict[str, mig.MigProfile]:
        return mig.TABLES.get(self.model, {})


@dataclass(frozen=True)
class StorageGroup:
    kind: str
    model: str
    count: int
    capacity: str
    attach: tuple[Attachment, ...]
    shareable: bool = False
    request_default: str | None = None
    request_min: str | None = None
    request_step: str | None = None
    prefix: str = ""
    attributes: dict = field(default_factory=dict)
    io_share: "IoShare | None" = None
    node_allocatable: tuple[NodeAllocatable, ...] = ()


@dataclass(frozen=True)
class IoShare:
    """A shareable device's I/O bandwidth as a fraction: capacity `ioShare` of 1 (the whole device),
    claimed in fractional steps (DRAFractionalCapacityRange: milli-unit rounding of min/max/step)."""
    default: str
    minimum: str
    step: str
    maximum: str | None = None


@dataclass(frozen=True)
class NicGroup:
    model: str
    count: int
    bandwidth: str
    attach: tuple[Attachment, ...]
    prefix: str = "nic"
    attributes: dict = field(default_factory=dict)
    node_allocatable: tuple[NodeAllocatable, ...] = ()


@dataclass(frozen=True)
class Publish:
    """How the driver publishes a node's devices: the shape a real driver may have. `attributes`
    "none" publishes bare device names (no attributes, no capacity), as drivers whose devices are
    interchangeable do; `pool` "node" is a node-local pool (nodeName), "nodeSelector" and "allNodes"
    a network-attached one (no nodeName: a node selector naming the node, or every node).
    `skip_node_operations` (DRAOptionalNodeOperations) is what the kubelet need not call the driver for."""

    attributes: str = "all"  # all | none
    pool: str = "node"  # node | nodeSelector | allNodes
    skip_node_operations: tuple[str, ...] = ()


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    source: str
    numa_nodes: tuple[NumaNode, ...]
    gpus: tuple[GpuGroup, ...] = ()
    storage: tuple[StorageGroup, ...] = ()
    nics: tuple[NicGroup, ...] = ()
    node_labels: dict[str, str] = field(default_factory=dict)
    publish: Publish = Publish()

    def numa(self, node_id: int) -> NumaNode:
        return next(n for n in self.numa_nodes if n.id == node_id)
