"""CDI spec files for prepared claims: a pure function from an allocation to the spec's content.

One spec file per claim, `<vendor>-<class>_<claim UID>.json` (the CDI naming of transient specs),
kind `<vendor>/<class>` with the driver name as vendor and the driver's first DNS label as class
(`gpu.example.com` -> `gpu.example.com/gpu`). One CDI device per allocated device, named
`<claim UID>-<device>` (plus `-<share ID>` for a share of a consumable-capacity device), so names
never collide across claims in the runtime's CDI cache. Fake devices have no device nodes: each CDI
device only sets environment variables that describe exactly what was allocated (see
docs/kubelet-plugin.md for the list), which a test container can read back.

cdiVersion 0.5.0: environment-only edits exist since 0.3.0, but device names that start with a
digit (claim UIDs do) need 0.5.0, and the spec uses nothing newer.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

CDI_VERSION = "0.5.0"
ENV_PREFIX = "DRA_"
STANDARD_DOMAIN = "resource.kubernetes.io"
_VENDOR_OR_CLASS = re.compile(r"^[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?$")
_DEVICE_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")


@dataclass(frozen=True)
class ClaimRef:
    namespace: str
    name: str
    uid: str


@dataclass(frozen=True)
class AllocatedDevice:
    """One allocation result of this driver, joined with what the driver publishes for the device."""

    request: str  # as in the allocation ("gpu", or "gpu/small" for a firstAvailable subrequest)
    driver: str
    pool: str
    device: str
    attributes: dict = field(default_factory=dict)  # ResourceSlice form: {"model": {"string": "H100"}}
    capacity: dict = field(default_factory=dict)  # ResourceSlice form: {"memory": {"value": "80Gi"}}
    share_id: str | None = None
    consumed_capacity: dict = field(default_factory=dict)  # {"size": "500Gi"}
    admin_access: bool = False
    configs: tuple = ()  # (source, opaque parameters) of this driver's configs for the request, class's first


def vendor_and_class(driver: str) -> tuple[str, str]:
    label = driver.split(".", 1)[0]
    return driver, (label if _VENDOR_OR_CLASS.match(label) else "device")


def valid_vendor(driver: str) -> bool:
    return bool(_VENDOR_OR_CLASS.match(driver))


def kind(driver: str) -> str:
    vendor, cls = vendor_and_class(driver)
    return f"{vendor}/{cls}"


def spec_file_name(driver: str, claim_uid: str) -> str:
    vendor, cls = vendor_and_class(driver)
    return f"{vendor}-{cls}_{claim_uid}.json"


def device_name(claim_uid: str, device: AllocatedDevice) -> str:
    name = f"{claim_uid}-{device.device}"
    if device.share_id:
        name += f"-{device.share_id}"
    return name


def qualified_id(driver: str, name: str) -> str:
    return f"{kind(driver)}={name}"


def valid_device_name(name: str) -> bool:
    return bool(_DEVICE_NAME.match(name))


def env_token(text: str) -> str:
    """`pciBusID` -> `PCI_BUS_ID`, `gpu-0` -> `GPU_0`: upper snake case, only [A-Z0-9_]."""
    text = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", text)
    text = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", text)
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_").upper()


def attribute_token(name: str, driver: str) -> str:
    """Unqualified names and the driver's own or the standard domain drop the domain; others keep it."""
    domain, _, short = name.rpartition("/")
    if domain in ("", driver, STANDARD_DOMAIN):
        return env_token(short)
    return env_token(f"{domain}_{short}")


def _attribute_value(value: dict) -> str:
    for key in ("string", "version", "int"):
        if key in value:
            return str(value[key])
    if "bool" in value:
        return "true" if value["bool"] else "false"
    for key in ("strings", "versions", "ints"):  # list attributes (DRAListTypeAttributes): comma-separated
        if key in value:
            return ",".join(str(item) for item in value[key])
    if "bools" in value:
        return ",".join("true" if item else "false" for item in value["bools"])
    return json.dumps(value, sort_keys=True)


def device_env_key(claim_uid: str, device: AllocatedDevice) -> str:
    """The per-device variable prefix: device name and claim UID (and share), so that several
    devices and claims in one container never overwrite each other's variables."""
    key = f"{env_token(device.device)}_{env_token(claim_uid[:8])}"
    if device.share_id:
        key += f"_{env_token(device.share_id[:8])}"
    return ENV_PREFIX + key


def device_env(claim: ClaimRef, device: AllocatedDevice, cdi_id: str) -> list[str]:
    prefix = device_env_key(claim.uid, device)
    pairs = [("DEVICE", device.device), ("POOL", device.pool), ("DRIVER", device.driver),
             ("REQUEST", device.request), ("CLAIM", f"{claim.namespace}/{claim.name}"), ("CLAIM_UID", claim.uid),
             ("CDI_DEVICE", cdi_id)]
    if device.share_id:
        pairs.append(("SHARE_ID", device.share_id))
    if device.admin_access:
        pairs.append(("ADMIN_ACCESS", "true"))
    pairs += sorted((f"ATTR_{attribute_token(name, device.driver)}", _attribute_value(value))
                    for name, value in device.attributes.items())
    pairs += sorted((f"CAPACITY_{env_token(name)}", str((value or {}).get("value", "")))
                    for name, value in device.capacity.items())
    pairs += sorted((f"CONSUMED_{env_token(name)}", str(value)) for name, value in device.consumed_capacity.items())
    for i, (source, parameters) in enumerate(device.configs):
        pairs += [(f"CONFIG_{i}", _compact(parameters)), (f"CONFIG_{i}_SOURCE", source)]
    if device.configs:
        pairs.append(("CONFIG", _compact(effective_config(device.configs))))
    return [f"{prefix}_{key}={value}" for key, value in pairs]


def effective_config(configs: tuple) -> dict:
    """The settings in force: the JSON objects of all configs merged in order, so a key the claim sets
    overrides the same key from the class. Parameters that are not objects cannot be merged and are
    left out (they still appear as CONFIG_<i>)."""
    merged: dict = {}
    for _, parameters in configs:
        if isinstance(parameters, dict):
            merged.update(parameters)
    return merged


def _compact(value) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def build_spec(driver: str, claim: ClaimRef, devices: list[AllocatedDevice]) -> tuple[dict, list[str]]:
    """The CDI spec of one claim, and the fully qualified CDI ID of each device (same order)."""
    cdi_devices, ids, used = [], [], set()
    for index, device in enumerate(devices):
        name = device_name(claim.uid, device)
        if name in used:  # the same device twice in one claim without share IDs: keep names unique
            name = f"{name}-{index}"
        used.add(name)
        cdi_id = qualified_id(driver, name)
        cdi_devices.append({"name": name, "containerEdits": {"env": device_env(claim, device, cdi_id)}})
        ids.append(cdi_id)
    return {"cdiVersion": CDI_VERSION, "kind": kind(driver), "devices": cdi_devices}, ids


def encode(spec: dict) -> bytes:
    return (json.dumps(spec, indent=2, sort_keys=True) + "\n").encode()  # stable: restores are byte-identical
