"""The predictor's Static memory manager (``hamid/fit/numa_memory.py``): kubelet's own cases from
``pkg/kubelet/cm/memorymanager/policy_static_test.go`` (descriptions quoted), the ledger's booking,
and predictions where memory, not CPU, decides the NUMA node — each checked against the simulated
kubelet (the differential test's oracle)."""

from __future__ import annotations

from typing import Any

import pytest

from hamid.fit.numa_memory import MemoryLedger, MemoryPinError
from hamid.fit.numa_predict import NumaLedger, NumaUsage, Outcome, is_narrower, iterate_masks, predict
from hamid.model.errors import InvalidInput
from hamid.model.numa import MemoryBlock
from tests.unit.fit.test_numa_differential import (
    NOW,
    Plugin,
    SimNode,
    _case,
    _container,
    check_agreement,
    plugin,
    profile_of,
)

__all__ = ["plugin"]  # the differential test's fixture: a real device plugin endpoint

MI = 1 << 20
GI = 1 << 30


def ledger_with(allocatable: dict[int, int], *used: tuple[frozenset[int], int]) -> MemoryLedger:
    """Regular memory per NUMA node, with blocks already booked."""
    ledger = MemoryLedger({n: {"memory": size} for n, size in allocatable.items()})
    for numa, size in used:
        ledger.apply([MemoryBlock(numa, "memory", size)])
    return ledger


def masks(n: int) -> list[int]:
    return list(iterate_masks(tuple(range(n))))


def test_default_hint_not_preferred_fails_under_a_preferred_topology_hint() -> None:
    """'should fail when no NUMA affinity was provided under the topology manager preferred hint and
    default hint has preferred false': node 0 alone could hold 1Gi if empty (so single nodes are
    preferred), but only {1,2} has it free."""
    ledger = ledger_with({0: GI, 1: 512 * MI, 2: 512 * MI}, (frozenset({0}), 512 * MI))
    assert ledger.hints(masks(3), {"memory": GI}, {}) == {"memory": [(0b110, False)]}
    with pytest.raises(MemoryPinError, match="failed to find the default preferred hint"):
        ledger.pin_mask(masks(3), {"memory": GI}, {}, (0, True), is_narrower)
    assert ledger.pin_mask(masks(3), {"memory": GI}, {}, (0, False), is_narrower) == 0b110


def test_extension_fails_when_groups_forbid_it() -> None:
    """'should fail when NUMA affinity provided under the topology manager hint did not satisfy
    container requirements and extended hint generation failed'"""
    ledger = ledger_with({0: 512 * MI, 1: 1536 * MI, 2: 1536 * MI}, (frozenset({1, 2}), 2 * GI))
    with pytest.raises(MemoryPinError, match="failed to find NUMA nodes to extend"):
        ledger.pin_mask(masks(3), {"memory": GI}, {}, (0b001, False), is_narrower)


def test_new_hints_respect_groups() -> None:
    """'should calculate new topology hints, when the container does not exist under assignments':
    nodes 0 and 1 form a group whose hugepages are used up, so only 2, 3 (preferred) and {2,3}."""
    ledger = MemoryLedger({n: {"memory": 1536 * MI, "hugepages-1Gi": GI} for n in range(4)})
    pair = frozenset({0, 1})
    ledger.apply([MemoryBlock(pair, "memory", 2 * GI), MemoryBlock(pair, "hugepages-1Gi", 2 * GI)])
    expected = [(0b0100, True), (0b1000, True), (0b1100, False)]
    requested = {"memory": GI, "hugepages-1Gi": GI}
    assert ledger.hints(masks(4), requested, {}) == {"memory": expected, "hugepages-1Gi": expected}


def test_default_hint_without_room_fails() -> None:
    """'should fail when no NUMA affinity was provided under the topology manager hint and calculation
    of the default hint failed'"""
    ledger = ledger_with({0: 1536 * MI}, (frozenset({0}), GI))
    with pytest.raises(MemoryPinError, match="failed to get the default NUMA affinity"):
        ledger.pin_mask(masks(1), {"memory": GI}, {}, None, is_narrower)


def test_ledger_books_and_releases_like_kubelet() -> None:
    """``updateMachineState`` / ``RemoveContainer``: nodes fill in id order, the group dissolves with
    its last block; booking more than is free or releasing what is not held changes nothing."""
    ledger = ledger_with({0: GI, 1: GI})
    block = MemoryBlock(frozenset({0, 1}), "memory", 1536 * MI)
    ledger.apply([block])
    assert (ledger.free(0b01, "memory"), ledger.free(0b10, "memory")) == (0, 512 * MI)
    assert not ledger.respects_groups(0b01) and ledger.respects_groups(0b11)
    before = ledger.state_key()
    with pytest.raises(InvalidInput, match="are not free"):
        ledger.apply([MemoryBlock(frozenset({0, 1}), "memory", GI)])
    with pytest.raises(InvalidInput, match="not in use"):
        ledger.release([MemoryBlock(frozenset({0}), "memory", GI)])
    assert ledger.state_key() == before
    ledger.release([block])
    assert ledger.state_key() == ledger_with({0: GI, 1: GI}).state_key()


def test_a_block_is_released_whatever_was_pinned_after_it() -> None:
    """``RemoveContainer`` checks no group: a NUMA node's group stays the mask of the last block
    pinned on it until its last block goes. A single-node block pinned on node 1 after a block on
    NUMA 0-1 (kubelet allows it: a single-node mask never violates a group) left the 0-1 block
    unreleasable, and the scheduler's ledger raised out of its event handlers (review2 R1)."""
    ledger = ledger_with({0: GI, 1: GI})
    wide = MemoryBlock(frozenset({0, 1}), "memory", 1536 * MI)
    narrow = MemoryBlock(frozenset({1}), "memory", 64 * MI)
    ledger.apply([wide])
    ledger.apply([narrow])
    with pytest.raises(InvalidInput, match="not in use"):  # none was booked on NUMA 0 alone
        ledger.release([MemoryBlock(frozenset({0}), "memory", 64 * MI)])
    ledger.release([wide])
    # node 0 held nothing more: its own group again; node 1 keeps the last group pinned on it
    assert ledger.respects_groups(0b01) and not ledger.respects_groups(0b11)
    assert (ledger.free(0b01, "memory"), ledger.free(0b10, "memory")) == (GI, GI - 64 * MI)
    with pytest.raises(InvalidInput, match="not in use"):  # released once only
        ledger.release([wide])
    ledger.release([narrow])
    assert ledger.state_key() == ledger_with({0: GI, 1: GI}).state_key()


def test_numa_ledger_without_memory_refuses_memory_blocks() -> None:
    ledger = NumaLedger(1, {0, 1}, {})
    with pytest.raises(InvalidInput, match="without the Static memory manager"):
        ledger.apply(NumaUsage(memory=(MemoryBlock(frozenset({0}), "memory", 1),)))


# --- predictions against the simulated kubelet ------------------------------------------------------


def _memory_node(**changes: Any) -> Any:
    """Two NUMA nodes with 2 cores each: NUMA 0 has 16Gi (1Gi reserved), NUMA 1 4Gi."""
    base: dict[str, Any] = {
        "devices": (),
        "tm_policy": "single-numa-node",
        "memory_gib": (16, 4),
        "hugepages": (0, 0),
        "reserved_mib": (1024, 0),
    }
    return _case(**(base | changes))


def _pod(name: str, cpu: str, memory: str, hugepages: int = 0) -> dict[str, Any]:
    spec = {"containers": [_container("c", "Guaranteed", cpu, 0, False, memory=memory, hugepages=hugepages)]}
    return {"metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"}, "spec": spec}


def test_memory_decides_the_numa_node(plugin: Plugin) -> None:
    """An earlier 2-CPU pod took NUMA 0's free CPUs down to one core; CPU alone would still tie to
    NUMA 0 for 1 CPU, but 6Gi fits only NUMA 0's allocatable memory... and a 2Gi pod that CPU
    places on NUMA 0 goes there; a 6Gi pod with 2 CPUs must be on NUMA 0 and is; a 3.5Gi pod whose
    CPUs fit only NUMA 1 is rejected (its memory would fit NUMA 1's 4Gi only as if empty)."""
    m = _memory_node()
    node = SimNode(m, plugin)
    profile = profile_of(m)
    first = _pod("first", "2", "6Gi")
    got = predict(profile, node.ledger(1), first, now=NOW)
    assert got.outcome is Outcome.PLACED and got.containers[0].numa == frozenset({0})
    assert got.usage.memory == (MemoryBlock(frozenset({0}), "memory", 6 * GI),)
    check_agreement(node, first, got)
    # NUMA 0 has 1 CPU left (CPU 0 reserved): 2 CPUs fit NUMA 1 only; 6Gi fits NUMA 0 only
    second = _pod("second", "2", "6Gi")
    got = predict(profile, node.ledger(1), second, now=NOW)
    assert (got.outcome, got.reason) == (Outcome.REJECT, "TopologyAffinityError")
    check_agreement(node, second, got)


def test_preferred_as_if_empty_under_restricted(plugin: Plugin) -> None:
    """kubelet's table case on a node (shared-pool CPUs, 500m: no CPU hints): NUMA 0 could hold
    7.5Gi if it were empty, so one node is the preferred size; with 8Gi taken there, only the small
    NUMA 1 and 2 together have it free — a hint that is not preferred. Restricted rejects it
    (TopologyAffinityError); best-effort pins the memory to {1,2}."""
    three = {"numa": 3, "distances": ((10, 20, 20), (20, 10, 20), (20, 20, 10))}
    memory = {"memory_gib": (16, 4, 4), "hugepages": (0, 0, 0), "reserved_mib": (1024, 0, 0)}
    arrival = _pod("arrival", "500m", "7680Mi")
    for policy, outcome, reason in (
        ("restricted", Outcome.REJECT, "TopologyAffinityError"),
        ("best-effort", Outcome.PLACED, ""),
    ):
        m = _memory_node(tm_policy=policy, **three, **memory)
        node = SimNode(m, plugin)
        assert node.admit(_pod("earlier", "500m", "8Gi")).admitted
        got = predict(profile_of(m), node.ledger(1), arrival, now=NOW)
        assert (got.outcome, got.reason) == (outcome, reason)
        if outcome is Outcome.PLACED:
            assert got.usage.memory == (MemoryBlock(frozenset({1, 2}), "memory", 7680 * MI),)
        check_agreement(node, arrival, got)


def test_a_group_violation_is_an_admission_error(plugin: Plugin) -> None:
    """No mask has 10Gi free and respects NUMA 0's single-node block: the memory manager gives no
    hints, the Topology Manager's hint is both nodes (preferred), and ``Allocate`` refuses it."""
    m = _memory_node(tm_policy="restricted", memory_gib=(16, 8))
    node = SimNode(m, plugin)
    assert node.admit(_pod("earlier", "500m", "8Gi")).admitted
    arrival = _pod("arrival", "500m", "10Gi")
    got = predict(profile_of(m), node.ledger(1), arrival, now=NOW)
    assert (got.outcome, got.reason) == (Outcome.REJECT, "UnexpectedAdmissionError")
    assert "violates NUMA node allocation" in got.message
    check_agreement(node, arrival, got)


def test_a_multi_numa_group_takes_later_pods_only_whole(plugin: Plugin) -> None:
    """Policy none (the memory manager's own default hint): 18Gi needs both nodes and forms the
    group {0,1}; a later 1Gi pod may only join that group (no single node is left), so its memory
    is pinned to both NUMA nodes."""
    m = _memory_node(tm_policy="none", memory_gib=(16, 8))
    node = SimNode(m, plugin)
    profile = profile_of(m)
    big = _pod("big", "1", "18Gi")
    got = predict(profile, node.ledger(1), big, now=NOW)
    assert got.outcome is Outcome.PLACED and got.usage.memory[0].numa == frozenset({0, 1})
    check_agreement(node, big, got)
    small = _pod("small", "1", "1Gi", hugepages=0)
    got = predict(profile, node.ledger(1), small, now=NOW)
    assert got.outcome is Outcome.PLACED and got.usage.memory[0].numa == frozenset({0, 1})
    check_agreement(node, small, got)
