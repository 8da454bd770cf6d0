"""`dra-harness` commands as a user runs them, for the integration tests: a subprocess of this
interpreter, its output appended to a log file the test shows on failure."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def cli(args: list[str], env: dict, log: Path, timeout: float) -> subprocess.CompletedProcess:
    with open(log, "a") as handle:
        handle.write(f"\n$ dra-harness {' '.join(args)}\n")
        handle.flush()
        return subprocess.run([sys.executable, "-m", "harness.cli", *args], cwd=REPO, env=env, stdout=handle,
                              stderr=subprocess.STDOUT, timeout=timeout, stdin=subprocess.DEVNULL)


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
