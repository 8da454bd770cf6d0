"""What to change so a node's published slices match the desired ones: a pure function.

Slices are compared by what a driver controls (devices, counters, taints), not by what the server
adds (resourceVersion, timestamps, taint timeAdded). When anything in a pool differs, every slice of
the pool is rewritten with a higher generation, because the scheduler only trusts a pool whose
slices all carry its newest generation; when nothing differs, nothing is written, which is what makes
a restarted driver leave its slices exactly as they were.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fake_devices.schema import quantity_value


@dataclass
class Plan:
    create: list[dict] = field(default_factory=list)
    update: list[tuple[dict, str]] = field(default_factory=list)  # (desired with new generation, resourceVersion)
    delete: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.create or self.update or self.delete)


def _quantities(value):
    """Replace quantity strings by their numbers, recursively: the server answers in canonical form
    (1024Mi comes back as 1Gi), which must not look like a change."""
    if isinstance(value, dict):
        return {k: (_number(v) if k in ("value", "default", "min", "max", "step") else _quantities(v))
                for k, v in value.items()}
    if isinstance(value, list):
        return [_quantities(v) for v in value]
    return value


def _number(value):
    try:
        return quantity_value(str(value))
    except ValueError:
        return value


def _device_view(device: dict) -> dict:
    view = {k: device[k] for k in ("name", "attributes", "allowMultipleAllocations")
            if device.get(k) not in (None, [], {}, False)}
    for key in ("capacity", "consumesCounters"):
        if device.get(key):
            view[key] = _quantities(device[key])
    taints = [{k: t.get(k) for k in ("key", "value", "effect")} for t in device.get("taints") or []]
    if taints:
        view["taints"] = taints
    return view


def content(slice_obj: dict) -> dict:
    """The part of a slice that the driver decides (comparable between desired and server copies)."""
    spec = slice_obj.get("spec") or {}
    return {"driver": spec.get("driver"), "nodeName": spec.get("nodeName"),
            "pool": (spec.get("pool") or {}).get("name"),
            "resourceSliceCount": (spec.get("pool") or {}).get("resourceSliceCount"),
            "devices": [_device_view(d) for d in spec.get("devices") or []],
            "sharedCounters": _quantities(spec.get("sharedCounters") or []),
            "owner": [(o.get("kind"), o.get("name")) for o in (slice_obj.get("metadata") or {}).get("ownerReferences")
                      or []]}


def dropped_fields(sent, stored, path: str = "spec") -> list[str]:
    """Paths of fields set in what the driver sent that the API server's copy does not have: what an API
    server drops when the feature gate of a field is off (as the kubelet plugin library's DroppedFieldsError
    reports, k8s.io/dynamic-resource-allocation@v0.37.2 resourceslice). Values are not compared (the server
    normalizes quantities); only presence."""
    if isinstance(sent, dict):
        if not isinstance(stored, dict):
            return [path]
        found = []
        for key, value in sent.items():
            if value in (None, [], {}, False, ""):
                continue
            if key not in stored or stored[key] in (None, [], {}):
                found.append(f"{path}.{key}")
            else:
                found += dropped_fields(value, stored[key], f"{path}.{key}")
        return found
    if isinstance(sent, list) and sent and isinstance(sent[0], dict):
        if not isinstance(stored, list):
            return [path]
        found = []
        for i, item in enumerate(sent):
            name = item.get("name") if isinstance(item, dict) else None
            where = f"{path}[{name}]" if name else f"{path}[{i}]"
            found += dropped_fields(item, stored[i], where) if i < len(stored) else [where]
        return found
    return []


def generation_of(slice_obj: dict) -> int:
    return int(((slice_obj.get("spec") or {}).get("pool") or {}).get("generation") or 0)


def with_generation(slice_obj: dict, generation: int) -> dict:
    spec = dict(slice_obj["spec"])
    spec["pool"] = {**spec["pool"], "generation": generation}
    return {**slice_obj, "spec": spec}


def plan_pool(desired: list[dict], actual: list[dict]) -> Plan:
    """desired/actual: the slices of one pool (one driver on one node), as API dicts."""
    want = {s["metadata"]["name"]: s for s in desired}
    have = {s["metadata"]["name"]: s for s in actual}
    generations = {generation_of(s) for s in actual}
    consistent = len(generations) <= 1
    same = consistent and want.keys() == have.keys() and all(content(want[n]) == content(have[n]) for n in want)
    plan = Plan()
    if same:
        return plan
    generation = max(generations | {0}) + 1
    for name, slice_obj in want.items():
        if name in have:
            plan.update.append((with_generation(slice_obj, generation),
                                have[name]["metadata"].get("resourceVersion") or ""))
        else:
            plan.create.append(with_generation(slice_obj, generation))
    plan.delete = sorted(set(have) - set(want))
    return plan
