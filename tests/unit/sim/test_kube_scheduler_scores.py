"""kube-scheduler's NodeResourcesFit filter over many nodes, the default scores and ``selectHost``."""

from __future__ import annotations

import random

import pytest

from hamidsim.kube_scheduler import (
    DEFAULT_MEMORY_REQUEST,
    NodeRequests,
    NodeRoomIndex,
    NodeSampler,
    Resources,
    default_score,
    feasible_nodes,
    nodes_to_find,
    select_host,
)

GI = 1024**3


def _node(cpu: int = 4000, memory: int = 8 * GI, pods: int = 110) -> NodeRequests:
    return NodeRequests(Resources(cpu, memory), pods)


def test_feasible_nodes_keeps_those_with_cpu_memory_and_a_pod_slot_free() -> None:
    full_cpu, full_memory, full_pods, roomy = _node(), _node(), _node(pods=1), _node()
    full_cpu.add(Resources(3500, GI))
    full_memory.add(Resources(100, 7 * GI))
    full_pods.add(Resources(0, 0))
    nodes = {"cpu": full_cpu, "memory": full_memory, "pods": full_pods, "roomy": roomy}
    assert feasible_nodes(Resources(1000, 2 * GI), nodes.items()) == ["roomy"]
    assert feasible_nodes(Resources(500, GI), nodes.items()) == ["cpu", "memory", "roomy"]
    full_cpu.remove(Resources(3500, GI))
    assert feasible_nodes(Resources(1000, 2 * GI), nodes.items()) == ["cpu", "roomy"]


def test_the_room_index_answers_what_feasible_nodes_answers_as_pods_come_and_go() -> None:
    rng = random.Random(7)
    nodes = {f"n{i}": _node(rng.choice((2000, 4000)), rng.choice((4, 8)) * GI, pods=5) for i in range(40)}
    reference = {name: NodeRequests(node.allocatable, node.allowed_pods) for name, node in nodes.items()}
    index = NodeRoomIndex(nodes)
    bound: list[tuple[str, Resources]] = []
    for _ in range(400):
        request = Resources(rng.choice((0, 250, 1000, 1500)), rng.choice((0, GI // 2, 2 * GI)))
        feasible = index.feasible(request)
        assert list(feasible) == feasible_nodes(request, reference.items())
        if bound and rng.random() < 0.3:
            name, gone = bound.pop(rng.randrange(len(bound)))
            index.remove(name, gone)
            reference[name].remove(gone)
        elif feasible:
            name = rng.choice(feasible)
            index.add(name, request)
            reference[name].add(request)
            bound.append((name, request))
    assert nodes == reference


def test_the_room_index_answers_the_same_tuple_while_the_short_nodes_stay_the_same() -> None:
    nodes = {"a": _node(), "b": _node()}
    index = NodeRoomIndex(nodes)
    assert index.feasible(Resources(1000, GI)) is index.names
    index.add("a", Resources(3500, GI))
    first = index.feasible(Resources(1000, GI))
    assert first == ("b",)
    assert index.feasible(Resources(2000, 2 * GI)) is first
    assert index.feasible(Resources(100, GI)) == ("a", "b")


def test_default_score_is_least_allocated_plus_balanced_allocation() -> None:
    # cpu (4000-1000)/4000 and memory (8-2)/8: 75 each; fractions 0.25 and 0.25: balanced 100
    assert default_score(Resources(1000, 2 * GI), _node()) == 75 + 100
    busy = _node()
    busy.add(Resources(2000, 2 * GI))
    # cpu 3000 of 4000 → 25, memory 4 of 8 Gi → 50: least 37; fractions 0.75 / 0.5 → std 0.125 → 87
    assert default_score(Resources(1000, 2 * GI), busy) == 37 + 87


def test_a_pod_without_requests_is_scored_with_kube_schedulers_defaults() -> None:
    node = _node(cpu=1000, memory=2 * DEFAULT_MEMORY_REQUEST)
    # non-zero requests 100m and 200 MiB: cpu 90, memory 50 → 70; actual fractions 0 and 0 → 100
    assert default_score(Resources(0, 0), node) == 70 + 100


def test_select_host_takes_the_best_score_and_breaks_ties_at_random() -> None:
    scored = [("low", 10), ("a", 50), ("b", 50)]
    picks = {select_host(scored, random.Random(seed)) for seed in range(50)}
    assert picks == {"a", "b"}
    assert select_host([], random.Random(1)) is None


@pytest.mark.parametrize(
    ("percentage", "total", "wanted"),
    [
        # kube-scheduler's TestNumFeasibleNodesToFind (schedule_one_test.go), by its case names
        (0, 10, 10),  # not set percentageOfNodesToScore and nodes number not more than 50
        (40, 10, 10),  # set percentageOfNodesToScore and nodes number not more than 50
        (0, 1000, 420),  # not set percentageOfNodesToScore and nodes number more than 50
        (40, 1000, 400),  # set percentageOfNodesToScore and nodes number more than 50
        (0, 6000, 300),  # not set percentageOfNodesToScore and nodes number more than 50*125
        (40, 6000, 2400),  # set percentageOfNodesToScore and nodes number more than 50*125
        (0, 1213, 497),  # the openb trace's nodes: 41 %
        (100, 1213, 1213),
        (5, 1213, 100),  # never fewer than 100
    ],
)
def test_nodes_to_find_is_kube_schedulers_count(percentage: int, total: int, wanted: int) -> None:
    assert nodes_to_find(percentage, total) == wanted


def test_the_sampler_searches_from_where_the_last_search_stopped() -> None:
    names = [f"n{i:03}" for i in range(200)]
    sampler = NodeSampler(names, 50)  # 100 of 200
    every = tuple(names)
    assert sampler.sample(every) == every[:100]
    assert sampler.sample(every) == every[100:]  # the next search starts after the last one examined
    assert sampler.start == 0
    odd = every[1::2]  # half the nodes feasible: the search examines every node, finds 100
    assert sampler.sample(odd) == odd and sampler.start == 0  # all examined: the start stays
    sampler.start = 150
    found = sampler.sample(every[10:])  # wraps around past the end, skipping the infeasible
    assert found == every[150:] + every[10:60]
    assert sampler.start == 60
    assert NodeSampler(names, 100).sample(odd) == odd
