"""The arithmetic of shareable devices' capacity (KEP-5075 consumable capacity, DRAFractionalCapacityRange):
what the scheduler allocates for a request under a capacity's requestPolicy, what fits beside what, and
amounts just inside or outside a policy. Pure functions over a device as its slice publishes it (a dict);
the suite's pools (under_test.py) choose the devices, these work out the amounts.

Sources: k8s.io/api@v0.37.2 resource/v1 types.go (CapacityRequestPolicy: default, validValues, validRange
min/max/step) and k8s.io/dynamic-resource-allocation@v0.37.2 structured allocator (rounding a request up to
the next valid amount; the whole capacity when a request names none and the policy has no default).
"""

from __future__ import annotations

from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal

from harness.config.capabilities import fractional, quantity, ranged


def _valid_values(entry: dict) -> list[Decimal]:
    return sorted(quantity(v) for v in entry["requestPolicy"].get("validValues") or [])


def smallest_valid(entry: dict, at_least: Decimal) -> Decimal | None:
    """The amount the scheduler allocates for a request of `at_least` (rounded up by the request
    policy), or None when no valid amount is that large (or the capacity is smaller)."""
    value, policy = quantity(entry["value"]), entry["requestPolicy"]
    found: Decimal | None
    if policy.get("validValues"):
        found = next((v for v in _valid_values(entry) if v >= at_least), None)
    else:
        valid = policy.get("validRange") or {}
        low = quantity(valid.get("min", "0"))
        step = quantity(valid["step"]) if valid.get("step") else None
        found = low if at_least <= low else (
            low + step * ((at_least - low) / step).to_integral_value(rounding=ROUND_CEILING) if step else at_least)
        if valid.get("max") and found > quantity(valid["max"]):
            found = None
    return found if found is not None and found <= value else None


def smallest_valid_above(entry: dict, amount: Decimal) -> Decimal | None:
    """The least amount the scheduler allocates that is more than `amount` (one step past it, not one unit:
    a fractional capacity's steps are thousandths), or None when none fits the capacity."""
    policy = entry["requestPolicy"]
    if policy.get("validValues"):
        found = next((v for v in _valid_values(entry) if v > amount), None)
        return found if found is not None and found <= quantity(entry["value"]) else None
    valid = policy.get("validRange") or {}
    low = quantity(valid.get("min", "0"))
    if amount < low:
        return smallest_valid(entry, low)
    step = quantity(valid["step"]) if valid.get("step") else NANO  # the API's quantities go no finer than 1n
    return smallest_valid(entry, low + step * (((amount - low) / step).to_integral_value(rounding=ROUND_FLOOR) + 1))


def largest_valid(entry: dict, at_most: Decimal) -> Decimal | None:
    """The largest amount a request may ask for and get exactly, no more than `at_most`."""
    policy = entry["requestPolicy"]
    if policy.get("validValues"):
        return next((v for v in reversed(_valid_values(entry)) if v <= at_most), None)
    valid = policy.get("validRange") or {}
    low = quantity(valid.get("min", "0"))
    at_most = min(at_most, quantity(valid["max"])) if valid.get("max") else at_most
    if at_most < low:
        return None
    return low + quantity(valid["step"]) * ((at_most - low) // quantity(valid["step"])) if valid.get("step") \
        else at_most


def default_share(entry: dict) -> Decimal:
    """What a request that names no amount of this capacity is allocated: the policy's default, else all."""
    default = entry["requestPolicy"].get("default")
    return quantity(default) if default is not None else quantity(entry["value"])


MILLI = Decimal("0.001")
NANO = Decimal("0.000000001")
def fractional_missing(drivers, devices: list[dict]) -> str | None:
    """Why no device of `drivers` (`devices`: all they publish) serves the fractional-capacity tests,
    naming the missing capability; None when one publishes a fractional validRange."""
    if any(fractional(d) for d in devices):
        return None
    names = ", ".join(drivers)
    integral = [f"{d['name']}: {name} {entry['requestPolicy']['validRange']}" for d in devices
                for name, entry in sorted(ranged(d).items())]
    if not integral:
        return f"{names} publishes no capacity with requestPolicy.validRange"
    return (f"{names} publishes requestPolicy.validRange only with whole-number min, max and step (e.g. "
            f"{integral[0]}): no capacity with a fractional one, which DRAFractionalCapacityRange computes in "
            "milli-units")


def milli_floor(value: Decimal) -> Decimal:
    return value.quantize(MILLI, rounding=ROUND_FLOOR)


def milli_text(value: Decimal) -> str:
    """A quantity as a request writes it: whole numbers as they are, fractions in milli-units (120m)."""
    if value == value.to_integral_value():
        return str(int(value))
    return f"{int(value * 1000)}m"


def decimal_text(value: Decimal) -> str:
    """A quantity in decimal notation (0.35), as some clients write a fraction."""
    return format(value.normalize(), "f")


def _bounds(entry: dict) -> tuple[Decimal, Decimal | None, Decimal | None, Decimal]:
    """(min, step, max, the most a request may get: max or else the capacity) of a validRange."""
    valid = entry["requestPolicy"]["validRange"]
    value = quantity(entry["value"])
    step = quantity(valid["step"]) if valid.get("step") is not None else None
    high = quantity(valid["max"]) if valid.get("max") is not None else None
    return quantity(valid.get("min") or "0"), step, high, value if high is None else min(high, value)


def consumed(device: dict, requests: dict[str, Decimal]) -> dict[str, Decimal] | None:
    """What the scheduler records as consumed of each capacity of `device` for a request of these
    amounts (an amount it does not name: the policy's default, else the whole capacity), or None when
    the request violates a policy (the device cannot serve it)."""
    found: dict[str, Decimal] = {}
    for name, entry in (device.get("capacity") or {}).items():
        if name not in requests:
            found[name] = default_share(entry) if entry.get("requestPolicy") else quantity(entry["value"])
        elif entry.get("requestPolicy"):
            rounded = smallest_valid(entry, requests[name])
            if rounded is None:
                return None
            found[name] = rounded
        else:
            found[name] = requests[name]
    return found


def fit(device: dict, claims: list[dict[str, Decimal]]) -> bool:
    """Whether claims with these requests all fit on `device` together."""
    amounts = [consumed(device, c) for c in claims]
    if any(a is None for a in amounts):
        return False
    return all(sum((a[name] for a in amounts if a is not None), Decimal(0)) <= quantity(entry["value"])
               for name, entry in (device.get("capacity") or {}).items())


def beside(device: dict, name: str, claims: int) -> dict[str, Decimal]:
    """Requests for the device's capacities other than `name` that let `claims` claims share it: none
    where that many defaults fit, else the least a request may ask for (a capacity without a policy:
    an equal part)."""
    extra: dict[str, Decimal] = {}
    for other, entry in sorted((device.get("capacity") or {}).items()):
        if other == name:
            continue
        value = quantity(entry["value"])
        if not entry.get("requestPolicy"):
            extra[other] = milli_floor(value / claims)
        elif claims * default_share(entry) > value:
            least = smallest_valid(entry, Decimal(0))
            if least is not None:
                extra[other] = least
    return extra


def between_steps(entry: dict) -> tuple[Decimal, Decimal] | None:
    """(a request off the range's steps, what it is rounded up to): halfway into the third step (or
    the second, the first) above min, or below a positive min without a step; None when no request
    lies between two valid amounts (a 1m step)."""
    low, step, _, top = _bounds(entry)
    if step is not None:
        half = milli_floor(step / 2)
        for n in (2, 1, 0):
            if half > 0 and low + (n + 1) * step <= top:
                return low + n * step + half, low + (n + 1) * step
    if low > 0 and milli_floor(low / 2) > 0:
        return milli_floor(low / 2), low
    return None


def split_whole(entry: dict) -> tuple[Decimal, Decimal] | None:
    """Two valid amounts, the first below half, that add up to exactly the whole capacity (or two
    halves); None when no two claims can take all of it."""
    value = quantity(entry["value"])
    first = largest_valid(entry, value / 2 - MILLI)
    for _ in range(100):
        if first is None or first <= 0:
            break
        if smallest_valid(entry, value - first) == value - first:
            return first, value - first
        first = largest_valid(entry, first - MILLI)
    half = value / 2
    if half == milli_floor(half) and half > 0 and smallest_valid(entry, half) == half:
        return half, half
    return None


def least_positive(entry: dict) -> Decimal | None:
    """The least amount above zero a request may be allocated."""
    low, step, _, _ = _bounds(entry)
    return smallest_valid(entry, low if low > 0 else (step or MILLI))


def above_max(entry: dict) -> Decimal | None:
    """A request above the range's max that the capacity itself would hold, or None (no max below it)."""
    _, step, high, _ = _bounds(entry)
    value = quantity(entry["value"])
    if high is None or high >= value:
        return None
    return high + step if step is not None and high + step <= value else high + MILLI


def above_capacity(entry: dict) -> Decimal:
    """A request for half as much again as the whole capacity."""
    value = quantity(entry["value"])
    return value + max(milli_floor(value / 2), MILLI)
