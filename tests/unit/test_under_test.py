"""conformance.under_test: which attribute pins a test's devices (pure logic over published devices)."""

from __future__ import annotations

from conformance.under_test import attribute_literal, identity_attribute


def _device(name: str, **attributes) -> dict:
    return {"name": name, "attributes": {k: v for k, v in attributes.items()}}


def test_uuid_is_preferred_over_other_distinct_attributes():
    devices = [_device(f"gpu-{i}", index={"int": i}, uuid={"string": f"u-{i}"}, model={"string": "X"})
               for i in range(3)]
    assert identity_attribute("gpu.example.com", devices) == ('device.attributes["gpu.example.com"].uuid', "string")


def test_a_qualified_attribute_is_read_from_its_domain():
    devices = [_device(f"d{i}", **{"resource.kubernetes.io/pciBusID": {"string": f"0000:0{i}:00.0"}})
               for i in range(2)]
    assert identity_attribute("nic.example.com", devices) == (
        'device.attributes["resource.kubernetes.io"].pciBusID', "string")


def test_no_identity_when_values_repeat_or_an_attribute_is_missing_on_some_device():
    repeated = [_device("a", model={"string": "X"}), _device("b", model={"string": "X"})]
    assert identity_attribute("d.example.com", repeated) is None
    partial = [_device("a", uuid={"string": "1"}), _device("b")]
    assert identity_attribute("d.example.com", partial) is None
    booleans = [_device("a", healthy={"bool": True}), _device("b", healthy={"bool": False})]
    assert identity_attribute("d.example.com", booleans) is None


def test_literals_are_cel_strings_or_numbers():
    assert attribute_literal(_device("a", uuid={"string": 'x"y'}), "uuid") == '"x\\"y"'
    assert attribute_literal(_device("a", index={"int": 7}), "index") == "7"


# --- partitionable devices: dra-example-driver's --gpu-partitions shape --------------------------

DRIVER = "gpu.example.com"


def _partitioned_slices(gpus: int = 2, partitions: int = 4) -> list[dict]:
    """What dra-example-driver v0.4.0 publishes with --gpu-partitions: one slice of counter sets, one of
    devices; partitions carry their GPU's uuid and index."""
    counter_sets, devices = [], []
    for i in range(gpus):
        name = f"gpu-{i}-counters"
        counter_sets.append({"name": name, "counters": {"memory": {"value": "80Gi"}, "compute": {"value": "100"}}})
        common = {"index": {"int": i}, "uuid": {"string": f"gpu-uuid-{i}"}, "model": {"string": "LATEST-GPU-MODEL"},
                  "driverVersion": {"version": "1.0.0"}, "partitionable": {"bool": True}}
        for j in range(partitions):
            devices.append({"name": f"gpu-{i}-partition-{j}", "attributes": {**common, "partition": {"int": j}},
                            "consumesCounters": [{"counterSet": name, "counters": {
                                "memory": {"value": f"{80 // partitions}Gi"}, "compute": {"value": str(100 // partitions)}}}]})
        devices.append({"name": f"gpu-{i}-full", "attributes": {**common, "full": {"bool": True}},
                        "consumesCounters": [{"counterSet": name, "counters": {
                            "memory": {"value": "80Gi"}, "compute": {"value": "100"}}}]})
    pool = {"name": "node-a", "generation": 1, "resourceSliceCount": 2}
    return [{"metadata": {"name": "s-0"}, "spec": {"driver": DRIVER, "nodeName": "node-a", "pool": pool,
                                                   "sharedCounters": counter_sets}},
            {"metadata": {"name": "s-1"}, "spec": {"driver": DRIVER, "nodeName": "node-a", "pool": pool,
                                                   "devices": devices}}]


def _counter_set(index: int = 0):
    from conformance.under_test import CounterSet, Device, quantity

    slices = _partitioned_slices()
    (counters,) = [{c: quantity(v["value"]) for c, v in s["counters"].items()}
                   for s in slices[0]["spec"]["sharedCounters"] if s["name"] == f"gpu-{index}-counters"]
    devices = tuple(Device(DRIVER, "node-a", d["name"], "node-a", d) for d in slices[1]["spec"]["devices"]
                    if d["consumesCounters"][0]["counterSet"] == f"gpu-{index}-counters")
    return CounterSet(DRIVER, "node-a", "node-a", f"gpu-{index}-counters", counters, devices)


def test_partitions_sharing_their_gpus_uuid_are_told_apart_by_all_their_attributes():
    from conformance import class_selectors
    from conformance.under_test import fingerprint, fingerprint_keys, fingerprints_unique

    slices = _partitioned_slices()
    devices = slices[1]["spec"]["devices"]
    assert identity_attribute(DRIVER, devices) is None  # uuid and index repeat within a GPU
    assert fingerprints_unique(devices)
    keys = fingerprint_keys(devices)
    assert "driverVersion" not in keys  # versions are not pinned (no semver literal needed)
    for device in (devices[1], devices[4], devices[5]):
        expression = fingerprint(DRIVER, device, keys)
        body = {"metadata": {"name": "pin"}, "spec": {"selectors": [{"cel": {"expression": expression}}]}}
        selection = class_selectors.evaluate(body, slices)
        assert not selection.not_evaluated and not selection.errors, (selection, expression)
        assert selection.selected == [(DRIVER, "node-a", device["name"])], expression


def test_the_whole_gpu_blocks_its_partitions_and_the_partitions_fill_it():
    counter_set = _counter_set()
    blocker = counter_set.blocker()
    assert blocker is not None and blocker.name == "gpu-0-full"
    together, rest = counter_set.fill()
    assert [d.name for d in together] == [f"gpu-0-partition-{j}" for j in range(4)]
    assert [d.name for d in rest] == ["gpu-0-full"]
    assert not counter_set.fits(rest[0], together) and counter_set.fits(together[0], together[1:])
    assert "gpu-0-partition-0 (compute 25, memory 20Gi)" in counter_set.describe()
    assert "gpu-0-full (compute 100, memory 80Gi)" in counter_set.describe()


def test_no_blocker_when_every_device_leaves_room_for_another():
    from dataclasses import replace

    counter_set = _counter_set()
    partitions = tuple(d for d in counter_set.devices if "partition" in d.name)
    assert replace(counter_set, devices=partitions).blocker() is None


# --- consumable capacity: what a request policy allocates ------------------------------------------

def test_a_valid_range_rounds_up_to_its_steps_and_clamps_to_min_and_max():
    from decimal import Decimal

    from conformance.under_test import default_share, largest_valid, quantity, smallest_valid

    nvme = {"value": "1Ti", "requestPolicy": {"default": "100Gi", "validRange": {"min": "10Gi", "step": "10Gi"}}}
    gi = quantity("1Gi")
    assert smallest_valid(nvme, 15 * gi) == 20 * gi and smallest_valid(nvme, 20 * gi) == 20 * gi
    assert smallest_valid(nvme, Decimal(0)) == 10 * gi and smallest_valid(nvme, 1025 * gi) is None
    assert largest_valid(nvme, 512 * gi) == 510 * gi and largest_valid(nvme, 5 * gi) is None
    assert default_share(nvme) == 100 * gi
    example = {"value": "100", "requestPolicy": {"default": "100", "validRange": {"min": "1", "step": "1", "max": "100"}}}
    assert smallest_valid(example, Decimal("0.5")) == 1 and smallest_valid(example, Decimal(101)) is None
    assert largest_valid(example, Decimal(50)) == 50 and largest_valid(example, Decimal(500)) == 100
    listed = {"value": "8", "requestPolicy": {"validValues": ["2", "4", "8"]}}
    assert smallest_valid(listed, Decimal(3)) == 4 and largest_valid(listed, Decimal(3)) == 2
    assert default_share(listed) == 8  # no default: the whole capacity
