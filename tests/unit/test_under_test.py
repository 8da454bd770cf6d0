"""conformance.under_test and its parts (device_pinning, published_devices, shared_counters): which attribute
pins a test's devices (pure logic over published devices)."""

from __future__ import annotations

from conformance.device_pinning import attribute_literal, identity_attribute


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
    from conformance.published_devices import Device
    from conformance.shared_counters import CounterSet
    from harness.config.capabilities import quantity

    slices = _partitioned_slices()
    (counters,) = [{c: quantity(v["value"]) for c, v in s["counters"].items()}
                   for s in slices[0]["spec"]["sharedCounters"] if s["name"] == f"gpu-{index}-counters"]
    devices = tuple(Device(DRIVER, "node-a", d["name"], "node-a", d) for d in slices[1]["spec"]["devices"]
                    if d["consumesCounters"][0]["counterSet"] == f"gpu-{index}-counters")
    return CounterSet(DRIVER, "node-a", "node-a", f"gpu-{index}-counters", counters, devices)


def test_partitions_sharing_their_gpus_uuid_are_told_apart_by_all_their_attributes():
    from conformance import class_selectors
    from conformance.device_pinning import fingerprint, fingerprint_keys, fingerprints_unique

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

    from conformance.capacity import default_share, largest_valid, smallest_valid
    from harness.config.capabilities import quantity

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


# --- fractional capacity: sizes worked out from a published validRange -----------------------------

def _nvme() -> dict:
    """An NVMe drive as the fake driver's nvme-storage profile publishes it."""
    return {"name": "nvme-0", "allowMultipleAllocations": True, "capacity": {
        "size": {"value": "7680G", "requestPolicy": {"default": "100Gi", "validRange": {"min": "10Gi", "step": "10Gi"}}},
        "ioShare": {"value": "1", "requestPolicy": {"default": "0",
                                                    "validRange": {"min": "0", "max": "800m", "step": "50m"}}}}}


def test_only_a_range_with_a_fractional_bound_is_fractional():
    from conformance.capacity import fractional_missing
    from harness.config.capabilities import fractional

    assert sorted(fractional(_nvme())) == ["ioShare"]  # size's range is whole bytes
    example = {"name": "gpu-0", "allowMultipleAllocations": True, "capacity": {
        "memory": {"value": "80Gi", "requestPolicy": {"default": "80Gi", "validRange": {"min": "1Gi", "step": "1Gi"}}},
        "compute": {"value": "100", "requestPolicy": {"default": "100", "validValues": ["10", "50", "100"]}}}}
    assert fractional(example) == {}
    assert fractional_missing(["gpu.example.com"], [_nvme(), example]) is None
    message = fractional_missing(["gpu.example.com"], [example])
    assert message is not None and message.startswith(
        "gpu.example.com publishes requestPolicy.validRange only with whole-number min, max and step (e.g. gpu-0: "
        "memory {'min': '1Gi', 'step': '1Gi'}): no capacity with a fractional one")
    plain = {"name": "gpu-0", "capacity": {"memory": {"value": "80Gi"}}}
    assert fractional_missing(["a.example.com", "b.example.com"], [plain]) == \
        "a.example.com, b.example.com publishes no capacity with requestPolicy.validRange"
    assert fractional({"name": "x", "capacity": {"bw": {"value": "2", "requestPolicy": {
        "default": "1500m", "validRange": {"min": "1500m"}}}}})  # a fractional min alone will do


def test_fractional_sizes_of_the_fake_drives_io_share():
    from decimal import Decimal

    from conformance.capacity import (
        above_capacity,
        above_max,
        between_steps,
        decimal_text,
        largest_valid,
        least_positive,
        milli_text,
        split_whole,
    )

    io = _nvme()["capacity"]["ioShare"]
    m = Decimal("0.001")
    assert between_steps(io) == (125 * m, 150 * m)  # halfway into the third step of 50m, rounded up
    assert split_whole(io) == (450 * m, 550 * m)  # distinct shares that are the whole drive
    assert least_positive(io) == 50 * m
    assert above_max(io) == 850 * m and above_capacity(io) == 1500 * m
    assert largest_valid(io, Decimal("0.425")) == 400 * m
    assert (milli_text(125 * m), milli_text(Decimal(2)), decimal_text(400 * m)) == ("125m", "2", "0.4")


def test_fractional_sizes_follow_other_ranges():
    from decimal import Decimal

    from conformance.capacity import above_max, between_steps, least_positive, smallest_valid, split_whole

    m = Decimal("0.001")
    # min 250m, step 500m, max 2750m on a capacity of 4: the third step is 1250m..1750m
    odd = {"value": "4", "requestPolicy": {"default": "250m",
                                           "validRange": {"min": "250m", "step": "500m", "max": "2750m"}}}
    asked, rounded = between_steps(odd)
    assert (asked, rounded) == (1500 * m, 1750 * m) and smallest_valid(odd, asked) == rounded
    assert least_positive(odd) == 250 * m and above_max(odd) == 3250 * m
    assert split_whole(odd) == (1750 * m, 2250 * m)  # 250m + n * 500m, each at most 2750m
    # 4 - 2 * 200m is no multiple of 500m: no two valid amounts add up to the whole capacity
    assert split_whole({"value": "4", "requestPolicy": {"default": "200m", "validRange": {"min": "200m",
                                                                                          "step": "500m"}}}) is None
    # a max at the capacity: nothing lies above the max that the capacity would hold
    whole = {"value": "1", "requestPolicy": {"default": "0", "validRange": {"min": "0", "step": "100m", "max": "1"}}}
    assert above_max(whole) is None and split_whole(whole) == (400 * m, 600 * m)
    # a 1m step: no request lies between two valid amounts; without a step, only below a positive min
    assert between_steps({"value": "1", "requestPolicy": {"default": "0", "validRange": {"min": "0", "step": "1m"}}}) \
        is None
    assert between_steps({"value": "1", "requestPolicy": {"default": "500m", "validRange": {"min": "500m"}}}) == \
        (250 * m, 500 * m)
    # a max below half the capacity: two claims cannot take it all
    assert split_whole({"value": "1", "requestPolicy": {"default": "0",
                                                        "validRange": {"min": "0", "step": "50m", "max": "300m"}}}) \
        is None


def test_what_a_device_records_as_consumed_and_what_fits_beside():
    from decimal import Decimal

    from conformance.capacity import beside, consumed, fit
    from harness.config.capabilities import quantity

    nvme, m = _nvme(), Decimal("0.001")
    gi = quantity("1Gi")
    assert consumed(nvme, {}) == {"size": 100 * gi, "ioShare": 0}  # the policies' defaults
    assert consumed(nvme, {"ioShare": 120 * m}) == {"size": 100 * gi, "ioShare": 150 * m}
    assert consumed(nvme, {"ioShare": 850 * m}) is None  # above max: the device cannot serve it
    assert fit(nvme, [{"ioShare": 450 * m}, {"ioShare": 550 * m}])
    assert not fit(nvme, [{"ioShare": 450 * m}, {"ioShare": 550 * m}, {"ioShare": 50 * m}])
    assert beside(nvme, "ioShare", 3) == {}  # three default sizes fit in 7680G
    assert beside(nvme, "ioShare", 100) == {"size": 10 * gi}  # a hundred do not: the least each
    plain = {"capacity": {"bw": {"value": "1", "requestPolicy": {"default": "0", "validRange": {"min": "0",
                                                                                                "step": "50m"}}},
                          "slots": {"value": "4"}}}
    assert consumed(plain, {"bw": 50 * m}) == {"bw": 50 * m, "slots": 4}  # no policy, no amount: all of it
    assert beside(plain, "bw", 3) == {"slots": Decimal("1.333")}
    assert not fit(plain, [{}, {}]) and fit(plain, [{"slots": 2}, {"slots": 2}])


# --- DeviceTaintRules: a device a blocking rule selects is not free -----------------------------

def test_blocking_rules_rule_out_the_devices_they_select():
    from types import SimpleNamespace as NS

    from conformance.published_devices import _ruled_out, blocking_rule_selectors

    def rule(effect, **selector):
        chosen = NS(driver=selector.get("driver"), pool=selector.get("pool"), device=selector.get("device"))
        return NS(spec=NS(taint=NS(effect=effect), device_selector=chosen if selector else None))

    rules = [rule("NoSchedule", driver="gpu.example.com", device="gpu-0"), rule("None", driver="gpu.example.com"),
             rule("NoExecute", pool="node-b")]
    k8s = NS(resource=NS(list_device_taint_rule=lambda: NS(items=rules)))
    selectors = blocking_rule_selectors(k8s)
    assert selectors == [("gpu.example.com", None, "gpu-0"), (None, "node-b", None)]  # effect None blocks nothing
    assert _ruled_out(("gpu.example.com", "node-a", "gpu-0"), selectors)
    assert not _ruled_out(("gpu.example.com", "node-a", "gpu-1"), selectors)
    assert _ruled_out(("nic.example.com", "node-b", "nic-3"), selectors)  # the whole pool
    # the API: an empty selector matches every device, a missing one none
    empty = NS(spec=NS(taint=NS(effect="NoSchedule"), device_selector=NS(driver=None, pool=None, device=None)))
    everything = blocking_rule_selectors(NS(resource=NS(list_device_taint_rule=lambda: NS(items=[empty]))))
    assert _ruled_out(("any.example.com", "p", "d"), everything)
    assert blocking_rule_selectors(NS(resource=NS(list_device_taint_rule=lambda: NS(items=[rule("NoSchedule")])))) == []


# --- devices nothing tells apart: pinned by DeviceTaintRules; network-attached pools ------------

def test_network_attached_pools_are_reachable_from_the_nodes_their_selector_names():
    from conformance.published_devices import reachable_nodes
    labels = {"a": {"kubernetes.io/hostname": "a", "zone": "z1"}, "b": {"kubernetes.io/hostname": "b", "zone": "z2"}}
    assert reachable_nodes({"allNodes": True}, labels) == ["a", "b"]
    term = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z2"]}]}
    assert reachable_nodes({"nodeSelector": {"nodeSelectorTerms": [term]}}, labels) == ["b"]
    fields = {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["b"]}]}
    assert reachable_nodes({"nodeSelector": {"nodeSelectorTerms": [fields]}}, labels) == ["a"]
    exists = {"matchExpressions": [{"key": "zone", "operator": "Exists"}, {"key": "gpu", "operator": "DoesNotExist"}]}
    assert reachable_nodes({"nodeSelector": {"nodeSelectorTerms": [exists]}}, labels) == ["a", "b"]
    assert reachable_nodes({"nodeSelector": {"nodeSelectorTerms": [{}]}}, labels) == []  # an empty term: none
    assert reachable_nodes({}, labels) == []


class _Objects:
    """Stands in for the test's cluster objects: records the DeviceTaintRules a pool makes."""

    def __init__(self):
        self.rules: list[dict] = []

    def device_taint_rule(self, body: dict):
        self.rules.append(body)

    def device_class(self, body: dict):
        pass


def _bare_pool(objects_made: _Objects, count: int = 2):
    from conformance.published_devices import Device
    from conformance.under_test import DevicePool
    devices = [Device(DRIVER, "node-a", f"gpu-{i}", "node-a", {"name": f"gpu-{i}"}) for i in range(count)]
    return DevicePool(None, objects_made, lambda prefix: f"{prefix}-x", driver=DRIVER, device_class="bare",  # type: ignore[arg-type]
                      node="node-a", devices=devices, identity=None, identity_name="", kubelet=False, image="i",
                      pull_policy="Never", vendor=True, pin_by_taints=True)


def test_a_pool_pinned_by_taints_tolerates_exactly_the_devices_each_request_asks_for():
    from conformance.under_test import PIN_TAINT_KEY
    made = _Objects()
    pool = _bare_pool(made)
    whole = pool.request("all", count=2)
    assert whole["exactly"]["selectors"] == [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]
    assert [t["value"] for t in whole["exactly"]["tolerations"]] == ["gpu-0", "gpu-1"]
    assert made.rules == []  # no subset asked for yet: the pool's own devices stay untainted
    one = pool.request("one", devices=(pool.devices[1],))
    assert [(t["key"], t["operator"], t["value"], t["effect"]) for t in one["exactly"]["tolerations"]] == [
        (PIN_TAINT_KEY, "Equal", "gpu-1", "NoSchedule")]
    # now each device carries its own pin value, once
    assert [(r["spec"]["deviceSelector"]["device"], r["spec"]["taint"]["value"]) for r in made.rules] == [
        ("gpu-0", "gpu-0"), ("gpu-1", "gpu-1")]
    pool.request("again", devices=(pool.devices[0],))
    assert len(made.rules) == 2


def test_an_own_class_of_some_devices_is_pinned_through_its_requests():
    made = _Objects()
    pool = _bare_pool(made)
    name = pool.own_class("first", devices=(pool.devices[0],))
    request = pool.request("first", device_class=name)
    assert request["exactly"]["deviceClassName"] == name
    assert [t["value"] for t in request["exactly"]["tolerations"]] == ["gpu-0"]


def test_a_subset_outside_a_request_is_not_applicable():
    import pytest
    pool = _bare_pool(_Objects())
    assert pool.only() == f'device.driver == "{DRIVER}"'
    with pytest.raises(pytest.skip.Exception, match="^not applicable: the test selects 1 particular device"):
        pool.only(pool.devices[0])


def test_the_least_amount_above_is_one_step_past_it_not_one_unit():
    """The consumable-capacity test asks for a little more than two halves left: on a fractional capacity (the
    nvme-storage profile's ioShare: 1, steps of 50m, at most 800m) that is 50m, where "left + 1" found none."""
    from decimal import Decimal

    from conformance.capacity import smallest_valid_above

    io_share = {"value": "1", "requestPolicy": {"default": "0", "validRange": {"min": "0", "max": "800m", "step": "50m"}}}
    assert smallest_valid_above(io_share, Decimal(0)) == Decimal("0.05")
    assert smallest_valid_above(io_share, Decimal("0.05")) == Decimal("0.1")
    assert smallest_valid_above(io_share, Decimal("0.8")) is None  # past the policy's max
    sized = {"value": "1Ti", "requestPolicy": {"validRange": {"min": "10Gi", "step": "10Gi"}}}
    gi = Decimal(1024 ** 3)
    assert smallest_valid_above(sized, Decimal(0)) == 10 * gi and smallest_valid_above(sized, 10 * gi) == 20 * gi
    assert smallest_valid_above(sized, 1020 * gi) is None  # 1030Gi would be more than the device has
    listed = {"value": "8", "requestPolicy": {"validValues": ["2", "4", "8"]}}
    assert smallest_valid_above(listed, Decimal(2)) == 4 and smallest_valid_above(listed, Decimal(8)) is None
    free = {"value": "1", "requestPolicy": {}}
    assert Decimal(0) < smallest_valid_above(free, Decimal("0.5")) - Decimal("0.5") <= Decimal("0.000000001")
