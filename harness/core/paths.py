"""Where the harness keeps things: a versioned binary cache and per-cluster state directories.

Both follow the XDG base-directory convention and can be overridden by environment variables, so CI
can point the (slow to fill) binary cache at a persistent location.
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "DRA_HARNESS_CACHE_DIR"
STATE_ENV = "DRA_HARNESS_STATE_DIR"


def cache_root() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "dra-harness"


def state_root() -> Path:
    if os.environ.get(STATE_ENV):
        return Path(os.environ[STATE_ENV]).expanduser()
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(Path.home(), ".local", "state")
    return Path(base) / "dra-harness"


def clusters_dir() -> Path:
    return state_root() / "clusters"
