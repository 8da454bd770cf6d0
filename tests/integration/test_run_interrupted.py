"""`dra-harness run` interrupted mid-suite (issue 16, item 11): the tests that finished are reported,
marked as interrupted, in every format; the exit status says which signal stopped it; and the cluster
it started is gone.

Runs the real main job as a subprocess against the real local cluster it starts (simulated nodes
only, so it needs no root), with its own state directory so its cluster is easy to find and nothing
else is touched.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path

import psutil
import pytest
from cli_runs import isolated_env, start_run  # tests/integration/cli_runs.py

from harness.backends.local import process
from harness.jobs import report
from harness.k8s import wait

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
FIRST_RESULT_TIMEOUT = 600  # cluster start (cold, loaded 2-core machine) + the first test
STOP_TIMEOUT = 300  # pytest's grace to finish its current test, then the cluster's teardown


def _results(report_dir: Path) -> list[dict]:
    try:
        return json.loads((report_dir / "results.json").read_text())
    except (OSError, ValueError):
        return []


def _cluster_processes(state_dir: Path) -> list[process.Running]:
    """Every component the run's cluster recorded."""
    found = []
    for record in state_dir.glob("clusters/*/pids/*.json"):
        try:
            data = json.loads(record.read_text())
        except (OSError, ValueError):
            continue
        found.append(process.Running(record.stem, **process.identity_fields(data)))
    return found


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupted_run_reports_finished_tests_and_stops_its_cluster(tmp_path, signum):
    state_dir, report_dir = tmp_path / "state", tmp_path / "reports"
    name = f"intr-{signum.name.lower()}-{uuid.uuid4().hex[:5]}"
    log = open(tmp_path / "run.log", "w")
    proc = start_run(name, report_dir, isolated_env(state_dir), log)
    try:
        wait.until("the first test result in results.json", lambda: _results(report_dir) or proc.poll() is not None,
                   FIRST_RESULT_TIMEOUT, interval=0.5,
                   diagnostics=lambda: (tmp_path / "run.log").read_text()[-3000:])
        assert proc.poll() is None, "the run ended before it could be interrupted:\n" + (tmp_path / "run.log").read_text()
        components = _cluster_processes(state_dir)
        assert components, "no cluster component recorded"
        proc.send_signal(signum)
        code = proc.wait(timeout=STOP_TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    output = (tmp_path / "run.log").read_text()

    assert code == 128 + signum, output
    assert "Traceback" not in output, output
    finished = _results(report_dir)
    assert finished, output
    ids = {r["id"] for r in finished}
    data = json.loads((report_dir / "report.json").read_text())
    assert data["interrupted"] is True, data
    assert data["interruptedReason"].startswith(f"stopped by {signum.name} after {len(finished)} finished tests")
    # Every outcome counts, not just passed/failed/skipped: a run stopped late has xfails and n/a too.
    assert sum(data[outcome] for outcome in report.OUTCOMES) == len(finished), data
    reported = {t["id"] for row in data["matrix"] for t in row["tests"]}
    assert reported == ids
    markdown = (report_dir / "report.md").read_text()
    html = (report_dir / "report.html").read_text()
    assert "**INTERRUPTED**" in markdown and "INTERRUPTED" in html
    for test_id in ids:
        assert f"`{test_id}`" in markdown and test_id in html
    junit = ET.parse(report_dir / "junit.xml").getroot()
    assert any(p.get("name") == "interrupted" for p in junit.iter("property")), ET.tostring(junit)[:2000]
    assert "report (interrupted):" in output

    # The cluster it started is gone: no component left, no state left.
    assert not [running.pid for running in components if process.alive(running)], output
    assert not (state_dir / "clusters" / name).exists(), output


def _suite_processes(report_dir: Path) -> list[psutil.Process]:
    """The run's pytest (and any worker of it): it runs in a session of its own, so a SIGKILL of the
    run does not reach it."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if f"--dra-report-dir={report_dir}" in (proc.info["cmdline"] or []):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def test_a_run_killed_with_sigkill_leaves_nothing_running(tmp_path):
    """SIGKILL cannot be handled: the run's cluster is torn down by its supervisor once the run is gone
    (ClusterSpec.owner), the orphaned suite ends as its cluster goes, and the next run starts clean."""
    state_dir, report_dir = tmp_path / "state", tmp_path / "reports"
    name = f"intr-kill-{uuid.uuid4().hex[:5]}"
    with open(tmp_path / "run.log", "w") as log:
        proc = start_run(name, report_dir, isolated_env(state_dir), log)
        try:
            wait.until("the first test result in results.json", lambda: _results(report_dir) or proc.poll() is not None,
                       FIRST_RESULT_TIMEOUT, interval=0.5, diagnostics=lambda: (tmp_path / "run.log").read_text()[-3000:])
            assert proc.poll() is None, "the run ended before it could be killed"
            components = _cluster_processes(state_dir)
            assert any(c.name == "supervisor" for c in components), [c.name for c in components]
            proc.kill()
            proc.wait()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    directory = state_dir / "clusters" / name
    wait.until("the supervisor to take the orphaned cluster down",
               lambda: not directory.exists() and not [c for c in components if process.alive(c)], STOP_TIMEOUT,
               diagnostics=lambda: process.tail(directory / "logs" / "supervisor.log"))
    wait.until("the orphaned suite to end", lambda: not _suite_processes(report_dir), STOP_TIMEOUT)
    assert json.loads((report_dir / "results.json").read_text())  # what finished is still there, whole


def test_the_next_up_removes_a_cluster_whose_owner_and_supervisor_were_both_killed(tmp_path):
    state_dir = tmp_path / "state"
    env = isolated_env(state_dir)
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        script = ("import sys; from harness.backends.local.backend import LocalBackend; "
                  "from harness.backends.base import ClusterSpec; from harness.backends.local import process; "
                  f"LocalBackend().up(ClusterSpec(name='orphan', nodes=0, owner=process.identity({owner.pid})))")
        subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, check=True, capture_output=True, timeout=300)
        directory = state_dir / "clusters" / "orphan"
        components = [process.Running(p.stem, **process.identity_fields(json.loads(p.read_text())))
                      for p in (directory / "pids").glob("*.json")]
        supervisor_record = [c for c in components if c.name == "supervisor"][0]
        os.kill(supervisor_record.pid, signal.SIGKILL)  # the machine's session ended: nobody tears it down
        wait.until("the supervisor to die", lambda: not process.alive(supervisor_record), 30)
    finally:
        owner.kill()
        owner.wait()
    result = subprocess.run([sys.executable, "-m", "harness.cli", "cluster", "up", "--name", "next", "--nodes", "0",
                             "--real-nodes", "0"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    try:
        assert result.returncode == 0, result.stdout + result.stderr
        assert "removing cluster 'orphan': the run that owned it" in result.stdout + result.stderr
        assert not directory.exists()
        assert not [c.name for c in components if process.alive(c)]
    finally:
        subprocess.run([sys.executable, "-m", "harness.cli", "cluster", "down", "--name", "next"], cwd=REPO, env=env,
                       capture_output=True, timeout=300)
