"""pytest plugin (entry point `pytest11`): options, markers and fixtures for DRA tests.

Only wiring lives here; the cluster lifecycle is in harness.pytest_plugin.session, API access in harness.k8s.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conformance import driver_checks
from fake_devices import config as driver_config
from fake_devices.controller import FakeDriver
from fake_devices.errors import InvalidInput
from fake_devices.variants import VARIANTS
from harness import backends
from harness.backends.base import Backend, ComponentWatchHandle
from harness.core import diskspace
from harness.core.errors import ComponentDied, HarnessError
from harness.core.records import MATURITY_ORDER, ClusterInfo, TestResult, read_cluster, write_results
from harness.k8s import wait
from harness.k8s.client import Clients
from harness.pytest_plugin import diagnostics
from harness.pytest_plugin import session as sessions
from harness.pytest_plugin.allocations import AllocatedDrivers
from harness.pytest_plugin.diagnostics import FAKE_DRIVERS
from harness.vendor import file as vendor
from harness.vendor import setup as vendor_setup
from harness.vendor.file import VendorDriver
from harness.vendor.plugins import load_plugins as load_vendor_plugins

RUN_ID_LABEL = "dra-harness.x-k8s.io/run-id"
_SHARED = pytest.StashKey[str]()
_RUN_ID = pytest.StashKey[str]()
_OPTIONS = pytest.StashKey[sessions.SessionOptions]()
_VENDOR: pytest.StashKey[VendorDriver] = pytest.StashKey()
_RESULTS = pytest.StashKey["ResultRecorder"]()
_VENDOR_SETUP: pytest.StashKey[Any] = pytest.StashKey()
_WATCH: pytest.StashKey[ComponentWatchHandle] = pytest.StashKey()
_RESTARTS_BEFORE: pytest.StashKey[dict[str, int]] = pytest.StashKey()
_BEGAN: pytest.StashKey[float] = pytest.StashKey()  # the test's setup, as time.time()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("dra-harness", "Kubernetes DRA test cluster")
    group.addoption("--dra-backend", choices=backends.BACKENDS,
                    default=os.environ.get("DRA_HARNESS_BACKEND", "local"),
                    help="local: start a real 1.37 control plane with KWOK nodes (default); kind: start a kind "
                         "cluster with the fake driver (needs Docker); existing: use the cluster of --kubeconfig")
    group.addoption("--kubeconfig", default=None, help="kubeconfig of an existing cluster (default: $KUBECONFIG)")
    group.addoption("--dra-cluster-record", default=None, metavar="CLUSTER_JSON",
                    help="the cluster record a dra-harness job wrote for the cluster it started (harness.core.records): "
                         "test that cluster; it is never stopped by this run")
    group.addoption("--dra-cluster-name", default=None,
                    help="local backend: use this cluster if it is running, else start it under this name")
    group.addoption("--dra-keep-cluster", action="store_true", help="do not stop a cluster this run started")
    group.addoption("--dra-nodes", type=int, default=3, help="KWOK nodes in a started cluster (default: 3)")
    group.addoption("--dra-preset", default=None, help="feature-gate preset for a started cluster")
    group.addoption("--dra-feature-gates", default="", help="feature-gate overrides for a started cluster")
    group.addoption("--dra-binaries-dir", default=None, help="pre-built Kubernetes/etcd/KWOK binaries")
    group.addoption("--dra-real-nodes", default=os.environ.get("DRA_HARNESS_REAL_NODES", "auto"),
                    help="local backend: nodes run by a real kubelet + containerd (needs root): auto (default: one "
                         "where this machine can host it, else none and kubelet tests skip with the reason), 0, 1")
    group.addoption("--dra-driver-config", default=None, metavar="VENDOR_YAML",
                    help="vendor mode: test this driver (kind VendorDriver) instead of the fake driver")
    group.addoption("--dra-maturity", choices=("ga", "beta", "alpha"), default="alpha",
                    help="run features up to this maturity: ga, ga+beta, or everything (default)")
    group.addoption("--dra-features", default="", help="comma-separated feature gates: run only their tests")
    group.addoption("--dra-report-dir", default=os.environ.get("DRA_HARNESS_REPORT_DIR"),
                    help="write failure diagnostics (objects, events, component logs) here")
    # What `dra-harness conformance run` set up from the vendor file before it started pytest (plain
    # pytest sets them up itself and leaves these unset)
    group.addoption(vendor_setup.SET_UP_OPTION, action="store_true",
                    help="the vendor file is checked against the cluster, its spec.manifests and spec.kubeletPlugin "
                         "are set up already")
    group.addoption(vendor_setup.PLUGINS_OPTION, default=None, metavar="RECORD_JSON",
                    help="the record of the vendor kubelet plugins the run started (restart/stop checks)")
    group.addoption("--dra-sanity-driver-config", default=None, metavar="VENDOR_YAML",
                    help="conformance/sanity: check the kubelet plugin this vendor file's spec.kubeletPlugin starts "
                         "against the written kubelet-plugin contract (`dra-harness sanity`; docs/contract.md)")
    group.addoption("--dra-fake-variant", default=None,
                    help="self-tests only: make the fake driver deliberately broken (fake_devices.variants)")


MARKERS = (
    "dra_feature(name, maturity='ga'|'beta'|'alpha', discovered=False, api_only=False): the DRA feature a test "
    "exercises; skipped when its gate is off in the cluster under test, and in vendor mode when the vendor file does "
    "not claim it (unless discovered=True: the test finds out itself whether the driver has it; or api_only=True: "
    "it checks the API server's rules with objects of its own, no driver's devices)",
    "requires_api(group_version, ...): skipped unless the cluster serves these API versions",
    "needs_kubelet: needs a node run by a real kubelet (skipped on simulated-only clusters)",
    "fake_devices(capability): needs a capability only the fake driver has (e.g. 'fault injection'); skipped in "
    "vendor mode naming it",
    "integration: needs a real Kubernetes control plane",
    "disrupts_node: restarts the kubelet of the `real_node` or reboots it; the fixture then waits for any other "
    "such test to end before the test takes its share of the node (realnode.sharing)",
    "long_wait(reason): the test waits out a fixed delay of Kubernetes (e.g. the kubelet's 30 s before it wipes a "
    "gone driver's slices); it starts before the other real-kubelet tests, so that a run does not end waiting for it",
)


def pytest_configure(config: pytest.Config) -> None:
    for marker in MARKERS:  # registered here so `pytest conformance/` works from any directory
        config.addinivalue_line("markers", marker)
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None:
        report_dir = config.getoption("--dra-report-dir")
        config.stash[_RESULTS] = ResultRecorder(Path(report_dir) / "results.json" if report_dir else None)
        config.pluginmanager.register(config.stash[_RESULTS], "dra-harness-results")
        config.stash[_SHARED] = str(sessions.new_shared_dir())
        # Always fresh: a pytest run started from inside another one's xdist worker inherits that run's
        # PYTEST_XDIST_* variables, and reusing its id would reuse its (still terminating) namespaces.
        config.stash[_RUN_ID] = sessions.new_run_id()
        # `kill` of the run takes the Ctrl-C path, so session teardown still stops the cluster.
        if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
            signal.signal(signal.SIGTERM, _interrupt)
    else:
        config.stash[_SHARED] = workerinput["dra_shared_dir"]
        config.stash[_RUN_ID] = workerinput["dra_run_id"]
    config.stash[_OPTIONS] = sessions.SessionOptions(
        backend=config.getoption("--dra-backend"),
        kubeconfig=config.getoption("--kubeconfig") or os.environ.get("KUBECONFIG"),
        cluster_name=config.getoption("--dra-cluster-name"),
        keep_cluster=config.getoption("--dra-keep-cluster"),
        nodes=config.getoption("--dra-nodes"),
        preset=config.getoption("--dra-preset"),
        feature_gates=config.getoption("--dra-feature-gates"),
        binaries_dir=config.getoption("--dra-binaries-dir"),
        real_nodes=config.getoption("--dra-real-nodes"),
        cluster_record=config.getoption("--dra-cluster-record"))
    vendor_file = config.getoption("--dra-driver-config")
    if vendor_file:
        options = config.stash[_OPTIONS]
        try:
            config.stash[_VENDOR] = loaded = vendor.load(vendor_file)
            kubeconfig = _given_cluster_kubeconfig(options)
            if kubeconfig is not None and workerinput is None and not config.getoption(vendor_setup.SET_UP_OPTION):
                # plain pytest on a cluster that is there already: this process checks the file against it
                # (refusing one it contradicts before any test starts) and sets up what `conformance run`
                # would, and takes it down in pytest_unconfigure; the xdist workers it starts get its options
                config.stash[_VENDOR_SETUP] = setup = vendor_setup.set_up(loaded, kubeconfig)
                config.option.dra_vendor_set_up = True
                config.option.dra_vendor_plugins = str(setup.record) if setup.record else None
        except (InvalidInput, HarnessError) as err:
            raise pytest.UsageError(str(err)) from None
    variant = config.getoption("--dra-fake-variant")
    if variant:
        if variant not in VARIANTS:
            raise pytest.UsageError(f"--dra-fake-variant {variant!r}: unknown; allowed: {', '.join(VARIANTS)}")


def pytest_unconfigure(config: pytest.Config) -> None:
    # Always called, also where pytest_sessionfinish was not (a Ctrl-C while plugins were still being
    # configured): the shared directory and a cluster the run started must not outlive it.
    if getattr(config, "workerinput", None) is None and _SHARED in config.stash \
            and Path(config.stash[_SHARED]).exists():
        leftovers = sessions.release_cluster(Path(config.stash[_SHARED]),
                                             config.stash.get(_OPTIONS, sessions.SessionOptions()))
        if leftovers:
            print(f"dra-harness: cluster clean-up left {leftovers}")
    setup = config.stash.get(_VENDOR_SETUP, None)
    if setup is not None:
        left = setup.close()
        if left:
            print(f"dra-harness: vendor clean-up left {left}")


def shared_dir(config: pytest.Config) -> Path:
    """A directory all xdist workers of this run share (for locks between them)."""
    return Path(config.stash[_SHARED])


def _given_cluster_kubeconfig(options: sessions.SessionOptions) -> Path | None:
    """The kubeconfig of a cluster that exists before the run (a job's record, or --kubeconfig for a
    backend that attaches), else None."""
    if options.cluster_record:
        return read_cluster(Path(options.cluster_record).expanduser()).kubeconfig
    if options.kubeconfig and backends.backend_class(options.backend).attaches:
        return Path(options.kubeconfig).expanduser()
    return None


@functools.cache
def _backend(name: str) -> Backend:
    """One backend object per name in this process: what it finds out about the machine (kind: the engine) is found
    once, not per node and per test."""
    return backends.get(name)


def node_cdi_dir(info: ClusterInfo, node: str):
    """The CDI spec directory of a node run by a real kubelet, as the cluster's backend reads it (a Path on the local
    backend's real node, the node's own directory through `docker exec` on kind); None where it is out of reach."""
    return _backend(info.backend).node_cdi_dir(info, node)


def node_runtime_query(info: ClusterInfo, node: str) -> tuple[str, ...] | None:
    """The argv prefix that asks the node's containerd about a container (`... containers info ID`), or None."""
    return _backend(info.backend).node_runtime_query(info, node)


def vendor_driver(config: pytest.Config):
    """The VendorDriver under test, or None when the fake driver is under test."""
    return config.stash.get(_VENDOR, None)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Record each test's feature and maturity (for the report), and apply --dra-maturity/--dra-features."""
    limit = MATURITY_ORDER[config.getoption("--dra-maturity")]
    wanted = {f.strip() for f in config.getoption("--dra-features").split(",") if f.strip()}
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        marker = item.get_closest_marker("dra_feature")
        feature = marker.args[0] if marker else None
        maturity = marker.kwargs.get("maturity", "ga") if marker else None
        if feature:
            item.user_properties.append(("dra_feature", feature))
            item.user_properties.append(("dra_maturity", maturity))
            # every gate the test is marked with, for the report's per-gate coverage
            item.user_properties.append(("dra_features", sorted({m.args[0] for m in item.iter_markers("dra_feature")})))
        too_new = maturity is not None and MATURITY_ORDER.get(maturity, 2) > limit
        unwanted = bool(wanted) and feature not in wanted
        (dropped if too_new or unwanted else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = suite_order(kept)


def uses_a_kubelet(item: pytest.Item) -> bool:
    return "real_node" in getattr(item, "fixturenames", ()) or item.get_closest_marker("needs_kubelet") is not None


def suite_order(items: list[pytest.Item]) -> list[pytest.Item]:
    """The suite in the order that ends it soonest when xdist's workers take one test at a time (`dra-harness run`),
    each group in its own order otherwise (measured in BENCHMARKS.md, "Suite time"):
    1. the tests that restart or reboot the real node: each needs the node alone, so it waits for every test
       holding a share of it and keeps new ones out meanwhile; first, they find the node free;
    2. the short tests that need no real kubelet (0.1-12 s), on the other workers meanwhile;
    3. the tests marked long_wait (30 s and more of a fixed delay), so that the run does not end waiting for one;
    4. the other tests that wait on a real kubelet (5-20 s each, about half of the suite's time), which share the
       node and end together."""
    def rank(item: pytest.Item) -> int:
        if item.get_closest_marker("disrupts_node"):
            return 0
        if item.get_closest_marker("long_wait"):
            return 2
        return 3 if uses_a_kubelet(item) else 1
    # Only the suite's tests move, within the places they had: in `make test` the harness's own tests
    # (tests/) keep theirs, so the suite's cluster is not started before they run.
    places = [i for i, item in enumerate(items) if _in_the_suite(item)]
    ordered = list(items)
    for place, item in zip(places, sorted((items[i] for i in places), key=rank)):
        ordered[place] = item
    return ordered


def _in_the_suite(item: pytest.Item) -> bool:
    path = getattr(item, "path", None)
    return path is not None and "conformance" in Path(path).parts


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    """On a failed test, save what explains it: the namespace's pods, claims and events, the slices
    of the drivers it used, and the last lines of every component log."""
    report = yield
    if report.failed:
        _name_dead_components(item, report)
    if report.failed and call.when in ("call", "setup") and INVALID_POOLS in str(report.longrepr):
        _name_invalid_pools(item, report)
    if report.failed and call.when in ("call", "setup"):
        try:
            path = diagnostics.collect(item, item.config.getoption("--dra-report-dir"), vendor_driver(item.config))
            if path:
                report.sections.append(("dra-harness diagnostics", f"saved to {path}"))
        except Exception as err:  # diagnostics must never hide the failure itself
            report.sections.append(("dra-harness diagnostics", f"could not be collected: {err}"))
    return report


INVALID_POOLS = "invalid resource pool"  # the scheduler's words, which name no pool


def _name_dead_components(item: pytest.Item, report: pytest.TestReport) -> None:
    """A test that failed some other way (an API error, a 504 from an apiserver without its etcd)
    while a component of the cluster is dead says that first: that is why it failed."""
    watch = item.config.stash.get(_WATCH, None)
    if watch is None:
        return
    try:
        watch.check(look_now=True)
        death = watch.restarted_since(item.stash.get(_RESTARTS_BEFORE, {}), item.stash.get(_BEGAN, None))
    except ComponentDied as err:
        death = str(err)
    crash = getattr(report.longrepr, "reprcrash", None)
    # What the record will say is the crash line: the death may sit earlier in the chain (a clean-up
    # that failed with a 504 while handling ComponentDied), where results.json does not show it.
    if not death or death.split("\n", 1)[0] in (crash.message if crash is not None else str(report.longrepr)):
        return  # it already says so
    if crash is not None:
        crash.message = f"{death}\n(the failure itself: {crash.message})"
    else:
        report.longrepr = f"{death}\n(the failure itself: {report.longrepr})"


def _name_invalid_pools(item: pytest.Item, report: pytest.TestReport) -> None:
    """The scheduler refused because some pool of the cluster is invalid: find which (any driver's,
    the harness's own or a vendor's) and say so in the failure message."""
    funcargs: dict[str, Any] = getattr(item, "funcargs", {})  # a test function's fixtures (pytest.Function)
    k8s = funcargs.get("k8s")
    if k8s is None:
        return
    try:
        slices = [k8s.api_client.sanitize_for_serialization(s) for s in k8s.resource.list_resource_slice().items]
        found = driver_checks.invalid_pools(slices)
    except Exception as err:  # explaining must never hide the failure itself
        report.sections.append(("dra-harness invalid pools", f"could not be listed: {err}"))
        return
    text = ("invalid pools in the cluster now: " + "; ".join(found[:10])) if found else \
        "no pool of the cluster is invalid now (it was repaired since)"
    report.sections.append(("dra-harness invalid pools", text))
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        crash.message = f"{crash.message}\n{text}"


def _interrupt(signum, frame):
    raise KeyboardInterrupt


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """xdist controller -> worker: where the shared cluster is recorded, and the run id."""
    node.workerinput["dra_shared_dir"] = node.config.stash[_SHARED]
    node.workerinput["dra_run_id"] = node.config.stash[_RUN_ID]


class ResultRecorder:
    """One record per test for `<report-dir>/results.json` (on the xdist controller, reports of all
    workers arrive here): outcome, duration, skip reason or failure message, feature and maturity.

    The file is rewritten (atomically) after every finished test, so a run that is interrupted or
    killed still leaves the results of the tests that finished (`dra-harness run` reports them)."""

    def __init__(self, path: Path | None = None):
        self.results: dict[str, TestResult] = {}
        self.finished: set[str] = set()  # tests whose teardown ran: a test cut short by Ctrl-C is left out
        self.write_error: str | None = None
        self.path = path

    def save(self) -> None:
        if self.path is None:
            return
        try:
            write_results([r for r in self.results.values() if r.id in self.finished], self.path)
        except OSError as err:
            # A full or read-only disk: the run goes on (the previous results.json stays whole, it is
            # replaced atomically) and says so once; the job that reads the file reports the error.
            if self.write_error is None:
                self.write_error = str(diskspace.write_error(err, self.path))
                sys.stderr.write(f"\ndra-harness: results.json lags behind the run from here: {self.write_error}\n")

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        entry = self.results.setdefault(report.nodeid, TestResult(report.nodeid))
        entry.seconds = round(entry.seconds + report.duration, 3)
        entry.properties.update(dict(report.user_properties))
        expected_failure = getattr(report, "wasxfail", None)
        if report.skipped and expected_failure is not None:
            entry.outcome = "xfailed"
            crash = getattr(report.longrepr, "reprcrash", None)
            entry.message = (f"expected failure: {expected_failure}"
                             + (f" (failed with: {crash.message})" if crash else ""))[:2000]
        elif report.passed and expected_failure is not None and report.when == "call":
            entry.outcome = "xpassed"
            entry.message = f"expected to fail, passed: {expected_failure}"
        elif report.skipped and entry.outcome != "failed":
            reason = (report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
                      ).removeprefix("Skipped: ")
            # recorded as a property, or said by the skip itself (where no test request is at hand)
            not_applicable = dict(report.user_properties).get("dra_not_applicable") or \
                reason.startswith("not applicable: ")
            entry.outcome = "not applicable" if not_applicable else "skipped"
            entry.message = reason
        elif report.failed:
            entry.outcome = "failed"
            crash = getattr(report.longrepr, "reprcrash", None)
            entry.message = (crash.message if crash else str(report.longrepr))[:2000]
            entry.phase = report.when
        if report.when == "teardown":
            self.finished.add(report.nodeid)
            self.save()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_sessionfinish(session: pytest.Session):
    config = session.config
    try:
        yield  # pytest's own: the JUnit file among them
    except OSError as err:
        # A full or read-only report directory: say where, not pytest's traceback; the run still
        # fails (the job that reads the reports names it again) and the cluster is still released.
        if err.errno not in diskspace.DISK_ERRNOS:
            raise
        junit = config.option.xmlpath if hasattr(config.option, "xmlpath") and config.option.xmlpath else None
        sys.stderr.write(f"\ndra-harness: pytest's reports: {diskspace.write_error(err, junit and Path(junit))}\n")
        session.exitstatus = pytest.ExitCode.INTERNAL_ERROR
    if getattr(config, "workerinput", None) is None:
        config.stash[_RESULTS].save()
    if getattr(config, "workerinput", None) is None and _SHARED in config.stash:

        leftovers = sessions.release_cluster(Path(config.stash[_SHARED]), config.stash[_OPTIONS])
        if leftovers:
            session.config.issue_config_time_warning(
                pytest.PytestWarning(f"dra-harness: cluster clean-up left {leftovers}"), stacklevel=1)


def pytest_report_header(config: pytest.Config) -> str:
    options = config.stash[_OPTIONS]
    # a given cluster record (the runner's, any backend) decides the cluster, not --dra-backend
    where = f"cluster={options.cluster_record}" if options.cluster_record else f"backend={options.backend}"
    return f"dra-harness: {where} run-id={config.stash[_RUN_ID]}"


# --- fixtures ---------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def dra_run_id(request: pytest.FixtureRequest) -> str:
    """Label value on everything this run creates (shared by all xdist workers)."""
    return request.config.stash[_RUN_ID]


@pytest.fixture(scope="session")
def dra_cluster(request: pytest.FixtureRequest) -> ClusterInfo:
    """The cluster under test: started on first use (local backend) or the one of --kubeconfig."""

    config = request.config
    try:
        info = sessions.acquire_cluster(Path(config.stash[_SHARED]), config.stash[_OPTIONS], config.stash[_RUN_ID])
    except HarnessError as err:
        pytest.fail(f"dra-harness could not provide a cluster:\n{err}", pytrace=False)
    if _WATCH not in config.stash and (watch := backends.get(info.backend).component_watch(info)) is not None:
        config.stash[_WATCH] = watch  # a dead component ends each wait within a second, naming it
        request.addfinalizer(wait.abort_waits_when(watch.check))
    return info


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test that starts after a component of the cluster died fails at once, naming it."""
    watch = item.config.stash.get(_WATCH, None)
    if watch is not None:
        # a dead kubelet or containerd of a real node fails only the tests that use the node (the real_node
        # and vendor_plugins fixtures say so too, for a test that asks for them on the way)
        watch.nodes_needed = uses_a_kubelet(item)
        try:
            watch.check()
            _wait_for_restarts(watch)  # a component that does not come back raises ComponentDied on the way
        except ComponentDied as err:
            pytest.fail(str(err), pytrace=False)
        item.stash[_RESTARTS_BEFORE] = watch.restarts()
        item.stash[_BEGAN] = time.time()


def _wait_for_restarts(watch: ComponentWatchHandle) -> None:
    """A test does not begin while the supervisor restarts a component it needs: it would fail on the way
    (connection refused). Bounded; past the bound the test runs, and a failure names the restart."""
    if not watch.restarting():
        return
    try:
        wait.until("the supervisor's restarts to finish", lambda: not watch.restarting(), RESTART_WAIT, interval=0.5)
    except wait.WaitTimeout:
        pass


# The supervisor's backoff before a restart (at most 16 s) and the wait for the component to serve again (120 s).
RESTART_WAIT = 150.0

# Without these no API request can succeed; once one is dead for good, a request would first wait out the
# client's read timeout (20 s, retried 3 times) or the apiserver's own 60 s, in every teardown that follows.
API_PATH = ("etcd", "kube-apiserver")


@pytest.fixture(scope="session")
def k8s(request: pytest.FixtureRequest, dra_cluster: ClusterInfo) -> Iterator[Clients]:
    """Typed API clients for the cluster under test. Where the backend watches its components, a request
    made after etcd or the apiserver died for good fails at once with ComponentDied, naming it."""
    clients = Clients(dra_cluster.kubeconfig)
    watch = request.config.stash.get(_WATCH, None)
    if watch is not None:
        def api_path_alive() -> None:
            if any(death.component in API_PATH for death in watch.deaths(nodes=False)):
                watch.check()  # raises ComponentDied, naming the dead component

        clients.check_before_each_call(api_path_alive)
    yield clients
    clients.close()


@pytest.fixture
def unique_name(request: pytest.FixtureRequest, dra_run_id: str):
    """`unique_name("gpu")` -> a DNS-safe name no other test or worker of this run uses."""
    worker = getattr(request.config, "workerinput", {}).get("workerid", "gw")
    digest = hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:6]

    def make(prefix: str) -> str:
        prefix = re.sub(r"[^a-z0-9-]", "-", prefix.lower())[:30].strip("-")
        return f"{prefix}-{dra_run_id[:5]}-{worker}-{digest}"

    return make


@pytest.fixture
def real_node(request: pytest.FixtureRequest, dra_cluster: ClusterInfo, k8s: Clients, dra_namespace: str):
    """A node run by a real kubelet where the backend runs the fake driver's kubelet plugins (the local backend's
    real node: host processes; a kind worker: pods): `real_node.run_for(fake)` starts one per driver name.
    A test that restarts its kubelet or reboots it is marked `disrupts_node`. At teardown the test's
    pods are deleted first (the kubelet unprepares their claims through the plugins), then the plugins
    stop. Skips, with the reason, where the cluster has no such node."""
    handle = _backend(dra_cluster.backend).node_plugins(dra_cluster)
    if handle is not None:
        _needs_nodes(request.config)
    else:
        pytest.skip(f"the cluster under test has no node where dra-harness runs the fake driver's kubelet plugins "
                    f"({dra_cluster.real_nodes_reason or f'{dra_cluster.backend} cluster started without one'}); on "
                    "your own cluster (or kind with --no-deploy) use a vendor config (--dra-driver-config) naming the "
                    "driver your nodes run")
    try:
        if request.node.get_closest_marker("disrupts_node"):
            handle.will_disrupt()  # before any share of the node: see realnode.sharing
    except BaseException:
        handle.close()
        raise
    yield handle
    try:
        _delete_pods_and_wait(k8s, dra_namespace)
    finally:
        handle.close()


@pytest.fixture
def vendor_plugins(request: pytest.FixtureRequest) -> list:
    """Vendor mode: the vendor's kubelet plugins the harness started from spec.kubeletPlugin, one per
    real node (harness.vendor.plugins.VendorPlugin: `.node`, `.restart(kill=True)`, `.stop()`,
    `.start()`, `.log`). Skips, naming the field, when the harness did not start the plugin."""
    vendor = vendor_driver(request.config)
    if vendor is None:
        pytest.skip("vendor mode only (--dra-driver-config): the fake driver's plugins are in `real_node`")
    plugins = load_vendor_plugins(request.config.getoption(vendor_setup.PLUGINS_OPTION))
    _needs_nodes(request.config)
    if not plugins:
        pytest.skip(f"the vendor file {vendor.source} has no spec.kubeletPlugin: the harness did not start the "
                    "plugin, so it cannot stop or restart it")
    return plugins


def _needs_nodes(config: pytest.Config) -> None:
    """This test uses a real node: a dead containerd or kubelet there fails it, naming the component."""
    watch = config.stash.get(_WATCH, None)
    if watch is not None:
        watch.nodes_needed = True


def _delete_pods_and_wait(k8s: Clients, namespace: str, timeout: float = 90.0) -> None:
    """Delete a namespace's pods gracefully (never forced: the kubelet must unprepare) and wait."""
    for pod in k8s.core.list_namespaced_pod(namespace).items:
        wait.ignore_not_found(k8s.core.delete_namespaced_pod, pod.metadata.name, namespace)
    wait.until(f"the pods of {namespace} to be gone", lambda: not k8s.core.list_namespaced_pod(namespace).items,
               timeout, diagnostics=lambda: wait.describe_namespace(k8s, namespace))


ALLOCATED_DRIVERS = "dra_allocated_drivers"  # test property: drivers whose devices the test was allocated
FAKE_DRIVER_NAMES = "dra_fake_drivers"  # test property: the drivers of the fake-driver instances it started


@pytest.fixture
def dra_namespace(request: pytest.FixtureRequest, k8s: Clients, unique_name, dra_run_id: str) -> Iterator[str]:
    """A fresh namespace for one test, deleted afterwards (also when the test fails). The drivers
    whose devices its claims were allocated are recorded for the report."""
    name = unique_name("t")
    k8s.core.create_namespace({"apiVersion": "v1", "kind": "Namespace",
                               "metadata": {"name": name, "labels": {RUN_ID_LABEL: dra_run_id}}})
    try:
        wait.service_account_ready(k8s, name)
        with AllocatedDrivers(k8s, name) as allocated:
            yield name
        request.node.user_properties.append((ALLOCATED_DRIVERS, sorted(allocated.drivers)))
        if not allocated.complete:
            request.node.user_properties.append(("dra_allocations_incomplete", True))
    finally:
        # Deleting through a cluster whose etcd or apiserver is dead for good only waits out timeouts
        # (measured: 274 s); the namespace goes with the cluster.
        watch = request.config.stash.get(_WATCH, None)
        if watch is None or not watch.deaths(look_now=True, nodes=False):
            wait.ignore_not_found(k8s.core.delete_namespace, name)


@pytest.fixture
def cluster_objects(k8s: Clients) -> Iterator[wait.CreatedObjects]:
    """Tracks cluster-scoped objects a test creates and deletes them at teardown."""
    created = wait.CreatedObjects(k8s)
    yield created
    created.delete_all()


@pytest.fixture
def fake_driver(request: pytest.FixtureRequest, k8s: Clients, unique_name, dra_namespace: str):
    """Start fake-driver instances for a test: `fake_driver({"kwok-node-0": "tiny"})`.

    Each instance gets a unique name and driver domain (`<instance>.example.com`), publishes the
    given profile on each named node, keeps its fault ConfigMap in the test's namespace, and is
    stopped with all its slices and DeviceClasses removed at teardown.
    """
    started: list[FakeDriver] = []
    setattr(request.node, FAKE_DRIVERS, started)  # so a failure report can show their slices

    def start(nodes: dict[str, str], **options) -> FakeDriver:
        instance = unique_name(f"fd{len(started)}")
        options.setdefault("workers", 4)
        options.setdefault("variant", request.config.getoption("--dra-fake-variant"))
        config = driver_config.build(instance, f"{instance}.example.com", [], nodes=nodes, namespace=dra_namespace,
                                     **options)
        driver = FakeDriver(config, k8s.api_client)
        started.append(driver)
        # with the fake driver under test, its devices are the ones that earn a feature credit in the report
        request.node.user_properties.append((FAKE_DRIVER_NAMES, sorted({name for d in started
                                                                        for name in d.drivers.all()})))
        driver.start()
        if not driver.wait_idle(60) or driver.errors:
            raise AssertionError(f"fake driver {instance} did not publish cleanly: {driver.errors}")
        return driver

    yield start
    for driver in reversed(started):
        driver.stop(delete_slices=True)
