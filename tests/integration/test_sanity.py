"""`dra-harness sanity` end to end: a real throwaway 1.37 control plane, the plugin as a process, the checks over
its sockets. The fake driver's plugin must keep every rule; the same plugin with deliberate defects must fail
exactly the rules those defects break, each named; the reference driver (dra-example-driver v0.4.0) fails only
where its own source is at fault (docs/contract.md gives the evidence).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness.backends.local import process
from harness.binaries import exampledriver
from harness.sanity import rules, target

# One xdist worker runs every vendor-style run (real-node vendor mode, sanity, shapes) in turn: run side by side
# they load the two cores enough to bring out the vendor-mode "cannot allocate all claims" flake (issue 30).
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("vendor-runs")]

ROOT = Path(__file__).resolve().parents[2]
FAKE = ROOT / "clusters" / "vendors" / "fake-driver.yaml"
EXAMPLE = ROOT / "clusters" / "vendors" / "dra-example-driver.yaml"
SANITY_TIMEOUT = 600  # a run takes about a minute; a machine under load several


def _sanity(vendor_file: Path, report_dir: Path, *extra: str) -> tuple[subprocess.CompletedProcess, dict[str, str]]:
    """Run the command as a user does; (process, rule id -> outcome)."""
    done = subprocess.run([sys.executable, "-m", "harness.cli", "sanity", "--driver-config", str(vendor_file),
                           "--report-dir", str(report_dir), *(["--", *extra] if extra else [])],
                          capture_output=True, text=True, timeout=SANITY_TIMEOUT, stdin=subprocess.DEVNULL,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    records = json.loads((report_dir / "results.json").read_text()) if (report_dir / "results.json").exists() else []
    outcomes = {r["properties"].get("contract_rule", r["id"]): r["outcome"] for r in records}
    return done, outcomes


def _explain(done: subprocess.CompletedProcess, report_dir: Path) -> str:
    report = report_dir / "sanity.md"
    return (f"exit {done.returncode}\n--- stdout (tail) ---\n{done.stdout[-6000:]}\n--- stderr (tail) ---\n"
            f"{done.stderr[-3000:]}\n--- sanity.md ---\n{report.read_text() if report.exists() else '(none)'}")


def _nothing_left(before: set[str]) -> None:
    """No run directory outlived its run: one whose owner process is gone (another run still going, on
    another worker, is not a leak)."""
    root = target.runs_root()
    left = []
    for name in (set(os.listdir(root)) - before if root.is_dir() else set()):
        try:
            owner = json.loads((root / name / target.OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue  # removed meanwhile, or still being written by a live run
        if not process.alive(process.Running("sanity", **process.identity_fields(owner))):
            left.append(name)
    assert not left, f"sanity runs left behind in {root}: {sorted(left)}"


def _runs() -> set[str]:
    root = target.runs_root()
    return set(os.listdir(root)) if root.is_dir() else set()


def test_fake_driver_keeps_every_rule(tmp_path):
    before = _runs()
    done, outcomes = _sanity(FAKE, tmp_path)
    assert done.returncode == 0, _explain(done, tmp_path)
    assert outcomes == {r.id: "passed" for r in rules.RULES}, _explain(done, tmp_path)
    assert "passed, 0 failed" in done.stdout, done.stdout[-500:]
    assert (tmp_path / "junit.xml").exists() and (tmp_path / "sanity.md").exists()
    _nothing_left(before)


def _with_defects(tmp_path: Path, defects: list[str]) -> Path:
    data = yaml.safe_load(FAKE.read_text())
    data["spec"]["kubeletPlugin"]["args"] += [f"--defect={d}" for d in defects]
    data["spec"]["manifests"] = [str(FAKE.parent / m) for m in data["spec"].get("manifests", [])]  # beside the copy
    data["metadata"]["name"] = "fake-driver-broken"
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


# Defects grouped so that no two touch the same rule: each group costs one cluster.
DEFECT_GROUPS = {
    "prepare-and-health": (["stale-cdi", "drop-claim", "any-node", "silent-health", "wrong-pool"],
                           {"KP-RESTART-CDI", "KP-PREP-MULTI", "KP-PREP-OTHER-NODE", "KP-HEALTH-INITIAL",
                            "KP-PREP-DEVICES"}),
    "unprepare": (["keep-cdi", "unprepare-unknown-fails"],
                  {"KP-UNPREP-CLEAN", "KP-UNPREP-DELETED", "KP-RESTART-STATE", "KP-UNPREP-REPEAT"}),
}


@pytest.mark.parametrize("group", sorted(DEFECT_GROUPS))
def test_each_defect_fails_exactly_its_rules(tmp_path, group):
    defects, broken = DEFECT_GROUPS[group]
    done, outcomes = _sanity(_with_defects(tmp_path, defects), tmp_path / "report")
    assert done.returncode == 1, _explain(done, tmp_path / "report")
    failed = {rule for rule, outcome in outcomes.items() if outcome == "failed"}
    assert failed == broken, _explain(done, tmp_path / "report")
    records = json.loads((tmp_path / "report" / "results.json").read_text())
    for record in records:
        if record["outcome"] == "failed":  # the message starts with the rule it broke
            message = record["message"].removeprefix("Failed: ")  # pytest.fail's own prefix
            assert message.startswith(record["properties"]["contract_rule"] + " ("), record


# dra-example-driver v0.4.0 against the contract, as measured (docs/contract.md, "The reference driver").
EXAMPLE_FAILS = {"KP-RESTART-CDI", "KP-PREP-OTHER-NODE"}
EXAMPLE_NOT_APPLICABLE = {"KP-HEALTH-INITIAL", "KP-HEALTH-DEVICES", "KP-HEALTH-REFRESH"}


def test_reference_driver_fails_only_where_its_source_is_at_fault(tmp_path):
    if exampledriver.locate() is None:
        pytest.skip("dra-example-driver v0.4.0 is not built (make example-driver; needs Go)")
    before = _runs()
    done, outcomes = _sanity(EXAMPLE, tmp_path)
    assert done.returncode == 1, _explain(done, tmp_path)
    assert {r for r, o in outcomes.items() if o == "failed"} == EXAMPLE_FAILS, _explain(done, tmp_path)
    assert {r for r, o in outcomes.items() if o == "not applicable"} == EXAMPLE_NOT_APPLICABLE, _explain(done, tmp_path)
    assert set(outcomes) == {r.id for r in rules.RULES}
    _nothing_left(before)
