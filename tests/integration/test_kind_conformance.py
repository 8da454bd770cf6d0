"""The conformance suite on kind, as a user runs it: `dra-harness conformance run --backend kind` brings
up a 1 control-plane + 2 worker kind cluster (clusters/kind-small.yaml), deploys the fake driver as a
Deployment + DaemonSet from its locally built image, runs the suite against it in vendor mode (the
kubelet checks through the DaemonSet's plugins on the kind workers), writes the report and takes the
cluster down. The suite must pass, the kubelet check must have run on kind's real kubelets, and the
run must leave nothing behind (kind_leaks).

Opt-in (DRA_HARNESS_KIND_E2E=1, see kind_leaks.why_not); `.ci/run` runs it where the machine allows
(root on Debian), through `make kind-e2e`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import kind_leaks
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.kind_e2e]

WHY_NOT = kind_leaks.why_not("builds the images and starts a kind cluster, minutes")
RUN_TIMEOUT = 3600.0  # cold: docker.io, both Debian root filesystems, kubeadm, the images (docs/kind-and-existing.md)


@pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))
def test_the_suite_passes_on_kind_and_leaves_nothing(tmp_path):
    name = f"conf-{uuid.uuid4().hex[:5]}"
    before = kind_leaks.Before(name)
    report = tmp_path / "report"
    log = tmp_path / "run.log"
    with open(log, "wb") as out:
        done = subprocess.run([sys.executable, "-m", "harness.cli", "conformance", "run", "--backend", "kind",
                               "--name", name, "--report-dir", str(report)], stdout=out, stderr=subprocess.STDOUT,
                              timeout=RUN_TIMEOUT)
    text = log.read_text()
    data = json.loads((report / "report.json").read_text()) if (report / "report.json").is_file() else {}
    failed = [(r["id"], r["message"][:400]) for row in data.get("matrix", []) for r in row["tests"]
              if r["outcome"] == "failed"]
    assert done.returncode == 0 and not failed, f"exit {done.returncode}, failed: {failed}\n{text[-4000:]}"
    assert data["passed"] > 0 and not data["interrupted"], text[-3000:]
    kubelet = [r for row in data["matrix"] for r in row["tests"] if "test_kubelet_prepares_and_unprepares" in r["id"]]
    assert kubelet and all(r["outcome"] == "passed" for r in kubelet), (
        f"the kubelet check did not pass on kind's kubelets: {[(r['id'], r['outcome'], r['message'][:300]) for r in kubelet]}")
    assert before.leaks() == [], text[-3000:]
