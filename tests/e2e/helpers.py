"""Helpers of the end-to-end suite: staged clusters, the seed pod, and the cross-checks of I1/I2."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from hamid.model.devices import PodDevices
from hamid.model.numa import NUMA_PROFILE
from hamidsim.cluster import ClusterOptions, NodeSpec, SimCluster
from hamidsim.demo import FILLER_NAME, NODE, filler_pod, refit_event_message

__all__ = ["NODE", "refit_event_message", "stage", "uuids"]

#: The GPUs of :func:`two_numa_two_gpu_node`: one on each NUMA node.
GPU0, GPU1 = "GPU-00000000-0000-4000-8000-000000000000", "GPU-00000000-0000-4000-8000-000000000001"


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


def two_numa_two_gpu_node(
    directory: Path, hide: str, split: int, topology_policy: str = "restricted"
) -> ClusterOptions:
    """A cluster of one node, two NUMA nodes of 16 CPUs (CPU 0 reserved) with one 46 GB GPU each,
    Topology Manager ``topology_policy``, its plugin hiding replicas by ``hide`` (``--hide-replicas``)."""
    rows = [f"{cpu},{cpu},{numa},{numa}" for numa in (0, 1) for cpu in range(numa * 16, numa * 16 + 16)]
    doc = {
        "lscpu": "# CPU,Core,Socket,Node\n" + "\n".join(rows) + "\n",
        "reservedCpus": "0",
        "memory": "128Gi",
        "devices": [
            {"uuid": uuid, "index": i, "name": "NVIDIA L40S", "memoryMiB": 46068, "numa": i,
             "pciBusId": f"00000000:{0x18 + i:02x}:00.0"}
            for i, uuid in enumerate((GPU0, GPU1))
        ],
    }  # fmt: skip
    path = directory / "two-numa-two-gpu.yaml"
    path.write_text(yaml.safe_dump(doc), "utf-8")
    spec = NodeSpec(NODE, machine_file=path, topology_policy=topology_policy, split=split)
    return ClusterOptions(nodes=(spec,), hide_replicas=hide)


def numa_profile(cluster: SimCluster, node: str = NODE) -> str | None:
    """The node's ``hamid.io/numa-profile`` as stored (None until its plugin published one)."""
    stored = cluster.server.get("Node", None, node) or {}
    return ((stored.get("metadata") or {}).get("annotations") or {}).get(NUMA_PROFILE)
