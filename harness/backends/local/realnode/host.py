"""Machine-wide settings a real node changes, recorded before the first node starts and restored
after the last one stops.

The kubelet sets kernel parameters for itself (vm.overcommit_memory=1, kernel.panic=10,
kernel.panic_on_oops=1, ...), the CNI bridge plugin turns on IP forwarding, and where `iptables`
exists the kubelet adds its KUBE-* chains. None of that is per cluster, so several clusters with
real nodes share one record: `users` lists them, the first one records the baseline, the last one
to go restores it. A user whose cluster directory is gone (a killed run) no longer counts.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from pathlib import Path

from harness import paths
from harness.locking import file_lock

# Every sysctl the kubelet (container_manager_linux.go) or the CNI bridge plugin may write.
SYSCTLS = ("vm.overcommit_memory", "vm.panic_on_oom", "kernel.panic", "kernel.panic_on_oops",
           "kernel.keys.root_maxkeys", "kernel.keys.root_maxbytes", "net.ipv4.ip_forward",
           "net.ipv6.conf.all.forwarding", "net.ipv6.conf.default.forwarding")
IPTABLES = ("iptables", "ip6tables")
TABLES = ("filter", "nat", "mangle", "raw")
# Directories under /run that containerd's shims create whatever their configuration says.
RUNTIME_DIRS = (Path("/run/containerd/s"), Path("/run/containerd"))


def _record_file() -> Path:
    return paths.state_root() / "real-node-host.json"


def _lock_file() -> Path:
    return paths.state_root() / "real-node-host.lock"


def sysctl_path(name: str) -> Path:
    return Path("/proc/sys") / name.replace(".", "/")


def read_sysctls() -> dict[str, str]:
    values = {}
    for name in SYSCTLS:
        try:
            values[name] = sysctl_path(name).read_text().strip()
        except OSError:
            continue  # not on this kernel
    return values


def write_sysctls(values: dict[str, str]) -> list[str]:
    """Write `values` back; returns the ones that could not be restored."""
    failed = []
    for name, value in values.items():
        try:
            if sysctl_path(name).read_text().strip() != value:
                sysctl_path(name).write_text(value + "\n")
        except OSError as err:
            failed.append(f"sysctl {name}={value}: {err.strerror}")
    return failed


def iptables_rules(binary: str) -> dict[str, list[str]]:
    """table -> its chain declarations and rules as `iptables-save` prints them."""
    save = shutil.which(f"{binary}-save")
    if not save:
        return {}
    result = {}
    for table in TABLES:
        proc = subprocess.run([save, "-t", table], capture_output=True, text=True, timeout=30)
        if proc.returncode == 0:
            result[table] = [line for line in proc.stdout.splitlines() if line.startswith((":", "-A "))]
    return result


def snapshot() -> dict:
    return {"sysctls": read_sysctls(), "iptables": {b: iptables_rules(b) for b in IPTABLES},
            "runtimeDirs": [str(d) for d in RUNTIME_DIRS if d.exists()]}


def restore(baseline: dict) -> list[str]:
    """Put the machine back to `baseline`; returns what could not be restored."""
    problems = write_sysctls(baseline.get("sysctls", {}))
    for binary, tables in baseline.get("iptables", {}).items():
        problems += _restore_iptables(binary, tables)
    existed = set(baseline.get("runtimeDirs", []))
    for directory in RUNTIME_DIRS:  # innermost first; only empty ones that we made
        if str(directory) not in existed and directory.is_dir():
            try:
                directory.rmdir()
            except OSError:
                problems.append(f"{directory} is not empty")
    return problems


def _restore_iptables(binary: str, before: dict[str, list[str]]) -> list[str]:
    tool = shutil.which(binary)
    if not tool:
        return []
    problems = []
    for table, lines in iptables_rules(binary).items():
        known = set(before.get(table, []))
        added_rules = [line for line in lines if line.startswith("-A ") and line not in known]
        # User chains are declared with policy "-"; built-in ones (INPUT, ...) are never ours to delete.
        added_chains = [line[1:].split()[0] for line in lines if line.startswith(":") and line.split()[1] == "-"
                        and not any(k.startswith(":" + line[1:].split()[0] + " ") for k in known)]
        for rule in reversed(added_rules):
            args = shlex.split(rule)[1:]
            proc = subprocess.run([tool, "-w", "-t", table, "-D", *args], capture_output=True, text=True)
            if proc.returncode != 0:
                problems.append(f"{binary} -t {table}: cannot delete {rule!r}: {proc.stderr.strip()}")
        for chain in added_chains:
            for action in ("-F", "-X"):
                proc = subprocess.run([tool, "-w", "-t", table, action, chain], capture_output=True, text=True)
                if proc.returncode != 0:
                    problems.append(f"{binary} -t {table} {action} {chain}: {proc.stderr.strip()}")
                    break
    return problems


def _load() -> dict:
    try:
        return json.loads(_record_file().read_text())
    except (OSError, ValueError):
        return {}


def _save(record: dict) -> None:
    path = _record_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True))
    tmp.replace(path)


def _live_users(record: dict) -> list[str]:
    return [name for name in record.get("users", []) if (paths.clusters_dir() / name).is_dir()]


def acquire(cluster: str) -> dict:
    """Register `cluster` as a user; the first user records the baseline. Returns the baseline."""
    _lock_file().parent.mkdir(parents=True, exist_ok=True)
    with file_lock(_lock_file()):
        record = _load()
        users = _live_users(record)
        # A baseline left by users that were killed before restoring it is still the truth: keep it.
        if not record.get("baseline"):
            record["baseline"] = snapshot()
        record["users"] = sorted(set(users) | {cluster})
        _save(record)
        return record["baseline"]


def release(cluster: str) -> list[str]:
    """Unregister `cluster`; the last user restores the baseline. Returns what could not be restored."""
    _lock_file().parent.mkdir(parents=True, exist_ok=True)
    with file_lock(_lock_file()):
        record = _load()
        if not record:
            return []
        users = [u for u in _live_users(record) if u != cluster]
        if users:
            record["users"] = users
            _save(record)
            return []
        problems = restore(record.get("baseline", {}))
        _record_file().unlink(missing_ok=True)
        return problems
