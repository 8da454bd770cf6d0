"""Cluster backends. `local` (real control plane + KWOK nodes) is the embedded default."""

from __future__ import annotations

from harness.errors import ConfigError, Problem

BACKENDS = ("local",)


def get(name: str, reporter=None):
    if name == "local":
        from harness.backends.local import LocalBackend

        return LocalBackend(reporter)
    raise ConfigError([Problem("--backend", name, "unknown backend", ", ".join(BACKENDS))])
