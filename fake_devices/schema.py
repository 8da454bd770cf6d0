"""Strict reading of YAML documents into typed values, collecting every problem with its location.

A `Reader` walks one mapping; each accessor records a Problem (file, dotted path, what is wrong, what
is allowed) instead of raising, so validation reports all mistakes of a file in one go. Unknown keys
are problems too: a typo must not be silently ignored.
"""

from __future__ import annotations

import builtins
import math
import re
from decimal import Decimal
from typing import Any

from fake_devices import quantity as quantities
from fake_devices.errors import Problem

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
# Label keys and values as the API checks them (apimachinery validation.IsQualifiedName / IsValidLabelValue).
LABEL_NAME = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                        r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")


def quantity_value(text: str) -> Decimal:
    """The exact number a Kubernetes quantity stands for (the string is what we publish).

    Raises ValueError (quantity.QuantityError) for anything the API server would not parse."""
    return quantities.parse(text)


def label_problems(labels: Any) -> list[tuple[str, str, str]]:
    """(key, problem, allowed) for every invalid entry of a label mapping."""
    result = []
    for key, value in labels.items():
        value = "" if value is None else value
        prefix, _, _ = str(key).rpartition("/")
        if not isinstance(key, str) or not LABEL_NAME.match(key) or len(prefix) > 253:
            result.append((str(key), f"{key!r} is not a valid label key",
                           "[prefix/]name: a DNS subdomain prefix of at most 253 characters, a name of at most 63 "
                           "letters, digits, '-', '_', '.'"))
        elif isinstance(value, (dict, list, bool)) or not LABEL_VALUE.match(str(value)):
            result.append((key, f"{value!r} is not a valid label value",
                           "at most 63 letters, digits, '-', '_', '.', beginning and ending with a letter or digit"))
    return result


def is_qualified_name(name: str) -> bool:
    """A DRA attribute/capacity name: a C identifier, optionally prefixed by `domain/`."""
    domain, sep, ident = name.rpartition("/")
    if sep and (len(domain) > 63 or not DNS_SUBDOMAIN.match(domain)):  # the API's DeviceMaxDomainLength
        return False
    return len(ident) <= 32 and bool(C_IDENTIFIER.match(ident))  # the API's DeviceMaxIDLength


def _kind(value: Any) -> str:
    """A YAML reader's name for a value's type."""
    names = {dict: "a mapping", list: "a list", str: "a string", int: "an integer", float: "a number",
             bool: "true/false", type(None): "empty"}
    return names.get(type(value), type(value).__name__)


def _short(value: Any) -> str:
    """A value for a message, cut short: documents may hold very long strings."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class Reader:
    # Its accessors are named after the types they read (str, int, bool, list), which shadow the builtins in
    # the class body: annotations after them name the builtins as builtins.str etc.
    def __init__(self, data: Any, source: str, path: str, problems: list[Problem]):
        self.source, self.path, self.problems = source, path, problems
        if not isinstance(data, dict):
            self.fail(path or "(document)", f"must be a mapping, not {_kind(data)}", "a mapping of field: value")
            data = {}
        self.data = data
        self._seen: set[str] = set()

    def at(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def fail(self, field: str, problem: str, allowed: str | None = None) -> None:
        self.problems.append(Problem(self.source, field, problem, allowed))

    def _get(self, key: str, required: bool, default: Any) -> Any:
        self._seen.add(key)
        if key not in self.data or self.data[key] is None:
            if required:
                self.fail(self.at(key), "is required", f"a value for {key}")
            return default
        return self.data[key]

    def str(self, key: str, *, required: bool = False, default: str | None = None,
            pattern: re.Pattern | None = None, allowed: str | None = None, choices: tuple[str, ...] = ()) -> str | None:
        value = self._get(key, required, default)
        if value is default:
            return value
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            self.fail(self.at(key), f"must be a string, not {_kind(value)}", "a string")
            return default
        value = str(value)
        if choices and value not in choices:
            self.fail(self.at(key), f"unknown value {_short(value)}", ", ".join(choices))
            return default
        if pattern is not None and not pattern.match(value):
            self.fail(self.at(key), f"{_short(value)} is not valid", allowed)
            return default
        return value

    def int(self, key: builtins.str, *, required: builtins.bool = False, default: int | None = None,
            minimum: int | None = None, maximum: int | None = None) -> int | None:
        value = self._get(key, required, default)
        if value is default:
            return value
        if not isinstance(value, int) or isinstance(value, bool):
            self.fail(self.at(key), f"must be an integer, not {_short(value)}", "an integer")
            return default
        if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
            bounds = f"{minimum if minimum is not None else '-inf'}..{maximum if maximum is not None else 'inf'}"
            self.fail(self.at(key), f"{value} is out of range", bounds)
            return default
        return value

    def bool(self, key: builtins.str, *, default: builtins.bool = False) -> builtins.bool:
        value = self._get(key, False, default)
        if not isinstance(value, bool):
            self.fail(self.at(key), f"must be true or false, not {_short(value)}", "true, false")
            return default
        return value

    def quantity(self, key: builtins.str, *, required: builtins.bool = False, default: builtins.str | None = None,
                 positive: builtins.bool = True) -> builtins.str | None:
        value = self._get(key, required, default)
        if value is default:
            return value
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            self.fail(self.at(key), f"must be a quantity, not {type(value).__name__}", quantities.ALLOWED)
            return default
        if isinstance(value, float) and not math.isfinite(value):
            # YAML reads 1.0e+999 as a float, which overflows to inf
            self.fail(self.at(key), f"{value!r} is not a finite number (YAML read it as a float that overflowed)",
                      quantities.ALLOWED)
            return default
        text = str(value)
        try:
            number = quantities.within_limits(text)
        except quantities.QuantityError as err:
            shown = text if len(text) <= 40 else text[:40] + "..."
            self.fail(self.at(key), f"{shown!r} is not a valid quantity: {err}", quantities.ALLOWED)
            return default
        if positive and number <= 0:
            self.fail(self.at(key), f"{text!r} must be greater than zero")
            return default
        return text

    def mapping(self, key: builtins.str, *, required: builtins.bool = False) -> "Reader":
        value = self._get(key, required, {})
        return Reader(value, self.source, self.at(key), self.problems)

    def list(self, key: builtins.str, *, required: builtins.bool = False) -> builtins.list["Reader"]:
        value = self._get(key, required, [])
        if not isinstance(value, list):
            self.fail(self.at(key), f"must be a list, not {_kind(value)}", "a list")
            return []
        return [Reader(item, self.source, f"{self.at(key)}[{i}]", self.problems) for i, item in enumerate(value)]

    def scalars(self, key: builtins.str) -> builtins.list:
        value = self._get(key, False, [])
        if not isinstance(value, list):
            self.fail(self.at(key), f"must be a list, not {_kind(value)}", "a list")
            return []
        return value

    def raw_mapping(self, key: builtins.str) -> dict:
        value = self._get(key, False, {})
        if not isinstance(value, dict):
            self.fail(self.at(key), f"must be a mapping, not {_kind(value)}", "a mapping")
            return {}
        return value

    def handled(self, key: Any) -> None:
        """Mark a key as read whose problem was already reported, so `done` does not call it unknown too."""
        self._seen.add(key)

    def done(self) -> None:
        """Report keys nobody asked for (typos)."""
        for key in self.data:
            if key not in self._seen:
                name = key if isinstance(key, str) and key.strip() else repr(key)  # '' or None must still show
                self.fail(self.at(name), "unknown field", ", ".join(sorted(self._seen)) or None)


def read_header(top: Reader, api_version: str, kind: str, *, name_pattern: re.Pattern | None = None,
                name_allowed: str | None = None) -> tuple[str | None, Reader]:
    """Check a document's apiVersion, kind and metadata.name; return the name and the spec reader."""
    found_version = top.str("apiVersion", required=True)
    if found_version is not None and found_version != api_version:
        top.fail("apiVersion", f"unsupported apiVersion {found_version!r}", api_version)
    found_kind = top.str("kind", required=True)
    if found_kind is not None and found_kind != kind:
        top.fail("kind", f"expected {kind}, not {found_kind!r}", kind)
    meta = top.mapping("metadata", required=True)
    name = meta.str("name", required=True, pattern=name_pattern, allowed=name_allowed)
    meta.done()
    return name, top.mapping("spec", required=True)
