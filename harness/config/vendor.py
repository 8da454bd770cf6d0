"""Vendor mode: the description of a driver under test that is not ours (`--driver-config vendor.yaml`).

    apiVersion: dra-harness.x-k8s.io/v1alpha1
    kind: VendorDriver
    metadata: {name: acme-gpu}
    spec:
      drivers: [gpu.acme.example]            # driver names it publishes ResourceSlices as
      deviceClasses: {gpu: acme-gpu}         # device type -> the DeviceClass it installs
      extendedResources: {gpu: acme.example/gpu}
      features: [DRAExtendedResource, DRADeviceTaints, DRAPartitionableDevices]   # what it claims to support
      testImage: registry.k8s.io/pause:3.10  # what the kubelet checks run on your nodes (default shown)

The suite then tests that driver as it is: checks of its published slices, and the feature tests it
claims; tests that need the fake driver's powers (profiles, fault injection) are skipped with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from fake_devices.errors import InvalidInput, Problem
from fake_devices.schema import DNS_SUBDOMAIN, Reader, read_header

KIND = "VendorDriver"
API_VERSION = "dra-harness.x-k8s.io/v1alpha1"
DEFAULT_TEST_IMAGE = "registry.k8s.io/pause:3.10"


@dataclass(frozen=True)
class VendorDriver:
    name: str
    drivers: tuple[str, ...]
    device_classes: dict[str, str] = field(default_factory=dict)
    extended_resources: dict[str, str] = field(default_factory=dict)
    features: frozenset[str] = frozenset()
    test_image: str = DEFAULT_TEST_IMAGE


def load(path: str) -> VendorDriver:
    problems: list[Problem] = []
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise InvalidInput([Problem(path, "(file)", f"cannot read: {err}")]) from None
    top = Reader(data, path, "", problems)
    name, spec = read_header(top, API_VERSION, KIND)
    drivers = []
    for i, driver in enumerate(spec.scalars("drivers")):
        if not isinstance(driver, str) or not DNS_SUBDOMAIN.match(driver) or len(driver) > 63:
            spec.fail(f"spec.drivers[{i}]", f"{driver!r} is not a driver name", "a DNS subdomain of at most 63 characters")
        else:
            drivers.append(driver)
    if not drivers and "drivers" not in [p.field for p in problems]:
        spec.fail("spec.drivers", "must name at least one driver")
    classes = {str(k): str(v) for k, v in spec.raw_mapping("deviceClasses").items()}
    extended = {str(k): str(v) for k, v in spec.raw_mapping("extendedResources").items()}
    features = frozenset(str(f) for f in spec.scalars("features"))
    test_image = spec.str("testImage", default=DEFAULT_TEST_IMAGE)
    spec.done()
    top.done()
    if problems:
        raise InvalidInput(problems)
    return VendorDriver(name or "", tuple(drivers), classes, extended, features, test_image or DEFAULT_TEST_IMAGE)
