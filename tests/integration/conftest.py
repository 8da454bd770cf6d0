"""Fixtures of the integration tests (cluster fixtures come from the dra-harness plugin)."""

from conformance.conftest import simulated_node, simulated_nodes  # noqa: F401  (Ready KWOK nodes of the cluster)
