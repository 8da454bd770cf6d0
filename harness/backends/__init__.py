"""Cluster backends, chosen by name through one registry. `local` (real control plane + KWOK nodes)
is the embedded default; `kind` runs real kubelets in Docker; `existing` uses a cluster the user owns.

Callers never switch on a backend's name: they call `get(name)` and use the `Backend` interface
(harness.backends.base). A backend's module is imported only when it is chosen."""

from __future__ import annotations

import importlib

from harness.backends.base import Backend
from harness.errors import ConfigError, Problem
from harness.progress import Reporter

# name -> "module:class"; a new backend is one line here plus its module.
REGISTRY: dict[str, str] = {
    "local": "harness.backends.local.backend:LocalBackend",
    "kind": "harness.backends.kind:KindBackend",
    "existing": "harness.backends.existing:ExistingBackend",
}
BACKENDS = tuple(REGISTRY)


def backend_class(name: str, flag: str = "--backend") -> type[Backend]:
    """The class registered under `name`; a ConfigError naming `flag` for an unknown name."""
    if name not in REGISTRY:
        raise ConfigError([Problem(flag, name, "unknown backend", ", ".join(BACKENDS))])
    module, _, attribute = REGISTRY[name].partition(":")
    found = getattr(importlib.import_module(module), attribute)
    assert issubclass(found, Backend), f"{REGISTRY[name]} is not a Backend"
    return found


def get(name: str, reporter: Reporter | None = None, flag: str = "--backend") -> Backend:
    return backend_class(name, flag)(reporter)
