"""Upstream's scheduler benchmark, scheduler_perf of k8s.io/kubernetes, as an anchor for our numbers:
build its DRA test binaries from the Go module proxy into the cache, run one workload, read its figures.

scheduler_perf runs an in-process apiserver and scheduler against an etcd it starts itself; its DRA
workloads are `test/integration/scheduler_perf/dra/**/performance-config.yaml`. The test binaries are
built with the same wrapper module as the cluster binaries (harness/binaries/gobuild.py) and cached
under `<cache>/scheduler-perf-v<version>_<os>-<arch>/`, one per test package, next to a record of
their SHA-256 (a binary that does not match is rebuilt, never trusted).

A run is bounded (`timeout`), starts its etcd on a unix socket inside a temporary directory of ours
(never a TCP port: scheduler_perf would otherwise reuse any etcd listening on 127.0.0.1:2379, such as
another cluster's), and the whole process group is killed and the directory removed afterwards, on
success, failure, timeout or Ctrl-C.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from harness import binaries
from harness.binaries import gobuild
from harness.core import conditions, paths
from harness.core.errors import BinariesError, HarnessError, Problem
from harness.core.progress import Reporter

PERF_PACKAGE = "k8s.io/kubernetes/test/integration/scheduler_perf"
# Test package (relative to scheduler_perf) -> name of its cached test binary.
PACKAGES = {"dra": "dra.test", "dra/extendedresource": "extendedresource.test"}


@dataclass(frozen=True)
class Workload:
    """One upstream workload and the scenario of ours that matches it (None: no automatic A/B yet)."""

    name: str  # <test case>/<workload>, as in performance-config.yaml
    package: str  # key of PACKAGES
    measured_pods: int | None  # pods in upstream's measured phase (None: steady state, time-bound: read from its log)
    ours: dict | None  # keyword arguments of load.scenarios.LoadParams


def _throughput(nodes: int, pods: int, scenario: str = "throughput") -> dict:
    # upstream: nodes x 10 devices, half the pods' claims allocated first, the other half measured;
    # ours: the same split (P/2 scheduled first, P/2 measured), 10 devices per node.
    return {"scenario": scenario, "nodes": nodes, "pending": pods, "events": 1, "devices_per_node": 10, "users": 64}


def _steady_state(held: int) -> dict:
    # upstream: `held` claims allocated first, then a closed loop of 10 pods (measurePods) for 10 s, each
    # deleted and replaced once scheduled; ours: the same loop (--in-flight 10 --duration 10), --events
    # only a bound on the arrivals
    return {"scenario": "steady-state", "nodes": 500, "pending": held, "events": 5000, "devices_per_node": 10,
            "in_flight": 10, "duration": 10.0}


WORKLOADS = {w.name: w for w in (
    Workload("SchedulingWithResourceClaimTemplate/fast", "dra", 10, _throughput(2, 20)),
    Workload("SchedulingWithResourceClaimTemplate/2000pods_200nodes", "dra", 1000, _throughput(200, 2000)),
    Workload("SchedulingWithResourceClaimTemplate/5000pods_500nodes", "dra", 2500, _throughput(500, 5000)),
    # steady state: upstream keeps 10 pods pending for 10 s at 0 / 50 % / 99.8 % utilization
    Workload("SchedulingWithResourceClaimTemplate/empty_500nodes", "dra", None, _steady_state(0)),
    Workload("SchedulingWithResourceClaimTemplate/half_500nodes", "dra", None, _steady_state(2500)),
    Workload("SchedulingWithResourceClaimTemplate/full_500nodes", "dra", None, _steady_state(4990)),
    Workload("ExtendedResource/fast", "dra/extendedresource", 10, _throughput(2, 20, "extended-throughput")),
    Workload("ExtendedResource/Explicit_25classes_2000pods_200nodes", "dra/extendedresource", 1000,
             _throughput(200, 2000, "extended-throughput")),
    Workload("ExtendedResource/Explicit_25classes_5000pods_500nodes", "dra/extendedresource", 2500,
             _throughput(500, 5000, "extended-throughput")),
    Workload("ExtendedResource/Implicit_25classes_5000pods_500nodes", "dra/extendedresource", 2500,
             _throughput(500, 5000, "extended-throughput")),
    # slice publishing is compared with benchmarks/fake_devices_bench.py publish (not a load scenario)
    Workload("PublishResourceSlices/500nodes", "dra", None, None),
    Workload("PublishResourceSlices/5000nodes", "dra", None, None),
)}


def cache_dir(version: str = binaries.DEFAULT_KUBERNETES) -> Path:
    os_name, arch = binaries.host_platform()
    return paths.cache_root() / f"scheduler-perf-v{version}_{os_name}-{arch}"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def cached(version: str) -> dict[str, Path] | None:
    """The cached test binaries, if every one is there and matches its recorded SHA-256."""
    directory = cache_dir(version)
    try:
        record = json.loads((directory / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    found = {}
    for package, name in PACKAGES.items():
        path = directory / name
        if not path.is_file() or record.get(name) != sha256(path):
            return None
        found[package] = path
    return found


def ensure_built(version: str, reporter: Reporter) -> dict[str, Path]:
    """The test binaries of scheduler_perf's DRA packages, built once per version and cached."""
    found = cached(version)
    if found:
        return found
    gobuild.require_go()
    directory = cache_dir(version)
    work = paths.cache_root() / "build" / f"scheduler-perf-v{version}"
    work.mkdir(parents=True, exist_ok=True)
    directory.mkdir(parents=True, exist_ok=True)
    info = gobuild.download_module(f"k8s.io/kubernetes@v{version}", work)
    gomod_text = Path(info["GoMod"]).read_text()
    module = work / "module"
    module.mkdir(exist_ok=True)
    (module / "go.mod").write_text(gobuild.kubernetes_wrapper_gomod(version, gomod_text)
                                   .replace("kubernetes-build", "scheduler-perf-build"))
    (module / "go.sum").unlink(missing_ok=True)
    gobuild._write_tools_file(module, [PERF_PACKAGE])
    gobuild._go(["mod", "tidy"], module, work, "resolving modules")
    # `go test -c` prints nothing while it compiles ~2300 packages: compile the test packages'
    # imports first with `go build -v` (a progress bar per package), then link the test binaries.
    packages = [f"{PERF_PACKAGE}/{p}" for p in PACKAGES]
    imports = _test_imports(packages, module, work)
    gobuild.run_go_build(imports, [], module, work, reporter, f"compiling scheduler_perf v{version} dependencies")
    record = {}
    for package, name in PACKAGES.items():
        target = directory / name
        with reporter.step(f"linking the {package} test binary"):
            gobuild._go(["test", "-c", "-vet=off", "-trimpath", "-o", str(target) + ".tmp", f"{PERF_PACKAGE}/{package}"],
                        module, work, f"building the scheduler_perf {package} test binary")
            os.replace(str(target) + ".tmp", target)
        record[name] = sha256(target)
    (directory / "manifest.json").write_text(json.dumps(record, indent=2))
    return {package: directory / name for package, name in PACKAGES.items()}


def _test_imports(packages: list[str], module: Path, work: Path) -> list[str]:
    out = gobuild._go(["list", "-f", '{{join .Imports "\\n"}}\n{{join .TestImports "\\n"}}\n{{join .XTestImports "\\n"}}',
                       *packages], module, work, "listing the test packages' imports")
    return sorted({line.strip() for line in out.splitlines() if "." in line.split("/")[0]})


def module_cache() -> Path:
    return Path(os.environ.get("GOMODCACHE") or _go_env("GOMODCACHE") or Path.home() / "go" / "pkg" / "mod")


def package_dir(version: str, package: str) -> Path:
    """Where the workload's performance-config.yaml and templates are: the module cache (read only)."""
    return module_cache() / f"k8s.io/kubernetes@v{version}" / "test/integration/scheduler_perf" / package


def _go_env(name: str) -> str:
    try:
        return subprocess.run(["go", "env", name], capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def bench_regex(workload: str) -> str:
    """-test.bench for exactly one workload: each level of the name anchored (Go splits on /)."""
    case, name = workload.split("/", 1)
    return f"^BenchmarkPerfScheduling$/^{re.escape(case)}$/^{re.escape(name)}$"


# --- reading the results ----------------------------------------------------------------------

_BENCH_LINE = re.compile(r"^(BenchmarkPerfScheduling\S*)\s+(\d+)\s+(.*)$")


def parse_bench_output(text: str) -> dict[str, dict[str, float]]:
    """Go benchmark result lines -> {benchmark name (without the -GOMAXPROCS suffix): {unit: value}}.
    scheduler_perf reports each data item as `<value> <Metric>/<Perc50|Average|...>`."""
    results: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        match = _BENCH_LINE.match(line.strip())
        if not match:
            continue
        name = re.sub(r"-\d+$", "", match[1])
        fields = match[3].split()
        values: dict[str, float] = {}
        for value, unit in zip(fields[0::2], fields[1::2]):
            try:
                values[unit] = float(value)
            except ValueError:
                continue
        results[name] = values
    return results


def throughput_of(values: dict[str, float]) -> dict[str, float] | None:
    """SchedulingThroughput's Average and percentiles from one benchmark line's values."""
    found = {key.split("/", 1)[1]: value for key, value in values.items() if key.startswith("SchedulingThroughput/")}
    return found or None


# scheduler_perf's steady state logs how many pods it saw scheduled when its duration ran out
# (createPodsSteadily in executor.go): `Completed after seeing 412 scheduled pod: ...`
_STEADY_COMPLETED = re.compile(r"Completed after seeing (\d+) scheduled pod")


def steady_state_pods(text: str) -> int | None:
    """The pods a steady-state workload saw scheduled, from its log; None when it logged no count."""
    counts = [int(m[1]) for m in _STEADY_COMPLETED.finditer(text)]
    return counts[-1] if counts else None


def parse_data_items(text: str) -> list[dict]:
    """A scheduler_perf data-items file (BenchmarkPerfScheduling_benchmark_*.json): its dataItems."""
    data = json.loads(text)
    items = data.get("dataItems") if isinstance(data, dict) else None
    if not isinstance(items, list):
        raise ValueError("not a scheduler_perf data-items file (no dataItems list)")
    return items


# scheduler_perf's own check of a workload's `threshold` (tuned for upstream's CI machines), e.g.
# `expected "SchedulingThroughput" "Average" to be higher: got 33.395522, want 56.000000`.
_THRESHOLD_MISS = re.compile(r'expected "(?P<metric>[^"]+)" "(?P<statistic>[^"]+)" to be higher: '
                             r'got (?P<got>[\d.]+), want (?P<want>[\d.]+)')


def below_threshold(text: str) -> dict | None:
    """When a run's only errors are misses of upstream's throughput threshold: what it got and wanted
    (the measurement itself completed and is in the data-items file). None for any other failure."""
    misses = list(_THRESHOLD_MISS.finditer(text))
    if not misses or text.count("ERROR:") != len(misses):
        return None
    first = misses[0]
    return {"metric": first["metric"], "statistic": first["statistic"], "got": float(first["got"]),
            "want": float(first["want"])}


def values_from_data_items(out_dir: Path, workload: str) -> dict[str, float]:
    """A workload's SchedulingThroughput from the data-items files in `out_dir`, in the form of a
    benchmark line's values ({"SchedulingThroughput/Average": ...}); {} when there is none."""
    prefix = f"BenchmarkPerfScheduling/{workload}"
    for path in sorted(out_dir.glob("BenchmarkPerfScheduling_benchmark_*.json")):
        try:
            items = parse_data_items(path.read_text())
        except ValueError:
            continue
        for item in items:
            labels = item.get("labels") or {}
            if labels.get("Metric") == "SchedulingThroughput" and str(labels.get("Name", "")).startswith(prefix):
                return {f"SchedulingThroughput/{key}": float(value) for key, value in (item.get("data") or {}).items()
                        if isinstance(value, (int, float)) and not key.endswith("Threshold")}
    return {}


def ratio(ours: float | None, theirs: float | None) -> float | None:
    return round(ours / theirs, 2) if ours and theirs else None


# --- running a workload -----------------------------------------------------------------------

def check(workloads: list[str], timeout: float) -> list[Problem]:
    problems = [Problem("--workload", w, "unknown upstream workload", ", ".join(WORKLOADS))
                for w in workloads if w not in WORKLOADS]
    if not workloads:
        problems.append(Problem("--workload", "", "no workload given", ", ".join(WORKLOADS)))
    if not (timeout == timeout and 10 <= timeout <= 86400):
        problems.append(Problem("--timeout", str(timeout), "out of range", "10 to 86400 seconds"))
    return problems


def run(workload: str, binary: Path, out_dir: Path, *, version: str, etcd_dir: Path, timeout: float,
        reporter: Reporter) -> dict:
    """One upstream workload, bounded by `timeout`; its figures and the run's conditions."""
    spec = WORKLOADS[workload]
    # The test binary runs in its package's directory: a relative --report-dir would point elsewhere.
    out_dir = out_dir.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="dra-harness-scheduler-perf-"))
    env = dict(os.environ, PATH=f"{etcd_dir}{os.pathsep}{os.environ.get('PATH', '')}", TMPDIR=str(scratch),
               # not host:port, so scheduler_perf never dials someone else's etcd and starts its own
               # on a unix socket in TMPDIR
               KUBE_INTEGRATION_ETCD_URL=f"unix://{scratch}/none.sock",
               KUBE_CACHE_MUTATION_DETECTOR="false", ARTIFACTS=str(out_dir),
               # built with -trimpath (as our binaries): the apiserver's test server finds its package
               # directory from these two, as under bazel, instead of from its (trimmed) source path
               TEST_SRCDIR=str(module_cache()), TEST_WORKSPACE=".")
    command = [str(binary), "-test.run=^$", f"-test.bench={bench_regex(workload)}", "-test.benchtime=1x",
               f"-test.timeout={int(timeout)}s", "-perf-scheduling-label-filter=", f"-data-items-dir={out_dir}",
               "-with-data-items-unique-id=false"]
    log_path = out_dir / "scheduler_perf.log"
    started = time.monotonic()
    proc = None
    try:
        with open(log_path, "w") as log, reporter.step(f"upstream scheduler_perf {workload}"), \
                conditions.Measure() as measured:
            proc = subprocess.Popen(command, cwd=package_dir(version, spec.package), env=env, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            try:
                code = proc.wait(timeout=timeout + 60)  # the test's own -test.timeout fires first
            except subprocess.TimeoutExpired:
                raise HarnessError(f"scheduler_perf {workload} did not finish within {timeout + 60:.0f}s",
                                   log_file=log_path) from None
    finally:
        if proc is not None:
            _kill_group(proc)
        shutil.rmtree(scratch, ignore_errors=True)
    text = log_path.read_text(errors="replace")
    lines = parse_bench_output(text)
    name = next((n for n in lines if n.startswith(f"BenchmarkPerfScheduling/{workload}")), None)
    below = below_threshold(text) if code != 0 and name is None else None
    if below is not None:  # measured, only slower than upstream's CI machines: a figure, not a failure
        values = values_from_data_items(out_dir, workload)
        if values:
            name = f"BenchmarkPerfScheduling/{workload}"
            lines[name] = values
            code = 0
    if code != 0 or name is None:  # the conditions say whether a starved machine is the likely cause
        raise HarnessError(f"scheduler_perf {workload} failed (exit status {code}; "
                           f"{'no result line' if name is None else 'see the log'}; upstream "
                           f"{conditions.describe(measured.result) if measured.result else 'conditions unknown'})",
                           log_file=log_path, hint=_tail(text))
    values = lines[name]
    pods = spec.measured_pods if spec.measured_pods is not None else steady_state_pods(text)
    result = {"workload": workload, "benchmark": name, "pods": pods, "seconds": round(time.monotonic() - started, 1),
              "below_upstream_threshold": below,
              "scheduling_throughput": throughput_of(values), "runtime_seconds": values.get("runtime_seconds"),
              "values": values, "conditions": measured.result, "log": str(log_path)}
    cpu = (measured.result or {}).get("own_cpu_seconds")
    result["cpu_seconds"] = cpu
    return result


def _kill_group(proc: subprocess.Popen) -> None:
    """The test binary and the etcd it started (same process group), whatever state they are in."""
    try:
        os.killpg(proc.pid, signal.SIGTERM if proc.poll() is None else signal.SIGKILL)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # etcd, if it outlived the test binary
    except ProcessLookupError:
        pass


def _tail(text: str, lines: int = 15) -> str:
    return "last lines of the log:\n" + "\n".join(text.splitlines()[-lines:])


def etcd_directory(reporter: Reporter) -> Path:
    """Our verified etcd (scheduler_perf looks it up on PATH)."""
    try:
        binset = binaries.locate(binaries.Versions())
    except HarnessError as err:
        raise BinariesError("scheduler_perf needs etcd: our binaries are not installed",
                            hint="run `dra-harness binaries install` first") from err
    return binset.path("etcd").parent
