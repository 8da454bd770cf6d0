"""The kind backend without Docker: the generated kind config (golden), the exact command sequence of
`cluster up`, the preflight messages, and `up`/`down` run end to end against fake docker, kind,
kubectl and python executables that record what they are asked to do.

Regenerate the golden file after an intended change with

    DRA_HARNESS_UPDATE_GOLDEN=1 .venv/bin/pytest tests/unit/test_kind_backend.py

and review the diff: it is exactly what `kind create cluster` will be given.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest
import yaml
from kubernetes.client import V1Node, V1NodeCondition, V1NodeSpec, V1NodeStatus, V1ObjectMeta, V1Taint

from harness.backends import commands, manifests
from harness.backends.commands import CommandFailed, Runner, Step, command
from harness.backends.kind import backend as kind
from harness.backends.kind import config as kind_config
from harness.backends.kind import preflight as kind_preflight
from harness.backends.kind import steps as kind_steps
from harness.backends.kwok import in_cluster
from harness.config import cluster, featuregates
from harness.core import schedulerprofiles
from harness.core.errors import ClusterNotFound, ConfigError, HarnessError
from harness.core.progress import Reporter
from harness.k8s import nodes

GOLDEN = Path(__file__).resolve().parent / "testdata" / "golden" / "kind-mixed.yaml"
REPO = Path(__file__).resolve().parents[2]
TOOLS = kind_preflight.Tools(docker="/usr/bin/docker", kind="/usr/local/bin/kind", kubectl="/opt/k8s/kubectl",
                             python="/venv/bin/python", platform="linux/amd64")


@pytest.fixture(autouse=True)
def state_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("DRA_HARNESS_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


def _plan(name="ci", tools=TOOLS, **options) -> kind_steps.Plan:
    options.setdefault("definition", cluster.load("mixed"))
    return kind.KindBackend().plan(kind.KindUpOptions(name=name, **options), tools)


# --- the kind config ------------------------------------------------------------------------------


def test_kind_config_for_mixed_matches_the_golden_file(monkeypatch):
    monkeypatch.setenv("DRA_HARNESS_STATE_DIR", "/state")  # the scheduler's mount names the state directory
    text = kind_config.config_yaml(_plan(name="dra-harness").config)
    if os.environ.get("DRA_HARNESS_UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert GOLDEN.is_file(), f"missing {GOLDEN}; run with DRA_HARNESS_UPDATE_GOLDEN=1"
    assert text == GOLDEN.read_text(), "kind config changed; regenerate with DRA_HARNESS_UPDATE_GOLDEN=1 and review"


def test_the_scheduler_runs_the_suites_second_profile_from_a_mounted_file(state_dir):
    plan = _plan()
    assert [p.name for p in plan.scheduler_profiles] == [schedulerprofiles.SHORT_DRA_TIMEOUTS]
    control_plane = plan.config["nodes"][0]
    assert control_plane["extraMounts"] == [{"hostPath": str(state_dir / "kind" / "ci" / "scheduler"),
                                             "containerPath": kind_config.SCHEDULER_NODE_DIR, "readOnly": True}]
    assert all("extraMounts" not in n for n in plan.config["nodes"][1:])
    (patch,) = plan.config["kubeadmConfigPatchesJSON6902"]
    assert (patch["group"], patch["version"], patch["kind"]) == ("kubeadm.k8s.io", "v1beta4", "ClusterConfiguration")
    operations = yaml.safe_load(patch["patch"])
    # appended to kind's own extraArgs (its --feature-gates), never replacing them
    assert operations[0] == {"op": "add", "path": "/scheduler/extraArgs/-", "value": {
        "name": "config", "value": f"{kind_config.SCHEDULER_NODE_DIR}/{kind_config.SCHEDULER_CONFIG}"}}
    assert operations[1]["value"][0]["hostPath"] == operations[1]["value"][0]["mountPath"] == \
        kind_config.SCHEDULER_NODE_DIR
    config = kind_config.scheduler_config(plan.scheduler_profiles)
    assert config["clientConnection"]["kubeconfig"] == "/etc/kubernetes/scheduler.conf"  # --kubeconfig is ignored
    assert [p["schedulerName"] for p in config["profiles"]] == ["default-scheduler", schedulerprofiles.SHORT_DRA_TIMEOUTS]
    # without gates of its own, kind writes no extraArgs list to append to: the patch makes one
    assert yaml.safe_load(kind_config._scheduler_patch(False)["patch"])[0] == {
        "op": "add", "path": "/scheduler/extraArgs", "value": [operations[0]["value"]]}


def test_kind_config_semantics():
    """What the golden file must say, checked without trusting it."""
    config = yaml.safe_load(GOLDEN.read_text())
    assert config["kind"] == "Cluster" and config["apiVersion"] == "kind.x-k8s.io/v1alpha4"
    roles = [n["role"] for n in config["nodes"]]
    assert roles == ["control-plane"] + ["worker"] * 9  # mixed.yaml: 2 + 1 + 1 + 1 + 2 + 2 nodes
    image = kind_config.NODE_IMAGE
    assert image.startswith("kindest/node:v1.37.") and "@sha256:" in image and len(image.split("@sha256:")[1]) == 64
    assert all(n["image"] == image for n in config["nodes"])
    workers = config["nodes"][1:]
    profiles = [w["labels"].get("dra-harness.x-k8s.io/profile") for w in workers]
    assert profiles == ["dgx-h100", "dgx-h100", "a100-mig", "nvme-storage", "mixed", "tiny", "tiny", None, None]
    assert all(w["labels"]["dra-harness.x-k8s.io/node-pool"] for w in workers)
    assert workers[0]["labels"]["dra-harness.x-k8s.io/tier"] == "training"  # the pool's own labels
    assert "labels" not in config["nodes"][0]
    # The same gates and API versions as the local backend for the same preset.
    expected = featuregates.resolve(featuregates.load_matrix("1.37.2"), preset="all-dra")
    assert config["featureGates"] == expected.gates
    assert config["runtimeConfig"] == {gv: str(on).lower() for gv, on in expected.runtime_config.items()}
    assert all(isinstance(v, str) for v in config["runtimeConfig"].values())  # kind wants strings


def test_containerd_patches_enable_cdi_for_both_config_versions():
    patches = [tomllib.loads(p) for p in yaml.safe_load(GOLDEN.read_text())["containerdConfigPatches"]]
    by_version = {p["version"]: p for p in patches}
    assert set(by_version) == {2, 3}
    v2 = by_version[2]["plugins"]["io.containerd.grpc.v1.cri"]
    v3 = by_version[3]["plugins"]["io.containerd.cri.v1.runtime"]
    for section in (v2, v3):
        assert section["enable_cdi"] is True
        assert "/var/run/cdi" in section["cdi_spec_dirs"]  # where the kubelet plugin writes its specs


def test_kind_config_follows_preset_and_overrides():
    plan = _plan(definition=None, nodes=2, preset="ga-only", feature_gates="DRAConsumableCapacity=false",
                 runtime_config="resource.k8s.io/v1beta2=true")
    assert plan.config["featureGates"] == {"DRAConsumableCapacity": False}
    assert plan.config["runtimeConfig"] == {"resource.k8s.io/v1beta2": "true"}
    assert [n["role"] for n in plan.config["nodes"]] == ["control-plane", "worker", "worker"]
    assert plan.node_names == ("ci-control-plane", "ci-worker", "ci-worker2")


def test_node_names_follow_kinds_naming():
    assert kind_config.node_names("x", 3) == ("x-control-plane", "x-worker", "x-worker2", "x-worker3")
    assert kind_config.node_names("x", 0) == ("x-control-plane",)


# --- the command sequence -------------------------------------------------------------------------


def test_up_runs_exactly_these_commands(state_dir):
    plan = _plan()
    d = state_dir / "kind" / "ci"
    image = f"localhost/dra-harness/fake-driver:{__import__('harness').__version__}"
    kubectl = f"/opt/k8s/kubectl --kubeconfig={d}/kubeconfig"
    nodes = ["ci-control-plane", "ci-worker"] + [f"ci-worker{i}" for i in range(2, 10)]
    expected = [
        "[write-files] writing the kind config, the image build context and the kustomization",
        f"/venv/bin/python -m pip wheel --no-deps --quiet --wheel-dir={d}/image/dist {REPO}",
        f"/usr/bin/docker build --tag={image} --file={d}/image/Dockerfile {d}/image",
        "/usr/bin/docker image prune --force --filter=label=dra-harness.x-k8s.io/image=fake-driver",
        f"/usr/local/bin/kind create cluster --name=ci --config={d}/kind-config.yaml --kubeconfig={d}/kubeconfig "
        "--wait=300s",
        "/usr/local/bin/kind get nodes --name=ci",
        f"/usr/bin/docker save --platform=linux/amd64 --output={d}/driver-image.tar {image}",
        f"/usr/bin/docker save --platform=linux/amd64 --output={d}/kwok-image.tar {in_cluster.UPSTREAM_IMAGE}",
        " & ".join([f"/usr/bin/docker exec --interactive {node} ctr --namespace=k8s.io images import "
                    f"--platform=linux/amd64 --digests - < {d}/driver-image.tar" for node in nodes]
                   # KWOK's image goes to the control-plane node alone: its controller runs there
                   + ["/usr/bin/docker exec --interactive ci-control-plane ctr --namespace=k8s.io images import "
                      f"--platform=linux/amd64 --digests - < {d}/kwok-image.tar"]),
        " & ".join(f"/usr/bin/docker exec {node} sh -c {shlex.quote(kind_steps.suite_images_script(image))}"
                   for node in nodes),
        "[drop-archive] removing the saved images",
        "[wait-nodes] waiting for 10 nodes to be Ready",
        f"{kubectl} kustomize {d}/deploy > {d}/manifests.yaml",
        f"{kubectl} apply --filename={d}/manifests.yaml",
        "[wait-rollout] waiting for the fake driver's controller and kubelet plugins",
        "[wait-slices] waiting until every node's ResourceSlices are published",
        f"{kubectl} apply --filename={d}/kwok.yaml",
        "[wait-kwok] waiting for KWOK's controller",
        "[simulated-nodes] creating 3 simulated (KWOK) nodes",
    ]
    assert [str(step) for step in plan.steps] == expected
    assert plan.steps[5].expect_lines == frozenset(nodes)  # kind must have named the nodes as planned
    assert plan.deployment.overlay == "mixed" and plan.deployment.deployed_by == "ci"
    assert plan.deployment.extended_resources == {"gpu": "example.com/gpu"}


def test_a_given_driver_image_is_loaded_not_built_and_no_deploy_skips_the_manifests():
    plan = _plan(definition=None, nodes=1, driver_image="registry.example/fake-driver:dev", deploy=False,
                 simulated_nodes=0)
    text = [str(s) for s in plan.steps]
    assert not any("docker build" in t or "pip wheel" in t for t in text)
    assert sum("docker save --platform=linux/amd64 --output=" in t and t.endswith("registry.example/fake-driver:dev")
               for t in text) == 1
    assert not any("kwok" in t.lower() for t in text)  # no simulated nodes: no KWOK at all
    assert [s for s in plan.steps if s.together][0].title == "loading the images into 2 nodes"
    assert not any("kubectl" in t for t in text)
    assert text[-1] == "[wait-nodes] waiting for 2 nodes to be Ready"


def test_a_dgx_only_definition_gets_the_dgx_overlay(tmp_path):
    definition = tmp_path / "dgx.yaml"
    definition.write_text(textwrap.dedent("""\
        apiVersion: dra-harness.x-k8s.io/v1alpha1
        kind: Cluster
        metadata: {name: dgx}
        spec:
          nodePools:
          - {name: dgx, count: 2, profile: dgx-h100}
          - {name: cpu, count: 1}
        """))
    plan = _plan(definition=cluster.load(str(definition)))
    assert plan.deployment.overlay == "dgx-h100"
    assert manifests.served_profiles("dgx-h100") == {"dgx-h100"}


# --- bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize("options, located", [
    ({"name": "Bad_Name"}, "--name: Bad_Name"),
    ({"node_image": "kindest/node:v1.37.0@sha256:abc"}, "--node-image: kindest/node:v1.37.0@sha256:abc"),
    ({"driver_image": "Not An Image"}, "--driver-image: Not An Image"),
    ({"feature_gates": "DRAPartitionableDevices=false,DRADeviceCompatibilityGroups=true", "definition": None},
     "--feature-gates: DRADeviceCompatibilityGroups: needs DRAPartitionableDevices"),
    ({"preset": "nope"}, "--preset: nope"),
])
def test_bad_input_is_reported_before_anything_runs(options, located, state_dir):
    calls = []
    backend = kind.KindBackend(preflight=lambda: calls.append("preflight") or TOOLS)
    base = {"name": "ci", "definition": cluster.load("mixed")}
    with pytest.raises(ConfigError) as err:
        backend.up(kind.KindUpOptions(**{**base, **options}))
    assert located in str(err.value)
    assert calls == [] and not state_dir.exists()  # not even the tools were looked for


def test_definitions_the_manifests_cannot_serve_are_refused_with_file_and_field(tmp_path):
    custom = tmp_path / "my-node.yaml"
    custom.write_text((REPO / "fake_devices" / "profiles" / "tiny.yaml").read_text().replace("name: tiny",
                                                                                             "name: my-node"))
    definition = tmp_path / "c.yaml"
    definition.write_text(textwrap.dedent(f"""\
        apiVersion: dra-harness.x-k8s.io/v1alpha1
        kind: Cluster
        metadata: {{name: c}}
        spec:
          driver: {{instance: other, domain: other.example.com}}
          nodePools:
          - {{name: a, count: 1, profile: tiny}}
          - {{name: b, count: 1, profile: {custom}}}
        """))
    with pytest.raises(ConfigError) as err:
        _plan(definition=cluster.load(str(definition)))
    text = str(err.value)
    assert f"{definition}: spec.driver.instance: 'other'" in text
    assert f"{definition}: spec.driver.domain: 'other.example.com'" in text
    assert f"{definition}: spec.nodePools[1].profile" in text and "only has the built-in profiles" in text
    assert "spec.nodePools[0]" not in text


# --- preflight ------------------------------------------------------------------------------------


def _fake_run(outputs: dict[str, tuple[int, str, str]]):
    def run(argv, timeout=60):
        key = " ".join(Path(argv[0]).name.split() + argv[1:2])
        code, out, err = outputs[key]
        return subprocess.CompletedProcess(argv, code, out, err)
    return run


GOOD = {"docker info": (0, "28.2.2|linux|x86_64\n", ""), "kind version": (0, "kind v0.33.0 go1.26.8 linux/amd64\n", "")}


def _which(*present):
    return lambda name: f"/usr/bin/{name}" if name in present else None


def test_preflight_names_everything_missing_in_one_message():
    with pytest.raises(HarnessError) as err:
        kind_preflight.preflight(which=_which(), run=_fake_run(GOOD), kubectl_finder=lambda: None)
    text = str(err.value)
    assert text.startswith("the kind backend cannot run on this machine:")
    assert "docker: the Docker CLI is not installed" in text
    assert "kind: not installed; need kind >= v0.33.0" in text
    assert "kubectl: not installed" in text
    assert text.count("\n  - ") == 3


def test_preflight_reports_an_unreachable_docker_engine():
    outputs = {**GOOD, "docker info": (1, "||\n", "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. "
                                                 "Is the docker daemon running?\n")}
    with pytest.raises(HarnessError) as err:
        kind_preflight.preflight(which=_which("docker", "kind"), run=_fake_run(outputs), kubectl_finder=lambda: "/k")
    text = str(err.value)
    assert "Docker engine: not reachable" in text and "Cannot connect to the Docker daemon" in text
    assert "kind" not in text.split("hint:")[0].replace("the kind backend", "")  # kind itself is fine


@pytest.mark.parametrize("docker, kind_out, problem", [
    ("27.5.1|linux|x86_64", "kind v0.33.0 go1.26.8 linux/amd64", "Docker engine 27.5.1 is too old: need >= 28.0"),
    ("28.2.2|linux|x86_64", "kind v0.32.0 go1.26.2 linux/amd64", "kind v0.32.0 is too old: need >= v0.33.0"),
    ("28.2.2|linux|x86_64", "something odd", "did not report a version"),
])
def test_preflight_reports_old_versions(docker, kind_out, problem):
    outputs = {"docker info": (0, docker, ""), "kind version": (0, kind_out, "")}
    with pytest.raises(HarnessError) as err:
        kind_preflight.preflight(which=_which("docker", "kind"), run=_fake_run(outputs), kubectl_finder=lambda: "/k")
    assert problem in str(err.value)


def test_preflight_passes_and_reports_the_engines_platform():
    outputs = {**GOOD, "docker info": (0, "29.0.1|linux|aarch64", "")}
    tools = kind_preflight.preflight(which=_which("docker", "kind"), run=_fake_run(outputs),
                                     kubectl_finder=lambda: "/k/kubectl")
    assert tools == kind_preflight.Tools("/usr/bin/docker", "/usr/bin/kind", "/k/kubectl", sys.executable,
                                         "linux/arm64")


def test_preflight_on_this_machine_gives_one_clear_message_or_tools():
    """Whatever this machine has: either the tools, or one HarnessError (never a traceback)."""
    try:
        tools = kind_preflight.preflight()
    except HarnessError as err:
        assert str(err).startswith("the kind backend cannot run on this machine:")
    else:
        assert Path(tools.docker).name == "docker" and Path(tools.kind).name == "kind"


def test_cli_without_docker_prints_one_error_line_and_starts_nothing(tmp_path):
    env = {**os.environ, "DRA_HARNESS_STATE_DIR": str(tmp_path / "state"), "PATH": str(tmp_path / "empty"),
           "DRA_HARNESS_CACHE_DIR": str(tmp_path / "cache")}  # no cached kind either
    (tmp_path / "empty").mkdir()
    result = subprocess.run([sys.executable, "-m", "harness.cli", "cluster", "up", "--backend", "kind",
                             "--config", "mixed"], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 1, result
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("error: the kind backend cannot run on this machine:")
    assert "docker: the Docker CLI is not installed" in result.stderr and "kind: not installed" in result.stderr
    assert not (tmp_path / "state" / "kind").exists()


# --- the runner -----------------------------------------------------------------------------------


def test_runner_pipes_writes_files_and_checks_output(tmp_path):
    runner = Runner(Reporter(quiet=True))
    out = tmp_path / "out.txt"
    runner.run(command("sort", "sort", "-r", pipe_from=("printf", "a\\nc\\nb\\n"), stdout_file=out))
    assert out.read_text() == "c\nb\na\n"
    assert runner.run(command("echo", "printf", "x\\ny\\n", expect_lines=frozenset({"x", "y"}))) == "x\ny\n"
    with pytest.raises(CommandFailed, match=r"printed \['x'\], expected \['x', 'z'\]"):
        runner.run(command("echo", "printf", "x\\n", expect_lines=frozenset({"x", "z"})))


def test_runner_failures_name_the_command_and_show_its_output():
    runner = Runner(Reporter(quiet=True))
    with pytest.raises(CommandFailed) as err:
        runner.run(command("failing", "sh", "-c", "echo something broke >&2; exit 3"))
    assert "failing: `sh -c 'echo something broke >&2; exit 3'` exited with 3" in str(err.value)
    assert "something broke" in str(err.value)
    with pytest.raises(CommandFailed, match=r"`sh -c 'echo producer died >&2; exit 4'` exited with 4"):
        runner.run(command("pipe", "cat", pipe_from=("sh", "-c", "echo producer died >&2; exit 4")))
    with pytest.raises(CommandFailed, match="cannot run /nonexistent/tool: not installed"):
        runner.run(command("missing", "/nonexistent/tool"))
    with pytest.raises(CommandFailed, match="did not finish within 0s"):
        runner.run(command("slow", "sleep", "30", timeout=0.3))


def test_together_runs_the_commands_at_the_same_time_and_names_every_failure(tmp_path):
    runner = Runner(Reporter(quiet=True))
    archive = tmp_path / "archive"
    archive.write_text("payload")
    marks = tmp_path / "marks"
    marks.mkdir()
    # each command waits until all three have started: only side by side can they finish
    wait_all = f"touch {marks}/$0; while [ $(ls {marks} | wc -l) -lt 3 ]; do sleep 0.05; done; cat > {tmp_path}/$0.out"
    runner.run(Step("three", together=tuple(command(f"to {n}", "sh", "-c", wait_all, n, stdin_file=archive, timeout=30)
                                            for n in ("a", "b", "c"))))
    assert [(tmp_path / f"{n}.out").read_text() for n in ("a", "b", "c")] == ["payload"] * 3


def test_together_names_each_failed_command_with_its_output():
    runner = Runner(Reporter(quiet=True))
    with pytest.raises(CommandFailed) as err:
        runner.run(Step("loading", together=(
            command("into n1", "sh", "-c", "echo n1 is full >&2; exit 3"),
            command("into n2", "true"),
            command("into n3", "sleep", "30", timeout=0.5),
            command("into n4", "/nonexistent/ctr"))))
    text = str(err.value)
    assert text.startswith("loading: ")
    assert "into n1: `sh -c 'echo n1 is full >&2; exit 3'` exited with 3" in text and "n1 is full" in text
    assert "into n3: `sleep 30` did not finish within 0s" in text
    assert "into n4: cannot run /nonexistent/ctr: not installed" in text and "n2" not in text
    with pytest.raises(ValueError):
        Step("nested", together=(Step("inner", together=(command("x", "true"),)),))


def test_steps_are_commands_or_actions():
    with pytest.raises(ValueError):
        Step("neither")
    with pytest.raises(ValueError):
        Step("both", argv=("a",), action="b")
    assert str(commands.action("wait", "waiting")) == "[wait] waiting"


# --- up and down against fake tools ---------------------------------------------------------------

FAKE_TOOL = r'''#!PYTHON -S
"""A stand-in for docker / kind / kubectl / python that records each call and behaves just enough."""
import json, os, sys
from pathlib import Path

work = Path(os.environ["FAKE_TOOLS_DIR"])
tool, args = Path(sys.argv[0]).name, sys.argv[1:]
with open(work / "calls.jsonl", "a") as log:
    log.write(json.dumps([tool] + args) + "\n")
line = " ".join([tool] + args)
if os.environ.get("FAKE_FAIL") and os.environ["FAKE_FAIL"] in line:
    print(f"fake failure of: {line}", file=sys.stderr)
    sys.exit(1)
clusters = work / "clusters"
known = set(clusters.read_text().split()) if clusters.exists() else set()
if tool == "kind" and args[:2] == ["create", "cluster"]:
    name = next(a.split("=", 1)[1] for a in args if a.startswith("--name="))
    clusters.write_text("\n".join(sorted(known | {name})))
    Path(next(a.split("=", 1)[1] for a in args if a.startswith("--kubeconfig="))).write_text("fake: kubeconfig\n")
elif tool == "kind" and args[:2] == ["delete", "cluster"]:
    name = next(a.split("=", 1)[1] for a in args if a.startswith("--name="))
    clusters.write_text("\n".join(sorted(known - {name})))
elif tool == "kind" and args[:2] == ["get", "clusters"]:
    print("\n".join(sorted(known)))
elif tool == "kind" and args[:2] == ["get", "nodes"]:
    print(os.environ["FAKE_NODES"].replace(",", "\n"))
elif tool == "docker" and args[0] == "save":
    output = next((a.split("=", 1)[1] for a in args if a.startswith("--output=")), None)
    if output:
        Path(output).write_text("IMAGE-ARCHIVE " + args[-1])
    else:
        sys.stdout.write("IMAGE-ARCHIVE " + args[-1])
elif tool == "docker" and args[0] == "exec" and args[2:4] == ["sh", "-c"]:  # naming the suite's images
    assert "images tag" in args[4], args
    with open(work / "tagged.txt", "a") as out:
        out.write(args[1] + "\n")
elif tool == "docker" and args[0] == "exec":
    data = sys.stdin.read()
    assert data.startswith("IMAGE-ARCHIVE "), data
    with open(work / "imported.txt", "a") as out:
        out.write(args[2] + " " + data.split(" ", 1)[1] + "\n")
elif tool == "python" and "wheel" in args:
    wheel_dir = Path(next(a.split("=", 1)[1] for a in args if a.startswith("--wheel-dir=")))
    (wheel_dir / "dra_harness-0.1.0-py3-none-any.whl").write_text("wheel")
elif tool == "docker" and args[0] == "build":
    context = Path(args[-1])
    assert (context / "Dockerfile").is_file() and (context / ".dockerignore").is_file()
    assert [p.name for p in (context / "dist").iterdir()] == ["dra_harness-0.1.0-py3-none-any.whl"]
elif tool == "kubectl" and "kustomize" in args:
    directory = Path(args[-1])
    assert (directory / "kustomization.yaml").is_file()
    print("---")
'''


@pytest.fixture
def fake_tools(tmp_path, monkeypatch):
    work = tmp_path / "tools"
    work.mkdir()
    for name in ("docker", "kind", "kubectl", "python"):
        path = work / name
        path.write_text(FAKE_TOOL.replace("PYTHON", sys.executable, 1))
        path.chmod(0o755)
    monkeypatch.setenv("FAKE_TOOLS_DIR", str(work))
    tools = kind_preflight.Tools(docker=str(work / "docker"), kind=str(work / "kind"), kubectl=str(work / "kubectl"),
                                 python=str(work / "python"), platform="linux/amd64")
    return work, tools


def _calls(work: Path) -> list[list[str]]:
    path = work / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _backend(tools, waits: list):
    backend = kind.KindBackend(Reporter(quiet=True), preflight=lambda: tools)
    backend._wait = lambda plan, what, tools=None: waits.append(what)
    backend._simulated_nodes = lambda plan, count: waits.append(f"{count} simulated nodes")
    return backend


def test_up_and_down_run_the_plan_against_the_tools(fake_tools, monkeypatch, state_dir):
    work, tools = fake_tools
    monkeypatch.setenv("FAKE_NODES", "t-control-plane,t-worker,t-worker2")
    waits: list[str] = []
    backend = _backend(tools, waits)
    options = kind.KindUpOptions(name="t", nodes=2, definition=None)
    plan = backend.plan(options, tools)
    monkeypatch.setattr(kind, "kubeconfig_endpoint", lambda path: ("kind-t", "https://127.0.0.1:6443"))
    info = backend.up(options)

    # The calls, in plan order. A pipe's producer and consumer start together, so within one step
    # their order is free: compare step by step as multisets.
    commands_run = [tuple(c) for c in _calls(work) if c[:3] != ["kind", "get", "clusters"]]
    groups = []
    for step in plan.steps:
        if step.argv:
            group = [tuple([Path(step.argv[0]).name, *step.argv[1:]])]
            if step.pipe_from:
                group.append(tuple([Path(step.pipe_from[0]).name, *step.pipe_from[1:]]))
            groups.append(sorted(group))
        elif step.together:  # run side by side: any order within the step
            groups.append(sorted(tuple([Path(s.argv[0]).name, *s.argv[1:]]) for s in step.together))
    position = 0
    for group in groups:
        assert sorted(commands_run[position:position + len(group)]) == group
        position += len(group)
    assert position == len(commands_run)
    assert [c[1] for c in commands_run if c[0] == "kind"] == ["create", "get"]
    assert waits == ["nodes", "rollout", "slices", "kwok", "3 simulated nodes"]
    image = manifests.default_image()
    assert sorted((work / "imported.txt").read_text().splitlines()) == sorted(
        [f"{n} {image}" for n in plan.node_names] + [f"t-control-plane {in_cluster.UPSTREAM_IMAGE}"])
    # every node names the suite's shell and pause images after its image load (the suite's pods on a worker)
    assert sorted((work / "tagged.txt").read_text().splitlines()) == sorted(plan.node_names)
    directory = state_dir / "kind" / "t"
    assert not {"driver-image.tar", "kwok-image.tar"} & {p.name for p in directory.iterdir()}  # removed once loaded
    assert yaml.safe_load((directory / "scheduler" / "kube-scheduler.yaml").read_text()) == \
        kind_config.scheduler_config(plan.scheduler_profiles)
    assert info.scheduler_profile(schedulerprofiles.SHORT_DRA_TIMEOUTS) == plan.scheduler_profiles[0]  # for the suite
    kwok_objects = list(yaml.safe_load_all((directory / "kwok.yaml").read_text()))
    assert {o["metadata"]["labels"][manifests.DEPLOYED_BY_LABEL] for o in kwok_objects} == {"t"}
    assert yaml.safe_load((directory / "kind-config.yaml").read_text()) == plan.config
    kustomization = yaml.safe_load((directory / "deploy" / "kustomization.yaml").read_text())
    assert kustomization["labels"][0]["pairs"] == {manifests.DEPLOYED_BY_LABEL: "t"}
    assert info.name == "t" and info.kubeconfig == directory / "kubeconfig"
    assert backend.list() == ["t"]

    assert backend.down("t") == []
    assert _calls(work)[-2][:3] == ["kind", "delete", "cluster"]
    assert not directory.exists() and backend.list() == []
    with pytest.raises(ClusterNotFound):
        backend.down("t")


def test_a_failed_up_deletes_the_cluster_and_its_state(fake_tools, monkeypatch, state_dir):
    work, tools = fake_tools
    monkeypatch.setenv("FAKE_NODES", "t-control-plane,t-worker")
    monkeypatch.setenv("FAKE_FAIL", "kubectl --kubeconfig")  # the first kubectl call (kustomize) fails
    backend = _backend(tools, [])
    with pytest.raises(CommandFailed) as err:
        backend.up(kind.KindUpOptions(name="t", nodes=1))
    assert "rendering the manifests (kustomize)" in str(err.value) and "fake failure of" in str(err.value)
    calls = _calls(work)
    assert ["kind", "delete", "cluster", "--name=t", f"--kubeconfig={state_dir / 'kind' / 't' / 'kubeconfig'}"] in calls
    # and whatever node container kind did not delete (an interrupted create leaves some)
    assert calls.index(["docker", "ps", "--all", "--quiet", "--filter=label=io.x-k8s.kind.cluster=t"]) > \
        calls.index(["kind", "delete", "cluster", "--name=t", f"--kubeconfig={state_dir / 'kind' / 't' / 'kubeconfig'}"])
    assert not (state_dir / "kind" / "t").exists()
    assert (work / "clusters").read_text().split() == []


def test_a_failed_up_with_keep_on_failure_keeps_everything(fake_tools, monkeypatch, state_dir):
    work, tools = fake_tools
    monkeypatch.setenv("FAKE_NODES", "t-control-plane,t-worker")
    monkeypatch.setenv("FAKE_FAIL", " apply ")
    backend = _backend(tools, [])
    with pytest.raises(CommandFailed, match="applying the manifests"):
        backend.up(kind.KindUpOptions(name="t", nodes=1, keep_on_failure=True))
    assert not any(c[:2] == ["kind", "delete"] for c in _calls(work))
    state = yaml.safe_load((state_dir / "kind" / "t" / "state.yaml").read_text())
    assert state["phase"] == "failed" and (work / "clusters").read_text().split() == ["t"]


def test_unexpected_node_names_stop_the_start(fake_tools, monkeypatch):
    work, tools = fake_tools
    monkeypatch.setenv("FAKE_NODES", "t-control-plane,t-worker,surprise")
    with pytest.raises(CommandFailed, match="checking the node names"):
        _backend(tools, []).up(kind.KindUpOptions(name="t", nodes=1))
    assert not any(c[0] == "docker" and c[1] in ("save", "exec") for c in _calls(work))


def test_up_refuses_a_name_kind_already_has(fake_tools, monkeypatch):
    work, tools = fake_tools
    (work / "clusters").write_text("t\n")
    with pytest.raises(HarnessError, match="a kind cluster named 't' already exists"):
        _backend(tools, []).up(kind.KindUpOptions(name="t", nodes=1))
    assert not any(c[:2] == ["kind", "create"] for c in _calls(work))


# --- what the image installs ----------------------------------------------------------------------


def test_the_wheel_the_image_installs_has_both_entry_points_and_the_data(tmp_path):
    """deploy/Dockerfile installs only the project wheel: it must carry both entry points, every
    built-in profile and the feature-gate matrix (the same `pip wheel` the kind backend runs)."""
    import importlib.util
    import zipfile

    from fake_devices import profile

    argv = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", f"--wheel-dir={tmp_path}", str(REPO)]
    if importlib.util.find_spec("setuptools") is not None:
        argv.insert(5, "--no-build-isolation")  # offline when the build backend is already here
    result = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    (wheel,) = tmp_path.glob("dra_harness-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for required in ["fake_devices/__main__.py", "fake_devices/controller.py", "fake_devices/kubeletplugin/__main__.py",
                     "clusters/feature-gates/v1.37.yaml"] + \
            [f"fake_devices/profiles/{name}.yaml" for name in profile.builtin_names()]:
        assert required in names, required
    assert not any(n.startswith(("tests/", "deploy/")) for n in names)
    dockerignore = (REPO / "deploy" / ".dockerignore").read_text().split()
    assert dockerignore[-1] == "!dist/dra_harness-*.whl" and "*" in dockerignore  # only the wheel goes in
    assert "FROM ${BASE_IMAGE}" in (REPO / "deploy" / "Dockerfile").read_text()
    # what a rebuild prunes is marked by the Dockerfile itself
    assert f"LABEL {kind_steps.DRIVER_IMAGE_LABEL}\n" in (REPO / "deploy" / "Dockerfile").read_text()


def test_strings_stay_strings_for_kinds_yaml_parser(tmp_path):
    """kind reads its config with Go YAML rules: `1e5` is a number and `y` a boolean there, although
    PyYAML would write both unquoted. Every string value is quoted."""
    definition = tmp_path / "c.yaml"
    definition.write_text("apiVersion: dra-harness.x-k8s.io/v1alpha1\nkind: Cluster\nmetadata: {name: c}\n"
                          "spec:\n  nodePools:\n  - {name: a, count: 1, labels: {tier: 'y', rack: '1e5'}}\n")
    text = kind_config.config_yaml(_plan(name="1e5", definition=cluster.load(str(definition))).config)
    assert 'name: "1e5"' in text and 'tier: "y"' in text and 'rack: "1e5"' in text
    assert yaml.safe_load(text)["nodes"][1]["labels"] == {"dra-harness.x-k8s.io/node-pool": "a", "rack": "1e5",
                                                          "tier": "y"}


# --- the harness's own engine and the offline node image (harness.backends.kind.host) -----------


def test_the_offline_node_image_brings_its_kubeadm_patches_and_no_default_cni():
    from harness.backends.kind.host import nodefiles, nodeinputs

    tag = f"{nodeinputs.IMAGE_REPOSITORY}:v1.37.2-0123456789ab"
    assert kind_config.OFFLINE_IMAGE_REPOSITORY == nodeinputs.IMAGE_REPOSITORY
    config = _plan(node_image=tag).config
    assert config["networking"] == {"disableDefaultCNI": True}
    assert config["kubeadmConfigPatches"] == nodefiles.kind_config_patches()
    assert {n["image"] for n in config["nodes"]} == {tag}
    assert "kubeadmConfigPatches" not in _plan().config  # kind's own image needs none of it


def test_an_own_older_engine_loads_images_without_platform_flags(monkeypatch):
    outputs = {**GOOD, "docker info": (0, "20.10.24+dfsg1|linux|x86_64", "")}
    calls = []

    def fake_run_quiet(argv, timeout=60, env=None):
        calls.append(env)
        return _fake_run(outputs)(argv, timeout)

    monkeypatch.setattr(kind_preflight, "run_quiet", fake_run_quiet)
    tools = kind_preflight.preflight(which=_which("docker", "kind"), kubectl_finder=lambda: "/k",
                                     env={"DOCKER_HOST": "unix:///s/docker.sock"})
    assert tools.save_platform is False and tools.env == {"DOCKER_HOST": "unix:///s/docker.sock"}
    assert calls and all(env == {"DOCKER_HOST": "unix:///s/docker.sock"} for env in calls)
    steps = [str(s) for s in _plan(tools=tools, definition=None, nodes=1).steps if "docker save" in str(s)]
    assert steps and all("--platform" not in s for s in steps)
    with pytest.raises(HarnessError, match="20.10.24 is too old"):  # the machine's own engine: still >= 28
        kind_preflight.preflight(which=_which("docker", "kind"), run=_fake_run(outputs), kubectl_finder=lambda: "/k")


def test_a_node_that_is_not_ready_is_named_with_its_reason():
    def node(status: str, reason: str = "KubeletNotReady", message: str = "container runtime network not ready",
             taints=()):
        return V1Node(metadata=V1ObjectMeta(name="n"), spec=V1NodeSpec(taints=[V1Taint(key=k, effect="NoSchedule")
                                                                            for k in taints]),
                      status=V1NodeStatus(conditions=[V1NodeCondition(type="Ready", status=status, reason=reason,
                                                                      message=message)]))

    assert nodes.why_not_ready(None).startswith("never registered")
    assert nodes.why_not_ready(node("False")) == ("Ready=False (KubeletNotReady: container runtime network not "
                                                  "ready)")
    assert nodes.why_not_ready(node("True", taints=["node.kubernetes.io/not-ready"])) == (
        "Ready but still tainted node.kubernetes.io/not-ready")
    empty = V1Node(metadata=V1ObjectMeta(name="n"), status=V1NodeStatus(conditions=[]))
    assert nodes.why_not_ready(empty) == "registered, no Ready condition yet"


def test_kubelet_logs_name_each_node_and_what_its_journal_says(tmp_path):
    docker = tmp_path / "docker"
    docker.write_text("#!/bin/sh\necho \"$2: E1201 kubelet.go: error creating fsnotify watcher: too many open files\"\n")
    docker.chmod(0o755)
    tools = kind_preflight.Tools(docker=str(docker), env=dict(os.environ))
    text = kind._kubelet_logs(["c-worker8", "c-worker9"], tools)
    assert "--- kubelet of c-worker8 (docker exec c-worker8 journalctl -u kubelet) ---" in text
    assert "c-worker9: E1201 kubelet.go: error creating fsnotify watcher: too many open files" in text
    assert kind._kubelet_logs(["x"], None) == ""
