"""The CLI on bad input: exit status 2, one located `error:` line, no traceback, and nothing built,
created or started. Environment failures (a missing cluster, a broken binary cache) exit 1, also
without a traceback.

Every case runs the CLI (`harness.cli.main.run`, in this process, so the table stays fast on a loaded
machine) with the state and cache directories pointed into a temporary directory, so nothing real is
touched; a few cases also run through `python -m harness.cli` as a user runs it.
"""

from __future__ import annotations

import contextlib
import io
import os
import socket
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.core import paths

REPO = Path(__file__).resolve().parents[2]
ROOT = "{root}"  # replaced by the case's temporary directory
REPORTS = ["--report-dir", f"{ROOT}/reports"]  # a report directory that must not be created


@dataclass(frozen=True)
class Result:
    args: tuple[str, ...]
    code: int
    stdout: str
    stderr: str
    root: Path
    seconds: float = 0.0

    @property
    def state_dir(self) -> Path:
        return self.root / "state"

    @property
    def cache_dir(self) -> Path:
        return self.root / "cache"

    def __str__(self) -> str:
        return (f"dra-harness {' '.join(self.args)} -> {self.code} in {self.seconds:.1f}s\n"
                f"stdout:\n{self.stdout}\nstderr:\n{self.stderr}")


def _closed_port() -> int:
    with socket.socket() as sock:  # bound, never listening: connections to it are refused
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _kubeconfig(server: str) -> str:
    return ("apiVersion: v1\nkind: Config\ncurrent-context: c\n"
            f"clusters: [{{name: k, cluster: {{server: '{server}', insecure-skip-tls-verify: true}}}}]\n"
            "users: [{name: u, user: {token: t}}]\ncontexts: [{name: c, context: {cluster: k, user: u}}]\n")


VENDOR_OK = ("apiVersion: dra-harness.x-k8s.io/v1alpha1\nkind: VendorDriver\nmetadata: {name: acme}\n"
             "spec: {drivers: [gpu.acme.example]}\n")

# Input files every case can name as {root}/files/<name>.
FILES = {
    "kc-empty": "",
    "kc-garbage": b"\x00\xff\xfe garbage \x81\x92",
    "kc-list": "- just\n- a list\n",
    "kc-bad-yaml": "clusters: [unclosed\n",
    "kc-no-context": "apiVersion: v1\nkind: Config\nclusters: []\n",
    "kc-dangling-context": "apiVersion: v1\nkind: Config\ncurrent-context: nope\ncontexts: []\n",
    "kc-no-server": _kubeconfig("").replace("server: ''", "server: 'not a url'"),
    "vendor-ok.yaml": VENDOR_OK,
    "vendor-empty.yaml": "",
    "vendor-wrong-kind.yaml": VENDOR_OK.replace("VendorDriver", "NodeProfile"),
    "vendor-bad-driver.yaml": VENDOR_OK.replace("gpu.acme.example", "Not_A_Driver"),
    "a-file": "not a directory\n",
}

EXISTING = ["conformance", "run", "--backend", "existing"]
LOAD = ["load", "run", "--scenario", "device-freed", *REPORTS]
TRAVERSAL = "1.37.2/../../../../escaped"

# (id, arguments, text that locates the problem in stderr); all exit 2.
BAD_INPUT = [
    ("bad-name", ["cluster", "up", "--name", "Bad_Name"], ["--name: Bad_Name", "not a valid cluster name"]),
    ("too-many-real-nodes", ["cluster", "up", "--real-nodes", "9"], ["--real-nodes: 9", "0 to 4"]),
    ("real-nodes-on-kind", ["cluster", "up", "--backend", "kind", "--real-nodes", "1"],
     ["--real-nodes: 1", "not used by --backend kind"]),
    ("simulated-nodes-on-local", ["cluster", "up", "--simulated-nodes", "2"],
     ["--simulated-nodes: 2", "not used by --backend local", "--backend kind or existing"]),
    ("simulated-nodes-out-of-range", ["cluster", "up", "--backend", "kind", "--simulated-nodes", "-1"],
     ["--simulated-nodes: -1", "out of range", "0 (no KWOK) to 1000"]),
    ("kwok-image-without-nodes", ["cluster", "up", "--backend", "kind", "--simulated-nodes", "0", "--kwok-image",
                                  "registry.k8s.io/kwok/kwok:v0.8.0"],
     ["--kwok-image: registry.k8s.io/kwok/kwok:v0.8.0", "has no effect without simulated nodes"]),
    ("bad-kwok-image", ["cluster", "up", "--backend", "kind", "--kwok-image", "Not An Image"],
     ["--kwok-image: Not An Image", "not an image reference"]),
    ("verbosity-out-of-range", ["cluster", "up", "--verbosity", "11"],
     ["--verbosity: 11", "out of range", "from 0 to 10"]),
    ("verbosity-on-kind", ["cluster", "up", "--backend", "kind", "--verbosity", "5"],
     ["--verbosity: 5", "not used by --backend kind", "--backend local"]),
    ("bad-real-nodes-count", ["conformance", "run", "--real-nodes", "many", *REPORTS],
     ["--real-nodes: many", "not a number", "auto, 0, 1"]),
    ("bad-gate-value", ["cluster", "up", "--feature-gates", "Foo=maybe"], ["--feature-gates: Foo", "not a boolean"]),
    ("dependency", ["cluster", "up", "--feature-gates", "GenericWorkload=false"],
     ["DRAWorkloadResourceClaims", "needs GenericWorkload"]),
    ("bad-preset", ["cluster", "up", "--preset", "nope"], ["--preset: nope", "unknown preset", "all-dra"]),
    ("negative-nodes", ["cluster", "up", "--nodes", "-1"], ["--nodes: -1", "out of range", "0 to 10000"]),
    ("bad-version", ["cluster", "up", "--kubernetes-version", "1.99.0"],
     ["--kubernetes-version", "no feature-gate matrix for 1.99.0"]),
    # rich markup characters in user input must be printed, not interpreted
    ("markup-in-input", ["cluster", "up", "--runtime-config", "[/x]=true"],
     ["--runtime-config: [/x]", "not an API group/version"]),
    # item 7: an unknown gate is refused on a cold cache, before any build
    ("unknown-gate-cold-cache", ["cluster", "up", "--feature-gates", "DRAWorkloadResourceClaim=true"],
     ["--feature-gates: DRAWorkloadResourceClaim", "unknown feature gate in Kubernetes 1.37",
      "DRAWorkloadResourceClaims"]),
    ("unknown-gate-run", ["run", "--feature-gates", "NoSuchGate=true", *REPORTS],
     ["--feature-gates: NoSuchGate", "unknown feature gate"]),
    ("unknown-gate-conformance", ["conformance", "run", "--feature-gates", "NoSuchGate=true", *REPORTS],
     ["--feature-gates: NoSuchGate", "unknown feature gate"]),
    ("bad-config-before-report-dir", ["conformance", "run", "--config", f"{ROOT}/files/nothing.yaml", *REPORTS],
     ["nothing.yaml"]),
    # item 10: versions are plain semantic versions, so none can leave the cache
    ("version-traversal-install", ["binaries", "install", "--kubernetes-version", TRAVERSAL],
     [f"--kubernetes-version: {TRAVERSAL}", "not a version", "X.Y.Z"]),
    ("version-traversal-etcd", ["binaries", "install", "--etcd-version", "../../x"],
     ["--etcd-version: ../../x", "not a version"]),
    ("version-traversal-kwok-path", ["binaries", "path", "--kwok-version", "0.8.0/../../x"],
     ["--kwok-version: 0.8.0/../../x", "not a version"]),
    ("version-traversal-up", ["cluster", "up", "--kubernetes-version", TRAVERSAL], ["--kubernetes-version", "not a version"]),
    ("version-traversal-kind", ["cluster", "up", "--backend", "kind", "--kubernetes-version", TRAVERSAL],
     ["--kubernetes-version", "not a version"]),
    ("version-traversal-run", ["run", "--etcd-version", "3.6.16/..", *REPORTS], ["--etcd-version", "not a version"]),
    ("version-empty", ["binaries", "install", "--kubernetes-version", ""], ["--kubernetes-version", "not a version"]),
    ("version-spaces", ["binaries", "install", "--kwok-version", "0.8.0 -x"], ["--kwok-version", "not a version"]),
    ("run-real-nodes-negative", ["run", "--real-nodes", "-1", *REPORTS], ["--real-nodes: -1", "0 to 4"]),
    ("run-nodes-huge", ["run", "--nodes", "100000", *REPORTS], ["--nodes: 100000", "0 to 10000"]),
    ("run-nodes-negative", ["conformance", "run", "--nodes", "-3", *REPORTS], ["--nodes: -3", "0 to 10000"]),
    # the backend checks the run's request itself (Backend.check), before the report directory is made
    ("run-kind-nodes-negative", ["conformance", "run", "--backend", "kind", "--nodes", "-2", *REPORTS],
     ["--nodes: -2", "out of range", "0 to 10000"]),
    ("run-kind-bad-gate", ["conformance", "run", "--backend", "kind", "--feature-gates", "NoSuchGate=true", *REPORTS],
     ["NoSuchGate"]),
    # item 9: conformance workers
    ("conformance-negative-workers", ["conformance", "run", "-n", "-1", *REPORTS],
     ["-n/--workers: -1", "out of range", "0 to 64"]),
    ("run-too-many-workers", ["run", "-n", "1000", *REPORTS], ["-n/--workers: 1000", "0 to 64"]),
    # item 7: vendor files only with --backend existing
    ("vendor-with-local", ["conformance", "run", "--driver-config", f"{ROOT}/files/vendor-ok.yaml", *REPORTS],
     ["--driver-config", "vendor-ok.yaml", "local backend runs only the dra-harness fake driver",
      "--backend existing --kubeconfig K"]),
    ("vendor-with-run", ["run", "--driver-config", f"{ROOT}/files/vendor-ok.yaml", *REPORTS],
     ["--driver-config", "--backend existing"]),
    # item 8: the vendor file is read before the kubeconfig is asked for
    ("vendor-bad-driver-first", [*EXISTING, "--driver-config", f"{ROOT}/files/vendor-bad-driver.yaml", *REPORTS],
     ["vendor-bad-driver.yaml", "spec.drivers[0]", "Not_A_Driver", "DNS subdomain"]),
    ("vendor-wrong-kind-first", [*EXISTING, "--driver-config", f"{ROOT}/files/vendor-wrong-kind.yaml", *REPORTS],
     ["vendor-wrong-kind.yaml", "kind", "VendorDriver"]),
    ("vendor-empty-first", [*EXISTING, "--driver-config", f"{ROOT}/files/vendor-empty.yaml", *REPORTS],
     ["vendor-empty.yaml"]),
    ("vendor-missing-first", [*EXISTING, "--driver-config", f"{ROOT}/files/no-such-vendor.yaml", *REPORTS],
     ["no-such-vendor.yaml", "no such file"]),
    # item 6: kubeconfigs of --backend existing
    ("existing-without-kubeconfig", [*EXISTING, *REPORTS], ["--kubeconfig: (not set)", "KUBECONFIG"]),
    ("existing-local-flags", [*EXISTING, "--kubeconfig", f"{ROOT}/files/kc-empty", "--name", "x", *REPORTS],
     ["--name: x", "not used by --backend existing"]),
    ("kubeconfig-missing", [*EXISTING, "--kubeconfig", f"{ROOT}/files/nope", *REPORTS],
     ["--kubeconfig", "files/nope", "does not exist"]),
    ("kubeconfig-directory", [*EXISTING, "--kubeconfig", f"{ROOT}/files", *REPORTS],
     ["--kubeconfig", "not a regular file"]),
    ("kubeconfig-empty", [*EXISTING, "--kubeconfig", f"{ROOT}/files/kc-empty", *REPORTS],
     ["--kubeconfig", "kc-empty", "empty", "current-context"]),
    ("kubeconfig-garbage", [*EXISTING, "--kubeconfig", f"{ROOT}/files/kc-garbage", *REPORTS],
     ["--kubeconfig", "kc-garbage", "not YAML"]),
    ("kubeconfig-bad-yaml", [*EXISTING, "--kubeconfig", f"{ROOT}/files/kc-bad-yaml", *REPORTS],
     ["kc-bad-yaml", "not YAML"]),
    ("kubeconfig-list", [*EXISTING, "--kubeconfig", f"{ROOT}/files/kc-list", *REPORTS],
     ["kc-list", "not a mapping but list"]),
    ("kubeconfig-no-context", [*EXISTING, "--kubeconfig", f"{ROOT}/files/kc-no-context", *REPORTS],
     ["kc-no-context", "current-context: missing"]),
    ("kubeconfig-dangling-context", [*EXISTING, "--kubeconfig", f"{ROOT}/files/kc-dangling-context", *REPORTS],
     ["kc-dangling-context", "no context named 'nope'"]),
    ("kubeconfig-no-server", [*EXISTING, "--kubeconfig", f"{ROOT}/files/kc-no-server", *REPORTS],
     ["kc-no-server", "clusters[k].cluster.server", "not a URL"]),
    ("kubeconfig-unreachable", [*EXISTING, "--kubeconfig", f"{ROOT}/files/kc-unreachable", *REPORTS],
     ["kc-unreachable", "cannot reach the API server https://127.0.0.1:", "a running cluster"]),
    ("fault-kubeconfig-empty", ["fault", "inject", "--kubeconfig", f"{ROOT}/files/kc-empty", "--node", "n",
                                "--device", "gpu-0", "--kind", "lost"], ["--kubeconfig", "kc-empty", "empty"]),
    ("fault-kubeconfig-garbage", ["fault", "list", "--kubeconfig", f"{ROOT}/files/kc-garbage"],
     ["--kubeconfig", "kc-garbage", "not YAML"]),
    ("fault-kubeconfig-unreachable", ["fault", "clear", "--kubeconfig", f"{ROOT}/files/kc-unreachable", "--node",
                                      "n", "--device", "gpu-0"], ["kc-unreachable", "cannot reach the API server"]),
    ("fault-bad-kind-first", ["fault", "inject", "--kubeconfig", f"{ROOT}/files/kc-unreachable", "--node", "n",
                              "--device", "gpu-0", "--kind", "melted"],
     ["--kind: melted", "unknown fault kind", "unhealthy"]),
    ("fault-bad-names-first", ["fault", "inject", "--kubeconfig", f"{ROOT}/files/kc-unreachable", "--node", "a/b",
                               "--device", "GPU_0", "--kind", "lost"],
     ["--node: a/b", "not a valid name", "DNS subdomain", "--device: GPU_0", "DNS label"]),
    ("existing-real-nodes", [*EXISTING, "--kubeconfig", f"{ROOT}/files/kc-unreachable", "--real-nodes", "1", *REPORTS],
     ["--real-nodes: 1", "not used by --backend existing"]),
    # item 6: report directories
    ("report-dir-is-file", ["conformance", "run", "--report-dir", f"{ROOT}/files/a-file"],
     ["--report-dir", "a-file", "is a file", "a directory"]),
    ("report-dir-under-file", ["run", "--report-dir", f"{ROOT}/files/a-file/reports"],
     ["--report-dir", "a-file is a file, not a directory"]),
    ("load-report-dir-is-file", ["load", "run", "--scenario", "device-freed", "--report-dir", f"{ROOT}/files/a-file"],
     ["--report-dir", "is a file"]),
    # items 6, 7 and 9: load parameters
    ("load-users-zero", [*LOAD, "--users", "0"], ["--users: 0", "out of range", "1 to 1000"]),
    ("load-workers-negative", [*LOAD, "--workers", "-1"], ["--workers: -1", "out of range", "0 (locust in one process)"]),
    ("load-time-limit-nan", [*LOAD, "--time-limit", "nan"], ["--time-limit: nan", "1 to 86400"]),
    ("load-time-limit-inf", [*LOAD, "--time-limit", "inf"], ["--time-limit: inf", "1 to 86400"]),
    ("load-time-limit-negative", [*LOAD, "--time-limit", "-5"], ["--time-limit: -5", "1 to 86400"]),
    ("load-nodes-huge", [*LOAD, "--nodes", "100000"], ["--nodes: 100000", "out of range", "1 to 10000"]),
    ("load-nodes-too-many-to-fill", [*LOAD, "--nodes", "3000", "--time-limit", "60"],
     ["--nodes: 3000", "fills every device", "at most 1500 nodes"]),
    # issue 12: every job chooses its backend through the registry; given clusters are checked first
    ("run-unknown-backend", ["run", "--backend", "nope", *REPORTS], ["--backend: nope", "unknown backend",
                                                                    "local, kind, existing"]),
    ("run-existing-without-kubeconfig", ["run", "--backend", "existing", *REPORTS], ["--kubeconfig: (not set)"]),
    ("run-existing-missing-kubeconfig", ["run", "--backend", "existing", "--kubeconfig", f"{ROOT}/files/nope",
                                         *REPORTS], ["--kubeconfig", "files/nope", "does not exist"]),
    ("run-existing-unreachable", ["run", "--backend", "existing", "--kubeconfig", f"{ROOT}/files/kc-unreachable",
                                  *REPORTS], ["kc-unreachable", "cannot reach the API server"]),
    ("run-kind-real-nodes", ["run", "--backend", "kind", "--real-nodes", "1", *REPORTS],
     ["--real-nodes: 1", "not used by --backend kind", "--backend local"]),
    ("load-unknown-backend", [*LOAD, "--backend", "nope"], ["--backend: nope", "unknown backend"]),
    ("load-existing-without-kubeconfig", [*LOAD, "--backend", "existing"], ["--kubeconfig: (not set)"]),
    ("load-existing-missing-kubeconfig", [*LOAD, "--backend", "existing", "--kubeconfig", f"{ROOT}/files/nope"],
     ["--kubeconfig", "files/nope", "does not exist"]),
    ("load-existing-unreachable", [*LOAD, "--backend", "existing", "--kubeconfig", f"{ROOT}/files/kc-unreachable"],
     ["kc-unreachable", "cannot reach the API server"]),
    ("load-kind", [*LOAD, "--backend", "kind"], ["--backend: kind", "names its nodes itself", "local, existing"]),
    # a given cluster keeps its own feature gates and is never stopped: judged before the kubeconfig is read
    ("load-existing-hints", [*LOAD, "--backend", "existing", "--kubeconfig", f"{ROOT}/files/nope", "--hints", "off"],
     ["--hints: off", "feature gates", "leave --hints out, or use --backend local"]),
    ("load-existing-keep", [*LOAD, "--backend", "existing", "--keep-cluster"],
     ["--keep-cluster", "always removes the run's own objects"]),
    ("sweep-time-limit-nan", ["load", "sweep", "--scenario", "device-freed", "--time-limit", "nan", *REPORTS],
     ["--time-limit: nan", "1 to 86400"]),
    ("too-many-nodes", ["cluster", "up", "--nodes", "10001"], ["--nodes: 10001", "out of range", "0 to 10000"]),
    ("version-traversal-validate", ["cluster", "validate", "mixed", "--kubernetes-version", TRAVERSAL],
     ["--kubernetes-version", "not a version"]),
    ("version-traversal-up-config", ["cluster", "up", "--config", "mixed", "--kubernetes-version", TRAVERSAL],
     ["--kubernetes-version", "not a version"]),
]

# (id, arguments, text in stderr); exit 1: not bad input but a missing cluster or a broken environment.
FAILURES = [
    ("status-missing", ["cluster", "status", "--name", "nosuch"], ["no cluster named 'nosuch'", "cluster list"]),
    ("binaries-path-empty", ["binaries", "path"], ["not installed", "binaries install"]),
]
OK_INPUT = [("list-empty", ["cluster", "list"])]


def _prepare(root: Path) -> None:
    files = root / "files"
    files.mkdir(parents=True)
    for name, content in FILES.items():
        (files / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    (files / "kc-unreachable").write_text(_kubeconfig(f"https://127.0.0.1:{_closed_port()}"))


def _environment(root: Path, env: dict | None) -> dict[str, str]:
    environment = dict(os.environ)
    environment.pop("KUBECONFIG", None)
    environment.update({paths.STATE_ENV: str(root / "state"), paths.CACHE_ENV: str(root / "cache"),
                        "PYTHONPATH": str(REPO), "NO_COLOR": "1", **(env or {})})
    return environment


def run_cli(args: list[str], root: Path, env: dict | None = None) -> Result:
    """`harness.cli.main.run(ARGS)` in this process, with state and cache under `root` and `{root}` in ARGS
    replaced; what it prints is captured, and an exception that escapes is recorded as a traceback."""
    from harness.cli import main as cli

    args = [a.replace(ROOT, str(root)) for a in args]
    saved = dict(os.environ)
    out, err = io.StringIO(), io.StringIO()
    started = time.monotonic()
    os.environ.clear()
    os.environ.update(_environment(root, env))
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.run(args, out=out)
    except SystemExit as exit_:  # argparse
        code = exit_.code if isinstance(exit_.code, int) else 1
    except BaseException:  # noqa: BLE001 - the very thing these tests look for
        err.write(traceback.format_exc())
        code = -1
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return Result(tuple(args), code, out.getvalue(), err.getvalue(), root, time.monotonic() - started)


def run_cli_process(args: list[str], root: Path, env: dict | None = None, timeout: float = 300) -> Result:
    """`python -m harness.cli ARGS` as a user runs it (exit status, output streams)."""
    args = [a.replace(ROOT, str(root)) for a in args]
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "harness.cli", *args], cwd=REPO, env=_environment(root, env),
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    return Result(tuple(args), proc.returncode, proc.stdout, proc.stderr, root, time.monotonic() - started)


def assert_refused_cleanly(result: Result, code: int, located: list[str]) -> None:
    assert result.code == code, result
    assert "error:" in result.stderr, result
    for text in located:
        assert text in result.stderr, f"{text!r} missing\n{result}"
    assert "Traceback" not in result.stdout + result.stderr, result
    assert result.stdout == "", result  # errors go to stderr only
    # Rejected before any slow work: nothing was built, downloaded, started or written.
    assert not (result.cache_dir / "binaries").exists(), result
    assert not (result.cache_dir / "build").exists(), result
    clusters = result.state_dir / "clusters"
    assert not clusters.exists() or not any(clusters.iterdir()), result
    assert not (result.root / "reports").exists(), result
    assert not list(result.root.parent.glob("**/escaped")), result  # no version escaped the cache


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, Result]:
    cases = [(case_id, args) for case_id, args, _ in BAD_INPUT + FAILURES] + OK_INPUT
    found = {}
    for case_id, args in cases:  # in this process, one after the other (they share os.environ)
        root = tmp_path_factory.mktemp(case_id) / "case"
        _prepare(root)
        found[case_id] = run_cli(args, root)
    return found


# Through the real entry point, as a user runs it: one case of each kind of input.
END_TO_END = ["version-traversal-install", "kubeconfig-garbage", "vendor-bad-driver-first", "load-time-limit-nan",
              "report-dir-is-file", "unknown-gate-cold-cache", "status-missing"]


@pytest.mark.parametrize("case_id", END_TO_END)
def test_real_entry_point_refuses_the_same_way(tmp_path_factory, case_id):
    args, located = next((a, loc) for c, a, loc in BAD_INPUT + FAILURES if c == case_id)
    root = tmp_path_factory.mktemp(case_id) / "case"
    _prepare(root)
    assert_refused_cleanly(run_cli_process(args, root), 1 if case_id == "status-missing" else 2, located)


@pytest.mark.parametrize("case_id, args, located", BAD_INPUT, ids=[c[0] for c in BAD_INPUT])
def test_bad_input_is_refused_with_status_2(results, case_id, args, located):
    assert_refused_cleanly(results[case_id], 2, located)


@pytest.mark.parametrize("case_id, args, located", FAILURES, ids=[c[0] for c in FAILURES])
def test_environment_failures_exit_1_without_traceback(results, case_id, args, located):
    assert_refused_cleanly(results[case_id], 1, located)


def test_vendor_file_is_judged_before_the_kubeconfig(results):
    # item 8: a broken vendor file is reported as such, never as a missing kubeconfig
    for case_id in ("vendor-bad-driver-first", "vendor-wrong-kind-first", "vendor-empty-first", "vendor-missing-first"):
        assert "kubeconfig" not in results[case_id].stderr, results[case_id]


def test_cluster_list_empty(results):
    result = results["list-empty"]
    assert result.code == 0, result
    assert "Traceback" not in result.stdout + result.stderr, result
    assert "error" not in result.stderr, result
    assert "name" in result.stdout  # the (empty) table's header
    assert not (result.cache_dir / "binaries").exists(), result


# --- a binary cache or report directory that cannot be written (needs root for the mounts) ----------

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a read-only or tiny tmpfs needs root")


@pytest.fixture
def mounted(tmp_path):
    """mount(name, options) -> a tmpfs at tmp_path/name (read-only or tiny); unmounted afterwards."""
    mounts = []

    def mount(name: str, options: str) -> Path:
        target = tmp_path / name
        target.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(target)], check=True)
        mounts.append(target)
        return target

    yield mount
    for target in reversed(mounts):
        subprocess.run(["umount", str(target)], check=False)


def test_binary_cache_that_is_a_file(tmp_path):
    _prepare(tmp_path)
    for args in (["binaries", "install"], ["cluster", "up", "--name", "cache-file"]):
        result = run_cli(args, tmp_path, env={paths.CACHE_ENV: str(tmp_path / "files" / "a-file")})
        assert result.code == 1, result
        assert "binary cache" in result.stderr and "a-file" in result.stderr, result
        assert "Not a directory" in result.stderr or "File exists" in result.stderr, result
        assert paths.CACHE_ENV in result.stderr, result  # says what to change
        assert "Traceback" not in result.stderr, result
        assert not (tmp_path / "state" / "clusters" / "cache-file").exists(), result


@needs_root
@pytest.mark.parametrize("options, located", [("ro,size=1m", "Read-only file system"),
                                              ("size=1m", "MiB free, kubernetes v1.37.2 needs about 1024 MiB")],
                         ids=["read-only", "full"])
def test_binary_cache_read_only_or_full(tmp_path, mounted, options, located):
    _prepare(tmp_path)
    cache = mounted("cache", options)
    for args in (["binaries", "install"], ["cluster", "up", "--name", "cache-bad"]):
        result = run_cli(args, tmp_path, env={paths.CACHE_ENV: str(cache)})
        assert result.code == 1, result
        assert f"binary cache {cache}" in result.stderr and located in result.stderr, result
        assert "Traceback" not in result.stderr, result
        assert not (tmp_path / "state" / "clusters" / "cache-bad").exists(), result
    assert not (cache / "build").exists()  # refused before a build started


@needs_root
def test_report_dir_on_a_read_only_mount(tmp_path, mounted):
    _prepare(tmp_path)
    readonly = mounted("ro", "ro,size=1m")
    for args in (["conformance", "run", "--report-dir", str(readonly / "reports")],
                 ["conformance", "run", "--report-dir", str(readonly)],
                 ["load", "run", "--scenario", "device-freed", "--report-dir", str(readonly / "load")]):
        result = run_cli(args, tmp_path)
        assert result.code == 2, result
        assert "--report-dir" in result.stderr and "Read-only file system" in result.stderr, result
        assert "Traceback" not in result.stderr, result
        assert not (tmp_path / "cache" / "binaries").exists(), result
        assert not (tmp_path / "state" / "clusters").exists() or not any((tmp_path / "state" / "clusters").iterdir())
