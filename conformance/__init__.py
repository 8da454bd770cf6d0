"""dra-harness conformance suite: DRA behaviour checked against a real Kubernetes 1.37 cluster."""
