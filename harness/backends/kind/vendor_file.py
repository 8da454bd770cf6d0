"""The deployed fake driver as a vendor's (a VendorDriver file, pure), so that the suite tests it on kind
as it tests users' drivers: through the kubelets of the nodes it runs on."""

from __future__ import annotations

from fake_devices.config import PROFILE_LABEL
from harness.backends import manifests
from harness.config import capabilities
from harness.config.featuregates import SUITE_FEATURES


def vendor_driver(slices: list[dict], classes: dict[str, str | None], node_images: dict[str, set[str]],
                  profiled_nodes: set[str]) -> dict:
    """The deployed fake driver as a VendorDriver file (harness.vendor.file), so that the suite tests
    it as users' drivers are tested on kind: through the kubelets of the nodes it runs on (pure).

    `slices`: the published ResourceSlices; `classes`: DeviceClass name -> its extendedResourceName,
    from the applied manifests; `node_images`: node -> the image names its kubelet reports;
    `profiled_nodes`: the nodes with a profile label."""
    suffix = "." + manifests.DOMAIN
    drivers: set[str] = set()
    types: set[str] = set()
    pools: dict[str, set[str]] = {}  # node -> drivers with devices there
    for item in slices:
        spec = item.get("spec") or {}
        driver = spec.get("driver", "")
        if not driver.endswith(suffix) or not spec.get("devices"):
            continue
        drivers.add(driver)
        pools.setdefault(spec.get("nodeName") or "", set()).add(driver)
        for device in spec["devices"]:
            kind = ((device.get("attributes") or {}).get("type") or {}).get("string")
            if kind:
                types.add(kind)
    prefix = manifests.INSTANCE + "-"
    device_classes = {kind: prefix + kind for kind in sorted(types) if prefix + kind in classes}
    extended = {kind: classes[name] for kind, name in device_classes.items() if classes[name]}
    # A pause image every node with devices has (kind's nodes keep their sandbox image): the kubelet
    # checks' container, never pulled.
    with_devices = sorted(node for node in pools if node)
    common = set.intersection(*(node_images.get(node, set()) for node in with_devices)) if with_devices else set()
    pause = sorted(name for name in common if name.startswith("registry.k8s.io/pause:"))
    vendor: dict = {"drivers": sorted(drivers), "deviceClasses": device_classes, "extendedResources": extended,
                    # it is the fake driver: its own powers' tests belong to the run (on the simulated nodes)
                    "runFakeDriverTests": True,
                    # its plugins are the DaemonSet's pods: a plugin crash is one of them deleted
                    "pluginDaemonSet": f"{manifests.NAMESPACE}/{manifests.PLUGIN}",
                    "features": list(vendor_features([s for s in slices
                                                      if (s.get("spec") or {}).get("driver") in drivers]))}
    if profiled_nodes and all(pools.get(node) == drivers for node in profiled_nodes):
        vendor["nodeSelector"] = PROFILE_LABEL  # every labelled node has devices of every driver
    if pause:
        vendor["testImage"] = pause[-1]
    return {"apiVersion": "dra-harness.x-k8s.io/v1alpha1", "kind": "VendorDriver",
            "metadata": {"name": f"{manifests.INSTANCE}-on-kind"}, "spec": vendor}


def vendor_features(slices: list[dict]) -> tuple[str, ...]:
    """The fake driver is the suite's reference driver: it claims every feature the suite has tests for,
    except those its slices must show and do not (the profiles deployed decide: kind-small's have shared
    counters but no consumable capacity), so the suite's claim check holds and those tests skip saying why."""
    missing = set(capabilities.not_shown(slices))
    return tuple(feature for feature in SUITE_FEATURES if feature not in missing)
