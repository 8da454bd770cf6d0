"""Every load scenario, small, on its own fresh cluster: the shape of the results, not their timings
(timings are benchmarks: BENCHMARKS.md)."""

from __future__ import annotations

import csv

import pytest

from harness import load_runner
from load import scenarios

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("scenario", [s for s in scenarios.SCENARIOS if s != "throughput"])
def test_latency_scenario_measures_every_event(scenario, tmp_path, dra_run_id):
    params = scenarios.LoadParams(scenario, nodes=3, pending=6, events=3, devices_per_node=1, time_limit=120)
    summary = load_runner.run(params, report_dir=tmp_path, name=f"ld-{scenario[:6]}-{dra_run_id[:5]}")
    latency = summary["latency_ms"]
    assert (latency["n"], summary["failures"]) == (3, 0)
    assert 0 < latency["p50"] <= latency["p99"] <= latency["max"] < 60_000
    scheduler = summary["scheduler"]
    assert scheduler["missedRequeues"] == 0  # no pod needed the periodic flush
    assert sum(scheduler["incomingByEvent"].values()) > 0
    generator = summary["generator"]
    assert generator["events_per_second"] > 0 and generator["cpu_seconds"] >= 0
    with open(tmp_path / "locust_stats_final.csv") as handle:
        rows = {(r["Type"], r["Name"]): r for r in csv.DictReader(handle)}
    assert rows[(scenario, "unblocked -> bound")]["Request Count"] == "3"
    assert (tmp_path / "locust.html").stat().st_size > 0


def test_throughput_scenario_reports_pods_per_second(tmp_path, dra_run_id):
    params = scenarios.LoadParams("throughput", nodes=3, pending=24, events=1, devices_per_node=8, users=4,
                                  time_limit=120)
    summary = load_runner.run(params, report_dir=tmp_path, name=f"ld-tput-{dra_run_id[:5]}")
    assert summary["throughput"]["pods"] == 12  # the measured half of the burst
    assert summary["throughput"]["pods_per_second"] > 0
    assert summary["generator"]["pods_created"] == 12


def test_sweep_writes_json_csv_and_plots(tmp_path, monkeypatch):
    # The sweep's own bookkeeping and plots, on recorded rows (each cell is a `run`, tested above).
    rows = [{"scenario": "device-freed", "nodes": n, "pending": 10, "hints": h, "p50_ms": 50.0 + n, "p99_ms": 90.0 + n,
             "events": 5, "pods_per_second": None, "missed_requeues": 0, "generator_cpu_percent": 10.0,
             "generator_pods_per_second": 0.0} for n in (10, 100) for h in (True, False)]
    load_runner.write_sweep(rows, tmp_path)
    assert (tmp_path / "sweep.csv").read_text().count("\n") == 5
    for name in ("device-freed-p50_ms.png", "device-freed-p99_ms.png"):
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"
    assert "device-freed-p99_ms.png" in (tmp_path / "sweep.html").read_text()
