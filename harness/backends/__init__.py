"""Cluster backends. `local` (real control plane + KWOK nodes) is the embedded default; `kind` runs
real kubelets in Docker; `existing` uses a cluster the user owns."""

from __future__ import annotations

from harness.errors import ConfigError, Problem

BACKENDS = ("local", "kind", "existing")


def get(name: str, reporter=None):
    if name == "local":
        from harness.backends.local import LocalBackend

        return LocalBackend(reporter)
    if name == "kind":
        from harness.backends.kind import KindBackend

        return KindBackend(reporter)
    if name == "existing":
        from harness.backends.existing import ExistingBackend

        return ExistingBackend(reporter)
    raise ConfigError([Problem("--backend", name, "unknown backend", ", ".join(BACKENDS))])
