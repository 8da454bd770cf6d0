"""Malformed node profiles and cluster definitions are rejected with located problems.

Every file in testdata/invalid/ is one row of TABLE: the loader must raise InvalidInput with a Problem
at exactly the expected field whose text contains the expected fragment. Files named `cluster-*` are
cluster definitions (harness.config.cluster.load), all others node profiles (fake_devices.profile.load).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fake_devices import mig, profile
from fake_devices.errors import InvalidInput
from harness.config import cluster

REPO = Path(__file__).resolve().parents[2]
INVALID = Path(__file__).resolve().parent / "testdata" / "invalid"

# file stem -> (exact field of the expected Problem, fragment of its problem text)
TABLE: dict[str, tuple[str, str]] = {
    # --- node profiles: devices and their names ---
    "profile-duplicate-name-prefix": ("spec.gpus[1].namePrefix", "device names gpu-N are already used by spec.gpus[0]"),
    "profile-name-prefix-too-long": ("spec.gpus[0].namePrefix", "would be longer than 63 characters"),
    "profile-no-devices": ("spec", "declares no devices"),
    "profile-count-zero": ("spec.gpus[0].count", "0 is out of range"),
    "profile-count-too-large": ("spec.nics[0].count", "65 is out of range"),
    "profile-unknown-gpu-model": ("spec.gpus[0].model", "unknown GPU model 'X9000'"),
    "profile-storage-kind-unknown": ("spec.storage[0].kind", "unknown value 'tape'"),
    # --- MIG ---
    "profile-mig-bad-start": ("spec.gpus[0].mig.partitions[0].start", "3g.40gb cannot start at memory slice 2"),
    "profile-mig-overlap": ("spec.gpus[0].mig.partitions[1]", "2g.20gb@2 overlaps memory slices 2 (3g.40gb@0)"),
    "profile-mig-two-media-units": ("spec.gpus[0].mig.partitions",
                                    "more than one partition takes the GPU's single media"),
    "profile-mig-unknown-profile": ("spec.gpus[0].mig.partitions[0].profile", "unknown MIG profile '5g.50gb'"),
    "profile-mig-on-t4": ("spec.gpus[0].mig.mode", "T4 has no MIG profile table"),
    "profile-mig-fixed-without-partitions": ("spec.gpus[0].mig.partitions", "mode fixed needs at least one partition"),
    "profile-mig-partitions-without-fixed": ("spec.gpus[0].mig.partitions", "only used with mode fixed"),
    # --- topology ---
    "profile-attach-unknown-numa": ("spec.storage[0].attach[0].numaNode", "unknown NUMA node 3"),
    "profile-attach-unknown-root": ("spec.gpus[0].attach[0].pcieRoot", "unknown PCIe root 'pci0000:99'"),
    "profile-attach-numa-contradicts-root": ("spec.gpus[0].attach[0].numaNode",
                                             "PCIe root pci0000:80 belongs to NUMA node 1, not 0"),
    "profile-attach-pcie-device-without-root": ("spec.nics[0].attach[0].pcieRoot", "is required for a PCIe device"),
    "profile-attach-more-places-than-devices": ("spec.gpus[0].attach", "lists 2 places for 1 devices"),
    "profile-pcie-root-malformed": ("spec.numaNodes[0].pcieRoots[0]", "'pci0:10' is not a PCIe root"),
    "profile-pcie-root-listed-twice": ("spec.numaNodes[1].pcieRoots[0]", "PCIe root pci0000:10 is already listed"),
    "profile-numa-duplicate-id": ("spec.numaNodes[1].id", "duplicate NUMA node id 0"),
    "profile-numa-bad-cpu-list": ("spec.numaNodes[1].cpus", "'8..15' is not valid"),
    # --- quantities ---
    "profile-quantity-with-space": ("spec.storage[0].capacity", "'80 GB' is not a valid quantity"),
    "profile-quantity-zero": ("spec.nics[0].bandwidth", "'0' must be greater than zero"),
    "profile-quantity-negative": ("spec.gpus[0].memory", "'-16Gi' must be greater than zero"),
    "profile-sharing-default-over-capacity": ("spec.storage[0].sharing.default",
                                              "2Ti is more than the device capacity 1Ti"),
    "profile-sharing-default-below-min": ("spec.storage[0].sharing.default", "5Gi is below min 10Gi"),
    "profile-ioshare-without-sharing": ("spec.storage[0].ioShare", "needs `sharing`"),
    "profile-ioshare-default-off-step": ("spec.storage[0].ioShare.step", "default and max must be min + a multiple of 50m"),
    "profile-ioshare-not-milli": ("spec.storage[0].ioShare.step", "0.0005 is not a whole number of milli-units"),
    "profile-ioshare-over-whole": ("spec.storage[0].ioShare.max", "1.5 is more than the whole device (1)"),
    # --- attributes ---
    "profile-too-many-attributes": ("spec.nics[0].attributes", "device nic-0 would have 33 attributes and capacities"),
    "profile-attribute-name-with-space": ("spec.gpus[0].attributes.bad name!", "'bad name!' is not a qualified name"),
    "profile-attribute-name-leading-dash": ("spec.gpus[0].attributes.-x", "'-x' is not a qualified name"),
    "profile-attribute-identifier-too-long": ("spec.gpus[0].attributes." + "a" * 33, "is not a qualified name"),
    "profile-attribute-domain-too-long": ("spec.gpus[0].attributes." + "d" * 60 + ".com/firmware",
                                          "is not a qualified name"),
    "profile-attribute-reserved-namespace": ("spec.gpus[0].attributes.resource.kubernetes.io/numaNode",
                                             "standard attributes are set from the topology"),
    "profile-attribute-value-too-long": ("spec.gpus[0].attributes.firmware", "unsupported attribute value"),
    "profile-attribute-version-not-semver": ("spec.gpus[0].attributes.driverVersion", "unsupported attribute value"),
    # --- binding conditions ---
    "profile-binding-without-failure-conditions": ("spec.gpus[0].binding.failureConditions",
                                                   "must list at least one condition type"),
    "profile-binding-conditions-overlap": ("spec.gpus[0].binding.failureConditions",
                                           "attached is also a binding condition"),
    "profile-binding-condition-invalid": ("spec.gpus[0].binding.conditions[0]", "'not a type!' is not a condition type"),
    "profile-binding-too-many-conditions": ("spec.gpus[0].binding.conditions", "lists 5 condition types"),
    "profile-binding-attach-unknown": ("spec.gpus[0].binding.attach", "unknown value 'sometimes'"),
    # --- document ---
    "profile-unknown-field": ("spec.nics[0].cout", "unknown field"),
    "profile-wrong-api-version": ("apiVersion", "unsupported apiVersion 'dra-harness.x-k8s.io/v1'"),
    "profile-wrong-kind": ("kind", "expected NodeProfile, not 'Profile'"),
    "profile-name-not-dns-label": ("metadata.name", "'Bad_Profile' is not valid"),
    "profile-several-mistakes": ("spec.gpus[0].cout", "unknown field"),
    "profile-yaml-syntax-error": ("line 8", "not valid YAML"),
    # --- cluster definitions ---
    "cluster-domain-not-subdomain": ("spec.driver.domain", "'Bad_Domain' is not valid"),
    "cluster-domain-too-long": ("spec.driver.domain", "would exceed 63 characters"),
    "cluster-duplicate-pool": ("spec.nodePools[1].name", "duplicate node pool 'tiny'"),
    "cluster-unknown-profile": ("spec.nodePools[0].profile", "unknown profile 'no-such-profile'"),
    "cluster-label-key-invalid": ("spec.nodePools[0].labels.bad key!", "not a valid label key"),
    "cluster-label-value-invalid": ("spec.nodePools[0].labels.tier", "'not valid!' is not a valid label value"),
    "cluster-feature-gate-not-bool": ("spec.featureGates.DRAPartitionableDevices", "must be true or false"),
    "cluster-pool-count-too-large": ("spec.nodePools[0].count", "10001 is out of range"),
    "cluster-total-nodes-too-large": ("spec.nodePools", "12000 nodes in all"),
    "cluster-pool-name-invalid": ("spec.nodePools[0].name", "'CPU_Pool' is not valid"),
    "cluster-wrong-kind": ("kind", "expected Cluster, not 'Clusters'"),
    "cluster-no-pools": ("spec.nodePools", "is required"),
    "cluster-yaml-syntax-error": ("line 8", "flow mapping at line 7"),
}


def _load(path: Path):
    return (cluster.load if path.name.startswith("cluster-") else profile.load)(str(path))


def _problems(path: Path):
    with pytest.raises(InvalidInput) as info:
        _load(path)
    return info.value.problems


def test_table_and_files_match():
    files = {p.stem for p in INVALID.glob("*.yaml")}
    assert files == set(TABLE), (f"files without a row: {sorted(files - set(TABLE))}; "
                                 f"rows without a file: {sorted(set(TABLE) - files)}")
    assert len(TABLE) >= 24


@pytest.mark.parametrize("stem", sorted(TABLE))
def test_invalid_file_is_rejected_with_located_problem(stem):
    field, fragment = TABLE[stem]
    path = INVALID / f"{stem}.yaml"
    problems = _problems(path)
    listing = "\n".join(f"  {p.field!r}: {p.problem}" for p in problems)
    assert any(p.field == field and fragment in p.problem for p in problems), \
        f"expected a problem at {field!r} containing {fragment!r}; got:\n{listing}"
    # every problem names the file it came from (cluster rows: the cluster file itself)
    assert all(p.source == str(path) for p in problems), listing


def test_one_mistake_files_report_only_that_mistake():
    """The single-mistake files differ from a valid document in one place: nothing else is reported."""
    for stem in sorted(set(TABLE) - {"profile-several-mistakes"}):
        problems = _problems(INVALID / f"{stem}.yaml")
        assert len(problems) == 1, f"{stem}: {[str(p) for p in problems]}"


def test_several_mistakes_are_all_reported_at_once():
    problems = _problems(INVALID / "profile-several-mistakes.yaml")
    fields = {p.field for p in problems}
    assert len(problems) >= 3
    assert {"apiVersion", "metadata.name", "spec.numaNodes[0].memory", "spec.gpus[0].cout",
            "spec.nics[0].bandwidth", "spec.nics[0].attach[0].pcieRoot"} <= fields
    with pytest.raises(InvalidInput) as info:
        profile.load(str(INVALID / "profile-several-mistakes.yaml"))
    assert f"({len(problems)} problems)" in str(info.value)


def test_yaml_syntax_error_names_a_line():
    (problem,) = _problems(INVALID / "profile-yaml-syntax-error.yaml")
    assert problem.field.startswith("line ") and int(problem.field.split()[1]) in (7, 8)
    (problem,) = _problems(INVALID / "cluster-yaml-syntax-error.yaml")
    assert problem.field == "line 8" and "at line 7" in problem.problem  # where it was found, where it began


# --- boundaries: the limits above are exact, not approximate ----------------------------------

_BOUNDARY_HEAD = (INVALID / "profile-count-zero.yaml").read_text().split("  gpus:")[0]


def _write(tmp_path: Path, body: str) -> str:
    path = tmp_path / "profile.yaml"
    path.write_text(_BOUNDARY_HEAD + body)
    return str(path)


def test_exactly_32_attributes_and_capacities_is_accepted(tmp_path):
    extras = "".join(f"      extra{i:02d}: {i}\n" for i in range(24))  # 7 own attributes + 1 capacity + 24
    loaded = profile.load(_write(tmp_path, "  nics:\n  - model: tiny-nic\n    bandwidth: 25G\n"
                                           "    attach: [{pcieRoot: pci0000:10}]\n    attributes:\n" + extras))
    assert len(loaded.nics[0].attributes) == 24


def test_limits_at_the_edge_are_accepted(tmp_path):
    body = ("  nics:\n  - model: tiny-nic\n    count: 64\n    bandwidth: 25G\n    attach: [{pcieRoot: pci0000:10}]\n"
            "    attributes:\n      " + "a" * 32 + ": 1\n      " + "d" * 59 + ".com/x: 1\n"
            "      fw: {version: 1.2.3-rc.1+build.5}\n      note: " + "x" * 64 + "\n")
    loaded = profile.load(_write(tmp_path, body))
    assert loaded.nics[0].count == 64
    assert loaded.nics[0].attributes["fw"] == {"version": "1.2.3-rc.1+build.5"}


def test_fixed_partitions_over_seven_compute_slices(tmp_path, monkeypatch):
    """The built-in tables cannot exceed 7 compute slices without overlapping memory slices, so the
    compute-slice check is exercised with a made-up table whose profiles have more compute than memory."""
    table = {"4g.20gb": mig.MigProfile("4g.20gb", 4, 2, (0, 2, 4, 6), 20)}
    monkeypatch.setitem(mig.TABLES, "FAKE-GPU", table)
    body = ("  gpus:\n  - model: FAKE-GPU\n    memory: 80Gi\n    multiprocessors: 100\n    architecture: Fake\n"
            "    count: 1\n    attach: [{pcieRoot: pci0000:10}]\n    mig:\n      mode: fixed\n      partitions:\n"
            "      - {profile: 4g.20gb, start: 0}\n      - {profile: 4g.20gb, start: 2}\n")
    with pytest.raises(InvalidInput) as info:
        profile.load(_write(tmp_path, body))
    (problem,) = info.value.problems
    assert problem.field == "spec.gpus[0].mig.partitions"
    assert "partitions use 8 compute slices" in problem.problem


def test_builtins_and_shipped_clusters_are_valid():
    for name in profile.builtin_names():
        assert profile.load(name).name == name
    for path in sorted((REPO / "clusters").glob("*.yaml")):
        assert cluster.load(str(path)).pools


# --- list attributes (DRAListTypeAttributes) ------------------------------------------------

def _nic_with(attributes: str, count: int = 1) -> str:
    """A one-group NIC profile body whose `attributes:` mapping is the given YAML lines."""
    return (f"  nics:\n  - model: tiny-nic\n    count: {count}\n    bandwidth: 25G\n"
            "    attach: [{pcieRoot: pci0000:10}]\n    attributes:\n" + attributes)


def test_list_attributes_take_the_api_typed_form(tmp_path):
    loaded = profile.load(_write(tmp_path, _nic_with(
        "      numas: [0, 1]\n      flags: [true, false, true]\n      domains: [a, " + "b" * 64 + "]\n"
        "      firmware: {versions: [1.2.3, 2.0.0-rc.1+build.5]}\n      single: [7]\n      plain: 3\n")))
    assert loaded.nics[0].attributes == {
        "numas": {"ints": [0, 1]}, "flags": {"bools": [True, False, True]},
        "domains": {"strings": ["a", "b" * 64]}, "firmware": {"versions": ["1.2.3", "2.0.0-rc.1+build.5"]},
        "single": {"ints": [7]}, "plain": {"int": 3}}


# attributes lines -> (exact field, fragment of the problem, fragment of what is allowed)
LIST_ATTRIBUTE_ERRORS = {
    "empty": ("      numas: []\n", "spec.nics[0].attributes.numas", "is an empty list", "a non-empty list"),
    "mixed-int-string": ("      numas: [0, x]\n", "spec.nics[0].attributes.numas", "mixes integers and strings",
                         "a list of one type"),
    "mixed-bool-int": ("      numas: [true, 1]\n", "spec.nics[0].attributes.numas", "mixes true/false and integers",
                       "a list of one type"),
    "float-item": ("      numas: [0, 1.5]\n", "spec.nics[0].attributes.numas[1]", "unsupported list item 1.5",
                   "integers, true/false or strings"),
    "nested-item": ("      numas: [[0]]\n", "spec.nics[0].attributes.numas[0]", "unsupported list item [0]",
                    "integers, true/false or strings"),
    "string-too-long": ("      domains: [a, " + "b" * 65 + "]\n", "spec.nics[0].attributes.domains[1]",
                        "is 65 characters long", "at most 64 characters"),
    "versions-empty": ("      fw: {versions: []}\n", "spec.nics[0].attributes.fw.versions", "is an empty list",
                       "{versions: [X.Y.Z, ...]}"),
    "versions-not-semver": ("      fw: {versions: [1.2.3, \"1.2\"]}\n", "spec.nics[0].attributes.fw.versions[1]",
                            "'1.2' is not a semantic version", "semver.org 2.0.0"),
    "versions-not-a-list": ("      fw: {versions: 1.2.3}\n", "spec.nics[0].attributes.fw",
                            "unsupported attribute value", "{versions: [X.Y.Z, ...]}"),
}


@pytest.mark.parametrize("case", sorted(LIST_ATTRIBUTE_ERRORS))
def test_bad_list_attribute_is_rejected_with_located_problem(tmp_path, case):
    lines, field, fragment, allowed = LIST_ATTRIBUTE_ERRORS[case]
    path = _write(tmp_path, _nic_with(lines))
    with pytest.raises(InvalidInput) as info:
        profile.load(path)
    (problem,) = info.value.problems
    assert (problem.source, problem.field) == (path, field), str(problem)
    assert fragment in problem.problem and allowed in (problem.allowed or ""), str(problem)


def test_attribute_values_per_device_are_limited_to_48(tmp_path):
    """A NIC has 7 attributes of its own (type, model, macAddress, index and the 3 topology ones): a list of
    41 integers makes 48 values, the API's ResourceSliceMaxAttributeValuesPerDevice; 42 is one too many."""
    at_limit = profile.load(_write(tmp_path, _nic_with(f"      ids: {list(range(41))}\n")))
    assert at_limit.nics[0].attributes["ids"] == {"ints": list(range(41))}
    path = _write(tmp_path, _nic_with(f"      ids: {list(range(40))}\n      more: [true, false]\n"))
    with pytest.raises(InvalidInput) as info:
        profile.load(path)
    (problem,) = info.value.problems
    assert problem.field == "spec.nics[0].attributes", str(problem)
    assert "device nic-0 would have 49 attribute values" in problem.problem and "at most 48" in (problem.allowed or "")


# --- the command line -------------------------------------------------------------------------

def _validate(*files: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness.cli", "profiles", "validate", *files],
                          cwd=REPO, capture_output=True, text=True, timeout=60)


def test_cli_validate_reports_every_bad_file():
    bad = [INVALID / f"{stem}.yaml" for stem in ("profile-mig-overlap", "profile-quantity-with-space",
                                                 "cluster-duplicate-pool", "profile-yaml-syntax-error")]
    result = _validate(*map(str, bad))
    assert result.returncode == 2, result.stderr  # bad input
    assert "error:" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    for path in bad:
        assert str(path) in result.stderr, f"{path.name} not named in:\n{result.stderr}"
    assert "spec.gpus[0].mig.partitions[1]" in result.stderr
    assert "spec.nodePools[1].name" in result.stderr
    assert ": ok" not in result.stdout


def test_cli_validate_accepts_the_builtins():
    good = [str(p.relative_to(REPO)) for p in sorted((REPO / "fake_devices" / "profiles").glob("*.yaml"))]
    good.append("clusters/mixed.yaml")
    result = _validate(*good)
    assert result.returncode == 0, result.stderr
    assert "error" not in result.stderr
    assert result.stdout.splitlines() == [f"{name}: ok" for name in good]
