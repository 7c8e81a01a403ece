"""The Allocate door of the NUMA seam (issue 18), end to end on the simulated cluster.

The stage (``hamid demo --scenario exact-fit``): 4 replicas per GPU; pinned GPU pods hold 15 of
NUMA 0's 16 replicas and none of its CPUs. kubelet's Topology Manager prefers NUMA 0 and finds
exactly the one replica the seed pod needs, so it calls Allocate without GetPreferredAllocation,
while the scheduler picked an idle GPU on NUMA 1. Every row of the behaviour table must hold there.
"""

from __future__ import annotations

from typing import Any

import pytest

from hamid.model import annotations as ann
from hamid.model import reasons as R
from hamidsim.cluster import SimCluster, wait_until
from hamidsim.demo import SEED_NAME, exact_fit_options, exact_fit_pod, stage_exact_fit
from tests.e2e.helpers import NODE, env_of, refit_event_message, uuids


async def _run(cluster: SimCluster, alignment: str, *, crowded: bool = False) -> str:
    free = await stage_exact_fit(cluster, crowded=crowded)
    await cluster.create_pod(exact_fit_pod(alignment))
    await cluster.wait_settled(SEED_NAME, timeout=15)
    admission = cluster.assignment(SEED_NAME)
    assert admission is not None and admission.containers
    container = admission.containers[0]
    assert container.preferred_calls == []  # the point of the stage: kubelet did not ask
    plugin = cluster.nodes[NODE].plugin
    assert plugin is not None
    if admission.admitted:
        picked = [plugin.inventory.uuid_of(i) for i in container.devices["nvidia.com/gpu"]]
        assert picked == [free]
    table = cluster.gpu_numa(NODE)
    assert table[free] == 0 and {table[u] for u in uuids(cluster.scheduler_choice(SEED_NAME))} == {1}
    return free


def _lock_free(cluster: SimCluster) -> bool:
    node = cluster.server.get("Node", None, NODE) or {}
    return ann.NODE_LOCK not in ((node.get("metadata") or {}).get("annotations") or {})


def _assert_agreement(cluster: SimCluster, gpus: list[str]) -> None:
    """Runtime GPU == both annotations == the scheduler's accounting == ``gpus``."""
    assert cluster.pod(SEED_NAME)["status"]["phase"] == "Running"
    assert cluster.annotations(SEED_NAME)[ann.BIND_PHASE] == ann.BIND_PHASE_SUCCESS
    assert env_of(cluster, SEED_NAME)["NVIDIA_VISIBLE_DEVICES"].split(",") == gpus
    assert uuids(cluster.allocated(SEED_NAME)) == gpus
    pending = [v for v in cluster.annotation_history(SEED_NAME, ann.DEVICES_TO_ALLOCATE) if v.strip(";")]
    assert uuids(ann.decode_pod_devices(pending[-1])) == gpus
    reservation = cluster.reservation(SEED_NAME)
    assert reservation is not None and uuids(reservation.layout) == gpus
    assert _lock_free(cluster)
    assert cluster.booked_usage() == cluster.annotated_usage()


@pytest.mark.parametrize("alignment", ["best-effort", "strict"])
async def test_refit_at_allocate_aligns_the_pod(alignment: str) -> None:
    async with SimCluster(exact_fit_options()) as cluster:
        free = await _run(cluster, alignment)
        choice = uuids(cluster.scheduler_choice(SEED_NAME))
        calls = cluster.refit_calls(SEED_NAME)
        assert [(c.door, c.outcome, list(c.devices), c.allowed) for c in calls] == [
            ("Allocate", "refitted", [free], (free,))
        ]
        events = cluster.events(SEED_NAME, reason=R.EVENT_NUMA_REFIT_SUCCEED)
        assert [e["message"] for e in events] == [refit_event_message(0, choice, [free])]
        _assert_agreement(cluster, [free])
        admission = cluster.assignment(SEED_NAME)
        assert admission is not None and admission.containers[0].numa_node == 0  # aligned with its CPUs


async def test_refused_refit_best_effort_runs_on_the_accounted_gpu(logs: list[dict[str, Any]]) -> None:
    async with SimCluster(exact_fit_options()) as cluster:
        await _run(cluster, "best-effort", crowded=True)
        choice = uuids(cluster.scheduler_choice(SEED_NAME))
        assert [(c.door, c.outcome) for c in cluster.refit_calls(SEED_NAME)] == [("Allocate", "unaligned")]
        assert cluster.events(SEED_NAME, reason=R.EVENT_NUMA_REFIT_FAILED)
        _assert_agreement(cluster, choice)
        failed = [e for e in logs if e.get("log_level") == "info" and e["event"] == "numa_refit_failed"]
        assert len(failed) == 1 and failed[0]["door"] == "Allocate"


async def test_refused_refit_strict_fails_the_allocation() -> None:
    async with SimCluster(exact_fit_options()) as cluster:
        await _run(cluster, "strict", crowded=True)
        calls = cluster.refit_calls(SEED_NAME)
        assert [(c.door, c.outcome) for c in calls] == [("Allocate", "failed")]
        assert "numa-alignment strict" in calls[0].error
        pod = cluster.pod(SEED_NAME)
        assert pod["status"]["phase"] == "Failed"
        assert "numa-alignment strict" in pod["status"]["message"]
        assert cluster.annotations(SEED_NAME)[ann.BIND_PHASE] == ann.BIND_PHASE_FAILED
        assert _lock_free(cluster)
        await wait_until(lambda: cluster.reservation(SEED_NAME) is None, 5.0, "reservation released")


@pytest.mark.parametrize("alignment", ["best-effort", "strict"])
async def test_refit_disabled_logs_and_runs_on_the_accounted_gpu(
    alignment: str, logs: list[dict[str, Any]]
) -> None:
    async with SimCluster(exact_fit_options(refit=False)) as cluster:
        await _run(cluster, alignment)
        choice = uuids(cluster.scheduler_choice(SEED_NAME))
        assert [(c.door, c.outcome) for c in cluster.refit_calls(SEED_NAME)] == [("Allocate", "unaligned")]
        assert not cluster.events(SEED_NAME, reason=R.EVENT_NUMA_REFIT_SUCCEED)
        _assert_agreement(cluster, choice)
        level = "error" if alignment == "strict" else "info"
        lines = [
            e for e in logs if e.get("log_level") == level and e["event"] == "numa_mismatch_refit_disabled"
        ]
        assert len(lines) == 1 and lines[0]["door"] == "Allocate"
        assert "not among kubelet's allocated replicas" in lines[0]["reason"]


async def test_no_opt_in_runs_on_the_accounted_gpu_without_a_refit() -> None:
    async with SimCluster(exact_fit_options()) as cluster:
        await _run(cluster, "")
        choice = uuids(cluster.scheduler_choice(SEED_NAME))
        assert [(c.door, c.outcome) for c in cluster.refit_calls(SEED_NAME)] == [("Allocate", "unaligned")]
        assert not cluster.events(SEED_NAME, reason=R.EVENT_NUMA_REFIT_SUCCEED)
        assert not cluster.events(SEED_NAME, reason=R.EVENT_NUMA_REFIT_FAILED)
        _assert_agreement(cluster, choice)
