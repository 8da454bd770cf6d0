"""`dra-harness conformance run` and the main job `dra-harness run`: get a cluster, run the
conformance suite against it in pytest, write the reports, and stop the cluster if we started it.

The suite always runs with the plugin's `existing` backend pointed at the cluster chosen here, so
the report shows exactly what `pytest conformance/` checks, on any backend.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from harness import report
from harness import session as sessions
from harness.errors import HarnessError
from harness.progress import Reporter

CONFORMANCE_DIR = Path(__file__).resolve().parent.parent / "conformance"


@dataclass
class ConformanceOptions:
    backend: str = "local"
    kubeconfig: str | None = None
    name: str | None = None
    nodes: int = 3
    preset: str | None = None
    feature_gates: str = ""
    definition: str | None = None
    driver_config: str | None = None
    maturity: str = "alpha"
    features: str = ""
    report_dir: Path = Path("reports")
    workers: int = 2
    keep_cluster: bool = False
    binaries_dir: Path | None = None
    versions: object = None
    real_nodes: str = "auto"  # local: nodes run by a real kubelet ("auto": one where the machine allows it)
    pytest_args: list[str] = field(default_factory=list)


def run(options: ConformanceOptions, reporter: Reporter, out) -> int:
    from harness.discovery import discover
    from harness.k8s.client import Clients

    report_dir = options.report_dir
    report_dir.mkdir(parents=True, exist_ok=True)
    for stale in ("results.json", "junit.xml"):
        (report_dir / stale).unlink(missing_ok=True)
    backend, cluster_name, kubeconfig, no_real_node_reason = _cluster(options, reporter)
    started = time.monotonic()
    try:
        clients = Clients(Path(kubeconfig))
        try:
            facts = discover(clients)
        finally:
            clients.close()
        command = [sys.executable, "-m", "pytest", str(CONFORMANCE_DIR), "-p", "no:cacheprovider",
                   "--dra-backend=existing", f"--kubeconfig={kubeconfig}", f"--junitxml={report_dir / 'junit.xml'}",
                   f"--dra-report-dir={report_dir}", f"--dra-maturity={options.maturity}", "-o", "junit_family=xunit2"]
        if options.features:
            command.append(f"--dra-features={options.features}")
        if options.driver_config:
            command.append(f"--dra-driver-config={options.driver_config}")
        if options.workers > 1:
            command += ["-n", str(options.workers)]
        command += options.pytest_args
        reporter.info("running the conformance suite: pytest " + " ".join(command[3:]))
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if no_real_node_reason:  # so the kubelet tests say why they skip
            env[sessions.NO_REAL_NODE_ENV] = no_real_node_reason
        code = subprocess.call(command, env=env)
        results = report.load_results(report_dir)
        summary = report.write(report_dir, results, cluster=facts.to_dict(), run={
            "backend": options.backend, "preset": options.preset or ("definition " + options.definition
                                                                      if options.definition else "all-dra"),
            "driver": options.driver_config or "the dra-harness fake driver", "maturity": options.maturity,
            "features": options.features or "all", "wallSeconds": round(time.monotonic() - started, 1)})
    finally:
        if backend is not None and not options.keep_cluster:
            with reporter.step(f"stopping cluster {cluster_name!r}"):
                leftovers = backend.down(cluster_name)
            if leftovers:
                reporter.info(f"clean-up left: {', '.join(leftovers)}")
    print(f"report: {summary['markdown']} and {summary['html']} ({summary['passed']} passed, "
          f"{summary['failed']} failed, {summary['skipped']} skipped)", file=out)
    if code == 5:
        raise HarnessError("no conformance test matched the selection", hint="check --maturity and --features")
    return 0 if code == 0 else 1


def _cluster(options: ConformanceOptions, reporter: Reporter):
    """(backend we started or None, cluster name, kubeconfig path, why it has no real node or "")."""
    if options.backend == "existing":
        kubeconfig = options.kubeconfig or os.environ.get("KUBECONFIG")
        if not kubeconfig or not Path(kubeconfig).expanduser().is_file():
            raise HarnessError("--backend existing needs a kubeconfig file (--kubeconfig or $KUBECONFIG)")
        return None, None, str(Path(kubeconfig).expanduser()), ""
    if options.backend != "local":
        raise HarnessError(f"unknown backend {options.backend!r}", hint="use local or existing")
    from harness.backends.local import LocalBackend
    from harness.backends.local.backend import UpOptions
    from harness.binaries import Versions
    from harness.config import cluster as cluster_config

    definition = cluster_config.load(options.definition) if options.definition else None
    name = options.name or f"conformance-{time.strftime('%H%M%S')}-{os.getpid() % 1000}"
    real_nodes, reason = sessions.resolve_real_nodes(options.real_nodes)
    if reason and options.real_nodes == "auto":
        reporter.info(f"no real node, the kubelet checks will skip: {reason}")
    backend = LocalBackend(reporter)
    info = backend.up(UpOptions(name=name, nodes=options.nodes, preset=options.preset,
                                feature_gates=options.feature_gates, definition=definition, real_nodes=real_nodes,
                                versions=options.versions or Versions(), binaries_dir=options.binaries_dir))
    reporter.info(f"cluster {name!r} is up: {info.server}")
    return backend, name, str(info.kubeconfig), reason
