"""Resolve the feature gates and runtime-config a cluster starts with, and check them first.

The matrix (clusters/feature-gates/v<minor>.yaml) names presets; command-line overrides go on top.
Unknown gate names, a gate switched on while a gate it needs is off, and malformed values are all
reported together, before anything is built or started: gate names are checked against the list of
every gate of that Kubernetes version (v<minor>-gates.txt) first, and against the installed
kube-apiserver's own --help once the binaries are there.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from clusters import FEATURE_GATES_DIR
from harness.core.errors import ConfigError, Problem

# The feature gates the suite has tests for (conformance/ markers; tests/unit keeps this list complete): what a
# vendor file may claim in spec.features.
SUITE_FEATURES = ("DynamicResourceAllocation", "DRAAdminAccess", "DRAConsumableCapacity", "DRADeviceBindingConditions",
                  "DRADeviceTaintRules", "DRADeviceTaints", "DRAExtendedResource", "DRAFractionalCapacityRange",
                  "DRAPartitionableDevices", "DRAPrioritizedList", "DRAResourceClaimDeviceStatus", "DRASchedulerFilterTimeout",
                  "DRAWorkloadResourceClaims", "GenericWorkload", "ResourceHealthStatus",
                  "DRAOptionalNodeOperations", "ResourceHealthStatusMessage", "DRAResourceClaimGranularStatusAuthorization",
                  "KubeletPodResourcesDynamicResources", "DRAResourcePoolStatus", "DRAPartitionableDevicesType",
                  "DRADeviceCompatibilityGroups", "DRANodeAllocatableResources",
                  "DRAListTypeAttributes", "DRADerivedAttributes")
_API_VERSION = re.compile(r"^(api/(all|ga|beta|alpha)|[a-z0-9]([a-z0-9.-]*[a-z0-9])?/v\d+((alpha|beta)\d+)?|v1)$")


@dataclass(frozen=True)
class GateInfo:
    stage: str
    default: bool
    locked: bool = False
    needs: tuple[str, ...] = ()
    tested_by: str = ""  # where its tests live when not in the conformance suite (e.g. the load scenarios)


@dataclass(frozen=True)
class Matrix:
    source: Path
    kubernetes_version: str
    gates: dict[str, GateInfo]
    presets: dict[str, dict]
    default_preset: str
    all_gates: frozenset[str] = frozenset()  # every gate name of this version (not only the DRA ones)


@dataclass(frozen=True)
class FeatureSettings:
    """What the components are started with."""

    preset: str
    gates: dict[str, bool] = field(default_factory=dict)  # only the gates set explicitly
    runtime_config: dict[str, bool] = field(default_factory=dict)

    def gates_flag(self) -> str:
        return ",".join(f"{name}={str(value).lower()}" for name, value in sorted(self.gates.items()))

    def runtime_config_flag(self) -> str:
        return ",".join(f"{name}={str(value).lower()}" for name, value in sorted(self.runtime_config.items()))

    def effective(self, matrix: Matrix) -> dict[str, bool]:
        """Every gate of the matrix with the value the cluster will run with."""
        values = {name: info.default for name, info in matrix.gates.items()}
        values.update(self.gates)
        return values

    def to_dict(self) -> dict:
        return {"preset": self.preset, "featureGates": dict(self.gates), "runtimeConfig": dict(self.runtime_config)}


def matrix_path(kubernetes_version: str) -> Path:
    minor = ".".join(kubernetes_version.lstrip("v").split(".")[:2])
    return FEATURE_GATES_DIR / f"v{minor}.yaml"


def gate_list_path(kubernetes_version: str) -> Path:
    return matrix_path(kubernetes_version).with_name(matrix_path(kubernetes_version).stem + "-gates.txt")


def load_matrix(kubernetes_version: str) -> Matrix:
    path = matrix_path(kubernetes_version)
    if not path.is_file():
        known = sorted(p.stem for p in FEATURE_GATES_DIR.glob("v*.yaml"))
        raise ConfigError([Problem("--kubernetes-version", "", f"no feature-gate matrix for {kubernetes_version}",
                                   ", ".join(known))])
    raw = yaml.safe_load(path.read_text())
    gates = {name: GateInfo(stage=info["stage"], default=bool(info["default"]), locked=bool(info.get("locked")),
                            needs=tuple(info.get("needs", ())), tested_by=str(info.get("testedBy") or ""))
             for name, info in raw["gates"].items()}
    gate_list = gate_list_path(kubernetes_version)
    all_gates = frozenset(line.strip() for line in gate_list.read_text().splitlines()
                          if line.strip() and not line.startswith("#")) if gate_list.is_file() else frozenset()
    return Matrix(path, str(raw["kubernetesVersion"]), gates, raw["presets"], raw["defaultPreset"], all_gates)


def parse_bool_map(text: str, flag: str) -> tuple[dict[str, bool], list[Problem]]:
    """Parse `A=true,B=false` as Kubernetes flags do."""
    values: dict[str, bool] = {}
    problems = []
    for item in filter(None, (part.strip() for part in (text or "").split(","))):
        name, sep, value = item.partition("=")
        if not sep or not name:
            problems.append(Problem(flag, item, "expected NAME=true or NAME=false"))
            continue
        if value.lower() not in ("true", "false"):
            problems.append(Problem(flag, name, f"value {value!r} is not a boolean", "true, false"))
            continue
        values[name.strip()] = value.lower() == "true"
    return values, problems


def resolve(matrix: Matrix, *, preset: str | None = None, gate_overrides: str = "",
            runtime_overrides: str = "", known_gates: set[str] | None = None) -> FeatureSettings:
    """Preset + overrides -> FeatureSettings, or ConfigError listing every problem found."""
    problems: list[Problem] = []
    preset = preset or matrix.default_preset
    if preset not in matrix.presets:
        raise ConfigError([Problem("--preset", preset, "unknown preset", ", ".join(sorted(matrix.presets)))])
    base = matrix.presets[preset]
    gates = {k: bool(v) for k, v in (base.get("featureGates") or {}).items()}
    runtime = {k: bool(v) for k, v in (base.get("runtimeConfig") or {}).items()}

    extra_gates, gate_problems = parse_bool_map(gate_overrides, "--feature-gates")
    extra_runtime, runtime_problems = parse_bool_map(runtime_overrides, "--runtime-config")
    problems += gate_problems + runtime_problems
    gates.update(extra_gates)
    runtime.update(extra_runtime)

    # known_gates None: the binaries are not there yet, so names are checked against the version's gate
    # list (when the version has one), and again against the binaries once they are there.
    known = set(matrix.gates) | matrix.all_gates | set(known_gates or ())
    check_names = known_gates is not None or bool(matrix.all_gates)
    for name in sorted(gates):
        if check_names and name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=3)
            problems.append(Problem("--feature-gates", name, "unknown feature gate in Kubernetes "
                                    f"{matrix.kubernetes_version}", ("did you mean " + ", ".join(close) + "?")
                                    if close else f"see {gate_list_path(matrix.kubernetes_version).name}"))
        elif name in matrix.gates and matrix.gates[name].locked and gates[name] != matrix.gates[name].default:
            problems.append(Problem("--feature-gates", name, f"is locked to {str(matrix.gates[name].default).lower()}"
                                    f" in {matrix.kubernetes_version}", str(matrix.gates[name].default).lower()))
    for name in sorted(runtime):
        if not _API_VERSION.match(name):
            problems.append(Problem("--runtime-config", name, "not an API group/version",
                                    "e.g. resource.k8s.io/v1beta2, api/alpha"))
    effective = FeatureSettings(preset, gates, runtime).effective(matrix)
    for name, on in sorted(effective.items()):
        if not on or name not in matrix.gates:
            continue
        for dependency in matrix.gates[name].needs:
            if not effective.get(dependency, True):
                problems.append(Problem("--feature-gates", name, f"needs {dependency}, which is off",
                                        f"enable {dependency} or disable {name}"))
    if problems:
        raise ConfigError(problems)
    return FeatureSettings(preset, gates, runtime)


def parse_known_gates(help_text: str) -> set[str]:
    """Gate names from the `--feature-gates` section of a Kubernetes component's --help output.

    Since the versioned feature gates, components print each gate as `kube:Name=true|false (...)`.
    """
    return set(re.findall(r"^\s+(?:kube:)?([A-Z][A-Za-z0-9]+)=true\|false \(", help_text, re.M))
