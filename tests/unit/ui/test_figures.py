"""The view's figures: alignment, stranded GPUs, the typical aligned pod, the node rows' snapshot.

Placements are made by the node agent's own :func:`hamid.plugin.numa_publisher.placement_of` from
what PodResources reports, so the view is judged on what it really reads (with
``enableNumaTopology`` the GPU's own NUMA node is in the placement's ``numa``).
"""

from __future__ import annotations

from typing import Any

import pytest

from hamid.fit.numa_predict import DEFAULT_PROFILE_MAX_AGE_S
from hamid.model import annotations as ann
from hamid.model.kube import Pod, view
from hamid.model.numa import NUMA_PLACEMENT, NUMA_PROFILE, MemoryBlock, encode_placement, encode_profile
from hamid.plugin.numa_publisher import placement_of
from hamid.plugin.podresources_client import HeldContainer, HeldPod
from hamid.scheduler.core import Scheduler
from hamid.scheduler.ui.figures import NodeRow, alignment, node_figures, profile_state, typical_cpus
from hamid.scheduler.ui.snapshot import Snapshots
from hamid.scheduler.ui.source import PodIndex, UiSource
from tests.unit.fit.test_numa_predict import NOW
from tests.unit.scheduler.test_numa_ledger import GPU, PROFILE, _gpu, _node, _placement, _pod, _scheduler

#: CPU → NUMA node of the test PROFILE (CPUs 0-3 on NUMA 0, 4-7 on NUMA 1), as the agent reads sysfs.
NUMA_OF = {c.cpu: c.numa for c in PROFILE.cpus}


def _running(name: str, gpu: str, placement: str | None, node: str = "n1", gpus: int = 1) -> dict[str, Any]:
    pod = _pod(name, cpus=1, gpus=gpus, node=node)
    notes = pod["metadata"]["annotations"]
    notes.update(
        {
            ann.VGPU_NODE: node,
            ann.DEVICES_ALLOCATED: "".join(f"{g},NVIDIA,1000,0:" for g in gpu.split("+")) + ";",
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
        ("default/off", "n1", "container main: GPUs on NUMA 1, its exclusive CPUs on NUMA 0")
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


def _observed(cpus: set[int], gpus: dict[int, tuple[str, ...]], memory: tuple[MemoryBlock, ...] = ()) -> str:
    """The agent's placement of container ``main`` holding ``cpus`` and GPU replicas per NUMA node."""
    held = HeldPod("default", "p", (HeldContainer("main", frozenset(cpus), {GPU: gpus}, memory),))
    return encode_placement(placement_of(held, NUMA_OF, 1))


def _four_gpus(name: str = "n1") -> dict[str, Any]:
    """A node with GPUs g0, g1 on NUMA 0 and g2, g3 on NUMA 1."""
    gpus = [_gpu(f"{name}-g{i}", i, i // 2) for i in range(4)]
    notes = {ann.NODE_REGISTER: ann.encode_node_devices(gpus), NUMA_PROFILE: encode_profile(PROFILE)}
    return {"metadata": {"name": name, "annotations": notes}, "status": {"allocatable": {GPU: "40"}}}


def _row(pod: dict[str, Any], *nodes: dict[str, Any], node: str = "n1") -> tuple[tuple[int, int, int], Any]:
    scheduler, source = _view(pod, nodes=nodes)
    figures = node_figures(source, node, scheduler.ledger.nodes[node])
    return (figures.row.aligned, figures.row.unaligned, figures.row.unknown), figures


def test_a_gpu_off_its_exclusive_cpus_numa_node_is_unaligned_though_the_placement_names_the_gpus() -> None:
    """With ``enableNumaTopology`` the placement's ``numa`` holds the GPU's own NUMA node: the view
    judges by the NUMA nodes of the container's exclusive CPUs, never by that union."""
    placement = _observed({1, 2}, {1: ("n1-g1::0",)})  # CPUs on NUMA 0, the replica of g1 on NUMA 1
    assert '"numa":"0-1"' in placement
    counts, figures = _row(_running("off", "n1-g1", placement))
    assert counts == (0, 1, 0)
    assert figures.unaligned == [
        ("default/off", "n1", "container main: GPUs on NUMA 1, its exclusive CPUs on NUMA 0")
    ]
    assert figures.samples == []  # an unaligned pod is no sample of the typical aligned pod
    counts, figures = _row(_running("on", "n1-g1", _observed({5, 6}, {1: ("n1-g1::0",)})))
    assert counts == (1, 0, 0) and figures.samples == [2]


def test_a_container_without_exclusive_cpus_is_judged_by_its_pinned_memory_else_unknown() -> None:
    """Without exclusive CPUs the container's CPUs are the shared pool: its pinned memory is what
    kubelet tied to a NUMA node; with neither, its GPU cannot be the reference for itself."""
    shared = _observed(set(), {1: ("n1-g1::0",)})
    counts, _ = _row(_running("shared", "n1-g1", shared))
    assert counts == (0, 0, 1)
    scheduler, source = _view(_running("shared", "n1-g1", shared))
    pod = source.pods.get("default/shared")
    assert pod is not None
    res = scheduler.ledger.reservation("uid-shared")
    assert res is not None
    entry = scheduler.ledger.nodes["n1"]
    found = alignment(pod, res.layout, {i.id: i for i in entry.infos}, PROFILE)
    assert "no exclusive CPUs or pinned memory" in found.why
    pinned = (MemoryBlock(frozenset({0}), "memory", 1 << 30),)
    counts, figures = _row(_running("pinned", "n1-g1", _observed(set(), {1: ("n1-g1::0",)}, pinned)))
    assert counts == (0, 1, 0)
    assert figures.unaligned[0][2] == "container main: GPUs on NUMA 1, its pinned memory on NUMA 0"


@pytest.mark.parametrize(
    ("gpus", "cpus", "counts"),
    [
        ("n1-g2+n1-g3", {4, 5}, (1, 0, 0)),  # both GPUs on NUMA 1 with the CPUs
        ("n1-g0+n1-g1", {4, 5}, (0, 1, 0)),  # both GPUs on NUMA 0, the CPUs on NUMA 1
        ("n1-g1+n1-g2", {1, 5}, (1, 0, 0)),  # one GPU per NUMA node, CPUs on both
    ],
)
def test_a_container_with_two_gpus_on_one_numa_node_is_judged_not_unknown(
    gpus: str, cpus: set[int], counts: tuple[int, int, int]
) -> None:
    """Registration is checked per GPU (two GPUs on one NUMA node are both registered)."""
    by_numa: dict[int, tuple[str, ...]] = {}
    for g in gpus.split("+"):
        numa = int(g[-1]) // 2
        by_numa[numa] = (*by_numa.get(numa, ()), f"{g}::0")
    pod = _running("pair", gpus, _observed(cpus, by_numa), gpus=2)
    got, figures = _row(pod, _four_gpus())
    assert got == counts, figures
    assert [u[0] for u in figures.unaligned] == (["default/pair"] if counts[1] else [])


def test_a_gpu_the_node_no_longer_registers_is_unknown_with_the_reason() -> None:
    """A booking outlives its GPU's registration (the node re-registered without it)."""
    scheduler, source = _view(_running("ghost", "n1-g1", _observed({5}, {1: ("n1-g1::0",)})))
    pod, res = source.pods.get("default/ghost"), scheduler.ledger.reservation("uid-ghost")
    assert pod is not None and res is not None
    infos = {i.id: i for i in scheduler.ledger.nodes["n1"].infos if i.id != "n1-g1"}
    found = alignment(pod, res.layout, infos, PROFILE)
    assert (found.state, found.why) == ("unknown", "container main: a GPU is not registered on the node")


def test_the_pod_index_lists_a_pending_pod_on_the_node_the_filter_booked_it_on() -> None:
    index = PodIndex()
    booked = _pod("b", annotations={ann.VGPU_NODE: "n1"})
    index.put(booked)
    assert index.booked_on("n1") == [booked] and index.on("n1") == []
    version = index.version_of("n1")
    assert version != 0  # the node page's stamp changes with the booking
    bound = _pod("b", node="n1", annotations={ann.VGPU_NODE: "n1"})
    index.put(bound)
    assert index.booked_on("n1") == [] and index.on("n1") == [bound]
    assert index.version_of("n1") not in (0, version)
    index.drop(bound)
    assert index.version_of("n1") == 0 and index.by_uid("uid-b") is None
