"""The node agent publishes what NUMA prediction needs, end to end on the simulated cluster.

The plugin reads the sysfs tree the simulator writes from the machine file, the kubelet config the
simulated kubelet runs with and the simulated kubelet's PodResources socket; after admission the
Node carries a profile equal to the machine file and each pod's placement equals the simulated
kubelet's own record (``sim.hamid.io/assignment``).
"""

from __future__ import annotations

from typing import Any

from hamid.model.numa import NUMA_PLACEMENT, NUMA_PREDICTED, NUMA_PROFILE, decode_placement, decode_profile
from hamidsim.cluster import ClusterOptions, NodeSpec, SimCluster, data_file, wait_until
from hamidsim.demo import SEED_NAME, filler_pod, seed_pod
from hamidsim.kubelet import PodAdmission
from hamidsim.machine import Machine, sample_machine_path
from tests.e2e.helpers import NODE


def _profile(cluster: SimCluster, node: str = NODE) -> str | None:
    obj = cluster.server.get("Node", None, node) or {}
    return ((obj.get("metadata") or {}).get("annotations") or {}).get(NUMA_PROFILE)


def _assert_profile_matches(raw: str, machine: Machine, kubelet_reserved: frozenset[int], tm: str) -> None:
    profile = decode_profile(raw)
    assert profile.generation >= 1
    assert list(profile.numa_nodes) == machine.numa_ids
    assert {c.cpu: (c.core, c.socket, c.numa) for c in profile.cpus} == {
        cpu: (i.core, i.socket, i.numa) for cpu, i in machine.cpu_topology.details.items()
    }
    assert profile.reserved_cpus == kubelet_reserved
    ids = machine.numa_ids
    assert profile.distances == tuple(tuple(machine.distance(a, b) for b in ids) for a in ids)
    assert profile.policies.cpu_manager_policy == "static"
    assert profile.policies.topology_manager_policy == tm
    # the simulated nodes' plugins offer GetPreferredAllocation: the profile says so (format 2)
    assert profile.preferred_allocation == "nvidia.com/gpu"


def _assert_placement_is_kubelets(cluster: SimCluster, name: str, admission: PodAdmission) -> None:
    placement = decode_placement(cluster.annotations(name)[NUMA_PLACEMENT])
    profile = decode_profile(_profile(cluster))
    assert placement.generation == profile.generation
    observed = {c.name: c for c in placement.containers}
    for c in admission.containers:
        if c.init:
            continue
        got = observed[c.name]
        assert got.cpus == c.cpus
        held = {d for per in got.devices.values() for ids in per.values() for d in ids}
        assert held == {d for ids in c.devices.values() for d in ids}
        numa = set(c.cpu_numa_nodes) | {n for ns in c.device_numa_nodes.values() for n in ns}
        assert got.numa == numa
        if c.numa_node is not None:
            assert got.numa == {c.numa_node}


async def _placed(cluster: SimCluster, name: str) -> dict[str, Any]:
    return await cluster.wait_pod(name, lambda p: NUMA_PLACEMENT in p["metadata"].get("annotations", {}))


async def test_profile_and_placements_match_the_simulated_kubelet() -> None:
    async with SimCluster() as cluster:
        await wait_until(lambda: _profile(cluster) is not None, 10, "NUMA profile on the Node")
        sim = cluster.nodes[NODE].kubelet
        machine = cluster.machine(NODE)
        reserved = machine.all_cpus - sim.cpus.allocatable()
        _assert_profile_matches(_profile(cluster) or "", machine, reserved, "single-numa-node")
        first = decode_profile(_profile(cluster))

        await cluster.create_pod(filler_pod(NODE))  # foreign: exclusive CPUs, no GPU
        await cluster.wait_settled("cpu-batch")
        await cluster.create_pod(seed_pod())
        await cluster.wait_settled(SEED_NAME, timeout=15)
        for name in ("cpu-batch", SEED_NAME):
            await _placed(cluster, name)
            admission = cluster.assignment(name)
            assert admission is not None and admission.admitted
            _assert_placement_is_kubelets(cluster, name, admission)
        # one GPU pod judged (the CPU-only foreign pod is not): unknown without a prediction
        registry = cluster.nodes[NODE].plugin.metrics.registry
        counts = {
            r: registry.get_sample_value("hamid_numa_prediction_total", {"result": r})
            for r in ("hit", "miss", "unknown")
        }
        assert sum(counts.values()) == 1
        if NUMA_PREDICTED not in cluster.annotations(SEED_NAME):
            assert counts["unknown"] == 1
        # nothing changed on the node: the profile was not rewritten
        assert decode_profile(_profile(cluster)).generation == first.generation
        assert cluster.nodes[NODE].plugin.numa.profile_patches == 1


async def test_smt_machine_profile_from_its_sysfs_tree() -> None:
    spec = NodeSpec(
        "smt-1", machine_file=sample_machine_path("smt-2socket-8gpu"), topology_policy="restricted"
    )
    async with SimCluster(ClusterOptions(nodes=(spec,))) as cluster:
        await wait_until(lambda: _profile(cluster, "smt-1") is not None, 10, "NUMA profile on the Node")
        sim = cluster.nodes["smt-1"].kubelet
        machine = cluster.machine("smt-1")
        assert any(len(t) > 1 for t in machine.cpu_topology.core_cpus.values())
        reserved = machine.all_cpus - sim.cpus.allocatable()
        _assert_profile_matches(_profile(cluster, "smt-1") or "", machine, reserved, "restricted")


async def test_without_the_publisher_nothing_is_written() -> None:
    spec = NodeSpec(NODE, machine_file=data_file("demo-2numa-8gpu.yaml"))
    async with SimCluster(ClusterOptions(nodes=(spec,), numa_publish=False)) as cluster:
        await cluster.create_pod(seed_pod())
        await cluster.wait_settled(SEED_NAME, timeout=15)
        assert _profile(cluster) is None
        assert NUMA_PLACEMENT not in cluster.annotations(SEED_NAME)


async def test_an_init_containers_cpus_stay_booked_beside_the_placement() -> None:
    """kubelet's PodResources lists the app container only, yet kubelet keeps the init container's
    CPUs the app did not reuse until the pod ends: the placement shows the app's CPUs, and the
    scheduler's NUMA ledger, kept from the events of the whole stack, frees exactly what kubelet
    frees (outside audit s24, F1; before, the simulated kubelet listed the init container too)."""
    async with SimCluster() as cluster:
        await wait_until(lambda: _profile(cluster) is not None, 10, "NUMA profile on the Node")
        pod = filler_pod(NODE, cpus=2, name="init-batch")
        limits = {"cpu": "6", "memory": "1Gi"}
        pod["spec"]["initContainers"] = [
            {"name": "prepare", "image": "busybox", "resources": {"limits": limits}}
        ]
        await cluster.create_pod(pod)
        await cluster.wait_settled("init-batch")
        await _placed(cluster, "init-batch")
        admission = cluster.assignment("init-batch")
        assert admission is not None and admission.admitted
        prepare, batch = admission.containers
        assert len(prepare.cpus) == 6 and batch.cpus < prepare.cpus
        placement = decode_placement(cluster.annotations("init-batch")[NUMA_PLACEMENT])
        assert [c.name for c in placement.containers] == ["batch"]
        kubelet = cluster.nodes[NODE].kubelet
        assert not prepare.cpus & kubelet.cpus.available()  # kubelet holds all six
        await wait_until(
            lambda: cluster.scheduler.numa.free_cpus(NODE) == kubelet.cpus.available(),
            10,
            "the scheduler's NUMA ledger to free what kubelet frees",
        )
