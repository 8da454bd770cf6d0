"""Resource pool status (DRAResourcePoolStatus, alpha in 1.37) and partition types
(DRAPartitionableDevicesType, alpha in 1.37).

A ResourcePoolStatusRequest (resource.k8s.io/v1alpha3, cluster-scoped) asks kube-controller-manager's
resourcepoolstatusrequest-controller, once, how the pools of a driver (optionally one pool) stand. The
controller answers on the request's add or update, from its informers: per pool the devices of the
newest generation's slices (`totalDevices`), those in allocated claims (`allocatedDevices`, each device
once), those with a NoSchedule/NoExecute taint (`unavailableDevices`) and the rest (`availableDevices`
= total - allocated - unavailable), with a `Complete` condition (reason CalculationComplete, "Calculated
status for %d pools"). A pool that has fewer slices than its `resourceSliceCount` keeps the request
unanswered. Once written the status is immutable, and so is the spec (k8s.io/api@v0.37.2
resource/v1alpha3/types.go ResourcePoolStatusRequest, ResourcePoolStatusRequestSpec.limit: 1..1000,
default 100; k8s.io/kubernetes@v1.37.2 pkg/controller/resourcepoolstatusrequest/controller.go
syncRequest, calculatePoolStatus; pkg/apis/resource/validation/validation_resourcepoolstatusrequest.go).

With DRAPartitionableDevicesType a ResourceSlice may name, in `spec.partitionTypeAttribute`, the string
attribute that labels each counter-consuming device with its partition type ("Full", "Half" of a GPU).
Only the pool-status controller reads it: `pools[].partitionSummary` lists per (attribute, type) the
devices of that type and how many more of them still fit, each type measured alone against the shared
counters left after the allocated devices (greedy fit). Devices of one type with different costs make
the pool's `validationError` "PartitionCostMismatch: ...". The API refuses the field on a slice that
declares no counter-consuming device (k8s.io/api@v0.37.2 resource/v1/types.go
ResourceSliceSpec.PartitionTypeAttribute; k8s.io/kubernetes@v1.37.2
pkg/controller/resourcepoolstatusrequest/views.go computePartitionSummary;
pkg/apis/resource/validation/validation.go validatePartitionTypeAttribute).

The tests publish their own slices on a simulated node under a driver name of their own, so every
count is exact whatever else the cluster runs.
"""

from __future__ import annotations

import json
import time

import pytest

from conformance import checks, objects
from harness.k8s import api, wait

POOL_STATUS = pytest.mark.dra_feature("DRAResourcePoolStatus", maturity="alpha")
PARTITION_TYPE = pytest.mark.dra_feature("DRAPartitionableDevicesType", maturity="alpha")
pytestmark = [pytest.mark.requires_api("resource.k8s.io/v1alpha3")]

API_VERSION = "resource.k8s.io/v1alpha3"
ANSWER_TIMEOUT = 30  # the controller answers from its informers, within a second on an idle cluster
PENDING_WINDOW = 3.0  # how long an unanswerable request is watched staying unanswered


class PoolStatusRequests:
    """The test's ResourcePoolStatusRequests (cluster-scoped): created under unique names, deleted at teardown."""

    def __init__(self, k8s, unique_name):
        self.k8s, self.unique_name = k8s, unique_name
        self.api = api.ResourceV1alpha3Api(k8s.api_client)
        self.names: list[str] = []

    def body(self, label: str, driver: str, **spec) -> dict:
        name = self.unique_name(f"psr-{label}")
        self.names.append(name)  # deleted at teardown also when a create expected to fail went through
        return {"apiVersion": API_VERSION, "kind": "ResourcePoolStatusRequest",
                "metadata": {"name": name}, "spec": {"driver": driver, **spec}}

    def create(self, label: str, driver: str, **spec) -> str:
        return self.api.create_resource_pool_status_request(self.body(label, driver, **spec)).metadata.name

    def read(self, name: str):
        return self.api.read_resource_pool_status_request(name)

    def describe(self, name: str) -> str:
        return f"ResourcePoolStatusRequest {name}: " + json.dumps(
            self.k8s.api_client.sanitize_for_serialization(self.read(name)), default=str)

    def answered(self, name: str, timeout: float = ANSWER_TIMEOUT):
        """The request once the controller wrote its status."""
        def status_written():
            found = self.read(name)
            return found if found.status is not None else None

        return wait.until(f"ResourcePoolStatusRequest {name} to be answered", status_written, timeout,
                          diagnostics=lambda: self.describe(name))

    def delete_all(self) -> None:
        for name in reversed(self.names):
            wait.ignore_not_found(self.api.delete_resource_pool_status_request, name)


@pytest.fixture
def pool_requests(k8s, unique_name):
    requests = PoolStatusRequests(k8s, unique_name)
    yield requests
    requests.delete_all()


def _driver(unique_name, prefix: str) -> str:
    return unique_name(prefix) + ".example.com"


def _slice(name: str, driver: str, node: str, pool: str, *, devices: list[dict] | None = None,
           counters: list[dict] | None = None, slice_count: int = 1, partition_attribute: str | None = None) -> dict:
    """A ResourceSlice of `pool` on `node`: devices or shared counter sets (a slice holds one or the other)."""
    spec: dict = {"driver": driver, "nodeName": node,
                  "pool": {"name": pool, "generation": 1, "resourceSliceCount": slice_count}}
    if devices is not None:
        spec["devices"] = devices
    if counters is not None:
        spec["sharedCounters"] = counters
    if partition_attribute is not None:
        spec["partitionTypeAttribute"] = partition_attribute
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name}, "spec": spec}


def _the_pool(request, driver: str, pool: str):
    """The request's one pool entry, checked to be `driver`/`pool`, with poolCount 1."""
    status = request.status
    where = f"ResourcePoolStatusRequest {request.metadata.name}"
    assert status.pool_count == 1 and len(status.pools or []) == 1, f"{where}: expected one pool, got {status}"
    (entry,) = status.pools
    assert (entry.driver, entry.pool_name) == (driver, pool), f"{where}: {entry}"
    return entry


def _counts(entry) -> dict:
    return {"resourceSliceCount": entry.resource_slice_count, "totalDevices": entry.total_devices,
            "allocatedDevices": entry.allocated_devices, "unavailableDevices": entry.unavailable_devices,
            "availableDevices": entry.available_devices}


def _complete(request, pools: int, incomplete: int = 0) -> None:
    """The status carries exactly the one condition the controller writes: Complete=True, CalculationComplete."""
    message = f"Calculated status for {pools} pools" + (f" ({incomplete} incomplete)" if incomplete else "")
    conditions = [(c.type, c.status, c.reason, c.message) for c in request.status.conditions or []]
    assert conditions == [("Complete", "True", "CalculationComplete", message)], \
        f"ResourcePoolStatusRequest {request.metadata.name}: conditions {conditions}"


def _allocate(k8s, ns: str, pod: str, device_class: str, node: str, selectors: tuple[str, ...] = ()) -> str:
    """Run a pod on `node` whose claim asks for one device of the class; return the device it was
    allocated (from the pool of `node`: the pod is pinned there)."""
    k8s.resource.create_namespaced_resource_claim_template(ns, objects.claim_template(
        pod, requests=[objects.request(device_class, selectors=selectors)]))
    k8s.core.create_namespaced_pod(ns, objects.pod_with_template_claim(
        pod, pod, node_selector={"kubernetes.io/hostname": node}))
    checks.running(k8s, ns, pod, timeout=90)
    ((_, pool, device),) = checks.allocated_devices(checks.pod_claim(k8s, ns, pod))
    assert pool == node, f"the claim of pod {pod} got {pool}/{device}, not a device of pool {node}"
    return device


def _stays_unanswered(requests: PoolStatusRequests, name: str, seconds: float) -> None:
    """Poll the request until the window's deadline; it must have no status at any look."""
    deadline = time.monotonic() + seconds
    while True:
        found = requests.read(name)
        assert found.status is None, f"ResourcePoolStatusRequest {name} was answered: {requests.describe(name)}"
        if time.monotonic() >= deadline:
            return
        time.sleep(0.2)


# --- DRAResourcePoolStatus ---------------------------------------------------------------------

@POOL_STATUS
def test_request_reports_the_pool_counts_once(k8s, dra_namespace, cluster_objects, unique_name, simulated_nodes,
                                              pool_requests):
    ns, node = dra_namespace, simulated_nodes[0]
    driver = _driver(unique_name, "ps")
    devices = [{"name": f"dev-{i}"} for i in range(4)]
    devices[3]["taints"] = [{"key": f"{driver}/broken", "effect": "NoSchedule"}]
    cluster_objects.resource_slice(_slice(unique_name("ps"), driver, node, node, devices=devices))
    if len(simulated_nodes) > 1:  # a second pool of the driver, which poolName filters out
        other = simulated_nodes[1]
        cluster_objects.resource_slice(_slice(unique_name("ps-other"), driver, other, other,
                                              devices=[{"name": "dev-0"}]))
    device_class = cluster_objects.device_class(objects.device_class(unique_name("ps"), driver)).metadata.name
    first = _allocate(k8s, ns, "first", device_class, node)
    assert first in {"dev-0", "dev-1", "dev-2"}, f"the claim of pod first got {first}, the tainted dev-3 or another"

    name = pool_requests.create("pool", driver, poolName=node)
    answer = pool_requests.answered(name)
    entry = _the_pool(answer, driver, node)
    assert _counts(entry) == {"resourceSliceCount": 1, "totalDevices": 4, "allocatedDevices": 1,
                              "unavailableDevices": 1, "availableDevices": 2}, f"ResourcePoolStatusRequest {name}: {entry}"
    assert (entry.node_name, entry.generation, entry.validation_error) == (node, 1, None), \
        f"ResourcePoolStatusRequest {name}: {entry}"
    assert not entry.partition_summary and not entry.shareable_summary, f"ResourcePoolStatusRequest {name}: {entry}"
    _complete(answer, 1)
    assert answer.spec.limit == 100, f"ResourcePoolStatusRequest {name}: spec.limit not defaulted: {answer.spec}"

    # The answer is final: nobody rewrites it, neither a client ...
    body = k8s.api_client.sanitize_for_serialization(answer)
    body["status"]["pools"][0]["allocatedDevices"] = 0
    body["status"]["pools"][0]["availableDevices"] = 3
    message = checks.rejected(pool_requests.api.replace_resource_pool_status_request_status, name, body)
    assert "status" in message and "field is immutable" in message, message
    message = checks.rejected(pool_requests.api.patch_resource_pool_status_request, name, {"spec": {"limit": 5}})
    assert "spec" in message and "field is immutable" in message, message

    # ... nor the controller, when the pool changed and the request was updated since. A request made
    # after that update is answered after the controller saw it (one informer, events in order).
    second = _allocate(k8s, ns, "second", device_class, node)
    pool_requests.api.patch_resource_pool_status_request(name, {"metadata": {"labels": {"touched": "yes"}}})
    later = pool_requests.answered(pool_requests.create("later", driver, poolName=node))
    assert _counts(_the_pool(later, driver, node))["allocatedDevices"] == 2, \
        f"ResourcePoolStatusRequest {later.metadata.name} (devices {first}, {second} allocated): {later.status}"
    kept = pool_requests.read(name)
    assert kept.metadata.labels == {"touched": "yes"}, f"ResourcePoolStatusRequest {name}: {kept.metadata}"
    assert kept.status == answer.status, \
        f"ResourcePoolStatusRequest {name} was answered again: {answer.status} -> {kept.status}"


@POOL_STATUS
def test_out_of_range_limits_are_refused_and_a_driver_without_pools_has_none(unique_name, pool_requests):
    driver = _driver(unique_name, "ps-none")
    for limit, words in ((0, "must be greater than or equal to 1"), (1001, "must be less than or equal to 1000")):
        message = checks.rejected(pool_requests.api.create_resource_pool_status_request,
                                  pool_requests.body(f"limit-{limit}", driver, limit=limit))
        assert f"spec.limit: Invalid value: {limit}: {words}" in message, message

    name = pool_requests.create("none", driver)
    answer = pool_requests.answered(name)
    assert (answer.status.pool_count, answer.status.pools) == (0, None), \
        f"ResourcePoolStatusRequest {name} for a driver without slices: {answer.status}"
    _complete(answer, 0)


@POOL_STATUS
def test_request_for_an_incomplete_pool_stays_unanswered(k8s, cluster_objects, unique_name, simulated_node,
                                                         pool_requests):
    node = simulated_node
    driver = _driver(unique_name, "ps-inc")
    published = {"driver": driver, "node": node, "pool": node, "slice_count": 2}
    cluster_objects.resource_slice(_slice(unique_name("ps-inc-a"), devices=[{"name": "dev-0"}], **published))
    cluster_objects.resource_slice(_slice(unique_name("ps-inc-ctl"), driver, node, "control",
                                          devices=[{"name": "dev-0"}]))
    pending = pool_requests.create("pending", driver, poolName=node)
    # A request for a complete pool of the same driver, made after the pending one: once it is answered,
    # the controller has seen the pending request too (one worker, one informer).
    control = pool_requests.answered(pool_requests.create("control", driver, poolName="control"))
    assert _counts(_the_pool(control, driver, "control"))["totalDevices"] == 1, control.status
    _stays_unanswered(pool_requests, pending, PENDING_WINDOW)

    # The second slice completes the pool. The controller answers a request on its add or update only
    # (and gives up requeueing an incomplete one after 5 quick retries), so the request is updated.
    cluster_objects.resource_slice(_slice(unique_name("ps-inc-b"), devices=[{"name": "dev-1"}], **published))
    pool_requests.api.patch_resource_pool_status_request(pending, {"metadata": {"labels": {"retry": "1"}}})
    answer = pool_requests.answered(pending)
    assert _counts(_the_pool(answer, driver, node)) == {
        "resourceSliceCount": 2, "totalDevices": 2, "allocatedDevices": 0, "unavailableDevices": 0,
        "availableDevices": 2}, f"ResourcePoolStatusRequest {pending}: {answer.status}"
    _complete(answer, 1)


# --- DRAPartitionableDevicesType ----------------------------------------------------------------

COUNTER_SET = "gpu-0"


def _partition(name: str, kind: str, memory: str) -> dict:
    """A device of the counter set, its partition type in the bare (driver-domain) attribute `partition`."""
    return {"name": name, "attributes": {"partition": {"string": kind}},
            "consumesCounters": [{"counterSet": COUNTER_SET, "counters": {"memory": {"value": memory}}}]}


def _partitioned_pool(k8s, cluster_objects, unique_name, driver: str, node: str, devices: list[dict]) -> str:
    """Publish a two-slice pool: the counter set (8Gi of memory), and `devices` typed by `<driver>/partition`.
    Skips when the API drops partitionTypeAttribute (the gate is off in the API server)."""
    attribute = f"{driver}/partition"
    counters = [{"name": COUNTER_SET, "counters": {"memory": {"value": "8Gi"}}}]
    devices_slice = _slice(unique_name("pt-devices"), driver, node, node, devices=devices, slice_count=2,
                           partition_attribute=attribute)
    _require_partition_type_attribute(k8s, devices_slice)
    cluster_objects.resource_slice(_slice(unique_name("pt-counters"), driver, node, node, counters=counters,
                                          slice_count=2))
    cluster_objects.resource_slice(devices_slice)
    return attribute


def _require_partition_type_attribute(k8s, body: dict) -> None:
    stored = k8s.resource.create_resource_slice(body, dry_run="All")
    if stored.spec.partition_type_attribute != body["spec"]["partitionTypeAttribute"]:
        pytest.skip("feature gate DRAPartitionableDevicesType is off in the API server: it dropped "
                    "spec.partitionTypeAttribute of a ResourceSlice")


def _summary(entry) -> list[tuple[str, str, int, int]]:
    return [(p.attribute, p.type, p.total, p.allocatable) for p in entry.partition_summary or []]


@POOL_STATUS
@PARTITION_TYPE
def test_partition_summary_counts_what_still_fits_the_shared_counters(k8s, dra_namespace, cluster_objects, unique_name,
                                                                      simulated_node, pool_requests):
    ns, node = dra_namespace, simulated_node
    driver = _driver(unique_name, "pt")
    # One GPU's 8Gi: the whole of it, or two halves.
    attribute = _partitioned_pool(k8s, cluster_objects, unique_name, driver, node, [
        _partition("full", "Full", "8Gi"), _partition("half-0", "Half", "4Gi"), _partition("half-1", "Half", "4Gi")])
    device_class = cluster_objects.device_class(objects.device_class(unique_name("pt"), driver)).metadata.name

    before = pool_requests.answered(pool_requests.create("before", driver, poolName=node))
    entry = _the_pool(before, driver, node)
    assert _summary(entry) == [(attribute, "Full", 1, 1), (attribute, "Half", 2, 2)], \
        f"ResourcePoolStatusRequest {before.metadata.name}: {entry}"
    assert _counts(entry) == {"resourceSliceCount": 2, "totalDevices": 3, "allocatedDevices": 0,
                              "unavailableDevices": 0, "availableDevices": 3}, entry
    assert entry.validation_error is None, entry
    _complete(before, 1)

    half = _allocate(k8s, ns, "half", device_class, node, (f'device.attributes["{driver}"].partition == "Half"',))
    assert half in {"half-0", "half-1"}, f"the claim of pod half got {half}"

    # 4Gi are left: no whole GPU fits, one more half does. The device counts do not look at counters:
    # the whole GPU still counts as available.
    after = pool_requests.answered(pool_requests.create("after", driver, poolName=node))
    entry = _the_pool(after, driver, node)
    assert _summary(entry) == [(attribute, "Full", 1, 0), (attribute, "Half", 2, 1)], \
        f"ResourcePoolStatusRequest {after.metadata.name} ({half} allocated): {entry}"
    assert _counts(entry) == {"resourceSliceCount": 2, "totalDevices": 3, "allocatedDevices": 1,
                              "unavailableDevices": 0, "availableDevices": 2}, entry


@PARTITION_TYPE
def test_partition_type_attribute_is_refused_on_a_slice_without_counter_consuming_devices(k8s, unique_name,
                                                                                          simulated_node):
    """Dry-run creates: the API server validates them fully and stores nothing."""
    node = simulated_node
    driver = _driver(unique_name, "pt-api")
    attribute = f"{driver}/partition"
    _require_partition_type_attribute(k8s, _slice(unique_name("pt-ok"), driver, node, node, slice_count=2,
                                                  devices=[_partition("half-0", "Half", "4Gi")],
                                                  partition_attribute=attribute))
    plain = _slice(unique_name("pt-plain"), driver, node, node, devices=[{"name": "dev-0"}],
                   partition_attribute=attribute)
    counters = _slice(unique_name("pt-counters"), driver, node, node, partition_attribute=attribute,
                      counters=[{"name": COUNTER_SET, "counters": {"memory": {"value": "8Gi"}}}])
    for body in (plain, counters):
        message = checks.rejected(k8s.resource.create_resource_slice, body, dry_run="All")
        assert (f'spec.partitionTypeAttribute: Invalid value: "{attribute}": '
                "may only be set on a slice which declares devices that consume counters") in message, message

    # A counter-consuming device must carry the attribute it names.
    untyped = _partition("half-0", "Half", "4Gi")
    del untyped["attributes"]
    message = checks.rejected(k8s.resource.create_resource_slice, _slice(
        unique_name("pt-untyped"), driver, node, node, devices=[untyped], slice_count=2,
        partition_attribute=attribute), dry_run="All")
    assert f"spec.devices[0].attributes[{attribute}]" in message and "must be set" in message, message


@POOL_STATUS
@PARTITION_TYPE
def test_devices_of_one_partition_type_with_different_costs_flag_the_pool(k8s, cluster_objects, unique_name,
                                                                          simulated_node, pool_requests):
    node = simulated_node
    driver = _driver(unique_name, "pt-cost")
    # The API lets two "Half" devices cost 4Gi and 2Gi; only the pool-status controller objects.
    _partitioned_pool(k8s, cluster_objects, unique_name, driver, node,
                      [_partition("half-0", "Half", "4Gi"), _partition("half-1", "Half", "2Gi")])
    answer = pool_requests.answered(pool_requests.create("cost", driver, poolName=node))
    entry = _the_pool(answer, driver, node)
    assert entry.validation_error == (f'PartitionCostMismatch: devices of partition type "Half" in pool '
                                      f"{driver}/{node} consume different counters"), \
        f"ResourcePoolStatusRequest {answer.metadata.name}: {entry}"
    assert not entry.partition_summary, f"ResourcePoolStatusRequest {answer.metadata.name}: {entry}"
    # The device counts stay valid beside the error; the condition counts the flagged pool as incomplete.
    assert _counts(entry) == {"resourceSliceCount": 2, "totalDevices": 2, "allocatedDevices": 0,
                              "unavailableDevices": 0, "availableDevices": 2}, entry
    _complete(answer, 1, incomplete=1)


ONE_MIG_GPU = """  gpus:
  - model: A100-SXM4-80GB
    count: 1
    attach: [{pcieRoot: pci0000:10}]
    mig: {mode: dynamic, partitionType: true}
"""


@POOL_STATUS
@PARTITION_TYPE
@pytest.mark.fake_devices("a MIG profile that names partition types")
def test_the_fake_drivers_mig_gpu_gets_a_partition_summary_per_mig_profile(k8s, dra_namespace, fake_driver,
                                                                            simulated_node, pool_requests, tmp_path):
    """The fake driver's A100 (7 compute slices, 8 memory slices, 80Gi) as partition types: the whole GPU and each
    MIG profile. Allocating a 3g.40gb instance (3 compute, 4 memory slices, 40Gi) leaves room for one more 3g.40gb
    and no whole GPU; every type's count is what fits the counters left, measured alone (greedy fit)."""
    ns, node = dra_namespace, simulated_node
    driver = fake_driver({node: objects.node_profile(tmp_path, "one-typed-mig-gpu", ONE_MIG_GPU)})
    gpu = driver.drivers.gpu
    attribute = f"{gpu}/partitionType"

    before = pool_requests.answered(pool_requests.create("mig-before", gpu, poolName=node))
    entry = _the_pool(before, gpu, node)
    assert entry.validation_error is None, f"ResourcePoolStatusRequest {before.metadata.name}: {entry}"
    assert {attr for attr, _, _, _ in _summary(entry)} == {attribute}, entry
    free = {kind: (total, allocatable) for _, kind, total, allocatable in _summary(entry)}
    # placements per profile (NVIDIA's table), each alone on an empty GPU: as many as its slices allow
    assert free == {"gpu": (1, 1), "1g.10gb": (7, 7), "1g.10gb+me": (7, 1), "1g.20gb": (4, 4), "2g.20gb": (3, 3),
                    "3g.40gb": (2, 2), "4g.40gb": (1, 1), "7g.80gb": (1, 1)}, \
        f"ResourcePoolStatusRequest {before.metadata.name} (driver {gpu}, pool {node}): {free}"

    device = _allocate(k8s, ns, "three-g", f"{driver.config.instance}-mig", node,
                       (f'device.attributes["{gpu}"].profile == "3g.40gb"',))
    after = pool_requests.answered(pool_requests.create("mig-after", gpu, poolName=node))
    entry = _the_pool(after, gpu, node)
    left = {kind: allocatable for _, kind, _, allocatable in _summary(entry)}
    # 4 compute, 4 memory slices, 40Gi left: one 3g.40gb or one 4g.40gb, four 1g.10gb (compute 4), ...
    assert left == {"gpu": 0, "1g.10gb": 4, "1g.10gb+me": 1, "1g.20gb": 2, "2g.20gb": 2, "3g.40gb": 1, "4g.40gb": 1,
                    "7g.80gb": 0}, f"ResourcePoolStatusRequest {after.metadata.name} ({device} allocated): {left}"
