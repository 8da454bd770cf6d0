"""Vendor mode's part of a failed test's diagnostics: the vendor's slices and DeviceClasses as the cluster
has them, what holds its devices (claims of any namespace, DeviceTaintRules), and its plugin's log."""

from __future__ import annotations

from pathlib import Path

import yaml

from harness.core.files import tail
from harness.vendor.file import VendorDriver
from harness.vendor.plugins import load_plugins


def parts(k8s, vendor: VendorDriver | None, plugins_record: str | None) -> list[str]:
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
        logs += [plugin.log for plugin in load_plugins(plugins_record)]
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
