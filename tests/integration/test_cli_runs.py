"""The integration tests' way of running a command (cli_runs.run_to_end): a command cut short by the
test's timeout or Ctrl-C gets SIGINT and its clean-up, as from a user's Ctrl-C, not subprocess.run's SIGKILL
(which left a kind cluster and the harness's dockerd running). No cluster: a Python child stands in."""

from __future__ import annotations

import subprocess
import sys

import pytest
from cli_runs import run_to_end

# Ready once it has written "started"; on SIGINT it writes "cleaned up" and exits 130, as the CLI does.
CHILD = """
import pathlib, signal, sys, time
mark = pathlib.Path(sys.argv[1])
def cleanup(*_):
    mark.write_text("cleaned up")
    sys.exit(130)
signal.signal(signal.SIGINT, cleanup)
mark.write_text("started")
while True:
    time.sleep(0.05)
"""


def test_a_command_past_its_timeout_is_interrupted_and_cleans_up(tmp_path):
    mark = tmp_path / "mark"
    with pytest.raises(subprocess.TimeoutExpired):
        run_to_end([sys.executable, "-c", CHILD, str(mark)], timeout=10)  # ample for the child to start
    assert mark.read_text() == "cleaned up"


def test_a_command_that_ends_is_returned_as_by_subprocess_run(tmp_path):
    done = run_to_end([sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"],
                      timeout=60, capture=True)
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err\n")
