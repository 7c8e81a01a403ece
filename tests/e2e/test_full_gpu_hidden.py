"""Free replicas hidden from kubelet (``--hide-replicas``), so an aligned pod lands where a GPU can take it.

A node with one GPU per NUMA node (16 CPUs each). ``full`` books all of GPU 0's memory (NUMA 0) and
takes 2 exclusive CPUs there; NUMA 0 still has the CPUs for ``aligned`` (8 exclusive CPUs,
best-effort alignment, 20000 MiB). kubelet counts replicas, not GPU room: while GPU 0 offers its
free replicas, the Topology Manager puts ``aligned``'s CPUs on NUMA 0, where no GPU has room, and
the pod runs unaligned on GPU 1 (the refit to NUMA 0 is refused). With ``--hide-replicas full`` (or
``busy``, the default where the replicas carry NUMA topology) the plugin reports GPU 0's free
replicas Unhealthy, kubelet's device hint is NUMA 1 alone, the pod's CPUs and GPU both land there,
the scheduler predicted exactly that (its profile says the plugin hides), and no refit is needed.
Under the ``busy`` rule the same holds for a GPU that is only partly used (by a Burstable share)
while GPU 1 is idle, and Burstable shares still run wherever the scheduler booked them. Everything
is real: scheduler, plugin (unix-socket gRPC to the simulated kubelet), PodResources, API server.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hamid.model import annotations as ann
from hamid.model.numa import NUMA_PREDICTED, ReplicaHiding, decode_prediction, decode_profile
from hamidsim.cluster import SimCluster, wait_until
from hamidsim.demo import seed_pod
from tests.e2e.helpers import GPU0, GPU1, NODE, numa_profile, two_numa_two_gpu_node, uuids

SPLIT = 10
RESOURCE = "nvidia.com/gpu"


def _share(name: str, gpu: str | None) -> dict[str, Any]:
    """A Burstable share (no alignment; 10000 MiB and 20 % of a GPU), on ``gpu`` when given."""
    share = seed_pod(name, alignment="", gpumem=10000)
    resources = share["spec"]["containers"][0]["resources"]
    resources["limits"] |= {"cpu": "1", "memory": "1Gi", "nvidia.com/gpucores": 20}
    resources["requests"] = {"cpu": "500m", "memory": "1Gi"}
    if gpu is not None:
        share["metadata"]["annotations"][ann.USE_GPU_UUID] = gpu
    return share


async def _run_share(cluster: SimCluster, name: str, gpu: str | None) -> list[str]:
    """Create a share, wait until kubelet admitted it; the GPUs it runs on. Where kubelet's replica
    is another GPU's (the plugin hides a partly used GPU's replicas until it has seen the pod's
    booking), the mismatch policy leaves a pod without ``numa-alignment`` on its booked GPU:
    never refitted, never refused."""
    await cluster.create_pod(_share(name, gpu))
    await cluster.wait_settled(name, timeout=15)
    admission = cluster.assignment(name)
    assert admission is not None and admission.admitted
    assert all(c.outcome == "unaligned" and not c.devices for c in cluster.refit_calls(name))
    return uuids(cluster.allocated(name))


async def _fill_gpu0(cluster: SimCluster) -> None:
    """``full``: all of GPU 0's memory and 2 exclusive CPUs of NUMA 0."""
    await wait_until(lambda: numa_profile(cluster) is not None, 10, "NUMA profile on the Node")
    full = seed_pod("full", alignment="", gpumem=None, gpumem_percentage=100)
    full["metadata"]["annotations"][ann.USE_GPU_UUID] = GPU0
    full["spec"]["containers"][0]["resources"]["limits"]["cpu"] = "2"
    await cluster.create_pod(full)
    await cluster.wait_settled("full", timeout=15)
    admission = cluster.assignment("full")
    assert admission is not None and admission.admitted
    assert uuids(cluster.allocated("full")) == [GPU0] and admission.containers[0].numa_node == 0


async def _run_aligned(cluster: SimCluster) -> tuple[int | None, list[str], int]:
    """``aligned``'s kubelet NUMA node, the GPUs it runs on, and the NUMA node the scheduler predicted."""
    await cluster.create_pod(seed_pod("aligned"))
    await cluster.wait_settled("aligned", timeout=15)
    admission = cluster.assignment("aligned")
    assert admission is not None and admission.admitted
    predicted = decode_prediction(cluster.annotations("aligned")[NUMA_PREDICTED])
    (numa,) = predicted.containers[0].numa
    return admission.containers[0].numa_node, uuids(cluster.allocated("aligned")), numa


async def test_full_gpu_hidden_so_aligned_pod_gets_cpus_and_gpu_on_numa_1(tmp_path: Path) -> None:
    async with SimCluster(two_numa_two_gpu_node(tmp_path, "full", SPLIT)) as cluster:
        kubelet = cluster.nodes[NODE].kubelet
        await _fill_gpu0(cluster)
        assert decode_profile(numa_profile(cluster)).hide_replicas == ReplicaHiding(RESOURCE, "full")
        # GPU 0's 9 free replicas hidden; the one ``full`` holds stays healthy: allocatable 1 + 10
        await wait_until(lambda: kubelet.allocatable(RESOURCE) == 1 + SPLIT, 10, "GPU 0's replicas hidden")
        numa, gpus, predicted = await _run_aligned(cluster)
        assert (numa, gpus, predicted) == (1, [GPU1], 1)
        admission = cluster.assignment("aligned")
        assert admission is not None and admission.containers[0].cpus <= frozenset(range(16, 32))
        assert cluster.refit_calls("aligned") == []
        assert cluster.booked_usage() == cluster.annotated_usage()
        # allocatable never below what the pods hold; GPU 0 re-offers its replicas once freed
        assert kubelet.allocatable(RESOURCE) >= 2
        await cluster.delete_pod("full")
        await wait_until(
            lambda: kubelet.allocatable(RESOURCE) == 2 * SPLIT, 10, "GPU 0's replicas re-offered"
        )


async def test_without_hiding_the_aligned_pod_runs_off_its_cpus_numa_node(tmp_path: Path) -> None:
    """The same stage with ``--hide-replicas=off``: the behaviour the option fixes."""
    async with SimCluster(two_numa_two_gpu_node(tmp_path, "off", SPLIT)) as cluster:
        await _fill_gpu0(cluster)
        assert decode_profile(numa_profile(cluster)).hide_replicas is None
        numa, gpus, predicted = await _run_aligned(cluster)
        assert (numa, gpus, predicted) == (0, [GPU1], 0)
        assert [c.outcome for c in cluster.refit_calls("aligned")] == ["unaligned"]
        assert cluster.nodes[NODE].kubelet.allocatable(RESOURCE) == 2 * SPLIT


async def test_busy_sends_an_aligned_whole_gpu_pod_to_the_idle_gpu_of_numa_1(tmp_path: Path) -> None:
    """GPU 0 (NUMA 0) holds a Burstable share, GPU 1 (NUMA 1) is idle: ``busy`` hides GPU 0's
    free replicas, so a whole-GPU aligned pod gets CPUs and GPU on NUMA 1, as predicted, with no
    refit (``full`` would offer GPU 0's replicas and send its CPUs to NUMA 0)."""
    async with SimCluster(two_numa_two_gpu_node(tmp_path, "busy", SPLIT)) as cluster:
        kubelet = cluster.nodes[NODE].kubelet
        await wait_until(lambda: numa_profile(cluster) is not None, 10, "NUMA profile on the Node")
        assert decode_profile(numa_profile(cluster)).hide_replicas == ReplicaHiding(RESOURCE, "busy")
        assert await _run_share(cluster, "share", GPU0) == [GPU0]
        await wait_until(lambda: kubelet.allocatable(RESOURCE) == 1 + SPLIT, 10, "GPU 0's replicas hidden")
        await cluster.create_pod(seed_pod("whole", gpumem=None, gpumem_percentage=100))
        await cluster.wait_settled("whole", timeout=15)
        admission = cluster.assignment("whole")
        assert admission is not None and admission.admitted
        assert uuids(cluster.allocated("whole")) == [GPU1]
        assert admission.containers[0].numa_node == 1
        assert admission.containers[0].cpus <= frozenset(range(16, 32))
        (predicted,) = decode_prediction(cluster.annotations("whole")[NUMA_PREDICTED]).containers[0].numa
        assert predicted == 1 and cluster.refit_calls("whole") == []
        assert cluster.booked_usage() == cluster.annotated_usage()


async def test_busy_still_admits_burstable_shares_wherever_they_were_booked(tmp_path: Path) -> None:
    """A second share booked on GPU 0 while its free replicas are hidden (GPU 1 idle) runs there
    (the plugin keeps the replica it needs offered); once GPU 1 holds a share too no GPU is idle,
    every replica is offered again, and a share the scheduler places freely is admitted."""
    async with SimCluster(two_numa_two_gpu_node(tmp_path, "busy", SPLIT)) as cluster:
        kubelet = cluster.nodes[NODE].kubelet
        await wait_until(lambda: numa_profile(cluster) is not None, 10, "NUMA profile on the Node")
        assert await _run_share(cluster, "a", GPU0) == [GPU0]
        await wait_until(lambda: kubelet.allocatable(RESOURCE) == 1 + SPLIT, 10, "GPU 0's replicas hidden")
        assert await _run_share(cluster, "b", GPU0) == [GPU0]
        assert await _run_share(cluster, "c", GPU1) == [GPU1]
        await wait_until(lambda: kubelet.allocatable(RESOURCE) == 2 * SPLIT, 10, "every replica re-offered")
        assert len(await _run_share(cluster, "d", None)) == 1
        assert cluster.booked_usage() == cluster.annotated_usage()
