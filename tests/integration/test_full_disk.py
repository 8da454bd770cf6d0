"""Full and read-only filesystems (issue 30 item 3): refused before work starts, naming the place and
its free space; and a report directory that fills up mid-run ends the run with a located error, no
traceback, a results.json that is still whole JSON, and nothing left running.

The small filesystems are tmpfs mounts of this test's own (root only, mounted under the test's temp
directory and unmounted afterwards); the machine's own disks are never filled.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from harness.backends.local import process
from harness.core import paths
from harness.k8s import wait

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
FIRST_RESULT_TIMEOUT = 600
END_TIMEOUT = 600


@pytest.fixture
def small_fs(tmp_path):
    """`small_fs(size)` -> a fresh tmpfs of `size` (e.g. "40m"), unmounted at the end."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small filesystem needs root")
    mounts: list[Path] = []

    def make(size: str) -> Path:
        where = tmp_path / f"fs-{len(mounts)}"
        where.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], check=True)
        mounts.append(where)
        return where

    yield make
    for where in mounts:
        subprocess.run(["umount", "--lazy", str(where)], check=False)


def _fill(directory: Path) -> None:
    """Take every free byte of the filesystem of `directory`."""
    with open(directory / "filler", "wb") as handle:
        try:
            while True:
                handle.write(b"\0" * (1 << 20))
                handle.flush()
        except OSError:
            pass


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(REPO), **(env or {})}, timeout=300)


def test_a_full_state_directory_is_refused_before_anything_starts(small_fs):
    full = small_fs("1m")
    _fill(full)
    result = _cli("cluster", "up", "--name", f"full-{uuid.uuid4().hex[:5]}", "--nodes", "0", "--real-nodes", "0",
                  env={paths.STATE_ENV: str(full / "state")})
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert f"state directory {full / 'state' / 'clusters'}: 0 MiB free on its filesystem" in result.stderr
    assert paths.STATE_ENV in result.stderr
    assert not (full / "state" / "clusters").exists() or not list((full / "state" / "clusters").iterdir())


def test_a_full_report_directory_is_refused_before_the_cluster_starts(small_fs, tmp_path):
    full = small_fs("1m")
    result = _cli("run", "--real-nodes", "0", "--report-dir", str(full / "reports"),
                  env={paths.STATE_ENV: str(tmp_path / "state")})
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert f"--report-dir: {full / 'reports'}: 1 MiB free on its filesystem" in result.stderr
    assert "at least 32 MiB free" in result.stderr
    assert not (tmp_path / "state" / "clusters").exists() or not list((tmp_path / "state" / "clusters").iterdir())


@pytest.mark.slow
def test_a_report_directory_that_fills_mid_run_ends_it_with_a_located_error(small_fs, tmp_path):
    reports = small_fs("40m") / "reports"
    state_dir = tmp_path / "state"
    env = {**os.environ, paths.STATE_ENV: str(state_dir), "PYTHONPATH": str(REPO), "NO_COLOR": "1"}
    env.pop("KUBECONFIG", None)
    name = f"fill-{uuid.uuid4().hex[:5]}"
    run_log = tmp_path / "run.log"
    with open(run_log, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "harness.cli", "run", "--name", name, "--real-nodes", "0",
                                 "-n", "1", "--report-dir", str(reports), "--", "-k", "test_api_versions_and_limits"],
                                cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait.until("the first test result in results.json",
                       lambda: (reports / "results.json").exists() or proc.poll() is not None, FIRST_RESULT_TIMEOUT,
                       interval=0.2, diagnostics=lambda: run_log.read_text()[-3000:])
            assert proc.poll() is None, "the run ended before the disk filled:\n" + run_log.read_text()
            components = process.recorded(state_dir / "clusters" / name)
            _fill(reports)
            code = proc.wait(timeout=END_TIMEOUT)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    output = run_log.read_text()

    assert code == 1, f"exit code {code}:\n{output[-4000:]}"
    assert "Traceback" not in output, output[output.index("Traceback") - 1000:][:5000]
    assert f"error: cannot write {reports}/" in output and "No space left on device" in output, output[-3000:]
    results = json.loads((reports / "results.json").read_text())  # whole: written atomically, never cut short
    assert isinstance(results, list) and results
    assert not list(reports.glob("*.tmp")), "a half-written file was left behind"
    assert not [r.name for r in components.values() if process.alive(r)], output[-3000:]
    assert not (state_dir / "clusters" / name).exists(), output[-3000:]
