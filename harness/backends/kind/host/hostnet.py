"""The host settings a dockerd of ours may change, recorded before it starts and restored after it stops.

dockerd (with its defaults) sets the iptables FORWARD policy to DROP and turns on IP forwarding. A
FORWARD DROP cuts traffic on every other bridge of the machine, e.g. a real node's of the local
backend. We start dockerd with `--iptables=false --ip-forward=false`, so neither should change; the
record is the safety net and proves it: whatever changed while dockerd started is put back at once,
and when it stops a FORWARD policy that is no longer the recorded one is put back (ip_forward is then
left alone: by that time another user, a real node's bridge, may have turned it on). The record is plain data (`{"forwardPolicy": {...},
"sysctls": {...}}`), so it can later join the machine-wide record of the real nodes' settings.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from harness.backends.commands import run_quiet

IPTABLES = ("iptables", "ip6tables")
SYSCTLS = ("net.ipv4.ip_forward", "net.ipv6.conf.all.forwarding")
# Written by the kubelets inside privileged kind node containers: not namespaced, so machine-wide.
KUBELET_SYSCTLS = ("vm.overcommit_memory", "kernel.panic", "kernel.panic_on_oops")

Run = Callable[[list[str]], subprocess.CompletedProcess]


def _run(argv: list[str]) -> subprocess.CompletedProcess:
    return run_quiet(argv, timeout=30)  # never raises: a missing program or a timeout is 127 / 124


def parse_forward_policy(iptables_s_output: str) -> str | None:
    """The policy from `iptables -S FORWARD` (its first line is `-P FORWARD ACCEPT`)."""
    match = re.search(r"^-P FORWARD (\w+)", iptables_s_output, re.M)
    return match[1] if match else None


def _sysctl_path(name: str) -> Path:
    return Path("/proc/sys") / name.replace(".", "/")


def snapshot(run: Run = _run, which=shutil.which, proc_sys: Callable[[str], Path] = _sysctl_path) -> dict:
    policies = {}
    for binary in IPTABLES:
        tool = which(binary)
        if tool:
            out = run([tool, "-w", "-S", "FORWARD"])
            policy = parse_forward_policy(out.stdout) if out.returncode == 0 else None
            if policy:
                policies[binary] = policy
    sysctls = {}
    for name in SYSCTLS + KUBELET_SYSCTLS:
        try:
            sysctls[name] = proc_sys(name).read_text().strip()
        except OSError:
            continue  # not on this kernel (no IPv6)
    return {"forwardPolicy": policies, "sysctls": sysctls}


def changes(baseline: dict, now: dict) -> list[str]:
    """What differs between two snapshots, as `what: before -> now` lines."""
    lines = []
    for binary, policy in baseline.get("forwardPolicy", {}).items():
        current = now.get("forwardPolicy", {}).get(binary)
        if current != policy:
            lines.append(f"{binary} FORWARD policy: {policy} -> {current}")
    for name, value in baseline.get("sysctls", {}).items():
        current = now.get("sysctls", {}).get(name)
        if current != value:
            lines.append(f"{name}: {value} -> {current}")
    return lines


def restore(baseline: dict, run: Run = _run, which=shutil.which,
            proc_sys: Callable[[str], Path] = _sysctl_path, sysctls: tuple[str, ...] | None = None) -> list[str]:
    """Put back what differs from `baseline`; returns what could not be restored. `sysctls` limits
    which sysctls (None: all recorded): when our dockerd stops, a changed ip_forward may be another
    user's (a real node's CNI bridge turns it on), while nothing else sets the policy to DROP."""
    now = snapshot(run, which, proc_sys)
    problems = []
    for binary, policy in baseline.get("forwardPolicy", {}).items():
        if now["forwardPolicy"].get(binary) == policy:
            continue
        tool = which(binary)
        out = run([tool, "-w", "-P", "FORWARD", policy]) if tool else None
        if out is None or out.returncode != 0:
            problems.append(f"{binary} -P FORWARD {policy}: {(out.stderr if out else 'not installed').strip()}")
    for name, value in baseline.get("sysctls", {}).items():
        if (sysctls is not None and name not in sysctls) or now["sysctls"].get(name) == value:
            continue
        try:
            proc_sys(name).write_text(value + "\n")
        except OSError as err:
            problems.append(f"sysctl {name}={value}: {err.strerror}")
    return problems
