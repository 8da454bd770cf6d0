"""The main job's interruption path without a cluster (issue 16, item 11): `conformance run` is stopped
by SIGINT or SIGTERM while pytest runs; pytest is told to stop, the results of the tests that finished
are kept, and the reports say the run was interrupted. Only the cluster part is left out here (no
cluster, a tiny test file instead of the suite); tests/integration/test_run_interrupted.py does the
same with the real main job and a real cluster.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from harness.backends import commands
from harness.k8s import wait

REPO = Path(__file__).resolve().parents[2]

SUITE = '''
import pathlib, time

def test_finishes():
    pass

def test_waits_until_interrupted():
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # a long test: the run is interrupted while it runs
        time.sleep(0.05)
'''

DRIVER = '''
import sys
from pathlib import Path

from harness.cli import main as cli
from harness.jobs import runner
from harness.core.records import ClusterInfo

suite, report_dir = sys.argv[1], sys.argv[2]
# No cluster: the plan, the cluster and its facts are left out; pytest runs a tiny suite.
runner.plan = lambda options: runner.Plan(options, kubeconfig="unused")
runner._cluster = lambda checked, reporter: (None, None, ClusterInfo("none", "existing", Path("unused"), "unused"))
runner._facts = lambda kubeconfig: {}
runner._pytest_command = lambda options, cluster_record, extra=None: [
    sys.executable, "-m", "pytest", suite, "-p", "no:cacheprovider",
    f"--dra-report-dir={report_dir}", f"--junitxml={report_dir}/junit.xml", "-q"]
sys.argv = ["dra-harness", "conformance", "run", "--backend", "existing", "--report-dir", report_dir]
cli.main()
'''


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupted_run_keeps_the_finished_tests(tmp_path, signum):
    suite, report_dir = tmp_path / "test_tiny.py", tmp_path / "reports"
    suite.write_text(textwrap.dedent(SUITE))
    env = {**os.environ, "PYTHONPATH": str(REPO), "NO_COLOR": "1"}
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(suite), str(report_dir)], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        def finished():
            try:
                return json.loads((report_dir / "results.json").read_text())
            except (OSError, ValueError):
                return proc.poll() is not None

        wait.until("the first finished test in results.json", finished, 60, interval=0.1)
        assert proc.poll() is None, proc.communicate()[0]
        proc.send_signal(signum)
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()

    assert proc.returncode == 128 + signum, output
    assert "Traceback" not in output, output
    data = json.loads((report_dir / "report.json").read_text())
    assert data["interrupted"] is True, data
    assert data["interruptedReason"] == f"stopped by {signum.name} after 1 finished tests"
    assert [t["id"] for row in data["matrix"] for t in row["tests"]] == ["test_tiny.py::test_finishes"]
    assert "**INTERRUPTED**" in (report_dir / "report.md").read_text()
    assert "INTERRUPTED" in (report_dir / "report.html").read_text()
    assert 'name="interrupted"' in (report_dir / "junit.xml").read_text()
    assert "report (interrupted):" in output
    # pytest (in its own session) is gone too
    assert subprocess.run(["pgrep", "-f", str(suite)], capture_output=True).stdout == b""


def test_a_command_stopped_by_the_runner_takes_what_it_started_with_it(tmp_path):
    # `kind create cluster` runs `docker run`s: killed alone, they would go on after the clean-up.
    import threading

    import psutil

    from harness.backends.commands import Runner, command

    pids = tmp_path / "pids"
    script = f"sleep 300 & echo $! > {pids}; wait"
    runner = Runner()
    failure: list[BaseException] = []

    def run() -> None:
        try:
            runner.run(command("parent with a child", "sh", "-c", script, timeout=5))
        except BaseException as err:  # noqa: BLE001 - the step's timeout is the expected end
            failure.append(err)

    thread = threading.Thread(target=run)
    thread.start()
    wait.until("the child's pid", lambda: pids.is_file() and pids.read_text().strip(), timeout=30)
    thread.join(timeout=60)
    child = int(pids.read_text())
    assert failure and "did not finish within" in str(failure[0])
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE, \
        f"the step's child {child} outlived it"


def test_ctrl_c_during_commands_run_together_kills_every_one(tmp_path, monkeypatch):
    started = []
    real_popen = commands.subprocess.Popen

    def popen(argv, **options):
        started.append(real_popen(argv, **options))
        return started[-1]

    def interrupted(process, deadline):
        raise KeyboardInterrupt

    monkeypatch.setattr(commands, "_wait", interrupted)
    runner = commands.Runner(popen=popen)
    with pytest.raises(KeyboardInterrupt):
        runner.run(commands.Step("loading", together=tuple(commands.command(f"into n{i}", "sleep", "300")
                                                            for i in range(3))))
    assert len(started) == 3
    assert all(p.poll() is not None for p in started), [p.pid for p in started if p.poll() is None]
    assert not [p.pid for p in started if psutil.pid_exists(p.pid) and
                psutil.Process(p.pid).status() != psutil.STATUS_ZOMBIE]
