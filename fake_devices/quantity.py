"""Kubernetes resource quantities, read exactly as the API server reads them.

A port of `ParseQuantity` in k8s.io/apimachinery v0.37.2 (pkg/api/resource/quantity.go and
suffix.go): what it refuses, `parse` refuses with the same reason, so a quantity the validator
accepts is never answered by the API server with a 400 that the fake driver would retry forever.
The grammar works on bytes, so only ASCII digits count (a full-width `１Ti` is not a number):

    [+-]? digits [. digits]  suffix-letters* [+-]? digits*      (suffix letters: eEinumkKMGTP)

and the suffix must then be one of `n u m "" k M G T P E` (decimal SI), `Ki Mi Gi Ti Pi Ei`
(binary SI) or `e<int64>`/`E<int64>` (decimal exponent).

Beyond the parser, quantities the API server would take but cannot hold usefully are refused too
(`within_limits`): a decimal exponent outside int32 (the parser silently wraps it: `1e4294967296`
reads as 1, and `1e2147483648` makes it spin for minutes), and values above 2^63-1, the largest
quantity `Quantity.Value()` represents (the API itself refuses larger consumable-capacity bounds).
"""

from __future__ import annotations

import decimal
from decimal import Decimal

DIGITS = frozenset("0123456789")
SUFFIX_LETTERS = frozenset("eEinumkKMGTP")
GRAMMAR = "^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$"
DECIMAL_SI = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
BINARY_SI = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)
MAX_VALUE = Decimal(2**63 - 1)
ALLOWED = ("ASCII digits with an optional fraction and one suffix: n u m k M G T P E, Ki Mi Gi Ti Pi Ei, "
           f"or e<exponent>; at most {2**63 - 1}; e.g. 80Gi, 3840G, 400G, 16")
# Exponents are bounded before any arithmetic, so this context never rounds nor overflows.
_CONTEXT = decimal.Context(prec=100, Emax=decimal.MAX_EMAX, Emin=decimal.MIN_EMIN, traps=[decimal.Overflow])


class QuantityError(ValueError):
    """Not a quantity the API server accepts; the text says why."""


def _split(text: str) -> tuple[bool, str, str, str]:
    """parseQuantityString: (positive, integer digits without leading zeroes, fraction digits, suffix)."""
    if not text.isascii():
        raise QuantityError(f"quantities must match the regular expression '{GRAMMAR}' (only ASCII digits count)")
    pos, end, positive = 0, len(text), True
    if pos < end and text[0] in "+-":
        positive = text[0] == "+"
        pos += 1
    while pos < end and text[pos] == "0":  # leading zeroes
        pos += 1
    start = pos
    while pos < end and text[pos] in DIGITS:
        pos += 1
    whole = text[start:pos] or "0"
    fraction = ""
    if pos < end and text[pos] == ".":
        pos += 1
        start = pos
        while pos < end and text[pos] in DIGITS:
            pos += 1
        fraction = text[start:pos]
    suffix_start = pos
    while pos < end and text[pos] in SUFFIX_LETTERS:
        pos += 1
    if pos < end and text[pos] in "+-":
        pos += 1
    while pos < end and text[pos] in DIGITS:
        pos += 1
    if pos < end:
        raise QuantityError(f"quantities must match the regular expression '{GRAMMAR}'")
    return positive, whole, fraction, text[suffix_start:]


def _go_parse_int64(text: str) -> int | None:
    """strconv.ParseInt(text, 10, 64): optional sign, ASCII digits, in int64."""
    digits = text[1:] if text[:1] in "+-" else text
    if not digits or not set(digits) <= DIGITS:
        return None
    value = int(text)
    return value if INT64[0] <= value <= INT64[1] else None


def parse(text: str) -> Decimal:
    """The exact value of a quantity, or QuantityError with the API server's reason."""
    if not isinstance(text, str) or not text:
        raise QuantityError(f"quantities must match the regular expression '{GRAMMAR}'")
    if text == "0":
        return Decimal(0)
    positive, whole, fraction, suffix = _split(text)
    if suffix in DECIMAL_SI:
        base, exponent = 10, DECIMAL_SI[suffix]
    elif suffix in BINARY_SI:
        base, exponent = 2, BINARY_SI[suffix]
    elif len(suffix) > 1 and suffix[0] in "eE" and (parsed := _go_parse_int64(suffix[1:])) is not None:
        base, exponent = 10, parsed
        if not INT32[0] <= exponent <= INT32[1]:
            raise QuantityError(f"exponent {exponent} is outside the int32 range Kubernetes keeps exponents in")
    else:
        raise QuantityError("unable to parse quantity's suffix")
    if _slow_path(base, exponent, whole, fraction) and not any(c in DIGITS for c in text[:len(text) - len(suffix)]):
        # the slow path reads the number with inf.Dec.SetString, which needs a digit ("Pi" and "+.Ei" fail,
        # while "Gi" and ".e3" take the fast path and read as 0)
        raise QuantityError("unable to parse numeric part of quantity")
    number = Decimal(f"{whole}.{fraction or '0'}")
    if base == 2:
        value = number * (2**exponent)
    elif number == 0:
        value = number
    elif number.adjusted() + exponent > 400:  # far beyond any int64: keep the order of magnitude only
        value = Decimal(f"1e{number.adjusted() + exponent}")
    else:
        context = _CONTEXT.copy()
        context.prec = len(whole) + len(fraction) + 1  # exact: scaleb must not round
        value = context.scaleb(number, exponent)
    return value if positive else value.copy_negate()  # copy_*: no context, so no overflow


def _slow_path(base: int, exponent: int, whole: str, fraction: str) -> bool:
    """Whether ParseQuantity leaves its int64 fast path for inf.Dec (quantity.go, "precision")."""
    if base == 10:
        precision = 18 - (len(whole) + len(fraction))  # maxInt64Factors
        scale = exponent
    elif exponent >= 0 and not fraction:
        precision = 15 - len(whole) - int(exponent * 3 / 10) - 1
        scale = 0
    else:
        precision, scale = -1, 0
    return precision < 0 or scale - len(fraction) < -9


def within_limits(text: str) -> Decimal:
    """parse(), and also refuse values the API cannot hold usefully (see the module docstring)."""
    value = parse(text)
    if value.copy_abs() > MAX_VALUE:
        raise QuantityError(f"is larger than {2**63 - 1}, the largest quantity Kubernetes represents as an integer")
    return value
