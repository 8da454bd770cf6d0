"""`dra-harness profiles ...` and `dra-harness fault ...`: thin wrappers over fake_devices."""

from __future__ import annotations

from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

from fake_devices import config as driver_config
from fake_devices import faultkinds, faults, profile, render, yamlfile
from fake_devices.controller import INSTANCE_LABEL
from fake_devices.errors import InvalidInput, Problem
from fake_devices.schema import DNS_LABEL, DNS_SUBDOMAIN
from harness.backends.local import state
from harness.config import cluster as cluster_config
from harness.k8s import errors
from harness.k8s.client import connect


def run(args, out) -> int:
    if args.action == "list":
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
        drivers = render.Drivers(args.domain)
        problems = _render_target_problems(args.node, args.domain, drivers)
        fault_map = _parse_faults(args.fault, prof, args.node, drivers, problems)
        if problems:
            raise InvalidInput(problems)
        slices = render.render_node(prof, args.node, drivers, faults=fault_map)
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


def _render_target_problems(node: str, domain: str, drivers: render.Drivers) -> list[Problem]:
    """A node name or domain that would make objects the API server rejects."""
    problems = []
    if not DNS_SUBDOMAIN.match(node):
        problems.append(Problem("--node", node, "is not a node name", "a DNS subdomain: lowercase letters, digits, "
                                                                    "'-' and '.', at most 253 characters"))
    else:
        longest = max((render.slice_name(node, driver, 99) for driver in drivers.all()), key=len)
        if len(longest) > 253:
            problems.append(Problem("--node", node, f"slice names like {longest[:40]}... would exceed 253 characters",
                                    f"a node name of at most {253 - (len(longest) - len(node))} characters"))
    problem = driver_config.domain_problem(domain)
    if problem:
        problems.append(Problem("--domain", domain, problem[0], problem[1]))
    return problems


def _parse_faults(items: list[str], prof: profile.Profile, node: str, drivers: render.Drivers,
                  problems: list[Problem]) -> dict[str, str]:
    """`--fault DEVICE=KIND` flags -> {device: kind}; every device must exist in the profile."""
    names = [d["name"] for devices, _ in render.devices_by_driver(prof, node, drivers).values() for d in devices]
    result = {}
    for item in items:
        device, _, kind = item.partition("=")
        if kind not in faultkinds.KINDS:
            problems.append(Problem("--fault", item, "expected DEVICE=KIND with a known kind", faultkinds.ALLOWED))
        elif device not in names:
            problems.append(Problem("--fault", item, f"profile {prof.name} has no device {device!r}",
                                    device_list(names)))
        else:
            result[device] = kind
    return result


def device_list(names: list[str], limit: int = 24) -> str:
    """Device names for a message: all of them, or the first `limit` and how many more."""
    shown = ", ".join(names[:limit])
    return shown if len(names) <= limit else f"{shown}, ... ({len(names) - limit} more)"


def _validate(files: list[str], out) -> int:
    """Check each file (profile or cluster definition, by its kind); report all problems of all files."""
    problems: list[Problem] = []
    for name in files:
        try:
            data = yamlfile.load(name)
            kind = data.get("kind") if isinstance(data, dict) else None
            if kind == cluster_config.KIND:
                cluster_config.parse(data, name)
            else:
                profile.parse(data, name)
            print(f"{name}: ok", file=out)
        except InvalidInput as err:
            problems.extend(err.problems)
    if problems:
        raise InvalidInput(problems)
    return 0


def _check_fault_args(args) -> None:
    names = {"--namespace": (args.namespace, DNS_LABEL, "a namespace name (DNS label)"),
             "--instance": (args.instance, DNS_LABEL, "a fake-driver instance name (DNS label)")}
    if args.action != "list":
        names["--node"] = (args.node, DNS_SUBDOMAIN, "a node name (DNS subdomain)")
        names["--device"] = (args.device, DNS_LABEL, "a device name (DNS label, at most 63 characters)")
    problems = [Problem(flag, value, "not a valid name", allowed)
                for flag, (value, pattern, allowed) in names.items() if not pattern.fullmatch(value)]
    if args.action == "inject" and (problem := faultkinds.problem("--kind", args.kind)) is not None:
        problems.append(problem)
    if problems:
        raise InvalidInput(problems)


def fault(args, out) -> int:
    _check_fault_args(args)  # input first, then the cluster
    if args.kubeconfig:
        kubeconfig, where = Path(args.kubeconfig), "--kubeconfig"
    else:
        kubeconfig, where = state.load(state.validate_name(args.name)).kubeconfig, f"cluster {args.name!r}"
    clients = connect(kubeconfig, where)  # a checked kubeconfig and an API server that answers
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
        _check_device(clients, args, configmap)
        now = faults.set_fault(clients.core, args.namespace, configmap, args.node, args.device, kind)
        print(f"{args.node}: {faults.format_faults(now) or 'no faults'}", file=out)
        return 0
    finally:
        clients.close()


def _check_device(clients, args, configmap: str) -> None:
    """Refuse a fault for a node or device the instance does not publish (a typo would be ignored by the
    driver); a device already faulted (a lost one is missing from the slices) can always be changed."""
    slices = clients.resource.list_resource_slice(label_selector=f"{INSTANCE_LABEL}={args.instance}").items
    devices: dict[str, list[str]] = {}
    for item in slices:
        names = devices.setdefault(item.spec.node_name or "", [])
        names += [d.name for d in item.spec.devices or []]
    found = errors.ignore_missing(clients.core.read_namespaced_config_map, configmap, args.namespace)
    data = (found.data or {}) if found is not None else {}
    faulted = faults.parse_faults(data.get(args.node, ""), f"ConfigMap {args.namespace}/{configmap} key {args.node}")
    if args.node not in devices and not faulted:
        nodes = sorted(n for n in devices if n)
        raise InvalidInput([Problem("--node", args.node, f"has no devices of fake-driver instance {args.instance}",
                                    device_list(nodes) if nodes else f"no node has devices of {args.instance} "
                                                                      "(is --instance right?)")])
    known = sorted(set(devices.get(args.node, [])) | set(faulted))
    if args.device not in known:
        raise InvalidInput([Problem("--device", args.device, f"node {args.node} has no such device",
                                    device_list(known))])
