"""Node lock, handshake, uuid/type lists, numa-bind, scoring weights and pair scores."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone

import pytest

from hamid.model.annotations import (
    NODE_LOCK,
    NODE_SCORE,
    NUMA_BIND,
    Handshake,
    HandshakeState,
    NodeLock,
    ScoringWeights,
    decode_pair_scores,
    encode_pair_scores,
    format_handshake,
    format_node_lock,
    parse_handshake,
    parse_node_lock,
    parse_numa_bind,
    parse_scoring_weights,
    parse_type_list,
    parse_uuid_list,
)
from hamid.model.errors import InvalidInput

# --- node lock --------------------------------------------------------------------------------


def test_node_lock_round_trip_utc() -> None:
    when = datetime(2026, 8, 21, 10, 30, 5, tzinfo=UTC)
    value = format_node_lock(when, "default", "pod-a")
    assert value == "2026-08-21T10:30:05Z,default,pod-a"
    assert parse_node_lock(value) == NodeLock(when, "default", "pod-a")


def test_node_lock_offset_and_microseconds_dropped() -> None:
    when = datetime(2026, 1, 2, 3, 4, 5, 999, tzinfo=timezone(timedelta(hours=8)))
    value = format_node_lock(when, "ns", "p")
    assert value == "2026-01-02T03:04:05+08:00,ns,p"
    assert parse_node_lock(value).time == when.replace(microsecond=0)
    negative = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone(-timedelta(hours=5, minutes=30)))
    assert format_node_lock(negative, "ns", "p").startswith("2026-01-02T03:04:05-05:30,")


def test_node_lock_legacy_bare_time() -> None:
    lock = parse_node_lock("2024-01-23T04:30:04Z")
    assert lock == NodeLock(datetime(2024, 1, 23, 4, 30, 4, tzinfo=UTC), None, None)


def test_node_lock_fractional_seconds() -> None:
    assert parse_node_lock("2024-01-23T04:30:04.123456789+00:00,a,b").time.microsecond == 123456


@pytest.mark.parametrize(
    "value", ["", "yesterday", "2024-01-23T04:30:04Z,a", "2024-01-23T04:30:04Z,a,b,c", "2024-13-01T00:00:00Z"]
)
def test_node_lock_errors(value: str) -> None:
    with pytest.raises(InvalidInput, match=NODE_LOCK):
        parse_node_lock(value)


def test_node_lock_format_needs_zone_and_clean_names() -> None:
    with pytest.raises(InvalidInput, match="zone"):
        format_node_lock(datetime(2026, 1, 1), "ns", "p")
    with pytest.raises(InvalidInput, match="name"):
        format_node_lock(datetime(2026, 1, 1, tzinfo=UTC), "ns", "a,b")


# --- handshake --------------------------------------------------------------------------------


def test_handshake_format_and_parse() -> None:
    when = datetime(2999, 1, 1, 0, 0, 0)
    assert format_handshake(when) == "Requesting_2999-01-01 00:00:00"
    assert parse_handshake("Requesting_2999-01-01 00:00:00") == Handshake(HandshakeState.REQUESTING, when)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("Requesting_garbage", Handshake(HandshakeState.REQUESTING, None)),
        ("Requesting", Handshake(HandshakeState.REQUESTING, None)),
        (
            "Deleted_2024-01-23 04:30:04",
            Handshake(HandshakeState.DELETED, datetime(2024, 1, 23, 4, 30, 4)),
        ),
        (
            "Reported 2024-01-23 04:30:04.434037031 +0000 UTC m=+1104711.777756895",
            Handshake(HandshakeState.REPORTED, datetime(2024, 1, 23, 4, 30, 4)),
        ),
        ("Reported", Handshake(HandshakeState.REPORTED, None)),
    ],
)
def test_handshake_states(value: str, expected: Handshake) -> None:
    assert parse_handshake(value) == expected


@pytest.mark.parametrize("value", ["", "hello", "requesting_2999-01-01 00:00:00"])
def test_handshake_unrecognized(value: str) -> None:
    with pytest.raises(InvalidInput, match="handshake"):
        parse_handshake(value)


# --- uuid / type lists ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("", None),
        ("   ", None),
        (" , ", ()),  # separators alone: HAMi's CheckUUID/CheckType match no GPU (not "no constraint")
        ("GPU-a", ("GPU-a",)),
        (" GPU-a , GPU-b ,", ("GPU-a", "GPU-b")),
    ],
)
def test_uuid_and_type_lists(value: str | None, expected: tuple[str, ...] | None) -> None:
    assert parse_uuid_list(value) == expected
    assert parse_type_list(value) == expected


# --- numa-bind (Go strconv.ParseBool) ---------------------------------------------------------


@pytest.mark.parametrize("value", ["1", "t", "T", "TRUE", "true", "True"])
def test_numa_bind_true(value: str) -> None:
    assert parse_numa_bind(value) is True


@pytest.mark.parametrize("value", ["0", "f", "F", "FALSE", "false", "False"])
def test_numa_bind_false(value: str) -> None:
    assert parse_numa_bind(value) is False


def test_numa_bind_absent() -> None:
    assert parse_numa_bind(None) is False


@pytest.mark.parametrize("value", ["", "yes", "tRUE", " true", "2", "on"])
def test_numa_bind_invalid(value: str) -> None:
    with pytest.raises(InvalidInput, match=NUMA_BIND):
        parse_numa_bind(value)


# --- scoring weights --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, ScoringWeights(1, 1, 1)),
        ("slot=1,core=2,memory=3", ScoringWeights(1, 2, 3)),
        ("memory=0, slot=0 ,core=5", ScoringWeights(0, 5, 0)),
    ],
)
def test_scoring_weights(value: str | None, expected: ScoringWeights) -> None:
    assert parse_scoring_weights(value) == expected


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ("", "not slot"),
        ("slot=1,core=1", "missing memory"),
        ("slot=1,core=1,memory=1,slot=2", "slot given twice"),
        ("slot=1,core=1,gpu=1", "'gpu=1'"),
        ("slot=-1,core=1,memory=1", "slot weight '-1'"),
        ("slot=1.5,core=1,memory=1", "slot weight"),
        ("slot=0,core=0,memory=0", "at least one"),
        ("slot1,core=1,memory=1", "'slot1'"),
    ],
)
def test_scoring_weights_errors(value: str, match: str) -> None:
    with pytest.raises(InvalidInput, match=match):
        parse_scoring_weights(value)


# --- pair scores ------------------------------------------------------------------------------

PAIR_SCORES = '[{"uuid":"GPU-0","score":{"GPU-1":100}},{"uuid":"GPU-1","score":{"GPU-0":100}}]'


def test_pair_scores_vector() -> None:
    scores = decode_pair_scores(PAIR_SCORES)
    assert scores == {"GPU-0": {"GPU-1": 100}, "GPU-1": {"GPU-0": 100}}
    assert encode_pair_scores(scores) == PAIR_SCORES


@pytest.mark.parametrize(
    "value",
    ["", "{", "{}", "[1]", '[{"uuid":1}]', '[{"uuid":"a","score":[]}]', '[{"uuid":"a","score":{"b":"1"}}]'],
)
def test_pair_scores_errors(value: str) -> None:
    with pytest.raises(InvalidInput, match=re.escape(NODE_SCORE)):
        decode_pair_scores(value)
