"""`--backend` of the benchmark scripts: each accepts the backends it makes sense on (local by default)
and refuses the others with exit status 2, naming the flag, why, and what is allowed."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

from harness.core.errors import InvalidInput

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def bench(request):
    sys.path.insert(0, str(BENCHMARKS))  # the scripts import each other as siblings, as when run
    yield lambda name: importlib.import_module(name)
    sys.path.remove(str(BENCHMARKS))


def _refused(capsys, parse, argv) -> str:
    with pytest.raises(SystemExit) as stopped:
        parse(argv)
    assert stopped.value.code == 2
    return capsys.readouterr().err


LOCAL_ONLY = [
    ("fake_devices_bench", ["publish"], "creates KWOK nodes"),
    ("real_node_bench", [], "starts a real kubelet"),
    ("requeue_curve", [], "SchedulerPreQueueingHints on and off"),
    ("throughput_ab", [], "SchedulerPreQueueingHints on and off"),
    ("cluster_bench", ["nodes"], "creates KWOK nodes"),
    ("cluster_bench", ["verify"], "binary cache"),
]


@pytest.mark.parametrize("script, argv, why", LOCAL_ONLY, ids=[f"{s}-{a[0] if a else ''}" for s, a, _ in LOCAL_ONLY])
def test_local_only_benchmarks_default_to_local_and_refuse_the_others(bench, capsys, script, argv, why):
    parse = bench(script).parse_args
    assert parse(argv).backend == "local"
    assert parse([*argv, "--backend", "local"]).backend == "local"
    for other in ("kind", "existing"):
        err = _refused(capsys, parse, [*argv, "--backend", other])
        assert f"error: --backend: {other}: " in err and why in err and "(allowed: local)" in err, err
        assert "Traceback" not in err


def test_cluster_start_runs_on_local_and_kind(bench, capsys):
    parse = bench("cluster_bench").parse_args
    assert parse(["start"]).backend == "local"
    assert parse(["start", "--backend", "kind"]).backend == "kind"
    err = _refused(capsys, parse, ["start", "--backend", "existing"])
    assert "--backend: existing: `start` times `cluster up`" in err and "(allowed: local, kind)" in err


def test_kubelet_plugin_bench_runs_anywhere_and_kubeconfig_means_existing(bench, capsys):
    parse = bench("kubelet_plugin_bench").parse_args
    assert (parse(["prepare"]).backend, parse(["prepare"]).kubeconfig) == ("local", None)
    assert parse(["prepare", "--backend", "kind"]).backend == "kind"
    given = parse(["prepare", "--kubeconfig", "/k"])
    assert (given.backend, given.kubeconfig) == ("existing", "/k")
    assert parse(["prepare", "--backend", "existing"]).backend == "existing"  # $KUBECONFIG, checked by the backend
    err = _refused(capsys, parse, ["prepare", "--backend", "local", "--kubeconfig", "/k"])
    assert "--kubeconfig: /k: names a cluster to use, but --backend local starts its own" in err
    err = _refused(capsys, parse, ["prepare", "--backend", "nope"])
    assert "--backend: nope: unknown backend (allowed: local, kind, existing)" in err


def test_benchmarks_get_their_cluster_through_the_registry(bench, monkeypatch):
    """No script constructs a backend class; bench_backend.start asks the registry by name."""
    for script in sorted(BENCHMARKS.glob("*.py")):
        text = script.read_text()
        assert "LocalBackend" not in text and "UpOptions" not in text, script.name
    bench_backend = bench("bench_backend")
    asked = []

    class Recorder:
        def __init__(self, reporter):
            pass

        def up(self, spec):
            return spec.name

    monkeypatch.setattr(bench_backend.backends, "get", lambda name, reporter=None: asked.append(name) or Recorder(None))
    from harness.backends.base import ClusterSpec

    _, info = bench_backend.start("kind", ClusterSpec(name="b"))
    assert (asked, info) == (["kind"], "b")


def test_a_backend_that_refuses_the_spec_exits_2_with_its_message(bench, monkeypatch, capsys):
    bench_backend = bench("bench_backend")
    from harness.backends.base import ClusterSpec

    with pytest.raises(SystemExit) as stopped:
        bench_backend.start("existing", ClusterSpec(name="b", kubeconfig="/nonexistent/kubeconfig", deploy=False))
    assert stopped.value.code == 2
    assert "--kubeconfig: /nonexistent/kubeconfig: no such file" in capsys.readouterr().err


def test_requeue_curve_merges_earlier_rows_and_refuses_other_sweeps(bench, tmp_path):
    script = bench("requeue_curve")
    rows = [{"scenario": "device-freed", "nodes": 1000, "waiting": 5000, "hints": True}]
    good = tmp_path / "curve.json"
    good.write_text(json.dumps({"rows": rows, "summary": {}}))
    assert script.merged_rows([good], "device-freed", 1000) == rows
    # the CSV the script writes beside it (and BENCHMARKS commits) gives the same rows back, typed
    script.write_results([{**rows[0], "p50_ms": 80.5, "error": None, "settled": False}], [5000], tmp_path)
    assert script.merged_rows([tmp_path / "curve.csv"], "device-freed", 1000) == [
        {**rows[0], "p50_ms": 80.5, "error": None, "settled": False}]
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"rows": [{**rows[0], "nodes": 500}]}))
    with pytest.raises(InvalidInput) as refused:
        script.merged_rows([good, other], "device-freed", 1000)
    assert str(refused.value.problems[0]) == (f"--merge {other}: rows[0].nodes: 500 is not this sweep's --nodes "
                                              "(allowed: 1000)")
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(InvalidInput) as refused:
        script.merged_rows([broken], "device-freed", 1000)
    assert "rows: not a curve.json or curve.csv of rows" in str(refused.value.problems[0])
    # after a good file, a bad one is still refused with what a --merge file must be
    with pytest.raises(InvalidInput) as refused:
        script.merged_rows([good, broken], "device-freed", 1000)
    assert "(allowed: a curve.json or curve.csv this script wrote)" in str(refused.value.problems[0])
    with pytest.raises(InvalidInput) as refused:
        script.merged_rows([tmp_path / "missing.json"], "device-freed", 1000)
    assert "(file): cannot be read" in str(refused.value.problems[0])


def test_requeue_curve_plans_a_sweep_with_merged_rows_and_names_bad_flags(bench, tmp_path, monkeypatch):
    script = bench("requeue_curve")
    earlier = tmp_path / "curve.json"
    rows = [{"scenario": "taint-removed", "nodes": 1000, "waiting": w, "hints": h, "repeat": r}
            for w in (100, 1000) for h in (True, False) for r in (1, 2)]
    earlier.write_text(json.dumps({"rows": rows}))
    args = script.parse_args(["--scenario", "taint-removed", "--waiting", "1000,100", "--repeats", "1",
                              "--events", "500", "--merge", str(earlier)])
    sizes, grid, merged = script.plan(args)
    assert sizes == [100, 1000] and merged == rows
    assert (grid[100].pending, grid[100].events, grid[1000].events) == (100, 100, 500)  # events capped by waiting
    # one repetition alone gives no interval: refused naming the flag and what is allowed
    with pytest.raises(InvalidInput) as refused:
        script.plan(script.parse_args(["--repeats", "1"]))
    assert str(refused.value.problems[0]) == ("--repeats: 1: out of range "
                                              "(allowed: 2 to 50 (0 and 1 only with --merge))")
    with pytest.raises(InvalidInput) as refused:
        script.plan(script.parse_args(["--waiting", "100,lots"]))
    assert "--waiting: 100,lots: not a list of waiting-pod counts" in str(refused.value.problems[0])
    # main says it in one line and exits 2, creating nothing
    monkeypatch.setattr(sys, "argv", ["requeue_curve.py", "--waiting", "0", "--report-dir", str(tmp_path / "out")])
    assert script.main() == 2
    assert not (tmp_path / "out").exists()


def test_requeue_curve_repeats_0_aggregates_merged_rows_into_a_verdict_and_plots(bench, tmp_path, monkeypatch,
                                                                                  capsys):
    script = bench("requeue_curve")
    # a straight line: 100 ms + 1.5 ms per waiting pod, the same in both modes, 2 runs per size
    rows = [{"scenario": "device-freed", "nodes": 1000, "waiting": w, "hints": h, "repeat": r,
             "scheduler_cpu_ms_per_event": (100 + 1.5 * w) * (1 + 0.01 * r), "p50_ms": 80.0 + r,
             "contended": False, "error": None} for w in (100, 1000, 5000) for h in (True, False) for r in (1, 2)]
    # a run whose queues never settled: its cost is the settle bound's, and it would bend the curve
    rows.append({**rows[-1], "repeat": 3, "scheduler_cpu_ms_per_event": 40000.0, "settled": False})
    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps({"rows": rows}))
    out = tmp_path / "out"
    monkeypatch.setattr(sys, "argv", ["requeue_curve.py", "--repeats", "0", "--merge", str(earlier),
                                      "--report-dir", str(out)])
    assert script.main() == 0
    printed = capsys.readouterr().out
    assert "0 runs" in printed and "(13 merged)" in printed
    assert "left out of the fits: 5000 waiting, hints off, repetition 3: the scheduler's queues did not settle" in printed
    assert "shape: scheduler CPU per event (ms), hints on: linear" in printed
    summary = json.loads((out / "curve.json").read_text())["summary"]
    assert summary["scheduler_cpu_ms_per_event"]["hints off"]["shape"] == "linear"
    assert summary["scheduler_cpu_ms_per_event"]["hints on"]["per_size"]["5000"]["n"] == 2
    assert (out / "device-freed-scheduler_cpu_ms_per_event.png").stat().st_size > 0
    # curve.md: the tables BENCHMARKS.md shows, from the same rows; the unsettled run on a line of its own
    table = (out / "curve.md").read_text().splitlines()
    assert "| device-freed | on | linear | 102 + 1.522 ± 0.015 (R² 1.000) |" in "\n".join(table)
    assert "**device-freed** (13 runs, 0 contended" in "\n".join(table)
    (cell,) = [line for line in table if line.startswith("| 5000 | off | 2 |")]
    assert cell.split(" | ")[3].startswith("7714 ± "), cell  # mean of (100 + 7500) x 1.01 and x 1.02
    assert "| 5000 | off | 1 | 40000.0 (not settled: left out) | 82.0 | - | - | - | - (bound) |" in table, table


def test_requeue_curve_ctrl_c_keeps_the_finished_runs_and_says_so(bench, tmp_path, monkeypatch, capsys):
    script = bench("requeue_curve")
    calls = []

    def one_run(params, hints, cell):
        calls.append(hints)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return {"scenario": params.scenario, "nodes": params.nodes, "waiting": params.pending, "hints": hints,
                "scheduler_cpu_ms_per_event": 100.0, "p50_ms": 50.0, "contended": False}

    monkeypatch.setattr(script, "one_run", one_run)
    monkeypatch.setattr(sys, "argv", ["requeue_curve.py", "--waiting", "100", "--report-dir", str(tmp_path)])
    assert script.main() == 130
    assert "interrupted after 1 runs of this sweep" in capsys.readouterr().err
    kept = json.loads((tmp_path / "curve.json").read_text())["rows"]
    assert [(r["waiting"], r["hints"]) for r in kept] == [(100, True)]
