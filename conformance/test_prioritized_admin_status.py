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
from kubernetes.client.rest import ApiException

from conformance import checks, objects
from harness import wait

pytestmark = [pytest.mark.fake_devices]
PRIORITIZED = pytest.mark.dra_feature("DRAPrioritizedList", maturity="ga")
ADMIN = pytest.mark.dra_feature("DRAAdminAccess", maturity="ga")
DEVICE_STATUS = pytest.mark.dra_feature("DRAResourceClaimDeviceStatus", maturity="ga")

NUMA = objects.standard_attribute("numaNode")
ADMIN_MESSAGE = ("spec.devices.requests[0].adminAccess: Forbidden: admin access to devices requires the "
                 "`resource.kubernetes.io/admin-access: true` label on the containing namespace")


def _template_pod(k8s, ns: str, name: str, *requests: dict, template: str | None = None) -> None:
    """A pod `name` using template `template` (default: a new template `name` with these requests)."""
    if template is None:
        k8s.resource.create_namespaced_resource_claim_template(ns, objects.claim_template(name,
                                                                                          requests=list(requests)))
    k8s.core.create_namespaced_pod(ns, objects.pod_with_template_claim(name, template or name))


def _results(k8s, ns: str, pod: str) -> list[tuple[str, str]]:
    """(request, device) of the claim of a running pod."""
    checks.running(k8s, ns, pod)
    return [(request, device) for request, _, device in checks.allocated_devices(checks.pod_claim(k8s, ns, pod))]


# --- prioritized list ----------------------------------------------------------------------------

@PRIORITIZED
def test_first_subrequest_wins_when_it_can_be_satisfied(k8s, dra_namespace, fake_driver, simulated_node):
    ns = dra_namespace
    gpu = f"{fake_driver({simulated_node: 'tiny'}).config.instance}-gpu"
    _template_pod(k8s, ns, "pair-or-single", objects.first_available(
        "gpu", objects.request(gpu, name="pair", count=2), objects.request(gpu, name="single")))
    assert _results(k8s, ns, "pair-or-single") == [("gpu/pair", "gpu-0"), ("gpu/pair", "gpu-1")]


@PRIORITIZED
def test_next_subrequest_when_the_first_cannot_be_satisfied(k8s, dra_namespace, fake_driver, simulated_node):
    """Two GPUs on NUMA node 0 do not exist on `tiny` (one per NUMA node): the single GPU is taken instead."""
    ns = dra_namespace
    gpu = f"{fake_driver({simulated_node: 'tiny'}).config.instance}-gpu"
    _template_pod(k8s, ns, "local-pair-or-single", objects.first_available(
        "gpu", objects.request(gpu, name="local-pair", count=2, selectors=[f"{NUMA} == 0"]),
        objects.request(gpu, name="single")))
    [(request, device)] = _results(k8s, ns, "local-pair-or-single")
    assert request == "gpu/single" and device in ("gpu-0", "gpu-1")


@PRIORITIZED
def test_falls_back_while_the_first_choice_is_in_use(k8s, dra_namespace, fake_driver, simulated_node):
    ns = dra_namespace
    gpu = f"{fake_driver({simulated_node: 'tiny'}).config.instance}-gpu"
    _template_pod(k8s, ns, "holder", objects.request(gpu, selectors=[f"{NUMA} == 0"]))
    assert _results(k8s, ns, "holder") == [("gpu", "gpu-0")]

    _template_pod(k8s, ns, "near-or-far", objects.first_available(
        "gpu", objects.request(gpu, name="near", selectors=[f"{NUMA} == 0"]),
        objects.request(gpu, name="far", selectors=[f"{NUMA} == 1"])))
    assert _results(k8s, ns, "near-or-far") == [("gpu/far", "gpu-1")]

    # Neither alternative is free now ...
    _template_pod(k8s, ns, "late", template="near-or-far")
    condition = checks.unschedulable(k8s, ns, "late")
    assert "cannot allocate all claims" in condition.message
    # ... until the holder goes: then the first choice is served again.
    k8s.core.delete_namespaced_pod("holder", ns)
    assert _results(k8s, ns, "late") == [("gpu/near", "gpu-0")]


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
def test_admin_access_does_not_consume_the_device(k8s, dra_namespace, fake_driver, simulated_node):
    ns = dra_namespace
    _label_admin(k8s, ns, "true")
    gpu = f"{fake_driver({simulated_node: 'tiny'}).config.instance}-gpu"
    on_numa0 = [f"{NUMA} == 0"]  # exactly one GPU: gpu-0
    k8s.resource.create_namespaced_resource_claim_template(ns, objects.claim_template(
        "monitor", requests=[objects.admin_request(gpu, selectors=on_numa0)]))
    k8s.resource.create_namespaced_resource_claim_template(ns, objects.claim_template(
        "user", requests=[objects.request(gpu, selectors=on_numa0)]))

    _template_pod(k8s, ns, "monitor-1", template="monitor")
    checks.running(k8s, ns, "monitor-1")
    [result] = checks.pod_claim(k8s, ns, "monitor-1").status.allocation.devices.results
    assert (result.device, result.admin_access) == ("gpu-0", True)

    # The admin allocation left gpu-0 free for a normal claim ...
    _template_pod(k8s, ns, "user-1", template="user")
    checks.running(k8s, ns, "user-1")
    [result] = checks.pod_claim(k8s, ns, "user-1").status.allocation.devices.results
    assert (result.device, result.admin_access) == ("gpu-0", None)
    # ... another admin claim gets it while it is in use ...
    _template_pod(k8s, ns, "monitor-2", template="monitor")
    assert _results(k8s, ns, "monitor-2") == [("gpu", "gpu-0")]
    # ... but a second normal claim does not.
    _template_pod(k8s, ns, "user-2", template="user")
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
        except ApiException as err:
            if err.status != 409:
                raise
    raise AssertionError(f"claim {claim}: status update kept conflicting")


def _entry(result, **fields) -> dict:
    return {"driver": result.driver, "pool": result.pool, "device": result.device, **fields}


NETWORK = {"interfaceName": "net1", "ips": ["10.9.8.7/24", "fd00::7/64"], "hardwareAddress": "02:00:00:00:00:01"}
READY = {"type": "Ready", "status": "True", "reason": "LinkUp", "message": "link is up",
         "lastTransitionTime": "2026-01-01T00:00:00Z"}


@DEVICE_STATUS
def test_driver_reports_status_of_allocated_devices_only(k8s, dra_namespace, fake_driver, simulated_node):
    ns = dra_namespace
    driver = fake_driver({simulated_node: "tiny"})
    instance = driver.config.instance
    k8s.resource.create_namespaced_resource_claim(ns, objects.resource_claim("net", [
        objects.request(f"{instance}-gpu", name="gpu"), objects.request(f"{instance}-nic", name="nic")]))
    unallocated = {"driver": driver.drivers.nic, "pool": simulated_node, "device": "nic-0"}
    message = checks.rejected(_write_device_status, k8s, ns, "net", [unallocated])
    assert message.endswith("must be an allocated device in the claim")  # nothing is allocated yet

    k8s.core.create_namespaced_pod(ns, objects.pod_with_claims("user", [objects.claim_ref("net", claim="net")]))
    checks.running(k8s, ns, "user")
    claim = checks.allocated_claim(k8s, ns, "net")
    gpu, nic = sorted(claim.status.allocation.devices.results, key=lambda r: r.request)
    other_nic = "nic-1" if nic.device == "nic-0" else "nic-0"

    stored = _write_device_status(k8s, ns, "net", [
        _entry(nic, conditions=[READY], data={"firmware": {"version": "22.41"}}, networkData=NETWORK),
        _entry(gpu, data={"health": "ok"})])
    got = k8s.api_client.sanitize_for_serialization(stored.status.devices)
    assert got == [
        {**_entry(nic), "conditions": [{**READY, "lastTransitionTime": "2026-01-01T00:00:00+00:00"}],
         "data": {"firmware": {"version": "22.41"}}, "networkData": NETWORK},
        {**_entry(gpu), "data": {"health": "ok"}}]

    # Rejected: a device of the pool that is not allocated to this claim, a bad address, a duplicate.
    message = checks.rejected(_write_device_status, k8s, ns, "net", [_entry(nic), {**_entry(nic), "device": other_nic}])
    assert message.startswith('ResourceClaim.resource.k8s.io "net" is invalid: status.devices[1]: Invalid value: ')
    assert f'"Device":"{other_nic}"' in message and message.endswith("must be an allocated device in the claim")
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

    released_claim = wait.until("claim net to be deallocated", released, 60,
                                diagnostics=lambda: wait.describe_namespace(k8s, ns))
    assert released_claim.status.devices is None


@DEVICE_STATUS
@pytest.mark.dra_feature("DRAConsumableCapacity", maturity="beta")
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
