"""Three GA features of DRA in 1.37 around a claim's requests and status:

- DRAPrioritizedList: a request with `firstAvailable` subrequests is served by the first subrequest that
  can be allocated; each result names it as `<request>/<subrequest>`.
- DRAAdminAccess: `exactly.adminAccess: true` is only accepted (ResourceClaim and ResourceClaimTemplate
  create) in a namespace labelled `resource.kubernetes.io/admin-access: "true"`
  (k8s.io/api resource/v1 DRAAdminNamespaceLabelKey; checked by the apiserver's registry, message
  "admin access to devices requires the `resource.kubernetes.io/admin-access: true` label on the
  containing namespace"). Admin allocations do not make a device busy and may take busy devices.
- DRAResourceClaimDeviceStatus: the driver reports per-device `status.devices[]` {driver, pool, device,
  shareID, conditions, data, networkData} through the status subresource; the apiserver accepts entries
  only for allocated devices (shareID included) and drops them when the claim is deallocated.
"""

from __future__ import annotations

import pytest

from conformance import checks, objects
from harness.k8s import errors, wait

PRIORITIZED = pytest.mark.dra_feature("DRAPrioritizedList", maturity="ga")
ADMIN = pytest.mark.dra_feature("DRAAdminAccess", maturity="ga")
DEVICE_STATUS = pytest.mark.dra_feature("DRAResourceClaimDeviceStatus", maturity="ga")

ADMIN_MESSAGE = ("spec.devices.requests[0].adminAccess: Forbidden: admin access to devices requires the "
                 "`resource.kubernetes.io/admin-access: true` label on the containing namespace")


def _template_pod(k8s, ns: str, pool, name: str, *requests: dict, template: str | None = None) -> None:
    """A pod `name` where the pool's devices are, using template `template` (default: a new template
    `name` with these requests)."""
    if template is None:
        k8s.resource.create_namespaced_resource_claim_template(ns, objects.claim_template(name,
                                                                                          requests=list(requests)))
    k8s.core.create_namespaced_pod(ns, pool.pod(objects.pod_with_template_claim(name, template or name)))


def _results(k8s, ns: str, pod: str) -> list[tuple[str, str]]:
    """(request, device) of the claim of a running pod."""
    checks.running(k8s, ns, pod, timeout=90)
    return [(request, device) for request, _, device in checks.allocated_devices(checks.pod_claim(k8s, ns, pod))]


# --- prioritized list ----------------------------------------------------------------------------

@PRIORITIZED
def test_first_subrequest_wins_when_it_can_be_satisfied(k8s, dra_namespace, devices_under_test):
    ns = dra_namespace
    pool = devices_under_test(2)
    _template_pod(k8s, ns, pool, "pair-or-single", objects.first_available(
        "gpu", pool.request("pair", count=2), pool.request("single")))
    assert sorted(_results(k8s, ns, "pair-or-single")) == [("gpu/pair", d) for d in sorted(pool.names)]


@PRIORITIZED
def test_next_subrequest_when_the_first_cannot_be_satisfied(k8s, dra_namespace, devices_under_test):
    """Three devices where the test has two cannot be had: the single device is taken instead."""
    ns = dra_namespace
    pool = devices_under_test(2)
    _template_pod(k8s, ns, pool, "triple-or-single", objects.first_available(
        "gpu", pool.request("triple", count=3), pool.request("single")))
    [(request, device)] = _results(k8s, ns, "triple-or-single")
    assert request == "gpu/single" and device in pool.names


CONFIG_DRIVER = "config-only.example.com"  # opaque configs no driver of the suite reads


def _opaque(driver: str, parameters: dict, requests: list[str] | None = None) -> dict:
    config: dict = {"opaque": {"driver": driver, "parameters": parameters}}
    if requests is not None:
        config["requests"] = requests
    return config


@PRIORITIZED
def test_only_the_chosen_subrequests_configs_reach_the_allocation(k8s, dra_namespace, devices_under_test):
    """Config follows the subrequest the allocator chose: the class config of the chosen subrequest's class and
    the claim configs naming `<request>/<chosen>` or the request itself are copied into the allocation, those
    of the subrequest not taken are not; a config that now covers every request loses its `requests`
    ("empty means all"). (k8s.io/dynamic-resource-allocation@v0.37.2 structured/internal/*/allocator_*.go,
    "Populate configs"; upstream test/e2e/dra: "supports claim and class parameters" with subrequests.)
    The configs name a driver of their own: the allocator copies them whatever driver they are for, and the
    driver under test, which would have to understand them, never gets them."""
    ns = dra_namespace
    pool = devices_under_test(2)
    driver = CONFIG_DRIVER
    # Two classes over the pool's devices, each with a config of its own.
    classes = {}
    for which in ("triple", "single"):
        name = pool.own_class(f"cfg-{which}")
        k8s.resource.patch_device_class(name, {"spec": {"config": [_opaque(driver, {"class": which})]}})
        classes[which] = name
    triple = pool.request("triple", count=3, device_class=classes["triple"])  # three where the test has two
    single = pool.request("single", device_class=classes["single"])
    template = objects.claim_template("chosen", requests=[objects.first_available("gpu", triple, single)])
    template["spec"]["spec"]["devices"]["config"] = [
        _opaque(driver, {"for": "triple"}, ["gpu/triple"]),
        _opaque(driver, {"for": "single"}, ["gpu/single"]),
        _opaque(driver, {"for": "request"}, ["gpu"]),
        _opaque(driver, {"for": "all"}),
    ]
    k8s.resource.create_namespaced_resource_claim_template(ns, template)
    k8s.core.create_namespaced_pod(ns, pool.pod(objects.pod_with_template_claim("chosen", "chosen")))
    # The allocation is the outcome; the pod need not start (devices with binding conditions wait for theirs).
    claim = checks.allocated_claim(k8s, ns, checks.pod_claim(k8s, ns, "chosen").metadata.name, timeout=90)
    [(request, _, device)] = checks.allocated_devices(claim)
    assert request == "gpu/single" and device in pool.names
    allocation = claim.status.allocation
    configs = [(c.source, c.opaque.parameters, list(c.requests or [])) for c in allocation.devices.config]
    # the chosen class's config first, then the claim's in their order; one request only, so each config
    # covers all of them and its `requests` is cleared
    assert configs == [("FromClass", {"class": "single"}, []), ("FromClaim", {"for": "single"}, []),
                       ("FromClaim", {"for": "request"}, []), ("FromClaim", {"for": "all"}, [])], configs


@PRIORITIZED
def test_falls_back_while_the_first_choice_is_in_use(k8s, dra_namespace, devices_under_test):
    ns = dra_namespace
    pool = devices_under_test(2)
    near, far = pool.devices
    _template_pod(k8s, ns, pool, "holder", pool.request(devices=(near,)))
    assert _results(k8s, ns, "holder") == [("gpu", near.name)]

    _template_pod(k8s, ns, pool, "near-or-far", objects.first_available(
        "gpu", pool.request("near", devices=(near,)), pool.request("far", devices=(far,))))
    assert _results(k8s, ns, "near-or-far") == [("gpu/far", far.name)]

    # Neither alternative is free now ...
    _template_pod(k8s, ns, pool, "late", template="near-or-far")
    condition = checks.unschedulable(k8s, ns, "late")
    assert "cannot allocate all claims" in condition.message
    # ... until the holder goes: then the first choice is served again.
    k8s.core.delete_namespaced_pod("holder", ns)
    assert _results(k8s, ns, "late") == [("gpu/near", near.name)]


@PRIORITIZED
def test_prioritized_list_is_validated(k8s, dra_namespace):
    ns = dra_namespace

    def claim(*requests, constraints=None):
        return objects.resource_claim("bad", list(requests), constraints)

    sub = objects.request("any-class", name="a")
    both = {**objects.first_available("gpu", sub), "exactly": {"deviceClassName": "any-class"}}
    message = checks.rejected(k8s.resource.create_namespaced_resource_claim, ns, claim(both))
    assert message.endswith("spec.devices.requests[0]: Invalid value: null: exactly one of `exactly` or "
                            "`firstAvailable` is required, but multiple fields are set")

    nine = objects.first_available("gpu", *(objects.request("any-class", name=f"s{i}") for i in range(9)))
    message = checks.rejected(k8s.resource.create_namespaced_resource_claim, ns, claim(nine))
    assert message.endswith("spec.devices.requests[0].firstAvailable: Too many: 9: must have at most 8 items")

    message = checks.rejected(k8s.resource.create_namespaced_resource_claim, ns, claim(
        objects.first_available("gpu", sub), constraints=[objects.match_attribute(objects.NUMA_NODE, "gpu/b")]))
    assert message.endswith('spec.devices.constraints[0].requests[0]: Invalid value: "gpu/b": must be the name of a '
                            "request in the claim or the name of a request and a subrequest separated by '/'")
    # A constraint may name a subrequest.
    k8s.resource.create_namespaced_resource_claim(ns, claim(
        objects.first_available("gpu", sub), constraints=[objects.match_attribute(objects.NUMA_NODE, "gpu/a")]))


# --- admin access --------------------------------------------------------------------------------

def _label_admin(k8s, ns: str, value: str) -> None:
    k8s.core.patch_namespace(ns, {"metadata": {"labels": {objects.ADMIN_ACCESS_LABEL: value}}})


@ADMIN
def test_admin_access_needs_the_namespace_label(k8s, dra_namespace):
    ns = dra_namespace
    admin = [objects.request("any-class", name="ok"), objects.admin_request("any-class", name="monitor")]
    path = ADMIN_MESSAGE.replace("requests[0]", "requests[1]")

    message = checks.rejected(k8s.resource.create_namespaced_resource_claim, ns, objects.resource_claim("c", admin))
    assert message == f'ResourceClaim.resource.k8s.io "c" is invalid: {path}'
    message = checks.rejected(k8s.resource.create_namespaced_resource_claim_template, ns,
                              objects.claim_template("t", requests=admin))
    assert message == f'ResourceClaimTemplate.resource.k8s.io "t" is invalid: {path}'
    _label_admin(k8s, ns, "True")  # only the exact value "true" grants it
    checks.rejected(k8s.resource.create_namespaced_resource_claim, ns, objects.resource_claim("c", admin))

    _label_admin(k8s, ns, "true")
    created = k8s.resource.create_namespaced_resource_claim(ns, objects.resource_claim("c", admin))
    assert [r.exactly.admin_access for r in created.spec.devices.requests] == [None, True]
    k8s.resource.create_namespaced_resource_claim_template(ns, objects.claim_template("t", requests=admin))


@ADMIN
def test_admin_access_does_not_consume_the_device(k8s, dra_namespace, devices_under_test):
    ns = dra_namespace
    _label_admin(k8s, ns, "true")
    pool = devices_under_test(1)
    (device,) = pool.devices
    k8s.resource.create_namespaced_resource_claim_template(ns, objects.claim_template(
        "monitor", requests=[objects.admin_request(pool.device_class, selectors=[pool.only()])]))
    k8s.resource.create_namespaced_resource_claim_template(ns, pool.template("user"))

    _template_pod(k8s, ns, pool, "monitor-1", template="monitor")
    checks.running(k8s, ns, "monitor-1", timeout=90)
    [result] = checks.pod_claim(k8s, ns, "monitor-1").status.allocation.devices.results
    assert (result.device, result.admin_access) == (device.name, True)

    # The admin allocation left the device free for a normal claim ...
    _template_pod(k8s, ns, pool, "user-1", template="user")
    checks.running(k8s, ns, "user-1", timeout=90)
    [result] = checks.pod_claim(k8s, ns, "user-1").status.allocation.devices.results
    assert (result.device, result.admin_access) == (device.name, None)
    # ... another admin claim gets it while it is in use ...
    _template_pod(k8s, ns, pool, "monitor-2", template="monitor")
    assert _results(k8s, ns, "monitor-2") == [("gpu", device.name)]
    # ... but a second normal claim does not.
    _template_pod(k8s, ns, pool, "user-2", template="user")
    condition = checks.unschedulable(k8s, ns, "user-2")
    assert "cannot allocate all claims" in condition.message


# --- device status -------------------------------------------------------------------------------

def _write_device_status(k8s, ns: str, claim: str, devices: list[dict]):
    """Replace `status.devices` through the status subresource, as a driver does (retrying on conflicts)."""
    for _ in range(5):
        body = k8s.api_client.sanitize_for_serialization(k8s.resource.read_namespaced_resource_claim(claim, ns))
        body.setdefault("status", {})["devices"] = devices
        try:
            return k8s.resource.replace_namespaced_resource_claim_status(claim, ns, body)
        except errors.Conflict:
            continue  # another writer (the scheduler) got there first: read again
    raise AssertionError(f"claim {claim}: status update kept conflicting")


def _entry(result, **fields) -> dict:
    return {"driver": result.driver, "pool": result.pool, "device": result.device, **fields}


NETWORK = {"interfaceName": "net1", "ips": ["10.9.8.7/24", "fd00::7/64"], "hardwareAddress": "02:00:00:00:00:01"}
READY = {"type": "Ready", "status": "True", "reason": "LinkUp", "message": "link is up",
         "lastTransitionTime": "2026-01-01T00:00:00Z"}


@DEVICE_STATUS
def test_driver_reports_status_of_allocated_devices_only(k8s, dra_namespace, devices_under_test):
    """The harness writes status.devices as a driver would, for a claim of the driver under test."""
    ns = dra_namespace
    pool = devices_under_test(3)
    first, second, other = pool.devices
    k8s.resource.create_namespaced_resource_claim(ns, objects.resource_claim("net", [
        pool.request("gpu", devices=(first,)), pool.request("nic", devices=(second,))]))
    message = checks.rejected(_write_device_status, k8s, ns, "net", [
        {"driver": pool.driver, "pool": second.pool, "device": second.name}])
    assert message.endswith("must be an allocated device in the claim")  # nothing is allocated yet

    k8s.core.create_namespaced_pod(ns, pool.pod(objects.pod_with_claims("user", [objects.claim_ref("net", claim="net")])))
    checks.running(k8s, ns, "user", timeout=90)
    claim = checks.allocated_claim(k8s, ns, "net")
    gpu, nic = sorted(claim.status.allocation.devices.results, key=lambda r: r.request)
    assert (gpu.device, nic.device) == (first.name, second.name)

    stored = _write_device_status(k8s, ns, "net", [
        _entry(nic, conditions=[READY], data={"firmware": {"version": "22.41"}}, networkData=NETWORK),
        _entry(gpu, data={"health": "ok"})])
    got = k8s.api_client.sanitize_for_serialization(stored.status.devices)
    assert got == [
        {**_entry(nic), "conditions": [{**READY, "lastTransitionTime": "2026-01-01T00:00:00+00:00"}],
         "data": {"firmware": {"version": "22.41"}}, "networkData": NETWORK},
        {**_entry(gpu), "data": {"health": "ok"}}]

    # Rejected: a device of the pool that is not allocated to this claim, a bad address, a duplicate.
    message = checks.rejected(_write_device_status, k8s, ns, "net", [_entry(nic), {**_entry(nic), "device": other.name}])
    assert message.startswith('ResourceClaim.resource.k8s.io "net" is invalid: status.devices[1]: Invalid value: ')
    assert f'"Device":"{other.name}"' in message and message.endswith("must be an allocated device in the claim")
    message = checks.rejected(_write_device_status, k8s, ns, "net", [
        _entry(nic, networkData={"interfaceName": "net1", "ips": ["10.9.8.7"]})])
    assert message.endswith('status.devices[0].networkData.ips[0]: Invalid value: "10.9.8.7": must be a valid '
                            "address in CIDR form, (e.g. 10.9.8.7/24 or 2001:db8::1/64)")
    message = checks.rejected(_write_device_status, k8s, ns, "net", [_entry(nic), _entry(nic)])
    assert "status.devices[1]: Duplicate value" in message
    assert len(k8s.resource.read_namespaced_resource_claim("net", ns).status.devices) == 2  # unchanged

    # Deallocation (the pod is gone, the claim is released) drops the device status with the allocation.
    k8s.core.delete_namespaced_pod("user", ns)

    def released():
        found = k8s.resource.read_namespaced_resource_claim("net", ns)
        return found if found.status.allocation is None else None

    released_claim = wait.until("claim net to be deallocated", released, 90,
                                diagnostics=lambda: wait.describe_namespace(k8s, ns))
    assert released_claim.status.devices is None


@DEVICE_STATUS
@pytest.mark.dra_feature("DRAConsumableCapacity", maturity="beta")
@pytest.mark.fake_devices("a shareable NVMe drive of the tiny profile")
def test_status_of_a_shared_device_names_its_share(k8s, dra_namespace, fake_driver, simulated_node):
    ns = dra_namespace
    nvme = f"{fake_driver({simulated_node: 'tiny'}).config.instance}-nvme"
    k8s.resource.create_namespaced_resource_claim(ns, objects.resource_claim("scratch", [
        objects.request(nvme, name="nvme", capacity={"size": "10Gi"})]))
    k8s.core.create_namespaced_pod(ns, objects.pod_with_claims("user", [objects.claim_ref("scratch", claim="scratch")]))
    checks.running(k8s, ns, "user")
    [share] = checks.allocated_claim(k8s, ns, "scratch").status.allocation.devices.results
    assert share.share_id

    message = checks.rejected(_write_device_status, k8s, ns, "scratch", [_entry(share)])
    assert message.endswith("must be an allocated device in the claim")  # the drive, but not this share
    stored = _write_device_status(k8s, ns, "scratch", [_entry(share, shareID=share.share_id, conditions=[READY])])
    [entry] = stored.status.devices
    assert (entry.device, entry.share_id, entry.conditions[0].reason) == (share.device, share.share_id, "LinkUp")
