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
