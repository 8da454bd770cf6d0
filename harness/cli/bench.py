"""`dra-harness bench upstream`: upstream's scheduler_perf beside our matching load scenario, A/B.

Kept apart from cli.py (which only registers and dispatches) so that other commands can grow there
without touching this one.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from harness import binaries
from harness.core import conditions
from harness.core.errors import ConfigError, HarnessError, Problem
from harness.core.progress import Reporter
from harness.jobs import report, upstream_perf
from load import scenarios


def add_parser(commands) -> None:
    bench = commands.add_parser("bench", help="benchmarks beside upstream's (scheduler_perf)")
    bench_sub = bench.add_subparsers(dest="action", required=True, metavar="ACTION")
    up = bench_sub.add_parser(
        "upstream", help="build scheduler_perf (k8s.io/kubernetes) from the Go module proxy into the cache and run "
                         "its DRA workloads, alternating with our matching scenario (--ab)")
    up.add_argument("--workload", action="append", default=[], metavar="CASE/WORKLOAD",
                    help="upstream workload, repeatable (e.g. SchedulingWithResourceClaimTemplate/5000pods_500nodes)")
    up.add_argument("--list", action="store_true", help="list the workloads and their matching scenarios, then exit")
    up.add_argument("--ab", action="store_true",
                    help="after each upstream run, run our matching scenario on a fresh local cluster")
    up.add_argument("--repeats", type=int, default=1, help="A/B rounds per workload (default: 1)")
    up.add_argument("--timeout", type=float, default=1800, help="bound of each upstream run, seconds (default: 1800)")
    up.add_argument("--build-only", action="store_true", help="build (or verify) the cached test binaries only")
    up.add_argument("--report-dir", type=Path, default=Path("reports/bench-upstream"))
    up.add_argument("--kubernetes-version", default=binaries.DEFAULT_KUBERNETES, metavar="X.Y.Z")


def run(args, reporter: Reporter, out) -> int:
    if args.list:
        for name, spec in upstream_perf.WORKLOADS.items():
            print(f"{name}\t{json.dumps(spec.ours) if spec.ours else '(no matching load scenario)'}", file=out)
        return 0
    version = binaries.check_version(args.kubernetes_version, "--kubernetes-version")
    problems = [] if args.build_only else upstream_perf.check(args.workload, args.timeout)
    if not 1 <= args.repeats <= 20:
        problems.append(Problem("--repeats", str(args.repeats), "out of range", "1 to 20"))
    if args.ab:
        problems += [Problem("--workload", w, "no matching load scenario for --ab", "a workload listed by --list "
                             "with a scenario") for w in args.workload
                     if w in upstream_perf.WORKLOADS and upstream_perf.WORKLOADS[w].ours is None]
    problems += report.dir_problems(args.report_dir)
    if problems:
        raise ConfigError(problems)
    built = upstream_perf.ensure_built(version, reporter)
    if args.build_only:
        print(upstream_perf.cache_dir(version), file=out)
        return 0
    etcd_dir = upstream_perf.etcd_directory(reporter)
    report.open_dir(args.report_dir)
    rows = []
    for workload in args.workload:
        spec = upstream_perf.WORKLOADS[workload]
        for round_number in range(1, args.repeats + 1):
            cell = args.report_dir / workload.replace("/", "_") / f"round{round_number}"
            try:
                theirs = upstream_perf.run(workload, built[spec.package], cell / "upstream", version=version,
                                           etcd_dir=etcd_dir, timeout=args.timeout, reporter=reporter)
            except HarnessError as err:  # recorded; our side, the other workloads and rounds still run
                theirs = {"failed": str(err)}
                print(f"{workload} round {round_number}: upstream FAILED: {err}", file=out)
            row = {"workload": workload, "round": round_number, "upstream": theirs}
            if args.ab:
                try:
                    row["ours"] = _ours(spec, cell / "ours", reporter)
                except HarnessError as err:  # recorded like an upstream failure; the next rounds still run
                    row["ours"] = {"failed": str(err), "complete": False}
                    print(f"{workload} round {round_number}: ours FAILED: {err}", file=out)
                row["ratios"] = ratios(row["ours"], theirs)
            rows.append(row)
            for line in describe(row):
                print(line, file=out)
            # after every round: an A/B stopped part-way still leaves the rounds it finished
            (args.report_dir / "bench-upstream.json").write_text(json.dumps(rows, indent=2))
    (args.report_dir / "bench-upstream.json").write_text(json.dumps(rows, indent=2))
    print(f"report: {args.report_dir / 'bench-upstream.json'}", file=out)
    failed = [r for r in rows if "failed" in r["upstream"] or not (r.get("ours") or {}).get("complete", True)]
    return 1 if failed else 0


def _ours(spec: upstream_perf.Workload, report_dir: Path, reporter: Reporter) -> dict:
    from harness.jobs import load_runner  # lazy: only `bench upstream --ab` runs our scenario (see cli.main)

    assert spec.ours is not None
    params = scenarios.LoadParams(**spec.ours, time_limit=1800)
    summary = load_runner.run(params, report_dir=report_dir, hints=True, reporter=reporter)
    # a burst's figures, or the steady-state closed loop's (the same figures over the pods it cycled)
    burst = summary.get("throughput") or (summary.get("steady_state") or {}).get("throughput") or {}
    cond = summary.get("conditions") or {}
    pods = burst.get("bound") or summary["latency_ms"]["n"]
    return {"scenario": params.scenario, "complete": burst.get("complete", not summary.get("failures")),
            "pods": pods, "scheduling_throughput": burst.get("scheduler_perf"),
            "end_to_end_pods_per_second": burst.get("pods_per_second"), "latency_ms": summary["latency_ms"],
            "cpu_seconds": cond.get("own_cpu_seconds"), "conditions": cond,
            "report": str(report_dir / "load-report.json")}


def ratios(ours: dict, theirs: dict) -> dict:
    """ours / upstream: SchedulingThroughput Average raw, and per CPU-second of the whole run's processes
    (ours: the measured window; upstream: the whole test process, start-up included, see BENCHMARKS.md)."""
    ours_avg = (ours.get("scheduling_throughput") or {}).get("Average")
    theirs_avg = (theirs.get("scheduling_throughput") or {}).get("Average")
    result = {"raw": upstream_perf.ratio(ours_avg, theirs_avg)}
    ours_cpu, theirs_cpu = ours.get("cpu_seconds"), theirs.get("cpu_seconds")
    if ours_avg and theirs_avg and ours_cpu and theirs_cpu and not math.isclose(theirs_cpu, 0):
        # pods per CPU-second: pods of the measured burst over the CPU the stack spent on them
        theirs_pods = theirs.get("pods") or 0
        result["per_cpu_second"] = upstream_perf.ratio(ours["pods"] / ours_cpu, theirs_pods / theirs_cpu) \
            if theirs_pods else None
    return result


def describe(row: dict) -> list[str]:
    theirs = row["upstream"]
    t = theirs.get("scheduling_throughput") or {}
    lines = [] if "failed" in theirs else [
        f"{row['workload']} round {row['round']}: upstream SchedulingThroughput average {t.get('Average')} "
        f"pods/s (Perc50 {t.get('Perc50')}, Perc90 {t.get('Perc90')}), runtime "
        f"{'not reported' if theirs.get('runtime_seconds') is None else str(theirs['runtime_seconds']) + 's'}, "
        f"CPU {theirs.get('cpu_seconds')}s", "  upstream " + conditions.describe(theirs["conditions"])]
    below = theirs.get("below_upstream_threshold")
    if below:
        lines.append(f"  upstream's own threshold missed ({below['metric']} {below['statistic']} {below['got']:.1f}, "
                     f"its CI wants {below['want']:.0f}): recorded as measured, not as a failure")
    ours = row.get("ours")
    if ours and "failed" not in ours:
        o = ours.get("scheduling_throughput") or {}
        lines.append(f"  ours ({ours['scenario']}): SchedulingThroughput average {o.get('Average')} pods/s, end to end "
                     f"{ours.get('end_to_end_pods_per_second')} pods/s, {ours['pods']} pods, complete {ours['complete']}")
        if ours.get("conditions"):
            lines.append("  ours " + conditions.describe(ours["conditions"]))
        lines.append(f"  ratio ours/upstream: raw {row['ratios'].get('raw')}, per CPU-second "
                     f"{row['ratios'].get('per_cpu_second')}")
    return lines
