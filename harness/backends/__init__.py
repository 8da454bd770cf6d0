"""Cluster backends, chosen by name through one registry. `local` (real control plane + KWOK nodes)
is the embedded default; `kind` runs real kubelets in Docker; `existing` uses a cluster the user owns.

Callers never switch on a backend's name: they call `get(name)` and use the `Backend` interface
(harness.backends.base). A backend's module is imported only when it is chosen (`local.state`, the local
clusters' records, is small and imported here). `attach(kubeconfig)`
gives the record of a cluster the user names by kubeconfig (used by `run` and the pytest session)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from pathlib import Path

from harness.backends.base import Backend, ClusterInfo
from harness.backends.common import kubeconfig_endpoint
from harness.backends.local import state
from harness.core.errors import ConfigError, Problem
from harness.core.progress import Reporter

# name -> "module:class"; a new backend is one line here plus its module.
REGISTRY: dict[str, str] = {
    "local": "harness.backends.local.backend:LocalBackend",
    "kind": "harness.backends.kind.backend:KindBackend",
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


def uses_flag(backend: type[Backend], flag: str) -> bool:
    """Whether `backend` reads this `cluster up` flag (Backend.spec_flags)."""
    return flag in backend.spec_flags


def unused_flags(chosen: str, given: Mapping[str, object],
                 uses: Callable[[type[Backend], str], bool] = uses_flag) -> list[Problem]:
    """A Problem for each flag of `given` (flag -> the value the user gave; None, "" or False when not
    given) that backend `chosen` does not use, naming the backends that do: refused, not ignored."""
    backend = backend_class(chosen)
    return [Problem(flag, str(value), f"not used by --backend {chosen}",
                    "--backend " + " or ".join(name for name in BACKENDS if uses(backend_class(name), flag)))
            for flag, value in given.items() if not _unset(value) and not uses(backend, flag)]


def _unset(value: object) -> bool:
    return value is None or value is False or value == ""  # 0 is a value: `--nodes 0` was given


def get(name: str, reporter: Reporter | None = None, flag: str = "--backend") -> Backend:
    return backend_class(name, flag)(reporter)


def attach(kubeconfig: str, where: str = "--kubeconfig") -> ClusterInfo:
    """The record of a cluster the user gives by kubeconfig (nothing of it is started or stopped)."""
    path = Path(kubeconfig).expanduser()
    name, server = kubeconfig_endpoint(path, where)
    local = _local_cluster(path)
    if local is not None:  # a local cluster of this machine: its record names its real nodes and logs
        return local
    return ClusterInfo(name=name, backend="existing", kubeconfig=path, server=server)


def _local_cluster(kubeconfig: Path) -> ClusterInfo | None:
    try:
        found = state.find_by_kubeconfig(kubeconfig)
        return get("local").info(found.name) if found is not None else None
    except Exception:  # a half-written record of a cluster being made or removed: attach as any cluster
        return None
