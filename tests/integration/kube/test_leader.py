"""Lease-based leadership against the embedded API server: campaigning electors, lease followers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any, TypedDict

import pytest

from hamid.kube import leader
from hamid.kube.client import KubeClient, WatchEvent, connect
from hamid.kube.leader import LeaderElector, LeaseFollower
from hamidsim.apiserver.server import ApiServer
from tests.integration.kube.helpers import eventually


class Timings(TypedDict):
    lease_duration: float
    renew_deadline: float
    retry_period: float


FAST: Timings = {"lease_duration": 2.0, "renew_deadline": 1.5, "retry_period": 0.1}


def elector(kube: KubeClient, identity: str, log: list[str], **kwargs: Any) -> LeaderElector:
    return LeaderElector(
        kube,
        "kube-system",
        "hamid-scheduler",
        identity,
        on_started_leading=lambda: log.append(f"{identity}+"),
        on_stopped_leading=lambda: log.append(f"{identity}-"),
        **FAST,
        **kwargs,
    )


async def test_one_leader_then_failover_after_crash(kube: KubeClient) -> None:
    log: list[str] = []
    a = elector(kube, "a", log, release_on_cancel=False)
    b = elector(kube, "b", log)
    async with asyncio.TaskGroup() as tg:
        task_a = tg.create_task(a.run())
        await eventually(lambda: a.is_leader)
        task_b = tg.create_task(b.run())
        # b keeps trying for a few retry periods but cannot take a renewed lease.
        await asyncio.sleep(0.5)
        assert a.is_leader and not b.is_leader
        assert b.holder == "a"
        # a "crashes" (no release): b takes over once the lease expires.
        task_a.cancel()
        await eventually(lambda: b.is_leader, within=15)
        lease = await kube.get_lease("kube-system", "hamid-scheduler")
        assert lease["spec"]["holderIdentity"] == "b"
        assert lease["spec"]["leaseTransitions"] == 1
        task_b.cancel()
    assert log == ["a+", "a-", "b+", "b-"]


async def test_release_on_cancel_hands_over(kube: KubeClient) -> None:
    log: list[str] = []
    a = elector(kube, "a", log)
    async with asyncio.TaskGroup() as tg:
        task_a = tg.create_task(a.run())
        await eventually(lambda: a.is_leader)
        task_a.cancel()
    lease = await kube.get_lease("kube-system", "hamid-scheduler")
    assert lease["spec"]["holderIdentity"] == ""
    # A released lease is free at once: b needs no expiry wait.
    b = elector(kube, "b", log, release_on_cancel=False)
    async with asyncio.TaskGroup() as tg:
        task_b = tg.create_task(b.run())
        await eventually(lambda: b.is_leader)
        task_b.cancel()
    assert log == ["a+", "a-", "b+", "b-"]


async def test_leader_steps_down_when_renewals_fail(kube: KubeClient, apiserver: Any) -> None:
    log: list[str] = []
    a = elector(kube, "a", log)
    async with asyncio.TaskGroup() as tg:
        task_a = tg.create_task(a.run())
        await eventually(lambda: a.is_leader)
        apiserver.faults.fail_next(100_000, path_pattern="/leases", status=500)
        await eventually(lambda: not a.is_leader, within=15)
        assert log == ["a+", "a-"]
        apiserver.faults.clear()
        await eventually(lambda: a.is_leader, within=15)
        task_a.cancel()
    assert log == ["a+", "a-", "a+", "a-"]


async def test_leadership_is_fenced_on_the_replicas_own_clock(
    kube: KubeClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the lease duration (less the margin) since the last renewal was sent, the leader's
    fence refuses at once, before its renew loop has noticed anything."""
    log: list[str] = []
    a = elector(kube, "a", log)
    assert a.lease_invalid() == "not the leader" and a.epoch == ""
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(a.run())
        await eventually(lambda: a.is_leader)
        assert a.lease_invalid() == ""
        assert a.epoch.startswith("a@") and a.epoch.endswith("#0")
        frozen_at = leader.fence_clock()
        monkeypatch.setattr(leader, "fence_clock", lambda: frozen_at + FAST["lease_duration"])
        assert a.is_leader  # the renew loop has not run: the flag alone would still decide
        assert a.lease_invalid().startswith("lease not renewed for")
        task.cancel()
    assert a.lease_invalid() == "not the leader"


def test_bad_durations_are_refused() -> None:
    with pytest.raises(ValueError):
        LeaderElector(None, "ns", "n", "id", lease_duration=1, renew_deadline=2, retry_period=0.5)
    with pytest.raises(ValueError):
        LeaderElector(None, "ns", "n", "", lease_duration=3, renew_deadline=2, retry_period=0.5)


# -- following kube-scheduler's lease ---------------------------------------------------------------

T0 = datetime(2026, 1, 1, tzinfo=UTC)


async def put_lease(apiserver: Any, holder: str, transitions: int = 0, duration: int = 15) -> None:
    """Play kube-scheduler: ``holder`` renewed the lease at T0."""
    stamp = T0.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    apiserver.put(
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": "kube-scheduler", "namespace": "kube-system"},
            "spec": {
                "holderIdentity": holder,
                "leaseDurationSeconds": duration,
                "acquireTime": stamp,
                "renewTime": stamp,
                "leaseTransitions": transitions,
            },
        }
    )


def follower(kube: KubeClient, hostname: str, log: list[str], now: list[float]) -> LeaseFollower:
    return LeaseFollower(
        kube,
        "kube-system",
        "kube-scheduler",
        hostname,
        poll_interval=0.02,
        on_started_leading=lambda: log.append(f"{hostname}+"),
        on_stopped_leading=lambda: log.append(f"{hostname}-"),
        clock=lambda: now[0],
    )


async def test_follower_leads_while_its_kube_scheduler_holds_the_lease(
    kube: KubeClient, apiserver: Any
) -> None:
    log: list[str] = []
    now = [T0.timestamp() + 5]
    a = follower(kube, "host-a", log, now)
    ab = follower(kube, "host-ab", log, now)  # a hostname that "host-a_..." must not match
    async with asyncio.TaskGroup() as tg:
        tasks = [tg.create_task(a.run()), tg.create_task(ab.run())]
        await eventually(lambda: ab.holder == "" and a.holder == "", what="no lease yet")
        assert not a.is_leader and not ab.is_leader
        await put_lease(apiserver, "host-a_1111")
        await eventually(lambda: a.is_leader, what="host-a leads")
        await eventually(lambda: ab.holder == "host-a_1111", what="host-ab sees the holder")
        assert not ab.is_leader
        # The lease expires on the local clock (kube-scheduler stopped renewing): leadership ends.
        now[0] = T0.timestamp() + 16
        await eventually(lambda: not a.is_leader, what="expired lease ends leadership")
        # Renewed again by the same kube-scheduler: a new term.
        now[0] = T0.timestamp() + 5
        await eventually(lambda: a.is_leader, what="a leads again")
        # Another replica's kube-scheduler takes it.
        await put_lease(apiserver, "host-ab_2222", transitions=1)
        await eventually(lambda: ab.is_leader and not a.is_leader, what="host-ab leads")
        for task in tasks:
            task.cancel()
    assert log == ["host-a+", "host-a-", "host-a+", "host-a-", "host-ab+", "host-ab-"]


async def test_follower_starts_a_new_term_when_the_holder_changes_unseen(
    kube: KubeClient, apiserver: Any
) -> None:
    """A→B→A between two reads (or kube-scheduler restarted in the pod) is a new term."""
    log: list[str] = []
    now = [T0.timestamp() + 5]
    a = follower(kube, "host-a", log, now)
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(a.run())
        await put_lease(apiserver, "host-a_1111")
        await eventually(lambda: a.is_leader, what="a leads")
        await put_lease(apiserver, "host-a_3333", transitions=2)
        await eventually(lambda: len(log) == 3, what="a new term")
        assert a.is_leader and a.holder == "host-a_3333"
        # lease read errors keep the last record: leadership lasts until it expires
        failing = apiserver.faults.fail_next(100_000, path_pattern="/leases", status=500)
        await eventually(lambda: (failing.remaining or 0) < 100_000 - 3, what="three failed reads")
        assert a.is_leader
        now[0] = T0.timestamp() + 16
        await eventually(lambda: not a.is_leader, what="expiry ends leadership despite read errors")
        apiserver.faults.clear()
        task.cancel()
    assert log == ["host-a+", "host-a-", "host-a+", "host-a-"]


async def test_a_follower_stops_deciding_when_its_kube_scheduler_releases_not_at_its_next_poll(
    kube: KubeClient, apiserver: Any
) -> None:
    """An HA audit: kube-scheduler released the lease on a rolling update and the other pod's
    took it at once, while this replica kept deciding until its next poll (2 s): two deciders,
    two pods on one GPU. The follower watches the lease and ends its term on the event."""
    log: list[str] = []
    now = [T0.timestamp() + 5]
    a = LeaseFollower(
        kube,
        "kube-system",
        "kube-scheduler",
        "host-a",
        poll_interval=30.0,  # the poll alone would notice half a minute later
        on_started_leading=lambda: log.append("host-a+"),
        on_stopped_leading=lambda: log.append("host-a-"),
        clock=lambda: now[0],
    )
    await put_lease(apiserver, "host-a_1111")
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(a.run())
        await eventually(lambda: a.is_leader, what="a leads")
        await asyncio.sleep(0.3)  # the watch is open
        await put_lease(apiserver, "host-b_2222", transitions=1)
        await eventually(lambda: not a.is_leader, within=3, what="the release seen at once")
        assert a.lease_invalid() == "not the leader" and a.holder == "host-b_2222"
        task.cancel()
    assert log == ["host-a+", "host-a-"]


def test_follower_refuses_bad_settings() -> None:
    with pytest.raises(ValueError):
        LeaseFollower(None, "ns", "n", "", poll_interval=1)
    with pytest.raises(ValueError):
        LeaseFollower(None, "ns", "n", "host", poll_interval=0)


def candidate(
    kube: KubeClient, now: list[float], timings: tuple[float, float, float], **kwargs: Any
) -> LeaderElector:
    """``b`` campaigning for the lease :func:`put_lease` writes, its wall clock reading ``now[0]``."""
    duration, renew, retry = timings
    return LeaderElector(
        kube,
        "kube-system",
        "kube-scheduler",
        "b",
        lease_duration=duration,
        renew_deadline=renew,
        retry_period=retry,
        clock=lambda: now[0],
        **kwargs,
    )


async def test_a_candidate_takes_over_at_renew_time_plus_duration_not_on_its_retry_tick(
    kube: KubeClient, apiserver: Any
) -> None:
    """The holder last renewed 9.5 s ago (10 s lease): the candidate, whose retry tick is 4 s and
    who saw the record just now, takes over at renewTime + duration, about 0.5 s later."""
    log: list[str] = []
    now = [T0.timestamp() + 9.5]
    b = candidate(kube, now, (10, 6, 4), on_started_leading=lambda: log.append("b+"))
    await put_lease(apiserver, "a", duration=10)
    loop = asyncio.get_running_loop()
    async with asyncio.TaskGroup() as tg:
        started = loop.time()
        task = tg.create_task(b.run())
        await eventually(lambda: b.holder == "a", what="b saw the lease")
        await asyncio.sleep(0.2)
        now[0] += 0.2
        assert not b.is_leader  # 0.3 s of the lease left on b's wall clock
        now[0] += 0.4  # the wall clock passes renewTime + duration while b sleeps
        await eventually(lambda: b.is_leader, within=3, what="b takes over")
        took = loop.time() - started
        task.cancel()
    assert took < 4, took  # before its first retry tick (4-4.8 s), let alone the observed 10 s
    assert log == ["b+"]


async def test_a_renew_time_ahead_of_the_candidates_clock_leaves_client_gos_bound(
    kube: KubeClient, apiserver: Any
) -> None:
    """The candidate's wall clock is 100 s behind the renewTime: it waits the whole lease from
    when it saw the record, as client-go (never sooner)."""
    now = [T0.timestamp() - 100]
    b = candidate(kube, now, (2, 1.5, 0.2))
    await put_lease(apiserver, "a", duration=2)
    loop = asyncio.get_running_loop()
    async with asyncio.TaskGroup() as tg:
        started = loop.time()
        task = tg.create_task(b.run())
        await eventually(lambda: b.holder == "a", what="b saw the lease")
        await asyncio.sleep(1.5)
        assert not b.is_leader
        await eventually(lambda: b.is_leader, within=5, what="b takes over")
        took = loop.time() - started
        task.cancel()
    assert took >= 2, took


async def test_a_released_lease_is_taken_at_once_not_on_the_retry_tick(kube: KubeClient) -> None:
    """The candidate watches the lease: the holder's release (SIGTERM, a rolling update) wakes it,
    so it takes over well before its 4 s retry tick."""
    log: list[str] = []
    slow: dict[str, Any] = {"lease_duration": 10.0, "renew_deadline": 6.0, "retry_period": 4.0}
    a = LeaderElector(kube, "kube-system", "hamid-scheduler", "a", **slow)
    b = LeaderElector(
        kube, "kube-system", "hamid-scheduler", "b", on_started_leading=lambda: log.append("b+"), **slow
    )
    loop = asyncio.get_running_loop()
    async with asyncio.TaskGroup() as tg:
        task_a = tg.create_task(a.run())
        await eventually(lambda: a.is_leader, what="a leads")
        task_b = tg.create_task(b.run())
        await eventually(lambda: b.holder == "a", what="b saw a's lease")
        await asyncio.sleep(0.3)  # b is waiting for its next tick, its watch open
        task_a.cancel()
        await asyncio.gather(task_a, return_exceptions=True)  # released on the way out
        released = loop.time()
        await eventually(lambda: b.is_leader, within=10, what="b takes the released lease")
        took = loop.time() - released
        task_b.cancel()
    assert took < 2.0, took
    assert log == ["b+"]


async def test_the_release_survives_a_renewal_that_landed_unseen(kube: KubeClient, apiserver: Any) -> None:
    """Cancelled while a renewal was in flight, the leader's copy of the lease is stale: its
    release meets a 409, reads the lease again and still hands it over."""
    a = elector(kube, "a", [])
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(a.run())
        await eventually(lambda: a.is_leader, what="a leads")
        task.cancel()
        # the renewal whose answer a never read: the stored lease moved past a's copy
        lease = apiserver.get("Lease", "kube-system", "hamid-scheduler")
        lease["spec"]["renewTime"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        apiserver.put(lease)
    released = await kube.get_lease("kube-system", "hamid-scheduler")
    assert released["spec"]["holderIdentity"] == ""


def _stamp() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


async def test_a_lease_another_term_held_is_not_renewed_into_the_same_term(
    kube: KubeClient, apiserver: Any
) -> None:
    """An HA audit: a leader frozen past its lease woke to find it released by the replica that
    led meanwhile, and took it back as a plain renewal: no new term, so it decided from a cache
    that had missed that term's writes (HAMi #2911). Now it steps down and starts a new term."""
    log: list[str] = []
    a = elector(kube, "a", log, release_on_cancel=False)
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(a.run())
        await eventually(lambda: a.is_leader, what="a leads")
        for holder in ("b", ""):  # b's term, then b's release, between two renewals of a
            lease = apiserver.get("Lease", "kube-system", "hamid-scheduler")
            transitions = int(lease["spec"].get("leaseTransitions") or 0) + 1
            lease["spec"].update(
                holderIdentity=holder, acquireTime=_stamp(), renewTime=_stamp(), leaseTransitions=transitions
            )
            apiserver.put(lease)
        await eventually(lambda: log == ["a+", "a-", "a+"], within=10, what="a new term")
        assert a.epoch.endswith("#3")
        task.cancel()


async def test_a_leader_whose_fence_lapsed_starts_a_new_term(
    kube: KubeClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pause longer than the lease (the fence lapsed) ends the term even when nobody took the
    lease meanwhile: what happened during the pause is unknown, so the term's caches resync."""
    log: list[str] = []
    a = elector(kube, "a", log)
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(a.run())
        await eventually(lambda: a.is_leader, what="a leads")
        real, paused = leader.fence_clock, FAST["lease_duration"]
        monkeypatch.setattr(leader, "fence_clock", lambda: real() + paused)
        await eventually(lambda: log == ["a+", "a-", "a+"], within=10, what="a new term")
        assert a.lease_invalid() == ""
        task.cancel()


async def test_a_holder_whose_wall_clock_steps_back_is_not_taken_over_while_it_decides(
    kube: KubeClient,
) -> None:
    """An HA audit: the holder's clock stepped back a minute (NTP, a VM restored from a
    snapshot), its renewals wrote a renewTime in the past, and the candidate's renewTime rule took
    the lease at once while the holder's monotonic fence still held: two deciders for 4 s."""
    timings: dict[str, Any] = {"lease_duration": 4.0, "renew_deadline": 3.0, "retry_period": 0.3}
    offset = [0.0]
    a = LeaderElector(
        kube, "kube-system", "hamid-scheduler", "a", clock=lambda: time.time() + offset[0], **timings
    )
    b = LeaderElector(kube, "kube-system", "hamid-scheduler", "b", **timings)
    loop = asyncio.get_running_loop()
    both = 0
    async with asyncio.TaskGroup() as tg:
        task_a = tg.create_task(a.run())
        await eventually(lambda: a.is_leader, what="a leads")
        task_b = tg.create_task(b.run())
        await eventually(lambda: b.holder == "a", what="b sees a's lease")
        offset[0] = -60.0
        until = loop.time() + 5.0
        while loop.time() < until:
            both += a.lease_invalid() == "" and b.lease_invalid() == ""
            await asyncio.sleep(0.01)
        assert a.is_leader and not b.is_leader
        task_a.cancel()
        task_b.cancel()
    assert both == 0


async def test_a_followers_fence_is_not_extended_by_a_step_of_its_wall_clock(
    kube: KubeClient, apiserver: Any
) -> None:
    """An HA audit: the follower's fence was renewTime + duration read on its wall clock; a step
    back of a minute extended it, and with its reads failing it decided long after the lease
    expired. The fence is also bounded by the duration from the read, on the monotonic clock."""
    offset = [0.0]
    a = LeaseFollower(
        kube,
        "kube-system",
        "kube-scheduler",
        "host-a",
        poll_interval=0.1,
        clock=lambda: time.time() + offset[0],
    )
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    spec = {"holderIdentity": "host-a_1", "leaseDurationSeconds": 2, "acquireTime": stamp, "renewTime": stamp}
    apiserver.put(
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": "kube-scheduler", "namespace": "kube-system"},
            "spec": spec,
        }
    )
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(a.run())
        await eventually(lambda: a.is_leader, what="a leads")
        offset[0] = -60.0
        await asyncio.sleep(0.4)  # reads with the stepped clock
        # the fence ends no later than the lease's 2 s from the last read on the monotonic clock
        # (it was renewTime + 2 s read on the stepped wall clock: a minute more)
        assert a.is_leader and a._valid_until - leader.fence_clock() <= 2.0
        task.cancel()


async def test_a_followers_term_survives_the_watchs_bookmarks() -> None:
    """A review: the lease watch asks for bookmarks, and a BOOKMARK (no spec) read as a release
    ended the term on every one (about once a minute on a real API server)."""
    server = ApiServer("127.0.0.1", 0, bookmark_interval=0.2)
    await server.start()
    try:
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        spec = {
            "holderIdentity": "host-a_1",
            "leaseDurationSeconds": 3600,
            "acquireTime": stamp,
            "renewTime": stamp,
        }
        server.put(
            {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": "kube-scheduler", "namespace": "kube-system"},
                "spec": spec,
            }
        )
        kube = await connect(api_server=server.url, request_timeout=5.0)
        log: list[str] = []
        a = LeaseFollower(
            kube,
            "kube-system",
            "kube-scheduler",
            "host-a",
            poll_interval=0.5,
            on_started_leading=lambda: log.append("+"),
            on_stopped_leading=lambda: log.append("-"),
        )
        task = asyncio.create_task(a.run())
        await asyncio.sleep(1.5)  # several bookmarks, nothing else
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await kube.close()
    finally:
        await server.stop()
    assert log == ["+", "-"]


class _LateAnswer:
    """A lease API whose second GET is served before a takeover and answered after the watch
    delivered it (an answer racing an event; a fault injected on purpose)."""

    def __init__(self) -> None:
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")

        def lease(holder: str, transitions: int) -> dict[str, Any]:
            spec = {"holderIdentity": holder, "leaseDurationSeconds": 15, "acquireTime": stamp}
            return {
                "metadata": {"name": "l"},
                "spec": {**spec, "renewTime": stamp, "leaseTransitions": transitions},
            }

        self.a, self.b = lease("host-a_1", 0), lease("host-b_2", 1)
        self.gets = 0
        self.events: asyncio.Queue[WatchEvent] = asyncio.Queue()
        self.delivered = asyncio.Event()

    async def get_lease(self, *_args: Any, **_kw: Any) -> dict[str, Any]:
        self.gets += 1
        if self.gets == 2:
            await self.events.put(WatchEvent("MODIFIED", self.b))
            await self.delivered.wait()
            return self.a
        return self.a if self.gets == 1 else self.b

    async def watch(self, *_args: Any, **_kw: Any) -> AsyncIterator[WatchEvent]:
        while True:
            event = await self.events.get()
            yield event
            await asyncio.sleep(0)
            self.delivered.set()


async def test_a_read_answered_before_a_takeover_does_not_revive_the_term() -> None:
    """A review: the watch ended the term, then a GET served earlier came back and started it again
    until the next poll: two deciders. A read sent before a change the watch applied is not taken."""
    api = _LateAnswer()
    log: list[str] = []
    a = LeaseFollower(
        api,  # type: ignore[arg-type]
        "kube-system",
        "l",
        "host-a",
        poll_interval=0.2,
        on_started_leading=lambda: log.append("+"),
        on_stopped_leading=lambda: log.append("-"),
    )
    task = asyncio.create_task(a.run())
    await eventually(lambda: api.gets >= 3, what="a read after the takeover")
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert log == ["+", "-"]
