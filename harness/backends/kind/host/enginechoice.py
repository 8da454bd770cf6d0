"""Which Docker engine the kind backend can use here, decided from facts alone: `detect()` gathers them
(every input injectable, so the tests need no Docker) and `decide()` turns them into a `Decision`: use the
machine's engine as it is, or start one of the harness's own (installing Debian's docker.io first, with a
runc wrapper where capabilities are missing), or say why neither can work. docker.py acts on the decision.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from harness.backends.commands import run_quiet
from harness.backends.kind.host import capabilities

RUNC_CANDIDATES = ("/usr/sbin/runc", "/usr/bin/runc", "/usr/local/sbin/runc", "/usr/local/bin/runc")

Run = Callable[..., subprocess.CompletedProcess]
_run = run_quiet  # short queries: never raises; a missing program or a timeout is 127 / 124


@dataclass(frozen=True)
class Facts:
    cli: str | None  # the docker CLI
    engine_reachable: bool  # the machine's engine (the caller's DOCKER_HOST or the default socket)
    engine_error: str
    dockerd: str | None
    runc: str | None
    root: bool
    apt_get: str | None
    missing_caps: tuple[str, ...]


def detect(*, which=shutil.which, run: Run = _run, status_text: str | None = None, last_cap: int | None = None,
           euid: int | None = None) -> Facts:
    cli = which("docker")
    reachable, error = False, "the docker CLI is not installed"
    if cli:
        out = run([cli, "info", "--format", "{{.ServerVersion}}"], timeout=30)
        reachable = out.returncode == 0 and bool(out.stdout.strip())
        lines = (out.stderr or out.stdout or "").strip().splitlines()
        error = "" if reachable else (lines[-1] if lines else f"`docker info` exited {out.returncode}")
    if status_text is None:
        status_text = capabilities.STATUS.read_text()
    if last_cap is None:
        last_cap = int(capabilities.LAST_CAP.read_text().strip())
    runc = which("runc") or next((c for c in RUNC_CANDIDATES if Path(c).is_file()), None)
    return Facts(cli=cli, engine_reachable=reachable, engine_error=error, dockerd=which("dockerd"), runc=runc,
                 root=(os.geteuid() if euid is None else euid) == 0, apt_get=which("apt-get"),
                 missing_caps=tuple(capabilities.missing(status_text, last_cap)))


@dataclass(frozen=True)
class Decision:
    use_existing: bool = False
    install: bool = False  # apt-get install docker.io first
    start_own: bool = False
    wrapper_drops: tuple[str, ...] = ()  # capabilities the runc wrapper removes (empty: no wrapper)
    problems: tuple[str, ...] = field(default_factory=tuple)  # why nothing can work

    def describe(self) -> str:
        if self.use_existing:
            return "using the machine's Docker engine as it is"
        steps = (["installing Debian's docker.io with apt-get"] if self.install else []) + \
            ["starting a dockerd of the harness's own (--iptables=false --ip-forward=false)"]
        if self.wrapper_drops:
            steps.append("with a runc wrapper dropping " + ", ".join(self.wrapper_drops) +
                         " (not in this machine's capability bounding set)")
        return "; ".join(steps)


def decide(facts: Facts) -> Decision:
    if facts.cli and facts.engine_reachable:
        return Decision(use_existing=True)
    need_install = facts.dockerd is None or facts.cli is None or facts.runc is None
    problems = []
    if need_install and not (facts.root and facts.apt_get):
        missing = [what for what, there in (("the docker CLI", facts.cli), ("dockerd", facts.dockerd),
                                            ("runc", facts.runc)) if not there]
        problems.append(f"no reachable Docker engine, and {', '.join(missing)} cannot be installed here: "
                        + ("not root" if not facts.root else "no apt-get"))
    elif not facts.root:
        problems.append("no reachable Docker engine, and starting dockerd needs root")
    if problems:
        return Decision(problems=tuple(problems))
    return Decision(install=need_install, start_own=True, wrapper_drops=facts.missing_caps)
