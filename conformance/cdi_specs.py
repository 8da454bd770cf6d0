"""The CDI spec files a driver writes for a claim on a node, in the node's CDI directory where the cluster's
backend can read it (the local backend's real node; a kind node, through `docker exec`)."""

from __future__ import annotations

from pathlib import Path

from harness.pytest_plugin.plugin import node_cdi_dir


def known_cdi_dir(dra_cluster, node: str) -> Path | None:
    """The CDI spec directory of `node` where the backend can read it (a Path, or a read-only stand-in for one)."""
    return node_cdi_dir(dra_cluster, node)


def cdi_specs_of(cdi_dir: Path, claim_uid: str) -> list[Path]:
    """The CDI spec files that mention the claim (drivers name them, or their devices, after its UID)."""
    if not cdi_dir.is_dir():
        return []
    return sorted(p for p in cdi_dir.iterdir() if p.is_file() and claim_uid in _text(p))


def _text(path) -> str:
    """A spec's text; "" for one removed since the directory was listed (another claim's unprepare, or this one's:
    a kind node's directory is listed and read in two steps)."""
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""
