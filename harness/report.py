"""Reports of a conformance run: JSON and Markdown built from pytest's JUnit XML."""

from __future__ import annotations

import json
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict
from pathlib import Path


def read_junit(path: Path) -> list[dict]:
    """One record per test case: id, outcome (passed/failed/skipped), seconds, message."""
    if not path.exists():
        return []
    cases = []
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                outcome, message = "failed", child.get("message") or (child.text or "")[:500]
            elif child.tag == "skipped":
                outcome, message = "skipped", child.get("message") or ""
        cases.append({"id": f"{case.get('classname')}::{case.get('name')}", "outcome": outcome,
                      "seconds": float(case.get("time") or 0), "message": message.strip()})
    return cases


def write(junit: Path, report_dir: Path, cluster=None) -> dict:
    cases = read_junit(junit)
    counts = {k: sum(1 for c in cases if c["outcome"] == k) for k in ("passed", "failed", "skipped")}
    data = {"generated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **counts, "tests": cases,
            "cluster": asdict(cluster) if cluster is not None else None}
    json_path = report_dir / "report.json"
    json_path.write_text(json.dumps(data, indent=2, default=str))
    md_path = report_dir / "report.md"
    md_path.write_text(markdown(data))
    return {**counts, "json": str(json_path), "markdown": str(md_path)}


def markdown(data: dict) -> str:
    lines = ["# dra-harness conformance report", "",
             f"Generated {data['generated']}: **{data['passed']} passed, {data['failed']} failed, "
             f"{data['skipped']} skipped**.", ""]
    cluster = data.get("cluster") or {}
    if cluster:
        features = (cluster.get("details") or {}).get("features") or {}
        lines += [f"Cluster `{cluster.get('name')}` (backend {cluster.get('backend')}), "
                  f"preset `{features.get('preset', '-')}`.", ""]
    lines += ["| test | outcome | seconds | note |", "|---|---|---|---|"]
    for case in data["tests"]:
        note = case["message"].replace("|", "\\|").replace("\n", " ")[:160]
        lines.append(f"| `{case['id']}` | {case['outcome']} | {case['seconds']:.2f} | {note} |")
    return "\n".join(lines) + "\n"
