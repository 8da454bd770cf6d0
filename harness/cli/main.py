"""The `dra-harness` command line. Thin: parse, call into the harness, print; one error printer."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import traceback
from dataclasses import asdict
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from harness import __version__, backends, binaries
from harness.backends.base import Backend, ClusterSpec
from harness.backends.local import state
from harness.binaries import exampledriver
from harness.cli import bench as bench_cli
from harness.cli import profiles as profiles_cli
from harness.config import cluster as cluster_config
from harness.core import diskspace
from harness.core.errors import ClusterNotFound, ConfigError, HarnessError, InvalidInput, Problem
from harness.core.nodelayout import records
from harness.core.progress import Reporter
from load import scenarios

# The suite's xdist workers: its tests mostly wait on the cluster (a kubelet, a timeout of the scheduler), so on
# two cores 6 workers ran it in 104 s against 122-126 s with 4 and 221 s with 2 (BENCHMARKS.md, "Suite time").
DEFAULT_WORKERS = 6

# A subcommand's implementation is imported when that subcommand runs (marked "lazy: subcommand" below):
# `jobs.runner`, `jobs.load_runner`, `migration.command`, `kind.host`, `vendor.plugins` and
# `binaries.noderuntime` load the fake driver's gRPC stubs, the local backend's real nodes and more (about
# 0.25 s of CPU together), which `--help`, `cluster up` and every other command would pay for nothing.


def _add_version_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kubernetes-version", default=binaries.DEFAULT_KUBERNETES, metavar="X.Y.Z")
    parser.add_argument("--etcd-version", default=binaries.DEFAULT_ETCD, metavar="X.Y.Z")
    parser.add_argument("--kwok-version", default=binaries.DEFAULT_KWOK, metavar="X.Y.Z")


def _versions(args) -> binaries.Versions:
    return binaries.Versions(binaries.check_version(args.kubernetes_version, "--kubernetes-version"),
                             binaries.check_version(args.etcd_version, "--etcd-version"),
                             binaries.check_version(args.kwok_version, "--kwok-version"))


BACKEND_HELP = ("local (default: control plane + KWOK nodes), kind (real kubelets in Docker), existing (a cluster "
                "you own, see --kubeconfig)")


def _add_suite_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", default="local", help=BACKEND_HELP)
    parser.add_argument("--kubeconfig", default=None, help="existing backend: the cluster to test (default: $KUBECONFIG)")
    parser.add_argument("--name", default=None, help="local: cluster name (default: a fresh one for this run)")
    parser.add_argument("--nodes", type=int, default=3, help="local: simulated nodes (default: 3)")
    parser.add_argument("--config", default=None, help="local: cluster definition (file or name in clusters/)")
    parser.add_argument("--real-nodes", default="auto", metavar="auto|N",
                        help="local: nodes run by a real kubelet + containerd (auto: one where this machine can "
                             "host it, needs root; docs/real-node.md)")
    parser.add_argument("--preset", default=None, help="local: feature-gate preset (default: all-dra)")
    parser.add_argument("--feature-gates", default="", help="local: gate overrides")
    parser.add_argument("--driver-config", default=None, metavar="VENDOR_YAML",
                        help="vendor mode: test this driver (kind VendorDriver) as it is")
    parser.add_argument("--maturity", choices=("ga", "beta", "alpha"), default="alpha",
                        help="features up to this maturity (default: all)")
    parser.add_argument("--features", default="", help="only these feature gates' tests (comma-separated)")
    parser.add_argument("--report-dir", type=Path, default=Path("reports"))
    parser.add_argument("-n", "--workers", type=int, default=DEFAULT_WORKERS,
                        help=f"pytest-xdist workers (default: {DEFAULT_WORKERS}: the tests mostly wait on the cluster, "
                             "so more workers than cores pay; BENCHMARKS.md, 'Suite time')")
    parser.add_argument("--keep-cluster", action="store_true", help="leave a started cluster running")
    parser.add_argument("--binaries-dir", type=Path, default=None)
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    _add_version_flags(parser)


def _add_migration_parser(commands) -> None:
    """`migration rehearse` (harness.migration.command)."""
    migration = commands.add_parser("migration", help="rehearse a device-plugin -> DRA migration (docs/migration.md)")
    actions = migration.add_subparsers(dest="action", required=True, metavar="ACTION")
    rehearse = actions.add_parser("rehearse", help="legacy cluster, node-by-node migration under a pod stream, "
                                                   "per-phase report, stop")
    rehearse.add_argument("--config", default="migration",
                          help="cluster definition of the target state (file or name in clusters/; default: migration)")
    rehearse.add_argument("--name", default=None, help="cluster name (default: a fresh one)")
    rehearse.add_argument("--pods-per-phase", type=int, default=4, help="workload pods to run per phase (default: 4)")
    rehearse.add_argument("--in-flight", type=int, default=None,
                          help="workload pods alive at once (default: as many as fit while the largest node migrates)")
    rehearse.add_argument("--pod-timeout", type=float, default=90.0, help="seconds a pod may take to run (default: 90)")
    rehearse.add_argument("--report-dir", type=Path, default=Path("reports"))
    rehearse.add_argument("--keep-cluster", action="store_true", help="leave the cluster running afterwards")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dra-harness", description=__doc__)
    parser.add_argument("--version", action="version", version=f"dra-harness {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="show tracebacks for errors")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    bins = commands.add_parser("binaries", help="install or locate Kubernetes, etcd and KWOK binaries")
    bins_sub = bins.add_subparsers(dest="action", required=True, metavar="ACTION")
    install = bins_sub.add_parser("install", help="build or download the binaries into the cache")
    _add_version_flags(install)
    install.add_argument("--source", choices=binaries.SOURCES, default="auto",
                         help="build from the Go module proxy, download official releases, or pick (default)")
    install.add_argument("--force", action="store_true", help="provide them again even if the cache verifies")
    install.add_argument("--node-runtime", action="store_true",
                         help="also build what a real node runs: containerd and the pause binary (needs runc, CNI "
                              "plugins and a static busybox on the machine; see docs/real-node.md)")
    install.add_argument("--example-driver", action="store_true",
                         help="also build the reference third-party driver's kubelet plugin (dra-example-driver "
                              "v0.4.0, from the Go module proxy; docs/vendor-guide.md)")
    install.add_argument("--kind", action="store_true",
                         help="also build what the kind backend needs from Go: kind v0.33.0 and the kubeadm and "
                              "kube-proxy of the offline node image (docs/kind-and-existing.md)")
    where = bins_sub.add_parser("path", help="print the cache directory of verified binaries")
    _add_version_flags(where)

    cluster = commands.add_parser("cluster", help="start, stop and inspect clusters")
    cluster_sub = cluster.add_subparsers(dest="action", required=True, metavar="ACTION")
    up = cluster_sub.add_parser("up", help="start a cluster")
    up.add_argument("--backend", default="local", help=BACKEND_HELP)
    up.add_argument("--name", default="dra-harness", help="cluster name (default: dra-harness)")
    up.add_argument("--config", default=None, metavar="FILE|NAME",
                    help="cluster definition (node pools, profiles, preset): a file or a name from clusters/")
    up.add_argument("--nodes", type=int, default=None,
                    help="number of simulated (KWOK) nodes without devices (default: 3; not with --config)")
    up.add_argument("--simulated-nodes", type=int, default=None, metavar="N",
                    help="kind, existing: simulated (KWOK) nodes inside the cluster beside its own, for the tests "
                         "that need them (default: 3 on kind, 0 on existing; 0: no KWOK)")
    up.add_argument("--kwok-image", default=None, metavar="IMG",
                    help="kind, existing: KWOK's controller image (default: registry.k8s.io/kwok/kwok:v0.8.0; on "
                         "kind without a registry, one built from the cached KWOK binary)")
    up.add_argument("--real-nodes", type=int, default=0,
                    help="local: nodes run by a real kubelet v1.37 + containerd on this machine (needs root; "
                         "see docs/real-node.md; default: 0)")
    up.add_argument("--preset", default=None, help="feature-gate preset from clusters/feature-gates (default: all-dra)")
    up.add_argument("--feature-gates", default="", metavar="A=true,B=false", help="gate overrides")
    up.add_argument("--runtime-config", default="", metavar="G/V=true", help="API version overrides")
    up.add_argument("--binaries-dir", type=Path, default=None, help="use pre-built binaries from this directory")
    up.add_argument("--source", choices=binaries.SOURCES, default="auto", help="where missing binaries come from")
    up.add_argument("--keep-on-failure", action="store_true", help="leave a failed cluster for inspection")
    up.add_argument("--verbosity", type=int, default=1, metavar="0-10",
                    help="local: the control-plane components' log level, --v (default: 1; 5 shows why the "
                         "scheduler's DRA allocator rejects a node)")
    up.add_argument("--kubeconfig", default=None, help="existing: the cluster's kubeconfig (default: $KUBECONFIG)")
    up.add_argument("--no-deploy", action="store_true",
                    help="kind, existing: do not deploy the fake driver (vendor mode: bring your own driver)")
    up.add_argument("--node-image", default=None, metavar="IMAGE",
                    help="kind: node image, pinned by digest (default: the kind v0.33.0 Kubernetes 1.37 image)")
    up.add_argument("--driver-image", default=None, metavar="IMAGE",
                    help="kind: load this local image instead of building one; existing: the image your cluster "
                         "pulls (default: localhost/dra-harness/fake-driver:<version>)")
    _add_version_flags(up)
    check = cluster_sub.add_parser("validate", help="check cluster definitions as `cluster up --config` does, "
                                                    "without building or starting anything")
    check.add_argument("definitions", nargs="+", metavar="FILE|NAME", help="Cluster YAML files or names in clusters/")
    check.add_argument("--kubernetes-version", default=binaries.DEFAULT_KUBERNETES, metavar="X.Y.Z",
                       help="the feature-gate matrix to check presets and gates against")
    down = cluster_sub.add_parser("down", help="stop a cluster and delete its state")
    down.add_argument("--name", default="dra-harness")
    down.add_argument("--all", action="store_true", help="every cluster this user has")
    down.add_argument("--backend", default="local", help="local (default), kind or existing")
    status = cluster_sub.add_parser("status", help="show whether a cluster's components are running")
    status.add_argument("--name", default="dra-harness")
    status.add_argument("--backend", default="local", help="local (default), kind or existing")
    status.add_argument("--json", action="store_true")
    lst = cluster_sub.add_parser("list", help="list clusters")
    lst.add_argument("--backend", default="local", help="local (default), kind or existing")
    lst.add_argument("--json", action="store_true")
    npaths = cluster_sub.add_parser("node-paths", help="print a local cluster's real-node paths for a kubelet plugin "
                                                        "you start yourself (the spec.kubeletPlugin placeholders)")
    npaths.add_argument("--name", default="dra-harness", help="local cluster name (default: dra-harness)")
    npaths.add_argument("--node", default=None, help="only this real node (default: every real node)")
    npaths.add_argument("--json", action="store_true", help="a JSON list, keys as the placeholders' names")
    kcfg = cluster_sub.add_parser("kubeconfig", help="print the path of a cluster's kubeconfig")
    kcfg.add_argument("--name", default="dra-harness")
    kcfg.add_argument("--backend", default="local", help="local (default), kind or existing")

    prof = commands.add_parser("profiles", help="hardware profiles of the fake driver")
    prof_sub = prof.add_subparsers(dest="action", required=True, metavar="ACTION")
    prof_sub.add_parser("list", help="list the built-in profiles")
    show = prof_sub.add_parser("show", help="print a profile")
    show.add_argument("profile", help="built-in name or file")
    validate = prof_sub.add_parser("validate", help="check profile or cluster-definition files")
    validate.add_argument("files", nargs="+", help="NodeProfile or Cluster YAML files")
    rend = prof_sub.add_parser("render", help="print the ResourceSlices a profile produces for one node")
    rend.add_argument("profile", help="built-in name or file")
    rend.add_argument("--node", default="node-0", help="node name (default: node-0)")
    rend.add_argument("--domain", default="fake.dra-harness.x-k8s.io", help="driver domain")
    rend.add_argument("--fault", action="append", default=[], metavar="DEVICE=KIND",
                      help="render as if DEVICE had this fault (repeatable)")

    fault = commands.add_parser("fault", help="inject device faults into a running fake driver")
    fault_sub = fault.add_subparsers(dest="action", required=True, metavar="ACTION")
    for action, text in (("inject", "make a device fail"), ("clear", "recover a device"), ("list", "show faults")):
        sub = fault_sub.add_parser(action, help=text)
        sub.add_argument("--name", default="dra-harness", help="local cluster name")
        sub.add_argument("--kubeconfig", default=None, help="any cluster (instead of --name)")
        sub.add_argument("--instance", default="fake", help="fake-driver instance (default: fake)")
        sub.add_argument("--namespace", default="dra-harness-system")
        if action != "list":
            sub.add_argument("--node", required=True)
            sub.add_argument("--device", required=True)
        if action == "inject":
            sub.add_argument("--kind", required=True, help="warning | degraded | unhealthy | lost")

    conf = commands.add_parser("conformance", help="the DRA conformance suite")
    conf_sub = conf.add_subparsers(dest="action", required=True, metavar="ACTION")
    crun = conf_sub.add_parser("run", help="run the suite against a started or existing cluster and write reports")
    _add_suite_flags(crun)
    cval = conf_sub.add_parser("validate", help="check vendor files (kind VendorDriver) offline, every problem at "
                                                "once, without a cluster")
    cval.add_argument("--driver-config", required=True, action="append", metavar="VENDOR_YAML",
                      help="a vendor file (repeatable)")

    sanity = commands.add_parser("sanity", help="check a kubelet plugin against the written kubelet-plugin contract "
                                                "over its own sockets: no root, no kubelet (docs/contract.md)")
    sanity.add_argument("--driver-config", required=True, metavar="VENDOR_YAML",
                        help="the vendor file whose spec.kubeletPlugin starts the plugin")
    sanity.add_argument("--report-dir", type=Path, default=Path("reports/sanity"),
                        help="results.json, junit.xml and sanity.md go here (default: reports/sanity)")
    sanity.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --), e.g. -k REG")

    load = commands.add_parser("load", help="locust load tests: requeue latency and scheduling throughput")
    load_sub = load.add_subparsers(dest="action", required=True, metavar="ACTION")
    lrun = load_sub.add_parser("run", help="one scenario on a fresh cluster (or as a guest on yours: --backend "
                                           "existing)")
    lrun.add_argument("--backend", default="local", help=BACKEND_HELP)
    lrun.add_argument("--kubeconfig", default=None, help="existing backend: the cluster (default: $KUBECONFIG)")
    lrun.add_argument("--scenario", required=True, help=" | ".join(scenarios.SCENARIOS))
    lrun.add_argument("--nodes", type=int, default=10)
    lrun.add_argument("--pending", type=int, default=20, help="waiting pods (throughput: the burst size)")
    lrun.add_argument("--events", type=int, default=20, help="unblocking events to measure")
    lrun.add_argument("--devices-per-node", type=int, default=4)
    lrun.add_argument("--users", type=int, default=1, help="locust users (concurrent events)")
    lrun.add_argument("--rate", type=float, default=10.0, help="steady-state: pod arrivals per second (default: 10)")
    lrun.add_argument("--in-flight", type=int, default=0, metavar="K",
                      help="steady-state closed loop: K pods always waiting, each replaced once bound (as "
                           "scheduler_perf's steady state); reports pods/s. Needs --duration (default: 0, open loop)")
    lrun.add_argument("--duration", type=float, default=0.0, metavar="SECONDS",
                      help="steady-state closed loop: how long to keep K pods waiting (--events still bounds the "
                           "arrivals)")
    lrun.add_argument("--time-limit", type=float, default=300, help="seconds; locust stops at this bound")
    lrun.add_argument("--hints", choices=("on", "off"), default=None,
                      help="SchedulerPreQueueingHints of the cluster the run starts (default: on; a cluster you "
                           "give keeps its own)")
    lrun.add_argument("--report-dir", type=Path, default=Path("reports/load"))
    lrun.add_argument("--web", action="store_true", help="serve locust's web UI on 127.0.0.1:8089")
    lrun.add_argument("--workers", type=int, default=0, help="locust distributed mode: K worker processes")
    lrun.add_argument("--keep-cluster", action="store_true")
    lsweep = load_sub.add_parser("sweep", help="a scenario over nodes x pending, hints on and off; plots")
    lsweep.add_argument("--scenario", required=True)
    lsweep.add_argument("--nodes", default="10,100", help="comma-separated node counts")
    lsweep.add_argument("--pending", default="10,100", help="comma-separated waiting-pod counts")
    lsweep.add_argument("--events", type=int, default=20)
    lsweep.add_argument("--devices-per-node", type=int, default=4)
    lsweep.add_argument("--time-limit", type=float, default=600)
    lsweep.add_argument("--hints", choices=("both", "on", "off"), default="both")
    lsweep.add_argument("--report-dir", type=Path, default=Path("reports/sweep"))

    kindc = commands.add_parser("kind", help="what the kind backend needs from this machine")
    kind_sub = kindc.add_subparsers(dest="action", required=True, metavar="ACTION")
    kind_sub.add_parser("engine", help="say which Docker engine the kind backend would use, and how (changes nothing)")
    kind_sub.add_parser("build-node-image",
                        help="build (or find cached) an offline kind node image for Kubernetes v1.37.2")

    bench_cli.add_parser(commands)

    run = commands.add_parser("run", help="main job: cluster + fake devices, conformance suite, report, stop")
    _add_suite_flags(run)

    _add_migration_parser(commands)
    return parser


# Exit statuses: 0 success, 1 a failure (tests failed, a component died), 2 bad input refused before
# anything started (as argparse does for usage errors), 128+N stopped by signal N.
EXIT_FAILURE = 1
EXIT_BAD_INPUT = 2


def run(argv: list[str], out=sys.stdout) -> int:
    args = build_parser().parse_args(argv)
    reporter = Reporter(quiet=args.quiet)
    try:
        try:
            return _dispatch(args, reporter, out)
        except InvalidInput as err:
            raise ConfigError(err.problems) from err
        except OSError as err:
            if err.errno not in diskspace.DISK_ERRNOS:
                raise
            raise diskspace.write_error(err) from err
    except HarnessError as err:
        if args.verbose:
            traceback.print_exc()
        reporter.console.print(f"[red]error:[/red] {escape(str(err))}", markup=True, highlight=False, soft_wrap=True)
        return EXIT_BAD_INPUT if isinstance(err, ConfigError) else EXIT_FAILURE
    except KeyboardInterrupt as err:
        reporter.console.print("interrupted; everything started by this command was stopped")
        return 128 + (err.args[0] if err.args and isinstance(err.args[0], int) else signal.SIGINT)


def _kind(args, reporter: Reporter, out) -> int:
    from harness.backends.kind.backend import engine_user_in_use  # lazy: subcommand
    from harness.backends.kind.host import docker, enginechoice, nodeimage  # lazy: subcommand

    facts = enginechoice.detect()
    decision = enginechoice.decide(facts)
    if args.action == "engine":
        print("; ".join(decision.problems) if decision.problems else decision.describe(), file=out)
        return 1 if decision.problems else 0
    # The engine is ours only for this command: a dockerd the harness starts is stopped again at the end.
    engine = docker.acquire("node-image", reporter, facts=facts, in_use=engine_user_in_use)
    try:
        tag = nodeimage.build(engine, reporter, drops=facts.missing_caps)
    finally:
        problems = docker.release("node-image", reporter, in_use=engine_user_in_use)
        for problem in problems:
            reporter.console.print(f"[yellow]warning:[/yellow] could not restore {escape(problem)}")
    print(tag, file=out)
    return 0


def _dispatch(args, reporter: Reporter, out) -> int:
    if args.command == "binaries":
        if args.action == "install":
            binset = binaries.ensure(_versions(args), source=args.source, reporter=reporter, force=args.force)
            if args.node_runtime:
                from harness.binaries import noderuntime  # lazy: subcommand (builds real-node images)

                print(noderuntime.ensure(reporter).directory, file=out)
            if args.example_driver:
                print(exampledriver.ensure(reporter), file=out)
            if args.kind:
                from harness.backends.kind.host import nodeinputs  # lazy: subcommand
                from harness.binaries import kindtool

                print(kindtool.ensure(reporter), file=out)
                print(nodeinputs.ensure_node_binaries(binset.versions.kubernetes, reporter), file=out)
        else:
            binset = binaries.locate(_versions(args))
        print(binset.directory, file=out)
        return 0

    if args.command == "conformance" and args.action == "validate":
        return _validate_vendor_files(args.driver_config, out)
    if args.command == "sanity":
        from harness.jobs import sanity_runner  # lazy: subcommand (starts a cluster, loads the gRPC stubs)

        return sanity_runner.run(args.driver_config, args.report_dir, reporter, out, args.pytest_args)
    if args.command in ("run", "conformance"):
        from harness.jobs import runner  # lazy: subcommand

        options = runner.ConformanceOptions(
            backend=args.backend, kubeconfig=args.kubeconfig, name=args.name,
            nodes=args.nodes, preset=args.preset, feature_gates=args.feature_gates, definition=args.config,
            driver_config=args.driver_config, maturity=args.maturity, features=args.features,
            report_dir=args.report_dir, workers=args.workers, keep_cluster=args.keep_cluster,
            binaries_dir=args.binaries_dir, versions=_versions(args), real_nodes=args.real_nodes,
            pytest_args=args.pytest_args)
        return runner.run(options, reporter, out)
    if args.command == "load":
        return _load(args, reporter, out)
    if args.command == "kind":
        return _kind(args, reporter, out)
    if args.command == "bench":
        return bench_cli.run(args, reporter, out)
    if args.command == "profiles":
        return profiles_cli.run(args, out)
    if args.command == "fault":
        return profiles_cli.fault(args, out)
    if args.command == "migration":
        from harness.migration import command as migration  # lazy: subcommand

        return migration.run(args, reporter, out)

    if args.action == "validate":
        return _validate_definitions(args, out)
    if args.action == "node-paths":
        return _node_paths(args, out)
    backend = backends.get(args.backend, reporter)
    if args.action == "up":
        info = backend.up(_up_spec(args, backend))
        print(f"cluster {info.name!r} is up: {info.server}", file=out)
        print(f"export KUBECONFIG={info.kubeconfig}", file=out)
        return 0
    if args.action == "down":
        names = backend.list() if args.all else [args.name]
        failed = False
        for name in names:
            try:
                leftovers = backend.down(name)
            except ClusterNotFound as err:  # a repeated `down` has nothing left to do: not a failure
                print(f"nothing to do: {err.message}", file=out)
                continue
            if leftovers:
                failed = True
                print(f"cluster {name!r}: could not clean up: {', '.join(leftovers)}", file=out)
            else:
                print(f"cluster {name!r} is down", file=out)
        return 1 if failed else 0
    if args.action == "status":
        status = backend.status(args.name)
        if args.json:
            print(json.dumps(asdict(status), indent=2), file=out)
        else:
            _print_status(status, out)
        return 0 if status.health == "running" else 2
    if args.action == "list":
        rows = []
        for name in backend.list():
            try:
                rows.append(asdict(backend.status(name)))
            except HarnessError as err:
                rows.append({"name": name, "backend": backend.name, "health": "broken", "error": str(err)})
        if args.json:
            print(json.dumps(rows, indent=2), file=out)
        else:
            _print_list(rows, out)
        return 0
    if args.action == "kubeconfig":
        print(backend.status(args.name).kubeconfig, file=out)
        return 0
    raise HarnessError(f"unknown action {args.action}")


def _validate_vendor_files(paths: list[str], out) -> int:
    """`conformance validate`: each vendor file's own checks (types, names, features, the plugin's command and
    placeholders, the manifests); all problems of all files at once, nothing contacted or started."""
    from harness.vendor import file as vendor  # lazy: subcommand

    problems: list[Problem] = []
    for path in paths:
        try:
            loaded = vendor.load(path)
        except InvalidInput as err:
            problems += err.problems
            continue
        plugin = f"; kubeletPlugin: {loaded.kubelet_plugin.command}" if loaded.kubelet_plugin else ""
        print(f"ok: {path}: drivers {', '.join(loaded.drivers)}; features "
              f"{', '.join(sorted(loaded.features)) or 'none claimed'}{plugin}", file=out)
    if problems:
        raise ConfigError(problems)
    return 0


def _validate_definitions(args, out) -> int:
    """`cluster validate`: every problem of every definition, as `cluster up --config` would refuse them."""
    problems: list[Problem] = []
    for name in args.definitions:
        try:
            cluster_config.validate(name, binaries.check_version(args.kubernetes_version, "--kubernetes-version"))
            print(f"{name}: ok", file=out)
        except (InvalidInput, ConfigError) as err:
            problems.extend(err.problems)
    if problems:
        raise ConfigError(problems)
    return 0


def _node_paths(args, out) -> int:
    """`cluster node-paths`: where a vendor's kubelet plugin must put its sockets and CDI specs on a
    local cluster's real node(s); the same values the harness fills into spec.kubeletPlugin."""
    cluster = state.load(state.validate_name(args.name))
    nodes = records(cluster.data)
    if not nodes:
        raise ConfigError([Problem("--name", args.name, "this cluster has no real node (a kubelet plugin runs only "
                                   "where a real kubelet does)", "a cluster from `cluster up --real-nodes 1`")])
    if args.node is not None:
        chosen = [n for n in nodes if n.name == args.node]
        if not chosen:
            raise ConfigError([Problem("--node", args.node, f"not a real node of cluster {args.name!r}",
                                       ", ".join(n.name for n in nodes))])
        nodes = chosen
    from harness.vendor import plugins  # lazy: subcommand

    rows = [plugins.node_paths(cluster, node) for node in nodes]
    if args.json:
        print(json.dumps(rows, indent=2), file=out)
        return 0
    for i, row in enumerate(rows):
        if i:
            print(file=out)
        width = max(map(len, row))
        for key, value in row.items():
            print(f"{key + ':':<{width + 1}} {value}", file=out)
    return 0


def _int_list(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ConfigError([Problem(flag, text, "not a comma-separated list of integers", "e.g. 10,100,1000")]) from None
    if not values:
        raise ConfigError([Problem(flag, text, "is empty", "e.g. 10,100")])
    return values


def _load(args, reporter: Reporter, out) -> int:
    from harness.jobs import load_runner  # lazy: subcommand

    if args.action == "run":
        params = scenarios.LoadParams(args.scenario, args.nodes, args.pending, args.events,
                                      devices_per_node=args.devices_per_node, users=args.users,
                                      time_limit=args.time_limit, rate=args.rate, in_flight=args.in_flight,
                                      duration=args.duration)
        summary = load_runner.run(params, report_dir=args.report_dir, web=args.web,
                                  hints=None if args.hints is None else args.hints == "on",
                                  workers=args.workers, keep_cluster=args.keep_cluster, reporter=reporter,
                                  backend_name=args.backend, kubeconfig=args.kubeconfig)
        for line in load_runner.result_lines(summary):
            print(f"{args.scenario}: {line}", file=out)
        print(f"{args.scenario}: report {args.report_dir / 'load-report.json'}, {args.report_dir / 'load-report.html'}",
              file=out)
        return 0 if not summary.get("failures") else 1
    modes = {"both": (True, False), "on": (True,), "off": (False,)}[args.hints]
    rows = load_runner.sweep(args.scenario, _int_list(args.nodes, "--nodes"), _int_list(args.pending, "--pending"),
                             args.events, report_dir=args.report_dir, hints_modes=modes,
                             devices_per_node=args.devices_per_node, time_limit=args.time_limit, reporter=reporter)
    print(f"{len(rows)} runs; {args.report_dir / 'sweep.html'}", file=out)
    return 0


MAX_VERBOSITY = 10  # klog's highest level in use


def _up_spec(args, backend: Backend) -> ClusterSpec:
    """The ClusterSpec of `cluster up`; a flag the chosen backend does not use is an error."""
    parser_defaults = {"nodes": None, "simulated_nodes": None, "real_nodes": 0, "source": "auto", "no_deploy": False, "verbosity": 1}
    given = {}
    for flag in sorted({flag for name in backends.BACKENDS for flag in backends.backend_class(name).spec_flags}):
        attr = flag.removeprefix("--").replace("-", "_")
        value = getattr(args, attr)
        given[flag] = None if value == parser_defaults.get(attr) else value
    problems = backends.unused_flags(args.backend, given)
    if not 0 <= args.verbosity <= MAX_VERBOSITY:
        problems.append(Problem("--verbosity", str(args.verbosity), "out of range",
                                f"a log level from 0 to {MAX_VERBOSITY}"))
    if problems:
        raise ConfigError(problems)
    # the same checks as `cluster validate`, before the backend builds or starts anything
    definition = cluster_config.validate(args.config, _versions(args).kubernetes) if args.config else None
    if definition is not None and args.nodes is not None:
        raise ConfigError([Problem("--nodes", str(args.nodes), "cannot be combined with --config",
                                   "set node counts in the definition's nodePools")])
    return ClusterSpec(name=args.name, nodes=3 if args.nodes is None else args.nodes, preset=args.preset,
                       feature_gates=args.feature_gates, runtime_config=args.runtime_config, definition=definition,
                       keep_on_failure=args.keep_on_failure, versions=_versions(args), binaries_dir=args.binaries_dir,
                       binary_source=args.source, real_nodes=args.real_nodes, verbosity=args.verbosity,
                       node_image=args.node_image, driver_image=args.driver_image, deploy=not args.no_deploy,
                       simulated_nodes=args.simulated_nodes, kwok_image=args.kwok_image,
                       kubeconfig=args.kubeconfig)


def _print_status(status, out) -> None:
    table = Table(title=f"cluster {status.name} ({status.backend}): {status.health}")
    for column in ("component", "pid", "state", "restarts", "log"):
        table.add_column(column)
    for comp in status.components:
        table.add_row(comp.name, str(comp.pid or ""), "running" if comp.alive else "[red]dead[/red]",
                      str(comp.restarts), comp.log or "")
    console = Console(file=out, highlight=False)
    console.print(table)
    console.print(f"kubeconfig: {status.kubeconfig}")


def _print_list(rows: list[dict], out) -> None:
    table = Table()
    for column in ("name", "backend", "health", "kubeconfig"):
        table.add_column(column)
    for row in rows:
        table.add_row(row["name"], row.get("backend", ""), row.get("health", ""), row.get("kubeconfig", ""))
    Console(file=out, highlight=False).print(table)


def _interrupt(signum, frame):
    raise KeyboardInterrupt(signum)  # the signal number becomes the exit status 128 + N


def main() -> None:
    # `kill` (SIGTERM) takes the same clean-up path as Ctrl-C.
    signal.signal(signal.SIGTERM, _interrupt)
    status = run(sys.argv[1:])
    if status >= 128:
        # Stopped by a signal, and the clean-up is done. Python would now wait for every worker
        # thread still inside an API request (node creation runs 16 of them); that wait has no
        # bound when a request hangs, so leave without it.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    sys.exit(status)


if __name__ == "__main__":
    main()
