"""Where the Kubernetes client's copies of a kubeconfig's embedded certificates and keys go.

The client library cannot hand certificate *data* to urllib3: it writes `client-key-data` and friends
to files first, by default loose in /tmp, and deletes them only in an atexit handler. A process that
is killed (SIGKILL: a crash test, a plugin killed on purpose) leaves a private key behind in /tmp.
So every process of the project (harness, fake driver, kubelet plugin, health monitor, locust) gives
the library a directory of its own, `$TMPDIR/dra-harness-keys-<uid>/<pid>-<start tick>` (0700); it is
removed at exit, and the next process that needs one removes those whose process is gone.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import kubernetes

PREFIX = "dra-harness-keys-"  # + uid, in TMPDIR: one subdirectory per process, named <pid>-<start tick>
_mine: tuple[int, Path] | None = None  # (pid, directory): a forked child makes its own


def root() -> Path:
    return Path(tempfile.gettempdir()) / f"{PREFIX}{os.getuid()}"


def directory() -> Path:
    """This process's directory (made on first use, 0700)."""
    global _mine
    if _mine is None or _mine[0] != os.getpid() or not _mine[1].is_dir():
        remove_stale()
        pid = os.getpid()
        base = root()
        base.mkdir(mode=0o700, exist_ok=True)
        if base.is_symlink() or base.stat().st_uid != os.getuid():  # not ours (made first by another user)
            base = Path(tempfile.mkdtemp(prefix=PREFIX))
        mine = base / f"{pid}-{started(pid)}"
        mine.mkdir(mode=0o700, exist_ok=True)
        _mine = (pid, mine)
        atexit.register(_remove_own, pid, mine)
    return _mine[1]


def _remove_own(pid: int, mine: Path) -> None:
    if os.getpid() == pid:  # not in a forked child, whose parent still uses it
        shutil.rmtree(mine, ignore_errors=True)


def started(pid: int) -> str | None:
    """When process `pid` started, in clock ticks since boot (field 22 of /proc/<pid>/stat: tells it
    from a later process with the same pid); None when it is gone or a zombie. (/proc, not psutil: the
    fake driver's image has no psutil.)"""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # after the command name, which may hold spaces
    return None if fields[0] == "Z" else fields[19]


def _owner_alive(name: str) -> bool:
    pid, _, ticks = name.partition("-")
    return pid.isdigit() and started(int(pid)) == ticks


def remove_stale() -> list[Path]:
    """Remove the directories of processes that are gone; return them."""
    removed: list[Path] = []
    if started(os.getpid()) is None:  # no /proc here: no process can be told apart, so none is judged
        return removed
    try:
        if root().is_symlink() or root().stat().st_uid != os.getuid():
            return removed  # not ours to sweep
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
