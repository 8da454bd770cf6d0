"""Granular authorization of ResourceClaim status writes (DRAResourceClaimGranularStatusAuthorization,
beta and on by default in 1.37).

Write access to `resourceclaims/status` is no longer enough to change any part of a claim's status. The
status strategy (k8s.io/kubernetes@v1.37.2 pkg/registry/resource/resourceclaim/strategy.go,
resourceclaimStatusStrategy.ValidateUpdate) asks the authorizer two more questions, on synthetic
subresources (k8s.io/api@v0.37.2 resource/v1/types.go: SubresourceBinding, SubresourceDriver,
VerbPrefixAssociatedNode, VerbPrefixArbitraryNode), in pkg/registry/resource/utils.go:

- AuthorizedForBinding: changing `status.allocation` or `status.reservedFor` needs the request's verb on
  `resourceclaims/binding`, asked cluster-wide (namespace "", name ""), so a namespaced Role cannot grant it.
- AuthorizedForDeviceStatus: for every driver whose `status.devices` entries are added, changed or removed
  (getModifiedDrivers; unchanged entries of other drivers need nothing), `arbitrary-node:<verb>` on
  `resourceclaims/driver` with the driver's name as resourceName, in the claim's namespace; a
  ServiceAccount whose credentials carry the extra `authentication.kubernetes.io/node-name` equal to the
  node of the claim's allocation (saAssociatedWithAllocatedNode) may instead hold `associated-node:<verb>`,
  which is what a kubelet plugin's RBAC grants (upstream
  test/e2e/dra/test-driver/deploy/example/plugin-permissions.yaml).

A refusal is a 422 Invalid whose message names the field, the synthetic resource and the verbs tried.
Upstream's e2e (test/e2e/dra/dra.go, "must be impossible for a node ServiceAccount to update the non-node
ResourceClaim.Status.Devices" and "... possible for a control-plane ServiceAccount ...") checks the
arbitrary-node case; here also the per-driver scope, the binding check and associated-node.

The claims are allocated for real: the fake driver publishes `tiny` (a GPU driver and a NIC driver among
others) on a simulated node and a pod's claim gets one GPU and one NIC, so both drivers' entries are
legal status.devices entries and only authorization can refuse them. The callers are ServiceAccounts of
the test's namespace, taken by impersonation (the SA's groups follow from its name); the node-name extra
is impersonated too (Impersonate-Extra-authentication.kubernetes.io%2fnode-name).
"""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Callable, Iterator

import pytest

from conformance import checks, objects
from fake_devices import keyfiles
from harness.k8s import api, errors, wait
from harness.k8s.client import Clients

GATE = "DRAResourceClaimGranularStatusAuthorization"
pytestmark = pytest.mark.dra_feature("DRAResourceClaimGranularStatusAuthorization", maturity="beta")

NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
RBAC_TIMEOUT = 30  # the RBAC authorizer reads Roles from an informer: a new grant takes effect a moment later


# --- the cluster side: a claim allocated for real, ServiceAccounts with Roles --------------------------------

class Allocated:
    """The namespace's claim with one GPU and one NIC of the fake driver, allocated on `node`."""

    def __init__(self, k8s: Clients, namespace: str, node: str, claim, gpu: str, nic: str):
        self.k8s, self.namespace, self.node, self.gpu, self.nic = k8s, namespace, node, gpu, nic
        self.name = claim.metadata.name
        self.results = {r.driver: r for r in claim.status.allocation.devices.results}

    def read(self):
        return self.k8s.resource.read_namespaced_resource_claim(self.name, self.namespace)

    def body(self) -> dict:
        """The claim as it is now, as the JSON a client would PUT back."""
        return self.k8s.api_client.sanitize_for_serialization(self.read())

    def entry(self, driver: str, condition: str = "Ready", data: dict | None = None) -> dict:
        """A status.devices entry for the device allocated from `driver` (conditions and data)."""
        result = self.results[driver]
        now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        found: dict = {"driver": result.driver, "pool": result.pool, "device": result.device,
                       "conditions": [{"type": condition, "status": "True", "reason": "Tested",
                                       "message": f"written for {driver}", "lastTransitionTime": now}],
                       "data": data or {"writer": driver}}
        if result.share_id:
            found["shareID"] = result.share_id
        return found

    def devices(self) -> list:
        return list(self.read().status.devices or [])

    def state(self) -> tuple:
        """What a refused write must leave untouched: the device entries and the consumers."""
        status = self.read().status
        return ([(d.driver, d.pool, d.device, [(c.type, c.status) for c in d.conditions or []], d.data)
                 for d in status.devices or []],
                [(r.resource, r.name, r.uid) for r in status.reserved_for or []])


@pytest.fixture
def allocated(k8s: Clients, dra_namespace: str, fake_driver, simulated_node) -> Allocated:
    ns = dra_namespace
    driver = fake_driver({simulated_node: "tiny"})
    instance = driver.config.instance
    k8s.resource.create_namespaced_resource_claim_template(ns, objects.claim_template(
        "gpu-and-nic", requests=[objects.request(f"{instance}-gpu", name="gpu"),
                                 objects.request(f"{instance}-nic", name="nic")]))
    k8s.core.create_namespaced_pod(ns, objects.pod_with_template_claim("consumer", "gpu-and-nic"))
    checks.running(k8s, ns, "consumer", timeout=90)  # allocated, reserved and bound: no one writes it any more
    claim = checks.pod_claim(k8s, ns, "consumer")
    drivers = sorted(r.driver for r in claim.status.allocation.devices.results)
    assert drivers == sorted([driver.drivers.gpu, driver.drivers.nic]), \
        f"claim {claim.metadata.name}: expected one GPU and one NIC, got devices of {drivers}"
    return Allocated(k8s, ns, simulated_node, claim, driver.drivers.gpu, driver.drivers.nic)


def _service_account(k8s: Clients, namespace: str, name: str, rules: list[dict]) -> str:
    """A ServiceAccount bound to a Role of `rules` in `namespace`; its user name."""
    k8s.core.create_namespaced_service_account(namespace, {"metadata": {"name": name}})
    k8s.rbac.create_namespaced_role(namespace, {"metadata": {"name": name}, "rules": rules})
    k8s.rbac.create_namespaced_role_binding(namespace, {
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]})
    return f"system:serviceaccount:{namespace}:{name}"


STATUS_RULE = {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/status"], "verbs": ["update", "patch"]}


def _driver_rule(driver: str, prefix: str) -> dict:
    return {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/driver"], "resourceNames": [driver],
            "verbs": [f"{prefix}update", f"{prefix}patch"]}


@pytest.fixture
def cluster_rbac(k8s: Clients, unique_name) -> Iterator[Callable[[str, list[dict]], str]]:
    """`cluster_rbac(user, rules)`: a ClusterRole and ClusterRoleBinding for `user`, deleted at teardown."""
    made: list[str] = []

    def grant(user: str, rules: list[dict]) -> str:
        name = unique_name("claim-binding")
        made.append(name)
        k8s.rbac.create_cluster_role({"metadata": {"name": name}, "rules": rules})
        k8s.rbac.create_cluster_role_binding({
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]})
        return name

    yield grant
    for name in made:
        wait.ignore_not_found(k8s.rbac.delete_cluster_role_binding, name)
        wait.ignore_not_found(k8s.rbac.delete_cluster_role, name)


# --- acting as the ServiceAccount ----------------------------------------------------------------------------

@contextlib.contextmanager
def _as_user(k8s: Clients, user: str, node_name: str | None = None) -> Iterator[api.ResourceV1Api]:
    """ResourceV1Api impersonating `user` (no group header: the API server adds a ServiceAccount's groups),
    with the node-name extra a pod-bound token carries when `node_name` is given."""
    client = api.ApiClient(keyfiles.load_configuration(k8s.kubeconfig))
    client.set_default_header("Impersonate-User", user)
    if node_name is not None:
        client.set_default_header("Impersonate-Extra-" + NODE_NAME_EXTRA.replace("/", "%2f"), node_name)
    try:
        yield api.ResourceV1Api(client)
    finally:
        client.close()


def _put_status(as_user, claim: Allocated, change: Callable[[dict], None]):
    """PUT the claim's current status with `change` applied, as `as_user`'s user (verb "update")."""
    body = claim.body()
    change(body["status"])
    return as_user.replace_namespaced_resource_claim_status(claim.name, claim.namespace, body)


def _answer(call: Callable[[], object]) -> tuple[int, str]:
    """(HTTP status, message) of a write: 200 when accepted. A 403 from the impersonation itself skips."""
    try:
        call()
    except errors.ApiError as err:
        message = errors.message(err)
        if isinstance(err, errors.Forbidden) and "impersonate" in message:
            pytest.skip(f"the cluster's admin may not impersonate ServiceAccounts or their node-name extra, which "
                        f"these checks act through: {message}")
        return err.status, message
    return 200, ""


def _accepted(what: str, call: Callable[[], object]) -> None:
    """Wait until the write is accepted: a new Role reaches the RBAC authorizer only a moment after its create."""
    last: list[tuple[int, str]] = []

    def attempt() -> bool:
        last[:] = [_answer(call)]
        status, message = last[0]
        if status in (403, 409) or (status == 422 and "Forbidden: changing status" in message):
            return False  # the grant is not in effect yet, or a concurrent write
        assert status == 200, f"{what}: HTTP {status}: {message}"
        return True

    try:
        wait.until(what, attempt, RBAC_TIMEOUT)
    except wait.WaitTimeout:
        pytest.fail(f"{what}: still refused {RBAC_TIMEOUT} s after the grant: HTTP {last[0][0]}: {last[0][1]}",
                    pytrace=False)


def _refused(what: str, call: Callable[[], object], cluster_facts) -> str:
    """The 422 message of a write that authorization must refuse. A 403 (the Role granting
    resourceclaims/status not in effect yet) is retried; an accepted write fails, or skips naming the gate
    when the cluster cannot tell whether the gate is on."""
    last: list[tuple[int, str]] = []

    def attempt() -> bool:
        last[:] = [_answer(call)]
        return last[0][0] not in (403, 409)

    try:
        wait.until(f"{what} to reach the status strategy", attempt, RBAC_TIMEOUT)
    except wait.WaitTimeout:
        pytest.fail(f"{what}: HTTP {last[0][0]} for {RBAC_TIMEOUT} s: {last[0][1]}", pytrace=False)
    status, message = last[0]
    if status == 200 and cluster_facts.gate(GATE) is None:
        pytest.skip(f"{what} was accepted: feature gate {GATE} seems off in the cluster under test")
    assert status == 422, f"{what}: expected 422 Invalid from the status authorization, got HTTP {status}: {message}"
    return message


def _driver_refusal(message: str, driver: str, verbs: str) -> None:
    assert 'status.devices: Forbidden: changing status.devices requires resource="resourceclaims/driver"' in message \
        and f'verb="{verbs}"' in message, message
    assert f'cannot {verbs.strip("[]").split()[0]} resource "resourceclaims/driver"' in message \
        and f'"{driver}"' in message, message


def _append(entry: dict) -> Callable[[dict], None]:
    return lambda status: status.setdefault("devices", []).append(entry)


def _with(body: dict, change: Callable[[dict], None]) -> dict:
    change(body["status"])
    return body


# --- the tests -----------------------------------------------------------------------------------------------

def test_a_driver_grant_lets_a_service_account_write_its_devices_status(k8s: Clients, allocated: Allocated):
    claim = allocated
    user = _service_account(k8s, claim.namespace, "gpu-status", [STATUS_RULE, _driver_rule(claim.gpu, "arbitrary-node:")])
    with _as_user(k8s, user) as as_sa:
        _accepted(f"{user} writing the {claim.gpu} entry of claim {claim.name}",
                  lambda: _put_status(as_sa, claim, _append(claim.entry(claim.gpu, data={"healthy": True}))))
        # a patch (verb "patch", so arbitrary-node:patch) changing the entry's condition
        entry = claim.entry(claim.gpu, condition="Attached", data={"healthy": False})
        as_sa.patch_namespaced_resource_claim_status(claim.name, claim.namespace, {"status": {"devices": [entry]}})
    (written,) = claim.devices()
    result = claim.results[claim.gpu]
    assert (written.driver, written.pool, written.device) == (claim.gpu, result.pool, result.device), \
        f"claim {claim.name}: status.devices entry {written}"
    assert [(c.type, c.status, c.reason) for c in written.conditions] == [("Attached", "True", "Tested")] \
        and written.data == {"healthy": False}, f"claim {claim.name}: status.devices entry {written}"


def test_a_driver_grant_covers_only_that_drivers_entries(k8s: Clients, allocated: Allocated, cluster_facts):
    claim = allocated
    user = _service_account(k8s, claim.namespace, "gpu-status", [STATUS_RULE, _driver_rule(claim.gpu, "arbitrary-node:")])
    with _as_user(k8s, user) as as_sa:
        _accepted(f"{user} writing the {claim.gpu} entry of claim {claim.name}",
                  lambda: _put_status(as_sa, claim, _append(claim.entry(claim.gpu))))
        before = claim.state()
        # the NIC driver's allocated device: a valid entry, refused only for want of that driver's grant
        message = _refused(f"{user} adding the {claim.nic} entry of claim {claim.name}",
                           lambda: _put_status(as_sa, claim, _append(claim.entry(claim.nic))), cluster_facts)
        _driver_refusal(message, claim.nic, "[arbitrary-node:update]")
        assert claim.gpu not in message, message  # its own, unchanged entry is not questioned
        # a made-up driver with the GPU's pool and device: refused the same way (validation adds its own error)
        made_up = {**claim.entry(claim.gpu), "driver": "made-up." + claim.gpu}
        message = _refused(f"{user} adding an entry of driver {made_up['driver']} to claim {claim.name}",
                           lambda: _put_status(as_sa, claim, _append(made_up)), cluster_facts)
        _driver_refusal(message, made_up["driver"], "[arbitrary-node:update]")
        assert claim.state() == before, f"claim {claim.name}: a refused write changed its status"

        # another driver's existing entry (written by the admin) may be kept as it is, not removed
        k8s.resource.replace_namespaced_resource_claim_status(claim.name, claim.namespace, _with(
            claim.body(), _append(claim.entry(claim.nic))))
        _put_status(as_sa, claim, lambda status: status["devices"][0]["conditions"][0].update(reason="Rewritten"))
        assert [(d.driver, d.conditions[0].reason) for d in claim.devices()] == \
            [(claim.gpu, "Rewritten"), (claim.nic, "Tested")], f"claim {claim.name}: {claim.devices()}"
        before = claim.state()
        message = _refused(f"{user} removing the {claim.nic} entry of claim {claim.name}",
                           lambda: _put_status(as_sa, claim, lambda status: status["devices"].pop()), cluster_facts)
        _driver_refusal(message, claim.nic, "[arbitrary-node:update]")
    assert claim.state() == before, f"claim {claim.name}: a refused write changed its status"


def test_status_access_alone_changes_neither_devices_nor_consumers(k8s: Clients, allocated: Allocated, cluster_facts,
                                                                    cluster_rbac):
    claim = allocated
    binding = {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/binding"], "verbs": ["update"]}
    # resourceclaims/binding granted in the namespace only: the check asks cluster-wide, so this must not count
    user = _service_account(k8s, claim.namespace, "status-only", [STATUS_RULE, binding])
    consumer = {"resource": "pods", "name": "not-a-pod", "uid": "00000000-0000-4000-8000-000000000001"}
    before = claim.state()
    with _as_user(k8s, user) as as_sa:
        message = _refused(f"{user} writing the {claim.gpu} entry of claim {claim.name}",
                           lambda: _put_status(as_sa, claim, _append(claim.entry(claim.gpu))), cluster_facts)
        _driver_refusal(message, claim.gpu, "[arbitrary-node:update]")
        add_consumer = lambda: _put_status(as_sa, claim,  # noqa: E731
                                           lambda status: status["reservedFor"].append(consumer))
        message = _refused(f"{user} adding a consumer to status.reservedFor of claim {claim.name}", add_consumer,
                           cluster_facts)
        assert 'status.allocation: Forbidden: changing status.allocation or status.reservedFor requires ' \
               'resource="resourceclaims/binding", verb="update" permission' in message, message
        assert claim.state() == before, f"claim {claim.name}: a refused write changed its status"

        # the same change, once resourceclaims/binding is granted cluster-wide
        cluster_rbac(user, [binding])
        _accepted(f"{user} adding a consumer to status.reservedFor of claim {claim.name} with a ClusterRole",
                  add_consumer)


def test_associated_node_grant_holds_only_on_the_allocated_node(k8s: Clients, allocated: Allocated, cluster_facts):
    claim = allocated
    user = _service_account(k8s, claim.namespace, "node-plugin",
                            [STATUS_RULE, _driver_rule(claim.gpu, "associated-node:")])
    # the allocation names its node (matchFields metadata.name), which the node-name extra must equal
    terms = claim.read().status.allocation.node_selector.node_selector_terms
    assert [f.values for t in terms for f in t.match_fields or []] == [[claim.node]], terms
    with _as_user(k8s, user, node_name=claim.node) as on_node:
        _accepted(f"{user} on node {claim.node} writing the {claim.gpu} entry of claim {claim.name}",
                  lambda: _put_status(on_node, claim, _append(claim.entry(claim.gpu))))
        # on its node both verbs are asked, associated-node first; the NIC driver is granted neither
        message = _refused(f"{user} on node {claim.node} writing the {claim.nic} entry of claim {claim.name}",
                           lambda: _put_status(on_node, claim, _append(claim.entry(claim.nic))), cluster_facts)
        _driver_refusal(message, claim.nic, "[associated-node:update arbitrary-node:update]")
    assert [d.driver for d in claim.devices()] == [claim.gpu], f"claim {claim.name}: {claim.devices()}"
    before = claim.state()
    change = lambda status: status["devices"][0].update(data={"from": "elsewhere"})  # noqa: E731
    other = f"{claim.node}-other"[:63]  # compared by name only: the node need not exist
    with _as_user(k8s, user, node_name=other) as elsewhere:
        message = _refused(f"{user} on node {other} changing the {claim.gpu} entry of claim {claim.name}",
                           lambda: _put_status(elsewhere, claim, change), cluster_facts)
        _driver_refusal(message, claim.gpu, "[arbitrary-node:update]")
    with _as_user(k8s, user) as nowhere:
        message = _refused(f"{user} without a node changing the {claim.gpu} entry of claim {claim.name}",
                           lambda: _put_status(nowhere, claim, change), cluster_facts)
        _driver_refusal(message, claim.gpu, "[arbitrary-node:update]")
    assert claim.state() == before, f"claim {claim.name}: a refused write changed its status"
