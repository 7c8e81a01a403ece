"""SchedulerState: incremental, phase-aware accounting; restart rebuild; undo; health; quotas."""

from __future__ import annotations

import copy
import random

from hamid.model import annotations as ann
from hamid.model.devices import ContainerDevice
from hamid.model.labels import parse_node_label_selector
from hamid.scheduler.inventory import HANDSHAKE_GRACE_S
from hamid.scheduler.state import SchedulerState
from tests.unit.scheduler.helpers import container, node, placed, pod


def dev(uuid: str, mem: int, cores: int) -> ContainerDevice:
    return ContainerDevice(uuid, "NVIDIA", mem, cores)


def usage(state: SchedulerState, name: str, uuid: str) -> tuple[int, int, int]:
    return state.ledger.snapshot()[name][uuid]


def test_pod_add_update_delete_incremental() -> None:
    state = SchedulerState()
    state.on_node(node("n1"))
    p = placed(pod("a"), "n1", "n1-gpu0,NVIDIA,1000,10:;")
    state.ledger.on_pod(p)
    assert usage(state, "n1", "n1-gpu0") == (1, 1000, 10)
    state.ledger.on_pod(copy.deepcopy(p))  # unchanged update: no double count
    assert usage(state, "n1", "n1-gpu0") == (1, 1000, 10)
    done = copy.deepcopy(p)
    done["status"]["phase"] = "Succeeded"
    state.ledger.on_pod(done)
    assert usage(state, "n1", "n1-gpu0") == (0, 0, 0)
    state.ledger.on_pod(p)
    state.ledger.on_pod_deleted(p)
    assert usage(state, "n1", "n1-gpu0") == (0, 0, 0)
    assert state.ledger.reservation("uid-a") is None


def test_init_peak_then_release_after_init_succeeded() -> None:
    state = SchedulerState()
    state.on_node(node("n1"))
    p = pod(
        "a",
        init=[container("init", 1, 5000, 50)],
        containers=[container("app1", 1, 1000, 10), container("app2", 1, 2000, 20)],
    )
    placed(p, "n1", "n1-gpu0,NVIDIA,5000,50:;n1-gpu0,NVIDIA,1000,10:;n1-gpu0,NVIDIA,2000,20:;")
    state.ledger.on_pod(p)
    # init 5000/50 alone vs apps 3000/30 together (2 slots): max per field
    assert usage(state, "n1", "n1-gpu0") == (2, 5000, 50)
    assert state.ledger.quotas.used("default") == (5000, 50)
    p["status"]["initContainerStatuses"] = [{"name": "init", "state": {"terminated": {"exitCode": 0}}}]
    state.ledger.on_pod(p)
    assert usage(state, "n1", "n1-gpu0") == (2, 3000, 30)
    assert state.ledger.quotas.used("default") == (3000, 30)


def test_sidecar_adds_to_apps() -> None:
    state = SchedulerState()
    state.on_node(node("n1"))
    side = container("side", 1, 1000, 10, restartPolicy="Always")
    p = pod("a", init=[side], containers=[container("app", 1, 2000, 20)])
    placed(p, "n1", "n1-gpu0,NVIDIA,1000,10:;n1-gpu0,NVIDIA,2000,20:;")
    state.ledger.on_pod(p)
    assert usage(state, "n1", "n1-gpu0") == (2, 3000, 30)


def _population() -> list[dict]:
    pods = []
    for i in range(40):
        gpu = f"n{i % 3}-gpu{i % 2}"
        p = pod(f"p{i}", init=[container("i", 1, 700, 5)] if i % 4 == 0 else None)
        alloc = (f"{gpu},NVIDIA,700,5:;" if i % 4 == 0 else "") + f"{gpu},NVIDIA,{100 + i},{i % 7}:;"
        placed(p, f"n{i % 3}", alloc)
        if i % 5 == 0:
            p["status"]["phase"] = "Running"
        pods.append(p)
    return pods


def test_restart_rebuild_equals_incremental() -> None:
    pods = _population()
    live = SchedulerState()
    for n in range(3):
        live.on_node(node(f"n{n}"))
    for p in pods:  # incremental history with churn
        live.ledger.on_pod(p)
    for p in pods[::7]:
        live.ledger.on_pod_deleted(p)
    survivors = [p for i, p in enumerate(pods) if i % 7 != 0]
    rebuilt = SchedulerState()
    shuffled = list(survivors)
    random.Random(4).shuffle(shuffled)
    for p in shuffled[:10]:  # pods seen before their nodes
        rebuilt.ledger.on_pod(p)
    for n in range(3):
        rebuilt.on_node(node(f"n{n}"))
    for p in shuffled[10:]:
        rebuilt.ledger.on_pod(p)
    assert rebuilt.ledger.snapshot() == live.ledger.snapshot()
    assert rebuilt.ledger.quotas.used("default") == live.ledger.quotas.used("default")
    assert any(u != (0, 0, 0) for n in live.ledger.snapshot().values() for u in n.values())


def test_undecodable_allocation_books_nothing() -> None:
    state = SchedulerState()
    state.on_node(node("n1"))
    p = placed(pod("bad"), "n1", "n1-gpu1,NVIDIA,oops:;")
    state.ledger.on_pod(p)
    assert usage(state, "n1", "n1-gpu1") == (0, 0, 0)
    assert state.ledger.undecodable and state.ledger.undecodable[0][0] is p
    garbage = placed(pod("worse"), "n1", "???")
    state.ledger.on_pod(garbage)
    assert usage(state, "n1", "n1-gpu0") == (0, 0, 0)
    assert len(state.ledger.undecodable) == 2
    state.ledger.on_pod_deleted(garbage)
    state.ledger.on_pod_deleted(p)
    assert state.ledger.snapshot()["n1"] == {"n1-gpu0": (0, 0, 0), "n1-gpu1": (0, 0, 0)}


def test_reserve_undo_restores_previous_and_skips_deleted() -> None:
    state = SchedulerState()
    state.on_node(node("n1"))
    p = pod("a")
    first = state.ledger.reserve(p, "n1", ((dev("n1-gpu0", 1000, 10),),), "n1-gpu0,NVIDIA,1000,10:;")
    undo = state.ledger.reserve(p, "n1", ((dev("n1-gpu1", 1000, 10),),), "n1-gpu1,NVIDIA,1000,10:;")
    assert usage(state, "n1", "n1-gpu0") == (0, 0, 0)
    undo()
    assert usage(state, "n1", "n1-gpu0") == (1, 1000, 10)
    assert usage(state, "n1", "n1-gpu1") == (0, 0, 0)
    undo()  # idempotent
    assert usage(state, "n1", "n1-gpu0") == (1, 1000, 10)
    state.ledger.on_pod_deleted(p)
    first()  # already gone: nothing resurrected
    assert usage(state, "n1", "n1-gpu0") == (0, 0, 0)


def test_pending_reservation_survives_event_without_annotation() -> None:
    state = SchedulerState()
    state.on_node(node("n1"))
    p = pod("a")
    state.ledger.reserve(p, "n1", ((dev("n1-gpu0", 1000, 10),),), "n1-gpu0,NVIDIA,1000,10:;")
    state.ledger.on_pod(p)  # the watch delivers the pod before the filter's patch
    assert usage(state, "n1", "n1-gpu0") == (1, 1000, 10)
    state.ledger.on_pod(placed(copy.deepcopy(p), "n1", "n1-gpu0,NVIDIA,1000,10:;"))
    res = state.ledger.reservation("uid-a")
    assert res is not None and not res.pending
    assert usage(state, "n1", "n1-gpu0") == (1, 1000, 10)


def test_move_and_undo_after_delete_is_noop() -> None:
    state = SchedulerState()
    state.on_node(node("n1"))
    p = placed(pod("a"), "n1", "n1-gpu0,NVIDIA,1000,10:;")
    state.ledger.on_pod(p)
    undo = state.ledger.move("uid-a", ((dev("n1-gpu1", 1000, 10),),), "n1-gpu1,NVIDIA,1000,10:;")
    assert usage(state, "n1", "n1-gpu1") == (1, 1000, 10)
    undo()
    assert usage(state, "n1", "n1-gpu0") == (1, 1000, 10)
    assert usage(state, "n1", "n1-gpu1") == (0, 0, 0)
    undo2 = state.ledger.move("uid-a", ((dev("n1-gpu1", 1000, 10),),), "n1-gpu1,NVIDIA,1000,10:;")
    state.ledger.on_pod_deleted(p)
    undo2()
    assert state.ledger.snapshot()["n1"] == {"n1-gpu0": (0, 0, 0), "n1-gpu1": (0, 0, 0)}
    assert state.ledger.quotas.used("default") == (0, 0)


def test_node_reregistration_keeps_reservations() -> None:
    state = SchedulerState()
    state.on_node(node("n1"))
    state.ledger.on_pod(placed(pod("a"), "n1", "n1-gpu0,NVIDIA,1000,10:;"))
    bare = node("n1")
    del bare["metadata"]["annotations"][ann.NODE_REGISTER]
    state.on_node(bare)
    assert "n1" not in state.ledger.nodes
    state.on_node(node("n1", gpus=3))
    assert usage(state, "n1", "n1-gpu0") == (1, 1000, 10)


def test_handshake_health_heals() -> None:
    now = [1_000_000.0]
    state = SchedulerState(clock=lambda: now[0])
    state.on_node(node("n1", allocatable=0))
    assert "n1" in state.ledger.handshake_wanted  # missing: scheduler writes Requesting_<now>
    assert state.ledger.schedulable("n1") is not None
    from datetime import datetime

    stamp = ann.format_handshake(datetime.fromtimestamp(now[0]))
    state.on_node(node("n1", 2, 0, **{ann.NODE_HANDSHAKE: stamp}))
    assert "n1" not in state.ledger.handshake_wanted
    assert state.ledger.schedulable("n1") is not None
    now[0] += HANDSHAKE_GRACE_S + 1
    assert state.ledger.schedulable("n1") is None  # no GPUs advertised after the grace period
    state.on_node(node("n1", 2, 20, **{ann.NODE_HANDSHAKE: stamp}))
    assert state.ledger.schedulable("n1") is not None  # plugin back: heals without hand edits
    for stale in ("Deleted_2020-01-01 00:00:00", "Requesting_garbage", "Reported 2020"):
        state.on_node(node("n1", 2, 20, **{ann.NODE_HANDSHAKE: stale}))
        assert "n1" in state.ledger.handshake_wanted
        assert state.ledger.schedulable("n1") is not None


def test_quota_headroom_excludes_pod() -> None:
    state = SchedulerState()
    state.on_node(node("n1"))
    state.on_quota(
        {
            "metadata": {"name": "q", "namespace": "default"},
            "spec": {"hard": {"limits.nvidia.com/gpumem": "3000", "limits.nvidia.com/gpucores": "50"}},
        }
    )
    state.ledger.on_pod(placed(pod("a"), "n1", "n1-gpu0,NVIDIA,1000,10:;"))
    quota = state.ledger.fit_quota("default")
    assert quota is not None and (quota.mem_limit, quota.used_mem, quota.used_cores) == (3000, 1000, 10)
    own = state.ledger.fit_quota("default", exclude_uid="uid-a")
    assert own is not None and own.used_mem == 0
    assert state.ledger.fit_quota("other") is None
    state.on_quota_deleted({"metadata": {"name": "q", "namespace": "default"}})
    assert state.ledger.fit_quota("default") is None


def test_hold_books_gpus_and_quota_until_released_once() -> None:
    state = SchedulerState()
    state.on_node(node("n1"))
    state.ledger.on_pod(placed(pod("a"), "n1", "n1-gpu0,NVIDIA,1000,10:;"))
    held = state.ledger.reservation("uid-a").applied
    h = state.ledger.hold("uid-a", "n1", held, "default", 500, 5)
    assert usage(state, "n1", "n1-gpu0") == (2, 2000, 20)
    assert state.ledger.quotas.used("default") == (1500, 15)
    assert state.ledger.node_busy("n1")  # the reconcile leaves a node with a hold alone
    state.on_node(node("n1", 2, 20, **{ann.NODE_SCORE: "{}"}))  # a rebuilt node keeps the hold booked
    assert usage(state, "n1", "n1-gpu0") == (2, 2000, 20)
    state.ledger.release_hold(h)
    state.ledger.release_hold(h)  # a second call changes nothing
    assert usage(state, "n1", "n1-gpu0") == (1, 1000, 10)
    assert state.ledger.quotas.used("default") == (1000, 10)
    assert not state.ledger.node_busy("n1")
    other = state.ledger.hold("uid-b", "n1", {}, "other", 300, 0)
    assert state.ledger.quotas.used("other") == (300, 0)
    state.ledger.release_hold(other)
    assert "other" not in state.ledger.quotas._used  # nothing left behind for an idle namespace


def test_event_settled_hold_waits_for_a_newer_pod_event_or_delete() -> None:
    state = SchedulerState()
    state.on_node(node("n1"))
    p = placed(pod("a"), "n1", "n1-gpu0,NVIDIA,1000,10:;")
    p["metadata"]["resourceVersion"] = "10"
    state.ledger.on_pod(p)
    h = state.ledger.hold("uid-a", "n1", state.ledger.reservation("uid-a").applied, "default", 0, 0)
    state.ledger.settle_on_event(h, "10")
    state.ledger.on_pod(copy.deepcopy(p))  # the same version decides nothing
    assert state.ledger.holds("uid-a") == (h,)
    newer = copy.deepcopy(p)
    newer["metadata"]["resourceVersion"] = "11"
    state.ledger.on_pod(newer)
    assert state.ledger.holds("uid-a") == ()
    assert usage(state, "n1", "n1-gpu0") == (1, 1000, 10)
    h2 = state.ledger.hold("uid-a", "n1", state.ledger.reservation("uid-a").applied, "default", 0, 0)
    state.ledger.settle_on_event(h2, "11")
    assert state.ledger.settle_holds("11", {}) == []  # a list no newer than the precondition decides nothing
    assert state.ledger.settle_holds("12", {"uid-a": newer}) == []  # listed unchanged: the write may land
    changed = copy.deepcopy(newer)
    changed["metadata"]["resourceVersion"] = "12"
    assert state.ledger.settle_holds("12", {"uid-a": changed}) == ["uid-a"]  # decided by its feed:
    assert state.ledger.holds("uid-a") == (h2,)
    state.ledger.on_pod(changed)  # as its event would
    assert state.ledger.holds("uid-a") == ()
    h2 = state.ledger.hold("uid-a", "n1", state.ledger.reservation("uid-a").applied, "default", 0, 0)
    state.ledger.settle_on_event(h2, "12")
    assert state.ledger.settle_holds("13", {}) == []  # not listed in a newer list: gone, released
    assert state.ledger.holds("uid-a") == ()
    h3 = state.ledger.hold("uid-a", "n1", state.ledger.reservation("uid-a").applied, "default", 0, 0)
    state.ledger.on_pod_deleted(newer)
    assert state.ledger.holds("uid-a") == () and h3.applied == {}
    assert usage(state, "n1", "n1-gpu0") == (0, 0, 0)


def test_stale_event_never_replaces_a_pending_filter_reservation() -> None:
    """A re-filtered pod moves gpu0 -> gpu1; an event still carrying gpu0 arrives mid-patch."""
    state = SchedulerState()
    state.on_node(node("n1"))
    p = placed(pod("a"), "n1", "n1-gpu0,NVIDIA,1000,10:;")
    state.ledger.on_pod(p)
    state.ledger.reserve(p, "n1", ((dev("n1-gpu1", 1000, 10),),), "n1-gpu1,NVIDIA,1000,10:;")
    stale = copy.deepcopy(p)
    stale["metadata"]["labels"] = {"touched": "yes"}
    state.ledger.on_pod(stale)
    res = state.ledger.reservation("uid-a")
    assert res is not None and res.pending and res.raw == "n1-gpu1,NVIDIA,1000,10:;"
    assert usage(state, "n1", "n1-gpu0") == (0, 0, 0)
    assert usage(state, "n1", "n1-gpu1") == (1, 1000, 10)
    state.ledger.on_pod({**stale, "metadata": {**stale["metadata"], "annotations": {}}})  # nothing placed yet
    assert state.ledger.reservation("uid-a").pending
    state.ledger.confirm("uid-a", "n1", "n1-gpu1,NVIDIA,1000,10:;")
    assert usage(state, "n1", "n1-gpu1") == (1, 1000, 10)
    assert usage(state, "n1", "n1-gpu0") == (0, 0, 0)


def test_terminal_phase_and_delete_still_release_a_pending_reservation() -> None:
    state = SchedulerState()
    state.on_node(node("n1"))
    p = pod("a")
    state.ledger.reserve(p, "n1", ((dev("n1-gpu1", 1000, 10),),), "n1-gpu1,NVIDIA,1000,10:;")
    done = copy.deepcopy(p)
    done["status"]["phase"] = "Failed"
    state.ledger.on_pod(done)
    assert state.ledger.reservation("uid-a") is None
    state.ledger.reserve(p, "n1", ((dev("n1-gpu1", 1000, 10),),), "n1-gpu1,NVIDIA,1000,10:;")
    state.ledger.on_pod_deleted(p)
    assert state.ledger.reservation("uid-a") is None
    assert usage(state, "n1", "n1-gpu1") == (0, 0, 0)


async def test_deleted_node_drops_its_lock_unless_held() -> None:
    state = SchedulerState()
    state.on_node(node("n1"))
    state.on_node(node("n2"))
    state.ledger.node_guard("n1")
    held = state.ledger.node_guard("n2")
    async with held:
        state.on_node_deleted(node("n1"))
        state.on_node_deleted(node("n2"))
        assert "n1" not in state.coordination._locks
        assert state.ledger.node_guard("n2") is held  # a holder keeps using the same lock


def test_node_label_selector_registers_matching_nodes_and_keeps_bookings() -> None:
    """A node's labels decide its registration on every event; bookings and quota outlive it."""
    state = SchedulerState(node_selector=parse_node_label_selector("gpu=on"))
    inventory = state.inventory
    matching, other = node("n1"), node("n1")
    matching["metadata"]["labels"] = {"gpu": "on"}
    other["metadata"]["labels"] = {"gpu": "off"}
    state.on_node(other)
    assert "n1" not in state.ledger.nodes and inventory.unselected == {"n1"}
    assert state.ledger.handshake_wanted == set()
    state.ledger.on_pod(placed(pod("a"), "n1", "n1-gpu0,NVIDIA,1000,10:;"))  # bound before a restart
    assert state.ledger.quotas.used("default") == (1000, 10)
    state.on_node(matching)
    assert usage(state, "n1", "n1-gpu0") == (1, 1000, 10) and inventory.unselected == set()
    assert state.ledger.handshake_wanted == {"n1"}
    for _ in range(2):  # out and back twice: the booking is applied once, never doubled
        membership = inventory.membership
        state.on_node(other)
        assert "n1" not in state.ledger.nodes and inventory.membership > membership
        assert state.ledger.reservation("uid-a") is not None
        assert state.ledger.quotas.used("default") == (1000, 10)
        state.on_node(copy.deepcopy(other))  # an unchanged update: nothing new
        state.on_node(matching)
        assert usage(state, "n1", "n1-gpu0") == (1, 1000, 10)
    # without a register the selector says nothing: a plain unregistered node
    bare = copy.deepcopy(other)
    del bare["metadata"]["annotations"][ann.NODE_REGISTER]
    state.on_node(other)
    state.on_node(bare)
    assert inventory.unselected == set() and "n1" not in state.ledger.nodes
    state.on_node(other)
    state.on_node_deleted(other)  # a deleted node leaves no verdict behind
    assert inventory.unselected == set()
