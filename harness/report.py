"""Conformance reports: JSON, a Markdown and an HTML matrix (feature x maturity x outcome, with skip
reasons and failure messages), built from the plugin's results.json and the cluster's facts. JUnit XML
comes from pytest itself."""

from __future__ import annotations

import html
import json
import time
from collections import defaultdict
from pathlib import Path

MATURITY_ORDER = {"ga": 0, "beta": 1, "alpha": 2, "-": 3}


def load_results(report_dir: Path) -> list[dict]:
    path = report_dir / "results.json"
    return json.loads(path.read_text()) if path.exists() else []


def build(results: list[dict], *, cluster: dict | None = None, run: dict | None = None) -> dict:
    counts = {k: sum(1 for r in results if r["outcome"] == k) for k in ("passed", "failed", "skipped")}
    matrix: dict[tuple[str, str], dict] = defaultdict(lambda: {"passed": 0, "failed": 0, "skipped": 0, "tests": []})
    for record in results:
        props = record.get("properties") or {}
        key = (props.get("dra_feature", "(harness)"), props.get("dra_maturity", "-"))
        matrix[key][record["outcome"]] += 1
        matrix[key]["tests"].append(record)
    rows = [{"feature": f, "maturity": m, **{k: v for k, v in cell.items()}}
            for (f, m), cell in sorted(matrix.items(), key=lambda kv: (MATURITY_ORDER.get(kv[0][1], 9), kv[0][0]))]
    return {"generated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **counts,
            "seconds": round(sum(r["seconds"] for r in results), 1), "run": run or {}, "cluster": cluster or {},
            "matrix": rows}


def write(report_dir: Path, results: list[dict], *, cluster: dict | None = None, run: dict | None = None) -> dict:
    data = build(results, cluster=cluster, run=run)
    report_dir.mkdir(parents=True, exist_ok=True)
    (report_dir / "report.json").write_text(json.dumps(data, indent=2, default=str))
    (report_dir / "report.md").write_text(markdown(data))
    (report_dir / "report.html").write_text(to_html(data))
    return {"passed": data["passed"], "failed": data["failed"], "skipped": data["skipped"],
            "markdown": str(report_dir / "report.md"), "html": str(report_dir / "report.html"),
            "json": str(report_dir / "report.json")}


def _status(cell: dict) -> str:
    if cell["failed"]:
        return "FAIL"
    if cell["passed"]:
        return "pass"
    return "skip"


def _cell_text(text: str, limit: int = 200) -> str:
    return " ".join(text.split())[:limit]


def markdown(data: dict) -> str:
    cluster, run = data.get("cluster") or {}, data.get("run") or {}
    lines = ["# dra-harness conformance report", "",
             f"**{data['passed']} passed, {data['failed']} failed, {data['skipped']} skipped** "
             f"({data['seconds']} s of test time), generated {data['generated']}.", ""]
    if cluster:
        gates_on = sorted(g for g, v in (cluster.get("gates") or {}).items() if v and g.startswith(("DRA", "Generic",
                                                                                                  "SchedulerPre")))
        lines += [f"- Cluster: Kubernetes {cluster.get('version', '?')}, backend {run.get('backend', '?')}"
                  f"{', preset ' + run['preset'] if run.get('preset') else ''}",
                  f"- DRA gates on: {', '.join(gates_on) or 'unknown (no metrics access)'}",
                  f"- Driver under test: {run.get('driver', 'the dra-harness fake driver')}", ""]
    lines += ["## Matrix", "", "| feature | maturity | result | passed | failed | skipped |", "|---|---|---|---|---|---|"]
    for row in data["matrix"]:
        lines.append(f"| {row['feature']} | {row['maturity']} | {_status(row)} | {row['passed']} | {row['failed']} "
                     f"| {row['skipped']} |")
    lines += ["", "## Tests", "", "| test | feature | outcome | seconds | reason / message |", "|---|---|---|---|---|"]
    for row in data["matrix"]:
        for test in row["tests"]:
            note = _cell_text(test["message"]).replace("|", "\\|")
            lines.append(f"| `{test['id']}` | {row['feature']} | {test['outcome']} | {test['seconds']:.1f} | {note} |")
    return "\n".join(lines) + "\n"


def to_html(data: dict) -> str:
    colour = {"pass": "#2e7d32", "FAIL": "#c62828", "skip": "#757575", "passed": "#2e7d32", "failed": "#c62828",
              "skipped": "#757575"}
    esc = html.escape
    cluster, run = data.get("cluster") or {}, data.get("run") or {}
    rows = []
    for row in data["matrix"]:
        status = _status(row)
        rows.append(f"<tr><td>{esc(row['feature'])}</td><td>{esc(row['maturity'])}</td>"
                    f"<td style='color:{colour[status]};font-weight:bold'>{status}</td>"
                    f"<td>{row['passed']}</td><td>{row['failed']}</td><td>{row['skipped']}</td></tr>")
    tests = []
    for row in data["matrix"]:
        for test in row["tests"]:
            tests.append(f"<tr><td><code>{esc(test['id'])}</code></td><td>{esc(row['feature'])}</td>"
                         f"<td style='color:{colour[test['outcome']]}'>{test['outcome']}</td>"
                         f"<td>{test['seconds']:.1f}</td><td>{esc(_cell_text(test['message'], 400))}</td></tr>")
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>dra-harness conformance report</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse;margin-bottom:2em}}
td,th{{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top}}th{{background:#eee}}</style></head>
<body><h1>dra-harness conformance report</h1>
<p><b>{data['passed']} passed, {data['failed']} failed, {data['skipped']} skipped</b> ({data['seconds']} s),
generated {esc(data['generated'])}. Kubernetes {esc(str(cluster.get('version', '?')))},
backend {esc(str(run.get('backend', '?')))}, driver under test: {esc(str(run.get('driver', 'fake driver')))}.</p>
<h2>Matrix</h2><table><tr><th>feature</th><th>maturity</th><th>result</th><th>passed</th><th>failed</th>
<th>skipped</th></tr>{''.join(rows)}</table>
<h2>Tests</h2><table><tr><th>test</th><th>feature</th><th>outcome</th><th>seconds</th><th>reason / message</th></tr>
{''.join(tests)}</table></body></html>
"""
