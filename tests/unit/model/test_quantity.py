"""Kubernetes quantities: the exact view and the int64 view (Go's ``Quantity.AsInt64``)."""

from __future__ import annotations

from fractions import Fraction

import pytest

from hamid.model.errors import InvalidInput
from hamid.model.quantity import integer_quantity, parse_quantity, quantity_as_int


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("1", 1),
        ("+7", 7),
        ("-3", -3),
        ("2k", 2000),
        ("1.5k", 1500),
        ("1000m", 1),
        ("1500m", None),
        ("1Gi", 2**30),
        ("1e3", 1000),
        ("1E-1", None),
        ("0.5", None),
        (".5", None),
        ("5.", 5),
        ("1e40", None),
        ("0e99", 0),
        ("9223372036854775808", None),
        (7, 7),
        (7.0, 7),
        (7.5, None),
        (2**64, None),
    ],
)
def test_quantity_as_int(value: object, expected: int | None) -> None:
    assert quantity_as_int(value, "q") == expected


@pytest.mark.parametrize(
    "value", ["", "abc", "1x", "Gi", "1 Gi", "--1", True, None, [1], {"a": 1}, float("nan")]
)
def test_quantity_garbage_raises(value: object) -> None:
    with pytest.raises(InvalidInput, match="q"):
        quantity_as_int(value, "q")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("500m", Fraction(1, 2)),
        ("1.5", Fraction(3, 2)),
        ("-250m", Fraction(-1, 4)),
        ("16Gi", 2**34),
        ("2k", 2000),
        ("1e-3", Fraction(1, 1000)),
        ("1e40", 10**40),
        ("0e999", 0),
        (" 3 ", 3),
        (7.5, Fraction(15, 2)),
        (4, 4),
    ],
)
def test_parse_quantity_is_exact(value: object, expected: Fraction | int) -> None:
    assert parse_quantity(value, "q") == expected


@pytest.mark.parametrize("value", ["1e999", "9" * 5000, "0." + "0" * 100 + "1"])
def test_parse_quantity_refuses_absurd_magnitudes(value: str) -> None:
    with pytest.raises(InvalidInput, match=r"q: .* is out of range"):
        parse_quantity(value, "q")


@pytest.mark.parametrize("value", ["", "abc", "1x", "--1", True, None, [1], float("inf")])
def test_parse_quantity_garbage_raises(value: object) -> None:
    with pytest.raises(InvalidInput, match="q"):
        parse_quantity(value, "q")


def test_integer_quantity_refuses_fractions() -> None:
    assert integer_quantity("2Ki", "limits.x") == 2048
    with pytest.raises(InvalidInput, match=r"limits\.x: '500m' is not an integer quantity"):
        integer_quantity("500m", "limits.x")
