"""Machine-wide settings a real node changes, recorded before the first node starts and restored
after the last one stops.

The kubelet sets kernel parameters for itself (vm.overcommit_memory=1, kernel.panic=10,
kernel.panic_on_oops=1, ...), the CNI bridge plugin turns on IP forwarding, where `iptables` exists
the kubelet adds its KUBE-* chains, and we raise the inotify limits when the nodes would not fit
(inotify.py). None of that is per cluster or per user, so there is ONE record per machine,
`/var/lib/dra-harness/host-settings.json` (not under a state directory, which differs between
users, CI jobs and test runs; not under DRA_HARNESS_NODE_ROOT, which may differ too), changed only
under its file lock. It lists its owners, the clusters with real nodes (by absolute cluster
directory, plus the process that registered it); the first owner records the baseline, the last one
to leave restores it. An owner whose registering process is gone and whose cluster has no live
recorded process (a killed run) no longer counts.
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

from harness.backends.commands import Runner
from harness.backends.local import process
from harness.backends.local.realnode import inotify
from harness.core.files import write_atomic
from harness.core.locking import file_lock
from harness.core.nodelayout import DEFAULT_NODE_ROOT

# Every sysctl the kubelet (container_manager_linux.go) or the CNI bridge plugin may write.
SYSCTLS = ("vm.overcommit_memory", "vm.panic_on_oom", "kernel.panic", "kernel.panic_on_oops",
           "kernel.keys.root_maxkeys", "kernel.keys.root_maxbytes", "net.ipv4.ip_forward",
           "net.ipv6.conf.all.forwarding", "net.ipv6.conf.default.forwarding",
           # ours: raised when the real nodes would not fit (see inotify.py)
           inotify.INSTANCES, inotify.WATCHES)
IPTABLES = ("iptables", "ip6tables")
TABLES = ("filter", "nat", "mangle", "raw")
# Directories under /run that containerd's shims create whatever their configuration says.
RUNTIME_DIRS = (Path("/run/containerd/s"), Path("/run/containerd"))
PROC_SYS = Path("/proc/sys")  # the kernel's parameters; the tests hand in a directory of their own


# The machine's record, beside the default node root; fixed on purpose (see the module docstring).
RECORD_DIR = Path(DEFAULT_NODE_ROOT)


def _record_file() -> Path:
    return RECORD_DIR / "host-settings.json"


def _lock_file() -> Path:
    return RECORD_DIR / "host-settings.lock"


def sysctl_path(name: str, proc_sys: Path = PROC_SYS) -> Path:
    return proc_sys / name.replace(".", "/")


def read_sysctls(proc_sys: Path = PROC_SYS) -> dict[str, str]:
    values = {}
    for name in SYSCTLS:
        try:
            values[name] = sysctl_path(name, proc_sys).read_text().strip()
        except OSError:
            continue  # not on this kernel
    return values


def write_sysctls(values: dict[str, str], proc_sys: Path = PROC_SYS) -> list[str]:
    """Write `values` back; returns the ones that could not be restored."""
    failed = []
    for name, value in values.items():
        path = sysctl_path(name, proc_sys)
        try:
            if path.read_text().strip() != value:
                path.write_text(value + "\n")
        except OSError as err:
            failed.append(f"sysctl {name}={value}: {err.strerror}")
    return failed


def iptables_rules(binary: str, runner: Runner | None = None) -> dict[str, list[str]]:
    """table -> its chain declarations and rules as `iptables-save` prints them."""
    runner = runner or Runner()
    save = runner.which(f"{binary}-save")
    if not save:
        return {}
    result = {}
    for table in TABLES:
        proc = runner.query([save, "-t", table], timeout=30)
        if proc.returncode == 0:
            result[table] = [line for line in proc.stdout.splitlines() if line.startswith((":", "-A "))]
    return result


def snapshot(runner: Runner | None = None, proc_sys: Path = PROC_SYS) -> dict:
    return {"sysctls": read_sysctls(proc_sys), "iptables": {b: iptables_rules(b, runner) for b in IPTABLES},
            "runtimeDirs": [str(d) for d in RUNTIME_DIRS if d.exists()]}


def restore(baseline: dict, runner: Runner | None = None) -> list[str]:
    """Put the machine back to `baseline`; returns what could not be restored."""
    problems = write_sysctls(baseline.get("sysctls", {}))
    for binary, tables in baseline.get("iptables", {}).items():
        problems += _restore_iptables(binary, tables, runner)
    existed = set(baseline.get("runtimeDirs", []))
    for directory in RUNTIME_DIRS:  # innermost first; only empty ones that we made
        if str(directory) not in existed and directory.is_dir():
            try:
                directory.rmdir()
            except OSError:
                problems.append(f"{directory} is not empty")
    return problems


def _restore_iptables(binary: str, before: dict[str, list[str]], runner: Runner | None = None) -> list[str]:
    runner = runner or Runner()
    tool = runner.which(binary)
    if not tool:
        return []
    problems = []
    for table, lines in iptables_rules(binary, runner).items():
        known = set(before.get(table, []))
        added_rules = [line for line in lines if line.startswith("-A ") and line not in known]
        # User chains are declared with policy "-"; built-in ones (INPUT, ...) are never ours to delete.
        added_chains = [line[1:].split()[0] for line in lines if line.startswith(":") and line.split()[1] == "-"
                        and not any(k.startswith(":" + line[1:].split()[0] + " ") for k in known)]
        for rule in reversed(added_rules):
            args = shlex.split(rule)[1:]
            proc = runner.query([tool, "-w", "-t", table, "-D", *args])
            if proc.returncode != 0:
                problems.append(f"{binary} -t {table}: cannot delete {rule!r}: {proc.stderr.strip()}")
        for chain in added_chains:
            for action in ("-F", "-X"):
                proc = runner.query([tool, "-w", "-t", table, action, chain])
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
    write_atomic(_record_file(), json.dumps(record, indent=1, sort_keys=True))


def _owner(cluster_dir: Path) -> dict:
    return {"cluster": os.path.abspath(cluster_dir), **process.identity()}


def owner_alive(owner: dict) -> bool:
    """Its registering process (a `cluster up` still starting) or a recorded process of its cluster lives."""
    if process.alive(process.Running("registrar", **process.identity_fields(owner))):
        return True
    directory = Path(owner.get("cluster", ""))
    return directory.is_dir() and any(process.alive(r) for r in process.recorded(directory).values())


def owners() -> list[str]:
    """The cluster directories that hold the machine settings now (live owners only)."""
    return [o["cluster"] for o in _load().get("owners", []) if owner_alive(o)]


def acquire(cluster_dir: Path, nodes: int = 1, *, footprint: dict[str, int] | None = None,
            uid: int | None = None) -> list[str]:
    """Register the cluster as an owner (the first records the baseline) and make room for `nodes`
    real nodes (or nodes of another `footprint`, run by `uid`: inotify.shortfalls) in the inotify limits.
    Returns what was raised, as `name: old -> new`."""
    RECORD_DIR.mkdir(parents=True, exist_ok=True)
    with file_lock(_lock_file()):
        record = _load()
        mine = os.path.abspath(cluster_dir)
        others = [o for o in record.get("owners", []) if o.get("cluster") != mine and owner_alive(o)]
        # A baseline left by owners that were killed before restoring it is still the truth: keep it.
        if not record.get("baseline"):
            record["baseline"] = snapshot()
        record["owners"] = [*others, _owner(cluster_dir)]
        _save(record)  # before changing anything, so the change is always undone
        raised = []
        for short in inotify.shortfalls(nodes, footprint=footprint, uid=uid):
            failed = write_sysctls({short.sysctl: str(short.raise_to)})
            raised += failed or [f"{short.sysctl}: {short.limit} -> {short.raise_to}"]
        return raised


def release(cluster_dir: Path) -> list[str]:
    """Unregister the cluster; the last owner restores the baseline. Returns what could not be
    restored. Repeatable: releasing a cluster that is no owner changes nothing while others live."""
    RECORD_DIR.mkdir(parents=True, exist_ok=True)
    with file_lock(_lock_file()):
        record = _load()
        if not record:
            return []
        mine = os.path.abspath(cluster_dir)
        others = [o for o in record.get("owners", []) if o.get("cluster") != mine and owner_alive(o)]
        if others:
            record["owners"] = others
            _save(record)
            return []
        problems = restore(record.get("baseline", {}))
        _record_file().unlink(missing_ok=True)
        return problems
