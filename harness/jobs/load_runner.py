"""`dra-harness load run` and `load sweep`: fresh local clusters, locust driving the scenarios, and the
reports (locust's CSV/HTML plus our JSON with the scheduler's metrics and the generator's own cost).

Each run gets its own cluster (N nodes named dev-*, each with a `load-gpu` profile of D GPUs published
by the fake driver) with SchedulerPreQueueingHints on or off, so runs never influence each other.
On a cluster the user gives (`--backend existing --kubeconfig K`) the run brings its own nodes, fake
driver and namespace instead and removes them afterwards (harness/jobs/load_guest.py).
locust runs as its own process (it patches the standard library with gevent), headless with a user
count, a run-time bound and an event budget; `--web` serves its UI on 127.0.0.1 instead, and
`--workers K` uses locust's distributed mode (a master and K worker processes).
"""

from __future__ import annotations

import csv
import html
import json
import os
import secrets
import statistics
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import yaml

from fake_devices.config import PROFILE_LABEL
from harness import backends
from harness.backends.base import ClusterSpec
from harness.config import cluster as cluster_config
from harness.core import conditions, proctime
from harness.core.errors import ConfigError, HarnessError, InvalidInput, Problem
from harness.core.progress import Reporter
from harness.jobs import load_guest, report
from harness.k8s import wait
from harness.k8s.client import Clients, check_reachable, read_kubeconfig
from load import scenarios
from load.scenarios import PROFILE_NAME, USER_CLASSES, Placement

LOCUSTFILE = Path(__file__).resolve().parents[2] / "load" / "locustfile.py"
MAX_WORKERS = 64  # locust worker processes on this machine
# The simulated nodes of a load run's own cluster renew their Leases every 30 s, not every 10 s (their
# controller-manager waits as long before it calls a node lost): an idle 500-node cluster spent 15.3 CPU-s a
# minute with 40 s leases and 7.5 with these (`benchmarks/cluster_bench.py idle`), CPU taken from the scheduler
# under test for work upstream's scheduler_perf nodes never do (BENCHMARKS.md).
LOAD_NODE_LEASE_SECONDS = 120


def _profile_yaml(devices_per_node: int, name: str = PROFILE_NAME) -> str:
    return yaml.safe_dump({
        "apiVersion": "dra-harness.x-k8s.io/v1alpha1", "kind": "NodeProfile", "metadata": {"name": name},
        "spec": {"description": f"{devices_per_node} GPUs, for load tests",
                 "numaNodes": [{"id": 0, "cpus": "0-15", "memory": "64Gi", "pcieRoots": ["pci0000:10"]}],
                 "gpus": [{"model": "T4", "count": devices_per_node, "attach": [{"pcieRoot": "pci0000:10"}]}]}})


def _definition(params: scenarios.LoadParams, work: Path):
    profile_file = work / f"{PROFILE_NAME}.yaml"
    profile_file.write_text(_profile_yaml(params.devices_per_node))
    return cluster_config.parse({
        "apiVersion": cluster_config.API_VERSION, "kind": "Cluster", "metadata": {"name": "load"},
        "spec": {"driver": {"instance": "load", "domain": "load.example.com"},
                 "nodePools": [{"name": "dev", "count": params.nodes, "profile": str(profile_file)}]}}, "(load run)")


def percentile(values: list[float], p: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def gives_cluster(backend_class) -> bool:
    """A backend that attaches to a cluster the user gives rather than starting one (Backend.attaches)."""
    return backend_class.attaches


def check_run_flags(backend_name: str, *, workers: int = 0, hints: bool | None = None,
                    keep_cluster: bool = False, in_flight: int = 0) -> list[Problem]:
    """The flags of `load run` that the chosen backend cannot honour, or that do not go together
    (pure: nothing is contacted)."""
    backend_class = backends.backend_class(backend_name)
    problems = [] if 0 <= workers <= MAX_WORKERS else [
        Problem("--workers", str(workers), "out of range",
                f"0 (locust in one process) to {MAX_WORKERS} worker processes")]
    if in_flight > 0 and workers > in_flight:  # every worker needs a user, and each user keeps one pod waiting
        problems.append(Problem("--workers", str(workers), f"more worker processes than pods the closed loop keeps "
                                f"waiting (--in-flight {in_flight}): each worker runs at least one locust user, and "
                                "each user keeps one pod waiting", f"at most {in_flight}"))
    if gives_cluster(backend_class):
        if hints is not None:
            problems.append(Problem("--hints", "on" if hints else "off", f"--backend {backend_name} runs on a "
                                    "cluster you give, whose feature gates (SchedulerPreQueueingHints) are its own",
                                    "leave --hints out, or use --backend local"))
        if keep_cluster:
            problems.append(Problem("--keep-cluster", "(set)", f"--backend {backend_name} never stops the cluster "
                                    "you give, and always removes the run's own objects from it",
                                    "leave --keep-cluster out"))
    elif not backend_class.names_its_nodes:
        allowed = [n for n in backends.BACKENDS if backends.backend_class(n).names_its_nodes
                   or gives_cluster(backends.backend_class(n))]
        problems.append(Problem("--backend", backend_name, "the load scenarios address their nodes as dev-0..N-1 "
                                "(the load definition's pool), and this backend names its nodes itself",
                                ", ".join(allowed)))
    return problems


def run(params: scenarios.LoadParams, *, report_dir: Path, hints: bool | None = None, web: bool = False,
        workers: int = 0, keep_cluster: bool = False, reporter: Reporter | None = None, name: str | None = None,
        backend_name: str = "local", kubeconfig: str | None = None) -> dict:
    """One scenario on one fresh cluster, or as a guest on a given one (`--backend existing`); returns
    the summary also written to load-report.json. `hints`: SchedulerPreQueueingHints of the cluster
    the run starts (None: on); a given cluster keeps its own."""
    backend_class = backends.backend_class(backend_name)
    given = gives_cluster(backend_class)
    problems = check_run_flags(backend_name, workers=workers, hints=hints, keep_cluster=keep_cluster,
                               in_flight=params.in_flight if params.closed_loop else 0)
    try:
        scenarios.validate(params)
    except InvalidInput as err:
        problems = err.problems + problems
    if problems:
        raise ConfigError(problems)
    if given:
        kubeconfig = str(_check_given_cluster(backend_name, kubeconfig))
    report.open_dir(report_dir, "--report-dir")
    # Absolute: the files written here (the load profile, locust's results) are read by processes
    # that run in other directories (the fake driver, locust).
    report_dir = report_dir.resolve()
    reporter = reporter or Reporter()
    name = name or f"load-{params.scenario}-{os.getpid() % 10000}"
    backend = backend_class(reporter)
    work = report_dir / ".work"
    work.mkdir(exist_ok=True)
    placement = Placement.guest(params.scenario, secrets.token_hex(3)) if given else Placement.own(params.scenario)
    if given:  # the run's objects only; the cluster is attached to, never changed or stopped
        info = backend.up(ClusterSpec(name=name, kubeconfig=kubeconfig, deploy=False))
    else:
        info = backend.up(ClusterSpec(name=name, definition=_definition(params, work),
                                      feature_gates=f"SchedulerPreQueueingHints={str(hints is not False).lower()}",
                                      owner=None if keep_cluster else proctime.identity(),
                                      node_lease_seconds=LOAD_NODE_LEASE_SECONDS))
    try:
        guest = None
        try:
            if given:
                profile_file = work / f"{placement.profile}.yaml"
                profile_file.write_text(_profile_yaml(params.devices_per_node, placement.profile))
                guest = load_guest.GuestRun(info.kubeconfig, placement, nodes=params.nodes, profile_file=profile_file,
                                            with_devices=scenarios.SCENARIOS[params.scenario].devices_at_start,
                                            reporter=reporter)
                guest.start()
            elif not scenarios.SCENARIOS[params.scenario].devices_at_start:
                with reporter.step(f"taking the devices away from {params.nodes} nodes (they come back as events)"):
                    _strip_profiles(Clients(info.kubeconfig), params.nodes)
            results_file = report_dir / "scenario.json"
            results_file.unlink(missing_ok=True)
            command = _locust_command(params, info, placement, report_dir, results_file, web=web, workers=workers)
            hints_text = "the cluster's own hints" if given else f"hints {'on' if hints is not False else 'off'}"
            with reporter.step(f"locust: {params.scenario}, {params.nodes} nodes, {params.pending} waiting pods, "
                               f"{params.events} events, {hints_text}"):
                _run_locust(command, params, workers, report_dir)
            if not results_file.exists():
                raise HarnessError("locust finished without results", hint=f"see {report_dir / 'locust.log'}",
                                   log_file=report_dir / "locust.log")
            scenario_result = json.loads(results_file.read_text())
        finally:
            if guest is not None:
                guest.close()
    finally:
        if given:
            backend.down(name)  # the record of the attachment only
        elif not keep_cluster:
            with reporter.step(f"stopping cluster {name!r}"):
                backend.down(name)
    latencies = scenario_result["latencies_ms"]
    aggregate = scenario_result.get("locust") or {}
    if latencies or params.burst or not workers:  # this process measured (even if nothing)
        latency = {"n": len(latencies), "p50": percentile(latencies, 50), "p90": percentile(latencies, 90),
                   "p99": percentile(latencies, 99),
                   "mean": round(statistics.mean(latencies), 2) if latencies else None,
                   "max": max(latencies) if latencies else None, "source": "harness"}
        # the closed loop's --events is a bound, not a target: what counts is every arrival it made
        failures: int | None = (scenario_result["events"] if params.closed_loop else params.events) - len(latencies)
    else:  # distributed: the workers measured; the master has locust's aggregate only
        latency = {"n": aggregate.get("requests", 0) - aggregate.get("failures", 0), "p50": aggregate.get("p50_ms"),
                   "p99": aggregate.get("p99_ms"), "source": "locust aggregate (workers)"}
        failures = aggregate.get("failures")
    if params.burst and "throughput" in scenario_result:  # every pod of the burst created and bound, or the run failed
        burst = scenario_result["throughput"]
        failures = burst["not_created"] + burst["unbound"]
    summary = {"params": asdict(params), "hints": None if given else hints is not False, "cluster": name,
               "backend": backend_name, "workers": workers,
               "latency_ms": latency, "failures": failures,
               "failure_reasons": failure_reasons(params, scenario_result, failures, report_dir),
               **{k: v for k, v in scenario_result.items() if k not in ("latencies_ms",)}}
    (report_dir / "load-report.json").write_text(json.dumps(summary, indent=2))
    write_html(summary, report_dir / "load-report.html")
    return summary


def _check_given_cluster(backend_name: str, kubeconfig: str | None) -> Path:
    """A load run on a cluster the user gives: its kubeconfig is checked before anything is created
    (missing, unusable or unreachable: a located ConfigError); returns its path."""
    raw = kubeconfig or os.environ.get("KUBECONFIG")
    where = "--kubeconfig" if kubeconfig else "$KUBECONFIG"
    if not raw:
        raise ConfigError([Problem("--kubeconfig", "(not set)", f"--backend {backend_name} needs the cluster's "
                                   "kubeconfig", "--kubeconfig FILE or the KUBECONFIG variable")])
    read_kubeconfig(raw, where)
    clients = Clients(Path(raw).expanduser())
    try:
        check_reachable(clients, f"{where} {raw}")
    finally:
        clients.close()
    return Path(raw).expanduser()


def failure_reasons(params: scenarios.LoadParams, result: dict, failures: int | None, report_dir: Path) -> list[str]:
    """One line per event that was not measured: the locust file's reason for each failed event, and
    why events were never fired at all."""
    failed = [f["reason"] for f in result.get("failed_events", [])]
    if result.get("setup_error"):  # nothing was fired: the set-up's reason is the whole story
        return [f"the set-up failed, no event was fired: {result['setup_error']} (see {report_dir / 'locust.log'})"]
    if params.burst or not failures:
        return failed
    fired = result.get("events", 0)
    unfired = 0 if params.closed_loop else max(0, params.events - fired)
    reasons = list(failed)
    if unfired:
        setup = result.get("setup_seconds")
        reasons.append(f"{unfired} of {params.events} events never fired: the run ended after {fired} "
                       f"(--time-limit {params.time_limit:g}s" + (f", set-up took {setup:g}s of it" if setup else "")
                       + f"; see {report_dir / 'locust.log'})")
    unexplained = failures - len(failed) - unfired
    if unexplained > 0:
        reasons.append(f"{unexplained} events fired but neither measured nor failed; see {report_dir / 'locust.log'}")
    return reasons


def result_lines(summary: dict) -> list[str]:
    """The run's outcome in a few lines, for the console and the HTML report."""
    lines = []
    burst = summary.get("throughput")
    if burst:
        e2e, creation, upstream = burst.get("end_to_end") or {}, burst.get("creation") or {}, burst.get("scheduler_perf")
        lines.append(f"{burst['bound']} of {burst['burst']} burst pods bound; end to end "
                     f"{e2e.get('pods_per_second')} pods/s over {e2e.get('seconds')}s; created at "
                     f"{creation.get('pods_per_second')} pods/s over the {creation.get('seconds')}s creation window")
        if upstream:
            lines.append(f"scheduler_perf SchedulingThroughput: average {upstream['Average']} pods/s, "
                         f"Perc50 {upstream['Perc50']}, Perc90 {upstream['Perc90']}, Perc95 {upstream['Perc95']}, "
                         f"Perc99 {upstream['Perc99']} ({upstream['samples']} one-second samples)")
        if not burst["complete"]:
            lines.append(f"FAILED: {burst['not_created']} pods not created, {burst['unbound']} created but not bound:")
            lines += [f"  {count} x {reason}" for reason, count in burst["reasons"].items()]
    else:
        latency = summary["latency_ms"]
        lines.append(f"{latency['n']} events, p50 {latency['p50']} ms, p99 {latency['p99']} ms; "
                     f"failures {summary['failures']}")
        steady = summary.get("steady_state")
        if steady and steady.get("mode") == "closed loop":
            flow, upstream = steady["throughput"], steady["throughput"].get("scheduler_perf") or {}
            lines.append(f"steady state, closed loop: {steady['in_flight']} pods waiting at once (at most "
                         f"{steady['most_waiting_at_once']} seen) for {steady['duration']:g}s: {flow['bound']} of "
                         f"{flow['pods']} pods bound, {flow.get('pods_per_second')} pods/s end to end; "
                         f"scheduler_perf SchedulingThroughput average {upstream.get('Average')} pods/s "
                         f"(Perc50 {upstream.get('Perc50')}, {upstream.get('samples')} one-second samples)")
        elif steady:
            lines.append(f"steady state: {steady['arrivals']} arrivals at {steady['rate']:g}/s, "
                         f"{steady['late_arrivals']} late (max lag {steady['max_lag_seconds']}s)")
        lines += requeue_lines(summary.get("requeueCorrectness"))
        lines += [f"  {row['kind']}: not fired: {row['reason']}" for row in summary.get("requeueCorrectnessLeftOut") or []]
        if summary.get("failures"):  # each failed or unmeasured event, and why
            lines += [f"  - {reason}" for reason in summary.get("failure_reasons")
                      or ["(no reason recorded; see locust.log)"]]
    lines.append(f"missed requeues {summary.get('scheduler', {}).get('missedRequeues')}")
    if summary.get("conditions"):
        lines.append(conditions.describe(summary["conditions"]))
        lines += cpu_by_role_lines(summary)
    return lines


def cpu_by_role_lines(summary: dict) -> list[str]:
    """Where the run's own CPU went over the measured window, per process role, and per measured pod for a burst."""
    by_role = summary["conditions"].get("own_cpu_by_role") or {}
    if not by_role:
        return []
    burst = summary.get("throughput") or {}
    pods = burst.get("bound") or 0
    parts = [f"{name} {seconds:g} s" + (f" ({1000 * seconds / pods:.1f} ms/pod)" if pods else "")
             for name, seconds in by_role.items()]
    return [f"own CPU by process: {', '.join(parts)}"]


def requeue_lines(rows: list[dict] | None) -> list[str]:
    """requeue-correctness: one line per kind, MISSED naming the pods a kind's event did not free in time."""
    lines = []
    for row in rows or []:
        outcome = (f"MISSED {row['missed']} ({', '.join(row['missedPods'][:5])})" if row["missed"]
                   else "none missed")
        lines.append(f"  {row['kind']}: {row['requeued']} of {row['events']} requeued within {row['boundMs'] / 1000:g}s, "
                     f"{outcome}; p50 {row['p50_ms']} ms, p99 {row['p99_ms']} ms")
    return lines


def write_html(summary: dict, path: Path) -> None:
    """A one-page report: the outcome, the conditions (with a CONTENDED banner) and the full JSON."""
    contended = (summary.get("conditions") or {}).get("contended")
    banner = ("<p style='background:#fdd;padding:6px'><b>CONTENDED</b>: other processes took more than 10% of "
              "the machine during the measured window; the figures are not trustworthy.</p>" if contended else "")
    body = "".join(f"<li>{html.escape(line)}</li>" for line in result_lines(summary))
    hints = {True: "hints on", False: "hints off"}.get(summary["hints"], "the cluster's own hints")
    path.write_text(f"<!doctype html><html><head><meta charset='utf-8'><title>load: {html.escape(summary['params']['scenario'])}"
                    f"</title></head><body style='font-family:sans-serif'><h1>{html.escape(summary['params']['scenario'])}"
                    f", {hints}</h1>{banner}<ul>{body}</ul>"
                    "<p>Locust's own report: <a href='locust.html'>locust.html</a></p>"
                    f"<pre>{html.escape(json.dumps(summary, indent=2))}</pre></body></html>")


def _strip_profiles(clients, nodes: int) -> None:
    try:
        for i in range(nodes):
            clients.core.patch_node(f"dev-{i}", {"metadata": {"labels": {PROFILE_LABEL: None}}})
        wait.until("the driver to withdraw every slice", lambda: not clients.resource.list_resource_slice().items, 120)
    finally:
        clients.close()


def _locust_command(params, info, placement: Placement, report_dir: Path, results_file: Path, *, web: bool,
                    workers: int) -> list[str]:
    user_class = USER_CLASSES[params.scenario]
    # throughput: enough concurrent creators that pod creation outpaces the scheduler (see BENCHMARKS.md)
    users = params.users if not params.burst else max(params.users, 64)
    users = params.in_flight if params.closed_loop else users  # closed loop: one user per pod kept waiting
    users = max(users, workers)  # locust gives each worker its part of the users: a worker without one never ends
    command = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), user_class, "-u", str(users), "-r", str(users),
               "--run-time", f"{int(params.time_limit)}s", "--stop-timeout", "10",
               "--csv", str(report_dir / "locust"), "--html", str(report_dir / "locust.html"),
               "--kubeconfig", str(info.kubeconfig), "--scenario", params.scenario, "--nodes", str(params.nodes),
               "--pending", str(params.pending), "--events", str(params.events),
               "--devices-per-node", str(params.devices_per_node), *placement.locust_args(),
               "--scheduler-metrics-url", info.metrics.get("kube-scheduler", ""),
               "--results-file", str(results_file), "--event-timeout", str(params.event_timeout),
               "--setup-timeout", str(params.setup_timeout),
               "--rate", str(params.rate), "--in-flight", str(params.in_flight), "--duration", str(params.duration),
               "--conditions-root-pid", str(os.getpid()),  # the run's own processes: this one and its children
               "--loglevel", "WARNING"]
    if web:
        command += ["--web-host", "127.0.0.1", "--autostart", "--autoquit", "60"]
    else:
        command += ["--headless"]
    if workers:
        command += ["--master", "--master-bind-host", "127.0.0.1", "--expect-workers", str(workers)]
    return command


def _run_locust(command: list[str], params, workers: int, report_dir: Path) -> None:
    log = open(report_dir / "locust.log", "w")
    procs = [subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)]
    try:
        worker_command = [c for c in command[:5]] + ["--worker", "--master-host", "127.0.0.1"] + \
            command[command.index("--kubeconfig"):command.index("--loglevel")]
        for _ in range(workers):
            procs.append(subprocess.Popen(worker_command, stdout=log, stderr=subprocess.STDOUT))
        # Bounded: locust stops itself at --run-time; this is the backstop for set-up that hangs.
        deadline = time.monotonic() + params.time_limit + 900
        while procs[0].poll() is None:
            if time.monotonic() > deadline:
                raise HarnessError(f"locust did not finish within {params.time_limit + 900:.0f}s",
                                   log_file=report_dir / "locust.log")
            time.sleep(0.5)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
        log.close()


def sweep(scenario: str, nodes: list[int], pending: list[int], events: int, *, report_dir: Path,
          hints_modes=(True, False), devices_per_node: int = 4, time_limit: float = 600,
          reporter: Reporter | None = None) -> list[dict]:
    """Run `scenario` over nodes x pending x hints on/off, each on a fresh cluster; write JSON, CSV, plots."""
    reporter = reporter or Reporter()
    for n in nodes:  # refuse the whole grid up front rather than fail half-way through
        for p in pending:
            scenarios.validate(scenarios.LoadParams(scenario, n, p, scenarios.sweep_events(scenario, events, p),
                                                    devices_per_node=devices_per_node, time_limit=time_limit))
    report.open_dir(report_dir, "--report-dir")
    rows = []
    for n in nodes:
        for p in pending:
            for hints in hints_modes:
                params = scenarios.LoadParams(scenario, n, p, scenarios.sweep_events(scenario, events, p),
                                              devices_per_node=devices_per_node, time_limit=time_limit)
                cell = report_dir / f"{scenario}-n{n}-p{p}-hints-{'on' if hints else 'off'}"
                summary = run(params, report_dir=cell, hints=hints, reporter=reporter)
                rows.append({"scenario": scenario, "nodes": n, "pending": p, "hints": hints,
                             "p50_ms": summary["latency_ms"]["p50"], "p99_ms": summary["latency_ms"]["p99"],
                             "events": summary["latency_ms"]["n"], "failures": summary["failures"],
                             "pods_per_second": (summary.get("throughput") or {}).get("pods_per_second"),
                             "scheduler_perf_average": ((summary.get("throughput") or {}).get("scheduler_perf")
                                                        or {}).get("Average"),
                             "creation_pods_per_second": (((summary.get("throughput") or {}).get("creation")
                                                           or {}).get("pods_per_second")),
                             "missed_requeues": (summary.get("scheduler") or {}).get("missedRequeues"),
                             "generator_cpu_percent": summary["generator"]["cpu_percent"],
                             "generator_pods_per_second": summary["generator"]["pods_created_per_second"],
                             "others_cpu_percent": (summary.get("conditions") or {}).get("others_percent_of_machine"),
                             "contended": (summary.get("conditions") or {}).get("contended")})
    write_sweep(rows, report_dir)
    return rows


def write_sweep(rows: list[dict], report_dir: Path) -> None:
    from load import plots  # lazy: matplotlib (a second or more to import) is for `load sweep` only

    report_dir.mkdir(parents=True, exist_ok=True)
    (report_dir / "sweep.json").write_text(json.dumps(rows, indent=2))
    with open(report_dir / "sweep.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]) if rows else ["scenario"])
        writer.writeheader()
        writer.writerows(rows)
    plots.write(rows, report_dir)
