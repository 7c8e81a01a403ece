"""Every row of the seed's NUMA-alignment behaviour, end to end on the simulated cluster.

Each test runs the real scheduler (TLS, authenticated ``/refit``), plugin, simulated kubelet
(single-numa-node, static CPU manager) and kube-scheduler driver against the embedded API server.
The stage: ``cpu-batch`` holds every free CPU of NUMA 1, so kubelet must put the seed pod's CPUs on
NUMA 0 while the scheduler's spread policy picks a GPU on NUMA 1.
"""

from __future__ import annotations

from typing import Any

import pytest

from hamid.model import annotations as ann
from hamid.model import reasons as R
from hamid.model.devices import MigPlacement
from hamid.model.mig import decode_mig_allocations
from hamidsim.cluster import DEMO_MIG_MACHINE, ClusterOptions, NodeSpec, SimCluster, data_file, wait_until
from hamidsim.demo import HETERO_MACHINE, SEED_NAME, data_machine_gpus, heterogeneous_pod, seed_pod
from hamidsim.kubelet import REASON_UNEXPECTED_ADMISSION
from tests.e2e.helpers import NODE, env_of, refit_event_message, stage, uuids

NUMA0 = [g.uuid for g in data_machine_gpus() if g.numa == 0]
NUMA1 = [g.uuid for g in data_machine_gpus() if g.numa == 1]


def _events(cluster: SimCluster, reason: str, name: str = SEED_NAME) -> list[dict[str, Any]]:
    return cluster.events(name, reason=reason)


def _lock_free(cluster: SimCluster, node: str = NODE) -> bool:
    node_obj = cluster.server.get("Node", None, node) or {}
    return ann.NODE_LOCK not in ((node_obj.get("metadata") or {}).get("annotations") or {})


def _reasons(logs: list[dict[str, Any]], level: str, event: str) -> list[str]:
    """The ``reason`` fields of the NUMA policy's ``event`` lines at ``level``."""
    return [str(e.get("reason")) for e in logs if e.get("log_level") == level and e.get("event") == event]


async def _run_seed(cluster: SimCluster, **kw: Any) -> dict[str, Any]:
    await stage(cluster)
    await cluster.create_pod(seed_pod(**kw))
    return await cluster.wait_settled(SEED_NAME, timeout=15)


def _assert_unaligned(
    cluster: SimCluster,
    logs: list[dict[str, Any]],
    name: str = SEED_NAME,
    *,
    mismatches: int = 1,
    level: str = "warning",
) -> list[str]:
    """No refit applied: the pod runs on the scheduler's GPUs (runtime == both annotations == accounting),
    not on kubelet's, NUMA alignment not achieved, and a log line at ``level`` names both GPU sets."""
    pod = cluster.pod(name)
    assert pod["status"]["phase"] == "Running"
    assert cluster.annotations(name)[ann.BIND_PHASE] == ann.BIND_PHASE_SUCCESS
    choice = uuids(cluster.scheduler_choice(name))
    assert [c.outcome for c in cluster.refit_calls(name)] == ["unaligned"] * mismatches
    assert uuids(cluster.allocated(name)) == choice
    pending = [v for v in cluster.annotation_history(name, ann.DEVICES_TO_ALLOCATE) if v.strip(";")]
    assert uuids(ann.decode_pod_devices(pending[-1])) == choice
    reservation = cluster.reservation(name)
    assert reservation is not None and uuids(reservation.layout) == choice
    env = env_of(cluster, name)
    assert env["NVIDIA_VISIBLE_DEVICES"].split(",") == choice
    allocated = cluster.allocated(name)
    assert allocated is not None
    for i, device in enumerate(allocated[0]):
        assert env[f"CUDA_DEVICE_MEMORY_LIMIT_{i}"] == f"{device.usedmem}m"
    admission = cluster.assignment(name)
    assert admission is not None
    container = admission.containers[0]
    plugin = cluster.nodes[NODE].plugin
    assert plugin is not None
    picked = [plugin.inventory.uuid_of(i) for i in container.devices["nvidia.com/gpu"]]
    table = cluster.gpu_numa(NODE)
    assert {table[u] for u in picked if u is not None} == {container.numa_node}  # kubelet's NUMA node
    assert container.numa_node not in {table[u] for u in choice}  # NUMA alignment not achieved
    warnings = [
        e
        for e in logs
        if e.get("log_level") == level and e["event"] == "kubelet_pick_differs_from_annotation"
    ]
    assert len(warnings) == 1 and "other GPUs than the allocation" in warnings[0]["reason"]
    assert "the runtime follows the scheduler's accounting" in warnings[0]["reason"]
    assert warnings[0]["annotated"] == choice and warnings[0]["kubelet"] == picked
    assert _lock_free(cluster)
    assert cluster.booked_usage() == cluster.annotated_usage()
    return choice


def _assert_aligned(cluster: SimCluster, name: str = SEED_NAME, gpus: int = 1) -> list[str]:
    """The pod runs with runtime GPU == both annotations == accounting, on its CPUs' NUMA node."""
    pod = cluster.pod(name)
    assert pod["status"]["phase"] == "Running"
    notes = cluster.annotations(name)
    assert notes[ann.BIND_PHASE] == ann.BIND_PHASE_SUCCESS
    choice = uuids(cluster.scheduler_choice(name))
    new = uuids(cluster.allocated(name))
    assert len(new) == gpus
    calls = [c for c in cluster.refit_calls(name) if c.outcome == "refitted"]
    assert [list(c.devices) for c in calls] == [new]
    events = _events(cluster, R.EVENT_NUMA_REFIT_SUCCEED, name)
    assert [(e["type"], e["message"]) for e in events] == [("Normal", refit_event_message(0, choice, new))]
    env = env_of(cluster, name)
    assert env["NVIDIA_VISIBLE_DEVICES"].split(",") == new
    for i in range(gpus):
        assert env[f"CUDA_DEVICE_MEMORY_LIMIT_{i}"] == "20000m"
    pending = [v for v in cluster.annotation_history(name, ann.DEVICES_TO_ALLOCATE) if v.strip(";")]
    assert uuids(ann.decode_pod_devices(pending[-1])) == new
    assert uuids(cluster.to_allocate(name)) == []
    reservation = cluster.reservation(name)
    assert reservation is not None and uuids(reservation.layout) == new
    admission = cluster.assignment(name)
    assert admission is not None
    numa = admission.containers[0].numa_node
    table = cluster.gpu_numa(NODE)
    assert {table[u] for u in new} == {numa}
    assert {table[u] for u in choice} != {numa}
    assert _lock_free(cluster)
    return new


async def test_best_effort_refit_succeeds_mtls() -> None:
    async with SimCluster(ClusterOptions(numa_publish=False)) as cluster:
        await _run_seed(cluster)
        new = _assert_aligned(cluster)
        assert new[0] in NUMA0
        assert cluster.booked_usage() == cluster.annotated_usage()


async def test_best_effort_refit_succeeds_with_service_account_token() -> None:
    async with SimCluster(ClusterOptions(numa_publish=False, refit_auth="token")) as cluster:
        await _run_seed(cluster)
        _assert_aligned(cluster)


async def test_strict_refit_succeeds() -> None:
    async with SimCluster(ClusterOptions(numa_publish=False)) as cluster:
        await _run_seed(cluster, alignment="strict")
        _assert_aligned(cluster)


async def test_best_effort_refused_runs_on_the_pinned_gpu_and_logs(logs: list[dict[str, Any]]) -> None:
    async with SimCluster(ClusterOptions(numa_publish=False)) as cluster:
        pinned = NUMA1[0]
        await _run_seed(cluster, annotations={ann.USE_GPU_UUID: pinned})
        failed = _events(cluster, R.EVENT_NUMA_REFIT_FAILED)
        assert len(failed) == 1 and failed[0]["type"] == "Warning" and pinned in failed[0]["message"]
        assert not _events(cluster, R.EVENT_NUMA_REFIT_SUCCEED)
        assert _assert_unaligned(cluster, logs) == [pinned]  # the user's pin holds
        assert (
            "NUMA refit failed; best-effort runs on the scheduler's allocation without NUMA alignment"
            in _reasons(logs, "info", "numa_refit_failed")
        )


async def _assert_allocation_failed(cluster: SimCluster, reason_text: str) -> None:
    pod = cluster.pod(SEED_NAME)
    assert pod["status"]["phase"] == "Failed"
    assert pod["status"]["reason"] == REASON_UNEXPECTED_ADMISSION
    assert reason_text in pod["status"]["message"]
    assert cluster.annotations(SEED_NAME)[ann.BIND_PHASE] == ann.BIND_PHASE_FAILED
    assert _lock_free(cluster)
    failed = _events(cluster, R.EVENT_NUMA_REFIT_FAILED)
    assert len(failed) == 1 and reason_text in failed[0]["message"]
    assert [c.outcome for c in cluster.refit_calls(SEED_NAME)] == ["failed"]
    assert uuids(cluster.allocated(SEED_NAME)) == uuids(cluster.scheduler_choice(SEED_NAME))
    await wait_until(lambda: cluster.reservation(SEED_NAME) is None, 5, "reservation released")
    assert cluster.booked_usage() == {}


async def test_strict_refused_fails_the_allocation() -> None:
    async with SimCluster(ClusterOptions(numa_publish=False)) as cluster:
        await _run_seed(cluster, alignment="strict", annotations={ann.NOUSE_GPU_UUID: ",".join(NUMA0)})
        await _assert_allocation_failed(cluster, "CardUuidMismatch")


async def test_strict_pinned_outside_allowed_set_is_refused() -> None:
    async with SimCluster(ClusterOptions(numa_publish=False)) as cluster:
        await _run_seed(cluster, alignment="strict", annotations={ann.USE_GPU_UUID: NUMA1[1]})
        await _assert_allocation_failed(cluster, "use-gpuuuid")


@pytest.mark.parametrize("alignment", ["best-effort", "strict"])
async def test_heterogeneous_amounts_are_refused(alignment: str, logs: list[dict[str, Any]]) -> None:
    node = NodeSpec(NODE, machine_file=data_file(HETERO_MACHINE))
    async with SimCluster(ClusterOptions(numa_publish=False, nodes=(node,))) as cluster:
        await stage(cluster)
        await cluster.create_pod(heterogeneous_pod(alignment))
        await cluster.wait_settled(SEED_NAME, timeout=15)
        choice = cluster.scheduler_choice(SEED_NAME)
        assert choice is not None and len({d.usedmem for d in choice[0]}) == 2
        if alignment == "strict":
            await _assert_allocation_failed(cluster, "heterogeneous")
            return
        # best-effort: refused; kubelet's replicas are on two distinct GPUs of the CPUs' NUMA node, the
        # runtime gets the scheduler's two GPUs with their differing amounts
        failed = _events(cluster, R.EVENT_NUMA_REFIT_FAILED)
        assert len(failed) == 1 and "heterogeneous" in failed[0]["message"]
        admission = cluster.assignment(SEED_NAME)
        assert admission is not None
        (call,) = admission.containers[0].preferred_calls
        plugin = cluster.nodes[NODE].plugin
        assert plugin is not None and len({plugin.inventory.uuid_of(i) for i in call.answer}) == 2
        assert _assert_unaligned(cluster, logs) == uuids(choice)


@pytest.mark.parametrize("alignment", ["best-effort", "strict"])
async def test_refit_disabled_runs_on_the_scheduler_gpu(alignment: str, logs: list[dict[str, Any]]) -> None:
    async with SimCluster(ClusterOptions(numa_publish=False, refit=False)) as cluster:
        await _run_seed(cluster, alignment=alignment)
        choice = _assert_unaligned(cluster, logs)
        assert choice[0] in NUMA1
        assert not _events(cluster, R.EVENT_NUMA_REFIT_SUCCEED) and not _events(
            cluster, R.EVENT_NUMA_REFIT_FAILED
        )
        errors = [
            m
            for m in _reasons(logs, "error", "numa_mismatch_refit_disabled")
            if "NUMA refit is disabled" in m
        ]
        infos = [
            m
            for m in _reasons(logs, "info", "numa_mismatch_refit_disabled")
            if "no replica in kubelet's available devices" in m
        ]
        if alignment == "strict":
            assert len(errors) == 1 and not infos
        else:
            assert not errors and len(infos) == 1


async def test_preferred_allocation_off_runs_on_the_scheduler_gpu(logs: list[dict[str, Any]]) -> None:
    """No GetPreferredAllocation and no opt-in: kubelet picks replicas on the CPUs' NUMA node by itself;
    the Allocate door sees the mismatch, the policy does nothing, the runtime gets the scheduler's GPU."""
    async with SimCluster(ClusterOptions(numa_publish=False, preferred_allocation=False)) as cluster:
        await _run_seed(cluster, alignment="")
        admission = cluster.assignment(SEED_NAME)
        assert admission is not None and admission.containers[0].preferred_calls == []
        assert _assert_unaligned(cluster, logs, level="info")[0] in NUMA1
        assert [c.door for c in cluster.refit_calls(SEED_NAME)] == ["Allocate"]


@pytest.mark.parametrize("alignment", ["best-effort", "strict"])
async def test_preferred_allocation_off_refits_at_the_allocate_door(alignment: str) -> None:
    """No GetPreferredAllocation: an opted-in pod is refitted at Allocate onto kubelet's GPU (issue 18)."""
    async with SimCluster(ClusterOptions(numa_publish=False, preferred_allocation=False)) as cluster:
        await _run_seed(cluster, alignment=alignment)
        admission = cluster.assignment(SEED_NAME)
        assert admission is not None and admission.containers[0].preferred_calls == []
        assert _assert_aligned(cluster)[0] in NUMA0
        assert [c.door for c in cluster.refit_calls(SEED_NAME)] == ["Allocate"]


async def test_mig_node_never_refits() -> None:
    """Dynamic MIG through the whole stack: the scheduler reserves the smallest profile with the
    memory (3g.40gb: the 2g.20gb has 19968 MiB) at the highest placement (3g packs from the top) and
    the plugin, reading a devices file, has no NVML to create it: Allocate refuses, the pod fails,
    and a MIG-mode node is never refitted."""
    node = NodeSpec(NODE, machine_file=data_file(DEMO_MIG_MACHINE), mig=True)
    async with SimCluster(ClusterOptions(numa_publish=False, nodes=(node,))) as cluster:
        await stage(cluster)
        await cluster.create_pod(seed_pod())
        await cluster.wait_settled(SEED_NAME, timeout=15)
        (reserved,) = decode_mig_allocations(cluster.annotations(SEED_NAME)[ann.MIG_ALLOCATIONS])
        assert (reserved.profile, reserved.placement) == ("3g.40gb", MigPlacement(4, 4))
        assert reserved.gpu_uuid in uuids(cluster.allocated(SEED_NAME)) and not reserved.realized
        assert cluster.refit_calls() == []
        assert not _events(cluster, R.EVENT_NUMA_REFIT_SUCCEED) and not _events(
            cluster, R.EVENT_NUMA_REFIT_FAILED
        )
        assert cluster.pod(SEED_NAME)["status"]["phase"] == "Failed"
        assert "no NVML" in cluster.pod(SEED_NAME)["status"]["message"]


async def test_numa_bind_and_alignment_combined() -> None:
    async with SimCluster(ClusterOptions(numa_publish=False)) as cluster:
        await _run_seed(cluster, gpus=2, annotations={ann.NUMA_BIND: "true"})
        choice = uuids(cluster.scheduler_choice(SEED_NAME))
        assert len(choice) == 2 and set(choice) <= set(NUMA1)
        new = _assert_aligned(cluster, gpus=2)
        assert set(new) <= set(NUMA0)


@pytest.mark.parametrize("alignment", ["best-effort", "strict"])
async def test_scheduler_unreachable(alignment: str, logs: list[dict[str, Any]]) -> None:
    async with SimCluster(ClusterOptions(numa_publish=False, scheduler_unreachable=True)) as cluster:
        await _run_seed(cluster, alignment=alignment)
        timeouts = [e for e in logs if "did not answer within 2s" in str(e.get("error", ""))]
        assert len(timeouts) == 1
        assert not _events(cluster, R.EVENT_NUMA_REFIT_SUCCEED)
        pod = cluster.pod(SEED_NAME)
        if alignment == "best-effort":
            assert pod["status"]["phase"] == "Running"
            assert _assert_unaligned(cluster, logs)[0] in NUMA1
        else:
            assert pod["status"]["phase"] == "Failed"
            assert [c.outcome for c in cluster.refit_calls(SEED_NAME)] == ["failed"]
            assert cluster.annotations(SEED_NAME)[ann.BIND_PHASE] == ann.BIND_PHASE_FAILED
            assert _lock_free(cluster)


def _small_pod(name: str) -> dict[str, Any]:
    pod = seed_pod(name=name)
    pod["spec"]["containers"][0]["resources"]["limits"]["cpu"] = "2"
    return pod


async def test_kubelet_restart_plugin_reregisters_and_pods_still_align() -> None:
    async with SimCluster(ClusterOptions(numa_publish=False)) as cluster:
        await _run_seed(cluster)
        _assert_aligned(cluster)
        kubelet = cluster.nodes[NODE].kubelet
        before = kubelet.resources["nvidia.com/gpu"].registrations
        await cluster.restart_kubelet(NODE)
        assert kubelet.restarts == 1
        assert kubelet.resources["nvidia.com/gpu"].registrations == before + 1
        await cluster.create_pod(_small_pod("after-restart"))
        await cluster.wait_settled("after-restart", timeout=15)
        _assert_aligned(cluster, "after-restart")
        assert cluster.booked_usage() == cluster.annotated_usage()


async def test_scheduler_restart_mid_stream_rebuilds_accounting() -> None:
    async with SimCluster(ClusterOptions(numa_publish=False)) as cluster:
        await _run_seed(cluster)
        await cluster.create_pod(_small_pod("second"))
        await cluster.wait_settled("second", timeout=15)
        reservations = {r.uid: r.raw for r in cluster.scheduler.ledger.reservations()}
        await cluster.create_pod(_small_pod("third"))
        await cluster.restart_scheduler()
        await cluster.wait_settled("third", timeout=15)
        for name in (SEED_NAME, "second", "third"):
            _assert_aligned(cluster, name)
        rebuilt = {r.uid: r.raw for r in cluster.scheduler.ledger.reservations()}
        assert {uid: rebuilt.get(uid) for uid in reservations} == reservations
        assert cluster.booked_usage() == cluster.annotated_usage()
        settled = cluster.scheduler.ledger.snapshot()
        await cluster.restart_scheduler()
        assert cluster.scheduler.ledger.snapshot() == settled
        assert cluster.scheduler_restarts == 2
