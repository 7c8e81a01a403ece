"""The scheduler's one safe JSON reader: UTF-8, no NaN/Infinity, nesting at most 64 deep."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from hamid.model.errors import InvalidInput
from hamid.scheduler.http import MAX_JSON_DEPTH, _depth_exceeds, parse_json_body


def depth(value: Any) -> int:
    """Nesting depth by plain recursion (the reference): a scalar 0, ``[]`` 1, ``[[]]`` 2."""
    if isinstance(value, dict):
        return 1 + max(map(depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(depth, value), default=0)
    return 0


def random_value(rng: random.Random, budget: int) -> Any:
    if budget == 0 or rng.random() < 0.25:
        return rng.choice([1, -2.5, "x", '"[{', "\\[", None, True])
    width = rng.randrange(5)
    if rng.random() < 0.5:
        return [random_value(rng, budget - 1) for _ in range(width)]
    return {f"k{i}[": random_value(rng, budget - 1) for i in range(width)}


def test_depth_check_agrees_with_recursion_on_random_documents() -> None:
    rng = random.Random(11)
    for _ in range(2000):
        value = random_value(rng, rng.randrange(14))
        body = json.dumps(value).encode()
        d = depth(value)
        for limit in range(max(d - 2, 1), d + 3):
            assert _depth_exceeds(body, value, limit) is (d > limit), (body, limit)


@pytest.mark.parametrize("wrap", [lambda v: [v], lambda v: {"a": v}, lambda v: [1, "[s", {"b": 2}, v]])
def test_exactly_the_limit_passes_and_one_more_fails(wrap: Any) -> None:
    value: Any = "leaf"
    while depth(value) < MAX_JSON_DEPTH:
        value = wrap(value)
    assert depth(parse_json_body(json.dumps(value).encode())) == MAX_JSON_DEPTH
    with pytest.raises(InvalidInput, match=f"nested deeper than {MAX_JSON_DEPTH}"):
        parse_json_body(json.dumps(wrap(value)).encode())


def test_brackets_inside_strings_count_for_nothing() -> None:
    body = json.dumps({"s": "[" * 500 + "{" * 500, "NodeNames": [f"n{i}" for i in range(1000)]}).encode()
    assert parse_json_body(body)["s"].startswith("[[")


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b'{"a": NaN}', "NaN"),
        (b"[Infinity]", "Infinity"),
        (b"\xff\xfe{}", "malformed JSON body"),
        (b"[" * 100_000 + b"]" * 100_000, f"nested deeper than {MAX_JSON_DEPTH}"),
        (b"{", "malformed JSON body"),
    ],
)
def test_bad_bodies_are_refused_with_the_reason(body: bytes, reason: str) -> None:
    with pytest.raises(InvalidInput, match=reason):
        parse_json_body(body)


@pytest.mark.parametrize("body", [b"5", b'"x"', b"null", b"[]", b"{}"])
def test_scalars_and_empty_containers_are_accepted(body: bytes) -> None:
    assert parse_json_body(body) == json.loads(body)
