"""`dra-harness` commands as a user runs them, for the integration tests: a subprocess of this
interpreter, its output appended to a log file the test shows on failure."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CLEANUP_GRACE = 600.0  # what an interrupted command may take to remove what it made (a kind cluster: minutes)


def cli(args: list[str], env: dict, log: Path, timeout: float) -> subprocess.CompletedProcess:
    with open(log, "a") as handle:
        handle.write(f"\n$ dra-harness {' '.join(args)}\n")
        handle.flush()
        return run_to_end([sys.executable, "-m", "harness.cli", *args], timeout, cwd=REPO, env=env, stdout=handle,
                          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def run_to_end(command: list[str], timeout: float, capture: bool = False, **popen) -> subprocess.CompletedProcess:
    """subprocess.run, except on a timeout or a Ctrl-C of the test: subprocess.run SIGKILLs the command, which
    leaves what it started (a kind cluster, the harness's dockerd). Here the command, in a session of its own
    (so a terminal's Ctrl-C reaches it once, from here), gets SIGINT and CLEANUP_GRACE to clean up."""
    if capture:
        popen.update(stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc = subprocess.Popen(command, start_new_session=True, **popen)
    try:
        out, err = proc.communicate(timeout=timeout)
    except (KeyboardInterrupt, subprocess.TimeoutExpired):
        stop_cleanly(proc)
        raise
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def stop_cleanly(proc: subprocess.Popen) -> None:
    """SIGINT, as a user's Ctrl-C, then wait for its clean-up; SIGKILL only after CLEANUP_GRACE or a second Ctrl-C."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=CLEANUP_GRACE)
    except (KeyboardInterrupt, subprocess.TimeoutExpired):
        proc.kill()
        proc.wait()


def isolated_env(state_dir: Path, **extra: str) -> dict:
    """This environment with its own state directory (so the run's cluster is easy to find and nothing
    else is touched), the repository importable, no colour, and no KUBECONFIG of the caller."""
    from harness.core import paths

    env = {**os.environ, paths.STATE_ENV: str(state_dir), "PYTHONPATH": str(REPO), "NO_COLOR": "1", **extra}
    env.pop("KUBECONFIG", None)
    return env


def start_run(name: str, report_dir: Path, env: dict, log, *pytest_args: str, real_nodes: int = 0,
              config: str | None = None) -> subprocess.Popen:
    """`dra-harness run --name NAME --real-nodes N [--config C] -n 1 --report-dir D [-- pytest args]` in the
    background."""
    command = [sys.executable, "-m", "harness.cli", "run", "--name", name, "--real-nodes", str(real_nodes), "-n", "1",
               "--report-dir", str(report_dir), *(["--config", config] if config else [])]
    if pytest_args:
        command += ["--", *pytest_args]
    return subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
