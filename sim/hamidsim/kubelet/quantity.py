"""Kubernetes resource quantities as apimachinery's ``resource.Quantity`` reads them (exact fractions).

The simulator's own parser, on purpose: the product has ``hamid/model/quantity.py``, but the
stand-ins are the oracle and share no logic with what they judge (docs/architecture.md §6).
"""

from __future__ import annotations

import re
from fractions import Fraction

from hamid.model.errors import InvalidInput

_QUANTITY_RE = re.compile(
    r"(?P<sign>[+-]?)(?P<num>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?:(?P<bin>Ki|Mi|Gi|Ti|Pi|Ei)|[eE](?P<exp>[+-]?[0-9]+)|(?P<dec>[numkMGTPE]?))\Z"
)
_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
#: Quantity strings already read (kubelet reads each pod's few quantities many times over).
_PARSED: dict[str, Fraction] = {}
_PARSED_MAX = 4096


def parse_quantity(value: object, where: str = "quantity") -> Fraction:
    """A Kubernetes quantity (``"8"``, ``"500m"``, ``"16Gi"``, a JSON number) as an exact fraction."""
    if type(value) is str:
        known = _PARSED.get(value)
        if known is None:
            known = _parse(value, where)
            if len(_PARSED) >= _PARSED_MAX:
                _PARSED.clear()
            _PARSED[value] = known
        return known
    return _parse(value, where)


def _parse(value: object, where: str) -> Fraction:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise InvalidInput(f"{where}: want a quantity, got {type(value).__name__}")
    if isinstance(value, int | float):
        return Fraction(value)
    match = _QUANTITY_RE.match(value.strip())
    if not match:
        raise InvalidInput(f"{where}: {value!r} is not a Kubernetes quantity")
    number = Fraction(match["num"])
    if match["bin"]:
        number *= 2 ** _BINARY[match["bin"]]
    else:
        exponent = int(match["exp"]) if match["exp"] is not None else _DECIMAL[match["dec"]]
        if abs(exponent) > 40:
            raise InvalidInput(f"{where}: {value!r} is out of range")
        number *= Fraction(10) ** exponent
    return -number if match["sign"] == "-" else number


def _ceil(value: Fraction) -> int:
    return -((-value.numerator) // value.denominator)


def quantity_value(value: object, where: str = "quantity") -> int:
    """Go's ``Quantity.Value()``: the quantity rounded up to an integer."""
    return _ceil(parse_quantity(value, where))


def quantity_milli_value(value: object, where: str = "quantity") -> int:
    """Go's ``Quantity.MilliValue()``: the quantity times 1000, rounded up."""
    return _ceil(parse_quantity(value, where) * 1000)
