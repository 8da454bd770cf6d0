"""The main job (`dra-harness run`): start a cluster, run the conformance suite against it, write the
report, stop the cluster. The suite runs in pytest with the `existing` backend pointed at the cluster
this job started, so what the report shows is exactly what `pytest conformance/` checks.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from harness import report
from harness.backends.local import LocalBackend
from harness.backends.local.backend import UpOptions
from harness.binaries import Versions
from harness.progress import Reporter

CONFORMANCE_DIR = Path(__file__).resolve().parent.parent / "conformance"


def main_job(args, reporter: Reporter, out) -> int:
    name = args.name or f"run-{time.strftime('%H%M%S')}"
    backend = LocalBackend(reporter)
    report_dir: Path = args.report_dir
    report_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    info = backend.up(UpOptions(name=name, nodes=args.nodes, preset=args.preset, feature_gates=args.feature_gates,
                                versions=Versions(args.kubernetes_version.lstrip("v"), args.etcd_version.lstrip("v"),
                                                  args.kwok_version.lstrip("v")),
                                binaries_dir=args.binaries_dir))
    reporter.info(f"cluster {info.name!r} is up ({time.monotonic() - started:.1f}s): {info.server}")
    try:
        junit = report_dir / "junit.xml"
        command = [sys.executable, "-m", "pytest", str(CONFORMANCE_DIR), "-p", "no:cacheprovider",
                   "--dra-backend=existing", f"--kubeconfig={info.kubeconfig}", f"--junitxml={junit}",
                   "-o", "junit_family=xunit2", *args.pytest_args]
        reporter.info("running the conformance suite: " + " ".join(command[2:]))
        code = subprocess.call(command)
        summary = report.write(junit, report_dir, cluster=backend.status(info.name))
    finally:
        if not args.keep_cluster:
            with reporter.step(f"stopping cluster {info.name!r}"):
                leftovers = backend.down(info.name)
            if leftovers:
                reporter.info(f"clean-up left: {', '.join(leftovers)}")
    print(f"report: {summary['markdown']} ({summary['passed']} passed, {summary['failed']} failed, "
          f"{summary['skipped']} skipped)", file=out)
    return 0 if code == 0 else 1
