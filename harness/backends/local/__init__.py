"""The embedded default backend: the real Kubernetes control plane as local processes, KWOK nodes."""

from harness.backends.local.backend import LocalBackend

__all__ = ["LocalBackend"]
