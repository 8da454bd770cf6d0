"""`dra-harness migration rehearse` end to end, as a user runs it: its own local cluster (simulated
nodes only, so no root is needed), the phases, the per-phase report in both formats, exit status 0,
and nothing left behind (no cluster, no process, no node directory).

Runs the command as a subprocess with its own state directory, so its cluster is easy to find and
nothing else on the machine is touched.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration

DEFINITION = """\
apiVersion: dra-harness.x-k8s.io/v1alpha1
kind: Cluster
metadata: {name: rehearse}
spec:
  preset: all-dra
  driver: {instance: fake, domain: fake.dra-harness.x-k8s.io, extendedResources: {gpu: example.com/gpu}}
  nodePools:
  - {name: gpu, count: 2, profile: tiny}
"""
TIMEOUT = 900  # a cold cluster start on a loaded 2-core machine, five phases, the teardown


def test_the_rehearsal_command_reports_each_phase_and_leaves_nothing(tmp_path):
    definition = tmp_path / "rehearse.yaml"
    definition.write_text(DEFINITION)
    state = tmp_path / "state"
    env = {**os.environ, "DRA_HARNESS_STATE_DIR": str(state)}
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "-q", "migration", "rehearse", "--config",
                           str(definition), "--pods-per-phase", "2", "--report-dir", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=TIMEOUT, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    data = json.loads((tmp_path / "out" / "migration-report.json").read_text())
    assert data["ok"] and data["resource"] == "example.com/gpu" and not data["problems"]
    rows = {r["phase"]: r for r in data["phases"]}
    assert list(rows) == ["device plugin everywhere", "migrate gpu-0", "migrate gpu-1", "DRA everywhere"]
    assert (rows["device plugin everywhere"]["devicePlugin"], rows["device plugin everywhere"]["dra"]) == (
        rows["device plugin everywhere"]["pods"], 0)
    assert (rows["DRA everywhere"]["devicePlugin"], rows["DRA everywhere"]["dra"]) == (0, rows["DRA everywhere"]["pods"])
    assert all(r["pods"] >= 2 and r["notScheduled"] == 0 for r in rows.values())
    markdown = (tmp_path / "out" / "migration-report.md").read_text()
    assert "| device plugin everywhere |" in markdown and markdown in proc.stdout  # the same table is printed
    # The cluster the command started is gone, with its state.
    clusters = state / "clusters"
    assert not (clusters.exists() and any(clusters.iterdir())), sorted(clusters.iterdir())


def test_bad_input_is_refused_before_a_cluster_starts(tmp_path):
    definition = tmp_path / "rehearse.yaml"
    definition.write_text(DEFINITION.replace("count: 2", "count: 1"))
    state = tmp_path / "state"
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "migration", "rehearse", "--config", str(definition)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "DRA_HARNESS_STATE_DIR": str(state)})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"{definition}: spec.nodePools: 1 node(s) with GPUs" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (state / "clusters").exists() or not any((state / "clusters").iterdir())
