"""``--hide-replicas steer``: kubelet aligns a pod's CPUs with the GPU the scheduler booked.

A node with one GPU per NUMA node (16 CPUs each, CPU 0 reserved), Topology Manager ``restricted``
(``single-numa-node`` and ``best-effort`` where the test says).
``a``, a share pinned to GPU 0, runs: GPU 0 is partly booked, GPU 1 idle, so ``busy`` (and
``steer`` between binds) report GPU 0's free replicas Unhealthy. ``b`` asks 4 exclusive CPUs and
a share, pinned to GPU 0 too (``nvidia.com/use-gpuuuid``: the scheduler's choice is the same under
either rule). Under ``busy`` kubelet's device hint is NUMA 1, the only NUMA node with a healthy
free replica: ``b``'s CPUs go there while Allocate serves GPU 0 (the refit is refused, the pod
is pinned). Under ``steer`` the scheduler's ``/bind`` takes the node lock, the plugin lists
healthy free replicas only on the NUMA node of ``b``'s GPU, acknowledges on the Node once kubelet's
ListAndWatch stream was sent that list, and only then is ``b`` bound: its CPUs are on NUMA 0 with
its GPU. Everything is real: scheduler, plugin (unix-socket gRPC to the simulated kubelet),
PodResources, API server.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

import hamidsim.cluster
from hamid.model.annotations import BIND_PHASE, DEVICES_LISTED_FOR, NODE_LOCK, USE_GPU_UUID, parse_node_lock
from hamid.model.numa import ReplicaHiding, decode_profile
from hamid.plugin.steering import LockSteering
from hamidsim.cluster import SimCluster, wait_until
from hamidsim.demo import seed_pod
from tests.e2e.helpers import GPU0, NODE, numa_profile, two_numa_two_gpu_node, uuids

SPLIT = 10
RESOURCE = "nvidia.com/gpu"


def _on_gpu0(name: str, alignment: str, cpus: int) -> dict[str, Any]:
    """A Guaranteed pod: ``cpus`` exclusive CPUs and 10000 MiB of GPU 0."""
    pod = seed_pod(name, alignment, gpumem=10000, annotations={USE_GPU_UUID: GPU0})
    pod["spec"]["containers"][0]["resources"]["limits"]["cpu"] = str(cpus)
    return pod


def _node_annotations(cluster: SimCluster) -> dict[str, str]:
    stored = cluster.server.get("Node", None, NODE) or {}
    return dict((stored.get("metadata") or {}).get("annotations") or {})


def _steer_waits(cluster: SimCluster, outcome: str) -> float | None:
    return cluster.scheduler.metrics.registry.get_sample_value(
        "hamid_bind_steer_wait_seconds_count", {"outcome": outcome}
    )


@pytest.mark.parametrize(
    ("hide", "policy", "cpu_numa"),
    [
        ("busy", "restricted", 1),
        ("steer", "restricted", 0),
        ("busy", "single-numa-node", 1),
        ("steer", "single-numa-node", 0),
        ("steer", "best-effort", 0),
    ],
)
async def test_steer_puts_the_cpus_on_the_numa_node_of_the_booked_gpu(
    tmp_path: Path, hide: str, policy: str, cpu_numa: int
) -> None:
    """Under every Topology Manager policy whose merged hint follows the devices' hint (under
    ``single-numa-node`` and ``best-effort`` without ``span``'s listing)."""
    async with SimCluster(two_numa_two_gpu_node(tmp_path, hide, SPLIT, policy)) as cluster:
        await wait_until(lambda: numa_profile(cluster) is not None, 10, "NUMA profile on the Node")
        assert decode_profile(numa_profile(cluster)).hide_replicas == ReplicaHiding(RESOURCE, hide)
        await cluster.create_pod(_on_gpu0("a", "", 8))
        await cluster.wait_settled("a", timeout=15)
        await cluster.create_pod(_on_gpu0("b", "best-effort", 4))
        await cluster.wait_settled("b", timeout=15)
        admission = cluster.assignment("b")
        assert admission is not None and admission.admitted, admission
        assert uuids(cluster.allocated("b")) == [GPU0]  # on NUMA 0
        (container,) = admission.containers
        assert container.numa_node == cpu_numa
        assert len(container.cpus) == 4 and all(c // 16 == cpu_numa for c in container.cpus)
        assert cluster.booked_usage() == cluster.annotated_usage()
        if hide == "busy":
            assert [r.outcome for r in cluster.refit_calls("b")] == ["unaligned"]
            assert DEVICES_LISTED_FOR not in _node_annotations(cluster)
            return
        assert cluster.refit_calls("b") == []
        # the plugin acknowledged b's lock (the lock itself is released since b's Allocate)
        listed_for = parse_node_lock(_node_annotations(cluster)[DEVICES_LISTED_FOR])
        assert (listed_for.namespace, listed_for.name) == ("default", "b")
        assert NODE_LOCK not in _node_annotations(cluster)
        assert _steer_waits(cluster, "confirmed") == 2 and _steer_waits(cluster, "unconfirmed") == 0


async def test_a_plugin_that_never_acknowledges_fails_the_bind_and_releases_the_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The injected fault: the plugin steers but never writes its acknowledgement. The bind fails
    after ``--steer-wait`` (0.5 s here) with the lock released and ``bind-phase`` removed; once the
    plugin acknowledges again, kube-scheduler's retry binds the pod and it runs aligned."""
    settings = dataclasses.replace(hamidsim.cluster.SCHEDULER_SETTINGS, steer_wait_s=0.5)
    monkeypatch.setattr(hamidsim.cluster, "SCHEDULER_SETTINGS", settings)
    async with SimCluster(two_numa_two_gpu_node(tmp_path, "steer", SPLIT)) as cluster:
        plugin = cluster.nodes[NODE].plugin
        assert plugin is not None and plugin.steering is not None
        steering: LockSteering = plugin.steering

        async def never(_value: str) -> bool:
            return False

        monkeypatch.setattr(steering, "_ack", never)
        await wait_until(lambda: numa_profile(cluster) is not None, 10, "NUMA profile on the Node")
        await cluster.create_pod(_on_gpu0("b", "best-effort", 4))
        await wait_until(lambda: bool(cluster.scheduling_failures("b")), 15, "a failed bind")
        error = cluster.scheduling_failures("b")[0]
        assert f"node {NODE}" in error and "--steer-wait 0.5s" in error, error
        # every failed attempt released the lock and removed bind-phase (kube-scheduler retries
        # after its backoff, each retry failing the same way while the fault lasts)
        await wait_until(
            lambda: (
                NODE_LOCK not in _node_annotations(cluster) and BIND_PHASE not in cluster.annotations("b")
            ),
            10,
            "the lock released and bind-phase removed",
        )
        assert DEVICES_LISTED_FOR not in _node_annotations(cluster)
        assert not cluster.pod("b")["spec"].get("nodeName")
        assert (_steer_waits(cluster, "unconfirmed") or 0) >= 1
        monkeypatch.undo()  # the plugin acknowledges again
        await cluster.wait_settled("b", timeout=15)
        admission = cluster.assignment("b")
        assert admission is not None and admission.admitted
        assert admission.containers[0].numa_node == 0
        assert _steer_waits(cluster, "confirmed") == 1
