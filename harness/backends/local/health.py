"""Is a started component ready: its health endpoint answers 200, or (without one) its log says so.

`cluster up` waits on this for every component; the supervisor (supervisor.py) waits on it after a
restart, so a component counts as restarted only once it serves again, not once its process exists.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

from harness.k8s.client import https_get, tls_context

TAIL_BYTES = 64 * 1024  # where a ready line is looked for: the log's last lines


@dataclass(frozen=True)
class Readiness:
    """How to tell a component is ready; what `process.start` records in its pid file for the supervisor."""
    url: str | None = None  # polled until it answers 200 ...
    line: str | None = None  # ... or, for components without an endpoint, a line in their log

    def as_record(self) -> dict:
        return {"url": self.url, "line": self.line} if (self.url or self.line) else {}

    @classmethod
    def from_record(cls, data: object) -> Readiness:
        if not isinstance(data, dict):
            return cls()
        url, line = data.get("url"), data.get("line")
        return cls(url if isinstance(url, str) else None, line if isinstance(line, str) else None)


def is_ready(readiness: Readiness, log: Path, tls: ssl.SSLContext | None, log_from: int = 0) -> bool:
    """One look. `log_from`: where in the log this run of the process began (a restart appends to the
    log of the previous run, whose ready line must not count)."""
    if readiness.line:
        try:
            with open(log, "rb") as handle:
                handle.seek(max(log_from, log.stat().st_size - TAIL_BYTES))
                return readiness.line in "\n".join(handle.read().decode(errors="replace").splitlines()[-5:])
        except OSError:
            return False
    if readiness.url:
        try:
            status, _ = https_get(readiness.url, tls if readiness.url.startswith("https") else None, timeout=2)
        except OSError:
            return False
        return status == 200
    return True  # nothing to wait for: running is ready


def cluster_tls(cluster_dir: Path) -> ssl.SSLContext | None:
    """The admin client's TLS context, for the secure health endpoints; None before the kubeconfig exists."""
    try:
        return tls_context(cluster_dir / "kubeconfig")
    except (OSError, ValueError, KeyError, StopIteration, TypeError):
        return None
