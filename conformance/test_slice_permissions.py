"""Per-node ResourceSlice permissions (upstream test/e2e/dra: "per-node permission checks").

A kubelet plugin that publishes with its node's credentials may write only its own node's slices: the
Node authorizer (k8s.io/kubernetes v1.37.2 plugin/pkg/auth/authorizer/node, authorizeResourceSlice)
lets a node create slices, get/update/delete only slices tied to it, and list/watch only with a
`spec.nodeName=<itself>` field selector; the NodeRestriction admission plugin (admitResourceSlice)
refuses a create or delete whose `spec.nodeName` is another node's or unset (allNodes, a node selector).

The node's identity is taken by impersonation (user `system:node:<name>`, group `system:nodes`), which
is exactly what both checks read, so any cluster whose admin may impersonate can run this; the node
need not run a kubelet. A cluster that does not authorize nodes this way is skipped, naming why.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from fake_devices import keyfiles
from harness.k8s import api, errors, wait
from harness.k8s.client import Clients

pytestmark = pytest.mark.dra_feature("DynamicResourceAllocation", maturity="ga")


@contextlib.contextmanager
def _as_node(k8s: Clients, node: str) -> Iterator[api.ResourceV1Api]:
    client = api.ApiClient(keyfiles.load_configuration(k8s.kubeconfig))
    client.set_default_header("Impersonate-User", f"system:node:{node}")
    client.set_default_header("Impersonate-Group", "system:nodes")
    try:
        yield api.ResourceV1Api(client)
    finally:
        client.close()


def _slice(name: str, driver: str, node: str | None) -> dict:
    spec: dict = {"driver": driver, "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
                  "devices": [{"name": "dev-0"}]}
    if node is None:
        spec["allNodes"] = True
    else:
        spec["nodeName"] = node
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name}, "spec": spec}


GRAPH_TIMEOUT = 60  # the authorizer's graph lags the create by milliseconds; seconds on a loaded machine


def _readable(as_node, name: str, node: str):
    """The node's own new slice, as soon as the Node authorizer lets the node read it."""
    def read():
        try:
            return as_node.read_resource_slice(name)
        except errors.Forbidden as err:
            if "no relationship found" in (err.body or ""):
                return None  # the graph has not seen the slice yet
            raise

    try:
        return wait.until(f"node {node} to be allowed to read its own ResourceSlice {name}", read, GRAPH_TIMEOUT)
    except wait.WaitTimeout:
        pytest.fail(f"node {node} created ResourceSlice {name} but was still refused reading it {GRAPH_TIMEOUT} s "
                    "later (Node authorizer: no relationship between the node and its own slice)", pytrace=False)


def _refused(call, *args, **kwargs) -> str:
    """The API's 403 message for a call that must be refused; fails naming the call when it is not."""
    try:
        call(*args, **kwargs)
    except errors.ApiError as err:
        assert isinstance(err, errors.Forbidden), f"{call.__name__}: expected 403 Forbidden, got {err.status}: {err.body}"
        return str(err.body)
    raise AssertionError(f"{call.__name__}{args}: allowed, but a node may not do this")


@pytest.fixture
def slices(k8s: Clients, unique_name):
    """`slices.name(kind)`: a unique slice name, removed at teardown by the admin whoever created it."""
    made: list[str] = []

    class Names:
        driver = unique_name("perm") + ".example.com"

        @staticmethod
        def name(kind: str) -> str:
            made.append(unique_name(f"perm-{kind}"))
            return made[-1]

    yield Names
    for name in made:
        wait.ignore_not_found(k8s.resource.delete_resource_slice, name)


def test_a_node_writes_only_its_own_resource_slices(k8s: Clients, slices):
    node = sorted(n.metadata.name for n in k8s.core.list_node().items)[0]
    other = f"{node}-other"[:63]  # NodeRestriction compares names: the other node need not exist
    with _as_node(k8s, node) as as_node:
        own = slices.name("own")
        try:
            as_node.create_resource_slice(_slice(own, slices.driver, node))
        except errors.Forbidden as err:
            pytest.skip(f"the cluster under test does not let node {node} publish its own ResourceSlice "
                        f"(no Node authorizer/NodeRestriction as 1.37 defines them?): {err.body}")
        # Reading and changing its own slice: allowed, once the Node authorizer's graph (fed by an
        # informer, so a moment behind the create) relates the new slice to the node.
        assert _readable(as_node, own, node).spec.node_name == node
        as_node.patch_resource_slice(own, {"spec": {"devices": [{"name": "dev-0"}, {"name": "dev-1"}]}})
        listed = as_node.list_resource_slice(field_selector=f"spec.nodeName={node}").items
        assert own in {s.metadata.name for s in listed}

        # Another node's slice, or one for all nodes: refused at create, by NodeRestriction.
        message = _refused(as_node.create_resource_slice, _slice(slices.name("other"), slices.driver, other))
        assert "can only create ResourceSlice with the same NodeName as the requesting node" in message, message
        _refused(as_node.create_resource_slice, _slice(slices.name("all"), slices.driver, None))

        # A slice of another node that exists (made by the admin): not readable, changeable or deletable.
        theirs = slices.name("theirs")
        k8s.resource.create_resource_slice(_slice(theirs, slices.driver, other))
        _refused(as_node.read_resource_slice, theirs)
        _refused(as_node.patch_resource_slice, theirs, {"metadata": {"labels": {"touched": "yes"}}})
        _refused(as_node.delete_resource_slice, theirs)
        # Listing is only for its own slices.
        _refused(as_node.list_resource_slice)
        _refused(as_node.list_resource_slice, field_selector=f"spec.nodeName={other}")

        as_node.delete_resource_slice(own)
    assert k8s.resource.read_resource_slice(theirs).metadata.labels is None  # untouched
    assert not k8s.resource.list_resource_slice(field_selector=f"metadata.name={own}").items
