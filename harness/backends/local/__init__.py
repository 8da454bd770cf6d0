"""The embedded default backend: the real Kubernetes control plane as local processes, KWOK nodes.

The backend itself is `harness.backends.local.backend.LocalBackend` (registered in harness.backends).
This package imports none of its modules, so that a caller needing only the cluster state (`state`),
process records (`process`) or the vendor plugins (`vendor_plugin`) does not load the whole backend."""
