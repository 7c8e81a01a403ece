"""The view's figures: alignment, stranded GPUs, the typical aligned pod, the node rows' snapshot."""

from __future__ import annotations

from typing import Any

import pytest

from hamid.fit.numa_predict import DEFAULT_PROFILE_MAX_AGE_S
from hamid.model import annotations as ann
from hamid.model.kube import Pod, view
from hamid.model.numa import NUMA_PLACEMENT
from hamid.scheduler.core import Scheduler
from hamid.scheduler.ui.figures import NodeRow, node_figures, profile_state, typical_cpus
from hamid.scheduler.ui.snapshot import Snapshots
from hamid.scheduler.ui.source import PodIndex, UiSource
from tests.unit.fit.test_numa_predict import NOW
from tests.unit.scheduler.test_numa_ledger import _node, _placement, _pod, _scheduler


def _running(name: str, gpu: str, placement: str | None, node: str = "n1") -> dict[str, Any]:
    pod = _pod(name, cpus=1, node=node)
    notes = pod["metadata"]["annotations"]
    notes.update(
        {
            ann.VGPU_NODE: node,
            ann.DEVICES_ALLOCATED: f"{gpu},NVIDIA,1000,0:;",
            ann.BIND_PHASE: ann.BIND_PHASE_SUCCESS,
        }
    )
    if placement is not None:
        notes[NUMA_PLACEMENT] = placement
    pod["status"]["phase"] = "Running"
    pod["metadata"]["resourceVersion"] = "1"
    return pod


class _Feed:
    def __init__(self) -> None:
        self.items: dict[str, dict[str, Any]] = {}

    def get(self, key: str) -> Pod | None:
        return view(Pod, self.items[key]) if key in self.items else None

    def add_handlers(self, on_add: Any = None, on_update: Any = None, on_delete: Any = None) -> None:
        self.on_add = on_add


def _view(*pods: dict[str, Any], nodes: tuple[dict[str, Any], ...] = ()) -> tuple[Scheduler, UiSource]:
    scheduler, _ = _scheduler(_node(), *nodes)
    feed, index = _Feed(), PodIndex()
    index.follow(feed)
    for pod in pods:
        scheduler._pod_seen(pod)
        feed.items[f"default/{pod['metadata']['name']}"] = pod
        feed.on_add(pod)
    source = UiSource(scheduler.ledger, scheduler.numa, feed, index, scheduler.metrics, scheduler.history)
    return scheduler, source


PODS = (
    # GPU on NUMA 1, kubelet placed the CPUs on NUMA 0
    _running("off", "n1-g1", _placement(frozenset({1, 2}), 0)),
    # GPU and CPUs on NUMA 0: aligned, 1 exclusive CPU per GPU
    _running("on", "n1-g0", _placement(frozenset({3}), 0)),
    # no placement observed yet
    _running("new", "n1-g0", None),
)


def test_each_gpu_pod_is_aligned_unaligned_or_unknown_with_the_reason() -> None:
    scheduler, source = _view(*PODS)
    figures = node_figures(source, "n1", scheduler.ledger.nodes["n1"])
    row = figures.row
    assert (row.gpus, row.allocated, row.idle, row.pods) == (2, 2, 0, 3)
    assert (row.aligned, row.unaligned, row.unknown) == (1, 1, 1)
    assert figures.samples == [1]
    assert figures.unaligned == [
        ("default/off", "n1", "container main: GPUs on NUMA 1, kubelet placed it on NUMA 0")
    ]
    assert row.profile == "ok"


def test_idle_gpus_are_stranded_where_free_cpus_cannot_host_the_typical_aligned_pod() -> None:
    row = NodeRow("n", gpus=4, idle=3, idle_by_numa=((0, 2, 3), (1, 1, 4), (2, 5, None)))
    row.strand(4)
    assert row.stranded == 2  # NUMA 0: 3 free CPUs < 4; NUMA 1 has 4; no ledger: not counted
    row.strand(1)
    assert row.stranded == 0


@pytest.mark.parametrize(
    ("samples", "typical"), [([], 1), ([0, 0], 1), ([2, 8, 4], 4), ([3, 4], 4), ([0, 6], 6)]
)
def test_the_typical_aligned_pod_takes_the_median_of_held_cpus_per_gpu(
    samples: list[int], typical: int
) -> None:
    assert typical_cpus(samples) == typical


def test_why_a_node_answers_unknown() -> None:
    scheduler, _ = _view(nodes=(_node("bare", profile=False),))
    assert profile_state(scheduler.numa.nodes["n1"], NOW) == ("ok", "")
    assert profile_state(scheduler.numa.nodes.get("bare"), NOW)[0] == "profile-missing"
    code, why = profile_state(scheduler.numa.nodes["n1"], NOW + DEFAULT_PROFILE_MAX_AGE_S + 1)
    assert code == "profile-stale" and "older than" in why


async def test_the_snapshot_totals_and_reuses_unchanged_nodes() -> None:
    scheduler, source = _view(*PODS, nodes=(_node("n2"),))
    snapshots = Snapshots(source)
    first = await snapshots.built()
    assert [r.name for r in first.rows] == ["n1", "n2"]
    assert first.typical_cpus == 1
    assert first.totals == {
        "gpus": 4, "allocated": 2, "idle": 2, "stranded": 0, "pods": 3,
        "aligned": 1, "unaligned": 1, "unknown": 1, "nodes": 2,
    }  # fmt: skip
    assert first.unaligned[0][0] == "default/off"
    assert [r.name for r in first.ordered("idle", True)] == ["n2", "n1"]
    cached = dict(snapshots._figures)
    await snapshots.refresh()
    assert all(snapshots._figures[n][1] is cached[n][1] for n in cached)  # nothing changed: reused
    assert snapshots._current is not None and snapshots._current.stamp == first.stamp
    gone = PODS[0]
    scheduler._pod_gone(gone)
    source.index.drop(gone)
    await snapshots.refresh()
    assert (
        snapshots._figures["n1"][1] is not cached["n1"][1] and snapshots._figures["n2"][1] is cached["n2"][1]
    )
    assert snapshots._current is not None and snapshots._current.totals["unaligned"] == 0
    assert snapshots._current.stamp != first.stamp


def test_the_pod_index_follows_binding_and_deletion() -> None:
    index = PodIndex()
    pending = _pod("p")
    index.put(pending)
    assert index.on("n1") == [] and index.by_uid("uid-p") is pending
    bound = _pod("p", node="n1")
    version = index.version_of("n1")
    index.put(bound)
    assert index.on("n1") == [bound] and index.version_of("n1") != version
    assert index.by_uid("uid-p") is bound
    done = _pod("p", node="n1")
    done["status"]["phase"] = "Succeeded"
    index.put(done)
    assert index.on("n1") == [] and index.by_uid("uid-p") is None and index.version_of("n1") == 0
