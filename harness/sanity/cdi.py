"""CDI device IDs and the spec files of a CDI directory, read the way a container runtime reads them.

A qualified device name is `<vendor>/<class>=<name>` (CDI specification v1.1.0, "Fully-qualified device
names"): vendor is letters, digits, `-`, `_` and `.`, starting with a letter and ending with a letter or
digit; class the same without `.`; the name is letters, digits, `-`, `_`, `.` and `:`, starting and
ending with a letter or digit. A runtime resolves the name from the `*.json` and `*.yaml` spec files of
its spec directories: the spec whose `kind` is `<vendor>/<class>` and that has a device of that name.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

VENDOR = r"[A-Za-z](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
CLASS = r"[A-Za-z](?:[A-Za-z0-9_-]*[A-Za-z0-9])?"
NAME = r"[A-Za-z0-9](?:[A-Za-z0-9_.:-]*[A-Za-z0-9])?"
QUALIFIED = re.compile(rf"^({VENDOR})/({CLASS})=({NAME})$")
SPEC_SUFFIXES = (".json", ".yaml", ".yml")


def parse(device_id: str) -> tuple[str, str] | None:
    """(kind `<vendor>/<class>`, device name) of a qualified CDI name, or None if it is not one."""
    match = QUALIFIED.match(device_id)
    return (f"{match.group(1)}/{match.group(2)}", match.group(3)) if match else None


@dataclass
class SpecDir:
    """What one CDI directory defines: kind -> device names, per file; files that do not parse."""

    path: Path
    devices: dict[str, dict[str, set[str]]] = field(default_factory=dict)  # file -> kind -> device names
    broken: dict[str, str] = field(default_factory=dict)  # file -> why it is not a spec

    def resolve(self, device_id: str) -> list[str]:
        """The files that define `device_id` (none: it does not resolve here)."""
        parsed = parse(device_id)
        if parsed is None:
            return []
        kind, name = parsed
        return sorted(f for f, kinds in self.devices.items() if name in kinds.get(kind, set()))

    @property
    def files(self) -> set[str]:
        return set(self.devices) | set(self.broken)


def read(directory: Path) -> SpecDir:
    """Every spec file of `directory` (not its subdirectories, as runtimes read it)."""
    found = SpecDir(Path(directory))
    try:
        entries = sorted(p for p in Path(directory).iterdir() if p.suffix in SPEC_SUFFIXES and p.is_file())
    except FileNotFoundError:
        return found
    for path in entries:
        try:
            text = path.read_text()
            data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
        except (OSError, ValueError, yaml.YAMLError) as err:
            found.broken[path.name] = f"does not parse: {err}"
            continue
        problem = _spec_problem(data)
        if problem:
            found.broken[path.name] = problem
            continue
        found.devices.setdefault(path.name, {}).setdefault(data["kind"], set()).update(
            str(device.get("name")) for device in data.get("devices") or [] if isinstance(device, dict))
    return found


def _spec_problem(data) -> str | None:
    if not isinstance(data, dict):
        return "is not a mapping"
    if not isinstance(data.get("cdiVersion"), str) or not data["cdiVersion"]:
        return "has no cdiVersion"
    kind = data.get("kind")
    if not isinstance(kind, str) or not re.match(rf"^{VENDOR}/{CLASS}$", kind):
        return f"kind {kind!r} is not <vendor>/<class>"
    if not isinstance(data.get("devices", []), list):
        return "devices is not a list"
    return None
