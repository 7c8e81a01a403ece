"""``--hide-replicas span``: a pod too big for one NUMA node runs under ``restricted``.

A node with one GPU per NUMA node (16 CPUs each, CPU 0 reserved). ``big`` asks both GPUs whole and
20 exclusive CPUs (Guaranteed): no NUMA node has 20 assignable CPUs, so the CPU manager's only
hint spans both, preferred. kubelet sizes the device manager's hints by *listed replicas*: with
each GPU's 10 replicas listed, 2 fit one NUMA node, so the spanning device hint is not preferred,
the merged hint is not preferred, and ``restricted`` rejects the pod on every node whatever the
scheduler does (the scheduler says so: ``NumaNeverAdmissible``). Under ``span`` the plugin of a node
with nothing booked lists one replica per GPU (the others left out of the list, not reported
Unhealthy, which kubelet would still count): the spanning hint is then the smallest, preferred,
and the pod runs on both GPUs, as the scheduler predicted. Everything is real: scheduler, plugin
(unix-socket gRPC to the simulated kubelet), PodResources, API server.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hamid.model.numa import NUMA_PREDICTED, ReplicaHiding, decode_prediction, decode_profile
from hamidsim.cluster import SimCluster, wait_until
from hamidsim.demo import seed_pod
from tests.e2e.helpers import GPU0, GPU1, NODE, numa_profile, two_numa_two_gpu_node, uuids

SPLIT = 10
RESOURCE = "nvidia.com/gpu"


def _big() -> dict[str, Any]:
    """Both GPUs whole and 20 exclusive CPUs (Guaranteed), NUMA alignment best-effort."""
    pod = seed_pod("big", gpus=2, gpumem=None, gpumem_percentage=100)
    pod["spec"]["containers"][0]["resources"]["limits"]["cpu"] = "20"
    return pod


async def test_span_runs_a_pod_wider_than_a_numa_node_on_both_gpus(tmp_path: Path) -> None:
    async with SimCluster(two_numa_two_gpu_node(tmp_path, "span", SPLIT)) as cluster:
        kubelet = cluster.nodes[NODE].kubelet
        await wait_until(lambda: numa_profile(cluster) is not None, 10, "NUMA profile on the Node")
        assert decode_profile(numa_profile(cluster)).hide_replicas == ReplicaHiding(RESOURCE, "span")
        # nothing booked: one replica listed per GPU (kubelet's capacity counts only those)
        await wait_until(lambda: kubelet.allocatable(RESOURCE) == 2, 10, "one replica listed per GPU")
        await cluster.create_pod(_big())
        await cluster.wait_settled("big", timeout=15)
        admission = cluster.assignment("big")
        assert admission is not None and admission.admitted, admission
        assert sorted(uuids(cluster.allocated("big"))) == [GPU0, GPU1]
        cpus = admission.containers[0].cpus
        assert len(cpus) == 20 and cpus & frozenset(range(16)) and cpus & frozenset(range(16, 32))
        (predicted,) = decode_prediction(cluster.annotations("big")[NUMA_PREDICTED]).containers
        assert sorted(predicted.numa) == [0, 1]
        assert cluster.refit_calls("big") == []
        assert cluster.booked_usage() == cluster.annotated_usage()
        # once something is booked, every free replica is listed again (the busy rule)
        await cluster.delete_pod("big")
        await wait_until(lambda: kubelet.allocatable(RESOURCE) == 2, 10, "one per GPU again when empty")


async def test_span_lists_every_replica_once_a_share_is_booked(tmp_path: Path) -> None:
    """A Burstable share on the empty node runs on the GPU the scheduler booked (the replica it
    needs stays listed); then GPU 0 is partly booked and GPU 1 idle: ``busy``'s rule, GPU 1's
    replicas all listed, GPU 0's free ones Unhealthy."""
    async with SimCluster(two_numa_two_gpu_node(tmp_path, "span", SPLIT)) as cluster:
        kubelet = cluster.nodes[NODE].kubelet
        await wait_until(lambda: kubelet.allocatable(RESOURCE) == 2, 10, "one replica listed per GPU")
        share = seed_pod("share", alignment="", gpumem=10000)
        share["metadata"]["annotations"]["nvidia.com/use-gpuuuid"] = GPU0
        await cluster.create_pod(share)
        await cluster.wait_settled("share", timeout=15)
        admission = cluster.assignment("share")
        assert admission is not None and admission.admitted
        assert uuids(cluster.allocated("share")) == [GPU0]
        await wait_until(lambda: kubelet.allocatable(RESOURCE) == 1 + SPLIT, 10, "GPU 1's replicas listed")
        assert cluster.booked_usage() == cluster.annotated_usage()


async def test_without_span_the_wide_pod_is_never_admissible(tmp_path: Path) -> None:
    """The same pod under ``busy``: every replica listed, kubelet would reject it, the scheduler
    places it nowhere and says why."""
    async with SimCluster(two_numa_two_gpu_node(tmp_path, "busy", SPLIT)) as cluster:
        await wait_until(lambda: numa_profile(cluster) is not None, 10, "NUMA profile on the Node")
        await cluster.create_pod(_big())
        await wait_until(lambda: bool(cluster.scheduling_failures("big")), 15, "a failed attempt")
        assert "NumaNeverAdmissible" in cluster.scheduling_failures("big")[0]
        assert cluster.assignment("big") is None


async def test_span_leaves_a_wide_gpu_pod_with_cpus_of_one_numa_node_pending_on_the_idle_node(
    tmp_path: Path,
) -> None:
    """The price of ``span`` (docs/operating.md): both GPUs but 8 exclusive CPUs, which NUMA 0 can
    assign. On the idle ``span`` node the CPU manager prefers NUMA 0 and the device manager only the
    span, so kubelet would reject it: the scheduler places it nowhere (not ``NumaNeverAdmissible``:
    with every replica listed it would run), where ``busy`` runs it."""
    for hide, runs in (("span", False), ("busy", True)):
        async with SimCluster(two_numa_two_gpu_node(tmp_path, hide, SPLIT)) as cluster:
            await wait_until(lambda: numa_profile(cluster) is not None, 10, "NUMA profile on the Node")
            pod = _big()
            pod["spec"]["containers"][0]["resources"]["limits"]["cpu"] = "8"
            await cluster.create_pod(pod)
            if runs:
                await cluster.wait_settled("big", timeout=15)
                admission = cluster.assignment("big")
                assert admission is not None and admission.admitted
                continue
            await wait_until(lambda: bool(cluster.scheduling_failures("big")), 15, "a failed attempt")
            assert "NumaPredictedNotFit" in cluster.scheduling_failures("big")[0]
            assert cluster.assignment("big") is None
