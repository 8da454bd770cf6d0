"""Fixtures of the integration tests (cluster fixtures come from the dra-harness plugin)."""

from conformance.conftest import simulated_node  # noqa: F401  (a Ready KWOK node of the cluster)
