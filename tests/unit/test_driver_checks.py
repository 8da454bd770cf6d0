"""The driver checks (conformance/driver_checks.py, class_selectors.py) over rendered fake-driver
slices: clean for the real profiles, and each broken variant caught with the defect and the object named."""

from __future__ import annotations

import pytest

from conformance import class_selectors, driver_checks
from fake_devices import profile, render, variants

DRIVERS = render.Drivers("fake.example.com")
NODES = ("node-a", "node-b")


def _published(name: str, variant: str | None = None) -> list[dict]:
    slices = []
    for node in NODES:
        by_driver = render.render_node(profile.load(name), node, DRIVERS, node_uid="uid-" + node, instance="t")
        for driver_slices in variants.apply(variant, by_driver).values():
            slices += driver_slices
    return slices


@pytest.mark.parametrize("name", ["tiny", "dgx-h100", "a100-mig"])
def test_correct_profiles_have_no_defects(name):
    slices = _published(name)
    for check, function in driver_checks.ALL_CHECKS.items():
        assert function(slices) == [], check
    assert driver_checks.nodes_exist(slices, set(NODES)) == []
    assert driver_checks.pools_on_nodes(slices, (DRIVERS.gpu,), list(NODES)) == []
    assert driver_checks.invalid_pools(slices) == []


@pytest.mark.parametrize("variant, check, defect", [
    ("duplicate-device-names", "device names are unique", "pool gpu.fake.example.com/node-a: device gpu-0 is "
                                                          "published twice"),
    ("duplicate-uuid", "device identities are unique", "driver gpu.fake.example.com: uuid"),
    ("duplicate-pci-bus-id", "device identities are unique",
     "resource.kubernetes.io/pciBusID '0000:"),
    ("tainted-healthy-device", "healthy devices are not tainted",
     "gpu.fake.example.com/node-a/gpu-0 (slice node-a-gpu-"),
])
def test_each_broken_variant_is_named(variant, check, defect):
    slices = _published("dgx-h100", variant)
    defects = driver_checks.ALL_CHECKS[check](slices)
    assert defects and defect in defects[0], defects
    others = {c: f(slices) for c, f in driver_checks.ALL_CHECKS.items() if c != check}
    assert not any(others.values()), others  # exactly the right check fails


def test_duplicate_device_names_make_the_pool_invalid():
    defects = driver_checks.invalid_pools(_published("tiny", "duplicate-device-names"))
    first = render.slice_name("node-a", DRIVERS.gpu, 0)
    assert f"pool {DRIVERS.gpu}/node-a: device gpu-0 is published twice (slices {first} and {first}-again)" in defects
    assert len(defects) == 2 * len({s["spec"]["driver"] for s in _published("tiny")})  # every pool of both nodes


def test_slice_for_a_missing_node():
    slices = _published("tiny", "slice-for-missing-node")
    defects = driver_checks.nodes_exist(slices, set(NODES))
    gone = render.slice_name("node-a", DRIVERS.gpu, 0) + "-gone"
    assert (f"driver {DRIVERS.gpu}: slice {gone} (pool node-a-gone) is for node 'node-a-gone', which does not exist"
            in defects), defects


def test_node_without_pool():
    slices = _published("tiny")
    assert driver_checks.pools_on_nodes(slices, (DRIVERS.gpu,), ["node-a", "node-c"]) == [
        f"driver {DRIVERS.gpu}: node node-c matches the vendor file's nodeSelector but has no ResourceSlice "
        "with devices for it"]


def test_not_applicable_when_nothing_is_published_to_check():
    bare = [{"metadata": {"name": "s"}, "spec": {"driver": "gpu.example.com", "nodeName": "n",
                                                 "pool": {"name": "n", "generation": 1, "resourceSliceCount": 1},
                                                 "devices": [{"name": "gpu-0", "attributes": {"index": {"int": 0}}}]}}]
    for check, (applies, _) in driver_checks.APPLIES.items():
        assert not applies(bare), check
    rich = _published("a100-mig", "tainted-healthy-device")
    assert [c for c, (applies, _) in driver_checks.APPLIES.items() if not applies(rich)] == []


def _class(name: str, *expressions: str) -> dict:
    return {"metadata": {"name": name}, "spec": {"selectors": [{"cel": {"expression": e}} for e in expressions]}}


def test_pinned_class_selects_its_drivers_devices_only():
    slices = _published("dgx-h100") + [s for s in _published_other()]
    expression = variants.class_expression(None, DRIVERS.gpu, "gpu")
    selection = class_selectors.evaluate(_class("gpu", expression), slices)
    assert selection.drivers() == {DRIVERS.gpu} and len(selection.selected) == 16
    assert class_selectors.defects(selection, (DRIVERS.gpu,), "spec.deviceClasses.gpu") == []


def _published_other() -> list[dict]:
    other = render.Drivers("other.example.com")
    return render.render_node(profile.load("tiny"), "node-a", other, instance="o")[other.gpu]


def test_unpinned_class_selects_another_drivers_devices():
    slices = _published("dgx-h100") + _published_other()
    expression = variants.class_expression("class-selects-other-drivers", DRIVERS.gpu, "gpu")
    selection = class_selectors.evaluate(_class("gpu", expression), slices)
    [defect] = class_selectors.defects(selection, (DRIVERS.gpu,), "spec.deviceClasses.gpu")
    assert defect.startswith("DeviceClass gpu (spec.deviceClasses.gpu) selects 2 device(s) of other drivers, "
                             "e.g. gpu.other.example.com/node-a/gpu-0"), defect


def test_class_failing_on_other_devices_and_selecting_none():
    slices = _published("tiny") + _published_other()
    selection = class_selectors.evaluate(_class("x", f'device.attributes["{DRIVERS.gpu}"].model == "H100"'), slices)
    found = class_selectors.defects(selection, (DRIVERS.gpu,), "spec.deviceClasses.gpu")
    assert any("selects none of the devices of gpu.fake.example.com" in d for d in found), found
    assert any(": its selector fails with a CEL runtime error on " in d and "no such key" in d for d in found), found


def test_class_using_unsupported_cel_is_not_judged():
    selection = class_selectors.evaluate(_class("q", 'device.capacity["x"].memory.compareTo(quantity("1Gi")) >= 0'),
                                         _published("tiny"))
    assert selection.not_evaluated and class_selectors.defects(selection, (DRIVERS.gpu,), "f") == []


def test_scheduler_refusal_over_an_invalid_pool_names_the_pool():
    """The plugin's hook on "invalid resource pools were encountered": the failure message gets the
    cluster's invalid pools, each with its driver and why."""
    from types import SimpleNamespace as NS

    from harness.pytest_plugin import plugin as pytest_plugin

    slices = _published("tiny", "duplicate-device-names")
    k8s = NS(resource=NS(list_resource_slice=lambda: NS(items=slices)),
             api_client=NS(sanitize_for_serialization=lambda obj: obj))
    crash = NS(message="pod first: 0/3 nodes are available: invalid resource pools were encountered")
    report = NS(longrepr=NS(reprcrash=crash), sections=[])
    pytest_plugin._name_invalid_pools(NS(funcargs={"k8s": k8s}), report)
    first = render.slice_name("node-a", DRIVERS.gpu, 0)
    assert (f"invalid pools in the cluster now: pool {DRIVERS.gpu}/node-a: device gpu-0 is published twice "
            f"(slices {first} and {first}-again)") in crash.message
    assert report.sections[0][0] == "dra-harness invalid pools"


@pytest.mark.parametrize("variant", sorted(variants.TRANSFORMS))
def test_a_variant_keeps_the_slices_of_a_driver_without_devices(variant):
    """A broken variant changes a device where there is one; a driver with none keeps its slices
    (refused-by-api once returned None for it)."""
    pool = {"name": "node-a", "generation": 1, "resourceSliceCount": 1}
    by_driver = {DRIVERS.storage: [{"spec": {"pool": pool, "devices": []}}], DRIVERS.nic: []}
    result = variants.apply(variant, by_driver)
    assert all(isinstance(slices, list) for slices in result.values()), result


def test_partitions_may_share_their_devices_uuid_but_two_devices_may_not():
    """dra-example-driver --gpu-partitions publishes each partition with its GPU's uuid: partitions of
    one counter set are one device's parts, not two devices with one identity."""
    def device(name: str, uuid: str, counter_set: str | None) -> dict:
        found = {"name": name, "attributes": {"uuid": {"string": uuid}}}
        if counter_set:
            found["consumesCounters"] = [{"counterSet": counter_set, "counters": {"memory": {"value": "1Gi"}}}]
        return found

    def slices(*devices: dict) -> list[dict]:
        return [{"metadata": {"name": "s"}, "spec": {"driver": "gpu.example.com", "nodeName": "node-a",
                                                     "pool": {"name": "node-a", "generation": 1,
                                                              "resourceSliceCount": 1}, "devices": list(devices)}}]

    shared = slices(device("gpu-0-partition-0", "u-0", "gpu-0-counters"), device("gpu-0-full", "u-0", "gpu-0-counters"))
    assert driver_checks.identities_unique(shared) == []
    across = slices(device("gpu-0-full", "u-0", "gpu-0-counters"), device("gpu-1-full", "u-0", "gpu-1-counters"))
    assert "uuid 'u-0' is published for two devices: gpu.example.com/node-a/gpu-0-full" in \
        driver_checks.identities_unique(across)[0]
    plain = slices(device("gpu-0", "u-0", None), device("gpu-1", "u-0", None))
    assert driver_checks.identities_unique(plain)
