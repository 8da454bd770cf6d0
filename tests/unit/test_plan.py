"""fake_devices/plan.py: what to write so a node's published slices match the desired ones."""

from __future__ import annotations

import copy

import pytest

from fake_devices import plan, profile, render

DRIVERS = render.Drivers("fake.example.com")
NODE = "node-a"
NODE_UID = "00000000-0000-0000-0000-000000000001"


def _desired(name: str = "a100-mig", **kwargs) -> list[dict]:
    """The slices of one pool: the GPU driver's pool (three slices for a100-mig: counters + 2 x devices)."""
    slices = render.render_node(profile.load(name), NODE, DRIVERS, node_uid=NODE_UID, instance="test", **kwargs)
    return slices[DRIVERS.gpu]


def _as_served(slices: list[dict], generation: int = 4) -> list[dict]:
    """What the API server returns for these slices: the same content plus fields the server adds."""
    served = []
    for i, s in enumerate(copy.deepcopy(slices)):
        s["metadata"].update({"resourceVersion": f"{1000 + i}", "uid": f"uid-{i}", "generation": 1,
                              "creationTimestamp": "2030-01-01T00:00:00Z",
                              "managedFields": [{"manager": "fake-devices", "operation": "Apply"}]})
        s["spec"]["pool"]["generation"] = generation
        for device in s["spec"].get("devices", []):
            for taint in device.get("taints", []):
                taint["timeAdded"] = "2030-01-01T00:00:01Z"
        served.append(s)
    return served


def _names(slices) -> list[str]:
    return [s["metadata"]["name"] for s in slices]


def _rv(slices) -> dict[str, str]:
    return {s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in slices}


def test_desired_pool_has_several_slices():
    assert len(_desired()) == 3  # the tests below need a multi-slice pool to mean anything


@pytest.mark.parametrize("name", ["a100-mig", "tiny"])
def test_identical_pool_needs_no_writes(name):
    desired = _desired(name)
    result = plan.plan_pool(desired, _as_served(desired))
    assert result.empty
    assert (result.create, result.update, result.delete) == ([], [], [])


def test_server_fields_and_taint_time_are_ignored():
    desired = _desired(faults={"gpu-1": "unhealthy"})
    actual = _as_served(desired)
    tainted = [d for s in actual for d in s["spec"].get("devices", []) if "taints" in d]
    assert len(tainted) == 26 and all("timeAdded" in d["taints"][0] for d in tainted)
    assert plan.plan_pool(desired, actual).empty


def test_server_omitting_empty_fields_is_not_a_change():
    desired = _desired("tiny")
    actual = _as_served(desired)
    for s in desired:  # desired spells out empty/false values the server would not return
        for device in s["spec"]["devices"]:
            device.update({"taints": [], "consumesCounters": [], "allowMultipleAllocations": False})
    assert plan.plan_pool(desired, actual).empty


def test_empty_pool_stays_empty():
    assert plan.plan_pool([], []).empty


def test_changed_attribute_rewrites_every_slice_of_the_pool():
    desired = _desired()
    actual = _as_served(desired, generation=4)
    changed = copy.deepcopy(desired)
    changed[2]["spec"]["devices"][-1]["attributes"]["model"] = {"string": "A100-SXM4-40GB"}

    result = plan.plan_pool(changed, actual)
    assert result.create == [] and result.delete == []
    assert _names(body for body, _ in result.update) == _names(desired)
    assert {body["metadata"]["name"]: rv for body, rv in result.update} == _rv(actual)
    for body, _ in result.update:
        assert body["spec"]["pool"]["generation"] == 5
        assert "resourceVersion" not in body["metadata"] and "uid" not in body["metadata"]
    assert result.update[2][0]["spec"]["devices"][-1]["attributes"]["model"] == {"string": "A100-SXM4-40GB"}
    # the input is not modified
    assert {s["spec"]["pool"]["generation"] for s in changed} == {1}


def test_new_generation_is_above_the_highest_seen():
    desired = _desired("tiny")
    actual = _as_served(desired, generation=41)
    changed = copy.deepcopy(desired)
    changed[0]["spec"]["devices"][0]["capacity"]["memory"] = {"value": "15Gi"}
    ((body, rv),) = plan.plan_pool(changed, actual).update
    assert body["spec"]["pool"]["generation"] == 42
    assert rv == actual[0]["metadata"]["resourceVersion"]


@pytest.mark.parametrize("change", ["taint effect", "new taint", "counter", "owner", "slice count"])
def test_each_driver_controlled_field_counts(change):
    desired = _desired(faults={"gpu-1": "warning"})
    actual = _as_served(desired)
    changed = copy.deepcopy(desired)
    devices = {d["name"]: d for s in changed for d in s["spec"].get("devices", [])}
    if change == "taint effect":
        devices["gpu-1"]["taints"][0]["effect"] = "NoExecute"
    elif change == "new taint":
        devices["gpu-2"]["taints"] = [{"key": render.FAULT_TAINT_KEY, "value": "warning", "effect": "None"}]
    elif change == "counter":
        changed[0]["spec"]["sharedCounters"][0]["counters"]["compute-slices"] = {"value": "6"}
    elif change == "owner":
        changed[1]["metadata"]["ownerReferences"][0]["name"] = "node-b"
    else:
        for s in changed:
            s["spec"]["pool"]["resourceSliceCount"] = 4
    result = plan.plan_pool(changed, actual)
    assert len(result.update) == 3 and not result.create and not result.delete


def test_missing_slice_is_created_and_the_others_updated():
    desired = _desired()
    actual = _as_served(desired, generation=2)
    missing = actual.pop(1)

    result = plan.plan_pool(desired, actual)
    (created,) = result.create
    assert created["metadata"]["name"] == missing["metadata"]["name"]
    assert created["spec"]["pool"]["generation"] == 3
    assert "resourceVersion" not in created["metadata"]
    assert _names(body for body, _ in result.update) == _names(actual)
    assert {body["metadata"]["name"]: rv for body, rv in result.update} == _rv(actual)
    assert {body["spec"]["pool"]["generation"] for body, _ in result.update} == {3}
    assert result.delete == []


def test_extra_slice_is_deleted():
    desired = _desired()
    actual = _as_served(desired, generation=2)
    extra = copy.deepcopy(actual[2])
    extra["metadata"]["name"] = render.slice_name(NODE, DRIVERS.gpu, 3)
    extra["metadata"]["resourceVersion"] = "2000"
    actual.append(extra)

    result = plan.plan_pool(desired, actual)
    assert result.delete == [extra["metadata"]["name"]]
    assert result.create == []
    # the remaining slices are rewritten too: the pool's generation must move past the deleted slice's
    assert _names(body for body, _ in result.update) == _names(desired)
    assert {body["spec"]["pool"]["generation"] for body, _ in result.update} == {3}


def test_mixed_generations_are_rewritten_even_when_contents_match():
    desired = _desired()
    actual = _as_served(desired, generation=3)
    actual[1]["spec"]["pool"]["generation"] = 5  # e.g. a writer died half-way through an update

    result = plan.plan_pool(desired, actual)
    assert not result.empty
    assert _names(body for body, _ in result.update) == _names(desired)
    assert {body["spec"]["pool"]["generation"] for body, _ in result.update} == {6}
    assert {body["metadata"]["name"]: rv for body, rv in result.update} == _rv(actual)
    assert result.create == [] and result.delete == []


def test_empty_desired_deletes_everything():
    actual = _as_served(_desired())
    result = plan.plan_pool([], actual)
    assert sorted(result.delete) == sorted(_names(actual))
    assert result.delete == sorted(result.delete)
    assert result.create == [] and result.update == []


def test_nothing_published_yet_creates_everything_at_generation_one():
    desired = _desired()
    result = plan.plan_pool(desired, [])
    assert _names(result.create) == _names(desired)
    assert {s["spec"]["pool"]["generation"] for s in result.create} == {1}
    assert result.update == [] and result.delete == []


def test_content_ignores_generation_and_server_metadata():
    desired = _desired("tiny")[0]
    served = _as_served([desired], generation=9)[0]
    assert plan.content(desired) == plan.content(served)
    assert plan.generation_of(served) == 9 and plan.generation_of({}) == 0
    bumped = plan.with_generation(desired, 2)
    assert bumped["spec"]["pool"]["generation"] == 2 and desired["spec"]["pool"]["generation"] == 1


@pytest.mark.parametrize("name", ["a100-mig", "tiny", "mixed", "dgx-h100", "nvme-storage"])
def test_a_served_copy_of_every_builtin_profile_drops_nothing(name):
    slices = render.render_node(profile.load(name), NODE, DRIVERS, node_uid=NODE_UID, instance="test",
                                faults={"gpu-1": "unhealthy"})
    for desired in slices.values():
        for sent, served in zip(desired, _as_served(desired)):
            assert plan.dropped_fields(sent["spec"], served["spec"]) == [], sent["metadata"]["name"]


def test_fields_the_server_dropped_are_named_with_their_device():
    (sent, *_) = _desired("tiny")
    served = copy.deepcopy(sent)
    device = served["spec"]["devices"][0]
    name = device["name"]
    device.pop("bindingConditions", None)
    sent["spec"]["devices"][0]["bindingConditions"] = ["example.com/attached"]  # a field of a gate that is off
    served["spec"]["devices"][0]["attributes"].pop("uuid")
    assert plan.dropped_fields(sent["spec"], served["spec"]) == [
        f"spec.devices[{name}].attributes.uuid", f"spec.devices[{name}].bindingConditions"]


class _DroppingServer:
    """Pure logic: a stand-in for the ResourceSlice API that stores what it gets minus one field, as an API
    server does with a field whose feature gate is off."""

    def __init__(self, field: str):
        self.field, self.writes, self.names = field, 0, []

    def create_resource_slice(self, body):
        self.writes += 1
        self.names.append(body["metadata"]["name"])
        stored = copy.deepcopy(body)
        for device in stored["spec"].get("devices", []):
            device.get("attributes", {}).pop(self.field, None)
        stored["metadata"]["resourceVersion"] = str(self.writes)
        return stored


def test_the_driver_reports_fields_the_server_dropped_instead_of_rewriting_them():
    from fake_devices.config import DriverConfig
    from fake_devices.controller import FakeDriver, FieldsDropped, SliceRejected

    tiny = profile.load("tiny")
    driver = FakeDriver(DriverConfig("t", "fake.example.com", {"tiny": tiny}, nodes={NODE: "tiny"}), api_client=None)
    server = _DroppingServer("uuid")
    driver.resource = server  # type: ignore[assignment]
    driver.api = type("Api", (), {"sanitize_for_serialization": staticmethod(lambda obj: obj)})()
    driver._nodes[NODE] = (NODE_UID, "tiny")
    with pytest.raises(FieldsDropped) as info:
        driver.reconcile(NODE)
    assert "the API server dropped spec.devices[gpu-0].attributes.uuid" in str(info.value)
    assert "feature gate" in str(info.value) and info.value.node == NODE
    # it stopped at the first slice that lost a field (a SliceRejected: the worker retries only slowly)
    assert server.names[-1] == info.value.slice_name and isinstance(info.value, SliceRejected)
