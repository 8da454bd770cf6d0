"""What a container on a real node was really given, judged from outside it: the OCI spec its runtime
built (after CDI injection) and the CDI devices a driver wrote for a claim. Image-independent, so the
container-side rules hold for any driver and any test image (a pause image prints nothing).

An "item" is one edit a container can see: `env K=V`, `device <path>` (a device node), `mount <path>`
(a mount's place in the container). CDI edits and OCI specs are compared as sets of items.
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import yaml

QUERY_TIMEOUT = 30


class ViewError(Exception):
    """The runtime or a CDI spec could not be read; the message names what and why."""


def oci_items(spec: dict) -> set[str]:
    process, linux = spec.get("process") or {}, spec.get("linux") or {}
    return ({f"env {e}" for e in process.get("env") or []}
            | {f"device {d.get('path')}" for d in linux.get("devices") or []}
            | {f"mount {m.get('destination')}" for m in spec.get("mounts") or []})


def container_items(runtime_query: tuple[str, ...], container_id: str) -> set[str]:
    """The items of a container's OCI spec, asked of its runtime (`ctr containers info`)."""
    cid = container_id.split("://", 1)[-1]
    try:
        proc = subprocess.run([*runtime_query, "containers", "info", cid], capture_output=True, text=True,
                              timeout=QUERY_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise ViewError(f"cannot ask the container runtime about container {cid}: {err}") from None
    if proc.returncode != 0:
        raise ViewError(f"the container runtime does not know container {cid}: {proc.stderr.strip()[-300:]}")
    try:
        return oci_items(json.loads(proc.stdout).get("Spec") or {})
    except ValueError as err:
        raise ViewError(f"the container runtime's answer about container {cid} is not JSON: {err}") from None


def cdi_edit_items(edits: dict | None) -> set[str]:
    edits = edits or {}
    return ({f"env {e}" for e in edits.get("env") or []}
            | {f"device {d.get('path')}" for d in edits.get("deviceNodes") or []}
            | {f"mount {m.get('containerPath')}" for m in edits.get("mounts") or []})


@dataclass(frozen=True)
class CdiDevice:
    qualified: str  # <vendor>/<class>=<name>
    name: str
    items: frozenset[str]
    file: Path


def claim_cdi_devices(cdi_dir: Path, claim_uid: str) -> list[CdiDevice]:
    """The devices of every CDI spec file in `cdi_dir` that mentions the claim's UID (drivers write
    one spec per claim, named or filled with its UID); device-level edits only."""
    found: list[CdiDevice] = []
    if not cdi_dir.is_dir():
        return found
    for path in sorted(p for p in cdi_dir.iterdir() if p.is_file() and p.suffix in (".json", ".yaml", ".yml")):
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue  # removed meanwhile (another claim's unprepare)
        if claim_uid not in text:
            continue
        try:
            spec = yaml.safe_load(text) or {}  # JSON is YAML
        except yaml.YAMLError as err:
            raise ViewError(f"CDI spec {path} is not valid JSON or YAML: {err}") from None
        kind = spec.get("kind", "?")
        for device in spec.get("devices") or []:
            name = str(device.get("name", ""))
            found.append(CdiDevice(f"{kind}={name}", name, frozenset(cdi_edit_items(device.get("containerEdits"))),
                                   path))
    return found


def named_after(cdi_device: CdiDevice, device_name: str) -> bool:
    """Whether a CDI device's name carries a DRA device's name as a whole token (`<uid>-gpu-1` is gpu-1's,
    not gpu-10's): how drivers tie a claim's CDI devices to its allocated devices."""
    return re.search(rf"(^|[^A-Za-z0-9]){re.escape(device_name)}($|[^A-Za-z0-9])", cdi_device.name) is not None


def given(cdi_device: CdiDevice, items: set[str], baseline: set[str]) -> bool:
    """Whether a container got this CDI device: all of its edits are in the container's spec, and at
    least one of them is not in a claimless sibling's (so it is not just what every container has)."""
    return bool(cdi_device.items) and cdi_device.items <= items and not cdi_device.items <= baseline


def isolation_problems(where: str, claim: str, results: dict[str, tuple[str, str]], items_of: dict[str, set[str]],
                       baseline: set[str], cdi_devices: list[CdiDevice]) -> tuple[list[str], str | None]:
    """CT-CONTAINER-DEVICES for one pod: per container `c-<request>` that names one request, the CDI devices of
    its own request's device reached it and none of another request's did. `results`: request -> (pool, device);
    `items_of`: container -> its items. Returns (problems, why the rule cannot be judged here)."""
    owners = {request_name: [c for c in cdi_devices if named_after(c, device)]
              for request_name, (_, device) in results.items()}
    if not any(owners.values()):
        return [], (f"{where}: the CDI devices written for claim {claim} "
                    f"({', '.join(c.qualified for c in cdi_devices) or 'none'}) are not named after its devices "
                    f"({', '.join(d for _, d in results.values())}), so which container must see which cannot be told")
    problems = []
    for request_name, (pool, device) in results.items():
        container = f"c-{request_name}"
        for other, (other_pool, other_device) in results.items():
            for cdi in owners[other] if other != request_name else ():
                if cdi not in owners[request_name] and given(cdi, items_of[container], baseline):
                    problems.append(f"container {container} names request {request_name!r} (device {pool}/{device}) "
                                    f"but was given CDI device {cdi.qualified} of request {other!r}: its device "
                                    f"{other_pool}/{other_device} ({cdi.file})")
        for cdi in owners[request_name]:
            if not given(cdi, items_of[container], baseline):
                problems.append(f"container {container} names request {request_name!r} but lacks CDI device "
                                f"{cdi.qualified} of its own device {pool}/{device}: missing "
                                f"{sorted(cdi.items - items_of[container])}")
    return problems, None
