"""Who may use a real node: the tests of a run (pytest-xdist workers) share it; a kubelet restart or a node
reboot needs it alone, since either breaks the pods of every other test there.

Three flock(2) files in the node's directory, each taken through its own open file:
- users.lock: shared by every user with plugins or pods on the node, exclusive while the node restarts.
- disrupt.lock: held by a user that will restart the node, from before it takes its share until it is
  done. Two such users holding shares would each wait for the other's to go; and a failed upgrade of a
  share drops the share first (flock(2): conversion is not atomic), which once let a node reboot in
  while another test's pod ran after a kubelet restart (CI, 2026-12-06). Only the holder of this lock
  ever asks for users.lock exclusively.
- turnstile.lock: the restarting user holds it while it waits for the others to go, and a new user passes
  it before taking a share, so a stream of short tests cannot keep a restart waiting forever.

The cluster's supervisor and the suite's component watch ask `restarting()` before they call a real node's
kubelet or containerd dead: during a restart it is down on purpose.
"""

from __future__ import annotations

import fcntl
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from harness.core.errors import ComponentError, HarnessError
from harness.core.nodelayout import RealNodeRecord

WAIT = 600.0  # how long a user waits for a restart, and a restart for the node's other users


class NodeUse:
    """One user's hold on a real node: `share()` while it runs things there, `alone()` to restart it, and
    `will_disrupt()` first when it will do both. `release()` gives everything back."""

    def __init__(self, record: RealNodeRecord | None = None, *, name: str = "", lock_dir: Path | None = None):
        """The local backend's real node (`record`), or any node by `name` with its lock files in `lock_dir`
        (the kind backend's workers: the files are the harness's, on this machine, not the node's)."""
        self.name = record.name if record is not None else name
        lock_dir = record.dirs.base if record is not None else lock_dir
        assert self.name and lock_dir is not None, "NodeUse needs a node record, or a name and a lock directory"
        self.lock_dir: Path = lock_dir
        self._share: IO[str] | None = None
        self._disrupt: IO[str] | None = None

    @property
    def sharing(self) -> bool:
        return self._share is not None

    def will_disrupt(self, wait: float = WAIT) -> None:
        """Say, before taking a share, that this user will restart the node: waits for any other such user."""
        if self._disrupt is not None:
            return
        if self._share is not None:
            raise HarnessError(
                f"a user of real node {self.name} asked to restart it after it took its share of the node "
                "without saying it would: call will_disrupt() first (in the suite: mark the test "
                "@pytest.mark.disrupts_node), or two restarting tests could wait for each other")
        self._disrupt = _locked(self.lock_dir, "disrupt.lock", fcntl.LOCK_EX, wait,
                                f"another test that restarts {self.name} to finish")

    def share(self, wait: float = WAIT) -> None:
        """Count as a user until release(): the node is not restarted under this user's pods."""
        if self._share is not None:
            return
        with _held(self.lock_dir, "turnstile.lock", fcntl.LOCK_SH, wait, f"a restart of {self.name} to finish"):
            self._share = _locked(self.lock_dir, "users.lock", fcntl.LOCK_SH, wait,
                                  f"a restart of {self.name} to finish")

    @contextmanager
    def alone(self, wait: float = WAIT) -> Iterator[None]:
        """The node to this user alone: waits (at most `wait`) for every other user's share to go and keeps new
        ones out meanwhile; this user's share, if any, stays."""
        self.will_disrupt(wait)
        self.share(wait)
        assert self._share is not None
        with _held(self.lock_dir, "turnstile.lock", fcntl.LOCK_EX, wait, f"new users of {self.name} to settle"):
            try:
                _flock(self._share, fcntl.LOCK_EX, wait, f"the other tests using {self.name} to finish")
                yield
            finally:
                # back to an ordinary user (also after a failed upgrade: it dropped the share)
                fcntl.flock(self._share, fcntl.LOCK_SH)

    def release(self) -> None:
        for handle in (self._share, self._disrupt):
            if handle is not None:
                handle.close()  # releases its lock
        self._share = self._disrupt = None


def restarting(record: RealNodeRecord) -> bool:
    """Whether a user has the node alone now, or waits to have it (a kubelet restart, a node reboot under
    way): its kubelet or containerd may be down on purpose. Looks without waiting and holds nothing."""
    for name, operation in (("turnstile.lock", fcntl.LOCK_SH), ("users.lock", fcntl.LOCK_SH)):
        try:
            with open(record.dirs.base / name, "a") as handle:
                fcntl.flock(handle, operation | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError:
            return False  # no node directory (any more): nobody restarts it
    return False


def _locked(lock_dir: Path, name: str, operation: int, wait: float, what: str) -> IO[str]:
    handle = open(lock_dir / name, "a")
    try:
        _flock(handle, operation, wait, what)
    except BaseException:
        handle.close()
        raise
    return handle


@contextmanager
def _held(lock_dir: Path, name: str, operation: int, wait: float, what: str) -> Iterator[None]:
    handle = _locked(lock_dir, name, operation, wait, what)
    try:
        yield
    finally:
        handle.close()


def _flock(handle: IO[str], operation: int, wait: float, what: str) -> None:
    """flock with a deadline (a plain blocking flock could wait forever)."""
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(handle, operation | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise ComponentError("real node", f"waited {wait:.0f}s for {what} ({handle.name})") from None
            time.sleep(0.2)
