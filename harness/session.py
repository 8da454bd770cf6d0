"""One cluster per pytest run, shared by all xdist workers.

Why shared: starting a control plane costs ~10 s and ~1 GiB of memory, and these machines have two
cores; one cluster per worker would spend the run starting clusters. Tests stay isolated through
their own namespaces and uniquely named cluster-scoped objects (see the plugin's fixtures).

How: the controller (the process without `workerinput`) makes a shared directory and hands it to
the workers. The first process that needs the cluster starts it under a file lock and writes
`cluster.json`; the others read it. A failed start writes `error.txt`, so every worker fails at once
with the same message instead of retrying. The controller tears the cluster down at session end
(also after Ctrl-C), because only it outlives all the workers. Without xdist, one process plays both
roles. No cluster is started if no test asks for one.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

from harness.backends.base import ClusterInfo
from harness.locking import file_lock
from harness.errors import HarnessError


@dataclass(frozen=True)
class SessionOptions:
    backend: str = "local"
    kubeconfig: str | None = None
    cluster_name: str | None = None
    keep_cluster: bool = False
    nodes: int = 3
    preset: str | None = None
    feature_gates: str = ""
    binaries_dir: str | None = None
    real_nodes: str = "auto"  # local backend: "auto" (1 where the machine can host one, else 0) or a count


NO_REAL_NODE_ENV = "DRA_HARNESS_NO_REAL_NODE_REASON"  # set by `dra-harness run` for the suite it starts


def resolve_real_nodes(value: str) -> tuple[int, str]:
    """How many real nodes to start for `--dra-real-nodes value`, and why none when none."""
    from harness.backends.local.realnode import preflight

    if value != "auto":
        try:
            count = int(value)
        except ValueError:
            raise HarnessError(f"real nodes {value!r}: not a number", hint="use auto, 0, 1, ...") from None
        return count, "" if count else "no real node was asked for (real nodes: 0)"
    problems = preflight.problems()
    return (0, "this machine cannot run a real node: " + "; ".join(problems)) if problems else (1, "")


def new_shared_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="dra-harness-pytest-"))


def new_run_id() -> str:
    return uuid.uuid4().hex[:8]


def acquire_cluster(shared: Path, options: SessionOptions, run_id: str) -> ClusterInfo:
    """Return the run's cluster, starting it if this is the first process to ask."""
    with file_lock(shared / "lock"):
        info_file, error_file = shared / "cluster.json", shared / "error.txt"
        if error_file.exists():
            raise HarnessError("the test cluster failed to start (in another worker):\n" + error_file.read_text())
        if info_file.exists():
            return _info_from_json(json.loads(info_file.read_text()))
        try:
            info, owned = _start_or_attach(options, run_id)
        except BaseException as err:
            error_file.write_text(str(err) or type(err).__name__)
            raise
        info_file.write_text(json.dumps({"name": info.name, "backend": info.backend, "kubeconfig": str(info.kubeconfig),
                                         "server": info.server, "metrics": info.metrics, "owned": owned,
                                         "directory": str(info.directory) if info.directory else None,
                                         "realNodesReason": info.real_nodes_reason}))
        return info


def release_cluster(shared: Path, options: SessionOptions, reporter=None) -> list[str]:
    """Tear down the cluster if this run started it. Returns leftovers (normally none)."""
    info_file = shared / "cluster.json"
    leftovers: list[str] = []
    if info_file.exists():
        data = json.loads(info_file.read_text())
        if data.get("owned") and not options.keep_cluster:
            from harness import backends

            leftovers = backends.get(data["backend"], reporter).down(data["name"])
    shutil.rmtree(shared, ignore_errors=True)
    return leftovers


def _start_or_attach(options: SessionOptions, run_id: str) -> tuple[ClusterInfo, bool]:
    if options.backend == "existing":
        if not options.kubeconfig:
            raise HarnessError("--dra-backend existing needs --kubeconfig (or the KUBECONFIG variable)")
        info = existing_cluster(options.kubeconfig)
        return dataclasses.replace(info, real_nodes_reason=os.environ.get(NO_REAL_NODE_ENV, "")), False
    if options.backend == "kind":
        from harness.backends.kind import KindBackend, KindUpOptions
        from harness.progress import Reporter

        info = KindBackend(Reporter()).up(KindUpOptions(name=options.cluster_name or f"pytest-{run_id}",
                                                        nodes=options.nodes, preset=options.preset,
                                                        feature_gates=options.feature_gates))
        return info, True
    if options.backend != "local":
        raise HarnessError(f"unknown --dra-backend {options.backend!r}", hint="use local, kind or existing")
    from harness.backends.local import LocalBackend
    from harness.backends.local.backend import UpOptions
    from harness.backends.local import state
    from harness.progress import Reporter

    backend = LocalBackend(Reporter())
    if options.cluster_name and state.cluster_dir(options.cluster_name).exists():
        status = backend.status(options.cluster_name)
        if status.health != "running":
            raise HarnessError(f"cluster {options.cluster_name!r} exists but is {status.health}",
                               hint=f"run `dra-harness cluster down --name {options.cluster_name}`")
        return backend.info(options.cluster_name), False
    name = options.cluster_name or f"pytest-{run_id}"
    real_nodes, reason = resolve_real_nodes(options.real_nodes)
    info = backend.up(UpOptions(name=name, nodes=options.nodes, preset=options.preset,
                                feature_gates=options.feature_gates, real_nodes=real_nodes,
                                binaries_dir=Path(options.binaries_dir) if options.binaries_dir else None))
    return dataclasses.replace(info, real_nodes_reason=reason), True


def existing_cluster(kubeconfig: str) -> ClusterInfo:
    import yaml

    path = Path(kubeconfig).expanduser()
    try:
        config = yaml.safe_load(path.read_text())
        context = next(c["context"] for c in config["contexts"] if c["name"] == config["current-context"])
        server = next(c["cluster"]["server"] for c in config["clusters"] if c["name"] == context["cluster"])
    except (OSError, KeyError, StopIteration, TypeError, yaml.YAMLError) as err:
        raise HarnessError(f"cannot read kubeconfig {path}: {err}") from None
    return ClusterInfo(name=config["current-context"], backend="existing", kubeconfig=path, server=server)


def _info_from_json(data: dict) -> ClusterInfo:
    return ClusterInfo(name=data["name"], backend=data["backend"], kubeconfig=Path(data["kubeconfig"]),
                       server=data["server"], metrics=data.get("metrics", {}),
                       directory=Path(data["directory"]) if data.get("directory") else None,
                       real_nodes_reason=data.get("realNodesReason", ""))
