"""Reading scheduler_perf's output (pure parsing) and refusing bad `bench upstream` input."""

from __future__ import annotations

import io
import json
import re

import pytest

from harness.cli import bench as bench_cli
from harness.cli import main as cli
from harness.jobs import upstream_perf
from load import scenarios

# As `go test -bench` prints scheduler_perf's results (GOMAXPROCS suffix, tab-separated value/unit pairs).
BENCH_OUTPUT = """\
goos: linux
goarch: amd64
pkg: k8s.io/kubernetes/test/integration/scheduler_perf/dra
cpu: Intel(R) Xeon(R) CPU @ 2.20GHz
BenchmarkPerfScheduling/SchedulingWithResourceClaimTemplate/2000pods_200nodes-2         \t       1\t         0 ns/op\t        41.50 SchedulingThroughput/Average\t        40.00 SchedulingThroughput/Perc50\t        62.00 SchedulingThroughput/Perc90\t        70.00 SchedulingThroughput/Perc95\t        71.00 SchedulingThroughput/Perc99\t        88.12 runtime_seconds
PASS
ok  \tk8s.io/kubernetes/test/integration/scheduler_perf/dra\t95.123s
"""


def test_bench_line_is_parsed_into_values():
    parsed = upstream_perf.parse_bench_output(BENCH_OUTPUT)
    name = "BenchmarkPerfScheduling/SchedulingWithResourceClaimTemplate/2000pods_200nodes"
    assert list(parsed) == [name]
    assert parsed[name]["SchedulingThroughput/Average"] == 41.5
    assert parsed[name]["runtime_seconds"] == 88.12
    assert upstream_perf.throughput_of(parsed[name]) == {"Average": 41.5, "Perc50": 40.0, "Perc90": 62.0,
                                                         "Perc95": 70.0, "Perc99": 71.0}


def test_output_without_result_lines_gives_nothing():
    assert upstream_perf.parse_bench_output("--- FAIL: BenchmarkPerfScheduling\nFAIL\n") == {}
    assert upstream_perf.throughput_of({"runtime_seconds": 3.0}) is None


def test_data_items_file():
    text = json.dumps({"version": "v1", "dataItems": [
        {"data": {"Average": 50.9, "Perc50": 48}, "unit": "pods/s",
         "labels": {"Metric": "SchedulingThroughput", "Name": "SchedulingWithResourceClaimTemplate/5000pods_500nodes"}}]})
    (item,) = upstream_perf.parse_data_items(text)
    assert item["data"]["Average"] == 50.9
    with pytest.raises(ValueError):
        upstream_perf.parse_data_items('{"version": "v1"}')


def test_bench_regex_selects_exactly_one_workload():
    pattern = upstream_perf.bench_regex("SchedulingWithResourceClaimTemplate/fast")
    levels = pattern.split("/")  # go test matches each level of the benchmark name separately
    assert [bool(re.search(level, name)) for level, name in
            zip(levels, ["BenchmarkPerfScheduling", "SchedulingWithResourceClaimTemplate", "fast"])] == [True] * 3
    assert not re.search(levels[2], "selector_fast")
    assert not re.search(levels[1], "SchedulingWithResourceClaim")


def test_every_workload_names_a_known_package_and_a_valid_scenario():
    for workload in upstream_perf.WORKLOADS.values():
        assert workload.package in upstream_perf.PACKAGES
        if workload.ours:
            scenarios.validate(scenarios.LoadParams(**workload.ours, time_limit=1800))


def test_ratios_raw_and_per_cpu_second():
    ours = {"scheduling_throughput": {"Average": 30.0}, "cpu_seconds": 150.0, "pods": 2500}
    theirs = {"scheduling_throughput": {"Average": 50.0}, "cpu_seconds": 100.0, "pods": 2500}
    assert bench_cli.ratios(ours, theirs) == {"raw": 0.6, "per_cpu_second": 0.67}
    assert bench_cli.ratios(ours, {"scheduling_throughput": None})["raw"] is None


@pytest.mark.parametrize("argv, fragment", [
    (["bench", "upstream", "--workload", "Nope/x"], "unknown upstream workload"),
    (["bench", "upstream"], "no workload given"),
    (["bench", "upstream", "--workload", "SchedulingWithResourceClaimTemplate/fast", "--timeout", "5"], "--timeout"),
    (["bench", "upstream", "--workload", "SchedulingWithResourceClaimTemplate/fast", "--repeats", "0"], "--repeats"),
    (["bench", "upstream", "--workload", "PublishResourceSlices/500nodes", "--ab"], "no matching load scenario"),
])
def test_bad_input_is_refused_before_building(argv, fragment, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(upstream_perf, "ensure_built", lambda *a: pytest.fail("must not build"))
    code = cli.run([*argv, "--report-dir", str(tmp_path / "r")], out=io.StringIO())
    assert code == 2
    assert fragment in capsys.readouterr().err.replace("\n", " ")
    assert not (tmp_path / "r").exists()


def test_a_failed_upstream_run_is_recorded_and_the_others_still_run(tmp_path, monkeypatch):
    from harness.core.errors import HarnessError

    monkeypatch.setattr(upstream_perf, "ensure_built", lambda *a: {p: tmp_path / "x.test" for p in upstream_perf.PACKAGES})
    monkeypatch.setattr(upstream_perf, "etcd_directory", lambda *a: tmp_path)
    calls = []

    def fake_run(workload, *args, **kwargs):
        calls.append(workload)
        if workload.startswith("ExtendedResource"):
            raise HarnessError("scheduler_perf ExtendedResource/fast failed (exit status 1; no result line)")
        return {"workload": workload, "scheduling_throughput": {"Average": 9.0}, "runtime_seconds": 3.0,
                "cpu_seconds": 6.0, "pods": 10, "conditions": {"contended": False, "others_percent_of_machine": 1.0,
                "own_percent_of_machine": 50.0, "cpus": 2, "window_seconds": 6.0, "load_average_start": [0.5],
                "load_average_end": [0.6]}}

    monkeypatch.setattr(upstream_perf, "run", fake_run)
    out = io.StringIO()
    code = cli.run(["-q", "bench", "upstream", "--workload", "ExtendedResource/fast", "--workload",
                    "SchedulingWithResourceClaimTemplate/fast", "--report-dir", str(tmp_path / "r")], out=out)
    assert code == 1
    assert calls == ["ExtendedResource/fast", "SchedulingWithResourceClaimTemplate/fast"]
    rows = json.loads((tmp_path / "r" / "bench-upstream.json").read_text())
    assert "failed" in rows[0]["upstream"] and rows[1]["upstream"]["scheduling_throughput"]["Average"] == 9.0
    assert "upstream FAILED" in out.getvalue() and "average 9.0 pods/s" in out.getvalue()


def test_a_relative_report_dir_reaches_the_test_binary_as_an_absolute_path(tmp_path, monkeypatch):
    # The binary runs in its package's directory, so a relative ARTIFACTS / -data-items-dir would be
    # resolved from there (measured: "Failed to create per-test log output file ... no such file").
    package = tmp_path / "package"
    package.mkdir()
    binary = tmp_path / "fake.test"
    binary.write_text('#!/bin/sh\necho "$ARTIFACTS $*" > "$ARTIFACTS/seen"\nexit 1\n')
    binary.chmod(0o755)
    monkeypatch.setattr(upstream_perf, "package_dir", lambda *a: package)
    monkeypatch.chdir(tmp_path)
    from harness.core.errors import HarnessError
    from harness.core.progress import Reporter

    with pytest.raises(HarnessError, match="no result line"):
        upstream_perf.run("SchedulingWithResourceClaimTemplate/fast", binary, tmp_path.joinpath("r").relative_to(tmp_path),
                          version="1.37.2", etcd_dir=tmp_path, timeout=30, reporter=Reporter(quiet=True))
    artifacts, *args = (tmp_path / "r" / "seen").read_text().split()
    assert artifacts == str(tmp_path / "r")
    assert f"-data-items-dir={tmp_path / 'r'}" in args


THRESHOLD_LOG = """\
    executor.go:1002: scheduling succeed
    executor.go:682: ERROR:
        \top 7: BenchmarkPerfScheduling/SchedulingWithResourceClaimTemplate/5000pods_500nodes/test: expected "SchedulingThroughput" "Average" to be higher: got 33.395522, want 56.000000
--- FAIL: BenchmarkPerfScheduling/SchedulingWithResourceClaimTemplate/5000pods_500nodes
FAIL
"""


def _fake_binary(tmp_path, log: str, items: list[dict] | None):
    # What scheduler_perf leaves: its log on stdout, the data items in -data-items-dir, exit status 1.
    import shlex

    items_file = tmp_path / "items.json"
    items_file.write_text(json.dumps({"version": "v1", "dataItems": items or []}))
    copy = f'cp {items_file} "$ARTIFACTS/BenchmarkPerfScheduling_benchmark_dra_x.json"\n' if items is not None else ""
    binary = tmp_path / "fake.test"
    binary.write_text(f"#!/bin/sh\nprintf '%s' {shlex.quote(log)}\n{copy}exit 1\n")
    binary.chmod(0o755)
    return binary


def _run_fake(tmp_path, monkeypatch, binary):
    from harness.core.progress import Reporter

    monkeypatch.setattr(upstream_perf, "package_dir", lambda *a: tmp_path)
    return upstream_perf.run("SchedulingWithResourceClaimTemplate/5000pods_500nodes", binary, tmp_path / "out",
                             version="1.37.2", etcd_dir=tmp_path, timeout=30, reporter=Reporter(quiet=True))


def test_a_run_that_only_misses_upstreams_threshold_is_a_measurement(tmp_path, monkeypatch):
    # Measured on the 2 cores: 33.4 pods/s against the 56 upstream's CI machines must reach.
    item = {"data": {"Average": 33.395, "AverageThreshold": 56, "Perc50": 26.96, "Perc90": 65.04}, "unit": "pods/s",
            "labels": {"Metric": "SchedulingThroughput",
                       "Name": "BenchmarkPerfScheduling/SchedulingWithResourceClaimTemplate/5000pods_500nodes/test"}}
    other = {"data": {"Average": 1.6}, "unit": "ms", "labels": {"Metric": "scheduler_event_handling_duration_seconds",
             "Name": "BenchmarkPerfScheduling/SchedulingWithResourceClaimTemplate/5000pods_500nodes/test"}}
    result = _run_fake(tmp_path, monkeypatch, _fake_binary(tmp_path, THRESHOLD_LOG, [other, item]))
    assert result["scheduling_throughput"] == {"Average": 33.395, "Perc50": 26.96, "Perc90": 65.04}
    assert result["below_upstream_threshold"] == {"metric": "SchedulingThroughput", "statistic": "Average",
                                                  "got": 33.395522, "want": 56.0}


@pytest.mark.parametrize("log, items", [
    (THRESHOLD_LOG, None),  # no data-items file: nothing measured to report
    (THRESHOLD_LOG + "    executor.go:682: ERROR:\n        op 3: timed out waiting for pods\n", []),  # another error
    ("--- FAIL: BenchmarkPerfScheduling\nFAIL\n", []),
])
def test_any_other_failure_stays_a_failure(tmp_path, monkeypatch, log, items):
    from harness.core.errors import HarnessError

    with pytest.raises(HarnessError, match="failed"):
        _run_fake(tmp_path, monkeypatch, _fake_binary(tmp_path, log, items))


def test_our_side_still_runs_when_upstream_fails(tmp_path, monkeypatch):
    from harness.core.errors import HarnessError

    monkeypatch.setattr(upstream_perf, "ensure_built", lambda *a: {p: tmp_path / "x.test" for p in upstream_perf.PACKAGES})
    monkeypatch.setattr(upstream_perf, "etcd_directory", lambda *a: tmp_path)

    def failing(workload, *args, **kwargs):
        raise HarnessError(f"scheduler_perf {workload} failed (exit status 1; no result line)")

    ours = []
    monkeypatch.setattr(upstream_perf, "run", failing)
    monkeypatch.setattr(bench_cli, "_ours", lambda spec, report_dir, reporter: ours.append(spec.name) or
                        {"scenario": "throughput", "complete": True, "pods": 10, "scheduling_throughput": {"Average": 3.0},
                         "end_to_end_pods_per_second": 2.0, "cpu_seconds": 1.0})
    out = io.StringIO()
    code = cli.run(["-q", "bench", "upstream", "--ab", "--workload", "SchedulingWithResourceClaimTemplate/fast",
                    "--report-dir", str(tmp_path / "r")], out=out)
    assert code == 1 and ours == ["SchedulingWithResourceClaimTemplate/fast"]
    row = json.loads((tmp_path / "r" / "bench-upstream.json").read_text())[0]
    assert "failed" in row["upstream"] and row["ours"]["scheduling_throughput"]["Average"] == 3.0
    assert row["ratios"]["raw"] is None


def test_a_failure_of_our_side_is_recorded_and_the_next_rounds_still_run(tmp_path, monkeypatch):
    from harness.core.errors import HarnessError

    monkeypatch.setattr(upstream_perf, "ensure_built", lambda *a: {p: tmp_path / "x.test" for p in upstream_perf.PACKAGES})
    monkeypatch.setattr(upstream_perf, "etcd_directory", lambda *a: tmp_path)
    monkeypatch.setattr(upstream_perf, "run", lambda workload, *a, **k: {
        "workload": workload, "scheduling_throughput": {"Average": 9.0}, "runtime_seconds": 3.0, "cpu_seconds": 6.0,
        "pods": 10, "conditions": {"contended": False, "others_percent_of_machine": 1.0, "own_percent_of_machine": 50.0,
                                   "cpus": 2, "window_seconds": 6.0, "load_average_start": [0.5],
                                   "load_average_end": [0.6]}})
    calls = []

    def ours(spec, report_dir, reporter):
        calls.append(report_dir.parent.name)
        raise HarnessError("fake-devices: exited during start with code 2")

    monkeypatch.setattr(bench_cli, "_ours", ours)
    out = io.StringIO()
    code = cli.run(["-q", "bench", "upstream", "--ab", "--repeats", "2", "--workload",
                    "SchedulingWithResourceClaimTemplate/fast", "--report-dir", str(tmp_path / "r")], out=out)
    assert code == 1 and calls == ["round1", "round2"]
    rows = json.loads((tmp_path / "r" / "bench-upstream.json").read_text())
    assert [r["upstream"]["scheduling_throughput"]["Average"] for r in rows] == [9.0, 9.0]
    assert all("exited during start" in r["ours"]["failed"] for r in rows)
    assert "ours FAILED: fake-devices" in out.getvalue()


def test_steady_state_pods_come_from_the_log():
    log = ("I1202 executor.go:748] creating pods in namespace \"test\" for 10s\n"
           "    executor.go:810: Completed after seeing 412 scheduled pod: the operation ran for the configured 10s\n")
    assert upstream_perf.steady_state_pods(log) == 412
    assert upstream_perf.steady_state_pods("no such line") is None


def test_steady_state_workloads_pair_with_the_closed_loop():
    for name in ("empty_500nodes", "half_500nodes", "full_500nodes"):
        ours = upstream_perf.WORKLOADS[f"SchedulingWithResourceClaimTemplate/{name}"].ours
        params = scenarios.LoadParams(**ours, time_limit=1800)
        assert params.closed_loop and (params.in_flight, params.duration) == (10, 10.0)
        assert params.pending + params.in_flight <= params.devices == 5000
