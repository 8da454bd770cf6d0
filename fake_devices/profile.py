"""Node profiles: the hardware of one node model, declared in YAML, checked, and held as data.

A profile names NUMA nodes (CPUs, memory, the PCIe roots behind them) and groups of devices attached
to them: GPUs (optionally MIG-partitioned), storage (NVMe drives, persistent memory, CXL memory) and
NICs. A group's `attach` list says where its devices sit: device i of a group of `count` goes to
`attach[i * len(attach) // count]`, so 8 GPUs over 4 roots put two behind each root. A PCIe root
belongs to the NUMA node that lists it, so the two can never disagree.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from fake_devices import mig, render, yamlfile
from fake_devices.errors import InvalidInput, Problem
from fake_devices.hardware import (
    WHOLE_GPU,
    Attachment,
    Binding,
    GpuGroup,
    IoShare,
    MigPartition,
    NicGroup,
    NodeAllocatable,
    NumaNode,
    Profile,
    Publish,
    StorageGroup,
)
from fake_devices.schema import (
    DNS_LABEL,
    LABEL_NAME,
    Reader,
    is_qualified_name,
    label_problems,
    quantity_value,
    read_header,
)

API_VERSION = "dra-harness.x-k8s.io/v1alpha1"
KIND = "NodeProfile"
BUILTIN_DIR = Path(__file__).resolve().parent / "profiles"
PCIE_ROOT = re.compile(r"^pci[0-9a-f]{4}:[0-9a-f]{2}$")
CPU_LIST = re.compile(r"^\d{1,5}(-\d{1,5})?(,\d{1,5}(-\d{1,5})?)*$")  # the kernel's cpulist format
MAX_CPU = 8191  # the kernel's NR_CPUS upper bound on x86-64
# semver.org 2.0.0, as the API checks version attributes
SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
                    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
                    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$")
MIG_MODES = ("none", "dynamic", "fixed")
STORAGE_KINDS = ("nvme", "pmem", "cxl-memory")
STANDARD_PREFIX = "resource.kubernetes.io/"

# Known GPU models: what a profile gets unless it says otherwise.
GPU_MODELS: dict[str, dict[str, Any]] = {
    "H100-SXM5-80GB": {"memory": "80Gi", "multiprocessors": 132, "architecture": "Hopper", "computeCapability": "9.0"},
    "A100-SXM4-80GB": {"memory": "80Gi", "multiprocessors": 108, "architecture": "Ampere", "computeCapability": "8.0"},
    "L40S": {"memory": "48Gi", "multiprocessors": 142, "architecture": "Ada", "computeCapability": "8.9"},
    "T4": {"memory": "16Gi", "multiprocessors": 40, "architecture": "Turing", "computeCapability": "7.5"},
}


def builtin_names() -> list[str]:
    return sorted(p.stem for p in BUILTIN_DIR.glob("*.yaml"))


def resolve_path(name_or_path: str) -> Path:
    """A built-in profile name or a path to a profile file."""
    if name_or_path in builtin_names():
        return BUILTIN_DIR / f"{name_or_path}.yaml"
    return Path(name_or_path)


def load(name_or_path: str) -> Profile:
    path = resolve_path(name_or_path)
    if not path.exists():
        raise InvalidInput([Problem(str(name_or_path), "(file)", "no such profile file or built-in profile",
                                    ", ".join(builtin_names()))])
    return parse(yamlfile.load(path), str(path))


def parse(data, source: str) -> Profile:
    """Validate a profile document; raise InvalidInput listing every problem."""
    problems: list[Problem] = []
    top = Reader(data, source, "", problems)
    name, spec = read_header(top, API_VERSION, KIND, name_pattern=DNS_LABEL,
                             name_allowed="a DNS label: lowercase letters, digits, '-'")
    description = spec.str("description", default="") or ""
    node_labels = _node_labels(spec)

    numa_nodes = _numa_nodes(spec, problems)
    roots = {root: n.id for n in numa_nodes for root in n.pcie_roots}
    numa_ids = {n.id for n in numa_nodes}
    gpus = tuple(g for g in (_gpu_group(r, roots, numa_ids) for r in spec.list("gpus")) if g)
    storage = tuple(s for s in (_storage_group(r, roots, numa_ids) for r in spec.list("storage")) if s)
    nics = tuple(n for n in (_nic_group(r, roots, numa_ids) for r in spec.list("nics")) if n)
    publish = _publish(spec)
    spec.done()
    top.done()
    if not (gpus or storage or nics) and not problems:
        spec.fail("spec", "declares no devices", "at least one of gpus, storage, nics")

    profile = Profile(name or "", description, source, numa_nodes, gpus, storage, nics, node_labels, publish)
    if not problems:
        _check_names(profile, problems)
        _check_partition_type(profile, problems)
    if not problems:
        problems.extend(render.check_limits(profile))
    if problems:
        raise InvalidInput(problems)
    return profile


PUBLISH_ATTRIBUTES = ("all", "none")
PUBLISH_POOLS = ("node", "nodeSelector", "allNodes")
# k8s.io/api@v0.37.2 resource/v1 SkipNodeOperation values
SKIP_NODE_OPERATIONS = ("NodePrepareResources", "NodeUnprepareResources", "*")


def _publish(spec: Reader) -> Publish:
    """spec.publish: the driver shape (bare devices, network-attached pools, node operations the kubelet may
    skip); defaults publish everything in a node-local pool, prepared on the node."""
    section = spec.mapping("publish")
    attributes = section.str("attributes", default="all", choices=PUBLISH_ATTRIBUTES) or "all"
    pool = section.str("pool", default="node", choices=PUBLISH_POOLS) or "node"
    skip = _skip_node_operations(section)
    section.done()
    return Publish(attributes, pool, skip)


def _skip_node_operations(r: Reader) -> tuple[str, ...]:
    """`skipNodeOperations` (DRAOptionalNodeOperations): the API's values, each once, and never
    NodePrepareResources alone: what was not prepared cannot be unprepared (k8s.io/kubernetes@v1.37.2
    pkg/apis/resource/validation validateSkipNodeOperations)."""
    found: list[str] = []
    for i, value in enumerate(r.scalars("skipNodeOperations")):
        where = f"{r.at('skipNodeOperations')}[{i}]"
        if value not in SKIP_NODE_OPERATIONS:
            r.fail(where, f"unknown node operation {value!r}", ", ".join(SKIP_NODE_OPERATIONS))
        elif value in found:
            r.fail(where, f"{value} is listed twice")
        else:
            found.append(value)
    if "NodePrepareResources" in found and not {"NodeUnprepareResources", "*"} & set(found):
        r.fail(r.at("skipNodeOperations"), "skips NodePrepareResources but not NodeUnprepareResources "
               "(what was not prepared cannot be unprepared)", "[NodePrepareResources, NodeUnprepareResources], "
               "[NodeUnprepareResources] or ['*']")
    return tuple(found)


HUGEPAGES = re.compile(r"^hugepages-[0-9]+(\.[0-9]+)?([KMGTPE]i?|[kmgtpe])?$")
NODE_ALLOCATABLE_ALLOWED = "cpu, memory or hugepages-<size> (the node's own allocatable resources)"


def _node_allocatable(r: Reader) -> tuple[NodeAllocatable, ...]:
    """`nodeAllocatable: {<resource>: {perDevice, perPod, perContainer}}` (DRANodeAllocatableResources): what
    each allocated device of the group takes of the node's cpu, memory or hugepages, checked by the API
    server's rules (k8s.io/kubernetes@v1.37.2 pkg/apis/resource/validation validateNodeAllocatableResources;
    pkg/apis/core/helper IsNodeAllocatableResourceName)."""
    result = []
    section = r.mapping("nodeAllocatable")
    for name in list(section.data):
        if not isinstance(name, str) or not (name in ("cpu", "memory") or HUGEPAGES.match(name)):
            section.fail(section.at(str(name)), f"{name!r} is not a node allocatable resource",
                         NODE_ALLOCATABLE_ALLOWED)
            section.handled(name)
            continue
        entry = section.mapping(name)
        before = len(r.problems)
        per_device = entry.quantity("perDevice")
        per_pod = entry.quantity("perPod", positive=False)
        per_container = entry.quantity("perContainer", positive=False)
        entry.done()
        for key, value in (("perPod", per_pod), ("perContainer", per_container)):
            if value is not None and quantity_value(value) < 0:
                entry.fail(entry.at(key), f"{value!r} is negative", "a quantity of at least 0")
        if len(r.problems) > before:
            continue
        if per_device is None and per_pod is None and per_container is None:
            entry.fail(entry.path, "sets nothing", "perDevice, perPod and/or perContainer")
            continue
        result.append(NodeAllocatable(name, per_device, per_pod, per_container))
    return tuple(result)


def _node_labels(spec: Reader) -> dict[str, str]:
    """Labels every node with this profile gets (a pool's own labels win over them)."""
    raw = spec.raw_mapping("nodeLabels")
    for key, problem, allowed in label_problems(raw):
        spec.fail(f"{spec.at('nodeLabels')}.{key}", problem, allowed)
    return {str(k): "" if v is None else str(v) for k, v in raw.items()}


def _cpu_list_problem(cpus: str) -> str | None:
    """What is wrong with a cpulist the pattern accepted: reversed ranges, overlaps, CPUs beyond the limit."""
    seen: set[int] = set()
    for part in cpus.split(","):
        low, _, high = part.partition("-")
        first, last = int(low), int(high or low)
        if first > last:
            return f"range {part} is reversed"
        if last > MAX_CPU:
            return f"CPU {last} is beyond {MAX_CPU}"
        overlap = seen.intersection(range(first, last + 1))
        if overlap:
            return f"CPU {min(overlap)} is listed twice"
        seen.update(range(first, last + 1))
    return None


def _numa_nodes(spec: Reader, problems: list[Problem]) -> tuple[NumaNode, ...]:
    nodes = []
    seen_ids: set[int] = set()
    seen_roots: dict[str, str] = {}
    readers = spec.list("numaNodes", required=True)
    if not readers and "numaNodes" in spec.data:
        spec.fail(spec.at("numaNodes"), "must list at least one NUMA node")
    for r in readers:
        node_id = r.int("id", required=True, minimum=0, maximum=1023)
        cpus = r.str("cpus", required=True, pattern=CPU_LIST, allowed="a CPU list like 0-55,112-167")
        if cpus and (wrong := _cpu_list_problem(cpus)):
            r.fail(r.at("cpus"), f"{cpus!r}: {wrong}", f"ascending ranges low-high of CPUs 0..{MAX_CPU}, each CPU once")
            cpus = None
        memory = r.quantity("memory", required=True)
        roots = []
        for i, root in enumerate(r.scalars("pcieRoots")):
            where = f"{r.at('pcieRoots')}[{i}]"
            if not isinstance(root, str) or not PCIE_ROOT.match(root):
                r.fail(where, f"{root!r} is not a PCIe root", "pci<domain>:<bus> in hex, e.g. pci0000:3a")
            elif root in seen_roots:
                r.fail(where, f"PCIe root {root} is already listed at {seen_roots[root]}")
            else:
                seen_roots[root] = where
                roots.append(root)
        r.done()
        if node_id is not None:
            if node_id in seen_ids:
                r.fail(r.at("id"), f"duplicate NUMA node id {node_id}")
            seen_ids.add(node_id)
            nodes.append(NumaNode(node_id, cpus or "", memory or "", tuple(roots)))
    return tuple(nodes)


def _attachments(r: Reader, count: int | None, roots: dict[str, int], numa_ids: set[int],
                 need_root: bool) -> tuple[Attachment, ...]:
    result = []
    for a in r.list("attach", required=True):
        root = a.str("pcieRoot")
        numa = a.int("numaNode", minimum=0)
        a.done()
        if root is not None:
            if root not in roots:
                a.fail(a.at("pcieRoot"), f"unknown PCIe root {root!r}", ", ".join(sorted(roots)) or "none declared")
                continue
            if numa is not None and numa != roots[root]:
                a.fail(a.at("numaNode"), f"PCIe root {root} belongs to NUMA node {roots[root]}, not {numa}")
                continue
            result.append(Attachment(roots[root], root))
        elif need_root:
            a.fail(a.at("pcieRoot"), "is required for a PCIe device")
        elif numa is None:
            a.fail(a.path, "needs numaNode or pcieRoot")
        elif numa not in numa_ids:
            a.fail(a.at("numaNode"), f"unknown NUMA node {numa}", ", ".join(map(str, sorted(numa_ids))))
        else:
            result.append(Attachment(numa, None))
    if count is not None and result and len(result) > count:
        r.fail(r.at("attach"), f"lists {len(result)} places for {count} devices", f"at most {count}")
    return tuple(result)


SCALAR_ATTRIBUTE = "an integer, true/false, a string of at most 64 characters, or {version: X.Y.Z}"
LIST_ATTRIBUTE = ("a non-empty list of integers, of true/false or of strings of at most 64 characters, "
                  "or {versions: [X.Y.Z, ...]}")
MAX_ATTRIBUTE_VALUE_LENGTH = 64  # k8s.io/api@v0.37.2 resource/v1 DeviceAttributeMaxValueLength


def _is_version(value: Any) -> bool:
    return isinstance(value, str) and len(value) <= MAX_ATTRIBUTE_VALUE_LENGTH and bool(SEMVER.match(value))


def _list_attribute(r: Reader, where: str, items: list, versions: bool) -> dict | None:
    """A YAML list -> {"ints"|"bools"|"strings"|"versions": [...]} (DRAListTypeAttributes), or None after
    reporting what is wrong. The API refuses empty lists ("must not be empty if specified") and a list holds
    one type (k8s.io/api@v0.37.2 resource/v1 DeviceAttribute)."""
    if not items:
        r.fail(where, "is an empty list (the API refuses an empty list attribute)", LIST_ATTRIBUTE)
        return None
    if versions:
        bad = [i for i, v in enumerate(items) if not _is_version(v)]
        if bad:
            r.fail(f"{where}[{bad[0]}]", f"{items[bad[0]]!r} is not a semantic version",
                   "semver.org 2.0.0 versions of at most 64 characters, e.g. 1.2.3 or 2.0.0-rc.1")
            return None
        return {"versions": list(items)}
    kinds = {"bools" if isinstance(v, bool) else "ints" if isinstance(v, int) else "strings" if isinstance(v, str)
             else "other" for v in items}
    if "other" in kinds:
        i = next(i for i, v in enumerate(items) if not isinstance(v, (bool, int, str)))
        r.fail(f"{where}[{i}]", f"unsupported list item {items[i]!r}", "integers, true/false or strings")
        return None
    if len(kinds) > 1:
        names = {"bools": "true/false", "ints": "integers", "strings": "strings"}
        r.fail(where, f"mixes {' and '.join(names[k] for k in sorted(kinds))}",
               "a list of one type: integers, true/false or strings")
        return None
    (kind,) = kinds
    if kind == "strings":
        long = next((i for i, v in enumerate(items) if len(v) > MAX_ATTRIBUTE_VALUE_LENGTH), None)
        if long is not None:
            r.fail(f"{where}[{long}]", f"is {len(items[long])} characters long",
                   f"strings of at most {MAX_ATTRIBUTE_VALUE_LENGTH} characters")
            return None
    return {kind: list(items)}


def _extra_attributes(r: Reader) -> dict:
    """`attributes: {name: value}` -> the API's typed form ({"int": 1}, {"string": "x"}, {"ints": [0, 1]}, ...).

    A YAML list becomes a list attribute (ints, bools or strings; {versions: [...]} for versions); the
    per-device total of values is checked against the API's limit in render.check_limits."""
    result: dict[str, dict[str, Any]] = {}
    for name, value in r.raw_mapping("attributes").items():
        where = f"{r.at('attributes')}.{name}"
        if not isinstance(name, str) or not is_qualified_name(name):
            r.fail(where, f"{name!r} is not a qualified name", "a C identifier, optionally prefixed by a DNS domain and '/'")
        elif name.startswith(STANDARD_PREFIX):
            r.fail(where, "standard attributes are set from the topology, not by hand")
        elif isinstance(value, bool):
            result[name] = {"bool": value}
        elif isinstance(value, int):
            result[name] = {"int": value}
        elif isinstance(value, str) and len(value) <= MAX_ATTRIBUTE_VALUE_LENGTH:
            result[name] = {"string": value}
        elif (isinstance(value, dict) and list(value) == ["version"] and _is_version(value["version"])):
            result[name] = {"version": value["version"]}
        elif isinstance(value, list):
            if (typed := _list_attribute(r, where, value, versions=False)) is not None:
                result[name] = typed
        elif isinstance(value, dict) and list(value) == ["versions"] and isinstance(value["versions"], list):
            if (typed := _list_attribute(r, f"{where}.versions", value["versions"], versions=True)) is not None:
                result[name] = typed
        else:
            r.fail(where, f"unsupported attribute value {value!r}", f"{SCALAR_ATTRIBUTE}; or {LIST_ATTRIBUTE}")
    return result


def _gpu_group(r: Reader, roots: dict[str, int], numa_ids: set[int]) -> GpuGroup | None:
    model = r.str("model", required=True)
    known = GPU_MODELS.get(model or "", {})
    count = r.int("count", required=True, minimum=1, maximum=64)
    memory = r.quantity("memory", default=known.get("memory"))
    multiprocessors = r.int("multiprocessors", default=known.get("multiprocessors"), minimum=1)
    architecture = r.str("architecture", default=known.get("architecture"))
    capability = r.str("computeCapability", default=known.get("computeCapability"))
    interconnect = r.str("interconnect", pattern=DNS_LABEL, allowed="a DNS label")
    prefix = r.str("namePrefix", default="gpu", pattern=DNS_LABEL, allowed="a DNS label")
    attach = _attachments(r, count, roots, numa_ids, need_root=True)
    extra = _extra_attributes(r)
    node_allocatable = _node_allocatable(r)
    mig_reader = r.mapping("mig")
    mode = mig_reader.str("mode", default="none", choices=MIG_MODES)
    partitions = []
    for p in mig_reader.list("partitions"):
        partitions.append((p, p.str("profile", required=True), p.int("start", required=True, minimum=0)))
        p.done()
    raw_groups = mig_reader.raw_mapping("compatibilityGroups")
    partition_type = mig_reader.bool("partitionType")
    mig_reader.done()
    binding = _binding(r.mapping("binding"), "binding" in r.data)
    r.done()
    if model and not known and (memory is None or multiprocessors is None or architecture is None):
        r.fail(r.at("model"), f"unknown GPU model {model!r}: give memory, multiprocessors and architecture",
               ", ".join(GPU_MODELS))
        return None
    # multiprocessors: given, or the known model's (an unknown model without it was refused above)
    if model is None or count is None or memory is None or multiprocessors is None or prefix is None or not attach:
        return None
    table = mig.TABLES.get(model, {})
    if mode != "none" and not table:
        mig_reader.fail(mig_reader.at("mode"), f"{model} has no MIG profile table", ", ".join(mig.TABLES))
        return None
    if mode == "fixed" and not partitions:
        mig_reader.fail(mig_reader.at("partitions"), "mode fixed needs at least one partition")
    if mode != "fixed" and partitions:
        mig_reader.fail(mig_reader.at("partitions"), "partitions are only used with mode fixed")
    checked = _check_partitions(mig_reader, table, partitions) if mode == "fixed" else ()
    groups = _compatibility_groups(mig_reader, raw_groups, mode or "none", table)
    if partition_type and mode != "dynamic":
        mig_reader.fail(mig_reader.at("partitionType"), "needs mode dynamic (partition types label devices that "
                        "consume a shared counter set)")
    return GpuGroup(model, count, memory, multiprocessors, architecture or "", capability or "", attach,
                    interconnect, mode or "none", checked, prefix, extra, binding, node_allocatable, groups,
                    partition_type and mode == "dynamic")


MAX_COMPATIBILITY_GROUPS = 2  # k8s.io/api@v0.37.2 resource/v1 DeviceCompatibilityGroupsMaxSize


def _compatibility_groups(r: Reader, raw: dict, mode: str, table: dict[str, mig.MigProfile]) -> dict[str, tuple[str, ...]]:
    """`mig.compatibilityGroups: {gpu | <MIG profile>: [group, ...]}` (DRADeviceCompatibilityGroups): the groups
    each kind of device names in its consumption of its GPU's counter set. Devices of one GPU are allocated
    together only if all of them share a group; a device naming none pairs only with others naming none
    (k8s.io/api@v0.37.2 resource/v1 DeviceCounterConsumption.CompatibilityGroups: at most 2, unique, DNS
    labels)."""
    if not raw:
        return {}
    where = r.at("compatibilityGroups")
    if mode != "dynamic":
        r.fail(where, "needs mode dynamic (only devices that consume a shared counter set have groups)")
        return {}
    result: dict[str, tuple[str, ...]] = {}
    keys = (WHOLE_GPU, *table)
    for key, groups in raw.items():
        at = f"{where}.{key}"
        if key not in keys:
            r.fail(at, f"{key!r} is neither the whole GPU nor a MIG profile of this model", ", ".join(keys))
            continue
        if not isinstance(groups, list) or not groups:
            r.fail(at, "must be a non-empty list of group names",
                   f"1..{MAX_COMPATIBILITY_GROUPS} DNS labels, e.g. [small]")
            continue
        bad = next((g for g in groups if not isinstance(g, str) or not DNS_LABEL.match(g)), None)
        if bad is not None:
            r.fail(at, f"{bad!r} is not a group name", "a DNS label: lowercase letters, digits, '-'")
        elif len(set(groups)) != len(groups):
            r.fail(at, "names a group twice", "unique group names")
        elif len(groups) > MAX_COMPATIBILITY_GROUPS:
            r.fail(at, f"names {len(groups)} groups", f"at most {MAX_COMPATIBILITY_GROUPS}")
        else:
            result[key] = tuple(groups)
    return result


ATTACH_OUTCOMES = ("succeeds", "fails-once", "fails", "never")
MAX_BINDING_CONDITIONS = 4  # k8s.io/api@v0.37.2 resource/v1 BindingConditionsMaxSize


def _binding(r: Reader, present: bool) -> Binding | None:
    """`binding: {conditions, failureConditions, bindsToNode, attach, attachSeconds}`: devices that wait for
    an attach controller before a pod binds (DRADeviceBindingConditions), checked by the API server's rules
    (k8s.io/kubernetes@v1.37.2 pkg/apis/resource/validation: validateDeviceBindingParameters)."""
    if not present:
        return None
    lists = {}
    for key in ("conditions", "failureConditions"):
        names: list[str] = []
        given = r.scalars(key)
        for i, name in enumerate(given):
            if not isinstance(name, str) or len(name) > 316 or not LABEL_NAME.match(name):
                r.fail(f"{r.at(key)}[{i}]", f"{name!r} is not a condition type",
                       "a qualified name, e.g. Attached or example.com/attached")
            elif name in names:
                r.fail(f"{r.at(key)}[{i}]", f"{name} is listed twice")
            else:
                names.append(name)
        if not given:
            r.fail(r.at(key), "must list at least one condition type (the API server needs both lists)",
                   f"1..{MAX_BINDING_CONDITIONS} condition types")
        elif len(names) > MAX_BINDING_CONDITIONS:
            r.fail(r.at(key), f"lists {len(names)} condition types", f"at most {MAX_BINDING_CONDITIONS}")
        lists[key] = tuple(names)
    both = set(lists["conditions"]) & set(lists["failureConditions"])
    if both:
        r.fail(r.at("failureConditions"), f"{', '.join(sorted(both))} is also a binding condition",
               "condition types distinct from `conditions`")
    binds_to_node = r.bool("bindsToNode", default=True)
    attach = r.str("attach", default="succeeds", choices=ATTACH_OUTCOMES) or "succeeds"
    seconds = r.int("attachSeconds", default=2, minimum=0, maximum=3600)
    r.done()
    return Binding(lists["conditions"], lists["failureConditions"], binds_to_node, attach,
                   float(seconds if seconds is not None else 2))


def _check_partitions(r: Reader, table: dict[str, mig.MigProfile], partitions) -> tuple[MigPartition, ...]:
    used: dict[int, str] = {}
    compute = 0
    media = 0
    result = []
    for reader, name, start in partitions:
        if name is None or start is None:
            continue
        profile = table.get(name)
        if profile is None:
            reader.fail(reader.at("profile"), f"unknown MIG profile {name!r}", ", ".join(table))
            continue
        if start not in profile.starts:
            reader.fail(reader.at("start"), f"{name} cannot start at memory slice {start}",
                        ", ".join(map(str, profile.starts)))
            continue
        clash = [f"{s} ({used[s]})" for s in profile.memory_slices(start) if s in used]
        if clash:
            reader.fail(reader.path, f"{name}@{start} overlaps memory slices {', '.join(clash)}")
            continue
        for s in profile.memory_slices(start):
            used[s] = f"{name}@{start}"
        compute += profile.compute
        media += profile.media
        result.append(MigPartition(name, start))
    if compute > mig.COMPUTE_SLICES:
        r.fail(r.at("partitions"), f"partitions use {compute} compute slices", f"at most {mig.COMPUTE_SLICES}")
    if media > 1:
        r.fail(r.at("partitions"), "more than one partition takes the GPU's single media (JPEG/OFA) unit",
               "one +me or 7g partition")
    return tuple(result)


def _storage_group(r: Reader, roots: dict[str, int], numa_ids: set[int]) -> StorageGroup | None:
    kind = r.str("kind", required=True, choices=STORAGE_KINDS)
    model = r.str("model", default=kind or "")
    count = r.int("count", default=1, minimum=1, maximum=64)
    capacity = r.quantity("capacity", required=True)
    prefix = r.str("namePrefix", default=kind, pattern=DNS_LABEL, allowed="a DNS label")
    attach = _attachments(r, count, roots, numa_ids, need_root=(kind == "nvme"))
    extra = _extra_attributes(r)
    node_allocatable = _node_allocatable(r)
    sharing = r.mapping("sharing")
    shareable = "sharing" in r.data
    default = sharing.quantity("default", required=shareable)
    minimum = sharing.quantity("min")
    step = sharing.quantity("step")
    sharing.done()
    io_share = _io_share(r.mapping("ioShare"), "ioShare" in r.data, shareable)
    r.done()
    if kind is None or count is None or capacity is None or not attach:
        return None
    _check_sharing(sharing, capacity, default, minimum, step)
    return StorageGroup(kind, model or kind, count, capacity, attach, shareable, default, minimum, step,
                        prefix or kind, extra, io_share, node_allocatable)


def _check_sharing(sharing: Reader, capacity: str, default: str | None, minimum: str | None,
                   step: str | None) -> None:
    """The API server's rules for the requestPolicy the renderer makes of `sharing` (validRange.min is
    min, or step when min is absent), so a profile never publishes a slice the server refuses."""
    total = quantity_value(capacity)
    for key, value in (("default", default), ("min", minimum), ("step", step)):
        if value is not None and quantity_value(value) > total:
            sharing.fail(sharing.at(key), f"{value} is more than the device capacity {capacity}",
                         f"at most {capacity}")
        elif value is not None and quantity_value(value) * 1000 % 1:
            sharing.fail(sharing.at(key), f"{value} is finer than a thousandth", "a multiple of 1m")
    if sharing.problems and any(p.field.startswith(sharing.path) for p in sharing.problems):
        return
    low = minimum or step
    if default and low and quantity_value(default) < quantity_value(low):
        sharing.fail(sharing.at("default"), f"{default} is below min {low}", f"at least {low}")
    elif step and low and quantity_value(low) + quantity_value(step) > total:
        sharing.fail(sharing.at("step"), f"min {low} plus one step {step} is more than the capacity {capacity}",
                     "a step of at most capacity - min")
    elif step and default and low and (quantity_value(default) - quantity_value(low)) % quantity_value(step):
        sharing.fail(sharing.at("default"), f"{default} is not min {low} plus a multiple of step {step}",
                     "min + k * step")


def _io_share(r: Reader, present: bool, shareable: bool) -> IoShare | None:
    """`ioShare: {default, min, step, max}`: fractions of the device's I/O bandwidth (1 = all of it)."""
    if not present:
        return None
    default = r.quantity("default", required=True, positive=False)
    minimum = r.quantity("min", required=True, positive=False)
    step = r.quantity("step", required=True)
    maximum = r.quantity("max")
    r.done()
    if not shareable:
        r.fail(r.path, "needs `sharing` (only a shareable device can be claimed in fractions)")
    if default is None or minimum is None or step is None:
        return None
    given = {key: value for key, value in (("default", default), ("min", minimum), ("step", step),
                                           ("max", maximum)) if value}
    milli = {key: quantity_value(value) * 1000 for key, value in given.items()}
    for key, value in milli.items():
        if value != int(value):  # the API computes fractional ranges in milli-units
            r.fail(r.at(key), f"{given[key]} is not a whole number of milli-units", "e.g. 50m, 250m, 1")
            return None
        if value > 1000:
            r.fail(r.at(key), f"{given[key]} is more than the whole device (1)", "at most 1")
            return None
    if milli["default"] < milli["min"] or ("max" in milli and milli["default"] > milli["max"]):
        r.fail(r.at("default"), f"{default} is outside min..max", f"{minimum}..{maximum or 1}")
    elif (milli["default"] - milli["min"]) % milli["step"] or ("max" in milli and (milli["max"] - milli["min"]) % milli["step"]):
        r.fail(r.at("step"), f"default and max must be min + a multiple of {step}")
    return IoShare(default, minimum, step, maximum)


def _nic_group(r: Reader, roots: dict[str, int], numa_ids: set[int]) -> NicGroup | None:
    model = r.str("model", required=True)
    count = r.int("count", default=1, minimum=1, maximum=64)
    bandwidth = r.quantity("bandwidth", required=True)
    prefix = r.str("namePrefix", default="nic", pattern=DNS_LABEL, allowed="a DNS label")
    attach = _attachments(r, count, roots, numa_ids, need_root=True)
    extra = _extra_attributes(r)
    node_allocatable = _node_allocatable(r)
    r.done()
    if model is None or count is None or bandwidth is None or not attach:
        return None
    return NicGroup(model, count, bandwidth, attach, prefix or "nic", extra, node_allocatable)


def _check_partition_type(profile: Profile, problems: list[Problem]) -> None:
    """`mig.partitionType` needs a node with one GPU. The slice's contract: "devices sharing a value must share
    the same ConsumesCounters cost" (k8s.io/api@v0.37.2 resource/v1 ResourceSliceSpec.PartitionTypeAttribute),
    and a cost names its counter set (k8s.io/kubernetes@v1.37.2 pkg/controller/resourcepoolstatusrequest
    views.go consumesCountersKey): the MIG instances of two GPUs, each drawing on its own GPU's set, never cost
    the same, so the pool-status controller would answer PartitionCostMismatch."""
    gpus = sum(g.count for g in profile.gpus)
    for i, group in enumerate(profile.gpus):
        if group.partition_type and gpus != 1:
            problems.append(Problem(profile.source, f"spec.gpus[{i}].mig.partitionType",
                                    f"needs exactly one GPU on the node, the profile has {gpus} (devices of one "
                                    "partition type must consume the same counters, counter set included)",
                                    "count: 1 and no other GPU group; or no partitionType"))


def _check_names(profile: Profile, problems: list[Problem]) -> None:
    """Device-name prefixes must not collide (two groups would publish the same device names)."""
    seen: dict[str, str] = {}
    groups = [(f"spec.gpus[{i}]", g.prefix) for i, g in enumerate(profile.gpus)]
    groups += [(f"spec.storage[{i}]", s.prefix) for i, s in enumerate(profile.storage)]
    groups += [(f"spec.nics[{i}]", n.prefix) for i, n in enumerate(profile.nics)]
    for where, prefix in groups:
        if prefix in seen:
            problems.append(Problem(profile.source, f"{where}.namePrefix",
                                    f"device names {prefix}-N are already used by {seen[prefix]}",
                                    "a distinct namePrefix per group"))
        seen[prefix] = where
