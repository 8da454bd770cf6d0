"""Strict reading of YAML documents into typed values, collecting every problem with its location.

A `Reader` walks one mapping; each accessor records a Problem (file, dotted path, what is wrong, what
is allowed) instead of raising, so validation reports all mistakes of a file in one go. Unknown keys
are problems too: a typo must not be silently ignored.
"""

from __future__ import annotations

import re
from typing import Any

from fake_devices.errors import Problem

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
QUANTITY = re.compile(r"^[+]?(\d+(\.\d*)?|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E|[eE][+-]?\d+)?$")
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}


def quantity_value(text: str) -> float:
    """The number a Kubernetes quantity stands for (for comparisons; the string is what we publish)."""
    match = QUANTITY.match(text)
    if not match:
        raise ValueError(f"not a quantity: {text!r}")
    number, suffix = float(match[1]), match[3] or ""
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    if suffix in _DECIMAL:
        return number * _DECIMAL[suffix]
    return float(text.lstrip("+")) if suffix else number


def is_qualified_name(name: str) -> bool:
    """A DRA attribute/capacity name: a C identifier, optionally prefixed by `domain/`."""
    domain, sep, ident = name.rpartition("/")
    if sep and (len(domain) > 63 or not DNS_SUBDOMAIN.match(domain)):  # the API's DeviceMaxDomainLength
        return False
    return len(ident) <= 32 and bool(C_IDENTIFIER.match(ident))  # the API's DeviceMaxIDLength


class Reader:
    def __init__(self, data: Any, source: str, path: str, problems: list[Problem]):
        self.source, self.path, self.problems = source, path, problems
        if not isinstance(data, dict):
            self.fail(path or "(document)", f"must be a mapping, not {type(data).__name__}")
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
                self.fail(self.at(key), "is required")
            return default
        return self.data[key]

    def str(self, key: str, *, required: bool = False, default: str | None = None,
            pattern: re.Pattern | None = None, allowed: str | None = None, choices: tuple[str, ...] = ()) -> str | None:
        value = self._get(key, required, default)
        if value is default:
            return value
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            self.fail(self.at(key), f"must be a string, not {type(value).__name__}")
            return default
        value = str(value)
        if choices and value not in choices:
            self.fail(self.at(key), f"unknown value {value!r}", ", ".join(choices))
            return default
        if pattern is not None and not pattern.match(value):
            self.fail(self.at(key), f"{value!r} is not valid", allowed)
            return default
        return value

    def int(self, key: str, *, required: bool = False, default: int | None = None, minimum: int | None = None,
            maximum: int | None = None) -> int | None:
        value = self._get(key, required, default)
        if value is default:
            return value
        if not isinstance(value, int) or isinstance(value, bool):
            self.fail(self.at(key), f"must be an integer, not {value!r}")
            return default
        if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
            bounds = f"{minimum if minimum is not None else '-inf'}..{maximum if maximum is not None else 'inf'}"
            self.fail(self.at(key), f"{value} is out of range", bounds)
            return default
        return value

    def bool(self, key: str, *, default: bool = False) -> bool:
        value = self._get(key, False, default)
        if not isinstance(value, bool):
            self.fail(self.at(key), f"must be true or false, not {value!r}")
            return default
        return value

    def quantity(self, key: str, *, required: bool = False, default: str | None = None,
                 positive: bool = True) -> str | None:
        value = self._get(key, required, default)
        if value is default:
            return value
        text = str(value)
        if isinstance(value, bool) or not QUANTITY.match(text):
            self.fail(self.at(key), f"{text!r} is not a valid quantity", "e.g. 80Gi, 3840G, 400G, 16")
            return default
        if positive and quantity_value(text) <= 0:
            self.fail(self.at(key), f"{text!r} must be greater than zero")
            return default
        return text

    def mapping(self, key: str, *, required: bool = False) -> "Reader":
        value = self._get(key, required, {})
        return Reader(value, self.source, self.at(key), self.problems)

    def list(self, key: str, *, required: bool = False) -> list["Reader"]:
        value = self._get(key, required, [])
        if not isinstance(value, list):
            self.fail(self.at(key), f"must be a list, not {type(value).__name__}")
            return []
        return [Reader(item, self.source, f"{self.at(key)}[{i}]", self.problems) for i, item in enumerate(value)]

    def scalars(self, key: str) -> list:
        value = self._get(key, False, [])
        if not isinstance(value, list):
            self.fail(self.at(key), f"must be a list, not {type(value).__name__}")
            return []
        return value

    def raw_mapping(self, key: str) -> dict:
        value = self._get(key, False, {})
        if not isinstance(value, dict):
            self.fail(self.at(key), f"must be a mapping, not {type(value).__name__}")
            return {}
        return value

    def done(self) -> None:
        """Report keys nobody asked for (typos)."""
        for key in self.data:
            if key not in self._seen:
                self.fail(self.at(str(key)), "unknown field", ", ".join(sorted(self._seen)) or None)


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
