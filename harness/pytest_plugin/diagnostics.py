"""What a failed test leaves behind for whoever has to understand it: the namespace's pods, claims
and events, the ResourceSlices of the drivers the test used, and the tail of every component log."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from harness import backends
from harness.core.files import lines_naming
from harness.k8s import wait
from harness.vendor import diagnostics as vendor_diagnostics
from harness.vendor.setup import PLUGINS_OPTION

FAKE_DRIVERS = "dra_fake_drivers"  # attribute on the test item: the fake drivers its fixture started


def collect(item, report_dir: str | None, vendor=None) -> str | None:
    """Write the diagnostics of a failed test; return where they are (or the text when no report dir).
    `vendor`: the VendorDriver under test (vendor mode), else None."""
    k8s = item.funcargs.get("k8s")
    if k8s is None:
        return None

    parts = []
    namespace = item.funcargs.get("dra_namespace")
    if namespace:
        parts.append(wait.describe_namespace(k8s, namespace))
    for driver in getattr(item, FAKE_DRIVERS, []):
        label = f"dra-harness.x-k8s.io/fake-driver-instance={driver.config.instance}"
        slices = [k8s.api_client.sanitize_for_serialization(s)
                  for s in k8s.resource.list_resource_slice(label_selector=label).items]
        parts.append(f"--- ResourceSlices of fake driver {driver.config.instance} ---\n"
                     + yaml.safe_dump_all(slices, sort_keys=False)[:20000])
        if driver.errors:
            parts.append("driver errors: " + "; ".join(driver.errors[-10:]))
    parts += vendor_diagnostics.parts(k8s, vendor, item.config.getoption(PLUGINS_OPTION))
    cluster = item.funcargs.get("dra_cluster")
    if cluster is not None:  # the cluster record says where its backend keeps component logs
        for log, text in backends.get(cluster.backend).collect_logs(cluster, lines=30).items():
            parts.append(f"--- last lines of {log} ---\n{text}")
            # what the components said about this test's objects (the scheduler on its pods), however long ago
            if namespace and (about := lines_naming(Path(log), namespace)):
                parts.append(f"--- lines of {log} naming namespace {namespace} ---\n{about}")
    text = "\n\n".join(parts)
    if not report_dir:
        return text[:4000]
    target = Path(report_dir) / "diagnostics" / (re.sub(r"[^A-Za-z0-9_.-]+", "_", item.nodeid) + ".txt")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    return str(target)
