"""Where the Kubernetes client's copies of a kubeconfig's embedded certificates and keys go.

The client library cannot hand certificate *data* to urllib3: it writes `client-key-data` and friends
to files first, by default loose in /tmp, and deletes them only in an atexit handler. A process that
is killed (SIGKILL, an xdist worker that leaves with os._exit) leaves a private key behind in /tmp.
So every harness process gives the library a directory of its own under the state root; the
directory is removed at exit, and the first harness process that needs one removes those whose
process is gone.
"""

from __future__ import annotations

import atexit
import os
import shutil
from pathlib import Path

import kubernetes
import psutil

from harness.core import paths

DIRECTORY = "client-keys"  # under the state root: one subdirectory per process, named <pid>-<start time>
_mine: tuple[int, Path] | None = None  # (pid, directory): a forked child makes its own


def root() -> Path:
    return paths.state_root() / DIRECTORY


def directory() -> Path:
    """This process's directory (made on first use, 0700)."""
    global _mine
    if _mine is None or _mine[0] != os.getpid() or not _mine[1].is_dir():
        remove_stale()
        me = psutil.Process()
        mine = root() / f"{me.pid}-{me.create_time():.2f}"
        mine.mkdir(parents=True, mode=0o700, exist_ok=True)
        _mine = (me.pid, mine)
        atexit.register(_remove_own, me.pid, mine)
    return _mine[1]


def _remove_own(pid: int, mine: Path) -> None:
    if os.getpid() == pid:  # not in a forked child, whose parent still uses it
        shutil.rmtree(mine, ignore_errors=True)


def _owner_alive(name: str) -> bool:
    pid, _, started = name.partition("-")
    try:
        proc = psutil.Process(int(pid))
        return abs(proc.create_time() - float(started)) < 1.0 and proc.status() != psutil.STATUS_ZOMBIE
    except (ValueError, psutil.Error):
        return False


def remove_stale() -> list[Path]:
    """Remove the directories of processes that are gone; return them."""
    removed: list[Path] = []
    try:
        candidates = list(root().iterdir())
    except OSError:
        return removed
    for candidate in candidates:
        if candidate.is_dir() and not _owner_alive(candidate.name):
            shutil.rmtree(candidate, ignore_errors=True)
            removed.append(candidate)
    return removed


def load_configuration(kubeconfig: Path | str,
                       configuration: kubernetes.client.Configuration | None = None) -> kubernetes.client.Configuration:
    """The client configuration of a kubeconfig's current context, its key files in `directory()`."""
    configuration = configuration or kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration,
                                       temp_file_path=str(directory()))
    return configuration
