"""List-type device attributes (DRAListTypeAttributes, alpha in 1.37) and derived attributes
(DRADerivedAttributes, alpha in 1.37).

List attributes (k8s.io/api@v0.37.2 resource/v1/types.go, DeviceAttribute `ints`, `bools`, `strings`,
`versions`): an attribute may hold a non-empty list of one type ("must not be empty if specified",
k8s.io/kubernetes@v1.37.2 pkg/apis/resource/validation/validation.go validateDeviceAttribute). With
the gate on, CEL sees such an attribute as a list and the `includes()` helper works on lists and scalars
alike (CELDeviceSelector.Expression). `matchAttribute` on a list attribute needs a non-empty
intersection across all devices in question, `distinctAttribute` needs the lists pairwise disjoint
(DeviceConstraint docs; k8s.io/dynamic-resource-allocation@v0.37.2
structured/internal/experimental/allocator_experimental.go matchAttributeConstraint.add keeps a running
intersection, constraint.go distinctAttributeConstraint.matchesAttribute compares pairwise). A slice with
a list attribute holds at most 64 devices (ResourceSliceMaxDevicesWithAdvancedFeatures) and a device at
most 48 attribute values, each list item counting (ResourceSliceMaxAttributeValuesPerDevice; validation.go
numEntriesDeviceAttribute).

Derived attributes (ExactDeviceRequest.derivedAttributes, DeviceDerivedAttribute): a fully qualified name
and a CEL expression over the device, evaluated for each candidate device of that request and visible
only to matchAttribute/distinctAttribute constraints, not to selectors. Each must be referenced by a
constraint targeting its request (validation.go validateDeviceDerivedAttribute). A CEL runtime error
aborts allocation: "evaluate derived attribute <name> on device <id> failed: ..."
(allocator_experimental.go lookupAttribute).

The devices come from the fake driver with profiles written by the tests: a profile's `attributes`
mapping turns YAML lists into list attributes (fake_devices/profile.py _extra_attributes).
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from conformance import checks, objects
from harness.k8s import errors

pytestmark = [pytest.mark.fake_devices("profiles with list-type attributes, and with socket/NUMA attributes "
                                       "of different types on GPUs and NICs")]
LIST = pytest.mark.dra_feature("DRAListTypeAttributes", maturity="alpha")
DERIVED = pytest.mark.dra_feature("DRADerivedAttributes", maturity="alpha")

NO_FIT = "cannot allocate all claims"  # the scheduler's DRA plugin, per node, when no allocation exists
MAX_DEVICES_WITH_ADVANCED_FEATURES = 64  # k8s.io/api@v0.37.2 resource/v1 ResourceSliceMaxDevicesWithAdvancedFeatures
MAX_ATTRIBUTE_VALUES = 48  # ResourceSliceMaxAttributeValuesPerDevice
UNREFERENCED = "must be referenced by at least one matchAttribute or distinctAttribute constraint targeting this request"
SOCKET = "derived/socket"


# --- gates ------------------------------------------------------------------------------------

def _require_list_attributes(k8s, unique_name, node: str) -> None:
    """Skip unless the API server keeps list values: with the gate off it drops them (the attribute is left
    without a value, which validation refuses), so a dry run shows which."""
    driver = unique_name("probe") + ".example.com"
    body = objects.resource_slice(unique_name("probe"), driver, node,
                                  [{"name": "d0", "attributes": {"numas": {"ints": [0, 1]}}}])
    try:
        created = k8s.resource.create_resource_slice(body, dry_run="All")
    except errors.ApiError as err:  # only the gate-off symptom skips; anything else is a failure
        if "must specify one of" in str(err.body):
            pytest.skip("DRAListTypeAttributes is off in this cluster: the API server dropped `ints`")
        raise
    if created.spec.devices[0].attributes["numas"].ints != [0, 1]:
        pytest.skip("DRAListTypeAttributes is off in this cluster: the API server dropped `ints`")


def _derived_claim(name: str, gpu_class: str, expression: str, constraint_requests: tuple[str, ...] = ("gpu",)) -> dict:
    request = objects.request(gpu_class, name="gpu")
    request["exactly"]["derivedAttributes"] = [{"name": SOCKET, "expression": expression}]
    other = objects.request(gpu_class, name="other")
    return objects.resource_claim(name, [request, other], [objects.match_attribute(SOCKET, *constraint_requests)])


def _require_derived_attributes(k8s, ns: str) -> None:
    """Skip unless the API server keeps `derivedAttributes` (the gate off drops the field)."""
    created = k8s.resource.create_namespaced_resource_claim(
        ns, _derived_claim("probe", "any-class", '"s0"'), dry_run="All")
    if not created.spec.devices.requests[0].exactly.derived_attributes:
        pytest.skip("DRADerivedAttributes is off in this cluster: the API server dropped derivedAttributes")


# --- helpers ----------------------------------------------------------------------------------

HEAD = """apiVersion: dra-harness.x-k8s.io/v1alpha1
kind: NodeProfile
metadata: {{name: {name}}}
spec:
  numaNodes:
  - {{id: 0, cpus: "0-7", memory: 32Gi, pcieRoots: [pci0000:10]}}
  - {{id: 1, cpus: "8-15", memory: 32Gi, pcieRoots: [pci0000:30]}}
  - {{id: 2, cpus: "16-23", memory: 32Gi, pcieRoots: [pci0000:50]}}
  - {{id: 3, cpus: "24-31", memory: 32Gi, pcieRoots: [pci0000:70]}}
"""
ROOTS = ("pci0000:10", "pci0000:30", "pci0000:50", "pci0000:70")


def _profile(tmp_path, name: str, gpus: Sequence[tuple[str, int, str]],
             nics: Sequence[tuple[str, int, str]] = ()) -> str:
    """A profile file: GPU and NIC groups as (namePrefix, NUMA node, attributes as YAML flow mapping)."""
    text = HEAD.format(name=name) + "  gpus:\n"
    for prefix, numa, attributes in gpus:
        text += (f"  - {{model: T4, namePrefix: {prefix}, count: 1, attach: [{{pcieRoot: {ROOTS[numa]}}}],"
                 f" attributes: {attributes}}}\n")
    if nics:
        text += "  nics:\n"
        for prefix, numa, attributes in nics:
            text += (f"  - {{model: ConnectX-7, namePrefix: {prefix}, count: 1, bandwidth: 200G,"
                     f" attach: [{{pcieRoot: {ROOTS[numa]}}}], attributes: {attributes}}}\n")
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return str(path)


def _claim_pod(k8s, ns: str, name: str, requests: list[dict], *constraints: dict) -> None:
    """A template `name` with these requests and constraints, and a pod `name` using it."""
    k8s.resource.create_namespaced_resource_claim_template(ns, objects.claim_template(
        name, requests=requests, constraints=list(constraints) or None))
    k8s.core.create_namespaced_pod(ns, objects.pod_with_template_claim(name, name))


def _allocated(k8s, ns: str, pod: str) -> dict[str, set[str]]:
    """request -> the devices allocated to it, once the pod runs."""
    checks.running(k8s, ns, pod)
    result: dict[str, set[str]] = {}
    for request, _, device in checks.allocated_devices(checks.pod_claim(k8s, ns, pod)):
        result.setdefault(request, set()).add(device)
    return result


def _refused(k8s, ns: str, pod: str) -> None:
    """No allocation exists: the pod is unschedulable for its claim, which stays unallocated."""
    condition = checks.unschedulable(k8s, ns, pod)
    assert NO_FIT in condition.message, f"pod {pod}: {condition.message}"
    claim = checks.pod_claim(k8s, ns, pod)
    assert claim.status.allocation is None, f"claim {claim.metadata.name} was allocated: {claim.status.allocation}"


def _cel(driver: str, attribute: str) -> str:
    return f'device.attributes["{driver}"].{attribute}'


# --- list attributes --------------------------------------------------------------------------

@LIST
def test_selector_includes_finds_the_devices_whose_list_has_the_value(k8s, unique_name, dra_namespace, fake_driver,
                                                                      simulated_node, tmp_path):
    """`includes()` on a list attribute picks exactly the devices whose list holds the value (allocation mode
    All: every such device, no other); on a scalar it tests equality; a value no list holds fits nothing."""
    ns, node = dra_namespace, simulated_node
    _require_list_attributes(k8s, unique_name, node)
    driver = fake_driver({node: _profile(tmp_path, "reach", [
        ("near", 0, "{reachableNumaNodes: [0, 1], rank: 0}"), ("near2", 1, "{reachableNumaNodes: [1, 0], rank: 1}"),
        ("far", 2, "{reachableNumaNodes: [2, 3], rank: 2}"), ("far2", 3, "{reachableNumaNodes: [3, 2], rank: 3}")])})
    gpu, reach = f"{driver.config.instance}-gpu", _cel(driver.drivers.gpu, "reachableNumaNodes")
    published = checks.published_device(k8s, driver.drivers.gpu, node, "far-0").attributes["reachableNumaNodes"]
    assert published.ints == [2, 3], f"far-0 of {driver.drivers.gpu} publishes reachableNumaNodes {published}"

    all_reaching_2 = objects.request(gpu, name="reach2", selectors=[f"{reach}.includes(2)"])
    all_reaching_2["exactly"] = {k: v for k, v in all_reaching_2["exactly"].items() if k != "count"}
    all_reaching_2["exactly"]["allocationMode"] = "All"
    scalar = objects.request(gpu, name="scalar", selectors=[f"{_cel(driver.drivers.gpu, 'rank')}.includes(1)"])
    _claim_pod(k8s, ns, "reaching", [all_reaching_2, scalar])
    assert _allocated(k8s, ns, "reaching") == {"reach2": {"far-0", "far2-0"}, "scalar": {"near2-0"}}

    _claim_pod(k8s, ns, "nowhere", [objects.request(gpu, selectors=[f"{reach}.includes(5)"])])
    _refused(k8s, ns, "nowhere")


@LIST
def test_match_attribute_on_a_list_picks_devices_whose_lists_intersect(k8s, unique_name, dra_namespace, fake_driver,
                                                                       simulated_node, tmp_path):
    """{0,1}, {2,3}, {3,4}: of the three pairs only the last two intersect, so two devices matching on the
    list attribute can only be those (first fit alone takes the first two)."""
    ns, node = dra_namespace, simulated_node
    _require_list_attributes(k8s, unique_name, node)
    driver = fake_driver({node: _profile(tmp_path, "intersect", [
        ("gpua", 0, "{numas: [0, 1]}"), ("gpub", 1, "{numas: [2, 3]}"), ("gpuc", 2, "{numas: [3, 4]}")])})
    gpu, numas = f"{driver.config.instance}-gpu", f"{driver.drivers.gpu}/numas"
    _claim_pod(k8s, ns, "matched", [objects.request(gpu, count=2)], objects.match_attribute(numas))
    assert _allocated(k8s, ns, "matched") == {"gpu": {"gpub-0", "gpuc-0"}}


@LIST
def test_match_attribute_needs_one_value_common_to_all_lists_not_pairwise_overlap(
        k8s, unique_name, dra_namespace, fake_driver, simulated_node, tmp_path):
    """{0,1}, {1,2}, {2,0} overlap pairwise but share no value: three devices matching on the list attribute
    do not exist (upstream: allocator_testing.go "list-attributes-match-constaint-list-of-string-values-with-
    partially-common-elements"); any two of them do."""
    ns, node = dra_namespace, simulated_node
    _require_list_attributes(k8s, unique_name, node)
    driver = fake_driver({node: _profile(tmp_path, "pairwise", [
        ("gpua", 0, "{numas: [0, 1]}"), ("gpub", 1, "{numas: [1, 2]}"), ("gpuc", 2, "{numas: [2, 0]}")])})
    gpu, numas = f"{driver.config.instance}-gpu", f"{driver.drivers.gpu}/numas"
    _claim_pod(k8s, ns, "three", [objects.request(gpu, count=3)], objects.match_attribute(numas))
    _refused(k8s, ns, "three")
    # Control: the three devices are free, and two of them do match.
    _claim_pod(k8s, ns, "two", [objects.request(gpu, count=2)], objects.match_attribute(numas))
    assert _allocated(k8s, ns, "two") == {"gpu": {"gpua-0", "gpub-0"}}


@LIST
def test_distinct_attribute_on_a_list_needs_pairwise_disjoint_lists(k8s, unique_name, dra_namespace, fake_driver,
                                                                    simulated_node, tmp_path):
    """{0,1}, {1,2}, {3}: no three are pairwise disjoint; two are only with {3}, not the first two."""
    ns, node = dra_namespace, simulated_node
    _require_list_attributes(k8s, unique_name, node)
    driver = fake_driver({node: _profile(tmp_path, "disjoint", [
        ("gpua", 0, "{numas: [0, 1]}"), ("gpub", 1, "{numas: [1, 2]}"), ("gpuc", 2, "{numas: [3]}")])})
    gpu, numas = f"{driver.config.instance}-gpu", f"{driver.drivers.gpu}/numas"
    _claim_pod(k8s, ns, "three", [objects.request(gpu, count=3)], objects.distinct_attribute(numas))
    _refused(k8s, ns, "three")
    _claim_pod(k8s, ns, "two", [objects.request(gpu, count=2)], objects.distinct_attribute(numas))
    assert _allocated(k8s, ns, "two") == {"gpu": {"gpua-0", "gpuc-0"}}


@LIST
def test_api_refuses_empty_lists_and_applies_the_advanced_slice_and_value_limits(k8s, unique_name, simulated_node):
    """Dry runs: an empty list is refused; a slice with list attributes holds 64 devices, not 65 (without
    them it would hold 128); a device holds 48 attribute values counting list items, not 49."""
    _require_list_attributes(k8s, unique_name, simulated_node)
    create = k8s.resource.create_resource_slice
    name, driver = unique_name("lists"), unique_name("lists") + ".example.com"

    def slice_of(devices: list[dict]) -> dict:
        return objects.resource_slice(name, driver, simulated_node, devices)

    message = checks.rejected(create, slice_of([{"name": "d0", "attributes": {"numas": {"ints": []}}}]),
                              dry_run="All")
    assert "spec.devices[0].attributes[numas].ints: Invalid value: []: must not be empty if specified" in message, \
        f"slice {name}: {message}"

    listed = [{"name": f"d{i}", "attributes": {"numas": {"ints": [0, 1]}}} for i in range(MAX_DEVICES_WITH_ADVANCED_FEATURES)]
    create(slice_of(listed), dry_run="All")
    more = listed + [{"name": "extra", "attributes": {"numa": {"int": 0}}}]  # scalar: the list elsewhere decides
    message = checks.rejected(create, slice_of(more), dry_run="All")
    assert (f"spec.devices: Too many: {MAX_DEVICES_WITH_ADVANCED_FEATURES + 1}: must have at most "
            f"{MAX_DEVICES_WITH_ADVANCED_FEATURES} items") in message, f"slice {name}: {message}"
    create(slice_of([{**d, "attributes": {"numa": {"int": 0}}} for d in more]), dry_run="All")  # all scalar: fits

    def device(values: int) -> dict:  # one scalar plus a list: `values` values in all
        return {"name": "wide", "attributes": {"model": {"string": "x"}, "ids": {"ints": list(range(values - 1))}}}

    create(slice_of([device(MAX_ATTRIBUTE_VALUES)]), dry_run="All")
    message = checks.rejected(create, slice_of([device(MAX_ATTRIBUTE_VALUES + 1)]), dry_run="All")
    assert (f"spec.devices[0]: Invalid value: {MAX_ATTRIBUTE_VALUES + 1}: the total number of attribute values "
            f"must not exceed {MAX_ATTRIBUTE_VALUES}") in message, f"slice {name}: {message}"


# --- derived attributes -----------------------------------------------------------------------

def _socket_profile(tmp_path) -> str:
    """GPUs name their socket as a string; NICs only know their NUMA node as an int (0, 1: s0; 2, 3: s1)."""
    return _profile(tmp_path, "sockets",
                    gpus=[("gpus0", 0, "{socket: s0}"), ("gpus1", 2, "{socket: s1}")],
                    nics=[(f"nicn{n}", n, f"{{numa: {n}}}") for n in range(4)])


def _socket_requests(driver, gpu_selectors: list[str], nic_selectors: list[str]) -> list[dict]:
    """A GPU request and a NIC request that both derive derived/socket, each from its own driver's attribute."""
    gpu = objects.request(f"{driver.config.instance}-gpu", name="gpu", selectors=gpu_selectors)
    gpu["exactly"]["derivedAttributes"] = [{"name": SOCKET, "expression": _cel(driver.drivers.gpu, "socket")}]
    nic = objects.request(f"{driver.config.instance}-nic", name="nic", selectors=nic_selectors)
    nic["exactly"]["derivedAttributes"] = [
        {"name": SOCKET, "expression": f'{_cel(driver.drivers.nic, "numa")} < 2 ? "s0" : "s1"'}]
    return [gpu, nic]


@DERIVED
def test_derived_attribute_aligns_devices_of_drivers_that_publish_different_attributes(
        k8s, dra_namespace, fake_driver, simulated_node, tmp_path):
    """The GPU's string socket and the NIC's int NUMA node become one derived/socket: matching on it pulls the
    GPU to the NIC's socket (first fit alone takes the s0 GPU); where only a misaligned pair is left, no
    allocation exists."""
    ns, node = dra_namespace, simulated_node
    _require_derived_attributes(k8s, ns)
    driver = fake_driver({node: _socket_profile(tmp_path)})
    nic_numa = _cel(driver.drivers.nic, "numa")
    gpu_socket = _cel(driver.drivers.gpu, "socket")

    _claim_pod(k8s, ns, "aligned", _socket_requests(driver, [], [f"{nic_numa} == 3"]),
               objects.match_attribute(SOCKET, "gpu", "nic"))
    assert _allocated(k8s, ns, "aligned") == {"gpu": {"gpus1-0"}, "nic": {"nicn3-0"}}

    # Control for the first fit: a GPU request without the constraint takes the s0 GPU. Then it is freed.
    _claim_pod(k8s, ns, "unaligned", [objects.request(f"{driver.config.instance}-gpu")])
    assert _allocated(k8s, ns, "unaligned") == {"gpu": {"gpus0-0"}}
    unaligned = checks.pod_claim(k8s, ns, "unaligned").metadata.name
    k8s.core.delete_namespaced_pod("unaligned", ns, grace_period_seconds=0)
    checks.claim_deleted(k8s, ns, unaligned)

    # Only the s0 GPU is left and the NIC asked for is on s1.
    _claim_pod(k8s, ns, "misaligned", _socket_requests(driver, [f'{gpu_socket} == "s0"'], [f"{nic_numa} == 2"]),
               objects.match_attribute(SOCKET, "gpu", "nic"))
    _refused(k8s, ns, "misaligned")


@DERIVED
def test_api_refuses_a_derived_attribute_no_constraint_of_its_request_uses(k8s, dra_namespace):
    ns = dra_namespace
    _require_derived_attributes(k8s, ns)
    create = k8s.resource.create_namespaced_resource_claim
    field = "spec.devices.requests[0].exactly.derivedAttributes[0].name"
    for constraints in ([], [objects.match_attribute(SOCKET, "other")]):  # none, or one for the other request
        body = _derived_claim("unused", "any-class", '"s0"')
        body["spec"]["devices"]["constraints"] = constraints
        message = checks.rejected(create, ns, body, dry_run="All")
        assert f'{field}: Invalid value: "{SOCKET}": {UNREFERENCED}' in message, f"claim unused {constraints}: {message}"
    # Control: a constraint naming the request (or naming no requests, so all of them) makes it valid.
    for requests in (("gpu", "other"), ()):
        created = create(ns, _derived_claim("used", "any-class", '"s0"', requests), dry_run="All")
        assert created.spec.devices.requests[0].exactly.derived_attributes[0].name == SOCKET


@DERIVED
def test_derived_attribute_runtime_error_fails_scheduling_and_selectors_do_not_see_it(
        k8s, dra_namespace, fake_driver, simulated_node, tmp_path):
    """An expression reading an attribute the device lacks (no has()) fails scheduling, naming the derived
    attribute and the device; a selector looking for a derived attribute finds nothing to see."""
    ns, node = dra_namespace, simulated_node
    _require_derived_attributes(k8s, ns)
    driver = fake_driver({node: _socket_profile(tmp_path)})
    requests = _socket_requests(driver, [], [])
    requests[1]["exactly"]["derivedAttributes"][0]["expression"] = _cel(driver.drivers.nic, "socket")  # GPUs have it
    _claim_pod(k8s, ns, "broken", requests, objects.match_attribute(SOCKET, "gpu", "nic"))
    message = checks.event_saying(k8s, ns, "broken", "FailedScheduling", "evaluate derived attribute", timeout=60)
    assert f"evaluate derived attribute {SOCKET} on device {driver.drivers.nic}/{node}/nicn" in message, message
    assert "no such key: socket" in message, message
    # an error, not "unschedulable": the filter plugin failed (PodScheduled=False, reason SchedulerError)
    (condition,) = [c for c in k8s.core.read_namespaced_pod("broken", ns).status.conditions or []
                    if c.type == "PodScheduled"]
    assert (condition.status, condition.reason) == ("False", "SchedulerError"), f"pod broken: {condition}"
    assert "evaluate derived attribute" in (condition.message or ""), f"pod broken: {condition.message}"
    claim = checks.pod_claim(k8s, ns, "broken")
    assert claim.status.allocation is None, f"claim {claim.metadata.name} was allocated: {claim.status.allocation}"

    # The same devices with a valid expression but a selector that asks for the derived attribute: selectors
    # see only what the drivers publish, where no domain "derived" exists.
    requests = _socket_requests(driver, ['has(device.attributes["derived"].socket)'], [])
    _claim_pod(k8s, ns, "selecting", requests, objects.match_attribute(SOCKET, "gpu", "nic"))
    _refused(k8s, ns, "selecting")
