"""`dra-harness` commands as a user runs them, for the integration tests: a subprocess of this
interpreter, its output appended to a log file the test shows on failure."""

from __future__ import annotations

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
