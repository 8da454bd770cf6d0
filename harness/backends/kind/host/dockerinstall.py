"""Installing Debian's docker.io with apt-get (no service started by the package), and the error that
names a Docker tool this machine still lacks."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

from harness.backends.commands import run_quiet
from harness.core.errors import HarnessError

DEBIAN_PACKAGE = "docker.io"
POLICY_RC_D = Path("/usr/sbin/policy-rc.d")

Run = Callable[..., subprocess.CompletedProcess]


_run = run_quiet  # short queries: never raises; a missing program or a timeout is 127 / 124


def found(path: str | None, what: str) -> str:
    """A tool's path, or a clear error when it is missing (e.g. a package install that did not bring it)."""
    if not path:
        raise HarnessError(f"the kind backend needs {what}, and it is not on this machine",
                           hint=f"install Docker Engine (Debian: apt-get install {DEBIAN_PACKAGE})")
    return path


def install_docker(run: Run = _run, policy_rc_d: Path = POLICY_RC_D) -> None:
    """apt-get install docker.io, without letting the package start docker or containerd services
    (we start our own dockerd; a system one would change the host and keep running): a policy-rc.d
    that refuses every start is in place during the install, unless the machine already has one."""
    ours = not policy_rc_d.exists()
    if ours:
        policy_rc_d.write_text("#!/bin/sh\n# dra-harness: no service starts while docker.io installs\nexit 101\n")
        policy_rc_d.chmod(0o755)
    try:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        argv = ["apt-get", "install", "-y", "-q", "--no-install-recommends", DEBIAN_PACKAGE]
        out = run(argv, timeout=900, env=env)
        if out.returncode != 0:
            run(["apt-get", "update", "-q"], timeout=600, env=env)
            out = run(argv, timeout=900, env=env)
        if out.returncode != 0:
            raise HarnessError(f"`apt-get install {DEBIAN_PACKAGE}` exited with {out.returncode}: "
                               + "\n".join((out.stderr or out.stdout).strip().splitlines()[-10:]))
    finally:
        if ours:
            policy_rc_d.unlink(missing_ok=True)
