"""Kubernetes resource quantities (apimachinery's ``resource.Quantity``): the product's one parser.

A quantity is read exactly, as a :class:`~fractions.Fraction` (``"500m"`` is 1/2, ``"16Gi"`` is
2**34), and viewed as an int64 the way Go's ``Quantity.AsInt64`` does. The simulator's stand-ins
keep a parser of their own (``sim/hamidsim/kubelet/quantity.py``, see docs/architecture.md §6): they
are the oracle the product is judged against, so they never share this one. Pure: no I/O.
"""

import math
import re
from fractions import Fraction

from hamid.model._wire import INT64_MAX, INT64_MIN, is_decimal, type_name
from hamid.model.errors import InvalidInput

_QUANTITY = re.compile(
    r"(?P<sign>[+-]?)(?P<num>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?:(?P<bin>Ki|Mi|Gi|Ti|Pi|Ei)|[eE](?P<exp>[+-]?[0-9]+)|(?P<dec>[numkMGTPE]?))\Z"
)
_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}

#: Significant digits and decimal exponents beyond these are never a resource amount; refusing
#: them keeps the arithmetic small (and clear of Python's limit on int-from-text conversions).
_MAX_DIGITS = 64
_MAX_EXPONENT = 64


class _OutOfRange(Exception):
    """A well-formed quantity too large (or too precise) for hamid to compute with."""


def _exact(value: object, where: str) -> Fraction:
    """``value`` as an exact number; raises InvalidInput, or _OutOfRange for an absurd magnitude."""
    if isinstance(value, bool):
        raise InvalidInput(f"{where}: want a quantity, got {type_name(value)}")
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidInput(f"{where}: {value} is not a quantity")
        return Fraction(value)
    if not isinstance(value, str):
        raise InvalidInput(f"{where}: want a quantity, got {type_name(value)}")
    if is_decimal(value) and len(value) <= 18:  # the common case: a plain integer
        return Fraction(int(value))
    m = _QUANTITY.match(value.strip())
    if not m:
        raise InvalidInput(f"{where}: {value[:80]!r} is not a Kubernetes quantity")
    whole, _, frac = m["num"].partition(".")
    whole, frac = whole.lstrip("0"), frac.rstrip("0")
    if not whole and not frac:
        return Fraction(0)  # zero at any exponent ("0e99")
    if len(whole) + len(frac) > _MAX_DIGITS:
        raise _OutOfRange
    number = Fraction(int(whole + frac), 10 ** len(frac))
    if m["bin"]:
        number *= 2 ** _BINARY[m["bin"]]
    else:
        exponent = int(m["exp"]) if m["exp"] is not None else _DECIMAL[m["dec"]]
        if abs(exponent) > _MAX_EXPONENT:
            raise _OutOfRange
        number *= Fraction(10) ** exponent
    return -number if m["sign"] == "-" else number


def parse_quantity(value: object, where: str) -> Fraction:
    """A quantity (``"8"``, ``"500m"``, ``"16Gi"``, a JSON number) as an exact fraction.

    Raises :class:`InvalidInput` naming ``where`` for anything that is not a quantity, and for one
    with more than 64 significant digits or a decimal exponent beyond ±64.
    """
    try:
        return _exact(value, where)
    except _OutOfRange:
        raise InvalidInput(f"{where}: {str(value)[:80]!r} is out of range") from None


def quantity_as_int(value: object, where: str) -> int | None:
    """A quantity as an exact int64, like Go's ``Quantity.AsInt64``; ``None`` if it is not one.

    Accepts what the API server serves (``"1"``, ``"4096"``, ``"2k"`` — the canonical form of 2000 —,
    ``"16Gi"``) and JSON numbers. Fractions (``"1.5"``, ``"500m"``) and values outside int64 give
    ``None``; text that is not a quantity at all, or a non-scalar, raises InvalidInput.
    """
    try:
        number = _exact(value, where)
    except _OutOfRange:
        return None
    if number.denominator != 1 or not INT64_MIN <= number.numerator <= INT64_MAX:
        return None
    return number.numerator


def quantity_value(value: object, where: str) -> int | None:
    """A quantity rounded up, away from zero, to an int64, like Go's ``Quantity.Value`` (HAMi's
    webhook reads ``gpumem-percentage`` and ``priority`` so: ``"99.5"`` is 100); ``None`` outside
    int64; text that is not a quantity raises InvalidInput."""
    try:
        number = _exact(value, where)
    except _OutOfRange:
        return None
    rounded = math.ceil(abs(number)) * (1 if number >= 0 else -1)
    return rounded if INT64_MIN <= rounded <= INT64_MAX else None


def integer_quantity(value: object, where: str) -> int:
    """A quantity that must be an int64 (a quota's limit); InvalidInput naming ``where`` otherwise."""
    number = quantity_as_int(value, where)
    if number is None:
        raise InvalidInput(f"{where}: {value!r:.80} is not an integer quantity")
    return number
