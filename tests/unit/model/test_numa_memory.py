"""Memory per NUMA node in the NUMA records: the profile's allocatable memory (format 4) and the
containers' memory blocks in placements and predictions (format 2); older formats still decode."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

import pytest

from hamid.model.errors import InvalidInput
from hamid.model.numa import (
    MAX_ANNOTATION_BYTES,
    ContainerPlacement,
    ContainerPrediction,
    KubeletPolicies,
    MemoryBlock,
    NumaProfile,
    PodPlacement,
    PodPrediction,
    decode_placement,
    decode_prediction,
    decode_profile,
    encode_placement,
    encode_prediction,
    encode_profile,
)
from tests.unit.model.test_numa import linux_node

GI = 1 << 30
STATIC = KubeletPolicies("static", {}, "single-numa-node", "container", {}, "Static")


def with_memory(numa_per_socket: int = 1, sockets: int = 2) -> NumaProfile:
    base = linux_node(sockets, 16, 2, numa_per_socket)
    memory = tuple((n, (("hugepages-1Gi", 8 * GI), ("memory", 250 * GI + n))) for n in base.numa_nodes)
    return dataclasses.replace(base, policies=STATIC, memory=memory)


def test_profile_with_memory_is_format_4_and_round_trips() -> None:
    profile = with_memory()
    text = encode_profile(profile)
    doc = json.loads(text)
    assert doc["v"] == 4
    assert doc["memory"]["1"] == {"hugepages-1Gi": 8 * GI, "memory": 250 * GI + 1}
    back = decode_profile(text)
    assert back == profile
    assert back.memory_allocatable()[0]["memory"] == 250 * GI


def test_profile_with_memory_and_preferred_is_format_4() -> None:
    profile = dataclasses.replace(with_memory(), preferred_allocation="nvidia.com/gpu")
    assert json.loads(encode_profile(profile))["v"] == 4
    assert decode_profile(encode_profile(profile)) == profile


def test_old_formats_still_decode() -> None:
    base = linux_node(2, 16, 2)
    assert decode_profile(encode_profile(base)).memory is None
    v2 = dataclasses.replace(base, preferred_allocation="nvidia.com/gpu")
    assert json.loads(encode_profile(v2))["v"] == 2
    assert decode_profile(encode_profile(v2)) == v2


@pytest.mark.parametrize(
    ("change", "error"),
    [
        (lambda d: d | {"v": 2}, "format version 2 does not match its fields"),
        (
            lambda d: {k: v for k, v in d.items() if k != "memory"},
            "format version 4 does not match its fields",
        ),
        (lambda d: d | {"memory": {"0": {"swap": 1}}}, "is not memory or hugepages"),
        (lambda d: d | {"memory": {"9": {"memory": 1}}}, "memory of unknown NUMA node 9"),
        (lambda d: d | {"memory": {"0": {"memory": 0}}}, r"memory.0.memory: 0 is out of range"),
        (lambda d: d | {"memory": {"x": {"memory": 1}}}, "is not a NUMA id"),
    ],
)
def test_profile_memory_is_decoded_strictly(change: Callable[[dict[str, Any]], Any], error: str) -> None:
    doc = json.loads(encode_profile(with_memory()))
    with pytest.raises(InvalidInput, match=error):
        decode_profile(json.dumps(change(doc)))


def test_sixteen_numa_nodes_with_memory_fit_the_bound() -> None:
    profile = with_memory(numa_per_socket=8)
    assert len(encode_profile(profile).encode()) < MAX_ANNOTATION_BYTES // 4


def test_pod_records_with_memory_are_format_2() -> None:
    blocks = (
        MemoryBlock(frozenset({0}), "hugepages-2Mi", 0),
        MemoryBlock(frozenset({0, 1}), "memory", 96 * GI),
    )
    placement = PodPlacement(
        3, (ContainerPlacement("main", frozenset({0, 1}), frozenset({4, 5}), {}, blocks),)
    )
    text = encode_placement(placement)
    assert json.loads(text)["v"] == 2
    assert json.loads(text)["containers"][0]["memory"]["memory"] == ["0-1", 96 * GI]
    assert decode_placement(text) == placement
    prediction = PodPrediction(3, (ContainerPrediction("main", frozenset({1}), frozenset(), {}, blocks[1:]),))
    assert decode_prediction(encode_prediction(prediction)) == prediction
    without = PodPrediction(3, (ContainerPrediction("main", frozenset({1}), frozenset()),))
    assert json.loads(encode_prediction(without))["v"] == 1


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (
            '{"v":1,"gen":1,"containers":[{"name":"a","memory":{"memory":["0",1]}}]}',
            "format version 1 does not match its content",
        ),
        ('{"v":2,"gen":1,"containers":[{"name":"a"}]}', "format version 2 does not match its content"),
        (
            '{"v":2,"gen":1,"containers":[{"name":"a","memory":{"memory":["0"]}}]}',
            r"want \[NUMA nodes, bytes\]",
        ),
        ('{"v":2,"gen":1,"containers":[{"name":"a","memory":{"memory":["",1]}}]}', "NUMA nodes missing"),
        (
            '{"v":2,"gen":1,"containers":[{"name":"a","memory":{"cpu":["0",1]}}]}',
            "is not memory or hugepages",
        ),
    ],
)
def test_pod_memory_is_decoded_strictly(text: str, error: str) -> None:
    with pytest.raises(InvalidInput, match=error):
        decode_prediction(text)
