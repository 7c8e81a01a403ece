"""Helpers of the end-to-end suite: staged clusters, the seed pod, and the cross-checks of I1/I2."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from hamid.model import annotations as ann
from hamid.model.devices import PodDevices
from hamid.sim.cluster import SimCluster
from hamid.sim.demo import FILLER_NAME, NODE, filler_pod, refit_event_message

__all__ = ["NODE", "expected_usage", "refit_event_message", "stage", "uuids"]


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


def expected_usage(cluster: SimCluster) -> dict[str, dict[str, tuple[int, int, int]]]:
    """Per node and GPU (slots, MiB, cores) recomputed from the API: live pods' allocated annotations."""
    usage: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0, 0]))
    for pod in cluster.server.list("Pod", None):
        meta = pod.get("metadata") or {}
        notes = meta.get("annotations") or {}
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed") or meta.get("deletionTimestamp"):
            continue
        raw, node = notes.get(ann.DEVICES_ALLOCATED), notes.get(ann.VGPU_NODE)
        if raw is None or node is None:
            continue
        for container in ann.decode_pod_devices(raw):
            for d in container:
                row = usage[node][d.uuid]
                row[0] += 1
                row[1] += d.usedmem
                row[2] += d.usedcores
    return {n: {u: (v[0], v[1], v[2]) for u, v in gpus.items()} for n, gpus in usage.items()}


def used_only(
    snapshot: dict[str, dict[str, tuple[int, int, int]]],
) -> dict[str, dict[str, tuple[int, int, int]]]:
    """A scheduler snapshot without idle GPUs (comparable with :func:`expected_usage`)."""
    out = {n: {u: v for u, v in gpus.items() if v != (0, 0, 0)} for n, gpus in snapshot.items()}
    return {n: gpus for n, gpus in out.items() if gpus}


def env_of(cluster: SimCluster, name: str) -> dict[str, Any]:
    """Allocate env of the pod's first container (as the simulated kubelet recorded it)."""
    admission = cluster.assignment(name)
    assert admission is not None and admission.containers
    return dict(admission.containers[0].env)
