"""The suite against drivers of other shapes than ours (issue "Any DRA driver, the whole contract"): the fake
driver publishes a shape (bare devices, one device per node, a network-attached pool) and is tested in
vendor mode, described only by a vendor file, nothing of its powers used. Per shape, no test may fail and
at least as many tests as measured must have been allocated its devices (docs/conformance.md, "Driver
shapes"; BENCHMARKS.md). Each runs as a user does: `cluster up --config clusters/shapes/<shape>.yaml`,
then `conformance run --backend existing --driver-config clusters/vendors/shape-<shape>.yaml`.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path

import pytest
import yaml
from cli_runs import cli as _cli  # tests/integration/cli_runs.py

from harness.core import paths

# One xdist worker runs every vendor-style run (real-node vendor mode, sanity, shapes) in turn: run side by side
# they load the two cores enough to bring out the vendor-mode "cannot allocate all claims" flake (issue 30).
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("vendor-runs")]

REPO = Path(__file__).resolve().parents[2]
# shape -> the fewest passing tests that must allocate its devices (measured: docs/conformance.md)
SHAPES = {"bare": 24, "one-per-node": 6, "network": 24, "binding": 24, "partitionable": 2, "consumable": 4}
RUN_TIMEOUT = 1200


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_shape_in_vendor_mode(tmp_path, shape):
    env = {**os.environ, paths.STATE_ENV: str(tmp_path / "state"), "PYTHONPATH": str(REPO), "NO_COLOR": "1"}
    env.pop("KUBECONFIG", None)
    name = f"shape-{uuid.uuid4().hex[:5]}"
    log = tmp_path / "cli.log"
    kubeconfig = tmp_path / "state" / "clusters" / name / "kubeconfig"
    try:
        up = _cli(["cluster", "up", "--name", name, "--config", str(REPO / "clusters" / "shapes" / f"{shape}.yaml"),
                   "--real-nodes", "0"], env, log, 600)
        assert up.returncode == 0, log.read_text()[-4000:]
        started = time.monotonic()
        run = _cli(["conformance", "run", "--backend", "existing", "--kubeconfig", str(kubeconfig), "-n", "2",
                    "--driver-config", str(REPO / "clusters" / "vendors" / f"shape-{shape}.yaml"),
                    "--report-dir", str(tmp_path / "reports")], env, log, RUN_TIMEOUT)
        wall = time.monotonic() - started
    finally:
        down = _cli(["cluster", "down", "--name", name], env, log, 300)
    assert down.returncode == 0, log.read_text()[-4000:]
    results = json.loads((tmp_path / "reports" / "results.json").read_text())
    failed = [f"{r['id']}: {r['message'][:600]}" for r in results if r["outcome"] in ("failed", "xpassed")]
    assert run.returncode == 0 and not failed, "\n".join(failed) + "\n" + log.read_text()[-3000:]
    drivers = set(yaml.safe_load((REPO / "clusters" / "vendors" / f"shape-{shape}.yaml").read_text())["spec"]["drivers"])
    allocating = sorted(r["id"].rsplit("::", 1)[1] for r in results if r["outcome"] == "passed"
                        and drivers & set(r["properties"].get("dra_allocated_drivers") or []))
    print(f"shape {shape}: {wall:.0f}s, {len(allocating)} passing tests allocated its devices: {allocating}")
    assert len(allocating) >= SHAPES[shape], allocating
    # a skip names a capability the shape lacks, never the way its devices are addressed
    addressed = [f"{r['id']}: {r['message'][:200]}" for r in results if r["outcome"] in ("skipped", "not applicable")
                 and "apart" in r["message"]]  # under_test's words for devices a test could not address
    assert not addressed, addressed
