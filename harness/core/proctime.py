"""When a process started, in a form a clock step cannot change.

psutil's `create_time()` is the boot time read now plus the start offset, so it moves whenever the
wall clock is stepped (NTP, a VM whose clock is set after boot). Comparing it with a recorded value
then says a live process is some other process: CI saw two apiservers "exit during start" at the same
instant, alive all along. The kernel's own start offset (clock ticks after boot, /proc/<pid>/stat
field 22) and the boot id never move, so identities are matched on those; the wall time stays in
the records for people and for records written before this.
"""

from __future__ import annotations

import os
from functools import cache

import psutil

TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")


@cache
def boot_id() -> str:
    """This boot of the machine (a pid and start offset mean nothing across a reboot)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def started_after_boot(pid: int) -> float | None:
    """Seconds from boot to the start of `pid` (None: no such process, or no /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            # The command name in parentheses may hold spaces; the fields after it are plain.
            fields = handle.read().rsplit(")", 1)[1].split()
        return int(fields[19]) / TICKS_PER_SECOND  # field 22 of the whole line
    except (OSError, IndexError, ValueError):
        return None


def same_start(recorded: float, now: float | None) -> bool:
    """Whether two start offsets name one process start (they are read from the same tick count)."""
    return now is not None and abs(now - recorded) < 0.5 / TICKS_PER_SECOND


def identity(pid: int | None = None) -> dict:
    """What tells a process apart from a later one with the same pid, for state files (this one by default)."""
    proc = psutil.Process(pid)
    return {"pid": proc.pid, "createTime": proc.create_time(), "startedAfterBoot": started_after_boot(proc.pid),
            "bootId": boot_id()}


def is_running(pid: int, create_time: float, started: float | None = None, boot: str = "") -> bool:
    """Whether the process that started as recorded still runs (and is no zombie): matched on the start
    offset and boot id where the record has them, else on the wall-clock start."""
    if pid <= 0:
        return False
    try:
        proc = psutil.Process(pid)
        if started is not None and boot:
            same = boot == boot_id() and same_start(started, started_after_boot(pid))
        else:  # a record from before start offsets were kept: wall clock, which a clock step moves
            same = abs(proc.create_time() - create_time) < 1.0
        return same and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def identity_running(record: dict) -> bool:
    """Whether the process an `identity()` record names still runs; a malformed record names none."""
    try:
        started = record.get("startedAfterBoot")
        return is_running(int(record["pid"]), float(record["createTime"]),
                          None if started is None else float(started), str(record.get("bootId") or ""))
    except (KeyError, TypeError, ValueError, AttributeError):
        return False
