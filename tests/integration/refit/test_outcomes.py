"""``/refit`` when the API server is slow or ambiguous: one deadline, patch outcomes, a lagging cache."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
import structlog.testing

from hamid.model import annotations as ann
from hamid.model.booked import booked_condition, booked_record
from hamid.plugin.allocator_rules import booked_entries, pending_entries, refuse_unbooked, to_allocate
from hamid.scheduler import ledger as ledger_module
from hamid.scheduler.refit import commit
from tests.fixtures.tls import TLSFiles
from tests.integration.refit.harness import Env, container, d, eventually, gpu, refit_env, request

TA, AL = ann.DEVICES_TO_ALLOCATE, ann.DEVICES_ALLOCATED
OLD, NEW = "GPU-a,NVIDIA,20000,30:;", "GPU-b,NVIDIA,20000,30:;"


def used(env: Env) -> dict[str, tuple[int, int, int]]:
    return env.scheduler.ledger.snapshot()["n1"]


async def placed(env: Env, **kw: Any) -> dict[str, Any]:
    env.add_node("n1", [gpu("GPU-a", 0), gpu("GPU-b", 1)])
    return await env.place("p", "n1", ((d("GPU-a", 20000, 30),),), **kw)


async def post(env: Env, pod: dict[str, Any], index: int = 0) -> dict[str, Any]:
    """POST /refit (mTLS as node n1) and wait for the server's own answer, however late."""
    body = json.dumps(request(pod, "n1", index, ["GPU-b"]).to_json()).encode()
    status, text = await asyncio.wait_for(env.post_raw(body), 20)
    assert status == 200, text
    return json.loads(text)


async def cache_at(env: Env, version: str) -> None:
    await eventually(
        lambda: (
            (env.scheduler.pods.get("default/p") or {}).get("metadata", {}).get("resourceVersion") == version
        )
    )


async def test_patch_that_timed_out_but_landed_keeps_the_new_booking(
    tls_files: TLSFiles, tmp_path: Path
) -> None:
    async with refit_env(tls_files, tmp_path, patch_timeout=1.0) as env:
        pod = await placed(env)
        uid = pod["metadata"]["uid"]
        slow = env.server.faults.add_latency(5.0, verb="patch", path_pattern="/pods/p$")
        answer = asyncio.create_task(post(env, pod))
        await eventually(lambda: bool(env.scheduler.ledger.holds(uid)))  # the patch is in flight
        # the API server applies the write, but its answer never reaches the scheduler
        landed = env.server.patch("Pod", "default", "p", {"metadata": {"annotations": {TA: NEW, AL: NEW}}})
        await cache_at(env, landed["metadata"]["resourceVersion"])
        result = await answer
        env.server.faults.remove(slow.id)
        # it landed, so the refit succeeded: the plugin learns the devices it now serves (it used
        # to be told of a failure and fall back to an entry that was no longer the pod's)
        assert result["succeeded"] is True, result
        assert result["containerDevices"].startswith("GPU-b,NVIDIA,")
        res = env.scheduler.ledger.reservation(uid)
        assert res is not None and res.raw == NEW
        assert used(env) == {"GPU-a": (0, 0, 0), "GPU-b": (1, 20000, 30)}
        assert env.scheduler.ledger.holds(uid) == ()


async def test_the_record_of_a_landed_refit_is_written_through_transient_failures(
    tls_files: TLSFiles, tmp_path: Path
) -> None:
    """A fault audit: the patch landed with its answer lost and the record's write failed once, so
    the record named the old allocation for good, and the plugin, told the refit had failed,
    refused the pod's refitted entry as one the scheduler did not book."""
    async with refit_env(tls_files, tmp_path, patch_timeout=1.0) as env:
        record = booked_condition("n1", OLD, "", time.time())  # what /bind recorded
        pod = await placed(env, status={"conditions": [record]})
        uid = pod["metadata"]["uid"]
        env.server.faults.fail_next(2, verb="patch", path_pattern="/pods/p/status$", status=500)
        slow = env.server.faults.add_latency(5.0, verb="patch", path_pattern="/pods/p$")
        answer = asyncio.create_task(post(env, pod))
        await eventually(lambda: bool(env.scheduler.ledger.holds(uid)))
        landed = env.server.patch("Pod", "default", "p", {"metadata": {"annotations": {TA: NEW, AL: NEW}}})
        await cache_at(env, landed["metadata"]["resourceVersion"])
        result = await answer
        env.server.faults.remove(slow.id)
        assert result["succeeded"] is True and result["containerDevices"] == "GPU-b,NVIDIA,20000,30:"
        await eventually(lambda: booked_record(env.server.get("Pod", "default", "p")).allocated == NEW)
        stored = env.server.get("Pod", "default", "p")
        (entry,) = pending_entries(to_allocate(stored))
        refuse_unbooked(entry, booked_entries(stored))  # the plugin serves it, even after a restart


async def test_a_late_retry_of_a_refits_record_never_overwrites_a_newer_refits(
    tls_files: TLSFiles, tmp_path: Path
) -> None:
    """Two refits of one pod's two containers: the first's record fails once and is sent again
    after the second's record landed. It used to land last, naming container 1's old GPU, so the
    plugin would refuse the allocation the pod carries; a superseded record is not sent again."""
    async with refit_env(tls_files, tmp_path) as env:
        env.add_node("n1", [gpu("GPU-a", 0), gpu("GPU-b", 1)])
        two = [container("c0", 1, 1000), container("c1", 1, 1000)]
        first, both = (
            "GPU-a,NVIDIA,1000,0:;GPU-a,NVIDIA,1000,0:;",
            "GPU-b,NVIDIA,1000,0:;GPU-b,NVIDIA,1000,0:;",
        )
        record = booked_condition("n1", first, "", time.time())
        pod = await env.place(
            "p",
            "n1",
            ((d("GPU-a", 1000),), (d("GPU-a", 1000),)),
            containers=two,
            status={"conditions": [record]},
        )
        env.server.faults.fail_next(1, verb="patch", path_pattern="/pods/p/status$", status=500)
        slow = env.server.faults.add_latency(1.0, verb="patch", path_pattern="/pods/p/status$")
        assert (await post(env, pod, 0))["succeeded"] is True
        assert (await post(env, pod, 1))["succeeded"] is True
        await eventually(lambda: booked_record(env.server.get("Pod", "default", "p")).allocated == both)
        await asyncio.sleep(2.5)  # the first record's retry would have landed by now
        env.server.faults.remove(slow.id)
        assert env.annotations("p")[AL] == both
        assert booked_record(env.server.get("Pod", "default", "p")).allocated == both


async def test_unknown_patch_outcome_books_both_until_the_next_pod_event(
    tls_files: TLSFiles, tmp_path: Path
) -> None:
    async with refit_env(tls_files, tmp_path, patch_timeout=0.5) as env:
        env.quota("default", 100000)
        pod = await placed(env)
        uid = pod["metadata"]["uid"]
        await eventually(lambda: env.scheduler.ledger.quotas.used("default") == (20000, 30))
        slow = env.server.faults.add_latency(5.0, verb="patch", path_pattern="/pods/p$")
        env.server.faults.fail_next(1, verb="get", path_pattern="/pods/p$", status=503)
        result = await post(env, pod)
        env.server.faults.remove(slow.id)
        assert result["succeeded"] is False and "outcome is unknown" in result["failureReason"]
        # neither GPU can be given away while the API server's answer is unknown
        assert used(env) == {"GPU-a": (1, 20000, 30), "GPU-b": (1, 20000, 30)}
        assert env.scheduler.ledger.quotas.used("default") == (20000, 30)
        # the pod's next update decides: the patch did not land, the old booking stays
        update = env.server.patch("Pod", "default", "p", {"metadata": {"labels": {"next": "update"}}})
        await cache_at(env, update["metadata"]["resourceVersion"])
        await eventually(lambda: not env.scheduler.ledger.holds(uid))
        assert used(env) == {"GPU-a": (1, 20000, 30), "GPU-b": (0, 0, 0)}
        assert env.scheduler.ledger.reservation(uid).raw == OLD
        assert env.scheduler.ledger.quotas.used("default") == (20000, 30)


async def undecided_refit(env: Env, pod: dict[str, Any], read_fails: bool = True) -> None:
    """Refit ``p`` onto GPU-b while the API server drops its patch (its client hung up) and the
    read-back fails (or shows the pod unchanged): the answer is that the outcome is unknown; the
    booking moved, both GPU sets held."""
    slow = env.server.faults.add_latency(5.0, verb="patch", path_pattern="/pods/p$")
    if read_fails:
        env.server.faults.fail_next(1, verb="get", path_pattern="/pods/p$", status=503)
    try:
        result = await post(env, pod)
    finally:
        env.server.faults.remove(slow.id)
    assert result["succeeded"] is False and "outcome is unknown" in result["failureReason"], result


async def refit_of_unknown_outcome(env: Env) -> str:
    """Refit ``p`` while its patch outlasts the refit's patch timeout (the API server then drops
    it: its client hung up) and its read-back shows it unchanged; the pod's UID."""
    pod = await placed(env)
    await undecided_refit(env, pod, read_fails=False)
    return str(pod["metadata"]["uid"])


async def test_unknown_patch_outcome_is_read_back_within_seconds_without_any_pod_event(
    tls_files: TLSFiles, tmp_path: Path
) -> None:
    """The pod changed but its event does not reach the scheduler (a lagging watch): the
    scheduler's own follow-up reads it back and rolls back (it once kept both GPU sets booked
    until the next reconcile, 5 min later). A read-back of the pod unchanged decides nothing:
    the API server may still apply the write (an audit saw one land after such a read-back)."""
    async with refit_env(tls_files, tmp_path, patch_timeout=0.5) as env:
        uid = await refit_of_unknown_outcome(env)
        ledger = env.scheduler.ledger
        await asyncio.sleep(1.0)  # read back unchanged (0.5 s): both GPU sets stay booked
        assert used(env) == {"GPU-a": (1, 20000, 30), "GPU-b": (1, 20000, 30)}
        heard = ledger.on_pod
        # a lagging watch: the pod's events do not reach the ledger
        ledger.on_pod = lambda pod: None if pod["metadata"]["name"] == "p" else heard(pod)  # type: ignore[method-assign]
        try:
            env.server.patch("Pod", "default", "p", {"metadata": {"labels": {"next": "update"}}})
            started = asyncio.get_running_loop().time()
            await eventually(lambda: not ledger.holds(uid), within=10)
            settled = asyncio.get_running_loop().time() - started
        finally:
            ledger.on_pod = heard  # type: ignore[method-assign]
        assert settled < 5.0, settled  # the next read-back (1 s later) decides
        assert env.annotations("p")[AL] == OLD
        assert ledger.reservation(uid).raw == OLD
        assert used(env) == {"GPU-a": (1, 20000, 30), "GPU-b": (0, 0, 0)}


async def test_a_refit_whose_landing_a_pod_event_tells_is_recorded_as_booked(
    tls_files: TLSFiles, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The patch's outcome was unknown and the pod's event, not the follow-up's read-back, showed
    it landed: the booking moved, but the status record kept naming the old allocation (a restart
    then rebuilt the booking from the record). The event that decides the hold writes it, as for
    any landed refit, at once (not when a follow-up wakes: review s24 R2)."""
    monkeypatch.setattr(commit, "FOLLOW_UP_DELAYS_S", (60.0,))  # no read-back within the test
    async with refit_env(tls_files, tmp_path, patch_timeout=0.5) as env:
        record = booked_condition("n1", OLD, "", time.time())
        pod = await placed(env, status={"conditions": [record]})
        uid = pod["metadata"]["uid"]
        await undecided_refit(env, pod)
        with structlog.testing.capture_logs() as logs:
            # the write lands late; its event reaches the ledger before the follow-up reads back
            moved = {"metadata": {"annotations": {TA: NEW, AL: NEW}}}
            env.server.patch("Pod", "default", "p", moved)
            await eventually(lambda: not env.scheduler.ledger.holds(uid))
            await eventually(lambda: booked_record(env.server.get("Pod", "default", "p")).allocated == NEW)
        assert [e["event"] for e in logs if e["event"].startswith("refit_outcome")] == [
            "refit_outcome_settled_by_event"
        ]
        assert used(env) == {"GPU-a": (0, 0, 0), "GPU-b": (1, 20000, 30)}


async def test_a_rolled_back_refit_never_records_a_later_refits_undecided_move(
    tls_files: TLSFiles, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review s24 R1: a refit's follow-up, woken after the pod's event had rolled the refit back,
    recorded its GPUs as booked because a second refit of the same plan, still undecided, had moved
    the booking there: the record named GPUs the pod never got (the plugin then refuses the pod's
    real allocation; signed, the ledger books the wrong GPUs). Only the event that shows the
    write on the pod records it."""
    monkeypatch.setattr(commit, "FOLLOW_UP_DELAYS_S", (3.0,))
    async with refit_env(tls_files, tmp_path, patch_timeout=0.5) as env:
        record = booked_condition("n1", OLD, "", time.time())
        pod = await placed(env, status={"conditions": [record]})
        uid = pod["metadata"]["uid"]
        ledger = env.scheduler.ledger
        await undecided_refit(env, pod)
        update = env.server.patch("Pod", "default", "p", {"metadata": {"labels": {"next": "update"}}})
        await cache_at(env, update["metadata"]["resourceVersion"])
        await eventually(lambda: not ledger.holds(uid))  # not applied: rolled back
        assert ledger.reservation(uid).raw == OLD
        await undecided_refit(env, env.server.get("Pod", "default", "p"))  # the same plan again
        await asyncio.sleep(3.5)  # the first refit's follow-up has woken
        stored = env.server.get("Pod", "default", "p")
        assert stored["metadata"]["annotations"][AL] == OLD  # nothing landed
        assert booked_record(stored).allocated == OLD
        (entry,) = pending_entries(to_allocate(stored))
        refuse_unbooked(entry, booked_entries(stored))  # the plugin still serves the pod


async def test_a_pod_unchanged_until_the_bound_was_not_refitted_even_with_the_reconcile_off(
    tls_files: TLSFiles, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review s23 N3: only the reconcile ended an undecided refit's hold, so with
    ``--reconcile-interval 0`` a pod that never changed kept both GPU sets booked for good. The
    follow-up reads it back once more at the bound (UNDECIDED_HOLD_S, shortened here): unchanged,
    the write was not applied. A read that fails there decides nothing (review3: it was taken as
    "not applied" too): it is read again until it says."""
    monkeypatch.setattr(commit, "FOLLOW_UP_DELAYS_S", (0.1, 0.1))
    monkeypatch.setattr(ledger_module, "UNDECIDED_HOLD_S", 1.5)
    async with refit_env(tls_files, tmp_path, patch_timeout=0.5) as env:
        ledger = env.scheduler.ledger
        with structlog.testing.capture_logs() as logs:
            uid = await refit_of_unknown_outcome(env)
            await asyncio.sleep(0.6)  # both read-backs: unchanged, both GPU sets stay booked
            assert used(env) == {"GPU-a": (1, 20000, 30), "GPU-b": (1, 20000, 30)}
            env.server.faults.fail_next(3, verb="get", path_pattern="/pods/p$", status=503)
            await eventually(lambda: not ledger.holds(uid), within=5)
        order = [
            e["event"] for e in logs if e["event"] in ("refit_patch_outcome_unreadable", "refit_hold_expired")
        ]
        assert order == ["refit_patch_outcome_unreadable"] * 3 + ["refit_hold_expired"], order
        assert ledger.reservation(uid).raw == OLD
        assert used(env) == {"GPU-a": (1, 20000, 30), "GPU-b": (0, 0, 0)}
        assert [e["pod"] for e in logs if e["event"] == "refit_hold_expired"] == ["default/p"]


async def test_one_deadline_covers_the_node_lock_wait(tls_files: TLSFiles, tmp_path: Path) -> None:
    """A refit that would commit after the plugin gave up (2 s) is refused with nothing changed."""
    async with refit_env(tls_files, tmp_path) as env:
        pod = await placed(env)
        before, snapshot = env.annotations("p"), used(env)
        patches = env.server.requests["patch pods"]
        async with env.scheduler.ledger.node_guard("n1"):  # another refit of n1 that takes long
            result = await post(env, pod)
        assert result["succeeded"] is False and "deadline" in result["failureReason"]
        assert env.annotations("p") == before and used(env) == snapshot
        assert env.server.requests["patch pods"] == patches


async def test_second_refit_reads_the_pod_when_the_cache_lags(tls_files: TLSFiles, tmp_path: Path) -> None:
    async with refit_env(tls_files, tmp_path) as env:
        env.add_node("n1", [gpu("GPU-a", 0), gpu("GPU-b", 1)])
        two = [container("c0", 1, 1000), container("c1", 1, 1000)]
        layout = ((d("GPU-a", 1000),), (d("GPU-a", 1000),))
        pod = await env.place("p", "n1", layout, containers=two)
        # the pod watch drops and cannot come back for a while: the cache keeps the old pod
        lagging = [
            env.server.faults.add_latency(5.0, verb=verb, path_pattern="/pods") for verb in ("watch", "list")
        ]
        env.server.close_watches("Pod")
        assert (await post(env, pod, 0))["succeeded"] is True
        second = await post(env, pod, 1)
        for rule in lagging:
            env.server.faults.remove(rule.id)
        assert second == {"succeeded": True, "containerDevices": "GPU-b,NVIDIA,1000,0:"}
        both = "GPU-b,NVIDIA,1000,0:;GPU-b,NVIDIA,1000,0:;"
        assert env.annotations("p")[AL] == env.annotations("p")[TA] == both
        assert used(env) == {"GPU-a": (0, 0, 0), "GPU-b": (2, 2000, 0)}
