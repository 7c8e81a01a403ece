"""Binds waiting for one node's lock queue in arrival order: each release costs the next bind one
PATCH, not a conflicting PATCH and a GET from every waiting bind (issue 17)."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import datetime

import pytest

from hamid.model import annotations as ann
from hamid.scheduler.core import SchedulerSettings
from hamid.scheduler.nodelock import LockContention
from tests.integration.scheduler.harness import Env, running_scheduler, wait_for
from tests.unit.scheduler.helpers import container, pod

PODS = 6


def _holder(env: Env) -> str | None:
    value = (env.server.get("Node", None, "n1") or {})["metadata"].get("annotations", {}).get(ann.NODE_LOCK)
    return None if value is None else ann.parse_node_lock(value).name


def _release(env: Env) -> None:
    """What the plugin does once the holder is allocated: remove the lock."""
    env.server.patch("Node", None, "n1", {"metadata": {"annotations": {ann.NODE_LOCK: None}}})


def _node_calls(env: Env) -> Counter[str]:
    """Count GET and PATCH of Node n1 as the API server receives them."""
    calls: Counter[str] = Counter()
    faults = env.server.faults
    inner = faults.before

    async def before(verb: str, method: str, path: str) -> None:
        if path == "/api/v1/nodes/n1":
            calls[verb] += 1
        await inner(verb, method, path)

    faults.before = before  # type: ignore[method-assign]
    return calls


def _foreign_lock(env: Env, name: str) -> None:
    """Another scheduler (or HAMi) holds the lock for its pod, bound and waiting for Allocate."""
    holder = pod(name, annotations={ann.VGPU_NODE: "n1", ann.BIND_PHASE: ann.BIND_PHASE_ALLOCATING})
    holder["spec"]["nodeName"] = "n1"
    env.server.put({"apiVersion": "v1", "kind": "Pod", **holder})
    value = ann.format_node_lock(datetime.now().astimezone(), "default", name)
    env.server.patch("Node", None, "n1", {"metadata": {"annotations": {ann.NODE_LOCK: value}}})


async def test_waiting_binds_get_the_lock_in_arrival_order_one_patch_each() -> None:
    async with running_scheduler(SchedulerSettings(bind_wait_s=19.0)) as env:
        env.add_node("n1", gpus=PODS)
        await wait_for(lambda: "n1" in env.scheduler.ledger.nodes)
        pods = [
            await env.create_pod(pod(f"p{i}", containers=[container("c", 1, 100, 1)])) for i in range(PODS)
        ]
        calls = _node_calls(env)
        binds = []
        for i, p in enumerate(pods):
            assert (await env.filter(p, ["n1"]))["NodeNames"] == ["n1"]
            binds.append(asyncio.create_task(env.bind(p, "n1")))
            if i == 0:
                await wait_for(lambda: _holder(env) == "p0")
            else:
                await wait_for(lambda i=i: env.scheduler.locker.waiting("n1") == i)
        order = []
        for i in range(PODS):
            await wait_for(lambda i=i: _holder(env) == f"p{i}")
            order.append(_holder(env))
            await wait_for(
                lambda: env.scheduler.nodes.get("n1")["metadata"]["annotations"].get(ann.NODE_LOCK)
            )
            _release(env)
        assert await asyncio.gather(*binds) == [""] * PODS
        assert order == [f"p{i}" for i in range(PODS)]
        # One take per pod; before the line, every release cost each waiting bind a PATCH and a GET.
        assert calls["patch"] + calls["get"] <= PODS + 2, calls
        assert env.scheduler.locker.waiting("n1") == 0


async def test_a_bind_whose_wait_ends_in_line_leaves_it_and_the_next_keeps_its_turn() -> None:
    async with running_scheduler(SchedulerSettings(node_lock_stall=None)) as env:
        env.add_node("n1")
        await wait_for(lambda: "n1" in env.scheduler.ledger.nodes)
        _foreign_lock(env, "elsewhere")
        await wait_for(lambda: env.scheduler.pods.get("default/elsewhere") is not None)
        await wait_for(lambda: ann.NODE_LOCK in env.scheduler.nodes.get("n1")["metadata"]["annotations"])
        locker = env.scheduler.locker
        first = asyncio.create_task(locker.acquire("n1", "default", "a", 10.0))
        await wait_for(lambda: locker.waiting("n1") == 1)
        third = asyncio.create_task(locker.acquire("n1", "default", "c", 10.0))
        await wait_for(lambda: locker.waiting("n1") == 2)
        with pytest.raises(LockContention, match="2 binds were ahead in line"):
            await locker.acquire("n1", "default", "b", 0.3)
        assert locker.waiting("n1") == 2
        _release(env)
        await first
        assert _holder(env) == "a"
        # A replayed bind of the holder does not queue behind the waiting one.
        assert await locker.acquire("n1", "default", "a", 1.0) == 0.0
        assert not third.done()
        _release(env)
        await third
        assert _holder(env) == "c"
        assert locker.waiting("n1") == 0


async def test_the_line_does_not_replace_the_api_guard() -> None:
    """Another scheduler takes the lock right after a release: whether this scheduler's cache shows
    the release first (the take is then refused by its resourceVersion precondition and the fresh
    read shows the new holder) or both at once, the bind first in line waits for the new holder."""
    async with running_scheduler(SchedulerSettings(node_lock_stall=None)) as env:
        env.add_node("n1")
        await wait_for(lambda: "n1" in env.scheduler.ledger.nodes)
        _foreign_lock(env, "first")
        await wait_for(lambda: env.scheduler.pods.get("default/first") is not None)
        await wait_for(lambda: ann.NODE_LOCK in env.scheduler.nodes.get("n1")["metadata"]["annotations"])
        locker = env.scheduler.locker
        waiting = asyncio.create_task(locker.acquire("n1", "default", "b", 10.0))
        await wait_for(lambda: locker.waiting("n1") == 1)
        _release(env)
        _foreign_lock(env, "second")
        await asyncio.sleep(0.3)
        assert _holder(env) == "second"
        assert not waiting.done()
        _release(env)
        await waiting
        assert _holder(env) == "b"
