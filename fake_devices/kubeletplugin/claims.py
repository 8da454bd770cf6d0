"""Is this ResourceClaim ours to prepare on this node? Pure checks on the claim as the API returns it.

Every refusal is a `ClaimError` whose text is the per-claim error the kubelet sees: it names the
claim and says what is wrong (not allocated, allocated for another node or to other drivers, UID
changed because the claim was deleted and recreated) and, where it helps, what was found instead.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from fake_devices.kubeletplugin.cdi import ClaimRef

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# UIDs end up in file and CDI device names: letters, digits and - _ . : only (no path separators).
_UID = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]{0,126}[A-Za-z0-9])?$")


class ClaimError(Exception):
    """A claim that cannot be prepared; str() is the per-claim error for the kubelet."""


def check_ref(ref: ClaimRef) -> None:
    """The kubelet's claim reference itself: malformed input gets a per-claim error, not a crash."""
    problems = []
    if not _DNS_LABEL.match(ref.namespace or ""):
        problems.append(f"namespace {ref.namespace!r} is not a DNS label")
    if not _DNS_SUBDOMAIN.match(ref.name or ""):
        problems.append(f"name {ref.name!r} is not a DNS subdomain")
    if not _UID.match(ref.uid or ""):
        problems.append(f"uid {ref.uid!r} is empty or has characters other than letters, digits and -_.:")
    if problems:
        raise ClaimError("invalid claim reference: " + "; ".join(problems))


def describe(ref: ClaimRef) -> str:
    return f"ResourceClaim {ref.namespace}/{ref.name}"


def driver_results(claim: dict, ref: ClaimRef, driver: str, node: str, node_labels: Callable[[], dict[str, str]],
                   check_node: bool = True) -> tuple[list[dict], list[dict]]:
    """The allocation results of `driver` in `claim` (and the opaque configs for the driver), after
    checking that the claim is the one the kubelet means and is allocated for `node` (unless
    `check_node` is false: the any-node defect of the self-tests)."""
    meta = claim.get("metadata") or {}
    if meta.get("uid") != ref.uid:
        raise ClaimError(f"{describe(ref)} has UID {meta.get('uid')}, not {ref.uid} as requested: "
                         "the claim was deleted and recreated")
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        raise ClaimError(f"{describe(ref)} is not allocated")
    results = ((allocation.get("devices") or {}).get("results")) or []
    mine = [r for r in results if r.get("driver") == driver]
    if not mine:
        others = sorted({r.get("driver", "?") for r in results})
        raise ClaimError(f"{describe(ref)} has no devices of driver {driver} (allocated: "
                         f"{', '.join(others) if others else 'no devices'})")
    selector = allocation.get("nodeSelector")
    if check_node and selector is not None and not selects_node(selector, node, node_labels):
        raise ClaimError(f"{describe(ref)} is allocated for another node: its node selector "
                         f"{describe_selector(selector)} does not select node {node}")
    configs = [c for c in ((allocation.get("devices") or {}).get("config") or [])
               if (c.get("opaque") or {}).get("driver") == driver]
    return mine, configs


# --- node selectors (core/v1 NodeSelector semantics) -------------------------------------------

def selects_node(selector: dict, node: str, node_labels: Callable[[], dict[str, str]]) -> bool:
    """Terms are ORed; the requirements of one term are ANDed; an empty term selects nothing."""
    labels: dict[str, str] | None = None

    def get_labels() -> dict[str, str]:
        nonlocal labels
        if labels is None:
            labels = node_labels()
        return labels

    for term in selector.get("nodeSelectorTerms") or []:
        expressions = term.get("matchExpressions") or []
        fields = term.get("matchFields") or []
        if not expressions and not fields:
            continue
        if all(_field_matches(r, node) for r in fields) and all(_label_matches(r, get_labels) for r in expressions):
            return True
    return False


def _field_matches(requirement: dict, node: str) -> bool:
    if requirement.get("key") != "metadata.name":
        return False  # the only field a node selector may use
    return _matches(requirement, node)


def _label_matches(requirement: dict, get_labels: Callable[[], dict[str, str]]) -> bool:
    return _matches(requirement, get_labels().get(requirement.get("key", "")))


def _matches(requirement: dict, value: str | None) -> bool:
    operator, values = requirement.get("operator"), requirement.get("values") or []
    if operator == "In":
        return value is not None and value in values
    if operator == "NotIn":
        return value is None or value not in values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in ("Gt", "Lt") and value is not None and len(values) == 1:
        try:
            have, bound = int(value), int(values[0])
        except ValueError:
            return False
        return have > bound if operator == "Gt" else have < bound
    return False


def describe_selector(selector: dict) -> str:
    terms = []
    for term in selector.get("nodeSelectorTerms") or []:
        parts = [f"{r.get('key')} {r.get('operator')} {r.get('values') or []}"
                 for r in (term.get("matchFields") or []) + (term.get("matchExpressions") or [])]
        terms.append(" and ".join(parts) or "(empty)")
    return " or ".join(f"[{t}]" for t in terms) or "(no terms)"
