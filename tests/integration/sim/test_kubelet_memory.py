"""The simulated kubelet with Memory Manager Static against the embedded API server: memory pinned
per NUMA node at admission, reported by PodResources (List and GetAllocatableResources), kept
across a kubelet restart, given back when the pod ends; hugepages in the node status."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from hamid.kube.client import KubeClient
from hamid.model.numa import MemoryBlock
from hamid.plugin.podresources_client import PodResourcesClient
from hamidsim.kubelet import SimKubelet
from hamidsim.kubelet.config import parse_kubelet_config
from hamidsim.machine import parse_machine_text
from tests import builders

GI = 1 << 30
NODE = "node-m"
MACHINE = parse_machine_text(
    """
numaNodes: [{id: 0, cpus: "0-7"}, {id: 1, cpus: "8-15"}]
reservedCpus: "0,8"
numaMemory: {0: 32Gi, 1: 64Gi}
hugepages: {1: {1Gi: 4}}
"""
)
CONFIG = parse_kubelet_config(
    yaml.safe_load(
        """
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cpuManagerPolicy: static
topologyManagerPolicy: single-numa-node
memoryManagerPolicy: Static
systemReserved: {memory: 1948Mi}
reservedMemory: [{numaNode: 0, limits: {memory: 1Gi}}, {numaNode: 1, limits: {memory: 1Gi}}]
"""
    )
)


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="hm", dir="/tmp"))  # unix socket paths are short
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _pod(name: str, memory: str, hugepages: str | None = None) -> dict:
    limits = {"cpu": "2", "memory": memory} | ({"hugepages-1Gi": hugepages} if hugepages else {})
    return builders.pod(name, node=NODE, containers=[builders.container(limits=limits)])


async def test_memory_is_pinned_reported_kept_and_given_back(kube: KubeClient, root: Path) -> None:
    kubelet = SimKubelet(kube, node_name=NODE, machine=MACHINE, root=root, config=CONFIG, rpc_timeout=5.0)
    try:
        await kubelet.start()
        status = kubelet.node_status()
        assert status["capacity"]["hugepages-1Gi"] == str(4 * GI)
        assert status["allocatable"]["memory"] == str(92 * GI)
        # 40Gi fits NUMA 1 only (NUMA 0 has 31Gi): the memory decides, the CPUs follow
        await kube.create_pod(_pod("big", "40Gi", "2Gi"))
        record = await kubelet.wait_admission("default", "big", published=True)
        assert record.admitted, record.message
        main = record.container("main")
        assert main.numa_node == 1 and main.cpu_numa_nodes == (1,)
        assert main.memory == {"hugepages-1Gi": ((1,), 2 * GI), "memory": ((1,), 40 * GI)}
        client = PodResourcesClient(str(kubelet.pod_resources.socket))
        allocatable = await client.allocatable()
        assert allocatable.memory == {0: {"memory": 31 * GI}, 1: {"hugepages-1Gi": 4 * GI, "memory": 59 * GI}}
        (held,) = await client.list_pods()
        assert held.containers[0].memory == (
            MemoryBlock(frozenset({1}), "hugepages-1Gi", 2 * GI),
            MemoryBlock(frozenset({1}), "memory", 40 * GI),
        )
        # NUMA 1 has 19Gi left: the next pod's 20Gi goes to NUMA 0
        await kubelet.restart()  # re-admission from the held blocks keeps the state
        await kube.create_pod(_pod("second", "20Gi"))
        second = await kubelet.wait_admission("default", "second")
        assert second.admitted and second.container("main").memory == {"memory": ((0,), 20 * GI)}
        await kubelet.terminate_pod("default", "big")
        assert kubelet.memory is not None
        assert kubelet.memory.machine[1].tables["memory"].free == 59 * GI
    finally:
        await kubelet.stop()
