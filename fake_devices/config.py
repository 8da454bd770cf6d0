"""Configuration of one fake-driver instance (file `kind: FakeDriverConfig`, or built in code).

An instance has a name (labels on its slices, its DeviceClass names, its fault ConfigMap) and a
driver domain: it publishes as `gpu.<domain>`, `storage.<domain>` and `nic.<domain>`. Which node
gets which profile: `nodes` maps node names to profiles explicitly; otherwise every node labelled
`dra-harness.x-k8s.io/profile=<profile>` gets that profile.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from fake_devices import profile as profiles
from fake_devices import yamlfile
from fake_devices.errors import InvalidInput, Problem
from fake_devices.schema import DNS_LABEL, DNS_SUBDOMAIN, Reader

KIND = "FakeDriverConfig"
PROFILE_LABEL = "dra-harness.x-k8s.io/profile"
DEVICE_TYPES = ("gpu", "mig", "nvme", "pmem", "cxl-memory", "nic")


@dataclass(frozen=True)
class DriverConfig:
    instance: str
    domain: str
    profiles: dict[str, profiles.Profile]
    nodes: dict[str, str] = field(default_factory=dict)  # node -> profile name; empty: use the node label
    namespace: str = "dra-harness-system"  # where the fault ConfigMap lives
    device_classes: bool = True
    extended_resources: dict[str, str] = field(default_factory=dict)  # device type -> extended resource name
    workers: int = 16
    variant: str | None = None  # a deliberately broken behaviour (fake_devices.variants), for self-tests only

    @property
    def faults_configmap(self) -> str:
        return f"{self.instance}-faults"


def domain_problem(domain: str) -> tuple[str, str] | None:
    """(problem, allowed) when `domain` cannot be a driver domain: driver names are DNS subdomains of at
    most 63 characters, and the longest one is storage.<domain>."""
    longest = f"storage.{domain}"
    if not DNS_SUBDOMAIN.match(domain or "") or len(longest) > 63:
        return (f"{domain!r} does not make valid driver names ({longest})",
                "a DNS subdomain of at most 55 characters; driver names are at most 63 characters")
    return None


def build(instance: str, domain: str, profile_names: list[str], *, nodes: dict[str, str] | None = None,
          source: str = "(config)", **options) -> DriverConfig:
    problems = []
    if not DNS_LABEL.match(instance or "") or len(instance) > 40:
        problems.append(Problem(source, "instance", f"{instance!r} is not a valid instance name",
                                "a DNS label of at most 40 characters"))
    problem = domain_problem(domain)
    if problem:
        problems.append(Problem(source, "domain", *problem))
    loaded: dict[str, profiles.Profile] = {}
    wanted = set(profile_names) | set((nodes or {}).values())
    for name in sorted(wanted):
        try:
            prof = profiles.load(name)
            loaded[prof.name] = prof
            if prof.name != name and name in (nodes or {}).values():
                # nodes may refer to a profile file by path; map it to the profile's own name
                nodes = {n: (prof.name if p == name else p) for n, p in (nodes or {}).items()}
        except InvalidInput as err:
            problems.extend(err.problems)
    for device_type, resource_name in options.get("extended_resources", {}).items():
        if device_type not in DEVICE_TYPES:
            problems.append(Problem(source, f"extendedResources.{device_type}", "unknown device type",
                                    ", ".join(DEVICE_TYPES)))
    if problems:
        raise InvalidInput(problems)
    return DriverConfig(instance=instance, domain=domain, profiles=loaded, nodes=dict(nodes or {}), **options)


def load(path: Path) -> DriverConfig:
    problems: list[Problem] = []
    data = yamlfile.load(path)
    top = Reader(data, str(path), "", problems)
    top.str("apiVersion", required=True)
    kind = top.str("kind", required=True)
    if kind is not None and kind != KIND:
        top.fail("kind", f"expected {KIND}", KIND)
    spec = top.mapping("spec", required=True)
    instance = spec.str("instance", required=True)
    domain = spec.str("domain", required=True)
    namespace = spec.str("namespace", default="dra-harness-system", pattern=DNS_LABEL, allowed="a DNS label")
    profile_names = [str(p) for p in spec.scalars("profiles")]
    nodes = {str(k): str(v) for k, v in spec.raw_mapping("nodes").items()}
    classes = spec.bool("deviceClasses", default=True)
    extended = {str(k): str(v) for k, v in spec.raw_mapping("extendedResources").items()}
    spec.done()
    top.done()
    if problems:
        raise InvalidInput(problems)
    return build(instance or "", domain or "", profile_names, nodes=nodes, source=str(path), namespace=namespace,
                 device_classes=classes, extended_resources=extended)


def to_yaml(config: DriverConfig) -> str:
    spec = {"instance": config.instance, "domain": config.domain, "namespace": config.namespace,
            "profiles": sorted(p.source if not p.source.startswith(str(profiles.BUILTIN_DIR)) else p.name
                               for p in config.profiles.values()),
            "nodes": config.nodes, "deviceClasses": config.device_classes,
            "extendedResources": config.extended_resources}
    return yaml.safe_dump({"apiVersion": profiles.API_VERSION, "kind": KIND, "spec": spec}, sort_keys=False)
