"""/filter and /bind over real HTTP against the embedded API server."""

from __future__ import annotations

import asyncio
import gc

from hamid.model import annotations as ann
from hamid.model import reasons as R
from hamid.model.annotations import parse_node_lock
from hamid.model.booked import booked_record
from hamid.scheduler.core import SchedulerSettings
from tests.integration.scheduler.harness import Env, running_scheduler, wait_for
from tests.unit.scheduler.helpers import container, pod


async def _node_synced(env: Env, name: str) -> None:
    await wait_for(lambda: name in env.scheduler.ledger.nodes)


async def test_filter_node_names_patches_pod() -> None:
    async with running_scheduler() as env:
        env.add_node("n1")
        await _node_synced(env, "n1")
        p = await env.create_pod(pod("a"))
        body = await env.filter(p, ["n1", "ghost"])
        assert body["NodeNames"] == ["n1"]
        assert body["FailedNodes"] == {"ghost": R.NODE_UNREGISTERED}
        stored = env.server.get("Pod", "default", "a")
        annos = stored["metadata"]["annotations"]
        assert annos[ann.VGPU_NODE] == "n1" and stored["metadata"]["labels"][ann.VGPU_NODE] == "n1"
        assert annos[ann.DEVICES_ALLOCATED] == annos[ann.DEVICES_TO_ALLOCATE]
        assert annos[ann.DEVICES_ALLOCATED].endswith(",NVIDIA,1000,10:;")
        assert int(annos[ann.VGPU_TIME]) > 0
        used = env.scheduler.ledger.snapshot()["n1"]
        assert sorted(used.values()) == [(0, 0, 0), (1, 1000, 10)]


async def test_filter_full_nodes_mode_and_unfit_reasons() -> None:
    async with running_scheduler() as env:
        env.add_node("n1", gpus=1)
        await _node_synced(env, "n1")
        p = await env.create_pod(pod("a"))
        nodes = {"metadata": {}, "items": [{"metadata": {"name": "n1"}}, {"metadata": {"name": "n2"}}]}
        status, body = await env.post(env.extender, "/filter", {"pod": p, "nodes": nodes})
        assert status == 200 and [n["metadata"]["name"] for n in body["Nodes"]["items"]] == ["n1"]
        big = await env.create_pod(pod("big", containers=[container("c", 1, 9000, 10)]))
        body = await env.filter(big, ["n1"])
        assert body.get("NodeNames") is None
        assert body["FailedNodes"] == {"n1": "1/1 CardInsufficientMemory"}


async def test_pass_through_for_pods_without_gpu() -> None:
    async with running_scheduler() as env:
        p = await env.create_pod(pod("cpu", containers=[container("c")]))
        body = await env.filter(p, ["x", "y"])
        assert body["NodeNames"] == ["x", "y"] and not body.get("Error")
        assert ann.VGPU_NODE not in env.server.get("Pod", "default", "cpu")["metadata"]["annotations"]


async def test_patch_failure_rolls_back() -> None:
    async with running_scheduler() as env:
        env.add_node("n1")
        await _node_synced(env, "n1")
        p = await env.create_pod(pod("a"))
        env.server.faults.fail_next(1, verb="patch", path_pattern="/pods/a$", status=500)
        body = await env.filter(p, ["n1"])
        assert "patching pod default/a failed" in body["Error"]
        assert env.scheduler.ledger.reservation(p["metadata"]["uid"]) is None
        assert set(env.scheduler.ledger.snapshot()["n1"].values()) == {(0, 0, 0)}
        body = await env.filter(p, ["n1"])  # a retry works and books once
        assert body["NodeNames"] == ["n1"]
        assert sorted(env.scheduler.ledger.snapshot()["n1"].values()) == [(0, 0, 0), (1, 1000, 10)]


async def test_concurrent_filters_never_overcommit() -> None:
    async with running_scheduler() as env:
        env.add_node("n1", gpus=2)  # 2 x 8000 MiB
        await _node_synced(env, "n1")
        env.server.faults.add_latency(0.02, verb="patch")
        pods = [
            await env.create_pod(pod(f"p{i}", containers=[container("c", 1, 3000, 10)])) for i in range(8)
        ]
        results = await asyncio.gather(*(env.filter(p, ["n1"]) for p in pods))
        fitted = [r for r in results if r.get("NodeNames") == ["n1"]]
        assert len(fitted) == 4  # 2 per GPU
        for used in env.scheduler.ledger.snapshot()["n1"].values():
            assert used[1] <= 8000


async def test_bind_takes_node_lock_and_binds() -> None:
    async with running_scheduler() as env:
        env.add_node("n1")
        await _node_synced(env, "n1")
        p = await env.create_pod(pod("a"))
        assert (await env.filter(p, ["n1"]))["NodeNames"] == ["n1"]
        assert await env.bind(p, "n1") == ""
        stored = env.server.get("Pod", "default", "a")
        assert stored["spec"]["nodeName"] == "n1"
        assert stored["metadata"]["annotations"][ann.BIND_PHASE] == ann.BIND_PHASE_ALLOCATING
        # unsigned, the booking is still recorded in the status (the plugin's proof of hamid's bind)
        record = booked_record(stored)
        assert record is not None and record.node == "n1" and record.signature == ""
        assert record.allocated == stored["metadata"]["annotations"][ann.DEVICES_ALLOCATED]
        lock = parse_node_lock(env.server.get("Node", None, "n1")["metadata"]["annotations"][ann.NODE_LOCK])
        assert (lock.namespace, lock.name) == ("default", "a")
        # a retried bind of a pod already bound here (its first answer lost) succeeds, lock kept
        assert await env.bind(p, "n1") == ""
        lock = parse_node_lock(env.server.get("Node", None, "n1")["metadata"]["annotations"][ann.NODE_LOCK])
        assert (lock.namespace, lock.name) == ("default", "a")
        stored = env.server.get("Pod", "default", "a")
        assert stored["metadata"]["annotations"][ann.BIND_PHASE] == ann.BIND_PHASE_ALLOCATING


async def test_bind_without_reservation_is_refused() -> None:
    async with running_scheduler() as env:
        env.add_node("n1")
        await _node_synced(env, "n1")
        p = await env.create_pod(pod("a"))
        error = await env.bind(p, "n1")
        assert "no GPU reservation" in error
        assert "nodeName" not in env.server.get("Pod", "default", "a")["spec"]


async def _fake_plugin(env: Env, node: str, stop: asyncio.Event) -> int:
    """Act as the device plugin's Allocate: finish the lock holder once it is bound, release its lock."""
    served = 0
    while not stop.is_set():
        annotations = env.server.get("Node", None, node)["metadata"].get("annotations") or {}
        value = annotations.get(ann.NODE_LOCK)
        if value:
            lock = parse_node_lock(value)
            holder = env.server.get("Pod", lock.namespace, lock.name)
            if holder is not None and holder["spec"].get("nodeName") == node:
                env.server.patch(
                    "Pod",
                    lock.namespace,
                    lock.name,
                    {"metadata": {"annotations": {ann.BIND_PHASE: "success"}}},
                )
                env.server.patch("Node", None, node, {"metadata": {"annotations": {ann.NODE_LOCK: None}}})
                served += 1
        await asyncio.sleep(0.01)
    return served


async def test_forty_pods_one_node_all_bind() -> None:
    async with running_scheduler() as env:
        env.add_node("big", gpus=8)
        await _node_synced(env, "big")
        pods = [
            await env.create_pod(pod(f"w{i}", containers=[container("c", 1, 1000, 10)])) for i in range(40)
        ]
        for p in pods:
            assert (await env.filter(p, ["big"]))["NodeNames"] == ["big"]
        stop = asyncio.Event()
        plugin = asyncio.create_task(_fake_plugin(env, "big", stop))
        try:
            errors = await asyncio.wait_for(asyncio.gather(*(env.bind(p, "big") for p in pods)), 60)
        finally:
            stop.set()
            await plugin
        assert errors == [""] * 40
        assert all(env.server.get("Pod", "default", f"w{i}")["spec"]["nodeName"] == "big" for i in range(40))
        assert env.scheduler.metrics.node_lock_wait_seconds._sum.get() > 0  # some binds waited


async def test_gc_freeze_after_sync_then_filters_as_before() -> None:
    gc.unfreeze()
    try:
        async with running_scheduler(SchedulerSettings(gc_freeze=True)) as env:
            await wait_for(lambda: gc.get_freeze_count() > 0)
            env.add_node("n1")
            await _node_synced(env, "n1")
            body = await env.filter(await env.create_pod(pod("a")), ["n1"])
            assert body["NodeNames"] == ["n1"]
        gc.unfreeze()
        async with running_scheduler():  # off by default (embedded schedulers)
            await asyncio.sleep(0.05)  # any task started by the sync has run by now
            assert gc.get_freeze_count() == 0
    finally:
        gc.unfreeze()
