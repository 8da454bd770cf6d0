"""The requeue-cost curve (issue 13): per unblocking event, the scheduler's CPU per event and the
requeue latency as the number of waiting pods grows, SchedulerPreQueueingHints on and off, with
confidence intervals and a verdict on how the cost grows (results in BENCHMARKS.md):

    .venv/bin/python benchmarks/requeue_curve.py [--scenario device-freed] [--nodes 1000]
        [--waiting 100,1000,5000] [--events 20] [--repeats 5] [--devices-per-node 1]
        [--report-dir reports/requeue-curve]

Each run is `dra-harness load run` on a fresh cluster. Order: for each repetition, for each size, the
two modes in alternating order (on/off, then off/on), so neither mode always runs first or on a
warmer machine. Cost per event = the scheduler's own CPU (its process_cpu_seconds_total) over the
measured window / events measured. Writes curve.json, curve.csv, curve.md (the tables BENCHMARKS.md
shows) and a plot per metric, and prints
per mode the log-log verdict, the straight-line fit and the shape from a + b*N + c*N^2: constant,
linear, sub-linear or quadratic in the waiting pods, or undecided. `--merge CURVE_JSON` adds earlier
sweeps' rows; with `--repeats 0` it only aggregates and plots them.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import time
from pathlib import Path

import bench_backend  # benchmarks/ is the script's directory

from harness.core.errors import HarnessError, InvalidInput, Problem
from harness.core.progress import Reporter
from harness.jobs import load_runner
from load import curve, scenarios

METRICS = {"scheduler_cpu_ms_per_event": "scheduler CPU per event (ms)", "p50_ms": "requeue latency p50 (ms)"}


def one_run(params: scenarios.LoadParams, hints: bool, report_dir: Path) -> dict:
    try:
        summary = load_runner.run(params, report_dir=report_dir, hints=hints, reporter=Reporter(quiet=True))
    except HarnessError as err:  # one failed run is a row with its error; the sweep goes on
        return {"scenario": params.scenario, "nodes": params.nodes, "waiting": params.pending, "hints": hints,
                "events": 0, "failures": params.events, "p50_ms": None, "p99_ms": None,
                "scheduler_cpu_ms_per_event": None, "missed_requeues": None, "others_percent": None,
                "contended": None, "report": str(report_dir), "error": str(err).splitlines()[0][:300]}
    measured = summary["latency_ms"]["n"]
    cpu = (summary.get("scheduler_window") or {}).get("cpuSeconds")
    cond = summary.get("conditions") or {}
    settle = (summary.get("queue_settle") or {}).get("after") or {}
    window = summary.get("scheduler_window") or {}
    attempts = (window.get("incomingByEvent") or {}).get("ScheduleAttemptFailure")
    return {"scenario": params.scenario, "nodes": params.nodes, "waiting": params.pending, "hints": hints,
            "events": measured, "failures": summary["failures"], "p50_ms": summary["latency_ms"]["p50"],
            "p99_ms": summary["latency_ms"]["p99"],
            "scheduler_cpu_ms_per_event": round(1000 * cpu / measured, 2) if cpu and measured else None,
            "missed_requeues": (summary.get("scheduler") or {}).get("missedRequeues"),
            "others_percent": cond.get("others_percent_of_machine"), "contended": cond.get("contended"),
            # after the last event: how long the scheduler took to retry what the events requeued (inside
            # the window, so inside the cost per event)
            "settle_seconds": settle.get("seconds"), "settled": settle.get("settled"),
            # where the CPU went: failed scheduling attempts (retries) and queueing-hint evaluations
            "failed_attempts": attempts, "hint_evaluations": sum((window.get("hints") or {}).values()),
            "scheduler_cpu_ms_per_failed_attempt": round(1000 * cpu / attempts, 2) if cpu and attempts else None,
            "report": str(report_dir / "load-report.json")}


def aggregate(rows: list[dict], sizes: list[int]) -> dict:
    """Per metric and mode: mean with 95 % interval per size, the log-log fit and its verdict. Runs whose
    scheduler never settled are left out: their window ended at the settle bound, not when the events'
    retries were done, so their cost per event is the bound's, not the events' (`unsettled` lists them)."""
    result: dict = {"unsettled": [{"waiting": r["waiting"], "hints": r["hints"], "repeat": r.get("repeat")}
                                  for r in rows if r.get("settled") is False]}
    for metric in METRICS:
        for hints in (True, False):
            mode = f"hints {'on' if hints else 'off'}"
            mine = [r for r in rows if r["hints"] == hints and r.get("settled") is not False]
            per_size = {size: curve.mean_ci([r[metric] for r in mine if r["waiting"] == size]) for size in sizes}
            points = [(r["waiting"], r[metric]) for r in mine if r[metric] is not None]
            fit = curve.loglog_slope(points)
            linear = curve.linear_fit(points)
            quadratic = curve.quadratic_fit(points)
            label = f"{METRICS[metric]}, {mode}"
            result.setdefault(metric, {})[mode] = {
                "per_size": per_size, "fit": fit, "verdict": curve.verdict(label, fit),
                "linear": linear, "linear_text": curve.describe_linear(label, linear),
                # the shape from a + b*N + c*N^2: what the verdict rests on when a fixed part bends the log-log
                "quadratic": quadratic, "shape": curve.shape(quadratic),
                "shape_text": curve.describe_shape(label, quadratic)}
    return result


def plot(summary: dict, sizes: list[int], report_dir: Path, scenario: str) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    for metric, label in METRICS.items():
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for mode, data in summary[metric].items():
            xs = [s for s in sizes if data["per_size"][s]["mean"] is not None]
            ys = [data["per_size"][s]["mean"] for s in xs]
            errors = [data["per_size"][s]["ci95"] or 0 for s in xs]
            ax.errorbar(xs, ys, yerr=errors, marker="o", capsize=4, label=mode)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("waiting pods")
        ax.set_ylabel(label)
        ax.set_title(f"{scenario}: {label} (mean, 95 % CI)")
        ax.legend()
        path = report_dir / f"{scenario}-{metric}.png"
        fig.savefig(path, dpi=100, bbox_inches="tight")
        plt.close(fig)
        files.append(path)
    return files


def _mean_text(cell: dict, digits: int = 0) -> str:
    if cell["mean"] is None:
        return "-"
    return f"{cell['mean']:.{digits}f}" + (f" ± {cell['ci95']:.{digits}f}" if cell["ci95"] is not None else "")


def _runs_text(values: list, digits: int = 1) -> str:
    shown = [f"{v:.{digits}f}" if isinstance(v, float) and digits else str(round(v)) for v in values if v is not None]
    return ", ".join(shown) or "-"


def markdown(rows: list[dict], summary: dict, sizes: list[int], scenario: str) -> str:
    """The fits row per mode and the per-size table, as BENCHMARKS.md shows them (curve.md), so the
    tables there are copied from the data, not typed."""
    cpu = summary["scheduler_cpu_ms_per_event"]
    lines = ["| event | hints | shape (a + b·N + c·N²) | straight line: ms + ms per waiting pod | b, ms per waiting "
             "pod (quadratic fit) | c, ms per waiting pod² | log-log slope | runs |", "|---|---|---|---|---|---|---|---|"]
    for mode, data in cpu.items():
        line, quad, fit = data["linear"], data["quadratic"], data["fit"]
        straight = "-" if line.get("slope") is None else (
            f"{line['intercept']:.0f} + {line['slope']:.3f}" + (f" ± {line['slope_ci95']:.3f}" if line.get("slope_ci95")
                                                                 is not None else "")
            + (f" (R² {line['r2']:.3f})" if line.get("r2") is not None else ""))
        b = "-" if quad.get("b") is None else f"{quad['b']:.3f} ± {quad['b_ci95']:.3f}"
        c = "-" if quad.get("c") is None else f"{quad['c']:.1e} ± {quad['c_ci95']:.1e}"
        slope = "-" if fit.get("slope") is None else f"{fit['slope']:.2f}" + (
            f" ± {fit['ci95']:.2f}" if fit.get("ci95") is not None else "")
        lines.append(f"| {scenario} | {mode.split()[-1]} | {data['shape']} | {straight} | {b} | {c} | {slope} | "
                     f"{line.get('n') or fit.get('n', 0)} |")
    contended = sum(1 for r in rows if r.get("contended"))
    others = max((r.get("others_percent") or 0.0 for r in rows), default=0.0)
    missed = sorted({r.get("missed_requeues") for r in rows if r.get("missed_requeues") is not None})
    lines += ["", f"**{scenario}** ({len(rows)} runs, {contended} contended, others at most {others:.1f} % of the "
              f"machine, `missedRequeues` {', '.join(str(round(m)) for m in missed) or '-'})", "",
              "| waiting pods | hints | runs | scheduler CPU per event, ms: mean ± 95 % CI | latency p50, ms: mean ± "
              "95 % CI | p99 per run, ms | failed attempts per run | CPU per failed attempt, ms | retries settled after "
              "the last event, s |", "|---|---|---|---|---|---|---|---|---|"]
    for size in sizes:
        for hints in (True, False):
            mode = f"hints {'on' if hints else 'off'}"
            cell = [r for r in rows if r["waiting"] == size and r["hints"] == hints]
            settled = [r for r in cell if r.get("settled") is not False]
            if settled:
                # no ScheduleAttemptFailure in a run's window is 0 failed attempts (the counter never moved)
                attempts = [r.get("failed_attempts") or 0 for r in settled if not r.get("error")]
                per_attempt = [r["scheduler_cpu_ms_per_failed_attempt"] for r in settled
                               if r.get("scheduler_cpu_ms_per_failed_attempt") is not None]
                lines.append(
                    f"| {size} | {mode.split()[-1]} | {len(settled)} | "
                    f"{_mean_text(summary['scheduler_cpu_ms_per_event'][mode]['per_size'][size])} | "
                    f"{_mean_text(summary['p50_ms'][mode]['per_size'][size])} | "
                    f"{_runs_text([r.get('p99_ms') for r in settled], 0)} | "
                    f"{round(statistics.fmean(attempts)) if attempts else '-'} | "
                    f"{f'{statistics.fmean(per_attempt):.1f}' if per_attempt else '-'} | "
                    f"{_runs_text([r.get('settle_seconds') for r in settled])} |")
            for r in cell:
                if r.get("settled") is False:
                    shown = {key: "-" if r.get(key) is None else r[key] for key in (
                        "scheduler_cpu_ms_per_event", "p50_ms", "p99_ms", "failed_attempts",
                        "scheduler_cpu_ms_per_failed_attempt", "settle_seconds")}
                    lines.append(f"| {size} | {mode.split()[-1]} | 1 | {shown['scheduler_cpu_ms_per_event']} (not "
                                 f"settled: left out) | {shown['p50_ms']} | {shown['p99_ms']} | "
                                 f"{shown['failed_attempts']} | {shown['scheduler_cpu_ms_per_failed_attempt']} | "
                                 f"{shown['settle_seconds']} (bound) |")
    return "\n".join(lines) + "\n"


ALLOWED = ("local",)
WHY_LOCAL = ("compares SchedulerPreQueueingHints on and off, which only a cluster the benchmark starts can "
             "switch (each run is `load run` on a fresh local cluster)")


def write_results(rows: list[dict], sizes: list[int], report_dir: Path) -> dict:
    """curve.json (rows and their summary) and curve.csv for the runs so far; returns the summary."""
    summary = aggregate(rows, sizes)
    (report_dir / "curve.json").write_text(json.dumps({"rows": rows, "summary": summary}, indent=2))
    (report_dir / "curve.md").write_text(markdown(rows, summary, sizes, rows[0]["scenario"] if rows else "?"))
    with open(report_dir / "curve.csv", "w", newline="") as handle:
        fields = list(dict.fromkeys(key for row in rows for key in row))
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    return summary


def _csv_value(text: str):
    """A curve.csv cell back as the value its row had: bool, int, float, None or text."""
    if text in ("True", "False"):
        return text == "True"
    if text == "":
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _read_rows(path: Path) -> list:
    if path.suffix == ".csv":  # a curve.csv, e.g. the rows committed under docs/benchmarks/
        with open(path, newline="") as handle:
            return [{key: _csv_value(value) for key, value in row.items()} for row in csv.DictReader(handle)]
    return json.loads(path.read_text())["rows"]


def merged_rows(files: list[Path], scenario: str, nodes: int) -> list[dict]:
    """The rows of earlier sweeps' curve.json or curve.csv files; InvalidInput naming the file and field
    when one is not such a file, or was measured for another scenario or node count."""
    rows: list[dict] = []
    allowed = "a curve.json or curve.csv this script wrote"
    for path in files:
        try:
            found = _read_rows(path)
            if not isinstance(found, list) or not all(isinstance(r, dict) for r in found):
                raise TypeError
        except OSError as err:
            raise InvalidInput([Problem(f"--merge {path}", "(file)", f"cannot be read: {err.strerror}",
                                        allowed)]) from None
        except (ValueError, KeyError, TypeError, csv.Error):
            raise InvalidInput([Problem(f"--merge {path}", "rows", "not a curve.json or curve.csv of rows",
                                        allowed)]) from None
        for index, row in enumerate(found):
            for field, wanted in (("scenario", scenario), ("nodes", nodes)):
                if row.get(field) != wanted:
                    raise InvalidInput([Problem(f"--merge {path}", f"rows[{index}].{field}",
                                                f"{row.get(field)!r} is not this sweep's --{field}", repr(wanted))])
        rows += found
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="device-freed",
                        choices=["device-freed", "slice-added", "taint-removed", "class-created", "claim-shared"])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--waiting", default="100,1000,5000", help="comma-separated waiting-pod counts")
    parser.add_argument("--events", type=int, default=20, help="events per run")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--devices-per-node", type=int, default=1)
    parser.add_argument("--time-limit", type=float, default=1800, help="bound of each run, seconds")
    parser.add_argument("--report-dir", type=Path, default=Path("reports/requeue-curve"))
    parser.add_argument("--merge", type=Path, action="append", default=[], metavar="CURVE_JSON",
                        help="rows of an earlier sweep (its curve.json or curve.csv) of the same scenario and nodes, aggregated "
                             "with this one's (e.g. the largest size swept on its own); repeatable")
    bench_backend.add_flags(parser, ALLOWED)
    return bench_backend.resolve(parser, parser.parse_args(argv), ALLOWED, WHY_LOCAL)


def plan(args: argparse.Namespace) -> tuple[list[int], dict[int, scenarios.LoadParams], list[dict]]:
    """The sizes, each size's run parameters and the merged earlier rows; InvalidInput naming the flag when
    the command line cannot make a sweep."""
    try:
        sizes = sorted({int(x) for x in args.waiting.split(",") if x.strip()})
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise InvalidInput([Problem("--waiting", args.waiting, "not a list of waiting-pod counts",
                                    "comma-separated counts of at least 1, e.g. 100,1000,5000")])
    # An interval needs two runs per size: from this sweep alone, or with the rows merged from earlier ones;
    # --repeats 0 with --merge runs nothing and only aggregates and plots the merged rows.
    least = 0 if args.merge else 2
    if not least <= args.repeats <= 50:
        raise InvalidInput([Problem("--repeats", str(args.repeats), "out of range",
                                    f"{least} to 50" + ("" if args.merge else " (0 and 1 only with --merge)"))])
    grid = {size: scenarios.validate(scenarios.LoadParams(
        args.scenario, args.nodes, size, min(args.events, size), devices_per_node=args.devices_per_node,
        time_limit=args.time_limit)) for size in sizes}
    return sizes, grid, merged_rows(args.merge, args.scenario, args.nodes)


def main() -> int:
    args = parse_args()
    try:
        sizes, grid, earlier = plan(args)
    except InvalidInput as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    args.report_dir.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    all_sizes = sorted(set(sizes) | {r["waiting"] for r in earlier})
    started = time.monotonic()
    # Repetitions go on from the merged ones: new cells get new names, and the on/off order keeps alternating.
    done = max((r.get("repeat", 0) for r in earlier), default=0)
    summary = write_results(earlier, all_sizes, args.report_dir) if earlier else {}
    try:
        for repeat in range(done, done + args.repeats):
            for size in sizes:
                order = (True, False) if (repeat + sizes.index(size)) % 2 == 0 else (False, True)
                for hints in order:
                    cell = args.report_dir / f"w{size}-r{repeat + 1}-hints-{'on' if hints else 'off'}"
                    row = {**one_run(grid[size], hints, cell), "repeat": repeat + 1}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                    # Written after every run: a sweep stopped after some repetitions still leaves its data.
                    summary = write_results(earlier + rows, all_sizes, args.report_dir)
            plot(summary, all_sizes, args.report_dir, args.scenario)
    except KeyboardInterrupt:  # Ctrl-C: the run in progress cleaned up after itself; say what is kept
        print(f"interrupted after {len(rows)} runs of this sweep; they are in {args.report_dir / 'curve.json'} "
              "(the interrupted run is not)", file=sys.stderr)
        return 130
    if not args.repeats:
        plot(summary, all_sizes, args.report_dir, args.scenario)
    contended = sum(1 for r in earlier + rows if r["contended"])
    failed = [r for r in earlier + rows if r.get("error")]
    print(f"{len(rows)} runs in {time.monotonic() - started:.0f}s ({len(earlier)} merged); {contended} contended "
          f"(others took more than 10 % of the machine); {len(failed)} failed")
    for row in failed:
        print(f"failed: {row['waiting']} waiting, hints {'on' if row['hints'] else 'off'}: {row['error']}")
    for row in summary.get("unsettled", []):
        print(f"left out of the fits: {row['waiting']} waiting, hints {'on' if row['hints'] else 'off'}, repetition "
              f"{row['repeat']}: the scheduler's queues did not settle within the bound")
    for metric in METRICS:
        for mode in summary[metric].values():
            print("verdict: " + mode["verdict"] + (" [CONTENDED runs included]" if contended else ""))
            print("  as a line: " + mode["linear_text"])
            print("  shape: " + mode["shape_text"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
