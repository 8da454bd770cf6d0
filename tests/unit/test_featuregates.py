"""Feature-gate matrix and resolution (harness/config/featuregates.py, clusters/feature-gates/v1.37.yaml)."""

from __future__ import annotations

import glob
import os
import re
import subprocess

import pytest

from harness.config.featuregates import FeatureSettings, load_matrix, parse_known_gates, resolve
from harness.core import paths
from harness.core.errors import ConfigError


@pytest.fixture(scope="module")
def matrix():
    return load_matrix("1.37.2")


def _problem_text(err: ConfigError) -> str:
    return "\n".join(str(p) for p in err.problems)


# --- the matrix -------------------------------------------------------------------------------


def test_matrix_loads_with_all_dra_default(matrix):
    assert matrix.kubernetes_version == "1.37"
    assert matrix.default_preset == "all-dra"
    assert {"all-dra", "ga-only"} <= set(matrix.presets)
    assert matrix.source.name == "v1.37.yaml"
    assert matrix.gates["DynamicResourceAllocation"].locked
    assert matrix.gates["DRAWorkloadResourceClaims"].needs == ("DynamicResourceAllocation", "GenericWorkload")


def test_matrix_is_internally_consistent(matrix):
    # Every `needs` names a gate of the matrix, and every preset sets only gates the matrix knows.
    for name, info in matrix.gates.items():
        assert info.stage in ("alpha", "beta", "GA"), name
        for dependency in info.needs:
            assert dependency in matrix.gates, f"{name} needs unknown gate {dependency}"
    for preset, body in matrix.presets.items():
        for gate in (body.get("featureGates") or {}):
            assert gate in matrix.gates, f"preset {preset} sets {gate}, which is not in the matrix"


def test_load_matrix_unknown_version():
    with pytest.raises(ConfigError) as info:
        load_matrix("1.99.0")
    assert len(info.value.problems) == 1
    problem = info.value.problems[0]
    assert problem.source == "--kubernetes-version"
    assert "1.99.0" in problem.problem
    assert "v1.37" in (problem.allowed or "")


# --- presets ----------------------------------------------------------------------------------


def test_all_dra_preset(matrix):
    settings = resolve(matrix, preset="all-dra")
    assert settings.preset == "all-dra"
    for gate in ("DRAWorkloadResourceClaims", "GenericWorkload", "SchedulerPreQueueingHints"):
        assert settings.gates[gate] is True, gate
    assert settings.runtime_config["resource.k8s.io/v1beta2"] is True
    assert settings.runtime_config["scheduling.k8s.io/v1beta1"] is True


def test_default_preset_is_all_dra(matrix):
    assert resolve(matrix) == resolve(matrix, preset="all-dra")


def test_all_dra_enabled_gates_have_their_needs(matrix):
    settings = resolve(matrix, preset="all-dra")
    effective = settings.effective(matrix)
    enabled = [name for name, on in settings.gates.items() if on]
    assert enabled
    for name in enabled:
        for dependency in matrix.gates[name].needs:
            assert effective[dependency], f"{name} is on but needs {dependency}, which is off"


def test_all_dra_switches_on_every_dra_gate(matrix):
    # The preset's promise: every DRA gate 1.37 has is on.
    effective = resolve(matrix, preset="all-dra").effective(matrix)
    off = sorted(name for name, on in effective.items() if name.startswith("DRA") and not on)
    assert off == []


def test_ga_only_preset(matrix):
    settings = resolve(matrix, preset="ga-only")
    assert settings.gates == {}
    assert settings.runtime_config == {}
    assert settings.gates_flag() == ""
    assert settings.runtime_config_flag() == ""
    assert settings.effective(matrix) == {name: info.default for name, info in matrix.gates.items()}


def test_unknown_preset_lists_presets(matrix):
    with pytest.raises(ConfigError) as info:
        resolve(matrix, preset="nope")
    (problem,) = info.value.problems
    assert problem.source == "--preset"
    assert problem.field == "nope"
    assert "all-dra" in problem.allowed and "ga-only" in problem.allowed
    assert "all-dra" in str(info.value)


# --- overrides --------------------------------------------------------------------------------


def test_override_on_top_of_preset(matrix):
    settings = resolve(matrix, preset="all-dra", gate_overrides="SchedulerPreQueueingHints=false")
    assert settings.gates["SchedulerPreQueueingHints"] is False
    assert settings.gates["DRAWorkloadResourceClaims"] is True
    assert "SchedulerPreQueueingHints=false" in settings.gates_flag()


def test_runtime_override(matrix):
    settings = resolve(matrix, preset="ga-only", runtime_overrides="resource.k8s.io/v1beta2=true, api/alpha=false")
    assert settings.runtime_config == {"resource.k8s.io/v1beta2": True, "api/alpha": False}


def test_unknown_gate_with_known_gates_suggests(matrix):
    with pytest.raises(ConfigError) as info:
        resolve(matrix, gate_overrides="DRAWorkloadResourceClaim=true", known_gates={"MemoryQoS"})
    (problem,) = info.value.problems
    assert problem.field == "DRAWorkloadResourceClaim"
    assert "unknown feature gate" in problem.problem
    assert "did you mean" in problem.allowed
    assert "DRAWorkloadResourceClaims" in problem.allowed
    message = str(info.value)
    assert "DRAWorkloadResourceClaim" in message and "did you mean" in message


def test_unknown_gate_is_refused_before_the_binaries_exist(matrix):
    # known_gates=None: nothing is built yet; the version's gate list decides (issue 16, item 7: a cold
    # cache must not build for 11 minutes before an unknown gate is refused).
    with pytest.raises(ConfigError) as info:
        resolve(matrix, gate_overrides="DRAWorkloadResourceClaim=true", known_gates=None)
    (problem,) = info.value.problems
    assert (problem.source, problem.field) == ("--feature-gates", "DRAWorkloadResourceClaim")
    assert "unknown feature gate in Kubernetes 1.37" in problem.problem
    assert "DRAWorkloadResourceClaims" in problem.allowed


def test_non_dra_gate_of_the_version_is_accepted_before_the_binaries_exist(matrix):
    settings = resolve(matrix, gate_overrides="MemoryQoS=true,AllAlpha=false", known_gates=None)
    assert settings.gates["MemoryQoS"] is True


def test_gate_list_covers_the_matrix(matrix):
    assert len(matrix.all_gates) > 200
    named = set(matrix.gates) | {g for p in matrix.presets.values() for g in (p.get("featureGates") or {})}
    assert named <= matrix.all_gates


def test_version_without_gate_list_checks_names_only_against_binaries(matrix):
    import dataclasses

    bare = dataclasses.replace(matrix, all_gates=frozenset())
    settings = resolve(bare, gate_overrides="SomethingNew=true", known_gates=None)
    assert settings.gates["SomethingNew"] is True


def test_gate_known_to_binary_but_not_matrix_is_accepted(matrix):
    settings = resolve(matrix, gate_overrides="MemoryQoS=true", known_gates={"MemoryQoS", "AllAlpha"})
    assert settings.gates["MemoryQoS"] is True
    assert "MemoryQoS=true" in settings.gates_flag()


@pytest.mark.parametrize("text, fragment", [("Foo", "expected NAME=true"), ("Foo=maybe", "not a boolean"),
                                            ("=true", "expected NAME=true")])
def test_malformed_gate(matrix, text, fragment):
    with pytest.raises(ConfigError) as info:
        resolve(matrix, gate_overrides=text)
    (problem,) = info.value.problems
    assert problem.source == "--feature-gates"
    assert fragment in problem.problem


def test_all_problems_reported_together(matrix):
    with pytest.raises(ConfigError) as info:
        resolve(matrix, gate_overrides="Foo,Bar=maybe,DRAExtendedResource=false,Typo=true",
                runtime_overrides="not a group=true", known_gates=set())
    problems = info.value.problems
    assert len(problems) == 5, _problem_text(info.value)
    fields = {p.field for p in problems}
    assert fields == {"Foo", "Bar", "DRAExtendedResource", "Typo", "not a group"}
    # one message lists them all, one per line
    assert str(info.value).count("\n  - ") == 5


def test_disabled_dependency_names_both(matrix):
    with pytest.raises(ConfigError) as info:
        resolve(matrix, preset="all-dra", gate_overrides="GenericWorkload=false")
    (problem,) = info.value.problems
    text = str(problem)
    assert "DRAWorkloadResourceClaims" in text and "GenericWorkload" in text
    assert "needs" in problem.problem


def test_disabling_both_dependency_and_dependent_is_fine(matrix):
    settings = resolve(matrix, preset="all-dra",
                       gate_overrides="GenericWorkload=false,DRAWorkloadResourceClaims=false")
    assert settings.effective(matrix)["GenericWorkload"] is False


def test_locked_gate_against_default(matrix):
    with pytest.raises(ConfigError) as info:
        resolve(matrix, gate_overrides="DynamicResourceAllocation=false")
    messages = [str(p) for p in info.value.problems]
    assert any("DynamicResourceAllocation" in m and "locked" in m for m in messages), messages


def test_locked_gate_at_its_default_is_fine(matrix):
    assert resolve(matrix, gate_overrides="DynamicResourceAllocation=true").gates["DynamicResourceAllocation"]


def test_bad_runtime_config_key(matrix):
    with pytest.raises(ConfigError) as info:
        resolve(matrix, runtime_overrides="not a group=true")
    (problem,) = info.value.problems
    assert problem.source == "--runtime-config"
    assert problem.field == "not a group"


# --- flags and help parsing -------------------------------------------------------------------


def test_flags_are_sorted():
    settings = FeatureSettings("x", {"B": False, "A": True, "C": True},
                               {"scheduling.k8s.io/v1beta1": True, "resource.k8s.io/v1beta2": False})
    assert settings.gates_flag() == "A=true,B=false,C=true"
    assert settings.runtime_config_flag() == "resource.k8s.io/v1beta2=false,scheduling.k8s.io/v1beta1=true"
    assert settings.to_dict()["featureGates"] == {"B": False, "A": True, "C": True}


HELP_EXCERPT = """\
Usage:
  kube-apiserver [flags]

Generic flags:

      --feature-gates mapStringBool
                A set of key=value pairs that describe feature gates for alpha/experimental features. Options are:
                APIResponseCompression=true|false (BETA - default=true)
                AllAlpha=true|false (ALPHA - default=false)
                AllBeta=true|false (BETA - default=false)
                DRAWorkloadResourceClaims=true|false (BETA - default=false)
                GenericWorkload=true|false (BETA - default=false)
      --goaway-chance float
                To prevent HTTP/2 clients from getting stuck on a single apiserver, randomly close a connection.
                Example=value is not a gate line
"""

# What 1.37 really prints: versioned gates carry the component prefix.
HELP_EXCERPT_VERSIONED = """\
      --feature-gates colonSeparatedMultimapStringString   Comma-separated list of component:key=value pairs.
                                                           If the component is not specified, defaults to "kube". Options are:
                                                           kube:AllAlpha=true|false (ALPHA - default=false)
                                                           kube:DRAFractionalCapacityRange=true|false (BETA - default=false), or DRAFractionalCapacityRange=true|false (BETA - default=true) if --min-compatibility-version>=1.37
                                                           kube:DRAWorkloadResourceClaims=true|false (BETA - default=false)
      --goaway-chance float                                To prevent HTTP/2 clients from getting stuck.
"""


def test_parse_known_gates():
    assert parse_known_gates(HELP_EXCERPT) == {"APIResponseCompression", "AllAlpha", "AllBeta",
                                                "DRAWorkloadResourceClaims", "GenericWorkload"}


def test_parse_known_gates_with_component_prefix():
    assert parse_known_gates(HELP_EXCERPT_VERSIONED) == {"AllAlpha", "DRAFractionalCapacityRange",
                                                          "DRAWorkloadResourceClaims"}


def test_parse_known_gates_empty():
    assert parse_known_gates("") == set()


# --- the matrix against the real binary -------------------------------------------------------

_APISERVERS = sorted(set(glob.glob(os.path.expanduser("~/.cache/dra-harness/binaries/*/kube-apiserver")))
                     | set(glob.glob(str(paths.cache_root() / "binaries" / "*" / "kube-apiserver"))))
_GATE_LINE = re.compile(r"^\s+(?:kube:)?([A-Z][A-Za-z0-9]+)=true\|false \((ALPHA|BETA|GA|DEPRECATED) - default=(true|false)\)",
                        re.M)


def _apiserver_gates(apiserver: str, matrix) -> tuple[str, set[str]]:
    """The binary's --help text and the gate names it lists (skips a binary of another version)."""
    version = re.search(r"kubernetes-v(\d+\.\d+)", apiserver)
    if version and version.group(1) != matrix.kubernetes_version:
        pytest.skip(f"{apiserver} is not Kubernetes {matrix.kubernetes_version}")
    help_text = subprocess.run([apiserver, "--help"], capture_output=True, text=True, timeout=30).stdout
    known = parse_known_gates(help_text)
    assert "AllAlpha" in known, "could not parse the gate list of kube-apiserver --help"
    return help_text, known


@pytest.mark.skipif(not _APISERVERS, reason="no kube-apiserver in ~/.cache/dra-harness/binaries or $DRA_HARNESS_CACHE_DIR "
                                            "(run `dra-harness binaries install` to enable this check)")
@pytest.mark.parametrize("apiserver", _APISERVERS)
def test_matrix_gates_match_real_apiserver(apiserver, matrix):
    help_text, known = _apiserver_gates(apiserver, matrix)
    # Kubernetes hides GA gates from --help, so only the alpha and beta ones can be checked by name.
    listed = {name: (stage.lower(), default == "true") for name, stage, default in _GATE_LINE.findall(help_text)}
    problems = []
    for name, info in matrix.gates.items():
        if info.stage == "GA":
            continue
        if name not in known:
            problems.append(f"{name}: not a gate of {apiserver}")
        elif listed[name] != (info.stage, info.default):
            problems.append(f"{name}: matrix says {info.stage}/default={info.default}, binary says {listed[name]}")
    assert problems == []


@pytest.mark.skipif(not _APISERVERS, reason="no kube-apiserver in ~/.cache/dra-harness/binaries or $DRA_HARNESS_CACHE_DIR "
                                            "(run `dra-harness binaries install` to enable this check)")
@pytest.mark.parametrize("apiserver", _APISERVERS)
def test_gate_list_holds_every_gate_of_the_real_apiserver(apiserver, matrix):
    # The list refuses gates before any binary exists, so it must never miss one the binary accepts.
    _, known = _apiserver_gates(apiserver, matrix)
    assert sorted(known - matrix.all_gates) == []
