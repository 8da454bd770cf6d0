"""The malformed-input corpus: every bad profile, cluster definition and vendor file is refused cleanly.

Each case is one small document (a valid base file from testdata/malformed/ changed in one place, an
attack file from there, or a special file made at test time) and what the refusal must say. Profiles
go through `dra-harness profiles validate FILE`, cluster definitions through `dra-harness cluster
validate FILE` (the checks `cluster up --config` runs before anything is built or started), both by
calling the CLI's entry function in this process so the time bound measures the refusal itself.
Vendor files are read through harness.vendor.file.load (their semantics belong to vendor mode; here
only the shared YAML reader is attacked). Every case asserts:

- exit status 2 (a ConfigError) and no traceback;
- the message names the file, the field (a path like spec.storage[0].capacity, or the line for
  YAML-level problems) and what is allowed (`(allowed: ...)`);
- the refusal takes under 2 s of CPU time and does not wait (under 10 s of wall time); most cases
  take well under 100 ms.

A few attacks also run through the installed `dra-harness` script in a subprocess, including
`cluster up --config`, which must refuse them before creating any state.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

# What the CLI imports lazily on its first refusal, imported here so the time bound measures refusing,
# not Python importing (the kubelet-plugin settings alone take about 0.5 s to import on a busy machine).
import fake_devices.kubeletplugin.config  # noqa: F401
import harness.cli.profiles  # noqa: F401
import harness.config.featuregates  # noqa: F401
import harness.core.nodelayout  # noqa: F401
from fake_devices import quantity, yamlfile
from fake_devices.errors import InvalidInput
from harness.cli import main as cli
from harness.vendor import file as vendor

DATA = Path(__file__).resolve().parent / "testdata" / "malformed"
# The refusal must cost under 2 s of this process's CPU time (a bomb or a quadratic parse is CPU-bound),
# and must not wait: under 10 s of wall time (a FIFO or a blocking read would hang). CPU time, because
# wall time on a shared 2-core machine says more about the neighbours than about the refusal.
CPU_BOUND = 2.0
WALL_BOUND = 10.0
DELETE = object()


def _doc(name: str) -> dict:
    return yaml.safe_load((DATA / name).read_text())


def _set(doc: Any, path: str, value: Any) -> Any:
    """doc with `path` (like spec.storage[0].capacity) set to value (or removed: DELETE)."""
    tokens = [int(t) if t.isdigit() else t for t in path.replace("[", ".").replace("]", "").split(".")]
    target = doc
    for token in tokens[:-1]:
        target = target[token]
    if value is DELETE:
        del target[tokens[-1]]
    else:
        target[tokens[-1]] = value
    return doc


@dataclass(frozen=True)
class Case:
    id: str
    kind: str  # profile | cluster | vendor
    make: Callable[[Path], Path]  # writes the input under tmp_path, returns its path
    field: str  # exactly as printed after the file name
    fragment: str  # part of the problem text
    allowed: str  # part of the "(allowed: ...)" text
    names: Callable[[Path], Path] | None = None  # the file the message must name, if not the input itself


def changed(base: str, path: str, value: Any) -> Callable[[Path], Path]:
    def make(tmp: Path) -> Path:
        target = tmp / "input.yaml"
        target.write_text(yaml.safe_dump(_set(_doc(base), path, value), allow_unicode=True, sort_keys=False))
        return target
    return make


def text(content: str | bytes) -> Callable[[Path], Path]:
    def make(tmp: Path) -> Path:
        target = tmp / "input.yaml"
        if isinstance(content, bytes):
            target.write_bytes(content)
        else:
            target.write_text(content)
        return target
    return make


def copied(name: str) -> Callable[[Path], Path]:
    return lambda tmp: DATA / name


def profile(case_id: str, path: str, value: Any, fragment: str, allowed: str, field: str | None = None) -> Case:
    return Case(case_id, "profile", changed("base-profile.yaml", path, value), field or path, fragment, allowed)


def cluster(case_id: str, path: str, value: Any, fragment: str, allowed: str, field: str | None = None) -> Case:
    return Case(case_id, "cluster", changed("base-cluster.yaml", path, value), field or path, fragment, allowed)


CAPACITY = "spec.storage[0].capacity"
QUANTITY_ALLOWED = "ASCII digits with an optional fraction and one suffix"
GRAMMAR = "quantities must match the regular expression"
LABEL_KEY_ALLOWED = "[prefix/]name"
LABEL_VALUE_ALLOWED = "at most 63 letters, digits"

PROFILE_CASES = [
    # --- quantities: exactly what the API server parses, within int64 ---
    profile("quantity-fullwidth-digit", CAPACITY, "１Ti", "only ASCII digits count", QUANTITY_ALLOWED),
    profile("quantity-arabic-indic-digit", CAPACITY, "٣Gi", "only ASCII digits count", QUANTITY_ALLOWED),
    profile("quantity-huge-exponent", CAPACITY, "1e99999999", "larger than 9223372036854775807", QUANTITY_ALLOWED),
    profile("quantity-exponent-beyond-int32", CAPACITY, "1e2147483648", "outside the int32 range", QUANTITY_ALLOWED),
    profile("quantity-exponent-wraps-int32", CAPACITY, "1e4294967296", "outside the int32 range", QUANTITY_ALLOWED),
    profile("quantity-negative-exponent-beyond-int32", CAPACITY, "1E-2147483649", "outside the int32 range",
            QUANTITY_ALLOWED),
    profile("quantity-exponent-beyond-int64", CAPACITY, "1e99999999999999999999", "unable to parse quantity's suffix",
            QUANTITY_ALLOWED),
    profile("quantity-8Ei", CAPACITY, "8Ei", "larger than 9223372036854775807", QUANTITY_ALLOWED),
    profile("quantity-above-int64", CAPACITY, "9223372036854775808", "larger than", QUANTITY_ALLOWED),
    profile("quantity-exponent-above-int64", CAPACITY, "1e19", "larger than", QUANTITY_ALLOWED),
    profile("quantity-KiB", CAPACITY, "1KiB", GRAMMAR, QUANTITY_ALLOWED),
    profile("quantity-upper-K", CAPACITY, "1K", "unable to parse quantity's suffix", QUANTITY_ALLOWED),
    profile("quantity-lower-gi", CAPACITY, "1gi", GRAMMAR, QUANTITY_ALLOWED),
    profile("quantity-bare-e", CAPACITY, "1e", "unable to parse quantity's suffix", QUANTITY_ALLOWED),
    profile("quantity-suffix-without-number", CAPACITY, "Pi", "unable to parse numeric part", QUANTITY_ALLOWED),
    profile("quantity-suffix-then-digits", CAPACITY, "1Ki5", "unable to parse quantity's suffix", QUANTITY_ALLOWED),
    profile("quantity-two-exponents", CAPACITY, "1e3e3", GRAMMAR, QUANTITY_ALLOWED),
    profile("quantity-empty", CAPACITY, "", GRAMMAR, QUANTITY_ALLOWED),
    profile("quantity-leading-space", CAPACITY, " 1Ti", GRAMMAR, QUANTITY_ALLOWED),
    profile("quantity-trailing-space", CAPACITY, "1Ti ", GRAMMAR, QUANTITY_ALLOWED),
    profile("quantity-two-dots", CAPACITY, "1.5.5Gi", GRAMMAR, QUANTITY_ALLOWED),
    profile("quantity-hex", CAPACITY, "0x10", GRAMMAR, QUANTITY_ALLOWED),
    profile("quantity-underscore", CAPACITY, "1_000", GRAMMAR, QUANTITY_ALLOWED),
    profile("quantity-inf-word", CAPACITY, "Inf", GRAMMAR, QUANTITY_ALLOWED),
    profile("quantity-nan-word", CAPACITY, "NaN", GRAMMAR, QUANTITY_ALLOWED),
    profile("quantity-float-overflow", CAPACITY, float("inf"), "not a finite number", QUANTITY_ALLOWED),
    profile("quantity-float-nan", CAPACITY, float("nan"), "not a finite number", QUANTITY_ALLOWED),
    profile("quantity-list", CAPACITY, [1], "must be a quantity, not list", QUANTITY_ALLOWED),
    profile("quantity-mapping", CAPACITY, {"value": "1Ti"}, "must be a quantity, not dict", QUANTITY_ALLOWED),
    profile("quantity-nbsp", CAPACITY, "1\u00a0Gi", "only ASCII digits count", QUANTITY_ALLOWED),
    profile("quantity-nic-bandwidth-space", "spec.nics[0].bandwidth", "25 G", GRAMMAR, QUANTITY_ALLOWED),
    profile("quantity-numa-memory-unit-word", "spec.numaNodes[0].memory", "32GB", GRAMMAR, QUANTITY_ALLOWED),
    profile("quantity-sharing-default-huge", "spec.storage[0].sharing.default", "1e99999999", "larger than",
            QUANTITY_ALLOWED),
    profile("quantity-sharing-min-fullwidth", "spec.storage[0].sharing.min", "１Gi", "only ASCII digits count",
            QUANTITY_ALLOWED),
    profile("quantity-sharing-step-garbage", "spec.storage[0].sharing.step", "ten", GRAMMAR, QUANTITY_ALLOWED),
    profile("quantity-gpu-memory-exponent-overflow", "spec.gpus[0].memory", "1E+2147483648", "outside the int32",
            QUANTITY_ALLOWED),
    # --- sharing: the API server's requestPolicy rules ---
    profile("sharing-default-off-step", "spec.storage[0].sharing", {"default": "15Gi", "min": "10Gi", "step": "10Gi"},
            "15Gi is not min 10Gi plus a multiple of step 10Gi", "min + k * step", field="spec.storage[0].sharing.default"),
    profile("sharing-step-beyond-capacity", "spec.storage[0].sharing", {"default": "1Ti", "min": "1Ti", "step": "1Gi"},
            "min 1Ti plus one step 1Gi is more than the capacity 1Ti", "a step of at most capacity - min",
            field="spec.storage[0].sharing.step"),
    profile("sharing-step-finer-than-milli", "spec.storage[0].sharing.step", "1n", "finer than a thousandth",
            "a multiple of 1m"),
    profile("sharing-default-below-step-as-min", "spec.storage[0].sharing", {"default": "5Gi", "step": "10Gi"},
            "5Gi is below min 10Gi", "at least 10Gi", field="spec.storage[0].sharing.default"),
    # --- CPU lists ---
    profile("cpus-reversed-range", "spec.numaNodes[0].cpus", "8-3", "range 8-3 is reversed", "ascending ranges"),
    profile("cpus-reversed-second-node", "spec.numaNodes[1].cpus", "15-8", "range 15-8 is reversed", "ascending"),
    profile("cpus-overlap", "spec.numaNodes[0].cpus", "0-7,4-9", "CPU 4 is listed twice", "each CPU once"),
    profile("cpus-repeated", "spec.numaNodes[0].cpus", "0-7,7", "CPU 7 is listed twice", "each CPU once"),
    profile("cpus-beyond-limit", "spec.numaNodes[0].cpus", "0-99999", "CPU 99999 is beyond 8191", "CPUs 0..8191"),
    profile("cpus-trailing-comma", "spec.numaNodes[0].cpus", "0-7,", "is not valid", "a CPU list like 0-55,112-167"),
    profile("cpus-negative", "spec.numaNodes[0].cpus", "-1", "is not valid", "a CPU list like"),
    profile("cpus-letters", "spec.numaNodes[0].cpus", "a-b", "is not valid", "a CPU list like"),
    profile("cpus-empty", "spec.numaNodes[0].cpus", "", "is not valid", "a CPU list like"),
    profile("cpus-too-many-digits", "spec.numaNodes[0].cpus", "0-" + "9" * 40, "is not valid", "a CPU list like"),
    # --- nodeLabels (applied to the nodes of every pool with this profile) ---
    profile("labels-key-with-space", "spec.nodeLabels", {"bad key!": "x"}, "is not a valid label key",
            LABEL_KEY_ALLOWED, field="spec.nodeLabels.bad key!"),
    profile("labels-value-with-space", "spec.nodeLabels", {"tier": "not valid!"}, "is not a valid label value",
            LABEL_VALUE_ALLOWED, field="spec.nodeLabels.tier"),
    profile("labels-value-64-chars", "spec.nodeLabels", {"tier": "a" * 64}, "is not a valid label value",
            LABEL_VALUE_ALLOWED, field="spec.nodeLabels.tier"),
    profile("labels-name-64-chars", "spec.nodeLabels", {"a" * 64: "x"}, "is not a valid label key", LABEL_KEY_ALLOWED,
            field="spec.nodeLabels." + "a" * 64),
    profile("labels-key-leading-dash", "spec.nodeLabels", {"-tier": "x"}, "is not a valid label key",
            LABEL_KEY_ALLOWED, field="spec.nodeLabels.-tier"),
    profile("labels-key-empty-name", "spec.nodeLabels", {"example.com/": "x"}, "is not a valid label key",
            LABEL_KEY_ALLOWED, field="spec.nodeLabels.example.com/"),
    profile("labels-key-uppercase-prefix", "spec.nodeLabels", {"Example.com/tier": "x"}, "is not a valid label key",
            LABEL_KEY_ALLOWED, field="spec.nodeLabels.Example.com/tier"),
    profile("labels-value-list", "spec.nodeLabels", {"tier": ["a"]}, "is not a valid label value",
            LABEL_VALUE_ALLOWED, field="spec.nodeLabels.tier"),
    profile("labels-value-trailing-dash", "spec.nodeLabels", {"tier": "x-"}, "is not a valid label value",
            LABEL_VALUE_ALLOWED, field="spec.nodeLabels.tier"),
    profile("labels-not-a-mapping", "spec.nodeLabels", ["tier=a"], "must be a mapping, not a list", "a mapping"),
    # --- other fields ---
    profile("count-string", "spec.gpus[0].count", "two", "must be an integer, not 'two'", "an integer"),
    profile("count-bool", "spec.gpus[0].count", True, "must be an integer, not True", "an integer"),
    profile("count-float-overflow", "spec.gpus[0].count", float("inf"), "must be an integer, not inf", "an integer"),
    profile("count-huge", "spec.gpus[0].count", 10**30, "is out of range", "1..64"),
    profile("attach-mapping", "spec.gpus[0].attach", {"pcieRoot": "pci0000:10"}, "must be a list, not a mapping",
            "a list"),
    profile("name-64-chars", "metadata.name", "a" * 64, "is not valid", "a DNS label"),
    profile("name-fullwidth", "metadata.name", "ｔｉｎｙ", "is not valid", "a DNS label"),
    profile("name-prefix-unicode", "spec.gpus[0].namePrefix", "gpü", "is not valid", "a DNS label"),
    profile("spec-missing", "spec", DELETE, "is required", "a value for spec"),
    profile("mig-mode-unknown", "spec.gpus[0].mig", {"mode": "auto"}, "unknown value 'auto'", "none, dynamic, fixed",
            field="spec.gpus[0].mig.mode"),
    # --- YAML level ---
    Case("yaml-billion-laughs", "profile", copied("yaml-billion-laughs.yaml"), "line 7", "more than 100000 YAML nodes",
         "at most 100000 nodes"),
    Case("yaml-deep-nesting", "profile", copied("yaml-deep-nesting.yaml"), "line 2", "nested deeper than 64 levels",
         "at most 64 levels"),
    Case("yaml-duplicate-key", "profile", copied("yaml-duplicate-keys.yaml"), "line 10",
         "duplicate key 'gpus' (first at line 8)", "each key once"),
    Case("yaml-duplicate-key-flow", "profile",
         text("apiVersion: dra-harness.x-k8s.io/v1alpha1\nkind: NodeProfile\nmetadata: {name: a, name: b}\n"),
         "line 3", "duplicate key 'name' (first at line 3)", "each key once"),
    Case("yaml-not-utf8", "profile", copied("yaml-not-utf8.yaml"), "line 3", "not UTF-8 text", "a UTF-8 text file"),
    Case("yaml-two-documents", "profile", text("kind: NodeProfile\n---\nkind: NodeProfile\n"), "line 2",
         "holds more than one YAML document", "one document"),
    Case("yaml-bad-date", "profile", text("apiVersion: dra-harness.x-k8s.io/v1alpha1\nkind: NodeProfile\n"
                                          "metadata: {name: a}\nspec: {description: 2024-13-45}\n"), "line 4",
         "cannot read '2024-13-45': month must be in 1..12", "quote it"),
    Case("yaml-5000-digit-int", "profile", text("spec: {gpus: [{count: " + "9" * 5000 + "}]}\n"), "line 1",
         "Exceeds the limit (4300 digits)", "quote it"),
    Case("yaml-control-character", "profile", text("kind: NodeProfile\nmetadata: {name: \x07}\n"), "line 2",
         "control characters are not allowed", "printable characters"),
    Case("yaml-document-is-a-list", "profile", text("- apiVersion: x\n- kind: NodeProfile\n"), "(document)",
         "must be a mapping, not a list", "a mapping of field: value"),
    Case("yaml-document-is-empty", "profile", text(""), "(document)", "must be a mapping, not empty",
         "a mapping of field: value"),
    Case("yaml-python-tag", "profile", text("kind: !!python/object/apply:os.system [id]\n"), "line 1",
         "could not determine a constructor for the tag", "YAML syntax with standard tags only"),
    Case("yaml-unhashable-key", "profile", text("? [a, b]\n: 1\n"), "line 1", "found unhashable key",
         "YAML syntax with standard tags only"),
    Case("yaml-undefined-alias", "profile", text("kind: *nowhere\n"), "line 1", "found undefined alias",
         "YAML syntax with standard tags only"),
]

CLUSTER_CASES = [
    cluster("pool-name-63-chars", "spec.nodePools[1].name", "c" * 63, "node names like " + "c" * 63 + "-0 would be 65",
            "a pool name of at most 61 characters for 1 nodes"),
    cluster("pool-name-too-long-for-count", "spec.nodePools[1]", {"name": "c" * 61, "count": 11},
            "would be 64 characters", "a pool name of at most 60 characters for 11 nodes",
            field="spec.nodePools[1].name"),
    cluster("real-pool-name-too-long", "spec.nodePools[1]", {"name": "r" * 62, "count": 1, "kubelet": "real"},
            "would be 64 characters", "kubernetes.io/hostname label values", field="spec.nodePools[1].name"),
    Case("real-node-domain-too-long-for-sockets", "cluster", changed(
        "base-cluster.yaml", "spec", {"driver": {"domain": "d" * 30 + ".example.com"},
                                      "nodePools": [{"name": "real", "count": 1, "kubelet": "real", "profile": "tiny"}]}),
         "spec.driver.domain", "kubelet plugin socket", "with `kubelet: real` pools (unix socket paths are at most 107"),
    cluster("pool-label-key-invalid", "spec.nodePools[0].labels", {"bad key!": "x"}, "is not a valid label key",
            LABEL_KEY_ALLOWED, field="spec.nodePools[0].labels.bad key!"),
    cluster("pool-label-value-too-long", "spec.nodePools[0].labels", {"tier": "v" * 64}, "is not a valid label value",
            LABEL_VALUE_ALLOWED, field="spec.nodePools[0].labels.tier"),
    cluster("pool-labels-list", "spec.nodePools[0].labels", ["tier"], "must be a mapping, not a list", "a mapping"),
    cluster("pool-count-negative", "spec.nodePools[0].count", -1, "-1 is out of range", "0..10000"),
    cluster("pool-count-too-large", "spec.nodePools[0].count", 10001, "10001 is out of range", "0..10000"),
    cluster("pool-count-string", "spec.nodePools[0].count", "2", "must be an integer", "an integer"),
    cluster("pool-kubelet-unknown", "spec.nodePools[0].kubelet", "fake", "unknown value 'fake'", "simulated, real"),
    cluster("pool-real-count-too-large", "spec.nodePools[1]", {"name": "real", "count": 5, "kubelet": "real"},
            "5 real nodes", "at most 4", field="spec.nodePools[1].count"),
    cluster("pool-entry-is-a-string", "spec.nodePools[1]", "cpu", "must be a mapping, not a string",
            "a mapping of field: value"),
    cluster("pools-mapping", "spec.nodePools", {"cpu": 1}, "must be a list, not a mapping", "a list"),
    cluster("pools-total-too-large", "spec.nodePools", [{"name": f"p{i}", "count": 4000} for i in range(3)],
            "12000 nodes in all", "at most 10000"),
    cluster("pool-profile-unknown", "spec.nodePools[0].profile", "no-such-profile", "unknown profile 'no-such-profile'",
            "or a path to a profile file"),
    cluster("preset-unknown", "spec.preset", "everything", "unknown preset", "all-dra"),
    cluster("gate-locked", "spec.featureGates", {"DynamicResourceAllocation": False}, "is locked to true", "true",
            field="spec.featureGates.DynamicResourceAllocation"),
    cluster("gate-dependency-off", "spec.featureGates", {"DRADeviceTaints": False},
            "needs DRADeviceTaints, which is off", "enable DRADeviceTaints", field="spec.featureGates.DRADeviceTaintRules"),
    cluster("gate-not-bool", "spec.featureGates", {"DRAConsumableCapacity": "yes"}, "must be true or false",
            "true, false", field="spec.featureGates.DRAConsumableCapacity"),
    cluster("runtime-config-not-group-version", "spec.runtimeConfig", {"not a group": True}, "not an API group/version",
            "e.g. resource.k8s.io/v1beta2", field="spec.runtimeConfig.not a group"),
    cluster("driver-domain-too-long", "spec.driver.domain", "d" * 50 + ".example", "would exceed 63 characters",
            "a DNS subdomain of at most 55 characters"),
    cluster("driver-domain-invalid", "spec.driver.domain", "Not_A_Domain", "is not valid", "a DNS subdomain"),
    cluster("driver-instance-invalid", "spec.driver.instance", "Fake!", "is not valid", "a DNS label"),
    cluster("extended-resource-unknown-type", "spec.driver.extendedResources", {"tpu": "example.com/tpu"},
            "unknown device type", "gpu, mig, nvme", field="spec.driver.extendedResources.tpu"),
    cluster("extended-resource-bad-name", "spec.driver.extendedResources", {"gpu": "kubernetes.io/gpu"},
            "is not an extended resource name", "domain/name", field="spec.driver.extendedResources.gpu"),
    cluster("name-invalid", "metadata.name", "Corpus_Base", "is not valid", "a DNS label"),
    cluster("kind-wrong", "kind", "NodeProfile", "expected Cluster", "Cluster"),
    cluster("unknown-field", "spec.nodepools", [], "unknown field", "nodePools"),
    Case("yaml-billion-laughs", "cluster", copied("yaml-billion-laughs.yaml"), "line 7", "more than 100000 YAML nodes",
         "at most 100000 nodes"),
    Case("yaml-deep-nesting", "cluster", copied("yaml-deep-nesting.yaml"), "line 2", "nested deeper than 64 levels",
         "at most 64 levels"),
    Case("yaml-duplicate-pools-key", "cluster",
         text((DATA / "base-cluster.yaml").read_text() + "  nodePools: []\n"), "line 13",
         "duplicate key 'nodePools' (first at line 10)", "each key once"),
    Case("yaml-anchor-in-flow-mapping", "cluster",
         text("kind: Cluster\nspec: {a: &x 1, a: *x}\n"), "line 2", "duplicate key 'a'", "each key once"),
]


def _same_name_profile(tmp: Path) -> Path:
    """Item 3: a pool with built-in `tiny` and one with another file also named tiny."""
    other = _set(_doc("base-profile.yaml"), "metadata.name", "tiny")
    _set(other, "spec.gpus[0].count", 2)
    (tmp / "other-tiny.yaml").write_text(yaml.safe_dump(other))
    doc = _set(_doc("base-cluster.yaml"), "spec.nodePools[1]", {"name": "big", "count": 1,
                                                                 "profile": str(tmp / "other-tiny.yaml")})
    target = tmp / "input.yaml"
    target.write_text(yaml.safe_dump(doc))
    return target


def _with_profile(make_profile: Callable[[Path], Path]) -> Callable[[Path], Path]:
    """A cluster definition whose second pool uses the profile file make_profile writes."""
    def make(tmp: Path) -> Path:
        profile_path = make_profile(tmp)
        doc = _set(_doc("base-cluster.yaml"), "spec.nodePools[1]", {"name": "p", "count": 1,
                                                                     "profile": str(profile_path)})
        target = tmp / "cluster.yaml"
        target.write_text(yaml.safe_dump(doc))
        return target
    return make


def _zero_link(tmp: Path) -> Path:
    link = tmp / "input.yaml"
    link.symlink_to("/dev/zero")
    return link


def _fifo(tmp: Path) -> Path:
    path = tmp / "input.yaml"
    os.mkfifo(path)
    return path


def _directory(tmp: Path) -> Path:
    path = tmp / "input.yaml"
    path.mkdir()
    return path


def _huge(tmp: Path) -> Path:
    path = tmp / "input.yaml"
    with open(path, "w") as handle:
        handle.write("kind: NodeProfile\n# " + "x" * yamlfile.MAX_BYTES + "\n")
    return path


def _missing(tmp: Path) -> Path:
    return tmp / "does-not-exist.yaml"


SPECIAL = [("zero-symlink", _zero_link, "is a character device", "a regular file"),
           ("fifo", _fifo, "is a FIFO", "a regular file"),
           ("directory", _directory, "is a directory", "a regular file"),
           ("huge", _huge, f"is {yamlfile.MAX_BYTES + 21} bytes", f"at most {yamlfile.MAX_BYTES} bytes")]

CLUSTER_CASES += [
    Case("profiles-with-one-name", "cluster", _same_name_profile, "spec.nodePools[1].profile",
         "profile name 'tiny' from", "distinct metadata.name"),
    Case("profile-file-is-a-bomb", "cluster", _with_profile(lambda tmp: DATA / "yaml-billion-laughs.yaml"), "line 7",
         "more than 100000 YAML nodes", "at most 100000 nodes", names=lambda tmp: DATA / "yaml-billion-laughs.yaml"),
    Case("profile-file-is-dev-zero", "cluster", _with_profile(lambda tmp: (tmp / "p.yaml").symlink_to("/dev/zero")
                                                              or tmp / "p.yaml"),
         "(file)", "is a character device", "a regular file", names=lambda tmp: tmp / "p.yaml"),
    Case("profile-file-quantity", "cluster", _with_profile(
        lambda tmp: changed("base-profile.yaml", CAPACITY, "１Ti")(tmp)), CAPACITY, "only ASCII digits count",
        QUANTITY_ALLOWED, names=lambda tmp: tmp / "input.yaml"),
    Case("missing-file", "cluster", _missing, "(file)", "no such cluster definition file", "or a path to a Cluster file"),
]
PROFILE_CASES += [Case("missing-file", "profile", _missing, "(file)", "no such file", "a path to an existing file")]
for _kind in ("profile", "cluster"):
    (PROFILE_CASES if _kind == "profile" else CLUSTER_CASES).extend(
        Case(f"special-{name}", _kind, make, "(file)", fragment, allowed) for name, make, fragment, allowed in SPECIAL)

VENDOR_CASES = [
    Case("yaml-billion-laughs", "vendor", copied("yaml-billion-laughs.yaml"), "line 7", "more than 100000 YAML nodes",
         "at most 100000 nodes"),
    Case("yaml-deep-nesting", "vendor", copied("yaml-deep-nesting.yaml"), "line 2", "nested deeper than 64 levels",
         "at most 64 levels"),
    Case("yaml-duplicate-key", "vendor", text((DATA / "base-vendor.yaml").read_text() + "  drivers: [x.example]\n"),
         "line 9", "duplicate key 'drivers' (first at line 6)", "each key once"),
    Case("yaml-not-utf8", "vendor", copied("yaml-not-utf8.yaml"), "line 3", "not UTF-8 text", "a UTF-8 text file"),
    Case("yaml-5000-digit-int", "vendor", text("spec: {drivers: [" + "1" * 5000 + "]}\n"), "line 1",
         "Exceeds the limit (4300 digits)", "quote it"),
    Case("yaml-two-documents", "vendor", text("kind: VendorDriver\n---\nkind: VendorDriver\n"), "line 2",
         "holds more than one YAML document", "one document"),
    Case("yaml-python-tag", "vendor", text("kind: !!python/name:os.system\n"), "line 1",
         "could not determine a constructor", "YAML syntax with standard tags only"),
    *(Case(f"special-{name}", "vendor", make, "(file)", fragment, allowed) for name, make, fragment, allowed in SPECIAL),
]

ALL_CASES = PROFILE_CASES + CLUSTER_CASES + VENDOR_CASES


def _refusal(case: Case, path: Path, capsys) -> tuple[int, str, float, float]:
    """(exit status, everything printed, CPU seconds, wall seconds) of refusing `path`."""
    cpu, wall = time.process_time(), time.monotonic()
    if case.kind == "vendor":
        try:
            vendor.load(str(path))
            code, output = 0, ""
        except InvalidInput as err:
            code, output = 2, str(err)
    else:
        argv = ["profiles", "validate", str(path)] if case.kind == "profile" else ["cluster", "validate", str(path)]
        out = io.StringIO()
        code = cli.run(argv, out=out)
        captured = capsys.readouterr()
        output = out.getvalue() + captured.out + captured.err
    return code, output, time.process_time() - cpu, time.monotonic() - wall


def test_corpus_size():
    assert len({(c.kind, c.id) for c in ALL_CASES}) == len(ALL_CASES), "case ids must be unique per kind"
    assert len(ALL_CASES) >= 100
    assert len(VENDOR_CASES) >= 8 and len(CLUSTER_CASES) >= 30 and len(PROFILE_CASES) >= 60


@pytest.mark.parametrize("case", ALL_CASES, ids=[f"{c.kind}-{c.id}" for c in ALL_CASES])
def test_malformed_input_is_refused_cleanly(case: Case, tmp_path: Path, capsys):
    path = case.make(tmp_path)
    code, output, cpu, wall = _refusal(case, path, capsys)
    assert code == 2, output
    assert "Traceback" not in output, output
    named = case.names(tmp_path) if case.names else path
    assert f"{named}: {case.field}: " in output, f"expected file {named} and field {case.field!r} in:\n{output}"
    assert case.fragment in output, output
    assert "(allowed: " in output and case.allowed in output.split("(allowed: ", 1)[1], output
    assert cpu < CPU_BOUND and wall < WALL_BOUND, f"took {cpu:.2f}s of CPU, {wall:.2f}s in all"


# --- the same attacks through the installed script, as a user would run them -----------------------

def _script(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "DRA_HARNESS_STATE_DIR": str(tmp_path / "state"),
           "DRA_HARNESS_CACHE_DIR": str(tmp_path / "cache")}
    return subprocess.run([str(Path(sys.executable).parent / "dra-harness"), *args], capture_output=True, text=True,
                          env=env, timeout=60)


@pytest.mark.parametrize("attack", ["bomb", "zero-symlink", "deep"])
@pytest.mark.parametrize("command", [["profiles", "validate"], ["cluster", "validate"], ["cluster", "up", "--config"]],
                         ids=["profiles-validate", "cluster-validate", "cluster-up"])
def test_attacks_through_the_script_are_refused_before_anything_starts(command, attack, tmp_path):
    path = {"bomb": lambda: DATA / "yaml-billion-laughs.yaml", "zero-symlink": lambda: _zero_link(tmp_path),
            "deep": lambda: DATA / "yaml-deep-nesting.yaml"}[attack]()
    started = time.monotonic()
    result = _script([*command, str(path), *(["--name", "corpus-never-started"] if "up" in command else [])], tmp_path)
    elapsed = time.monotonic() - started
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert f"{path}: " in result.stderr and "(allowed: " in result.stderr, result.stderr
    assert elapsed < 30, f"{elapsed:.1f}s"  # includes starting Python; the refusal itself is bounded above
    # nothing was built, downloaded or started: no cluster state, no binaries
    assert not (tmp_path / "state" / "clusters").exists() or not any((tmp_path / "state" / "clusters").iterdir())
    assert not (tmp_path / "cache" / "binaries").exists()


# --- the quantity parser against the real one ----------------------------------------------------

def test_quantities_parse_exactly_as_apimachinery_does():
    """testdata/quantities-go.json: k8s.io/apimachinery v0.37.2 ParseQuantity's verdict (and exact value) on
    1600+ strings (testdata/quantity-oracle/ regenerates it). The only deliberate differences: exponents
    outside int32, which Go silently wraps (1e4294967296 reads as 1) and can spin on for minutes."""
    import decimal
    import json

    rows = json.loads((Path(__file__).resolve().parent / "testdata" / "quantities-go.json").read_text())
    assert len(rows) > 1500
    nano = decimal.Decimal("1e-9")
    mismatches = []
    for row in rows:
        try:
            value, error = quantity.parse(row["in"]), None
        except quantity.QuantityError as err:
            value, error = None, str(err)
        if error is not None and error.startswith("exponent") and row["ok"]:
            continue  # the deliberate difference
        if (error is None) != row["ok"]:
            mismatches.append(f"{row['in']!r}: go {'accepts' if row['ok'] else row['err']}, we {error or 'accept'}")
        elif error is not None and not error.startswith(row["err"].split(" (")[0]):
            mismatches.append(f"{row['in']!r}: go says {row['err']!r}, we say {error!r}")
        elif row.get("dec") is not None:
            with decimal.localcontext(decimal.Context(prec=200)):
                ours = value.quantize(nano, rounding=decimal.ROUND_UP) if value else decimal.Decimal(0)
                # Go clamps binary-SI values above 2^63-1 to 2^63-1; within_limits refuses those anyway
                if ours != decimal.Decimal(row["dec"]) and ours <= quantity.MAX_VALUE:
                    mismatches.append(f"{row['in']!r}: go {row['dec']}, we {ours}")
    assert not mismatches, "\n".join(mismatches[:20])


@pytest.mark.parametrize("text, value", [("1Ti", "1099511627776"), ("1.5Gi", "1610612736"), ("400G", "400e9"),
                                         ("16", "16"), ("100m", "0.1"), ("7Ei", str(7 * 2**60)), (".5", "0.5"),
                                         ("9223372036854775807", "9223372036854775807"), ("1e18", "1e18"),
                                         ("0.5Ki", "512"), ("12e-3", "0.012"), ("+3k", "3000")])
def test_quantities_in_range_are_accepted_with_their_exact_value(text, value):
    import decimal

    assert quantity.within_limits(text) == decimal.Decimal(value)
