"""`dra-harness conformance run` and the main job `dra-harness run`: get a cluster, run the
conformance suite against it in pytest, write the reports, and stop the cluster if we started it.

The backend is chosen by name through the registry (harness.backends): one that attaches to a cluster
you give (`existing`, with --kubeconfig) makes nothing; any other starts a cluster from one
ClusterSpec and stops it at the end. Either way the suite gets the cluster as data: the typed
cluster record (harness.core.records) is written to `<report-dir>/cluster.json` and pytest is pointed at
it (`--dra-cluster-record`), so the report shows exactly what `pytest conformance/` checks there.

Order matters: every input (flags, cluster definition, vendor file, kubeconfig, report directory) is
checked by `plan()` before anything is created or started, so bad input costs nothing. Once tests
run, an interruption (Ctrl-C, SIGTERM) stops pytest gracefully, and the report of the tests that
finished is still written, marked as interrupted, before the cluster is torn down.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from harness import backends
from harness.backends.base import Backend, ClusterSpec
from harness.binaries import Versions
from harness.config import cluster as cluster_config
from harness.config.cluster import ClusterDefinition
from harness.core import proctime
from harness.core.errors import ConfigError, HarnessError, Problem
from harness.core.progress import Reporter
from harness.core.records import ClusterInfo, write_cluster
from harness.jobs import report
from harness.k8s.client import Clients, check_reachable, read_kubeconfig
from harness.k8s.discovery import discover
from harness.vendor import cluster_check, plugins, setup
from harness.vendor import file as vendor
from harness.vendor.file import VendorDriver

CONFORMANCE_DIR = Path(__file__).resolve().parents[2] / "conformance"
MAX_WORKERS = 64
CLUSTER_RECORD = "cluster.json"  # in the report directory: the cluster the suite ran against
# How long pytest gets, after it is told to stop, to tear its tests down and write its results.
PYTEST_STOP_GRACE = 120.0


@dataclass
class ConformanceOptions:
    backend: str = "local"
    kubeconfig: str | None = None
    name: str | None = None
    nodes: int = 3
    preset: str | None = None
    feature_gates: str = ""
    definition: str | None = None
    driver_config: str | None = None
    maturity: str = "alpha"
    features: str = ""
    report_dir: Path = Path("reports")
    workers: int = 6  # the CLI's DEFAULT_WORKERS
    keep_cluster: bool = False
    binaries_dir: Path | None = None
    versions: Versions | None = None
    real_nodes: str = "auto"  # local: nodes run by a real kubelet ("auto": one where the machine allows it)
    pytest_args: list[str] = field(default_factory=list)


@dataclass
class Plan:
    """Checked inputs: what `run` needs, decided before anything exists."""

    options: ConformanceOptions
    kubeconfig: str | None = None  # a backend that attaches (existing): the cluster's checked kubeconfig
    definition: ClusterDefinition | None = None  # a backend that starts the cluster: its definition
    spec: ClusterSpec | None = None  # ... and the request it gets (checked by the backend)
    real_nodes: int = 0
    no_real_node_reason: str = ""
    vendor_file: VendorDriver | None = None  # vendor mode: the checked VendorDriver file
    # the backend's own deployed fake driver, tested the way a vendor's driver is (Backend.suite_driver_config)
    deployed_driver: bool = False


def plan(options: ConformanceOptions) -> Plan:
    """Check every input; ConfigError (exit status 2) on the first kind of problem, nothing created."""
    problems: list[Problem] = []
    if not 0 <= options.workers <= MAX_WORKERS:
        problems.append(Problem("-n/--workers", str(options.workers), "out of range",
                                f"0 to {MAX_WORKERS} pytest-xdist workers; 0 or 1 runs the tests in one process"))
    backend = backends.backend_class(options.backend)  # ConfigError naming --backend if unknown
    attaches = _attaches(backend)
    given = {"--config": options.definition, "--preset": options.preset,
             "--feature-gates": options.feature_gates or None, "--name": options.name,
             "--real-nodes": None if options.real_nodes == "auto" else options.real_nodes,
             "--binaries-dir": options.binaries_dir}
    problems += backends.unused_flags(options.backend, given, uses=_uses)
    if options.driver_config and not attaches:
        problems.append(Problem("--driver-config", options.driver_config,
                                f"vendor mode tests your own driver on your own cluster; the {options.backend} "
                                "backend runs only the dra-harness fake driver", "--backend existing --kubeconfig K"))
    problems += report.dir_problems(options.report_dir)
    if problems:
        raise ConfigError(problems)

    result = Plan(options)
    if options.driver_config:  # the vendor file's own checks come before anything about the cluster

        result.vendor_file = vendor.load(options.driver_config)
    if attaches:
        kubeconfig = options.kubeconfig or os.environ.get("KUBECONFIG")
        if not kubeconfig:
            raise ConfigError([Problem("--kubeconfig", "(not set)", "--backend existing needs the cluster's "
                                       "kubeconfig", "--kubeconfig FILE or the KUBECONFIG variable")])
        where = "--kubeconfig" if options.kubeconfig else "$KUBECONFIG"
        read_kubeconfig(kubeconfig, where)
        result.kubeconfig = str(Path(kubeconfig).expanduser())
        _require_reachable(result.kubeconfig, f"{where} {kubeconfig}")
        if result.vendor_file is not None:  # its classes, extended resources and image, in the cluster
            cluster_check.check(result.vendor_file, result.kubeconfig)
            if result.vendor_file.kubelet_plugin is not None:  # a real node of a local cluster to start it on
                plugins.real_nodes(result.kubeconfig, result.vendor_file.source)
        return result

    versions = options.versions or Versions()
    # the checks of `cluster validate`, before anything is built or started
    chosen = options.definition or backend.suite_definition  # kind: its own default definition
    result.definition = cluster_config.validate(chosen, versions.kubernetes) if chosen else None
    result.real_nodes, result.no_real_node_reason = backend(None).resolve_real_nodes(options.real_nodes)
    # the one request `run` makes of the backend, checked by the backend itself before the report
    # directory is made (its gates again against the binaries, once they are there, in `up`)
    result.spec = ClusterSpec(name=options.name or f"conformance-{time.strftime('%H%M%S')}-{os.getpid() % 1000}",
                              nodes=options.nodes, preset=options.preset, feature_gates=options.feature_gates,
                              definition=result.definition, real_nodes=result.real_nodes, versions=versions,
                              binaries_dir=options.binaries_dir,
                              owner=None if options.keep_cluster else proctime.identity())
    backend(None).check(result.spec)
    return result


def _attaches(backend: type[Backend]) -> bool:
    """A backend that works on a cluster you give it; the others start one (Backend.attaches)."""
    return backend.attaches


def _uses(backend: type[Backend], flag: str) -> bool:
    # a cluster definition and a name are for backends that start the cluster
    return not _attaches(backend) if flag in ("--config", "--name") else flag in backend.spec_flags


def _open_report_dir(report_dir: Path) -> None:
    report.open_dir(report_dir, "--report-dir")
    for stale in ("results.json", "junit.xml", CLUSTER_RECORD):
        (report_dir / stale).unlink(missing_ok=True)


def run(options: ConformanceOptions, reporter: Reporter, out) -> int:
    checked = plan(options)
    report_dir = options.report_dir
    _open_report_dir(report_dir)
    backend, cluster_name, facts, code = None, None, {}, None
    started = time.monotonic()
    interrupted: KeyboardInterrupt | None = None
    summary = None
    vendor_setup = None
    try:
        try:
            backend, cluster_name, info = _cluster(checked, reporter)
            record = write_cluster(info, report_dir / CLUSTER_RECORD)
            facts = _facts(str(info.kubeconfig))
            driver_config = backend.suite_driver_config(cluster_name) if backend and cluster_name else None
            checked_already = checked.vendor_file is not None  # by plan(), before anything was made
            if driver_config is not None:  # the deployed fake driver, tested the way a vendor's driver is
                checked.vendor_file = vendor.load(str(driver_config))  # the same checks as a vendor's file
                reporter.info(f"the deployed fake driver as the suite's driver under test: {driver_config}")
                options.driver_config = checked.vendor_file.source
                checked.deployed_driver = True
            suite_args: list[str] = []
            if checked.vendor_file is not None:
                # checked against the cluster, and spec.manifests and spec.kubeletPlugin set up, here: the
                # suite does neither again, and all is taken down below however it ends (pytest killed after
                # its grace period included)
                vendor_setup = setup.set_up(checked.vendor_file, info.kubeconfig, reporter, checked=checked_already)
                suite_args = vendor_setup.suite_arguments()
            code = _run_pytest(_pytest_command(options, record, suite_args), reporter)
        except KeyboardInterrupt as err:
            interrupted = err
        finally:
            try:
                if vendor_setup is not None and vendor_setup.holds_anything:
                    with reporter.step("stopping the vendor's kubelet plugin, deleting spec.manifests objects"):
                        left = vendor_setup.close()
                    if left:
                        reporter.info(f"vendor clean-up left: {', '.join(left)}")
            finally:
                if code is not None or interrupted:  # the suite ran, or was stopped: report what finished
                    summary = _write_report(checked, facts, started, interrupted)
    finally:
        if backend is not None and cluster_name is not None and not options.keep_cluster:
            with reporter.step(f"stopping cluster {cluster_name!r}"):
                leftovers = backend.down(cluster_name)
            if leftovers:
                reporter.info(f"clean-up left: {', '.join(leftovers)}")
    assert summary is not None  # written whenever the suite ran or was stopped; any other way out raised
    state = " (interrupted)" if interrupted else ""
    counted = ", ".join(f"{summary[o]} {o}" for o in ("passed", "failed", "skipped", "not applicable", "xfailed")
                        if summary[o] or o in ("passed", "failed", "skipped"))
    print(f"report{state}: {summary['markdown']} and {summary['html']} ({counted})", file=out)
    if interrupted:
        raise interrupted
    if code == 5:
        raise HarnessError("no conformance test matched the selection", hint="check --maturity and --features")
    return 0 if code == 0 else 1


def _require_reachable(kubeconfig: str, where: str) -> None:
    clients = Clients(Path(kubeconfig))
    try:
        check_reachable(clients, where)
    finally:
        clients.close()


def _facts(kubeconfig: str) -> dict:
    clients = Clients(Path(kubeconfig))
    try:
        return discover(clients).to_dict()
    finally:
        clients.close()


def _pytest_command(options: ConformanceOptions, cluster_record: Path, extra: list[str] | None = None) -> list[str]:
    report_dir = options.report_dir
    # no:hypothesispytest: the dev extra's fuzzing library, for the harness's own tests, costs each worker 1 s
    command = [sys.executable, "-m", "pytest", str(CONFORMANCE_DIR), "-p", "no:cacheprovider", "-p", "no:hypothesispytest",
               f"--dra-cluster-record={cluster_record}", f"--junitxml={report_dir / 'junit.xml'}",
               f"--dra-report-dir={report_dir}", f"--dra-maturity={options.maturity}", "-o", "junit_family=xunit2"]
    if options.features:
        command.append(f"--dra-features={options.features}")
    if options.driver_config:
        command.append(f"--dra-driver-config={options.driver_config}")
    if options.workers > 1:
        # Tests handed out one at a time, in the suite's order (plugin.suite_order): a worker never
        # holds a queue of long tests while another is idle (measured in BENCHMARKS.md, "Suite time").
        command += ["-n", str(options.workers), "--dist", "load", "--maxschedchunk", "1"]
    return command + (extra or []) + options.pytest_args


def _run_pytest(command: list[str], reporter: Reporter) -> int:
    """Run the suite; on an interruption, let pytest finish its teardown and write its results first.

    pytest runs in its own session, so a terminal's Ctrl-C reaches only us and pytest is told exactly
    once (SIGINT: it stops the running test, tears down and writes results.json and JUnit)."""
    reporter.info("running the conformance suite: pytest " + " ".join(command[3:]))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(command, env=env, start_new_session=True)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        reporter.info(f"interrupted: stopping pytest; it tears its tests down and writes their results (up to "
                      f"{PYTEST_STOP_GRACE:.0f}s; interrupt again to stop it now)")
        _stop(proc)
        raise


def _stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C would: pytest and its xdist workers
        proc.wait(timeout=PYTEST_STOP_GRACE)
    except (KeyboardInterrupt, subprocess.TimeoutExpired):
        os.killpg(proc.pid, signal.SIGKILL)  # its own session: the xdist workers go too
        proc.wait()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _write_report(checked: Plan, facts: dict, started: float,
                  interrupted: KeyboardInterrupt | None) -> dict:
    options = checked.options
    results = report.load_results(options.report_dir)
    reason = None
    if interrupted is not None:
        signum = interrupted.args[0] if interrupted.args and isinstance(interrupted.args[0], int) else signal.SIGINT
        reason = f"stopped by {signal.Signals(signum).name} after {len(results)} finished tests"
    return report.write(options.report_dir, results, cluster=facts, interrupted=reason, run={
        "backend": options.backend, "preset": options.preset or ("definition " + options.definition
                                                                  if options.definition else "all-dra"),
        "driver": (f"the dra-harness fake driver deployed on {options.backend} (vendor mode: {options.driver_config})"
                   if checked.deployed_driver else options.driver_config or "the dra-harness fake driver"),
        "maturity": options.maturity,
        "drivers": list(checked.vendor_file.drivers) if checked.vendor_file else [],
        "features": options.features or "all", "wallSeconds": round(time.monotonic() - started, 1)})


def _cluster(checked: Plan, reporter: Reporter) -> tuple[Backend | None, str | None, ClusterInfo]:
    """(backend that started the cluster, or None when it was given; its name; its record)."""
    options = checked.options
    if checked.kubeconfig is not None:  # given (plan checked it is there and reachable): attach only
        return None, None, backends.attach(checked.kubeconfig)

    assert checked.spec is not None  # plan() made the request of every backend that starts a cluster
    name = checked.spec.name
    if checked.no_real_node_reason and options.real_nodes == "auto":
        reporter.info(f"no real node, the kubelet checks will skip: {checked.no_real_node_reason}")
    backend = backends.get(options.backend, reporter)
    info = backend.up(checked.spec)
    reporter.info(f"cluster {name!r} is up: {info.server}")
    return backend, name, replace(info, real_nodes_reason=checked.no_real_node_reason)
