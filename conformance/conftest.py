"""Fixtures shared by the conformance tests (the cluster fixtures come from the dra-harness plugin)."""

from __future__ import annotations

import pytest

from harness.k8s.client import Clients

KWOK_ANNOTATION = "kwok.x-k8s.io/node"


@pytest.fixture(scope="session")
def simulated_node(k8s: Clients) -> str:
    """A Ready KWOK node: pods bound there run without a kubelet or a node-side driver."""
    from harness.backends.local.nodes import is_ready

    for node in k8s.core.list_node().items:
        if (node.metadata.annotations or {}).get(KWOK_ANNOTATION) == "fake" and is_ready(node):
            return node.metadata.name
    pytest.skip("needs a simulated (KWOK) node; the cluster under test has none")
