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

from clusters import DIRECTORY
from fake_devices import profile as profiles
from fake_devices import yamlfile
from fake_devices.config import DEVICE_TYPES
from fake_devices.errors import InvalidInput, Problem
from fake_devices.kubeletplugin.config import MAX_SOCKET_PATH
from fake_devices.render import Drivers
from fake_devices.schema import DNS_LABEL, DNS_SUBDOMAIN, Reader, label_problems, read_header
from harness.config import featuregates
from harness.core.errors import ConfigError
from harness.core.nodelayout import NodeDirs, node_root

API_VERSION = "dra-harness.x-k8s.io/v1alpha1"
KIND = "Cluster"
DEFAULT_DOMAIN = "fake.dra-harness.x-k8s.io"
# Nodes are named <pool>-<i>; a node's name is also the value of its kubernetes.io/hostname label,
# so it must be a label value (at most 63 characters), not only a DNS subdomain (253).
MAX_NODE_NAME = 63
MAX_NODES = 10000  # measured to fit a 24 GiB machine: BENCHMARKS.md "10,000 nodes"
KUBELET_KINDS = ("simulated", "real")
MAX_REAL_NODES = 4
EXTENDED_RESOURCE = re.compile(r"^(?!kubernetes\.io/)(?!requests\.)[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


@dataclass(frozen=True)
class NodePool:
    name: str
    count: int
    profile: profiles.Profile | None = None
    labels: dict[str, str] = field(default_factory=dict)  # the profile's nodeLabels, then the pool's own
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
    candidate = Path(name_or_path)
    if candidate.is_file():
        return candidate
    shipped = DIRECTORY / f"{name_or_path}.yaml"
    return shipped if shipped.is_file() else candidate


def load(name_or_path: str) -> ClusterDefinition:
    path = resolve_path(name_or_path)
    if not path.exists():
        shipped = sorted(p.stem for p in DIRECTORY.glob("*.yaml"))
        raise InvalidInput([Problem(str(name_or_path), "(file)", "no such cluster definition file or shipped name",
                                    ", ".join(shipped) + ", or a path to a Cluster file")])
    return parse(yamlfile.load(path), str(path))


def _bool_map(reader: Reader, key: str) -> dict[str, bool]:
    result = {}
    for name, value in reader.raw_mapping(key).items():
        if not isinstance(value, bool):
            reader.fail(f"{reader.at(key)}.{name}", f"must be true or false, not {value!r}", "true, false")
        else:
            result[str(name)] = value
    return result


def _beside(profile_name: str, base: Path) -> str:
    """A profile path relative to the definition's own file (as clusters/shapes/ names theirs), made
    absolute; a built-in name, an absolute path or a path relative to the working directory as it is."""
    if profile_name in profiles.builtin_names() or Path(profile_name).is_absolute():
        return profile_name
    beside = base / profile_name
    return str(beside.resolve()) if beside.is_file() else profile_name


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
        drv.fail(drv.at("instance"), f"{instance!r} is longer than 40 characters", "a DNS label of at most 40 characters")
    domain = drv.str("domain", default=DEFAULT_DOMAIN, pattern=DNS_SUBDOMAIN, allowed="a DNS subdomain")
    if domain and len(f"storage.{domain}") > 63:
        drv.fail(drv.at("domain"), f"driver names like storage.{domain} would exceed 63 characters",
                 "a DNS subdomain of at most 55 characters")
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
    profile_sources: dict[str, tuple[str, str]] = {}  # profile name -> (its file, the pool field naming it)
    total = 0
    for pool in spec.list("nodePools", required=True):
        pool_name = pool.str("name", required=True, pattern=DNS_LABEL, allowed="a DNS label")
        count = pool.int("count", required=True, minimum=0, maximum=MAX_NODES)
        profile_name = pool.str("profile")
        kubelet = pool.str("kubelet", default="simulated", choices=KUBELET_KINDS)
        if kubelet == "real" and (count or 0) > MAX_REAL_NODES:
            pool.fail(pool.at("count"), f"{count} real nodes", f"at most {MAX_REAL_NODES} (each runs a kubelet "
                                                               "and containerd on this machine)")
        raw_labels = pool.raw_mapping("labels")
        for key, problem, allowed in label_problems(raw_labels):
            pool.fail(f"{pool.at('labels')}.{key}", problem, allowed)
        labels = {str(k): "" if v is None else str(v) for k, v in raw_labels.items()}
        pool.done()
        if pool_name and count:
            longest = f"{pool_name}-{count - 1}"
            if len(longest) > MAX_NODE_NAME:
                pool.fail(pool.at("name"), f"node names like {longest} would be {len(longest)} characters",
                          f"a pool name of at most {MAX_NODE_NAME - 1 - len(str(count - 1))} characters for "
                          f"{count} nodes (node names are kubernetes.io/hostname label values, at most "
                          f"{MAX_NODE_NAME} characters)")
        loaded = None
        if profile_name:
            profile_name = _beside(profile_name, Path(source).parent)
        if profile_name and not profiles.resolve_path(profile_name).exists():
            pool.fail(pool.at("profile"), f"unknown profile {profile_name!r}",
                      ", ".join(profiles.builtin_names()) + ", or a path to a profile file")
        elif profile_name:
            try:
                loaded = profiles.load(profile_name)
            except InvalidInput as err:
                problems.extend(err.problems)  # located in the profile's own file
        if loaded is not None:
            where = pool.at("profile")
            earlier = profile_sources.setdefault(loaded.name, (loaded.source, where))
            if earlier[0] != loaded.source:
                # the driver maps nodes to profiles by name: two files of one name would swap devices
                pool.fail(where, f"profile name {loaded.name!r} from {loaded.source} is also the name of "
                                 f"{earlier[0]} ({earlier[1]})", "distinct metadata.name for different profiles")
            labels = {**loaded.node_labels, **labels}
        if pool_name in seen:
            pool.fail(pool.at("name"), f"duplicate node pool {pool_name!r}")
        if pool_name:
            seen.add(pool_name)
        total += count or 0
        if pool_name is not None and count is not None:
            pools.append(NodePool(pool_name, count, loaded, labels, kubelet or "simulated"))
    if total > MAX_NODES:
        spec.fail(spec.at("nodePools"), f"{total} nodes in all", f"at most {MAX_NODES}")
    if domain and any(p.kubelet == "real" and p.profile for p in pools):
        _check_plugin_sockets(drv, domain)
    spec.done()
    top.done()
    if problems:
        raise InvalidInput(problems)
    return ClusterDefinition(name or "", source, preset, gates, runtime, tuple(pools),
                             DriverSettings(instance or "fake", domain or DEFAULT_DOMAIN, extended))


def _check_plugin_sockets(drv: Reader, domain: str) -> None:
    """A real node with a profile runs the kubelet plugins, whose sockets are named after the drivers
    (<node dir>/kubelet/plugins_registry/<driver>-reg.sock); a unix socket path has at most 107 bytes."""
    dirs = NodeDirs(node_root() / ("0" * 8))  # node directories are <root>/<8 hex digits>
    sockets = [str(p) for driver in Drivers(domain).all()
               for p in (dirs.plugins_registry / f"{driver}-reg.sock", dirs.plugins / driver / "dra.sock")]
    longest = max(sockets, key=len)
    if len(longest.encode()) > MAX_SOCKET_PATH:
        longest_driver = max(Drivers(domain).all(), key=len)
        room = MAX_SOCKET_PATH - (len(longest.encode()) - len(domain.encode()))
        drv.fail(drv.at("domain"), f"a real node's kubelet plugin socket {longest} would be {len(longest.encode())} "
                                   f"bytes (driver {longest_driver})",
                 f"a domain of at most {room} characters with `kubelet: real` pools (unix socket paths are at most "
                 f"{MAX_SOCKET_PATH} bytes; node root {node_root()}, see DRA_HARNESS_NODE_ROOT)")


# Where a feature-gate problem found by featuregates.resolve (which names command-line flags) sits in a definition.
_FEATURE_FIELDS = {"--preset": "spec.preset", "--feature-gates": "spec.featureGates", "--runtime-config": "spec.runtimeConfig"}


def validate(name_or_path: str, kubernetes_version: str) -> ClusterDefinition:
    """Everything `cluster up --config` checks about a definition before it builds or starts anything:
    the file itself, its profiles, and its preset and gates against the Kubernetes version's matrix."""
    definition = load(name_or_path)
    matrix = featuregates.load_matrix(kubernetes_version)
    try:
        featuregates.resolve(matrix, preset=definition.preset, gate_overrides=definition.gates_flag(),
                             runtime_overrides=definition.runtime_flag())
    except ConfigError as err:
        located = []
        for problem in err.problems:
            where = _FEATURE_FIELDS.get(problem.source)
            if where is None:
                located.append(problem)
                continue
            field_path = where if where == "spec.preset" else f"{where}.{problem.field}"
            located.append(Problem(definition.source, field_path, problem.problem, problem.allowed))
        raise InvalidInput(located) from None
    return definition
