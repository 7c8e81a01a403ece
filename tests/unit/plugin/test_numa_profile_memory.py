"""The node agent's profile under kubelet's Memory Manager: PodResources' allocatable memory is
published under ``Static`` only, and only when kubelet reports some (else the predictor must not
assume an empty node)."""

from __future__ import annotations

from hamid.model.numa import CpuInfo, KubeletPolicies
from hamid.plugin.cpu_topology import CpuTopology
from hamid.plugin.numa_publisher import build_profile

TOPOLOGY = CpuTopology((0, 1), tuple(CpuInfo(c, c, c // 2, c // 2) for c in range(4)), None)
GI = 1 << 30
REPORTED = {0: {"memory": 30 * GI, "hugepages-1Gi": 0}, 1: {"memory": 31 * GI}}


def test_static_publishes_the_reported_allocatable_memory() -> None:
    profile = build_profile(
        TOPOLOGY, KubeletPolicies(memory_manager_policy="Static"), frozenset({1, 2, 3}), None, REPORTED
    )
    assert profile.memory == ((0, (("memory", 30 * GI),)), (1, (("memory", 31 * GI),)))


def test_no_memory_without_static_or_without_a_report() -> None:
    assert build_profile(TOPOLOGY, KubeletPolicies(), frozenset({1, 2, 3}), None, REPORTED).memory is None
    static = KubeletPolicies(memory_manager_policy="Static")
    assert build_profile(TOPOLOGY, static, frozenset({1, 2, 3}), None, {}).memory is None
