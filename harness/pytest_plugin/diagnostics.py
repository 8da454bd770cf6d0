"""What a failed test leaves behind for whoever has to understand it: the namespace's pods, claims
and events, the ResourceSlices of the drivers the test used, and the tail of every component log."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from harness import backends
from harness.backends.local import vendor_plugin
from harness.core.files import lines_naming, tail
from harness.k8s import wait

FAKE_DRIVERS = "dra_fake_drivers"  # attribute on the test item: the fake drivers its fixture started


def _vendor_parts(k8s, vendor, plugins_record: str | None) -> list[str]:
    """Vendor mode: the vendor's slices and DeviceClasses as the cluster has them, and its plugin's log."""
    if vendor is None:
        return []
    parts = []
    for driver in vendor.drivers:
        slices = [k8s.api_client.sanitize_for_serialization(s)
                  for s in k8s.resource.list_resource_slice(field_selector=f"spec.driver={driver}").items]
        parts.append(f"--- ResourceSlices of vendor driver {driver} ---\n"
                     + yaml.safe_dump_all(slices, sort_keys=False)[:20000])
    for kind, name in sorted(vendor.device_classes.items()):
        try:
            found = k8s.api_client.sanitize_for_serialization(k8s.resource.read_device_class(name))
            parts.append(f"--- DeviceClass {name} (spec.deviceClasses.{kind}) ---\n" + yaml.safe_dump(found, sort_keys=False))
        except Exception as err:
            parts.append(f"--- DeviceClass {name} (spec.deviceClasses.{kind}): cannot be read: {err}")

    parts.append(_holders_and_rules(k8s, vendor.drivers))
    logs = [Path(vendor.plugin_log).expanduser()] if vendor.plugin_log else []
    try:
        # spec.kubeletPlugin: the plugins the run started
        logs += [plugin.log for plugin in vendor_plugin.load_plugins(plugins_record)]
    except Exception as err:
        parts.append(f"--- the vendor plugins' record cannot be read: {err}")
    for log in logs:
        parts.append(f"--- last lines of the plugin log {log} ---\n{tail(log, 60)}")
    return parts


def _holders_and_rules(k8s, drivers) -> str:
    """What can keep a vendor device from a test although its slice shows it: the claims of any namespace
    that hold one, and the cluster's DeviceTaintRules."""
    lines = [f"--- claims holding devices of {', '.join(drivers)}, and DeviceTaintRules ---"]
    for claim in k8s.resource.list_resource_claim_for_all_namespaces().items:
        allocation = claim.status.allocation if claim.status else None
        held = [f"{r.driver}/{r.pool}/{r.device}" for r in (allocation.devices.results or [] if allocation else [])
                if r.driver in drivers]
        if held:
            users = [r.name for r in claim.status.reserved_for or []]
            lines.append(f"claim {claim.metadata.namespace}/{claim.metadata.name}: {held}, reserved for {users}, "
                         f"deleting={claim.metadata.deletion_timestamp is not None}")
    try:
        rules = k8s.resource.list_device_taint_rule().items
    except Exception as err:  # a cluster without the API: say so, keep the rest
        rules, lines = [], [*lines, f"DeviceTaintRules cannot be listed: {err}"]
    for rule in rules:
        chosen, taint = rule.spec.device_selector, rule.spec.taint
        lines.append(f"DeviceTaintRule {rule.metadata.name}: selector "
                     f"{chosen.to_dict() if chosen else None}, taint {taint.key}={taint.value}:{taint.effect}")
    return "\n".join(lines)


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
    parts += _vendor_parts(k8s, vendor, item.config.getoption(vendor_plugin.PLUGINS_OPTION))
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
