"""Failure paths of /filter and /bind against the embedded API server with injected faults."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import datetime, timedelta
from typing import Any

import aiohttp
import pytest

from hamid import listen
from hamid.kube.errors import Timeout
from hamid.model import annotations as ann
from hamid.model import reasons as R
from hamid.scheduler.core import SchedulerSettings
from tests.integration.scheduler.harness import (
    Env,
    running_scheduler,
    wait_for,
)
from tests.unit.scheduler.helpers import container, pod

AL = ann.DEVICES_ALLOCATED


async def _cache_has(env: Env, name: str, version: str) -> None:
    await wait_for(
        lambda: (
            (env.scheduler.pods.get(f"default/{name}") or {}).get("metadata", {}).get("resourceVersion")
            == version
        )
    )


def _events(env: Env, reason: str) -> list[dict]:
    return [e for e in env.server.list("Event", "default") if e.get("reason") == reason]


def _node_annotations(env: Env, name: str = "n1") -> dict[str, str]:
    return env.server.get("Node", None, name)["metadata"].get("annotations") or {}


async def test_stale_event_during_a_refilter_patch_never_over_commits() -> None:
    """P moves gpu0 -> gpu1; an update still carrying gpu0 arrives while P's patch is in flight."""
    async with running_scheduler() as env:
        env.add_node("n1", gpus=2)
        await wait_for(lambda: "n1" in env.scheduler.ledger.nodes)
        big = [container("main", 1, 6000, 10)]  # one per 8000 MiB GPU
        p = await env.create_pod(pod("p", containers=big))
        assert (await env.filter(p, ["n1"]))["NodeNames"] == ["n1"]
        first = env.server.get("Pod", "default", "p")["metadata"]["annotations"][AL]
        old_gpu = first.split(",")[0]
        new_gpu = "n1-gpu1" if old_gpu == "n1-gpu0" else "n1-gpu0"
        env.server.patch("Node", None, "n1", {"metadata": {"annotations": {ann.DEVICE_CORDON: old_gpu}}})
        await wait_for(lambda: old_gpu in env.scheduler.ledger.nodes["n1"].usage.cordoned)
        uid = p["metadata"]["uid"]
        slow = env.server.faults.add_latency(1.0, verb="patch", path_pattern="/pods/p$")
        refilter = asyncio.create_task(env.filter(env.server.get("Pod", "default", "p"), ["n1"]))

        def pending_on_new_gpu() -> bool:
            res = env.scheduler.ledger.reservation(uid)
            return res is not None and res.pending and new_gpu in res.raw

        await wait_for(pending_on_new_gpu)
        stale = env.server.patch("Pod", "default", "p", {"metadata": {"labels": {"touched": "yes"}}})
        assert stale["metadata"]["annotations"][AL] == first  # the earlier allocation
        await _cache_has(env, "p", stale["metadata"]["resourceVersion"])
        q = await env.create_pod(pod("q", containers=big))
        answer = await env.filter(q, ["n1"])
        assert not answer.get("NodeNames"), answer  # gpu1 is P's: Q fits nowhere
        assert (await asyncio.wait_for(refilter, 10))["NodeNames"] == ["n1"]
        env.server.faults.remove(slow.id)
        used = env.scheduler.ledger.snapshot()["n1"]
        assert used[new_gpu] == (1, 6000, 10) and used[old_gpu] == (0, 0, 0)
        assert env.server.get("Pod", "default", "p")["metadata"]["annotations"][AL].startswith(new_gpu)


async def _filtered(env: Env, name: str = "a") -> dict:
    env.add_node("n1")
    await wait_for(lambda: "n1" in env.scheduler.ledger.nodes)
    p = await env.create_pod(pod(name))
    assert (await env.filter(p, ["n1"]))["NodeNames"] == ["n1"]
    return p


async def test_bind_answers_in_band_when_the_lock_release_fails_too() -> None:
    async with running_scheduler() as env:
        p = await _filtered(env)
        env.server.faults.fail_next(1, verb="create", path_pattern="/binding$", status=500)
        env.server.faults.fail_next(1, verb="get", path_pattern="/nodes/n1$", status=503)
        status, body = await env.post(
            env.extender,
            "/bind",
            {"PodName": "a", "PodNamespace": "default", "PodUID": p["metadata"]["uid"], "Node": "n1"},
        )
        assert status == 200 and "binding pod default/a to n1 failed" in body["Error"]
        await wait_for(lambda: bool(_events(env, R.EVENT_BINDING_FAILED)))
        assert "nodeName" not in env.server.get("Pod", "default", "a")["spec"]
        # the pod's retry owns the lock it could not release, and binds
        assert await env.bind(p, "n1") == ""


async def test_failed_binding_leaves_no_allocating_pod_nor_lock() -> None:
    async with running_scheduler() as env:
        p = await _filtered(env)
        env.server.faults.fail_next(1, verb="create", path_pattern="/binding$", status=504)
        error = await env.bind(p, "n1")
        assert "failed" in error
        annotations = env.server.get("Pod", "default", "a")["metadata"]["annotations"]
        assert ann.BIND_PHASE not in annotations and ann.BIND_TIME not in annotations
        assert ann.NODE_LOCK not in _node_annotations(env)
        assert env.scheduler.ledger.reservation(p["metadata"]["uid"]) is not None  # still filtered


async def test_binding_that_timed_out_but_landed_is_a_success() -> None:
    async with running_scheduler() as env:
        p = await _filtered(env)
        # the Binding lands but its answer is lost (a 504 from the API server's front)
        await env.kube.bind_pod("default", "a", p["metadata"]["uid"], "n1")
        env.server.faults.fail_next(1, verb="create", path_pattern="/binding$", status=504)
        assert await env.bind(p, "n1") == ""
        annotations = env.server.get("Pod", "default", "a")["metadata"]["annotations"]
        assert annotations[ann.BIND_PHASE] == ann.BIND_PHASE_ALLOCATING
        lock = ann.parse_node_lock(_node_annotations(env)[ann.NODE_LOCK])
        assert (lock.namespace, lock.name) == ("default", "a")  # kept for the plugin's Allocate


@pytest.mark.parametrize("unreadable", [1, 10])
async def test_a_binding_whose_outcome_stays_unknown_undoes_nothing(unreadable: int) -> None:
    """A fault audit: the Binding landed with its answer lost, and the one read back failed too;
    the undo then stripped the lock and bind-phase of a pod that was bound, and kube-scheduler
    never binds a bound pod again, so its Allocate could never be served. The read back is tried
    again through transient failures; while it stays unknown, nothing is undone."""
    async with running_scheduler() as env:
        p = await _filtered(env)
        await env.kube.bind_pod("default", "a", p["metadata"]["uid"], "n1")  # it landed ...
        env.server.faults.fail_next(1, verb="create", path_pattern="/binding$", status=504)  # ... unheard
        env.server.faults.fail_next(
            unreadable, verb="get", path_pattern="/namespaces/default/pods/a$", status=503
        )
        error = await env.bind(p, "n1")
        assert error == "" if unreadable == 1 else "outcome unknown" in error and "nothing undone" in error
        annotations = env.server.get("Pod", "default", "a")["metadata"]["annotations"]
        assert annotations[ann.BIND_PHASE] == ann.BIND_PHASE_ALLOCATING
        lock = ann.parse_node_lock(_node_annotations(env)[ann.NODE_LOCK])
        assert (lock.namespace, lock.name) == ("default", "a")  # for the plugin's Allocate


async def test_a_lock_take_whose_answer_was_lost_leaves_no_lock(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fault audit: the take landed, its answer did not; the bind failed and left the lock on
    the node after its pod was gone (invariant I4)."""
    async with running_scheduler() as env:
        p = await _filtered(env)
        kube = env.scheduler.locker.kube
        take = kube.patch_node_metadata

        async def landed_then_lost(name: str, **kw: Any) -> Any:
            await take(name, **kw)
            raise Timeout("PATCH nodes/n1: no answer within the timeout (injected)")

        monkeypatch.setattr(kube, "patch_node_metadata", landed_then_lost)
        error = await env.bind(p, "n1")
        monkeypatch.setattr(kube, "patch_node_metadata", take)
        assert "no answer" in error
        assert ann.NODE_LOCK not in _node_annotations(env)


async def test_a_bind_waiting_in_line_across_a_takeover_takes_no_lock() -> None:
    """A red team: a bind waiting for the lock when this replica lost its lease still took it
    (the fence was asked only before the wait), then answered fenced and left it on the node."""
    async with running_scheduler(SchedulerSettings(bind_wait_s=19.0)) as env:
        p = await _filtered(env)
        other = pod("other", annotations={ann.VGPU_NODE: "n1", ann.BIND_PHASE: ann.BIND_PHASE_ALLOCATING})
        other["spec"]["nodeName"] = "n1"
        env.server.put({"apiVersion": "v1", "kind": "Pod", **other})
        value = ann.format_node_lock(datetime.now().astimezone(), "default", "other")
        env.server.patch("Node", None, "n1", {"metadata": {"annotations": {ann.NODE_LOCK: value}}})
        await wait_for(
            lambda: (
                ann.NODE_LOCK
                in (env.scheduler.nodes.get("n1") or {}).get("metadata", {}).get("annotations", {})
            )
        )
        bind = asyncio.create_task(env.bind(p, "n1"))
        await wait_for(lambda: env.scheduler.locker.waiting("n1") == 1)
        env.scheduler.readiness.follow()  # another replica took the lease
        env.server.patch("Node", None, "n1", {"metadata": {"annotations": {ann.NODE_LOCK: None}}})
        error = await bind
        assert "lock not taken" in error
        assert ann.NODE_LOCK not in _node_annotations(env)
        assert ann.BIND_PHASE not in env.server.get("Pod", "default", "a")["metadata"]["annotations"]


async def test_a_bind_failing_after_a_takeover_undoes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """An HA audit: the Binding failed after this replica lost its lease, and the undo still
    stripped the node lock and bind-phase, which the new leader may have written again for the
    same pod (the lock is re-entrant). A fenced bind leaves them to the new term."""
    async with running_scheduler() as env:
        p = await _filtered(env)
        kube = env.scheduler.binder.kube

        async def taken_over_then_lost(*_args: Any, **_kw: Any) -> None:
            env.scheduler.readiness.follow()  # another replica took the lease meanwhile
            raise Timeout("POST binding: no answer within the timeout (injected)")

        monkeypatch.setattr(kube, "bind_pod", taken_over_then_lost)
        error = await env.bind(p, "n1")
        assert "nothing undone (not the leader)" in error
        annotations = env.server.get("Pod", "default", "a")["metadata"]["annotations"]
        assert annotations[ann.BIND_PHASE] == ann.BIND_PHASE_ALLOCATING
        lock = ann.parse_node_lock(_node_annotations(env)[ann.NODE_LOCK])
        assert (lock.namespace, lock.name) == ("default", "a")


def _holder_lock(env: Env, age: timedelta) -> None:
    """Node n1 locked ``age`` ago by pod ``holder``, still Pending and unallocated on n1."""
    env.server.put(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            **pod(
                "holder",
                annotations={ann.VGPU_NODE: "n1", ann.BIND_PHASE: ann.BIND_PHASE_ALLOCATING},
            ),
        }
    )
    value = ann.format_node_lock(datetime.now().astimezone() - age, "default", "holder")
    env.server.patch("Node", None, "n1", {"metadata": {"annotations": {ann.NODE_LOCK: value}}})


@pytest.mark.parametrize(("age_min", "taken"), [(10, False), (40, True)])
async def test_expired_lock_stays_with_a_pending_holder_until_the_max_hold(age_min: int, taken: bool) -> None:
    settings = SchedulerSettings(
        bind_wait_s=0.5, node_lock_timeout=timedelta(minutes=5), node_lock_max_hold=timedelta(minutes=30)
    )
    async with running_scheduler(settings) as env:
        p = await _filtered(env)
        _holder_lock(env, timedelta(minutes=age_min))
        await wait_for(lambda: env.scheduler.pods.get("default/holder") is not None)
        await wait_for(
            lambda: ann.NODE_LOCK in (env.scheduler.nodes.get("n1") or {})["metadata"]["annotations"]
        )
        error = await env.bind(p, "n1")
        lock = ann.parse_node_lock(_node_annotations(env)[ann.NODE_LOCK])
        if taken:
            assert error == "" and lock.name == "a"
        else:
            assert "node lock contention" in error and "--node-lock-max-hold" in error
            assert lock.name == "holder"


async def test_a_bind_cut_off_at_shutdown_undoes_its_lock_and_bind_phase(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The listener's grace ends while a bind's write hangs on the API server: the request is
    cancelled, and the bind, its own task, undoes its node lock and ``bind-phase`` while the
    replica still leads, instead of leaving them for the stall rule."""
    monkeypatch.setattr(listen, "SHUTDOWN_GRACE_S", 0.3)
    async with running_scheduler(SchedulerSettings(bind_wait_s=5.0)) as env:
        server, app = env.server, env.app
        p = await _filtered(env)
        hang = server.faults.add_latency(2.0, verb="patch", path_pattern="/pods/a/status$")
        bind = asyncio.create_task(env.bind(p, "n1"))

        def phase() -> str | None:
            return server.get("Pod", "default", "a")["metadata"]["annotations"].get(ann.BIND_PHASE)

        await wait_for(lambda: phase() == ann.BIND_PHASE_ALLOCATING)
        await asyncio.sleep(0.2)  # its booking's record in the status now hangs
        assert _node_annotations(env).get(ann.NODE_LOCK)  # held by the hanging bind
        await app.stop()
        with contextlib.suppress(aiohttp.ClientError, AssertionError):
            await bind
        server.faults.remove(hang.id)
        assert ann.NODE_LOCK not in _node_annotations(env)
        annotations = server.get("Pod", "default", "a")["metadata"]["annotations"]
        assert ann.BIND_PHASE not in annotations and ann.BIND_TIME not in annotations
        assert not server.get("Pod", "default", "a")["spec"].get("nodeName")


async def test_a_replayed_bind_of_a_bound_pod_undoes_nothing_when_cut_off_or_failing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """kube-scheduler retries a bind whose answer was lost, for a pod bound here and still waiting
    for Allocate: the bind goes on (its lock is re-entrant), and neither a failed write nor a cut
    at shutdown may strip the lock and bind-phase the plugin serves the pod by (found by this
    session's review: the pod was then never bound again and its Allocate refused)."""
    monkeypatch.setattr(listen, "SHUTDOWN_GRACE_S", 0.3)
    async with running_scheduler(SchedulerSettings(bind_wait_s=5.0)) as env:
        server, app = env.server, env.app
        env.add_node("n1")
        await wait_for(lambda: "n1" in env.scheduler.ledger.nodes)
        p = await env.create_pod(pod("a"))
        assert (await env.filter(p, ["n1"]))["NodeNames"] == ["n1"]
        assert await env.bind(p, "n1") == ""  # bound; waits for the plugin's Allocate
        assert server.get("Pod", "default", "a")["spec"]["nodeName"] == "n1"
        await wait_for(
            lambda: (env.scheduler.pods.get("default/a") or {}).get("spec", {}).get("nodeName") == "n1"
        )
        failed = server.faults.fail_next(1, verb="patch", path_pattern="/pods/a$", status=403)
        answer = await env.bind(p, "n1")
        assert "nothing undone (the pod is bound there)" in answer, answer
        server.faults.remove(failed.id)
        assert ann.NODE_LOCK in _node_annotations(env)
        hang = server.faults.add_latency(2.0, verb="patch", path_pattern="/pods/a/status$")
        replay = asyncio.create_task(env.bind(p, "n1"))
        await asyncio.sleep(0.3)
        await app.stop()
        with contextlib.suppress(aiohttp.ClientError, AssertionError):
            await replay
        server.faults.remove(hang.id)
        stored = server.get("Pod", "default", "a")
        assert stored["spec"]["nodeName"] == "n1"
        node = server.get("Node", None, "n1")["metadata"].get("annotations") or {}
        kept = (ann.NODE_LOCK in node, stored["metadata"]["annotations"].get(ann.BIND_PHASE))
        assert kept == (True, ann.BIND_PHASE_ALLOCATING), f"(lock kept, bind-phase) = {kept}"
