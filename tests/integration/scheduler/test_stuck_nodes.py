"""A node whose kubelet never admits its bound pod: the holder loses the node lock once it makes no
progress, and a node whose binds keep failing stops winning pods (issue 16, binpack loop)."""

from __future__ import annotations

import time
from datetime import datetime, timedelta

from hamid.model import annotations as ann
from hamid.scheduler.core import SchedulerSettings
from tests.integration.scheduler.harness import Env, running_scheduler, wait_for
from tests.unit.scheduler.helpers import container, pod


def _stuck_holder(env: Env, node: str = "n1") -> None:
    """Pod ``holder`` bound to ``node`` with its GPU booked, never admitted; it holds the node's lock."""
    holder = pod(
        "holder",
        containers=[container("main", 1, 1000, 10)],
        annotations={
            ann.VGPU_NODE: node,
            ann.DEVICES_ALLOCATED: f"{node}-gpu0,NVIDIA,1000,10:;",
            ann.DEVICES_TO_ALLOCATE: f"{node}-gpu0,NVIDIA,1000,10:;",
            ann.BIND_PHASE: ann.BIND_PHASE_ALLOCATING,
        },
    )
    holder["spec"]["nodeName"] = node
    env.server.put({"apiVersion": "v1", "kind": "Pod", **holder})
    value = ann.format_node_lock(datetime.now().astimezone(), "default", "holder")
    env.server.patch("Node", None, node, {"metadata": {"annotations": {ann.NODE_LOCK: value}}})


async def _locked(env: Env, node: str = "n1") -> None:
    await wait_for(lambda: env.scheduler.pods.get("default/holder") is not None)
    await wait_for(lambda: ann.NODE_LOCK in (env.scheduler.nodes.get(node) or {})["metadata"]["annotations"])


async def test_a_holder_without_progress_loses_the_lock_long_before_the_max_hold() -> None:
    settings = SchedulerSettings(bind_wait_s=5.0, node_lock_stall=timedelta(seconds=1))
    async with running_scheduler(settings) as env:
        env.add_node("n1")
        await wait_for(lambda: "n1" in env.scheduler.ledger.nodes)
        _stuck_holder(env)
        await _locked(env)
        p = await env.create_pod(pod("a"))
        assert (await env.filter(p, ["n1"]))["NodeNames"] == ["n1"]
        started = time.monotonic()
        assert await env.bind(p, "n1") == ""
        assert 1.0 <= time.monotonic() - started < 5.0
        lock = ann.parse_node_lock(
            env.server.get("Node", None, "n1")["metadata"]["annotations"][ann.NODE_LOCK]
        )
        assert lock.name == "a"


async def test_a_node_whose_binds_fail_stops_winning_under_binpack() -> None:
    settings = SchedulerSettings(bind_wait_s=0.3, node_lock_stall=None, node_policy="binpack")
    async with running_scheduler(settings) as env:
        for name in ("n1", "n2"):
            env.add_node(name)
        await wait_for(lambda: {"n1", "n2"} <= env.scheduler.ledger.nodes.keys())
        _stuck_holder(env)
        await _locked(env)
        await wait_for(lambda: env.scheduler.ledger.snapshot()["n1"]["n1-gpu0"] == (1, 1000, 10))
        p = await env.create_pod(pod("a"))
        # binpack: n1 (holder's GPU booked) beats the empty n2
        assert (await env.filter(p, ["n1", "n2"]))["NodeNames"] == ["n1"]
        assert "node lock contention" in await env.bind(p, "n1")
        p = env.server.get("Pod", "default", "a")
        assert (await env.filter(p, ["n1", "n2"]))["NodeNames"] == ["n2"]
        assert await env.bind(p, "n2") == ""
        assert env.scheduler.bind_backoff.failures("n2") == 0  # a bind that worked clears it
        assert env.scheduler.bind_backoff.failures("n1") == 1
