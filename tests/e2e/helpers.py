"""Helpers of the end-to-end suite: staged clusters, the seed pod, and the cross-checks of I1/I2."""

from __future__ import annotations

from typing import Any

from hamid.model.devices import PodDevices
from hamidsim.cluster import SimCluster
from hamidsim.demo import FILLER_NAME, NODE, filler_pod, refit_event_message

__all__ = ["NODE", "refit_event_message", "stage", "uuids"]


async def stage(cluster: SimCluster, node: str = NODE) -> int:
    """Fill NUMA 1's free CPUs of the demo node with a Guaranteed CPU-only pod; returns its NUMA node."""
    name = FILLER_NAME if node == NODE else f"{FILLER_NAME}-{node}"
    await cluster.create_pod(filler_pod(node, name=name))
    await cluster.wait_settled(name)
    admission = cluster.assignment(name)
    assert admission is not None and admission.admitted
    numa = admission.containers[0].numa_node
    assert numa == 1
    return numa


def uuids(devices: PodDevices | None, container: int = 0) -> list[str]:
    """UUIDs of one container's devices."""
    assert devices is not None
    return [d.uuid for d in devices[container]]


def env_of(cluster: SimCluster, name: str) -> dict[str, Any]:
    """Allocate env of the pod's first container (as the simulated kubelet recorded it)."""
    admission = cluster.assignment(name)
    assert admission is not None and admission.containers
    return dict(admission.containers[0].env)
