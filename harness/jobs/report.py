"""Conformance reports: JSON, a Markdown and an HTML matrix (feature x maturity x outcome, with skip
reasons and failure messages), built from the plugin's results.json and the cluster's facts. JUnit XML
comes from pytest itself; after an interruption it is marked as such, or written here from the
results when pytest could not write it."""

from __future__ import annotations

import html
import json
import os
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

from harness.config import featuregates
from harness.core import diskspace
from harness.core.errors import ConfigError, Problem
from harness.core.files import write_atomic
from harness.core.records import MATURITY_ORDER, OUTCOMES, read_results

# Reports are small, but each failed test saves its diagnostics (objects, events, log tails) beside them.
REPORT_ROOM = 32 << 20


def dir_problems(report_dir: Path, flag: str = "--report-dir") -> list[Problem]:
    """Whether a report directory can be made and written, judged without creating anything."""
    existing = report_dir
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent
    if existing.exists() and not existing.is_dir():
        what = "is a file" if existing == report_dir else f"{existing} is a file, not a directory"
        return [Problem(flag, str(report_dir), what, "a directory (created if missing)")]
    if not os.access(existing, os.W_OK | os.X_OK):
        why = " (Read-only file system)" if os.statvfs(existing).f_flag & os.ST_RDONLY else ""
        return [Problem(flag, str(report_dir), f"{existing} is not writable{why}", "a directory this user can write")]
    free = diskspace.free_bytes(existing)
    if free is not None and free < REPORT_ROOM:
        return [Problem(flag, str(report_dir), f"{free >> 20} MiB free on its filesystem",
                        f"a directory with at least {REPORT_ROOM >> 20} MiB free (reports and failure diagnostics)")]
    return []


def open_dir(report_dir: Path, flag: str = "--report-dir") -> None:
    """Create a report directory and prove it takes a file (a read-only mount passes os.access for
    root); ConfigError naming `flag` otherwise."""
    problems = dir_problems(report_dir, flag)
    if problems:
        raise ConfigError(problems)
    try:
        report_dir.mkdir(parents=True, exist_ok=True)
        probe = report_dir / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise ConfigError([Problem(flag, str(report_dir), f"cannot write: {err.strerror}",
                                   "a directory this user can write")]) from None


def load_results(report_dir: Path) -> list[dict]:
    """The plugin's results.json (harness.core.records.TestResult, one per finished test), as the report reads them."""
    return [result.to_dict() for result in read_results(report_dir / "results.json")]

ALLOCATED = "dra_allocated_drivers"


FAKE_DRIVERS = "dra_fake_drivers"


def credited(record: dict, drivers_under_test: list[str]) -> bool:
    """A passing test counts for the driver under test only if it was allocated one of its devices:
    the vendor's drivers, or (no vendor drivers named: the fake driver under test) the drivers of the
    fake-driver instances the test started. Hand-made slices of a test are helpers either way."""
    props = record.get("properties") or {}
    allocated = set(props.get(ALLOCATED) or [])
    return bool(allocated & set(drivers_under_test or props.get(FAKE_DRIVERS) or []))


def build(results: list[dict], *, cluster: dict | None = None, run: dict | None = None,
          interrupted: str | None = None) -> dict:
    run = run or {}
    drivers_under_test = list(run.get("drivers") or [])
    counts = {k: sum(1 for r in results if r["outcome"] == k) for k in OUTCOMES}
    matrix: dict[tuple[str, str], dict] = defaultdict(lambda: {**{k: 0 for k in OUTCOMES}, "credited": 0,
                                                               "tests": []})
    uncredited = []
    for record in results:
        props = record.get("properties") or {}
        key = (props.get("dra_feature", "(harness)"), props.get("dra_maturity", "-"))
        cell = matrix[key]
        cell[record["outcome"]] = cell.get(record["outcome"], 0) + 1
        cell["tests"].append(record)
        if record["outcome"] == "passed":
            if credited(record, drivers_under_test):
                cell["credited"] += 1
            else:
                uncredited.append({"id": record["id"], "feature": key[0],
                                   "drivers": props.get(ALLOCATED) or []})
    rows = [{"feature": f, "maturity": m, **cell, "status": _status(cell)}
            for (f, m), cell in sorted(matrix.items(), key=lambda kv: (MATURITY_ORDER.get(kv[0][1], 9), kv[0][0]))]
    return {"generated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **counts,
            "interrupted": bool(interrupted), "interruptedReason": interrupted or "",
            "seconds": round(sum(r["seconds"] for r in results), 1), "run": run, "cluster": cluster or {},
            "matrix": rows, "uncredited": uncredited, "gates": gate_coverage(results, cluster)}


STAGE_ORDER = {"GA": 0, "beta": 1, "alpha": 2}


def gate_coverage(results: list[dict], cluster: dict | None) -> list[dict]:
    """One row per DRA-related gate of the cluster's Kubernetes version (clusters/feature-gates/): its
    stage, whether the cluster runs with it, and the tests marked with it; "no test" where there is none,
    "tested by ..." where the gate's matrix entry names tests outside the suite (`testedBy`).
    Empty when the version is unknown or has no gate matrix."""
    version = str((cluster or {}).get("version") or "")
    try:
        matrix = featuregates.load_matrix(version) if version else None
    except (ConfigError, OSError, ValueError):
        matrix = None
    if matrix is None:
        return []
    running = (cluster or {}).get("gates") or {}
    rows = []
    for gate, info in sorted(matrix.gates.items(), key=lambda kv: (STAGE_ORDER.get(kv[1].stage, 9), kv[0])):
        marked = [r for r in results
                  if gate in ((r.get("properties") or {}).get("dra_features")
                              or [(r.get("properties") or {}).get("dra_feature")])]
        outcomes = {k: sum(1 for r in marked if r["outcome"] == k) for k in OUTCOMES}
        status = ((f"tested by {info.tested_by}" if info.tested_by else "no test") if not marked
                  else "FAIL" if outcomes["failed"] else "pass" if outcomes["passed"]
                  else "xfail" if outcomes["xfailed"] else "not run")
        rows.append({"gate": gate, "stage": info.stage, "on": running.get(gate), "tests": len(marked),
                     "passed": outcomes["passed"], "failed": outcomes["failed"], "status": status})
    return rows


def write(report_dir: Path, results: list[dict], *, cluster: dict | None = None, run: dict | None = None,
          interrupted: str | None = None) -> dict:
    """Write report.json, report.md and report.html; `interrupted` (why the run stopped early) marks
    all of them, and the JUnit file, as covering only the tests that finished."""
    data = build(results, cluster=cluster, run=run, interrupted=interrupted)
    report_dir.mkdir(parents=True, exist_ok=True)
    # Whole or not at all: a disk that fills leaves no cut-short report that a reader would trust.
    write_atomic(report_dir / "report.json", json.dumps(data, indent=2, default=str))
    write_atomic(report_dir / "report.md", markdown(data))
    write_atomic(report_dir / "report.html", to_html(data))
    if interrupted:
        mark_junit_interrupted(report_dir / "junit.xml", results, interrupted)
    return {"passed": data["passed"], "failed": data["failed"], "skipped": data["skipped"],
            "xfailed": data["xfailed"], "not applicable": data["not applicable"],
            "markdown": str(report_dir / "report.md"), "html": str(report_dir / "report.html"),
            "json": str(report_dir / "report.json")}


def mark_junit_interrupted(path: Path, results: list[dict], reason: str) -> None:
    """Add `interrupted` to pytest's JUnit file, or write one from `results` if pytest wrote none."""
    try:
        tree = ET.parse(path)
        suites = [tree.getroot()] if tree.getroot().tag == "testsuite" else tree.getroot().findall("testsuite")
    except (OSError, ET.ParseError):
        tree, suites = None, []
    if tree is None or not suites:
        root = ET.Element("testsuites")
        suite = ET.SubElement(root, "testsuite", name="dra-harness conformance", tests=str(len(results)),
                              failures=str(sum(r["outcome"] == "failed" for r in results)),
                              skipped=str(sum(r["outcome"] == "skipped" for r in results)), errors="0",
                              time=f"{sum(r['seconds'] for r in results):.3f}")
        for record in results:
            classname, _, name = record["id"].rpartition("::")
            case = ET.SubElement(suite, "testcase", classname=classname.replace("/", ".").removesuffix(".py"),
                                 name=name, time=f"{record['seconds']:.3f}")
            if record["outcome"] in ("failed", "skipped"):
                tag = "failure" if record["outcome"] == "failed" else "skipped"
                ET.SubElement(case, tag, message=record["message"][:2000])
        tree, suites = ET.ElementTree(root), [suite]
    for suite in suites:
        properties = suite.find("properties")
        if properties is None:
            properties = ET.Element("properties")
            suite.insert(0, properties)
        ET.SubElement(properties, "property", name="interrupted", value=reason)
    tree.write(path, encoding="utf-8", xml_declaration=True)


def _status(cell: dict) -> str:
    """FAIL; pass only with a passing test that allocated a device of the driver under test; "not
    credited" when tests passed without such an allocation; then xfail, not applicable, skip."""
    if cell["failed"]:
        return "FAIL"
    if cell["credited"]:
        return "pass"
    if cell["passed"] or cell["xpassed"]:
        return "not credited"
    if cell["xfailed"]:
        return "xfail"
    if cell["not applicable"]:
        return "n/a"
    return "skip"


def _summary(data: dict) -> str:
    text = f"{data['passed']} passed, {data['failed']} failed, {data['skipped']} skipped"
    for extra in ("xfailed", "xpassed", "not applicable"):
        if data.get(extra):
            text += f", {data[extra]} {extra}"
    return text


def _cell_text(text: str, limit: int = 200) -> str:
    return " ".join(text.split())[:limit]


def markdown(data: dict) -> str:
    cluster, run = data.get("cluster") or {}, data.get("run") or {}
    lines = ["# dra-harness conformance report", ""]
    if data.get("interrupted"):
        lines += [f"**INTERRUPTED**: {data['interruptedReason']}; the results below cover only the tests "
                  "that finished.", ""]
    lines += [f"**{_summary(data)}** "
              f"({data['seconds']} s of test time), generated {data['generated']}.", ""]
    if cluster:
        gates_on = sorted(g for g, v in (cluster.get("gates") or {}).items() if v and g.startswith(("DRA", "Generic",
                                                                                                  "SchedulerPre")))
        lines += [f"- Cluster: Kubernetes {cluster.get('version', '?')}, backend {run.get('backend', '?')}"
                  f"{', preset ' + run['preset'] if run.get('preset') else ''}",
                  f"- DRA gates on: {', '.join(gates_on) or 'unknown (no metrics access)'}",
                  f"- Driver under test: {run.get('driver', 'the dra-harness fake driver')}", ""]
    lines += ["## Matrix", "",
              "A feature is `pass` only if a passing test allocated a device of the driver under test; `not credited`: "
              "its tests passed on helper drivers or allocated nothing (listed below).", "",
              "| feature | maturity | result | passed (on the driver under test) | failed | xfailed | n/a | skipped |",
              "|---|---|---|---|---|---|---|---|"]
    for row in data["matrix"]:
        lines.append(f"| {row['feature']} | {row['maturity']} | {row['status']} | {row['passed']} ({row['credited']}) "
                     f"| {row['failed']} | {row['xfailed']} | {row['not applicable']} | {row['skipped']} |")
    if data.get("gates"):
        lines += ["", "## Feature gates", "",
                  "Every DRA-related gate of the cluster's Kubernetes version, with the tests marked with it "
                  "(`no test`: the suite has none yet; `tested by`: its tests are outside the suite).", "",
                  "| gate | stage | on in this cluster | tests | passed | failed | result |", "|---|---|---|---|---|---|---|"]
        for gate in data["gates"]:
            on = {True: "yes", False: "no"}.get(gate["on"], "unknown")
            lines.append(f"| {gate['gate']} | {gate['stage']} | {on} | {gate['tests']} | {gate['passed']} "
                         f"| {gate['failed']} | {gate['status']} |")
    if data.get("uncredited"):
        lines += ["", "## Passed without a device of the driver under test", "", "| test | feature | devices of |",
                  "|---|---|---|"]
        for test in data["uncredited"]:
            lines.append(f"| `{test['id']}` | {test['feature']} | {', '.join(test['drivers']) or 'none allocated'} |")
    lines += ["", "## Tests", "", "| test | feature | outcome | seconds | devices of | reason / message |",
              "|---|---|---|---|---|---|"]
    for row in data["matrix"]:
        for test in row["tests"]:
            note = _cell_text(test["message"]).replace("|", "\\|")
            used = ", ".join((test.get("properties") or {}).get(ALLOCATED) or [])
            lines.append(f"| `{test['id']}` | {row['feature']} | {test['outcome']} | {test['seconds']:.1f} | {used} "
                         f"| {note} |")
    return "\n".join(lines) + "\n"


def to_html(data: dict) -> str:
    colour = {"pass": "#2e7d32", "FAIL": "#c62828", "skip": "#757575", "passed": "#2e7d32", "failed": "#c62828",
              "skipped": "#757575", "not credited": "#ef6c00", "xfail": "#6a1b9a", "xfailed": "#6a1b9a",
              "xpassed": "#ef6c00", "n/a": "#757575", "not applicable": "#757575"}
    esc = html.escape
    cluster, run = data.get("cluster") or {}, data.get("run") or {}
    rows = []
    for row in data["matrix"]:
        status = row["status"]
        rows.append(f"<tr><td>{esc(row['feature'])}</td><td>{esc(row['maturity'])}</td>"
                    f"<td style='color:{colour[status]};font-weight:bold'>{status}</td>"
                    f"<td>{row['passed']} ({row['credited']})</td><td>{row['failed']}</td><td>{row['xfailed']}</td>"
                    f"<td>{row['not applicable']}</td><td>{row['skipped']}</td></tr>")
    apart = "".join(f"<tr><td><code>{esc(t['id'])}</code></td><td>{esc(t['feature'])}</td>"
                    f"<td>{esc(', '.join(t['drivers']) or 'none allocated')}</td></tr>"
                    for t in data.get("uncredited") or [])
    tests = []
    for row in data["matrix"]:
        for test in row["tests"]:
            used = ", ".join((test.get("properties") or {}).get(ALLOCATED) or [])
            tests.append(f"<tr><td><code>{esc(test['id'])}</code></td><td>{esc(row['feature'])}</td>"
                         f"<td style='color:{colour.get(test['outcome'], '#000')}'>{test['outcome']}</td>"
                         f"<td>{test['seconds']:.1f}</td><td>{esc(used)}</td>"
                         f"<td>{esc(_cell_text(test['message'], 400))}</td></tr>")
    gates = "".join(f"<tr><td>{esc(g['gate'])}</td><td>{esc(g['stage'])}</td>"
                    f"<td>{ {True: 'yes', False: 'no'}.get(g['on'], 'unknown')}</td><td>{g['tests']}</td>"
                    f"<td>{g['passed']}</td><td>{g['failed']}</td><td>{esc(g['status'])}</td></tr>"
                    for g in data.get("gates") or [])
    interrupted = (f"\n<p style='color:#c62828'><b>INTERRUPTED</b>: {esc(data['interruptedReason'])}; the results "
                   "below cover only the tests that finished.</p>" if data.get("interrupted") else "")
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>dra-harness conformance report</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse;margin-bottom:2em}}
td,th{{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top}}th{{background:#eee}}</style></head>
<body><h1>dra-harness conformance report</h1>{interrupted}
<p><b>{esc(_summary(data))}</b> ({data['seconds']} s),
generated {esc(data['generated'])}. Kubernetes {esc(str(cluster.get('version', '?')))},
backend {esc(str(run.get('backend', '?')))}, driver under test: {esc(str(run.get('driver', 'fake driver')))}.</p>
<h2>Matrix</h2><p>A feature is <i>pass</i> only if a passing test allocated a device of the driver under test.</p>
<table><tr><th>feature</th><th>maturity</th><th>result</th><th>passed (on the driver under test)</th><th>failed</th>
<th>xfailed</th><th>n/a</th><th>skipped</th></tr>{''.join(rows)}</table>
<h2>Feature gates</h2><p>Every DRA-related gate of the cluster's version with the tests marked with it
(<i>no test</i>: the suite has none yet; <i>tested by</i>: its tests are outside the suite).</p>
<table><tr><th>gate</th><th>stage</th><th>on in this cluster</th><th>tests</th><th>passed</th><th>failed</th>
<th>result</th></tr>{gates}</table>
<h2>Passed without a device of the driver under test</h2><table><tr><th>test</th><th>feature</th><th>devices of</th></tr>
{apart}</table>
<h2>Tests</h2><table><tr><th>test</th><th>feature</th><th>outcome</th><th>seconds</th><th>devices of</th>
<th>reason / message</th></tr>
{''.join(tests)}</table></body></html>
"""
