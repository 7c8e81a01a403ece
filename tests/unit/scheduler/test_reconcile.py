"""reconcile_state: drift found and repaired to a fresh list; in-flight reservations left alone."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from click.testing import CliRunner

from hamid.fit.usage import DeviceAmount
from hamid.model import annotations as ann
from hamid.model.devices import ContainerDevice
from hamid.model.objects import newer_than
from hamid.scheduler.ledger import UNDECIDED_HOLD_S
from hamid.scheduler.options import parse_interval
from hamid.scheduler.reconcile import (
    DRIFT_CHANGED,
    DRIFT_GPU,
    DRIFT_LEAKED,
    DRIFT_MISSING,
    reconcile_state,
)
from hamid.scheduler.signing import AllocationKeys
from hamid.scheduler.state import SchedulerState
from tests.unit.scheduler.helpers import (
    container,
    node,
    placed,
    pod,
    refit_in_flight,
    signed,
    ticking_keys,
    undecided_refit,
)

GPU0 = "n1-gpu0,NVIDIA,1000,10:;"
GPU1 = "n1-gpu1,NVIDIA,1000,10:;"


def versioned(p: dict[str, Any], version: int) -> dict[str, Any]:
    p["metadata"]["resourceVersion"] = str(version)
    return p


def on(name: str, raw: str, version: int, node_name: str = "n1") -> dict[str, Any]:
    """Pod ``name`` placed on ``node_name`` with allocation ``raw`` at ``version``."""
    return versioned(placed(pod(name), node_name, raw), version)


def fresh_state(*pods: dict[str, Any], keys: AllocationKeys | None = None) -> SchedulerState:
    state = SchedulerState(keys=keys)
    state.on_node(node("n1"))
    state.on_node(node("n2"))
    for p in pods:
        state.ledger.on_pod(p)
    return state


def test_no_drift_changes_nothing() -> None:
    a, b = on("a", GPU0, 5), on("b", "n2-gpu1,NVIDIA,3000,30:;", 6, "n2")
    state = fresh_state(a, b)
    before, held = state.ledger.snapshot(), state.ledger.reservation("uid-a")
    report = reconcile_state(
        state.ledger, [copy.deepcopy(a), copy.deepcopy(b), pod("cpu-only")], "9", state.ledger.seq
    )
    assert report.drifts == []
    assert (report.pods, report.reservations, report.skipped, report.gpus) == (3, 2, 0, 4)
    assert state.ledger.snapshot() == before
    assert state.ledger.reservation("uid-a") is held  # not even re-created


def test_dropped_delete_is_released() -> None:
    a = on("a", GPU0, 5)
    state = fresh_state(a, on("b", GPU1, 6))
    report = reconcile_state(state.ledger, [on("b", GPU1, 6)], "10", state.ledger.seq)
    [drift] = report.drifts
    assert (drift.kind, drift.pod, drift.uid, drift.node) == (DRIFT_LEAKED, "default/a", "uid-a", "n1")
    assert drift.listed == "pod not listed"
    assert drift.difference == {"n1-gpu0": (1, 1000, 10)}
    assert state.ledger.reservation("uid-a") is None
    assert state.ledger.was_deleted("uid-a")
    assert state.ledger.snapshot()["n1"]["n1-gpu0"] == (0, 0, 0)
    assert state.ledger.quotas.used("default") == (1000, 10)  # only b


def test_changed_allocation_is_moved_to_a_later_signed_one() -> None:
    keys = ticking_keys()  # a refit by another replica, whose event this one missed
    state = fresh_state(signed(on("a", GPU0, 5), keys), keys=keys)
    report = reconcile_state(state.ledger, [signed(on("a", GPU1, 8), keys)], "10", state.ledger.seq)
    [drift] = report.drifts
    assert drift.kind == DRIFT_CHANGED
    assert drift.difference == {"n1-gpu0": (1, 1000, 10), "n1-gpu1": (-1, -1000, -10)}
    res = state.ledger.reservation("uid-a")
    assert res is not None and (res.raw, res.version) == (GPU1, "8")
    assert state.ledger.snapshot()["n1"] == {"n1-gpu0": (0, 0, 0), "n1-gpu1": (1, 1000, 10)}


def test_a_later_signed_allocation_is_judged_beside_every_other_listed_booking() -> None:
    """The live ledger refused a refit landing late on a GPU another pod holds; the list puts the
    refitted pod first and a pod that finished, holding the other GPU, last. Fed in list order,
    the shadow judged the move before the holder's booking was there (and the finished pod's
    still was) and would adopt it past the GPU's capacity, or refuse one the live ledger took."""
    keys = ticking_keys()
    big = [container("c", 1, 6000, 10)]
    gpu0, gpu1 = "n1-gpu0,NVIDIA,6000,10:;", "n1-gpu1,NVIDIA,6000,10:;"

    def six(name: str, raw: str, version: int, node_name: str = "n1") -> dict[str, Any]:
        return signed(versioned(placed(pod(name, containers=big), node_name, raw), version), keys)

    p = six("p", gpu0, 5)
    state = fresh_state(p, six("q", gpu1, 6), keys=keys)
    late = six("p", gpu1, 8)
    state.ledger.on_pod(late)
    res = state.ledger.reservation("uid-p")
    assert res is not None and res.raw == gpu0
    report = reconcile_state(state.ledger, [late, six("q", gpu1, 6)], "10", state.ledger.seq)
    assert report.drifts == []
    assert state.ledger.snapshot()["n1"] == {"n1-gpu0": (1, 6000, 10), "n1-gpu1": (1, 6000, 10)}
    # the GPU's holder finished: the move fits now, listed before the finished pod or not
    done = six("q", gpu1, 9)
    done["status"]["phase"] = "Succeeded"
    report = reconcile_state(state.ledger, [late, done], "10", state.ledger.seq)
    assert [d.kind for d in report.drifts] == [DRIFT_CHANGED, DRIFT_LEAKED]
    assert state.ledger.snapshot()["n1"] == {"n1-gpu0": (0, 0, 0), "n1-gpu1": (1, 6000, 10)}


def test_the_shadow_judges_a_late_write_against_the_quota_and_holds_as_the_live_ledger() -> None:
    """Review s23 R1: the shadow had no quota limits, so a late filter write the live ledger
    refused for its namespace's quota was booked there and adopted as missing, past the quota."""
    keys = ticking_keys()
    state = fresh_state(keys=keys)
    state.on_quota(
        {
            "metadata": {"name": "gpu", "namespace": "team"},
            "spec": {"hard": {"limits.nvidia.com/gpumem": "2000"}},
        }
    )
    first = signed(versioned(placed(pod("new", namespace="team"), "n1", GPU0), 5), keys)
    state.ledger.on_pod(first)
    state.ledger.hold("uid-r", "n2", {}, "team", 1000, 0)  # another pod's refit, on another node
    late = signed(versioned(placed(pod("late", namespace="team"), "n1", GPU1), 6), keys)
    state.ledger.on_pod(late)
    assert state.ledger.reservation("uid-late") is None
    report = reconcile_state(state.ledger, [first, late], "10", state.ledger.seq)
    assert report.drifts == []
    assert state.ledger.reservation("uid-late") is None
    assert state.ledger.quota_usage("team")[1] == (2000, 10)


def test_a_list_showing_an_undecided_refits_pod_unchanged_settles_it_only_past_the_time_bound(
    logs: list[dict[str, Any]],
) -> None:
    """Review s23 R2: a list newer than an undecided refit's precondition released its hold though
    it showed the pod unchanged (the write may still land: over the pod a filter then placed on
    the GPU freed). Unchanged, the hold stays, until UNDECIDED_HOLD_S: then it was not applied."""
    keys = ticking_keys()
    state = fresh_state(keys=keys)
    now = [1000.0]
    state.ledger.elapsed = lambda: now[0]
    state.clock = lambda: now[0] + 10**6  # a step of the wall clock moves no hold
    six = [container("c", 1, 6000, 10)]
    gpu0, gpu1 = "n1-gpu0,NVIDIA,6000,10:;", "n1-gpu1,NVIDIA,6000,10:;"
    p = placed(pod("p", containers=six, phase="Running"), "n1", gpu0)
    p["spec"]["nodeName"] = "n1"
    p = signed(versioned(p, 100), keys)
    ledger = state.ledger
    ledger.on_pod(p)
    hold = undecided_refit(ledger, "uid-p", "n1", gpu1, "100")
    both = {"n1-gpu0": (1, 6000, 10), "n1-gpu1": (1, 6000, 10)}
    now[0] += UNDECIDED_HOLD_S - 1
    reconcile_state(ledger, [copy.deepcopy(p)], "150", ledger.seq)
    assert ledger.holds("uid-p") == (hold,)
    assert ledger.snapshot()["n1"] == both
    now[0] += 1
    reconcile_state(ledger, [copy.deepcopy(p)], "160", ledger.seq)
    assert ledger.holds("uid-p") == ()
    back = ledger.reservation("uid-p")
    assert back is not None and back.raw == gpu0
    assert ledger.snapshot()["n1"] == {"n1-gpu0": (1, 6000, 10), "n1-gpu1": (0, 0, 0)}
    (expired,) = [e for e in logs if e["event"] == "refit_hold_expired"]
    assert expired["pod"] == "default/p" and expired["waited_s"] == UNDECIDED_HOLD_S


def test_a_list_deciding_an_undecided_refit_judges_a_third_allocation_as_its_event_would() -> None:
    """Review s23 N1: the reconcile released the hold and re-fed the pod with no booking, so the
    allocation another replica signed later onto a full GPU was booked past its capacity; the list
    now decides as the pod's event does: the move is refused and the refit's outcome stays booked."""
    keys = ticking_keys()
    state = fresh_state(keys=keys)
    state.on_node(node("n1", gpus=3))
    six = [container("c", 1, 6000, 10)]
    gpu0, gpu1, gpu2 = (f"n1-gpu{i},NVIDIA,6000,10:;" for i in range(3))
    ledger = state.ledger
    running: dict[str, dict[str, Any]] = {}
    for name, raw, version in (("p", gpu0, 100), ("q", gpu2, 101)):
        running[name] = placed(pod(name, containers=six, phase="Running"), "n1", raw)
        running[name]["spec"]["nodeName"] = "n1"
        running[name] = signed(versioned(running[name], version), keys)
        ledger.on_pod(running[name])
    undecided_refit(ledger, "uid-p", "n1", gpu1, "100")
    moved = placed(pod("p", containers=six, phase="Running"), "n1", gpu2)  # another replica's, later
    moved["spec"]["nodeName"] = "n1"
    reconcile_state(ledger, [signed(versioned(moved, 120), keys), running["q"]], "150", ledger.seq)
    assert ledger.holds("uid-p") == ()
    res = ledger.reservation("uid-p")
    assert res is not None and res.raw == gpu1
    assert ledger.snapshot()["n1"]["n1-gpu2"] == (1, 6000, 10)  # q alone


@pytest.mark.parametrize("signing", [False, True])
def test_an_allocation_the_scheduler_did_not_sign_never_moves_a_booking(signing: bool) -> None:
    keys = ticking_keys() if signing else None
    booked = on("a", GPU0, 5)
    state = fresh_state(signed(booked, keys) if keys else booked, keys=keys)
    forged = on("a", GPU1, 8)  # a tenant's patch (unsigned, or signed with another key)
    if keys is not None:
        signed(forged, ticking_keys(b"another-key-0123456789abcdef01234567"))
    report = reconcile_state(state.ledger, [forged], "10", state.ledger.seq)
    assert report.drifts == []
    res = state.ledger.reservation("uid-a")
    assert res is not None and res.raw == GPU0
    assert state.ledger.snapshot()["n1"] == {"n1-gpu0": (1, 1000, 10), "n1-gpu1": (0, 0, 0)}


def test_missing_reservation_is_booked() -> None:
    state = fresh_state()
    report = reconcile_state(state.ledger, [on("a", GPU0, 5)], "10", state.ledger.seq)
    assert [d.kind for d in report.drifts] == [DRIFT_MISSING]
    assert state.ledger.snapshot()["n1"]["n1-gpu0"] == (1, 1000, 10)


def test_finished_pod_in_list_is_released() -> None:
    state = fresh_state(on("a", GPU0, 5))
    done = on("a", GPU0, 7)
    done["status"]["phase"] = "Succeeded"
    report = reconcile_state(state.ledger, [done], "10", state.ledger.seq)
    assert [d.kind for d in report.drifts] == [DRIFT_LEAKED]
    assert state.ledger.reservation("uid-a") is None
    assert not state.ledger.was_deleted("uid-a")  # the pod still exists


def test_pending_reservation_survives() -> None:
    state = fresh_state()
    a = versioned(pod("a"), 3)
    state.ledger.on_pod(a)
    state.ledger.reserve(a, "n1", tuple(ann.decode_pod_devices(GPU0)), GPU0)  # filter: patch in flight
    report = reconcile_state(state.ledger, [a], "10", state.ledger.seq)
    assert report.drifts == []  # the shadow starts from the pending booking and keeps it
    res = state.ledger.reservation("uid-a")
    assert res is not None and res.pending
    assert state.ledger.snapshot()["n1"]["n1-gpu0"] == (1, 1000, 10)


def test_reservations_younger_than_the_list_survive() -> None:
    state = fresh_state()
    since = state.ledger.seq  # the list is requested now
    listed = versioned(pod("a"), 3)  # the list shows a without allocation ...
    state.ledger.reserve(listed, "n1", tuple(ann.decode_pod_devices(GPU0)), GPU0)
    state.ledger.confirm("uid-a", "n1", GPU0)  # ... its patch landed after the list
    ghost = pod("ghost")  # not even listed: created after the list
    undo = state.ledger.reserve(ghost, "n1", tuple(ann.decode_pod_devices(GPU1)), GPU1)
    state.ledger.confirm("uid-ghost", "n1", GPU1)
    report = reconcile_state(state.ledger, [listed], "10", since)
    assert report.drifts == [] and report.skipped == 1  # the ghost; a's booking the shadow keeps
    assert state.ledger.snapshot()["n1"] == {"n1-gpu0": (1, 1000, 10), "n1-gpu1": (1, 1000, 10)}
    # a later list (nothing changed since it): the unlisted ghost is released; a, listed without
    # the allocation its booking holds (removed by someone else), keeps its booking
    report = reconcile_state(state.ledger, [listed], "12", state.ledger.seq)
    assert [d.kind for d in report.drifts] == [DRIFT_LEAKED]
    assert state.ledger.snapshot()["n1"] == {"n1-gpu0": (1, 1000, 10), "n1-gpu1": (0, 0, 0)}
    undo()  # a late rollback of a pod the reconcile released is a no-op
    assert state.ledger.reservation("uid-ghost") is None


def test_pod_event_newer_than_the_list_is_left_alone() -> None:
    state = fresh_state(on("a", GPU1, 15))  # the watch already applied version 15
    report = reconcile_state(state.ledger, [on("a", GPU0, 8)], "10", state.ledger.seq)
    assert report.drifts == []  # the older listed allocation disagrees with the booking: kept
    res = state.ledger.reservation("uid-a")
    assert res is not None and res.raw == GPU1


def test_delete_applied_after_the_list_is_not_undone() -> None:
    a = on("a", GPU0, 5)
    state = fresh_state(a)
    since = state.ledger.seq
    state.ledger.on_pod_deleted(a)
    report = reconcile_state(state.ledger, [a], "10", since)
    assert report.drifts == [] and report.skipped == 1
    assert state.ledger.reservation("uid-a") is None


def test_binding_pod_is_left_alone() -> None:
    state = fresh_state(on("a", GPU0, 5))
    report = reconcile_state(state.ledger, [], "10", state.ledger.seq, busy=frozenset({"uid-a"}))
    assert report.drifts == [] and report.skipped == 1
    assert state.ledger.reservation("uid-a") is not None


async def test_node_under_lock_is_left_alone() -> None:
    state = fresh_state(on("a", GPU0, 5))
    state.ledger.nodes["n1"].usage.add({"n1-gpu1": DeviceAmount(1, 1000, 10)})  # a refit's double booking
    async with state.ledger.node_guard("n1"):
        report = reconcile_state(state.ledger, [], "10", state.ledger.seq)
        assert report.drifts == [] and report.skipped == 1
        assert report.gpus == 2  # n2 only
    report = reconcile_state(state.ledger, [], "10", state.ledger.seq)
    assert sorted(d.kind for d in report.drifts) == [DRIFT_GPU, DRIFT_LEAKED]


def test_corrupted_gpu_usage_is_recomputed() -> None:
    a = on("a", GPU0, 5)
    state = fresh_state(a)
    state.ledger.nodes["n1"].usage.add({"n1-gpu0": DeviceAmount(0, 500, 0)})
    report = reconcile_state(state.ledger, [a], "10", state.ledger.seq)
    [drift] = report.drifts
    assert (drift.kind, drift.node, drift.gpu) == (DRIFT_GPU, "n1", "n1-gpu0")
    assert drift.difference == {"n1-gpu0": (1, 500, 0)}  # an add books at least one slot
    assert state.ledger.snapshot()["n1"]["n1-gpu0"] == (1, 1000, 10)
    assert state.ledger.nodes["n1"].usage.room() == (2, 8000, 100)  # gpu1 fully free, index current
    assert state.ledger.ranked()[-1][1] == "n1"  # the score index follows the rebuilt usage


def test_skipped_pods_do_not_count_as_gpu_drift() -> None:
    state = fresh_state()
    a = versioned(pod("a"), 3)
    state.ledger.reserve(a, "n1", tuple(ann.decode_pod_devices(GPU0)), GPU0)
    report = reconcile_state(state.ledger, [a], "10", state.ledger.seq)
    assert report.drifts == []


def test_undecodable_allocation_books_nothing_without_new_warnings(logs: list[dict[str, Any]]) -> None:
    bad = on("bad", "n1-gpu0,NVIDIA,not-a-number,10:;", 5)
    state = fresh_state(bad)
    assert [p["metadata"]["name"] for p, _ in state.ledger.undecodable] == ["bad"]  # an Event follows
    state.ledger.undecodable.clear()
    logs.clear()
    report = reconcile_state(state.ledger, [copy.deepcopy(bad)], "10", state.ledger.seq)
    assert report.drifts == []
    assert state.ledger.undecodable == []
    assert not [e for e in logs if e["log_level"] == "warning"]
    assert state.ledger.snapshot()["n1"]["n1-gpu0"] == (0, 0, 0)  # attack 2: never the whole GPU


def test_rebuild_from_state_equals_shadow_after_many_repairs() -> None:
    pods = [on(f"p{i}", f"n1-gpu{i % 2},NVIDIA,{100 * (i + 1)},{i + 1}:;", 10 + i) for i in range(6)]
    state = fresh_state(*pods[:4])
    state.ledger.reserve(
        pods[0], "n1", ((ContainerDevice("n1-gpu1", "NVIDIA", 50, 1),),), "x"
    )  # stale pending
    state.ledger.confirm("uid-p0", "n1", "x")
    listed = pods[1:]  # p0 deleted, p4 and p5 missed
    reconcile_state(state.ledger, listed, "30", state.ledger.seq)
    assert state.ledger.snapshot() == fresh_state(*listed).ledger.snapshot()
    assert state.ledger.quotas.used("default") == fresh_state(*listed).ledger.quotas.used("default")


def test_marks_of_gone_pods_are_forgotten() -> None:
    state = fresh_state()
    listed, gone = versioned(pod("a"), 3), pod("gone")
    for p in (listed, gone):
        undo = state.ledger.reserve(p, "n1", tuple(ann.decode_pod_devices(GPU0)), GPU0)
        undo()  # a filter whose patch failed
    assert state.ledger.changed_since("uid-gone", -1) and state.ledger.changed_since("uid-a", -1)
    reconcile_state(state.ledger, [listed], "10", state.ledger.seq)
    assert not state.ledger.changed_since("uid-gone", -1)
    assert state.ledger.changed_since("uid-a", -1)  # still listed: kept until its delete


def test_newer_than() -> None:
    assert newer_than("11", "10")
    assert not newer_than("10", "10")
    assert not newer_than("", "10")
    assert newer_than("abc", "10")  # cannot be ordered: assume newer


def test_parse_interval() -> None:
    assert parse_interval("0") == 0.0
    assert parse_interval("0s") == 0.0
    assert parse_interval("5m") == 300.0
    assert parse_interval(" 90s ") == 90.0
    for bad in ("-1m", "soon", ""):
        with pytest.raises(ValueError):
            parse_interval(bad)


def test_cli_reads_reconcile_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    from hamid.scheduler import cli
    from hamid.scheduler.options import SchedulerOptions

    seen: list[float] = []

    async def fake_run(options: SchedulerOptions, **_: Any) -> None:
        seen.append(options.settings.reconcile_interval_s)

    monkeypatch.setattr(cli, "run_scheduler", fake_run)
    runner = CliRunner()
    unsigned = "--allow-unsigned-allocations"
    assert runner.invoke(cli.scheduler_command, [unsigned, "--reconcile-interval", "90s"]).exit_code == 0
    assert (
        runner.invoke(cli.scheduler_command, [unsigned], env={"HAMID_RECONCILE_INTERVAL": "0"}).exit_code == 0
    )
    assert runner.invoke(cli.scheduler_command, [unsigned]).exit_code == 0
    bad = runner.invoke(cli.scheduler_command, [unsigned, "--reconcile-interval", "often"])
    assert bad.exit_code == 2 and "often" in bad.output
    assert seen == [90.0, 0.0, 300.0]


def test_a_list_older_than_the_cache_does_not_book_again_a_pod_the_cache_saw_finish() -> None:
    """Review s23 review3 D2: a list taken before the pod finished decided its undecided refit
    with the listed (Running) copy and booked the finished pod again as the refit's rollback,
    until the next reconcile. The cache's newer copy decides instead."""
    keys = ticking_keys()
    state = fresh_state(keys=keys)
    ledger = state.ledger
    six = [container("c", 1, 6000, 10)]
    gpu0, gpu1 = "n1-gpu0,NVIDIA,6000,10:;", "n1-gpu1,NVIDIA,6000,10:;"
    p = placed(pod("p", containers=six, phase="Running"), "n1", gpu0)
    p["spec"]["nodeName"] = "n1"
    p = signed(versioned(p, 100), keys)
    ledger.on_pod(p)
    hold = refit_in_flight(ledger, "uid-p", "n1", gpu1)
    touched = versioned(copy.deepcopy(p), 101)  # an unrelated update: the refit's patch will fail
    touched["metadata"]["labels"] = {"touched": "yes"}
    ledger.on_pod(touched)
    since = ledger.seq  # the list is taken now: it shows p at 101
    done = versioned(copy.deepcopy(touched), 102)
    done["status"]["phase"] = "Succeeded"
    ledger.on_pod(done)  # the cache applies the pod's end
    assert ledger.reservation("uid-p") is None
    ledger.settle_on_event(hold, "100")  # the patch timed out, its read-back failed
    cache = {"default/p": done}
    reconcile_state(ledger, [copy.deepcopy(touched)], "101", since, cached=cache.get)
    assert ledger.holds("uid-p") == ()
    assert ledger.reservation("uid-p") is None
    assert ledger.snapshot()["n1"]["n1-gpu0"] == (0, 0, 0)
    # A cache copy older than the list (the cache not caught up) is not used: the list decides.
    ledger.on_pod(p)
    hold = undecided_refit(ledger, "uid-p", "n1", gpu1, "100")
    reconcile_state(ledger, [copy.deepcopy(touched)], "101", ledger.seq, cached={"default/p": p}.get)
    assert ledger.holds("uid-p") == ()
    back = ledger.reservation("uid-p")
    assert back is not None and back.raw == gpu0
