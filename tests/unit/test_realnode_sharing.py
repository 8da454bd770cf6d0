"""Who may use a real node (harness/backends/local/realnode/sharing.py): users share it, a restart has it
alone. Every NodeUse opens its own lock files, so two of them in one process behave as two tests of two
xdist workers would."""

from __future__ import annotations

import fcntl
import threading
import time
from pathlib import Path

import pytest

from harness.backends.local.realnode import plugins
from harness.backends.local.realnode.sharing import NodeUse
from harness.core.errors import ComponentError, HarnessError
from harness.core.nodelayout import RealNodeRecord


@pytest.fixture
def record(tmp_path: Path) -> RealNodeRecord:
    (tmp_path / "node").mkdir()
    return RealNodeRecord(name="real-node-0", id="0123abcd", directory=str(tmp_path / "node"), bridge="drh-0123abcd",
                          subnet="10.202.41.0/24", address="10.202.41.1", kubelet_port=20001, healthz_port=20002)


def _free(record: RealNodeRecord, name: str, operation: int = fcntl.LOCK_EX) -> bool:
    """Whether a newcomer could take `name` now (its own open file, as another process would)."""
    with open(record.dirs.base / name, "a") as handle:
        try:
            fcntl.flock(handle, operation | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False


def test_a_restart_waits_for_the_other_users_and_keeps_its_own_share(record):
    user, restarter = NodeUse(record), NodeUse(record)
    user.share()
    restarter.will_disrupt()
    restarter.share()
    with pytest.raises(ComponentError, match="waited 0s for the other tests using real-node-0 to finish"):
        with restarter.alone(wait=0.3):
            pytest.fail("had the node alone while another user held a share")
    # Linux drops a share on a failed upgrade (flock(2)); the restarter must hold it again afterwards
    user.release()
    assert not _free(record, "users.lock"), "the restarter lost its share of the node after a failed upgrade"
    with restarter.alone(wait=1):
        assert not _free(record, "users.lock", fcntl.LOCK_SH), "a newcomer could share the node during the restart"
    assert _free(record, "users.lock", fcntl.LOCK_SH)  # shared again after it
    restarter.release()
    assert _free(record, "users.lock") and _free(record, "disrupt.lock")


def test_two_restarting_users_take_turns_before_either_takes_a_share(record):
    """The CI failure of 2026-12-06: two tests that each held a share asked for the node alone (a kubelet
    restart, a reboot); the reboot got in while the other test's pod ran. The second waits at will_disrupt."""
    first, second = NodeUse(record), NodeUse(record)
    first.will_disrupt()
    first.share()
    with pytest.raises(ComponentError, match="waited 0s for another test that restarts real-node-0 to finish"):
        second.will_disrupt(wait=0.3)
    assert not second.sharing
    first.release()
    second.will_disrupt(wait=1)
    second.release()


def test_a_restart_by_a_user_that_did_not_say_so_first_is_refused(record):
    user = NodeUse(record)
    user.share()
    with pytest.raises(HarnessError, match=r"without saying it would: call will_disrupt\(\) first .*disrupts_node"):
        with user.alone(wait=0.3):
            pytest.fail("restarted without having said so")
    assert _free(record, "disrupt.lock")
    user.release()


def test_a_waiting_restart_keeps_new_users_out(record):
    """The turnstile: tests that come and go one after another must not keep a restart waiting forever."""
    user, restarter, newcomer = NodeUse(record), NodeUse(record), NodeUse(record)
    user.share()
    had_it: list[bool] = []

    def restart():
        with restarter.alone(wait=10):
            had_it.append(True)
        restarter.release()

    thread = threading.Thread(target=restart)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while _free(record, "turnstile.lock", fcntl.LOCK_SH):
            assert time.monotonic() < deadline, "the restarter never started to wait for the node"
            time.sleep(0.05)
        with pytest.raises(ComponentError, match="waited 0s for a restart of real-node-0 to finish"):
            newcomer.share(wait=0.3)
    finally:
        user.release()
        thread.join(15)
    assert had_it == [True]
    newcomer.share(wait=1)
    newcomer.release()


def test_sole_user_and_node_plugins_restarts_share_one_rule(record, tmp_path):
    """A vendor plugin's reboot (sole_user, no share) waits like any other restart, and leaves nothing held."""
    user = plugins.NodePlugins(tmp_path / "cluster", record, tmp_path / "kubeconfig")
    user.will_disrupt()
    with pytest.raises(ComponentError, match="another test that restarts real-node-0"):
        with plugins.sole_user(record, wait_for_others=0.3):
            pytest.fail("had the node while another restarting user held it")
    user.close()
    with plugins.sole_user(record, wait_for_others=1):
        assert not _free(record, "users.lock", fcntl.LOCK_SH)
    assert all(_free(record, name) for name in ("users.lock", "disrupt.lock", "turnstile.lock"))
