"""dra-harness: run Kubernetes 1.37 DRA for real on one machine, emulate hardware, check conformance."""

__version__ = "0.1.0"
