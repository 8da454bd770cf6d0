"""`dra-harness sanity --driver-config FILE`: the kubelet-plugin contract checked over a plugin's own sockets.

The vendor file is checked first (exit 2 naming file and field, nothing started). Then pytest runs
conformance/sanity, whose session fixture starts the throwaway cluster and the plugin
(harness.sanity.target) and acts as the kubelet towards it. The report directory gets `results.json`
(one record per rule: its id, level and outcome), `junit.xml` and `sanity.md`, the rules table with each
outcome and failure message. Ctrl-C stops pytest gracefully: it tears the target down and keeps the
records of the rules already checked.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

from harness.core.errors import HarnessError
from harness.core.progress import Reporter
from harness.core.records import OUTCOMES, TestResult, read_results
from harness.jobs import report
from harness.sanity import rules, target
from harness.vendor import file as vendor

SANITY_DIR = Path(__file__).resolve().parents[2] / "conformance" / "sanity"
STOP_GRACE = 60.0
SETUP_FAILED = 3  # pytest.exit code of the session fixture that could not set the target up


def check(driver_config: str) -> vendor.VendorDriver:
    """The vendor file's own checks plus what the sanity mode needs of it (spec.kubeletPlugin)."""
    loaded = vendor.load(driver_config)
    target.require_plugin(loaded)
    return loaded


def pytest_command(driver_config: str, report_dir: Path, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "pytest", str(SANITY_DIR), "-p", "no:cacheprovider", "-p", "no:randomly",
            f"--dra-sanity-driver-config={Path(driver_config).resolve()}", f"--dra-report-dir={report_dir}",
            f"--junitxml={report_dir / 'junit.xml'}", "-o", "junit_family=xunit2", "-q", *extra]


def run(driver_config: str, report_dir: Path, reporter: Reporter, out, pytest_args: list[str] | None = None) -> int:
    loaded = check(driver_config)
    report.open_dir(report_dir, "--report-dir")
    for stale in ("results.json", "junit.xml", "sanity.md"):
        (report_dir / stale).unlink(missing_ok=True)
    command = pytest_command(driver_config, report_dir, pytest_args or [])
    reporter.info(f"checking the kubelet plugin of {', '.join(loaded.drivers)} against {len(rules.RULES)} rules "
                  "(docs/contract.md)")
    proc = subprocess.Popen(command, env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)
    interrupted = False
    try:
        code = proc.wait()
    except KeyboardInterrupt:
        interrupted = True
        reporter.info(f"interrupted: stopping the checks; the throwaway cluster is torn down (up to "
                      f"{STOP_GRACE:.0f}s)")
        _stop(proc)
        code = proc.returncode
    results = read_results(report_dir / "results.json")
    counts = write_report(report_dir / "sanity.md", loaded, results, interrupted=interrupted)
    print(f"sanity{' (interrupted)' if interrupted else ''}: {report_dir / 'sanity.md'}: "
          + ", ".join(f"{counts[o]} {o}" for o in OUTCOMES if counts[o] or o in ("passed", "failed")), file=out)
    if interrupted:
        raise KeyboardInterrupt
    if code == SETUP_FAILED:
        raise HarnessError("the kubelet plugin could not be set up for the checks (see the message above)",
                           hint="check spec.kubeletPlugin in the vendor file and the plugin's log it names")
    if code not in (0, 1):
        raise HarnessError(f"the sanity checks ended with pytest exit status {code}")
    return 0 if code == 0 else 1


def _stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=STOP_GRACE)
    except (KeyboardInterrupt, subprocess.TimeoutExpired):
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def write_report(path: Path, loaded: vendor.VendorDriver, results: list[TestResult], *,
                 interrupted: bool = False) -> Counter:
    """The rules table with each rule's outcome per driver (a rule with no record: not checked)."""
    by_rule: dict[str, list[TestResult]] = {}
    for result in results:
        by_rule.setdefault(str(result.properties.get("contract_rule", "")), []).append(result)
    counts: Counter = Counter(r.outcome for r in results)
    lines = [f"# Kubelet-plugin sanity: {', '.join(loaded.drivers)}", "",
             f"Vendor file: `{loaded.source}`. Rules: docs/contract.md of dra-harness "
             f"({len(rules.RULES)} rules).", ""]
    if interrupted:
        lines += ["**Interrupted**: only the rules checked before the stop have an outcome.", ""]
    lines += ["| rule | level | outcome | details |", "|---|---|---|---|"]
    for rule in rules.RULES:
        found = by_rule.get(rule.id, [])
        if not found:
            lines.append(f"| {rule.id} | {rule.level} | not checked | |")
        for result in found:
            detail = result.message.removeprefix("Failed: ").replace("|", "\\|").replace("\n", " ")[:400]
            lines.append(f"| {rule.id} | {rule.level} | {result.outcome} | {detail} |")
    lines += ["", ", ".join(f"{counts[o]} {o}" for o in OUTCOMES if counts[o]) or "no rule was checked", ""]
    path.write_text("\n".join(lines))
    return counts
