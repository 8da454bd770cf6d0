"""Ctrl-C during `cluster up --backend kind` and during `conformance run --backend kind`, and an `up`
that fails after kind created the cluster, leave nothing:
no node container (running or stopped) in the engine, no docker bridge, no dockerd the harness started,
no mount, no temporary build or pytest directory, no state, no process naming the cluster; the host's
FORWARD policies as before and, once no real node holds the machine-wide record, the kubelets' sysctls.

Opt-in like test_kind_offline.py (DRA_HARNESS_KIND_E2E=1, kind on PATH or DRA_HARNESS_KIND, a machine
where the harness can provide an engine or has one); each test starts a real kind cluster (minutes).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import kind_leaks
import pytest

from harness.backends.kind import backend as kind
from harness.k8s import wait

pytestmark = [pytest.mark.integration, pytest.mark.kind_e2e]


WHY_NOT = kind_leaks.why_not("starts real kind clusters, minutes each")
UP_TIMEOUT = 1200.0
STOP_TIMEOUT = 600.0


def _env() -> dict[str, str]:
    env = dict(os.environ)
    if os.environ.get("DRA_HARNESS_KIND"):
        env["PATH"] = str(Path(os.environ["DRA_HARNESS_KIND"]).parent) + os.pathsep + env["PATH"]
    return env


def _interrupt_when(argv: list[str], ready, what: str, log: Path) -> int:
    """Start the CLI in its own process group, send SIGINT to the group (a terminal's Ctrl-C) once
    `ready()` holds, and return its exit status."""
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "harness.cli", *argv], stdout=out, stderr=subprocess.STDOUT,
                                env=_env(), start_new_session=True)
    try:
        wait.until(what, lambda: ready() or proc.poll() is not None, UP_TIMEOUT, interval=1.0,
                   diagnostics=lambda: log.read_text()[-2000:])
        assert proc.poll() is None, f"the command ended before it could be interrupted:\n{log.read_text()[-3000:]}"
        os.killpg(proc.pid, signal.SIGINT)
        return proc.wait(timeout=STOP_TIMEOUT)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))
def test_ctrl_c_while_kind_creates_the_nodes_leaves_nothing(tmp_path):
    name = f"intr-{uuid.uuid4().hex[:5]}"
    before = kind_leaks.Before(name)
    code = _interrupt_when(["cluster", "up", "--backend", "kind", "--name", name, "--config", "kind-small"],
                           lambda: len(kind_leaks.node_containers(name)) == 3, f"kind to create the 3 node containers of {name}",
                           tmp_path / "up.log")
    text = (tmp_path / "up.log").read_text()
    assert code == 130, text[-3000:]
    assert "interrupted" in text
    assert before.leaks() == [], text[-3000:]


@pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))
def test_ctrl_c_during_the_suite_on_kind_leaves_nothing_and_reports_what_finished(tmp_path):
    name = f"intr-{uuid.uuid4().hex[:5]}"
    before = kind_leaks.Before(name)
    pytest_dirs = set(Path(tempfile.gettempdir()).glob("dra-harness-pytest-*"))
    report = tmp_path / "report"

    started: set[Path] = set()  # pytest's shared directory of our run (others' runs may make some meanwhile)

    def suite_running() -> bool:  # the vendor file is written just before pytest starts; pytest makes its dir
        if not (kind.state_dir(name) / kind.VENDOR_FILE).is_file():
            return False
        started.update(set(Path(tempfile.gettempdir()).glob("dra-harness-pytest-*")) - pytest_dirs)
        return bool(started)

    code = _interrupt_when(["conformance", "run", "--backend", "kind", "--name", name, "--report-dir", str(report)],
                           suite_running, "the conformance suite to start on the kind cluster", tmp_path / "run.log")
    text = (tmp_path / "run.log").read_text()
    assert code == 130, text[-3000:]
    assert "report (interrupted)" in text, text[-3000:]
    assert not [d for d in started if d.exists()], f"pytest's shared directory left: {started}"
    assert (report / "report.md").is_file()
    assert before.leaks() == [], text[-3000:]


@pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))
def test_a_failed_up_leaves_nothing_and_says_what_failed(tmp_path):
    """The cluster is created, then loading a driver image the engine does not have fails: the
    clean-up deletes the cluster, releases our dockerd and restores the host."""
    name = f"fail-{uuid.uuid4().hex[:5]}"
    before = kind_leaks.Before(name)
    missing = f"localhost/dra-harness/no-such-image:{uuid.uuid4().hex[:6]}"
    done = subprocess.run([sys.executable, "-m", "harness.cli", "cluster", "up", "--backend", "kind", "--name", name,
                           "--nodes", "1", "--driver-image", missing], capture_output=True, text=True, env=_env(),
                          timeout=UP_TIMEOUT)
    text = done.stdout + done.stderr
    assert done.returncode == 1, text[-3000:]
    assert "Traceback" not in text and missing in done.stderr, text[-3000:]
    assert before.leaks() == [], text[-3000:]
