"""`dra-harness profiles ...` and `dra-harness fault ...`: thin wrappers over fake_devices."""

from __future__ import annotations

from pathlib import Path

import yaml

from fake_devices import faults, profile, render
from fake_devices.errors import InvalidInput, Problem


def run(args, out) -> int:
    if args.action == "list":
        from rich.console import Console
        from rich.table import Table

        table = Table()
        for column in ("profile", "devices", "description"):
            table.add_column(column)
        for name in profile.builtin_names():
            prof = profile.load(name)
            counts = _device_counts(prof)
            table.add_row(name, ", ".join(f"{n} {k}" for k, n in counts.items()), prof.description)
        Console(file=out, highlight=False).print(table)
        return 0
    if args.action == "show":
        path = profile.resolve_path(args.profile)
        profile.load(args.profile)  # validate first: never show a broken profile as if it were fine
        out.write(path.read_text())
        return 0
    if args.action == "validate":
        return _validate(args.files, out)
    if args.action == "render":
        prof = profile.load(args.profile)
        fault_map = {}
        for item in args.fault:
            device, _, kind = item.partition("=")
            if kind not in render.FAULT_KINDS:
                raise InvalidInput([Problem("--fault", item, "expected DEVICE=KIND", ", ".join(render.FAULT_KINDS))])
            fault_map[device] = kind
        slices = render.render_node(prof, args.node, render.Drivers(args.domain), faults=fault_map)
        out.write(yaml.safe_dump_all([s for driver in sorted(slices) for s in slices[driver]], sort_keys=False))
        return 0
    raise ValueError(args.action)


def _device_counts(prof: profile.Profile) -> dict[str, int]:
    counts: dict[str, int] = {}
    for driver_devices, _ in render.devices_by_driver(prof, "node", render.Drivers("example.com")).values():
        for device in driver_devices:
            kind = device["attributes"]["type"]["string"]
            counts[kind] = counts.get(kind, 0) + 1
    return counts


def _validate(files: list[str], out) -> int:
    """Check each file (profile or cluster definition, by its kind); report all problems of all files."""
    from harness.config import cluster as cluster_config

    problems: list[Problem] = []
    for name in files:
        path = Path(name)
        try:
            kind = (yaml.safe_load(path.read_text()) or {}).get("kind") if path.is_file() else None
            if kind == cluster_config.KIND:
                cluster_config.load(name)
            else:
                profile.load(name)
            print(f"{name}: ok", file=out)
        except InvalidInput as err:
            problems.extend(err.problems)
        except (yaml.YAMLError, AttributeError) as err:
            problems.append(Problem(name, "(file)", f"not a YAML mapping: {err}"))
        except (UnicodeDecodeError, OSError) as err:
            problems.append(Problem(name, "(file)", f"cannot read as text: {err}"))
    if problems:
        raise InvalidInput(problems)
    return 0


def fault(args, out) -> int:
    from harness.k8s.client import Clients

    if args.kubeconfig:
        kubeconfig = Path(args.kubeconfig)
    else:
        from harness.backends.local import state

        kubeconfig = state.load(state.validate_name(args.name)).kubeconfig
    clients = Clients(kubeconfig)
    configmap = f"{args.instance}-faults"
    try:
        if args.action == "list":
            try:
                data = clients.core.read_namespaced_config_map(configmap, args.namespace).data or {}
            except Exception:
                data = {}
            for node in sorted(data):
                print(f"{node}: {data[node]}", file=out)
            return 0
        kind = args.kind if args.action == "inject" else None
        now = faults.set_fault(clients.core, args.namespace, configmap, args.node, args.device, kind)
        print(f"{args.node}: {faults.format_faults(now) or 'no faults'}", file=out)
        return 0
    finally:
        clients.close()
