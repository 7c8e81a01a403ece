"""The scheduler's NUMA ledger on a node with kubelet's Static memory manager: memory, not CPU,
decides the NUMA node the GPU is fitted on; a burst sees its predecessors' memory; observed
placements with memory blocks displace predictions; a restart rebuilds the memory state exactly."""

from __future__ import annotations

import dataclasses
from typing import Any

from hamid.model import reasons as R
from hamid.model.numa import (
    NUMA_PLACEMENT,
    NUMA_PREDICTED,
    NUMA_PROFILE,
    ContainerPlacement,
    MemoryBlock,
    PodPlacement,
    encode_placement,
    encode_profile,
)
from tests.unit.scheduler.test_numa_ledger import PROFILE, _filtered, _gpus_of, _node, _plan, _pod, _scheduler

GI = 1 << 30
#: NUMA 0 has 8Gi allocatable, NUMA 1 32Gi (PodResources' allocatable memory under Static).
MEMORY_PROFILE = dataclasses.replace(
    PROFILE,
    policies=dataclasses.replace(PROFILE.policies, memory_manager_policy="Static"),
    memory=((0, (("memory", 8 * GI),)), (1, (("memory", 32 * GI),))),
)


def _memory_node() -> dict[str, Any]:
    node = _node()
    node["metadata"]["annotations"][NUMA_PROFILE] = encode_profile(MEMORY_PROFILE)
    return node


def _memory_pod(name: str, memory: str, cpus: int = 2, gpus: int = 1, **kw: Any) -> dict[str, Any]:
    p = _pod(name, cpus=cpus, gpus=gpus, **kw)
    for c in p["spec"]["containers"]:
        c["resources"]["limits"]["memory"] = c["resources"]["requests"]["memory"] = memory
    return p


def test_memory_decides_where_the_gpu_is_fitted() -> None:
    """2 CPUs fit both NUMA nodes (CPU alone picks NUMA 0), 16Gi fits only NUMA 1's memory."""
    scheduler, _ = _scheduler(_memory_node())
    node, fitted, _, numa = _plan(scheduler, _memory_pod("a", "16Gi"))
    assert node == "n1" and _gpus_of(fitted) == ["n1-g1"]
    prediction = numa.predictions["n1"]
    assert prediction is not None and prediction.containers[0].numa == frozenset({1})
    assert prediction.usage.memory == (MemoryBlock(frozenset({1}), "memory", 16 * GI),)


def test_a_burst_sees_its_predecessors_memory() -> None:
    """Two 16Gi pods fill NUMA 1's memory; the third fits no single NUMA node: not offered."""
    scheduler, _ = _scheduler(_memory_node())
    for name in ("b0", "b1"):
        p = _memory_pod(name, "16Gi", cpus=1)
        node, _, _, numa = _plan(scheduler, p)
        prediction = numa.predictions["n1"]
        assert node == "n1" and prediction is not None
        scheduler.numa.book(p["metadata"]["uid"], node, prediction, p)
    node, _, failed, _ = _plan(scheduler, _memory_pod("b2", "16Gi", cpus=1))
    assert node is None and failed == {"n1": R.NUMA_PREDICTED_NOT_FIT}


def test_an_observed_placement_with_memory_is_booked_and_rebuilt_exactly() -> None:
    """A foreign pod's observed 30Gi on NUMA 1 leaves 2Gi there: a 16Gi pod is rejected; after a
    restart the ledger rebuilt from the annotations answers the same."""
    scheduler, _ = _scheduler(_memory_node())
    foreign = _memory_pod("f", "30Gi", cpus=1, gpus=0, scheduler="default-scheduler", node="n1")
    block = MemoryBlock(frozenset({1}), "memory", 30 * GI)
    placement = PodPlacement(1, (ContainerPlacement("main", frozenset({1}), frozenset({4}), {}, (block,)),))
    foreign["metadata"]["annotations"][NUMA_PLACEMENT] = encode_placement(placement)
    scheduler._pod_seen(foreign)
    small = _memory_pod("s", "4Gi", cpus=1)
    node, _, _, numa = _plan(scheduler, small)
    assert node == "n1" and numa.predictions["n1"] is not None
    assert numa.predictions["n1"].containers[0].numa == frozenset({0})
    node, _, failed, _ = _plan(scheduler, _memory_pod("big", "16Gi", cpus=1))
    assert node is None and failed == {"n1": R.NUMA_PREDICTED_NOT_FIT}
    booked = _filtered(scheduler, "g", cpus=1)  # 1Gi, predicted and annotated (format 2 with memory)
    assert '"memory":{"memory":' in booked["metadata"]["annotations"][NUMA_PREDICTED]
    restarted, _ = _scheduler(_memory_node())
    for p in (foreign, booked):
        restarted._pod_seen(p)
    assert restarted.numa.nodes["n1"].memo_key() == scheduler.numa.nodes["n1"].memo_key()
