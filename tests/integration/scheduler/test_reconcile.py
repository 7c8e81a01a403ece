"""The periodic reconcile against the embedded API server: missed watch events are repaired.

The scheduler's caches run as separate tasks here so a test can stop the pod watch (a watch gap)
and change pods behind it with the server's Python API.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from itertools import count
from typing import Any

import pytest

from hamid.fit.usage import DeviceAmount
from hamid.kube.client import connect
from hamid.model import annotations as ann
from hamid.scheduler.core import Scheduler, SchedulerSettings
from hamid.scheduler.ledger import Ledger
from hamid.scheduler.reconcile import DRIFT_CHANGED, DRIFT_LEAKED, Reconciler
from hamid.scheduler.signing import AllocationKeys
from hamidsim.apiserver import ApiServer
from tests.integration.scheduler.harness import wait_for
from tests.unit.scheduler.helpers import node, placed, pod

GPU0 = "n1-gpu0,NVIDIA,1000,10:;"
GPU1 = "n1-gpu1,NVIDIA,1000,10:;"


@dataclass
class Setup:
    """A scheduler whose caches run as separate tasks, and a reconciler with a short catch-up."""

    server: ApiServer
    scheduler: Scheduler
    tasks: dict[str, asyncio.Task[None]]
    reconciler: Reconciler

    async def stop_pod_watch(self) -> None:
        """From now on the scheduler misses every pod event (a watch that never resumes)."""
        task = self.tasks.pop("pods")
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def create(self, p: dict[str, Any]) -> str:
        """Create a pod through the API; its UID once the scheduler's cache has it."""
        created = await self.scheduler.kube.create_pod({"apiVersion": "v1", "kind": "Pod", **p})
        key = f"{created['metadata']['namespace']}/{created['metadata']['name']}"
        await wait_for(lambda: self.scheduler.pods.get(key) is not None)
        return str(created["metadata"]["uid"])

    def drift_count(self, kind: str) -> float:
        value = self.scheduler.metrics.registry.get_sample_value(
            "hamid_reconcile_drift_total", {"kind": kind}
        )
        return value or 0.0


@contextlib.asynccontextmanager
async def setup(
    server: ApiServer, interval: float = 0.0, keys: AllocationKeys | None = None
) -> AsyncIterator[Setup]:
    """Node n1 with 2 GPUs; with ``interval`` > 0 ``Scheduler.run`` runs (caches, reconcile loop)."""
    server.put({"apiVersion": "v1", "kind": "Node", **node("n1")})
    kube = await connect(api_server=server.url, request_timeout=5.0)
    scheduler = Scheduler(kube, settings=SchedulerSettings(reconcile_interval_s=interval), keys=keys)
    caches = {"pods": scheduler.pods, "nodes": scheduler.nodes, "quotas": scheduler.quotas}
    if interval > 0:
        tasks = {"scheduler": asyncio.create_task(scheduler.run())}
    else:
        tasks = {name: asyncio.create_task(cache.run()) for name, cache in caches.items()}
    try:
        for cache in caches.values():
            await cache.wait_synced(10)
        await wait_for(lambda: "n1" in scheduler.ledger.nodes)
        yield Setup(server, scheduler, tasks, Reconciler(scheduler, catch_up_s=0.1))
    finally:
        for task in tasks.values():
            task.cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
        await scheduler.close()
        await kube.close()


def drift_warnings(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in logs if e["event"] == "reconcile_drift" and e["log_level"] == "warning"]


async def test_dropped_delete_is_repaired_by_one_run(
    apiserver: ApiServer, logs: list[dict[str, Any]]
) -> None:
    async with setup(apiserver) as env:
        state = env.scheduler.state
        uid = await env.create(placed(pod("a"), "n1", GPU0))
        await wait_for(lambda: state.ledger.reservation(uid) is not None)
        await env.stop_pod_watch()
        assert apiserver.delete("Pod", "default", "a") is not None
        assert state.ledger.snapshot()["n1"]["n1-gpu0"] == (1, 1000, 10)  # the delete was missed

        report = await env.reconciler.reconcile_once()

        assert report is not None
        assert [(d.kind, d.pod, d.uid) for d in report.drifts] == [(DRIFT_LEAKED, "default/a", uid)]
        assert state.ledger.reservation(uid) is None
        assert env.scheduler.pods.get("default/a") is None  # the cache forgot it too (node-lock checks)
        assert state.ledger.snapshot()["n1"]["n1-gpu0"] == (0, 0, 0)
        assert env.drift_count(DRIFT_LEAKED) == 1
        [warning] = drift_warnings(logs)
        assert (warning["pod"], warning["node"], warning["kind"]) == ("default/a", "n1", DRIFT_LEAKED)
        assert warning["difference"] == {"n1-gpu0": [1, 1000, 10]}


async def test_allocation_changed_behind_the_cache_is_never_booked(
    apiserver: ApiServer, logs: list[dict[str, Any]]
) -> None:
    """A change the watch missed that the scheduler did not make (a tenant's, past admission) does
    not move the booking: the reconcile judges the list by the ledger's own rules (docs/trust.md)."""
    async with setup(apiserver) as env:
        state = env.scheduler.state
        uid = await env.create(placed(pod("a"), "n1", GPU0))
        await wait_for(lambda: state.ledger.reservation(uid) is not None)
        await env.stop_pod_watch()
        moved = {ann.DEVICES_ALLOCATED: GPU1, ann.DEVICES_TO_ALLOCATE: GPU1}
        apiserver.patch("Pod", "default", "a", {"metadata": {"annotations": moved}})

        report = await env.reconciler.reconcile_once()

        assert report is not None and report.drifts == []
        res = state.ledger.reservation(uid)
        assert res is not None and res.raw == GPU0
        assert state.ledger.snapshot()["n1"] == {"n1-gpu0": (1, 1000, 10), "n1-gpu1": (0, 0, 0)}
        assert env.drift_count(DRIFT_CHANGED) == 0 and drift_warnings(logs) == []


async def test_pending_reservations_survive(apiserver: ApiServer) -> None:
    async with setup(apiserver) as env:
        state = env.scheduler.state
        uid_a = await env.create(pod("a"))
        uid_b = await env.create(pod("b"))
        a, b = env.scheduler.pods.get("default/a"), env.scheduler.pods.get("default/b")
        assert a is not None and b is not None
        layout0, layout1 = tuple(ann.decode_pod_devices(GPU0)), tuple(ann.decode_pod_devices(GPU1))
        state.ledger.reserve(a, "n1", layout0, GPU0)  # a filter whose patch is still in flight

        run = asyncio.create_task(env.reconciler.reconcile_once())
        await asyncio.sleep(0)  # the run has asked for its list
        state.ledger.reserve(b, "n1", layout1, GPU1)  # a filter after the list was requested ...
        state.ledger.confirm(uid_b, "n1", GPU1)  # ... whose patch succeeded: not in the list either
        report = await run

        # the shadow starts from both bookings and the listed pods (without allocation) keep them
        assert report is not None and report.drifts == []
        res_a, res_b = state.ledger.reservation(uid_a), state.ledger.reservation(uid_b)
        assert res_a is not None and res_a.pending
        assert res_b is not None and not res_b.pending
        assert state.ledger.snapshot()["n1"] == {"n1-gpu0": (1, 1000, 10), "n1-gpu1": (1, 1000, 10)}


async def test_no_drift_no_change_no_warning(apiserver: ApiServer, logs: list[dict[str, Any]]) -> None:
    async with setup(apiserver) as env:
        state = env.scheduler.state
        uids = [
            await env.create(placed(pod("a"), "n1", GPU0)),
            await env.create(placed(pod("b"), "n1", GPU1)),
            await env.create(pod("cpu", containers=[{"name": "c", "image": "busybox"}])),
        ]
        await wait_for(lambda: all(state.ledger.reservation(u) is not None for u in uids[:2]))
        before = state.ledger.snapshot()
        held = [state.ledger.reservation(u) for u in uids]

        report = await env.reconciler.reconcile_once()

        assert report is not None and report.drifts == []
        assert (report.pods, report.reservations, report.gpus) == (3, 2, 2)
        assert state.ledger.snapshot() == before
        assert [state.ledger.reservation(u) for u in uids] == held
        assert drift_warnings(logs) == []
        assert not [e for e in logs if e["log_level"] == "warning"]
        [done] = [e for e in logs if e["event"] == "reconcile_done"]
        assert (done["pods"], done["drifts"], done["log_level"]) == (3, 0, "info")
        registry = env.scheduler.metrics.registry
        assert registry.get_sample_value("hamid_reconcile_runs_total", {"outcome": "clean"}) == 1
        assert registry.get_sample_value("hamid_reconcile_duration_seconds_count") == 1
        assert sum(env.drift_count(k) for k in ("missing", "changed", "leaked", "gpu")) == 0


async def test_followers_do_not_reconcile(apiserver: ApiServer) -> None:
    async with setup(apiserver) as env:
        s = env.scheduler
        uid = await env.create(placed(pod("a"), "n1", GPU0))
        await wait_for(lambda: s.ledger.reservation(uid) is not None)
        await env.stop_pod_watch()
        apiserver.delete("Pod", "default", "a")
        lists = apiserver.requests["list pods"]

        s.readiness.follow()
        assert await env.reconciler.reconcile_once() is None
        s.readiness.lead()  # a new term whose caches have not caught up
        assert await env.reconciler.reconcile_once() is None

        assert apiserver.requests["list pods"] == lists  # not even listed
        assert s.ledger.reservation(uid) is not None
        s.readiness.caught_up()
        report = await env.reconciler.reconcile_once()
        assert report is not None and s.ledger.reservation(uid) is None


async def test_scheduler_run_owns_the_loop(apiserver: ApiServer) -> None:
    async with setup(apiserver, interval=0.05) as env:
        s = env.scheduler
        s.ledger.nodes["n1"].usage.add({"n1-gpu1": DeviceAmount(1, 4000, 40)})  # corrupted usage
        await wait_for(lambda: s.ledger.snapshot()["n1"]["n1-gpu1"] == (0, 0, 0))
        assert env.drift_count("gpu") == 1
        run = env.tasks.pop("scheduler")
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run
        assert run.cancelled()  # the TaskGroup ended cleanly on cancellation


async def test_a_hostile_signature_ends_nothing(apiserver: ApiServer, logs: list[dict[str, Any]]) -> None:
    """A tenant's pod of another scheduler (admission leaves those alone) carrying hamid's
    annotations with an issue time written in a digit ``int`` refuses (``'²'``) once made the
    ledger raise, and the reconcile let that end the scheduler. It is merely unsigned now."""
    keys = AllocationKeys((b"test-key-0123456789abcdef0123456789",))
    async with setup(apiserver, interval=0.05, keys=keys) as env:
        hostile = placed(pod("hostile"), "n1", GPU0)
        hostile["metadata"]["annotations"][ann.ALLOCATION_SIGNATURE] = "v1:00000000:\u00b2:00"
        hostile["spec"]["schedulerName"] = "another-scheduler"
        uid = await env.create(hostile)
        sample = env.scheduler.metrics.registry.get_sample_value

        def clean_runs() -> float:
            return sample("hamid_reconcile_runs_total", {"outcome": "clean"}) or 0.0

        runs = clean_runs()
        await wait_for(lambda: clean_runs() >= runs + 2)
        assert not env.tasks["scheduler"].done()
        assert env.scheduler.ledger.reservation(uid) is None  # foreign: booked nothing
        assert not [e for e in logs if e["event"] in ("cache_callback_failed", "reconcile_failed")]


async def test_a_pod_the_ledger_cannot_read_stops_neither_the_reconcile_nor_the_scheduler(
    apiserver: ApiServer, logs: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Faults injected on purpose: the ledger raises on one pod, and one whole reconcile raises.
    Each is logged; the loop goes on and still repairs what it should."""
    on_pod = Ledger.on_pod

    def cursed(self: Ledger, p: Any) -> None:
        if p["metadata"]["name"] == "cursed":
            raise RuntimeError("a defect reading this pod")
        on_pod(self, p)

    monkeypatch.setattr(Ledger, "on_pod", cursed)
    reconcile_once = Reconciler.reconcile_once
    calls = count()

    async def first_fails(self: Reconciler) -> Any:
        if next(calls) == 0:
            raise RuntimeError("a defect in the reconcile")
        return await reconcile_once(self)

    monkeypatch.setattr(Reconciler, "reconcile_once", first_fails)
    async with setup(apiserver, interval=0.05) as env:
        await env.create(placed(pod("cursed"), "n1", GPU1))
        uid = await env.create(placed(pod("a"), "n1", GPU0))
        s = env.scheduler
        await wait_for(lambda: s.ledger.reservation(uid) is not None)
        s.ledger.nodes["n1"].usage.add({"n1-gpu1": DeviceAmount(1, 4000, 40)})  # corrupted usage
        await wait_for(lambda: s.ledger.snapshot()["n1"]["n1-gpu1"] == (0, 0, 0))
        assert not env.tasks["scheduler"].done()
        events = {e["event"] for e in logs}
        assert {"reconcile_failed", "reconcile_pod_unreadable"} <= events
