"""The ``fgd`` ranker's memos across changes of the learned workload: the same answers as a cold
computation, kept per ranker (two schedulers, or two replays in one process, share nothing)."""

from __future__ import annotations

import math
import random
from dataclasses import replace
from typing import Any

import pytest
import structlog.testing
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from hamid.fit.fgd import Gpu, NodeState, NumaRoom, Shape, best_placement, fragmentation, gain_steps
from hamid.model import annotations as ann
from hamid.model import reasons as R
from hamid.model.resources import ResourceConfig
from hamid.scheduler import fgd_rank
from hamid.scheduler import inventory as inventory_module
from hamid.scheduler.core import Scheduler
from hamid.scheduler.fgd_rank import FgdRanker, tie_order
from hamid.scheduler.inventory import NodeInventory
from hamid.scheduler.node_cpu_mem import NodeCpuMem
from hamid.scheduler.numa_ledger import NumaLedgers
from tests.unit.scheduler.helpers import container, gpu, placed, pod
from tests.unit.scheduler.helpers import node as helpers_node

HALF = Shape(1000, 1024, 1, 500)
ALIGNED = Shape(4000, 8192, 1, 1000, None, 4)
TWO = Shape(8000, 16384, 2, 1000)
CPU_ONLY = Shape(2000, 1024, 0, 0)


def ranker() -> FgdRanker:
    """A ranker in use (it ranked once: the workload is refreshed as pods come)."""
    config = ResourceConfig()
    numa = NumaLedgers("hami-scheduler", config.resource_count_name, lambda: 0.0, booked_on=lambda _uid: None)
    fgd = FgdRanker(config, NodeInventory(config), numa, NodeCpuMem())
    fgd.ranking(CPU_ONLY, {})
    return fgd


def states() -> list[NodeState]:
    """Nodes part used, with and without NUMA knowledge, one short of CPU for the aligned shape."""
    rooms = (NumaRoom(6, 32), NumaRoom(30, 32))
    out = []
    for frees, cpu, numa in (
        ((1000, 500, 0, 1000), 64_000, rooms),
        ((300, 1000, 1000, 700), 3000, rooms),
        ((1000, 1000, 1000, 1000), 64_000, None),
        ((200, 500, 800, 0), 16_000, (NumaRoom(0, 32), NumaRoom(2, 32))),
    ):
        gpus = (Gpu(f, i // 2, "A100") for i, f in enumerate(frees))
        out.append(NodeState.of(cpu, 256_000, gpus, numa))
    return out


def learn(fgd: FgdRanker, *shapes: Shape) -> None:
    for shape in shapes:
        fgd.learn(shape)


def cold(fgd: FgdRanker, state: NodeState, shape: Shape) -> tuple[float, object]:
    """Fragmentation and best placement computed afresh under the ranker's current workload."""
    workload = fgd.workload
    placed = best_placement(state, shape, lambda s: fragmentation(s, workload))
    return fragmentation(state, workload), placed


def test_memos_across_workload_changes_equal_a_cold_computation() -> None:
    fgd = ranker()
    learn(fgd, HALF, HALF, ALIGNED)
    epochs = set()
    for more in ((HALF,) * 3, (ALIGNED,) * 4, (TWO, CPU_ONLY), (HALF,) * 20, (TWO,) * 30):
        epochs.add(fgd.epoch)
        for i, state in enumerate(states()):
            for shape in (HALF, ALIGNED, TWO, CPU_ONLY):
                memo = (fgd.fragmentation(state), fgd.placement(f"node-{i}", state, shape))
                assert memo == cold(fgd, state, shape)  # exactly: the same float operations
        learn(fgd, *more)
    assert len(epochs) >= 4  # weight-only changes and changes of the shapes both happened


def test_a_weight_only_change_recomputes_only_the_weighted_sum() -> None:
    fgd = ranker()
    learn(fgd, HALF, ALIGNED)
    state = states()[0]
    before = fgd.fragmentation(state)
    uses = dict(fgd._uses[state.gpu_side()])
    learn(fgd, HALF, HALF, HALF, HALF)  # same shapes, other weights
    assert set(dict(fgd.workload.shapes)) == {HALF, ALIGNED}
    assert fgd.fragmentation(state) != before
    assert fgd._uses[state.gpu_side()] == uses  # the GPU parts' usable room was kept, not recomputed
    assert fgd.fragmentation(state) == fragmentation(state, fgd.workload)


def test_states_differing_only_in_cpu_and_memory_share_the_usable_room() -> None:
    """The same GPUs after pods of other CPU asks: one usable-room memo, each its own fragmentation."""
    fgd = ranker()
    learn(fgd, HALF, ALIGNED, TWO)
    state = states()[0]
    short = state._replace(cpu=3000, memory=4096)  # short of CPU for ALIGNED and TWO
    fgd.fragmentation(state)
    fgd.fragmentation(short)
    assert len(fgd._uses) == 1
    assert fgd.fragmentation(short) == fragmentation(short, fgd.workload) > fgd.fragmentation(state)


def test_states_no_typical_shape_tells_apart_share_one_fragmentation() -> None:
    """Fragmentation is memoised by the GPU side and the CPU/memory levels while the free CPU backs
    every typical share's pods (a node with a CPU or a MiB more or less is not computed again);
    below that CPU, by the free CPU itself (a share's room counts as far as the CPU backs it)."""
    fgd = ranker()
    learn(fgd, HALF, ALIGNED, TWO)
    state = states()[0]._replace(cpu=1_000_000)
    fgd.fragmentation(state)
    fgd.fragmentation(state._replace(cpu=state.cpu - 1, memory=state.memory - 1))
    assert len(fgd._frag) == 1
    short = state._replace(cpu=min(s.cpu for s, _ in fgd.workload.shapes) - 1)
    assert fgd.fragmentation(short) == fragmentation(short, fgd.workload) > fgd.fragmentation(state)
    assert len(fgd._frag) == 2
    backing = fgd._backing[state.gpu_side()]
    assert backing > 0  # HALF's pods need CPU to use the room
    below = state._replace(cpu=backing - 1)
    lower = below._replace(cpu=backing - 2)
    assert fgd.fragmentation(below) == fragmentation(below, fgd.workload) > fgd.fragmentation(state)
    assert fgd.fragmentation(lower) == fragmentation(lower, fgd.workload) > fgd.fragmentation(below)
    assert len(fgd._frag) == 4


def test_memos_belong_to_one_ranker() -> None:
    """Two rankers (two schedulers or two replays in one process) learning different workloads
    answer each from its own memos."""
    first, second = ranker(), ranker()
    learn(first, HALF, HALF, HALF)
    learn(second, ALIGNED, TWO)
    for state in states():
        assert first.fragmentation(state) == fragmentation(state, first.workload)
        assert second.fragmentation(state) == fragmentation(state, second.workload)
    assert first._uses is not second._uses


def test_gain_indexes_are_kept_for_the_recently_filtered_shapes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the bound the least recently used shape's index goes, not every index at once."""
    monkeypatch.setattr(fgd_rank, "_INDEX_ENTRIES", 0)  # the bound is then _INDEXES_MIN indexes
    fgd = ranker()
    shapes = [Shape(1000 + i, 1024, 1, 500) for i in range(fgd_rank._INDEXES_MIN)]
    first = {shape: fgd.index(shape) for shape in shapes}
    assert fgd.index(shapes[0]) is first[shapes[0]]  # used again: now the most recent
    fgd.index(Shape(9000, 1024, 1, 500))  # one too many: shapes[1] was used least recently
    assert fgd.index(shapes[0]) is first[shapes[0]]
    assert all(fgd.index(s) is first[s] for s in shapes[2:])
    assert fgd.index(shapes[1]) is not first[shapes[1]]  # ranked afresh
    assert len(fgd._indexes) == fgd_rank._INDEXES_MIN


def test_a_workload_moved_by_noise_keeps_the_ranking_a_real_move_replaces_it() -> None:
    """Refreshed workloads within 5 % of the current one in total variation are noise: the memos
    and gain indexes stay; a new shape taking a quarter of the pods is a real change."""
    fgd = ranker()
    learn(fgd, *(HALF, ALIGNED) * 50)
    epoch, kept = fgd.epoch, fgd.index(HALF)
    learn(fgd, *(HALF,) * 10, ALIGNED, ALIGNED)  # HALF from 50 % to 60 of 112 pods: 3.6 points
    assert abs(dict(fgd.histogram.typical().shapes)[HALF] - 60 / 112) < 0.001
    assert fgd.epoch == epoch and fgd.index(HALF) is kept
    learn(fgd, *(TWO,) * 40)
    assert fgd.epoch > epoch and fgd.index(HALF) is not kept  # changed as TWO's share grew
    assert dict(fgd.workload.shapes).keys() == {HALF, ALIGNED, TWO}


def _gpu_node(rng: random.Random, name: str) -> dict[str, Any]:
    """A node of 1-4 GPUs of one of two models, with allocatable CPU and memory."""
    model = rng.choice(("NVIDIA-A100", "NVIDIA-H100"))
    gpus = [
        replace(gpu(f"{name}-g{i}", index=i, numa=i % 2), type=model) for i in range(rng.choice((1, 2, 4)))
    ]
    body = helpers_node(name, gpus=0)
    body["metadata"]["annotations"][ann.NODE_REGISTER] = ann.encode_node_devices(gpus)
    body["status"]["allocatable"].update(cpu=str(rng.choice((8, 16, 32))), memory="64Gi", pods="110")
    return body


def _bound(rng: random.Random, i: int, name: str, gpu_id: str) -> dict[str, Any]:
    """A pod running on ``name`` with CPU and a share of ``gpu_id``."""
    mem = rng.choice((2000, 4000))
    c = container("c", 1, mem, 30)
    c["resources"]["requests"] = {"cpu": str(rng.choice((1, 2, 6)))}
    p = placed(pod(f"p{i}", containers=[c]), name, f"{gpu_id},NVIDIA,{mem},30:;")
    p["spec"]["nodeName"] = name
    p["status"]["phase"] = "Running"
    return p


@pytest.mark.parametrize("bulk", [0, 8, 10**9])
def test_a_gain_index_holds_each_nodes_own_rank_after_any_changes(
    monkeypatch: pytest.MonkeyPatch, bulk: int
) -> None:
    """Re-keyed node by node (``bulk`` 0), in bulk by state (10**9) or either as the changes come
    (8, the product's), an index gives every registered node exactly the rank, gain or shortage of
    its own state computed alone, after pods come and go and nodes register again or leave."""
    monkeypatch.setattr(fgd_rank, "_BULK", bulk)
    rng = random.Random(bulk)
    scheduler = Scheduler(None)
    fgd = scheduler.fgd
    names = [f"n{i}" for i in range(24)]
    for name in names:
        scheduler._node_seen(_gpu_node(rng, name))
    learn(fgd, HALF, HALF, TWO, CPU_ONLY, Shape(6000, 1024, 1, 1000))
    running: list[dict[str, Any]] = []
    shorts = 0
    for step in range(60):
        roll = rng.random()
        live = sorted(scheduler.ledger.nodes)
        if roll < 0.6 and live:
            name = rng.choice(live)
            running.append(_bound(rng, step, name, rng.choice(scheduler.ledger.nodes[name].infos).id))
            scheduler._pod_seen(running[-1])
        elif roll < 0.75 and running:
            scheduler._pod_gone(running.pop(rng.randrange(len(running))))
        elif roll < 0.8 and live:  # every node changes and one leaves: a whole index re-keyed
            for name in live[1:]:
                scheduler._node_seen(_gpu_node(rng, name))
            scheduler._node_gone(helpers_node(live[0]))
        elif roll < 0.9:
            scheduler._node_seen(_gpu_node(rng, rng.choice(names)))
        elif live:
            scheduler._node_gone(helpers_node(rng.choice(live)))
        for shape in (HALF, TWO, CPU_ONLY):
            fgd.sync()
            index = fgd.index(shape)
            index.refresh(fgd, shape, scheduler.ledger.nodes)
            want_keys, want_short = [], {}
            for name, entry in scheduler.ledger.nodes.items():
                state = fgd.node_state(name, entry)
                if shape.cpu > state.cpu or shape.memory > state.memory:
                    want_short[name] = R.INSUFFICIENT_CPU if shape.cpu > state.cpu else R.INSUFFICIENT_MEMORY
                    continue
                placed_there = best_placement(state, shape, lambda s: fragmentation(s, fgd.workload))
                gain = -math.inf if placed_there is None else placed_there.gain
                want_keys.append((gain_steps(gain) + tie_order(name), name))
            assert index.keys == sorted(want_keys) and index.short == want_short
            shorts += len(want_short)
    assert shorts and len(scheduler.ledger.nodes) < len(names)  # some nodes short, some gone


def _scraped(scheduler: Scheduler) -> dict[str, float]:
    """The fgd samples of the scheduler's ``/metrics`` (the exposition text parsed back)."""
    text = generate_latest(scheduler.metrics.registry).decode()
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("hamid_fgd_")
    }


def test_metrics_show_fgds_view_without_moving_the_learned_workload() -> None:
    """Pods are counted always, the workload learned once fgd ranks and then as the pods come; the
    cluster's fragmentation appears then, equals every node's own summed, and a scrape moves
    nothing. A cluster that never ranks with fgd learns (and logs) no workload."""
    rng = random.Random(3)
    scheduler = Scheduler(None)
    fgd = scheduler.fgd
    for i in range(6):
        scheduler._node_seen(_gpu_node(rng, f"n{i}"))
    with structlog.testing.capture_logs() as logs:
        for step in range(4):
            name = f"n{step}"
            scheduler._pod_seen(_bound(rng, step, name, scheduler.ledger.nodes[name].infos[0].id))
    assert not [e for e in logs if e["event"] == "fgd_workload_changed"] and fgd.epoch == 0
    scraped = _scraped(scheduler)
    assert "hamid_fgd_fragmentation_milli_gpu" not in scraped  # fgd has ranked nothing yet
    assert scraped["hamid_fgd_pods_learned_total"] == 4 and scraped["hamid_fgd_typical_shapes"] == 0

    with structlog.testing.capture_logs() as logs:
        fgd.ranking(HALF, scheduler.ledger.nodes)  # learned over the 4 pods, at once
        scheduler._pod_seen(_bound(rng, 4, "n4", scheduler.ledger.nodes["n4"].infos[0].id))
    changes = [(e["epoch"], e["pods_learned"]) for e in logs if e["event"] == "fgd_workload_changed"]
    assert changes[0] == (1, 4) and changes[-1][0] == fgd.epoch  # then as the pods come
    assert all(e["top"][0].endswith("%") for e in logs)  # the most frequent shape named first
    epoch, workload = fgd.epoch, fgd.workload
    fgd.sync()
    states = {name: fgd.node_state(name, entry) for name, entry in scheduler.ledger.nodes.items()}
    scraped = _scraped(scheduler)
    assert (fgd.epoch, fgd.workload) == (epoch, workload)  # the scrapes moved nothing
    assert scraped["hamid_fgd_typical_shapes"] == len(workload.shapes) > 0
    assert scraped["hamid_fgd_workload_changes_total"] == epoch
    assert scraped["hamid_fgd_fragmentation_milli_gpu"] == pytest.approx(
        sum(fragmentation(state, workload) for state in states.values())
    )
    assert scraped["hamid_fgd_fragmentation_milli_gpu"] > 0
    assert scraped["hamid_fgd_idle_milli_gpu"] == sum(sum(state.frees) for state in states.values())
    assert scraped["hamid_fgd_node_states"] == len(set(states.values()))
    assert scraped["hamid_fgd_reranks_total"] >= 1 and scraped["hamid_fgd_rerank_seconds_total"] > 0


def test_a_shape_reads_as_an_operator_writes_it() -> None:
    assert fgd_rank.shape_text(Shape(2500, 8192, 1, 470)) == "2.5 CPU, 8192 MiB, 1 GPU x 47%"
    assert fgd_rank.shape_text(ALIGNED._replace(models=("A100",))) == (
        "4 CPU, 8192 MiB, 1 GPU (A100), 4 exclusive CPUs"
    )
    assert fgd_rank.shape_text(CPU_ONLY) == "2 CPU, 1024 MiB"


def test_nothing_piles_up_for_nodes_while_fgd_has_ranked_nothing() -> None:
    """A cluster that never uses fgd keeps no mark of changed or deleted nodes (nodes replaced
    under new names, autoscaled, made a set grow for good); once fgd ranks, changes are marked."""
    rng = random.Random(7)
    scheduler = Scheduler(None)
    fgd = scheduler.fgd
    for i in range(50):
        scheduler._node_seen(_gpu_node(rng, f"gone-{i}"))
        scheduler._pod_seen(_bound(rng, i, f"gone-{i}", scheduler.ledger.nodes[f"gone-{i}"].infos[0].id))
        scheduler._node_gone(helpers_node(f"gone-{i}"))
    assert not fgd._dirty and not fgd.ranked
    scheduler._node_seen(_gpu_node(rng, "kept"))
    fgd.ranking(HALF, scheduler.ledger.nodes)
    scheduler._node_seen(_gpu_node(rng, "kept"))
    scheduler._node_gone(helpers_node("kept"))
    assert fgd._dirty == {"kept"}


def test_the_change_log_of_nodes_stays_about_the_live_set(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nodes replaced under new names do not grow the inventory's change log for good: past the
    live nodes and a slack its oldest entries go, and a reader from before them re-reads all."""
    monkeypatch.setattr(inventory_module, "_CHANGE_LOG_SLACK", 4)
    rng = random.Random(11)
    scheduler = Scheduler(None)
    inventory = scheduler.ledger.inventory
    start = inventory.seq
    for i in range(40):
        scheduler._node_seen(_gpu_node(rng, f"spot-{i}"))
        scheduler._node_gone(helpers_node(f"spot-{i}"))
    scheduler._node_seen(_gpu_node(rng, "live"))
    assert len(inventory._changed) <= 2 * len(inventory.nodes) + 4
    assert inventory.changed_since(start, 10_000) is None  # the log no longer reaches back there
    recent = inventory.seq
    scheduler._node_seen(_gpu_node(rng, "live"))
    assert inventory.changed_since(recent, 10) == ["live"]
