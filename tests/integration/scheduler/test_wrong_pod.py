"""Extender calls that name the wrong pod or node change nothing (issue 16)."""

from __future__ import annotations

from typing import Any

from hamid.scheduler.core import SchedulerSettings
from tests.integration.scheduler.harness import Env, running_scheduler, wait_for
from tests.unit.scheduler.helpers import pod

ALLOCATED = "hami.io/vgpu-devices-allocated"
LOCK = "hami.io/mutex.lock"


async def _placed(env: Env, name: str = "a") -> dict[str, Any]:
    if "n1" not in env.scheduler.ledger.nodes:
        env.add_node("n1")
        await wait_for(lambda: "n1" in env.scheduler.ledger.nodes)
    p = await env.create_pod(pod(name))
    assert (await env.filter(p, ["n1"]))["NodeNames"] == ["n1"]
    return p


def _booked(env: Env) -> int:
    return sum(u[0] for u in env.scheduler.ledger.snapshot()["n1"].values())


async def test_bind_to_an_unknown_node_or_for_a_missing_pod_keeps_the_reservation() -> None:
    async with running_scheduler() as env:
        p = await _placed(env)
        uid = p["metadata"]["uid"]
        assert "not found" in await env.bind(p, "ghost-node")
        ghost = {"metadata": {"name": "no-such-pod", "namespace": "default", "uid": uid}}
        assert "not found" in await env.bind(ghost, "n1")
        assert env.scheduler.ledger.reservation(uid) is not None and _booked(env) == 1


async def test_filter_never_replans_a_bound_or_running_pod_and_a_replayed_bind_takes_no_lock() -> None:
    async with running_scheduler(SchedulerSettings(bind_wait_s=2.0)) as env:
        p = await _placed(env)
        assert await env.bind(p, "n1") == ""
        await env.kube.patch_pod_status("default", "a", {"phase": "Running"})
        env.server.patch("Node", None, "n1", {"metadata": {"annotations": {LOCK: None}}})
        await wait_for(
            lambda: (env.scheduler.pods.get("default/a") or {}).get("status", {}).get("phase") == "Running"
        )
        await wait_for(
            lambda: LOCK not in (env.scheduler.nodes.get("n1") or {})["metadata"].get("annotations", {})
        )
        before = env.server.get("Pod", "default", "a")["metadata"]["annotations"][ALLOCATED]
        body = await env.filter(env.server.get("Pod", "default", "a"), ["n1"])
        assert "already bound to n1" in body["Error"]
        body = await env.filter(p, ["n1"])  # kube-scheduler's stale copy: the cache knows better
        assert "already bound to n1" in body["Error"]
        assert env.server.get("Pod", "default", "a")["metadata"]["annotations"][ALLOCATED] == before
        assert await env.bind(p, "n1") == ""  # replayed: success, and the lock is not taken again
        assert LOCK not in (env.server.get("Node", None, "n1")["metadata"].get("annotations") or {})
        assert "already bound to n1" in await env.bind(p, "n2")


async def test_filter_patch_is_bound_to_the_uid_across_delete_and_recreate() -> None:
    async with running_scheduler() as env:
        env.add_node("n1")
        await wait_for(lambda: "n1" in env.scheduler.ledger.nodes)
        old = await env.create_pod(pod("a"))
        await env.kube.delete_pod("default", "a", grace_period_seconds=0)
        new = await env.create_pod(pod("a"))
        assert new["metadata"]["uid"] != old["metadata"]["uid"]
        body = await env.filter(old, ["n1"])
        assert "patching pod default/a failed" in body["Error"] and "Precondition" in body["Error"]
        stored = env.server.get("Pod", "default", "a")
        assert ALLOCATED not in (stored["metadata"].get("annotations") or {})
        assert env.scheduler.ledger.reservation(old["metadata"]["uid"]) is None and _booked(env) == 0


async def test_a_filter_patch_failing_with_any_error_leaves_no_reservation() -> None:
    async with running_scheduler() as env:
        env.add_node("n1")
        await wait_for(lambda: "n1" in env.scheduler.ledger.nodes)
        p = await env.create_pod(pod("a"))
        no_namespace = {**p, "metadata": {k: v for k, v in p["metadata"].items() if k != "namespace"}}
        assert "no metadata.namespace" in (await env.filter(no_namespace, ["n1"]))["Error"]

        async def broken(*_args: Any, **_kw: Any) -> Any:  # a deliberately injected non-API fault
            raise RuntimeError("injected")

        env.scheduler.kube.patch_pod_metadata = broken  # type: ignore[method-assign]
        assert "injected" in (await env.filter(p, ["n1"]))["Error"]
        assert env.scheduler.ledger.reservation(p["metadata"]["uid"]) is None and _booked(env) == 0
