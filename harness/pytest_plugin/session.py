"""One cluster per pytest run, shared by all xdist workers.

Why shared: starting a control plane costs ~10 s and ~1 GiB of memory, and these machines have two
cores; one cluster per worker would spend the run starting clusters. Tests stay isolated through
their own namespaces and uniquely named cluster-scoped objects (see the plugin's fixtures).

How: the controller (the process without `workerinput`) makes a shared directory and hands it to
the workers. The first process that needs the cluster starts it under a file lock and writes
`cluster.json` (the typed cluster record, harness.core.records); the others read it. A failed start writes `error.txt`, so every worker fails at once
with the same message instead of retrying. The controller tears the cluster down at session end
(also after Ctrl-C), because only it outlives all the workers. Without xdist, one process plays both
roles. No cluster is started if no test asks for one.

A job that started the cluster itself (`dra-harness run`) hands its record over by path
(`--dra-cluster-record`): the run attaches to it and never tears it down.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path

from harness import backends
from harness.backends.base import ClusterSpec
from harness.core import proctime
from harness.core.errors import HarnessError
from harness.core.files import write_atomic
from harness.core.locking import file_lock
from harness.core.progress import Reporter
from harness.core.records import ClusterInfo, read_cluster, write_cluster


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
    cluster_record: str | None = None  # a cluster record a job wrote: attach to that cluster


SHARED_PREFIX = "dra-harness-pytest-"
OWNER_FILE = "owner.json"  # the controller process that made the directory (pid and start time)
LEGACY_AGE = 86400.0  # a directory without an owner record (older versions) counts as stale after a day


def new_shared_dir() -> Path:
    """A fresh shared directory, recording its controller; first the stale ones of runs that were killed
    before their clean-up (owner gone) are removed."""
    remove_stale_shared_dirs()
    shared = Path(tempfile.mkdtemp(prefix=SHARED_PREFIX))
    write_atomic(shared / OWNER_FILE, json.dumps(proctime.identity()))
    return shared


def remove_stale_shared_dirs(root: Path | None = None) -> list[Path]:
    """Remove this user's shared directories whose controller is gone (a run killed with SIGKILL, or
    stopped before pytest ran its clean-up). Returns what was removed."""
    removed = []
    for candidate in Path(root or tempfile.gettempdir()).glob(SHARED_PREFIX + "*"):
        try:
            if not candidate.is_dir() or candidate.stat().st_uid != os.geteuid():
                continue
            owner = candidate / OWNER_FILE
            if owner.is_file():
                stale = not proctime.identity_running(json.loads(owner.read_text() or "{}"))
            else:
                stale = time.time() - candidate.stat().st_mtime > LEGACY_AGE
        except (OSError, ValueError):
            continue  # vanished meanwhile, or unreadable: not ours to judge
        if stale:
            shutil.rmtree(candidate, ignore_errors=True)
            removed.append(candidate)
    return removed


def new_run_id() -> str:
    return uuid.uuid4().hex[:8]


OWNED_MARK = "owned"  # in the shared directory: this run started the cluster and stops it at the end


def acquire_cluster(shared: Path, options: SessionOptions, run_id: str) -> ClusterInfo:
    """Return the run's cluster, starting it if this is the first process to ask."""
    with file_lock(shared / "lock"):
        info_file, error_file = shared / "cluster.json", shared / "error.txt"
        if error_file.exists():
            raise HarnessError("the test cluster failed to start (in another worker):\n" + error_file.read_text())
        if info_file.exists():
            return read_cluster(info_file)
        try:
            info, owned = _start_or_attach(options, run_id, shared)
        except BaseException as err:
            error_file.write_text(str(err) or type(err).__name__)
            raise
        if owned:
            (shared / OWNED_MARK).touch()
        write_cluster(info, info_file)
        return info


def release_cluster(shared: Path, options: SessionOptions, reporter: Reporter | None = None) -> list[str]:
    """Tear down the cluster if this run started it. Returns leftovers (normally none)."""
    info_file = shared / "cluster.json"
    leftovers: list[str] = []
    if info_file.exists() and (shared / OWNED_MARK).exists() and not options.keep_cluster:
        info = read_cluster(info_file)
        leftovers = backends.get(info.backend, reporter).down(info.name)
    shutil.rmtree(shared, ignore_errors=True)
    return leftovers


def _controller(shared: Path) -> dict | None:
    """The identity of the run's controller (it tears the cluster down, so the cluster ends with it)."""
    try:
        return json.loads((shared / OWNER_FILE).read_text())
    except (OSError, ValueError):
        return None


def _start_or_attach(options: SessionOptions, run_id: str, shared: Path) -> tuple[ClusterInfo, bool]:
    if options.cluster_record:  # the job that started the cluster owns it
        return read_cluster(Path(options.cluster_record).expanduser()), False
    backend = backends.get(options.backend, Reporter(), flag="--dra-backend")
    if backend.attaches:  # a cluster the user gives: attach, make nothing
        if not options.kubeconfig:
            raise HarnessError(f"--dra-backend {options.backend} needs --kubeconfig (or the KUBECONFIG variable)")
        return backends.attach(options.kubeconfig), False
    if options.cluster_name and options.cluster_name in backend.list():
        status = backend.status(options.cluster_name)
        if status.health != "running":
            raise HarnessError(f"cluster {options.cluster_name!r} exists but is {status.health}",
                               hint=f"run `dra-harness cluster down --backend {backend.name} "
                                    f"--name {options.cluster_name}`")
        return backend.info(options.cluster_name), False
    real_nodes, reason = backend.resolve_real_nodes(options.real_nodes, "--dra-real-nodes")
    info = backend.up(ClusterSpec(owner=None if options.keep_cluster else _controller(shared),
                                  name=options.cluster_name or f"pytest-{run_id}", nodes=options.nodes,
                                  preset=options.preset, feature_gates=options.feature_gates, real_nodes=real_nodes,
                                  binaries_dir=Path(options.binaries_dir) if options.binaries_dir else None))
    return replace(info, real_nodes_reason=reason), True
