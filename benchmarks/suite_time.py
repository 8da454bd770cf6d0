"""Where the conformance suite's time goes: `dra-harness run` with a timeline of every test, per xdist worker.

    .venv/bin/python benchmarks/suite_time.py [--workers 6] [--runs 1] [--report-dir /tmp/suite-time]

For each run it prints pytest's own time and the run's wall time (cluster up and down included), then per
worker when it finished and how busy it was, and the slowest tests with when they started. The timeline
comes from a small pytest plugin (this file, loaded into pytest with `-p`), written to
`<report-dir>/run-N/timeline.jsonl`. A worker that ends well before the others means the order or the hand-out
of the tests left it idle (harness.pytest_plugin.plugin.suite_order); tests that grow when there are
more workers mean they wait for each other (the real node shared, or the CPU). Numbers: BENCHMARKS.md,
"Suite time".
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

TIMELINE_ENV = "DRA_HARNESS_SUITE_TIMELINE"
SLOWEST = 12


# --- the pytest plugin: one line per finished test ------------------------------------------------------

_started: dict[str, float] = {}


def pytest_runtest_logstart(nodeid, location):
    _started[nodeid] = time.time()


def pytest_runtest_logfinish(nodeid, location):
    path, worker = os.environ.get(TIMELINE_ENV), os.environ.get("PYTEST_XDIST_WORKER")
    if path and worker:  # the workers run the tests; the controller only relays their reports
        with open(path, "a") as out:
            out.write(json.dumps({"test": nodeid, "worker": worker, "start": _started.get(nodeid), "end": time.time()})
                      + "\n")


# --- the benchmark ------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=None, help="dra-harness run -n (default: its own)")
    parser.add_argument("--runs", type=int, default=1, help="runs one after the other (1 to 10)")
    parser.add_argument("--report-dir", type=Path, default=Path("/tmp/suite-time"))
    args = parser.parse_args(argv)
    if not 1 <= args.runs <= 10:
        parser.error(f"--runs {args.runs}: 1 to 10 allowed")
    here = Path(__file__).resolve().parent
    failed = 0
    for run in range(1, args.runs + 1):
        report = args.report_dir / f"run-{run}"
        report.mkdir(parents=True, exist_ok=True)
        timeline = report / "timeline.jsonl"
        timeline.unlink(missing_ok=True)
        command = [str(Path(sys.executable).parent / "dra-harness"), "run", "--report-dir", str(report)]
        command += ["-n", str(args.workers)] if args.workers is not None else []
        command += ["--", "-p", "suite_time"]
        env = {**os.environ, TIMELINE_ENV: str(timeline),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(here), os.environ.get("PYTHONPATH")]))}
        began = time.monotonic()
        done = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        wall = time.monotonic() - began
        (report / "run.log").write_text(done.stdout)
        summary = re.findall(r"=+ (.*) in ([0-9.]+)s", done.stdout)
        print(f"run {run}: rc {done.returncode}, wall {wall:.0f} s, pytest "
              f"{summary[-1][1] + ' s (' + summary[-1][0] + ')' if summary else '?'}")
        failed += done.returncode != 0
        _print_timeline(timeline)
    return 1 if failed else 0


def _print_timeline(path: Path) -> None:
    if not path.exists():
        print("  (no timeline: the suite did not start)")
        return
    tests = [json.loads(line) for line in path.read_text().splitlines()]
    start = min(t["start"] for t in tests if t["start"])
    workers: dict[str, list[dict]] = defaultdict(list)
    for test in tests:
        workers[test["worker"]].append(test)
    for worker, done in sorted(workers.items()):
        busy = sum(t["end"] - t["start"] for t in done if t["start"])
        print(f"  {worker}: {len(done)} tests, busy {busy:.0f} s, last ended at {max(t['end'] for t in done) - start:.0f} s")
    print(f"  slowest {SLOWEST} (start s, duration s, worker):")
    for test in sorted(tests, key=lambda t: t["start"] - t["end"] if t["start"] else 0)[:SLOWEST]:
        print(f"    {test['start'] - start:5.0f} {test['end'] - test['start']:5.1f} {test['worker']}  "
              f"{test['test'].split('/')[-1]}")


if __name__ == "__main__":
    sys.exit(main())
