"""Cluster definitions (`clusters/*.yaml`, kind `Cluster`): node pools, feature preset, fake driver.

    spec:
      preset: all-dra                 # from clusters/feature-gates/v1.37.yaml
      featureGates: {SchedulerPreQueueingHints: false}
      runtimeConfig: {}
      driver: {instance: fake, domain: fake.dra-harness.x-k8s.io, extendedResources: {gpu: example.com/gpu}}
      nodePools:
      - {name: h100, count: 2, profile: dgx-h100, labels: {tier: training}}
      - {name: cpu, count: 2}         # no profile: a plain node without devices

Everything is checked before anything starts; every problem is reported with file and field.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from fake_devices import profile as profiles
from fake_devices.config import DEVICE_TYPES
from fake_devices.errors import InvalidInput, Problem
from fake_devices.schema import DNS_LABEL, DNS_SUBDOMAIN, Reader, read_header

API_VERSION = "dra-harness.x-k8s.io/v1alpha1"
KIND = "Cluster"
DEFAULT_DOMAIN = "fake.dra-harness.x-k8s.io"
LABEL_NAME = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                        r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
MAX_NODES = 5000
KUBELET_KINDS = ("simulated", "real")
MAX_REAL_NODES = 4
EXTENDED_RESOURCE = re.compile(r"^(?!kubernetes\.io/)(?!requests\.)[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


@dataclass(frozen=True)
class NodePool:
    name: str
    count: int
    profile: profiles.Profile | None = None
    labels: dict[str, str] = field(default_factory=dict)
    kubelet: str = "simulated"  # "simulated": KWOK nodes; "real": a kubelet + containerd on this machine each


@dataclass(frozen=True)
class DriverSettings:
    instance: str = "fake"
    domain: str = DEFAULT_DOMAIN
    extended_resources: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ClusterDefinition:
    name: str
    source: str
    preset: str | None
    feature_gates: dict[str, bool]
    runtime_config: dict[str, bool]
    pools: tuple[NodePool, ...]
    driver: DriverSettings

    @property
    def profiles(self) -> dict[str, profiles.Profile]:
        return {p.profile.name: p.profile for p in self.pools if p.profile}

    def gates_flag(self) -> str:
        return ",".join(f"{k}={str(v).lower()}" for k, v in sorted(self.feature_gates.items()))

    def runtime_flag(self) -> str:
        return ",".join(f"{k}={str(v).lower()}" for k, v in sorted(self.runtime_config.items()))


def resolve_path(name_or_path: str) -> Path:
    """A file path, or the name of a definition shipped in clusters/ (e.g. `mixed`)."""
    from clusters import DIRECTORY

    candidate = Path(name_or_path)
    if candidate.is_file():
        return candidate
    shipped = DIRECTORY / f"{name_or_path}.yaml"
    return shipped if shipped.is_file() else candidate


def load(name_or_path: str) -> ClusterDefinition:
    path = resolve_path(name_or_path)
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError) as err:
        raise InvalidInput([Problem(str(path), "(file)", f"cannot read as text: {err}")]) from None
    except yaml.YAMLError as err:
        raise InvalidInput([Problem(str(path), "(file)", f"not valid YAML: {err}")]) from None
    return parse(data, str(path))


def _bool_map(reader: Reader, key: str) -> dict[str, bool]:
    result = {}
    for name, value in reader.raw_mapping(key).items():
        if not isinstance(value, bool):
            reader.fail(f"{reader.at(key)}.{name}", f"must be true or false, not {value!r}")
        else:
            result[str(name)] = value
    return result


def parse(data, source: str) -> ClusterDefinition:
    problems: list[Problem] = []
    top = Reader(data, source, "", problems)
    name, spec = read_header(top, API_VERSION, KIND, name_pattern=DNS_LABEL, name_allowed="a DNS label")
    preset = spec.str("preset")
    gates = _bool_map(spec, "featureGates")
    runtime = _bool_map(spec, "runtimeConfig")

    drv = spec.mapping("driver")
    instance = drv.str("instance", default="fake", pattern=DNS_LABEL, allowed="a DNS label")
    if instance and len(instance) > 40:
        drv.fail(drv.at("instance"), f"{instance!r} is longer than 40 characters")
    domain = drv.str("domain", default=DEFAULT_DOMAIN, pattern=DNS_SUBDOMAIN, allowed="a DNS subdomain")
    if domain and len(f"storage.{domain}") > 63:
        drv.fail(drv.at("domain"), f"driver names like storage.{domain} would exceed 63 characters")
    extended = {}
    for device_type, resource_name in drv.raw_mapping("extendedResources").items():
        where = f"{drv.at('extendedResources')}.{device_type}"
        if device_type not in DEVICE_TYPES:
            drv.fail(where, "unknown device type", ", ".join(DEVICE_TYPES))
        elif not isinstance(resource_name, str) or not EXTENDED_RESOURCE.match(resource_name):
            drv.fail(where, f"{resource_name!r} is not an extended resource name", "domain/name, e.g. example.com/gpu")
        else:
            extended[str(device_type)] = resource_name
    drv.done()

    pools = []
    seen: set[str] = set()
    total = 0
    for pool in spec.list("nodePools", required=True):
        pool_name = pool.str("name", required=True, pattern=DNS_LABEL, allowed="a DNS label")
        count = pool.int("count", required=True, minimum=0, maximum=MAX_NODES)
        profile_name = pool.str("profile")
        kubelet = pool.str("kubelet", default="simulated", choices=KUBELET_KINDS)
        if kubelet == "real" and (count or 0) > MAX_REAL_NODES:
            pool.fail(pool.at("count"), f"{count} real nodes", f"at most {MAX_REAL_NODES} (each runs a kubelet "
                                                               "and containerd on this machine)")
        labels = {}
        for key, value in pool.raw_mapping("labels").items():
            key, value = str(key), "" if value is None else str(value)
            if not LABEL_NAME.match(key):
                pool.fail(f"{pool.at('labels')}.{key}", "not a valid label key", "[prefix/]name, name of at most 63 characters")
            elif not LABEL_VALUE.match(value):
                pool.fail(f"{pool.at('labels')}.{key}", f"{value!r} is not a valid label value",
                          "at most 63 letters, digits, '-', '_', '.'")
            else:
                labels[key] = value
        pool.done()
        loaded = None
        if profile_name:
            try:
                loaded = profiles.load(profile_name)
            except InvalidInput as err:
                if len(err.problems) == 1 and err.problems[0].field == "(file)":
                    pool.fail(pool.at("profile"), f"unknown profile {profile_name!r}",
                              ", ".join(profiles.builtin_names()) + ", or a path to a profile file")
                else:
                    problems.extend(err.problems)
        if pool_name in seen:
            pool.fail(pool.at("name"), f"duplicate node pool {pool_name!r}")
        if pool_name:
            seen.add(pool_name)
        total += count or 0
        if pool_name is not None and count is not None:
            pools.append(NodePool(pool_name, count, loaded, labels, kubelet or "simulated"))
    if total > MAX_NODES:
        spec.fail(spec.at("nodePools"), f"{total} nodes in all", f"at most {MAX_NODES}")
    spec.done()
    top.done()
    if problems:
        raise InvalidInput(problems)
    return ClusterDefinition(name or "", source, preset, gates, runtime, tuple(pools),
                             DriverSettings(instance or "fake", domain or DEFAULT_DOMAIN, extended))
