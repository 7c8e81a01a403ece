"""``hami.io/numa-alignment`` parsing (TestGetNumaAlignmentModeByPod / ...ErrorMentionsKeyAndValue)."""

from __future__ import annotations

import pytest

from hamid.model.alignment import AlignmentMode, parse_alignment
from hamid.model.annotations import NUMA_ALIGNMENT
from hamid.model.errors import InvalidInput


def test_enum_values() -> None:
    assert [m.value for m in AlignmentMode] == ["none", "best-effort", "strict"]


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        (None, AlignmentMode.NONE),
        ({}, AlignmentMode.NONE),
        ({"other": "strict"}, AlignmentMode.NONE),
        ({NUMA_ALIGNMENT: "best-effort"}, AlignmentMode.BEST_EFFORT),
        ({NUMA_ALIGNMENT: "  Best-Effort\t"}, AlignmentMode.BEST_EFFORT),
        ({NUMA_ALIGNMENT: "strict"}, AlignmentMode.STRICT),
        ({NUMA_ALIGNMENT: " STRICT "}, AlignmentMode.STRICT),
    ],
)
def test_parse_alignment(annotations: dict[str, str] | None, expected: AlignmentMode) -> None:
    assert parse_alignment(annotations) is expected


@pytest.mark.parametrize("value", ["", "  ", "true", "none", "besteffort", "best_effort", "strict-ish"])
def test_invalid_values_name_key_and_value(value: str) -> None:
    with pytest.raises(InvalidInput) as info:
        parse_alignment({NUMA_ALIGNMENT: value})
    assert NUMA_ALIGNMENT in str(info.value)
    assert f'"{value}"' in str(info.value)  # Go's %q, as upstream's message quotes it


def test_invalid_value_has_upstreams_wording() -> None:
    """HAMi #2729 ``ParseNumaAlignmentMode``: ``invalid %s annotation %q: expected %q or %q``."""
    with pytest.raises(InvalidInput) as info:
        parse_alignment({"hami.io/numa-alignment": "bogus"})
    assert str(info.value) == (
        'invalid hami.io/numa-alignment annotation "bogus": expected "best-effort" or "strict"'
    )
