"""Topology Manager merge, device/CPU hint generation and static CPU picks, against kubelet's rules."""

from __future__ import annotations

import pytest

from hamid.model.errors import InvalidInput
from hamidsim.kubelet.cadvisor import CpuTopology, format_cpu_list, parse_cpu_list
from hamidsim.kubelet.cpu_assignment import CpuAllocationError, take_by_topology
from hamidsim.kubelet.cpumanager import allocate_cpus, generate_cpu_hints, guaranteed_cpus
from hamidsim.kubelet.devicemanager import (
    device_hints_for_resource,
    filter_by_affinity,
    generate_device_hints,
)
from hamidsim.kubelet.podutil import pod_qos_class
from hamidsim.kubelet.topologymanager import TopologyHint, check_manager, iterate_masks, merge_hints

N0 = frozenset({0})
N1 = frozenset({1})
BOTH = frozenset({0, 1})
NUMA = [0, 1]
# 2 NUMA nodes x 4 devices (docs/kubelet-and-extender.md §2.5 example).
DEVICES = {f"d{i}": (0,) if i < 4 else (1,) for i in range(8)}
TOPO = CpuTopology.from_numa({0: frozenset(range(0, 8)), 1: frozenset(range(8, 16))})


def hint(mask: frozenset[int] | None, preferred: bool) -> TopologyHint:
    return TopologyHint(mask, preferred)


def test_iterate_masks_by_size() -> None:
    assert list(iterate_masks([0, 1, 2])) == [
        frozenset({0}),
        frozenset({1}),
        frozenset({2}),
        frozenset({0, 1}),
        frozenset({0, 2}),
        frozenset({1, 2}),
        frozenset({0, 1, 2}),
    ]


def test_device_hints_two_per_node() -> None:
    hints = generate_device_hints(NUMA, DEVICES, DEVICES, (), 2)
    assert hints == [hint(N0, True), hint(N1, True), hint(BOTH, False)]


def test_device_hints_one_free_per_node_only_cross_numa() -> None:
    hints = generate_device_hints(NUMA, DEVICES, {"d0", "d4"}, (), 2)
    assert hints == [hint(BOTH, False)]


def test_device_hints_request_larger_than_a_node_prefers_both() -> None:
    hints = generate_device_hints(NUMA, DEVICES, DEVICES, (), 6)
    assert hints == [hint(BOTH, True)]


def test_device_hints_no_topology_is_dont_care_and_shortage_is_empty() -> None:
    no_topo = {"a": None, "b": ()}
    assert device_hints_for_resource(NUMA, no_topo, {"a", "b"}, (), 1) is None
    assert device_hints_for_resource(NUMA, DEVICES, {"d0"}, (), 2) == []


def test_device_hints_reusable_outside_mask_disqualifies_it() -> None:
    hints = generate_device_hints(NUMA, DEVICES, {"d1", "d2", "d5"}, {"d4"}, 2)
    # d4 (NUMA 1) is reusable: every mask without NUMA 1 is dropped.
    assert hints == [hint(N1, True), hint(BOTH, False)]


def test_device_hints_regenerated_from_allocated() -> None:
    assert device_hints_for_resource(NUMA, DEVICES, DEVICES, (), 1, already_allocated={"d5"}) == [
        hint(N1, True),
        hint(BOTH, False),
    ]
    assert device_hints_for_resource(NUMA, DEVICES, DEVICES, (), 2, already_allocated={"d5"}) == []


def test_topology_less_devices_are_invisible_to_hints() -> None:
    mixed = {"a": (0,), "b": None, "c": None}
    # Three devices free but only one has topology: a request of 2 gets no hint at all.
    assert generate_device_hints(NUMA, mixed, {"a", "b", "c"}, (), 2) == []


def test_single_numa_node_picks_common_node() -> None:
    cpu = {"cpu": [hint(N0, True), hint(N1, True), hint(BOTH, False)]}
    gpu = {"nvidia.com/gpu": [hint(N1, True), hint(BOTH, False)]}
    best, admit = merge_hints("single-numa-node", NUMA, [gpu, cpu])
    assert (best, admit) == (hint(N1, True), True)


def test_single_numa_node_rejects_cross_numa() -> None:
    cpu = {"cpu": [hint(N0, True), hint(BOTH, False)]}
    gpu = {"nvidia.com/gpu": [hint(N1, True), hint(BOTH, False)]}
    best, admit = merge_hints("single-numa-node", NUMA, [gpu, cpu])
    assert admit is False
    assert best == hint(None, False)
    # restricted rejects too; best-effort admits with the non-preferred hint whose size is the
    # largest per-resource minimum (1), the lower node on a tie — kubelet's HintMerger.
    assert merge_hints("restricted", NUMA, [gpu, cpu]) == (hint(N0, False), False)
    assert merge_hints("best-effort", NUMA, [gpu, cpu]) == (hint(N0, False), True)


def test_single_numa_node_rejects_request_needing_two_nodes() -> None:
    gpu = {"nvidia.com/gpu": [hint(BOTH, True)]}
    assert merge_hints("single-numa-node", NUMA, [gpu]) == (hint(None, False), False)
    assert merge_hints("restricted", NUMA, [gpu]) == (hint(BOTH, True), True)


def test_tie_goes_to_lower_node_and_dont_care() -> None:
    both = {"cpu": [hint(N0, True), hint(N1, True)]}
    assert merge_hints("single-numa-node", NUMA, [None, both]) == (hint(N0, True), True)
    assert merge_hints("best-effort", NUMA, [{"cpu": None}, both]) == (hint(N0, True), True)
    # Everybody "don't care": single-numa-node rewrites the full mask to nil.
    assert merge_hints("single-numa-node", NUMA, [None, {"x": None}]) == (hint(None, True), True)
    assert merge_hints("best-effort", NUMA, [None]) == (hint(BOTH, True), True)


def test_cannot_satisfy_resource() -> None:
    gpu: dict[str, list[TopologyHint] | None] = {"nvidia.com/gpu": []}
    assert merge_hints("restricted", NUMA, [gpu]) == (hint(BOTH, False), False)
    assert merge_hints("best-effort", NUMA, [gpu]) == (hint(BOTH, False), True)


def test_non_preferred_choice_closest_to_max_min_count() -> None:
    numa = [0, 1, 2, 3]
    a = {"a": [hint(frozenset({0, 1}), False), hint(frozenset({0, 1, 2, 3}), False)]}
    b = {"b": [hint(frozenset({1, 2}), False), hint(frozenset({0, 1, 2, 3}), False)]}
    best, admit = merge_hints("best-effort", numa, [a, b])
    # Both narrowest masks have 2 nodes: the best non-preferred hint has a count close to 2.
    assert best == hint(frozenset({0, 1}), False)
    assert admit


def test_policy_none_and_bad_policy() -> None:
    assert merge_hints("none", NUMA, [{"x": []}]) == (hint(None, False), True)
    with pytest.raises(InvalidInput):
        merge_hints("strict", NUMA, [])
    with pytest.raises(InvalidInput, match="more than 8 NUMA"):
        check_manager(list(range(9)), "restricted")
    check_manager(list(range(9)), "none")


def test_filter_by_affinity_split() -> None:
    devices = {"a": (0,), "b": (1,), "c": None, "d": (0, 1)}
    aligned, unaligned, none = filter_by_affinity(devices, devices, N1)
    assert (aligned, unaligned, none) == ({"b", "d"}, {"a"}, {"c"})
    assert filter_by_affinity(devices, devices, None) == (set(), set(), set(devices))
    assert filter_by_affinity({"x": None}, {"x"}, N0) == (set(), set(), {"x"})


def guaranteed_pod(cpu: str, *, memory: str = "1Gi", extra: dict[str, str] | None = None) -> dict:
    limits = {"cpu": cpu, "memory": memory, **(extra or {})}
    return {"spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]}}


def test_qos_and_guaranteed_cpus() -> None:
    pod = guaranteed_pod("8")
    assert pod_qos_class(pod) == "Guaranteed"
    assert guaranteed_cpus(pod, pod["spec"]["containers"][0]) == 8
    frac = guaranteed_pod("1500m")
    assert guaranteed_cpus(frac, frac["spec"]["containers"][0]) == 0
    burst = {"spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "2"}}}]}}
    assert pod_qos_class(burst) == "Burstable"
    assert guaranteed_cpus(burst, burst["spec"]["containers"][0]) == 0
    assert pod_qos_class({"spec": {"containers": [{"name": "c"}]}}) == "BestEffort"
    mismatch = {
        "spec": {
            "containers": [
                {
                    "name": "c",
                    "resources": {
                        "requests": {"cpu": "1", "memory": "1Gi"},
                        "limits": {"cpu": "2", "memory": "1Gi"},
                    },
                }
            ]
        }
    }
    assert pod_qos_class(mismatch) == "Burstable"


def test_cpu_hints_prefer_single_node() -> None:
    available = set(range(1, 8)) | set(range(9, 16))
    assert generate_cpu_hints(TOPO, available, (), 4) == [hint(N0, True), hint(N1, True), hint(BOTH, False)]
    # 7 free on each node, 8 requested: each node has 8 CPUs in total, so singles would be preferred,
    # but none has 8 free → only the cross-NUMA mask, not preferred.
    assert generate_cpu_hints(TOPO, available, (), 8) == [hint(BOTH, False)]
    assert generate_cpu_hints(TOPO, available, (), 15) == []


def test_take_by_topology_packs_fullest_node_first() -> None:
    free = set(range(2, 8)) | set(range(8, 16))  # NUMA 0 has 6 free, NUMA 1 has 8 (whole)
    assert take_by_topology(TOPO, free, 2) == frozenset({2, 3})
    # 8 CPUs: a whole free NUMA node is taken first.
    assert take_by_topology(TOPO, free, 8) == frozenset(range(8, 16))
    assert take_by_topology(TOPO, free, 10) == frozenset(range(8, 16)) | {2, 3}
    with pytest.raises(CpuAllocationError, match="requested=20, available=14"):
        take_by_topology(TOPO, free, 20)


def test_allocate_cpus_aligned_first_then_elsewhere() -> None:
    free = set(range(1, 8)) | set(range(9, 16))
    assert allocate_cpus(TOPO, 3, N1, free) == frozenset({9, 10, 11})
    # best-effort over-spill: 7 on NUMA 1 then 1 more from NUMA 0.
    assert allocate_cpus(TOPO, 8, N1, free) == frozenset(range(9, 16)) | {1}
    assert allocate_cpus(TOPO, 2, None, free) == frozenset({1, 2})


def test_cpu_list_syntax() -> None:
    assert parse_cpu_list("0-3, 8,10-11") == frozenset({0, 1, 2, 3, 8, 10, 11})
    assert format_cpu_list({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11"
    with pytest.raises(InvalidInput, match="ends before"):
        parse_cpu_list("5-2")
    with pytest.raises(InvalidInput):
        parse_cpu_list("a")
