"""The simulator's quantity reader: exact values, remembered strings, errors every time."""

from __future__ import annotations

from fractions import Fraction

import pytest

from hamid.model.errors import InvalidInput
from hamidsim.kubelet.quantity import parse_quantity, quantity_milli_value, quantity_value


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("8", Fraction(8)),
        ("500m", Fraction(1, 2)),
        ("16Gi", Fraction(16 << 30)),
        ("1.5k", Fraction(1500)),
        ("-2", Fraction(-2)),
    ],
)
def test_a_quantity_reads_the_same_the_first_and_the_second_time(text: str, value: Fraction) -> None:
    assert parse_quantity(text) == value
    assert parse_quantity(text) == value


def test_numbers_and_rounding_as_go_reads_them() -> None:
    assert parse_quantity(3) == 3
    assert quantity_value("1500m") == 2
    assert quantity_milli_value("0.0005") == 1


@pytest.mark.parametrize("text", ["8x", "", "1e99", "--1"])
def test_a_bad_quantity_is_refused_each_time_it_is_read(text: str) -> None:
    for where in ("first", "second"):
        with pytest.raises(InvalidInput, match=where):
            parse_quantity(text, where)
