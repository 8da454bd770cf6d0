"""How a request pins particular devices of a driver among all it publishes: by an attribute whose value
tells them apart (the identity), or by all their attributes together (a fingerprint), written as CEL."""

from __future__ import annotations

import json

from conformance.published_devices import Device

# attributes that name one device, looked for first; any other string/int attribute with distinct values also does
IDENTITY_ATTRIBUTES = ("uuid", "resource.kubernetes.io/pciBusID", "serial", "index")


def _value(attribute: dict):
    for kind in ("string", "int", "bool", "version"):
        if attribute.get(kind) is not None:
            return kind, attribute[kind]
    return None, None


def identity_attribute(driver: str, devices: list[dict]) -> tuple[str, str] | None:
    """(CEL of an attribute, its kind) whose value differs on each of `devices` (all of the driver's
    published devices), or None when no attribute tells them apart."""
    candidates: dict[str, list] = {}
    for device in devices:
        for name, attribute in (device.get("attributes") or {}).items():
            kind, value = _value(attribute)
            if kind in ("string", "int"):
                candidates.setdefault(name, []).append((kind, value))
    usable = [name for name, values in candidates.items()
              if len(values) == len(devices) and len({v for _, v in values}) == len(values)
              and len({k for k, _ in values}) == 1]
    if not usable:
        return None
    usable.sort(key=lambda n: (IDENTITY_ATTRIBUTES.index(n) if n in IDENTITY_ATTRIBUTES else len(IDENTITY_ATTRIBUTES), n))
    name = usable[0]
    domain, _, local = name.rpartition("/")
    return f'device.attributes["{domain or driver}"].{local}', candidates[name][0][0]


def attribute_literal(device: dict, name: str):
    kind, value = _value((device.get("attributes") or {}).get(name) or {})
    return json.dumps(value) if kind == "string" else str(value)


def _cel_attribute(driver: str, key: str) -> str:
    domain, _, local = key.rpartition("/")
    return f'device.attributes["{domain or driver}"].{local}'


def _pinnable(attribute: dict) -> bool:
    kind, _ = _value(attribute)
    return kind in ("string", "int", "bool")


def fingerprint(driver: str, device: dict, keys: frozenset[str]) -> str:
    """CEL true for the devices of `driver` whose string, int and bool attributes are exactly those of
    `device` (`keys`: every such attribute name the driver publishes; the others must be absent)."""
    attributes = device.get("attributes") or {}
    terms = []
    for key in sorted(keys):
        attribute = attributes.get(key)
        cel = _cel_attribute(driver, key)
        if attribute is None or not _pinnable(attribute):
            terms.append(f"!has({cel})")
            continue
        kind, value = _value(attribute)
        literal = json.dumps(value) if kind in ("string", "bool") else str(value)  # JSON true/false is CEL's
        terms.append(f"has({cel}) && {cel} == {literal}")
    return " && ".join(terms) or "true"


def fingerprint_keys(devices: list[dict]) -> frozenset[str]:
    return frozenset(k for d in devices for k, a in (d.get("attributes") or {}).items() if _pinnable(a))


def _fingerprint_value(device: dict, keys: frozenset[str]) -> tuple:
    attributes = device.get("attributes") or {}
    return tuple((k, _value(attributes[k])) if k in attributes else (k, None) for k in sorted(keys))


def fingerprints_unique(devices: list[dict]) -> bool:
    keys = fingerprint_keys(devices)
    values = [_fingerprint_value(d, keys) for d in devices]
    return len(set(values)) == len(values)


def _identity_name(driver: str, devices: list[Device], cel: str) -> str:
    """The attribute key (as the slice spells it) behind an identity CEL expression."""
    domain, local = cel.split('"')[1], cel.rsplit(".", 1)[1]
    for key in devices[0].published.get("attributes") or {}:
        d, _, loc = key.rpartition("/")
        if loc == local and (d or driver) == domain:
            return key
    raise AssertionError(f"{cel} names no attribute of {devices[0].path}")
