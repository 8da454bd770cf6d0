"""The fake driver image offline (kind.host.driverbase) and the deployed driver as the suite's vendor
file (kind.vendor_file): pure parts and the detection, with fake `docker` answers."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from harness.backends import manifests
from harness.backends.kind import backend as kind
from harness.backends.kind import preflight as kind_preflight
from harness.backends.kind import steps as kind_steps
from harness.backends.kind import vendor_file as kind_vendor
from harness.backends.kind.host import driverbase
from harness.core.errors import HarnessError
from harness.vendor import file as vendor

REPO = Path(__file__).resolve().parents[2]


def test_the_base_is_read_from_the_dockerfile_itself():
    assert driverbase.dockerfile_base((REPO / "deploy" / "Dockerfile").read_text()) == "python:3.13-slim-trixie"
    with pytest.raises(HarnessError, match="ARG BASE_IMAGE"):
        driverbase.dockerfile_base("FROM python:3.13-slim\n")


def test_the_offline_base_matches_the_dockerfiles_python_and_debian():
    base = driverbase.dockerfile_base((REPO / "deploy" / "Dockerfile").read_text())
    assert base == f"python:{driverbase.PYTHON}-slim-{driverbase.SUITE}"


def test_driver_requirements_are_the_lines_without_comments():
    text = "# why\nkubernetes>=37,<38  # the client\n\npyyaml>=6\n"
    assert driverbase.driver_requirements(text) == ["kubernetes>=37,<38", "pyyaml>=6"]
    assert driverbase.driver_requirements("# nothing\n") == []


def _driver_requirement_names() -> dict[str, str]:
    text = (REPO / "deploy" / driverbase.REQUIREMENTS_FILE).read_text()
    return {re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].lower(): r for r in driverbase.driver_requirements(text)}


def test_the_driver_image_requirements_are_pyprojects_own_specifiers():
    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    for name, requirement in _driver_requirement_names().items():
        assert requirement in dependencies, (
            f"deploy/{driverbase.REQUIREMENTS_FILE}: {requirement!r} is not one of pyproject.toml's "
            f"dependencies ({dependencies}); the image must install what the harness is tested with")


# Not part of the driver: the developer tool that regenerates the gRPC stubs (needs grpcio-tools, a dev extra).
NOT_IN_THE_IMAGE = {"fake_devices/kubeletplugin/generate.py"}


def _third_party_imports(package: Path) -> dict[str, str]:
    """top-level module -> first file importing it, for every import in the package (lazy ones too)."""
    found: dict[str, str] = {}
    for path in sorted(package.rglob("*.py")):
        if str(path.relative_to(REPO)) in NOT_IN_THE_IMAGE:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top != package.name:
                    found.setdefault(top, str(path.relative_to(REPO)))
    return found


def test_every_module_the_driver_imports_is_in_the_driver_image():
    """The image installs the wheel with --no-deps: an import of fake_devices that no line of
    driver-requirements.txt provides would fail only on a cluster."""
    listed = _driver_requirement_names()
    providers = importlib.metadata.packages_distributions()
    for module, where in _third_party_imports(REPO / "fake_devices").items():
        distributions = {d.lower() for d in providers.get(module, [])}
        assert distributions & set(listed), (
            f"{where} imports {module!r} (from {sorted(distributions) or 'no installed distribution'}), which "
            f"deploy/{driverbase.REQUIREMENTS_FILE} does not install (it has {sorted(listed)})")


def test_wheels_are_asked_for_trixies_python_and_the_engines_architecture(tmp_path):
    argv = driverbase.download_argv("/py", tmp_path, tmp_path / "req.txt", "arm64")
    assert argv[:3] == ["/py", "-m", "pip"] and "--only-binary=:all:" in argv
    assert "--python-version=3.13" in argv and "--abi=cp313" in argv
    platforms = [a.split("=", 1)[1] for a in argv if a.startswith("--platform=")]
    assert platforms[0] == "manylinux_2_41_aarch64" and "manylinux_2_17_aarch64" in platforms
    assert "manylinux2014_aarch64" in platforms and all("x86_64" not in p for p in platforms)


def test_the_base_dockerfile_installs_from_the_wheels_only():
    text = driverbase.base_dockerfile("dra-harness.local/debian-rootfs:trixie-abc")
    assert text.startswith("FROM dra-harness.local/debian-rootfs:trixie-abc\n")
    assert "--no-index --find-links=/tmp/wheels" in text and "PIP_BREAK_SYSTEM_PACKAGES=1" in text


def _answers(inspect: int, pull: int, pull_err: str = ""):
    calls = []

    def run(argv, timeout=60, env=None):
        calls.append(argv[1:3])
        code = inspect if argv[1:3] == ["image", "inspect"] else pull
        return subprocess.CompletedProcess(argv, code, "", pull_err if argv[1] == "pull" else "")

    return run, calls


def test_a_base_the_engine_has_or_pulls_is_used_as_it_is():
    run, calls = _answers(inspect=0, pull=1)
    assert driverbase.needs_offline_base("docker", {}, "python:3.13-slim-trixie", run=run) is None
    assert calls == [["image", "inspect"]]  # present: not even a pull
    run, calls = _answers(inspect=1, pull=0)
    assert driverbase.needs_offline_base("docker", {}, "python:3.13-slim-trixie", run=run) is None
    assert calls == [["image", "inspect"], ["pull", "--quiet"]]


def test_no_registry_is_detected_with_the_engines_reason():
    run, _ = _answers(inspect=1, pull=1, pull_err="Error response from daemon: lookup registry-1.docker.io: no such host")
    why = driverbase.needs_offline_base("docker", {}, "python:3.13-slim-trixie", run=run)
    assert why is not None and "docker pull python:3.13-slim-trixie" in why and "no such host" in why


def test_the_build_step_names_the_offline_base_and_reaches_no_network(tmp_path):
    tools = kind_preflight.Tools(docker="/usr/bin/docker", kind="/k", kubectl="/kc", python="/py")
    steps = kind_steps.plan_steps("c", tmp_path, tools, ("c-control-plane",), "img:1", build_image=True, deploy=False,
                                  driver_base="dra-harness.local/python-base:3.13-trixie-abc")
    build = next(s for s in steps if "build" in s.argv)
    assert build.argv[:5] == ("env", "DOCKER_BUILDKIT=0", "/usr/bin/docker", "build", "--network=none")
    assert "--build-arg=BASE_IMAGE=dra-harness.local/python-base:3.13-trixie-abc" in build.argv
    plain = next(s for s in kind_steps.plan_steps("c", tmp_path, tools, ("c-control-plane",), "img:1",
                                                  build_image=True, deploy=False) if "build" in s.argv)
    assert plain.argv[:2] == ("/usr/bin/docker", "build") and not any("BASE_IMAGE" in a for a in plain.argv)


# --- the deployed driver as a vendor file -----------------------------------------------------------

def _slice(driver: str, node: str, *types: str) -> dict:
    return {"spec": {"driver": f"{driver}.{manifests.DOMAIN}", "nodeName": node, "pool": {"name": node},
                     "devices": [{"name": f"d{i}", "attributes": {"type": {"string": t}}}
                                 for i, t in enumerate(types)]}}


CLASSES = {"fake-gpu": "example.com/gpu", "fake-mig": None, "fake-nvme": None, "fake-pmem": None,
           "fake-cxl-memory": None, "fake-nic": None}
PAUSE = {"registry.k8s.io/pause:3.10", "localhost/dra-harness/fake-driver:0.1.0"}


def test_the_vendor_file_names_what_the_cluster_publishes(tmp_path):
    slices = [_slice("gpu", "w1", "gpu", "gpu"), _slice("storage", "w1", "nvme"), _slice("nic", "w1", "nic"),
              _slice("gpu", "w2", "gpu", "mig"), _slice("storage", "w2", "nvme"), _slice("nic", "w2", "nic"),
              {"spec": {"driver": "gpu.other.example", "nodeName": "w1", "devices": [{"name": "x"}]}}]
    data = kind_vendor.vendor_driver(slices, CLASSES, {"w1": PAUSE, "w2": PAUSE, "cp": set()}, {"w1", "w2"})
    spec = data["spec"]
    assert spec["drivers"] == [f"{d}.{manifests.DOMAIN}" for d in ("gpu", "nic", "storage")]
    # only classes that select something here: no pmem or cxl-memory devices were published
    assert spec["deviceClasses"] == {"gpu": "fake-gpu", "mig": "fake-mig", "nic": "fake-nic", "nvme": "fake-nvme"}
    assert spec["extendedResources"] == {"gpu": "example.com/gpu"}
    assert spec["nodeSelector"] == "dra-harness.x-k8s.io/profile" and spec["testImage"] == "registry.k8s.io/pause:3.10"
    path = tmp_path / "vendor.yaml"
    path.write_text(manifests.dump_yaml(data))
    loaded = vendor.load(str(path))  # the suite's own reader accepts it
    assert loaded.drivers == tuple(spec["drivers"]) and not loaded.default_image


def test_the_vendor_file_claims_a_slice_shown_feature_only_where_the_slices_show_it():
    """kind-small's profiles have partitions (shared counters) but no consumable capacity: claiming
    DRAConsumableCapacity there failed the suite's own claim check on kind."""
    plain = [_slice("gpu", "w1", "gpu")]
    features = kind_vendor.vendor_driver(plain, CLASSES, {"w1": PAUSE}, {"w1"})["spec"]["features"]
    assert "DynamicResourceAllocation" in features and "DRADeviceTaints" in features
    assert not {"DRAPartitionableDevices", "DRAConsumableCapacity", "DRAFractionalCapacityRange"} & set(features)

    partitioned = _slice("gpu", "w1", "mig")
    partitioned["spec"]["sharedCounters"] = [{"name": "gpu-0", "counters": {"memory": {"value": "40Gi"}}}]
    partitioned["spec"]["devices"][0]["consumesCounters"] = [{"counterSet": "gpu-0",
                                                               "counters": {"memory": {"value": "5Gi"}}}]
    shared = _slice("storage", "w1", "nvme")
    shared["spec"]["devices"][0].update(allowMultipleAllocations=True, capacity={"size": {
        "value": "1Ti", "requestPolicy": {"default": "1Gi", "validRange": {"min": "1Gi", "step": "1Gi"}}}})
    features = kind_vendor.vendor_driver([partitioned, shared], CLASSES, {"w1": PAUSE}, {"w1"})["spec"]["features"]
    assert {"DRAPartitionableDevices", "DRAConsumableCapacity"} <= set(features)
    assert "DRAFractionalCapacityRange" not in features  # whole-number range only
    shared["spec"]["devices"][0]["capacity"]["size"]["requestPolicy"]["validRange"]["step"] = "500m"
    features = kind_vendor.vendor_driver([partitioned, shared], CLASSES, {"w1": PAUSE}, {"w1"})["spec"]["features"]
    assert "DRAFractionalCapacityRange" in features
    # another driver's slices show nothing for ours
    other = {"spec": {"driver": "gpu.other.example", "nodeName": "w1", "devices": [
        {"name": "x", "allowMultipleAllocations": True, "capacity": {"c": {"value": "1"}}}]}}
    assert "DRAConsumableCapacity" not in kind_vendor.vendor_driver(plain + [other], CLASSES, {"w1": PAUSE},
                                                                    {"w1"})["spec"]["features"]


def test_no_node_selector_when_a_labelled_node_lacks_a_driver():
    slices = [_slice("gpu", "w1", "gpu"), _slice("nic", "w1", "nic"), _slice("gpu", "w2", "gpu")]
    spec = kind_vendor.vendor_driver(slices, CLASSES, {"w1": PAUSE, "w2": {"registry.k8s.io/pause:3.10"}},
                                     {"w1", "w2"})["spec"]
    assert "nodeSelector" not in spec and spec["testImage"] == "registry.k8s.io/pause:3.10"


# --- the suite on kind: what `conformance run --backend kind` accepts, and its waits ------------------

def test_conformance_run_on_kind_refuses_local_only_flags_before_anything_starts(tmp_path):
    from harness.core.errors import ConfigError
    from harness.jobs import runner

    with pytest.raises(ConfigError) as err:
        runner.plan(runner.ConformanceOptions(backend="kind", real_nodes="1", binaries_dir=tmp_path,
                                              report_dir=tmp_path / "r"))
    assert [p.source for p in err.value.problems] == ["--real-nodes", "--binaries-dir"]
    assert all("not used by --backend kind" in p.problem for p in err.value.problems)
    assert not (tmp_path / "r").exists()


def test_conformance_run_on_kind_defaults_to_the_small_definition(tmp_path):
    from harness.jobs import runner

    checked = runner.plan(runner.ConformanceOptions(backend="kind", report_dir=tmp_path / "r"))
    assert checked.definition is not None and checked.definition.name == kind.KindBackend.suite_definition
    assert sum(pool.count for pool in checked.definition.pools) == 2 and checked.real_nodes == 0


def test_a_dropped_apiserver_connection_is_not_yet_while_waiting():
    from urllib3.exceptions import ProtocolError

    answers = [ProtocolError("Connection aborted."), ConnectionResetError(), True]

    def check():
        answer = answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    polled = manifests._unreachable_is_not_yet(check)
    assert [polled(), polled(), polled()] == [False, False, True]
