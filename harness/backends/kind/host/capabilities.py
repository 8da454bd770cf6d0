"""Which Linux capabilities this machine cannot grant, read from /proc.

`docker run --privileged` asks runc for every capability the kernel knows (0..cap_last_cap). In some
VMs and sandboxes the capability bounding set lacks some of them even for root (measured here:
CAP_SYS_RESOURCE, bit 24), and runc then fails with "unable to apply caps: operation not permitted".
The runtime wrapper (runc_wrapper.py) drops exactly the capabilities this module reports missing.
"""

from __future__ import annotations

from pathlib import Path

# Bit number -> name, as in include/uapi/linux/capability.h (the names runc's config.json uses).
NAMES = ("CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL",
         "CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE", "CAP_NET_BIND_SERVICE",
         "CAP_NET_BROADCAST", "CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_IPC_LOCK", "CAP_IPC_OWNER", "CAP_SYS_MODULE",
         "CAP_SYS_RAWIO", "CAP_SYS_CHROOT", "CAP_SYS_PTRACE", "CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT",
         "CAP_SYS_NICE", "CAP_SYS_RESOURCE", "CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE",
         "CAP_AUDIT_WRITE", "CAP_AUDIT_CONTROL", "CAP_SETFCAP", "CAP_MAC_OVERRIDE", "CAP_MAC_ADMIN", "CAP_SYSLOG",
         "CAP_WAKE_ALARM", "CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ", "CAP_PERFMON", "CAP_BPF", "CAP_CHECKPOINT_RESTORE")

STATUS = Path("/proc/self/status")
LAST_CAP = Path("/proc/sys/kernel/cap_last_cap")


def name(bit: int) -> str:
    return NAMES[bit] if bit < len(NAMES) else f"CAP_{bit}"  # a kernel newer than this table


def bounding_mask(status_text: str) -> int:
    """The CapBnd mask of a /proc/<pid>/status text."""
    for line in status_text.splitlines():
        if line.startswith("CapBnd:"):
            return int(line.split(":", 1)[1].strip(), 16)
    raise ValueError("no CapBnd line in the process status")


def missing(status_text: str, last_cap: int) -> list[str]:
    """Capabilities the kernel has (0..last_cap) that the bounding set lacks, in bit order."""
    mask = bounding_mask(status_text)
    return [name(bit) for bit in range(last_cap + 1) if not mask >> bit & 1]

