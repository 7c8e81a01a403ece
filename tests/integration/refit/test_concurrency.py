"""Refits and filters together: per-node locking, tentative moves, deadlines, deleted pods."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest

from hamid.model import annotations as ann
from hamid.model import reasons as R
from hamid.plugin.refit_client import RefitError
from hamid.scheduler.signing import AllocationKeys
from hamid.scheduler.state import SchedulerState
from hamidsim.apiserver import ApiServer
from tests.fixtures.tls import TLSFiles
from tests.integration.refit.harness import Env, container, d, eventually, gpu, refit_env, request

AL = ann.DEVICES_ALLOCATED


def new_pod(env: Env, name: str, mem: int) -> dict[str, Any]:
    """An unscheduled pod asking for one GPU with ``mem`` MiB."""
    return env.server.put(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"schedulerName": "hami-scheduler", "containers": [container("main", 1, mem)]},
            "status": {"phase": "Pending"},
        }
    )


async def filter_on(env: Env, pod: dict[str, Any], nodes: list[str]) -> dict[str, Any]:
    async with env.session.post(env.extender + "/filter", json={"Pod": pod, "NodeNames": nodes}) as resp:
        assert resp.status == 200
        return await resp.json()


def over_committed(env: Env) -> list[str]:
    """GPUs whose booked memory or slots exceed their capacity."""
    out = []
    for name, entry in env.scheduler.ledger.nodes.items():
        for dev in entry.usage.devices:
            if dev.usedmem > dev.totalmem or dev.used > dev.count:
                out.append(f"{name}/{dev.id} {dev.usedmem}/{dev.totalmem}")
    return out


async def test_patch_deadline_does_not_block_filter_and_holds_both_gpus(
    tls_files: TLSFiles, tmp_path: Path
) -> None:
    async with refit_env(tls_files, tmp_path, patch_timeout=1.0) as env:
        env.add_node("n1", [gpu("GPU-a", 0), gpu("GPU-b", 1)])
        env.quota("default", 100000)
        pod = await env.place("p", "n1", ((d("GPU-a", 20000, 30),),))
        await eventually(lambda: env.scheduler.ledger.quotas.used("default") == (20000, 30))
        before = env.annotations("p")
        env.server.faults.add_latency(5.0, verb="patch", path_pattern="/pods/p$")
        refit = asyncio.create_task(env.mtls_client("system:node:n1").refit(request(pod, "n1", 0, ["GPU-b"])))
        uid = pod["metadata"]["uid"]
        await eventually(lambda: env.scheduler.ledger.reservation(uid).raw != before[AL])
        # while the refit's patch hangs, a filter on the same node answers at once, and can take
        # neither the old GPU nor the new one (30000 MiB fits on neither while both are held)
        big = new_pod(env, "big", 30000)
        answer = await filter_on(env, big, ["n1"])
        assert not refit.done()
        assert not answer.get("NodeNames"), answer
        with pytest.raises(RefitError, match="cannot patch pod annotations"):
            await asyncio.wait_for(refit, 10)
        assert env.annotations("p") == before
        # the pod read back unchanged: the write may still land, so both stay booked until the
        # pod changes (here the plugin's own update after its Allocate); then it rolls back
        assert env.scheduler.ledger.snapshot()["n1"] == {"GPU-a": (1, 20000, 30), "GPU-b": (1, 20000, 30)}
        env.server.patch("Pod", "default", "p", {"metadata": {"annotations": {ann.BIND_PHASE: "success"}}})
        await eventually(lambda: not env.scheduler.ledger.holds(uid))
        res = env.scheduler.ledger.reservation(uid)
        assert res is not None and res.raw == before[AL]
        assert env.scheduler.ledger.snapshot()["n1"] == {"GPU-a": (1, 20000, 30), "GPU-b": (0, 0, 0)}
        assert env.scheduler.ledger.quotas.used("default") == (20000, 30)
        assert not over_committed(env)


async def test_a_refit_write_landing_after_an_unchanged_read_back_is_not_booked_over_another_pod(
    tls_files: TLSFiles, tmp_path: Path
) -> None:
    """An audit: the patch's answer timed out and one GET showed the pod unchanged, so the refit was
    answered "not applied", rolled back and released its hold; a 40,000 MiB pod then took the GPU
    it had freed, and the API server applied the write (it finishes a write whose client hung up;
    the resourceVersion precondition still held): the ledger booked the move over that pod, 60,000
    of 40,000 MiB. An unchanged pod decides nothing: both GPU sets stay booked until it changes."""
    async with refit_env(tls_files, tmp_path, patch_timeout=0.5) as env:
        env.add_node("n1", [gpu("GPU-a", 0), gpu("GPU-b", 1)])
        pod = await env.place("p", "n1", ((d("GPU-a", 20000, 30),),))
        uid, version = pod["metadata"]["uid"], pod["metadata"]["resourceVersion"]
        slow = env.server.faults.add_latency(3.0, verb="patch", path_pattern="/pods/p$")
        try:
            with pytest.raises(RefitError, match="its outcome is unknown"):
                await env.mtls_client("system:node:n1").refit(request(pod, "n1", 0, ["GPU-b"]))
        finally:
            env.server.faults.remove(slow.id)
        assert env.scheduler.ledger.snapshot()["n1"] == {"GPU-a": (1, 20000, 30), "GPU-b": (1, 20000, 30)}
        big = new_pod(env, "big", 40000)
        assert not (await filter_on(env, big, ["n1"])).get("NodeNames")  # neither GPU is free
        await asyncio.sleep(1.0)  # the follow-up's read-backs see the pod unchanged: still held
        assert env.scheduler.ledger.holds(uid)
        # the API server applies the write now, its precondition still holding
        moved = "GPU-b,NVIDIA,20000,30:;"
        late = {"resourceVersion": version, "annotations": {ann.DEVICES_TO_ALLOCATE: moved, AL: moved}}
        env.server.patch("Pod", "default", "p", {"metadata": late})
        await eventually(lambda: not env.scheduler.ledger.holds(uid))
        res = env.scheduler.ledger.reservation(uid)
        assert res is not None and res.raw == moved
        assert env.scheduler.ledger.snapshot()["n1"] == {"GPU-a": (0, 0, 0), "GPU-b": (1, 20000, 30)}
        assert not over_committed(env)
        assert (await filter_on(env, big, ["n1"]))["NodeNames"] == ["n1"]  # GPU-a, free now


async def test_an_old_leaders_refit_landing_after_a_takeover_is_not_booked_over_the_new_leaders_pod(
    tls_files: TLSFiles, tmp_path: Path
) -> None:
    """An HA audit: replica A's refit patch was slow and landed, within its budget, after B had
    placed a pod on the GPU it moved to; B followed A's later-signed allocation without judging
    it: 60,000 of 40,000 MiB. B now keeps the earlier booking and says why (an Event)."""
    keys = AllocationKeys.generate()
    async with (
        ApiServer() as server,
        refit_env(tls_files, tmp_path, server=server, keys=keys) as a,
        refit_env(tls_files, tmp_path, server=server, keys=keys) as b,
    ):
        a.add_node("n1", [gpu("GPU-a", 0), gpu("GPU-b", 1)])
        await eventually(lambda: "n1" in b.scheduler.ledger.nodes)
        p = new_pod(a, "p", 20000)
        uid = p["metadata"]["uid"]
        assert (await filter_on(a, p, ["n1"]))["NodeNames"] == ["n1"]
        await eventually(lambda: (res := a.scheduler.ledger.reservation(uid)) is not None and not res.pending)
        bind = {"PodName": "p", "PodNamespace": "default", "PodUID": uid, "Node": "n1"}
        async with a.session.post(a.extender + "/bind", json=bind) as resp:
            assert not (await resp.json()).get("Error")
        await eventually(lambda: b.scheduler.ledger.reservation(uid) is not None)
        old = a.annotations("p")[AL]
        to = "GPU-b" if old.startswith("GPU-a") else "GPU-a"
        slow = server.faults.add_latency(1.0, verb="patch", path_pattern="/pods/p$")
        pod = server.get("Pod", "default", "p")
        refit = asyncio.create_task(a.mtls_client("system:node:n1").refit(request(pod, "n1", 0, [to])))
        await eventually(lambda: bool(a.scheduler.ledger.holds(uid)))  # A's patch is on the wire
        big = new_pod(b, "big", 40000)
        assert (await filter_on(b, big, ["n1"]))["NodeNames"] == ["n1"]  # B: that GPU is free
        assert (await asyncio.wait_for(refit, 10))[0].uuid == to  # the plugin serves it
        server.faults.remove(slow.id)
        await eventually(lambda: b.annotations("p")[AL].startswith(to))

        def refused() -> list[dict[str, Any]]:
            return [e for e in b.events(R.EVENT_ALLOCATION_REFUSED) if e["involvedObject"]["name"] == "p"]

        await eventually(lambda: bool(refused()))
        assert f"n1: {old} stays booked" in refused()[0]["message"]
        res = b.scheduler.ledger.reservation(uid)
        assert res is not None and res.raw == old
        assert b.scheduler.ledger.snapshot()["n1"][to] == (1, 40000, 0)
        assert not over_committed(b)
        report = await b.scheduler.reconciler.reconcile_once()  # judged by the same rule
        assert report is not None and report.drifts == []
        assert not over_committed(b)


async def test_in_flight_refit_that_lowers_quota_usage_frees_no_headroom(
    tls_files: TLSFiles, tmp_path: Path
) -> None:
    async with refit_env(tls_files, tmp_path, patch_timeout=1.0) as env:
        env.add_node("n1", [gpu("GPU-a", 0), gpu("GPU-b", 1), gpu("GPU-c", 1)])
        env.quota("default", 15000)
        # init@b 5000 then two apps@a 5000 each: the pod counts b 5000 + a 10000 = 15000; with its
        # init container moved to a it would count only 10000 (phase-aware, upstream #2836)
        pod = await env.place(
            "p",
            "n1",
            ((d("GPU-b", 5000),), (d("GPU-a", 5000),), (d("GPU-a", 5000),)),
            init=[container("init", 1, 5000)],
            containers=[container("m1", 1, 5000), container("m2", 1, 5000)],
        )
        await eventually(lambda: env.scheduler.ledger.quotas.used("default") == (15000, 0))
        before = env.annotations("p")
        env.server.faults.add_latency(5.0, verb="patch", path_pattern="/pods/p$")
        refit = asyncio.create_task(env.mtls_client("system:node:n1").refit(request(pod, "n1", 0, ["GPU-a"])))
        uid = pod["metadata"]["uid"]
        await eventually(lambda: env.scheduler.ledger.reservation(uid).raw != before[AL])
        # while the patch hangs the namespace still counts the larger, old usage: a 5000 MiB pod
        # does not fit the quota (it would over-run it once the refit rolls back)
        assert env.scheduler.ledger.quotas.used("default") == (15000, 0)
        answer = await filter_on(env, new_pod(env, "q", 5000), ["n1"])
        assert not refit.done()
        assert not answer.get("NodeNames"), answer
        assert "ResourceQuotaNotFit" in answer["FailedNodes"]["n1"], answer
        with pytest.raises(RefitError, match="cannot patch pod annotations"):
            await asyncio.wait_for(refit, 10)
        assert env.annotations("p") == before
        assert env.scheduler.ledger.quotas.used("default") == (15000, 0)


async def test_refit_on_node_a_does_not_block_filter_on_node_b(tls_files: TLSFiles, tmp_path: Path) -> None:
    async with refit_env(tls_files, tmp_path, patch_timeout=3.0) as env:
        env.add_node("na", [gpu("GPU-a", 0), gpu("GPU-b", 1)])
        env.add_node("nb", [gpu("GPU-c", 0)])
        pod = await env.place("p", "na", ((d("GPU-a", 20000),),))
        env.server.faults.add_latency(10.0, verb="patch", path_pattern="/pods/p$")
        refit = asyncio.create_task(env.mtls_client("system:node:na").refit(request(pod, "na", 0, ["GPU-b"])))
        uid = pod["metadata"]["uid"]
        await eventually(
            lambda: env.scheduler.ledger.reservation(uid).raw != pod["metadata"]["annotations"][AL]
        )
        assert env.scheduler.ledger.node_guard("na").locked()
        answer = await filter_on(env, new_pod(env, "q", 1000), ["nb"])
        assert answer.get("NodeNames") == ["nb"], answer
        assert not refit.done()
        with pytest.raises(RefitError):
            await asyncio.wait_for(refit, 10)


async def test_pod_deleted_during_refit_is_released_once(tls_files: TLSFiles, tmp_path: Path) -> None:
    async with refit_env(tls_files, tmp_path, patch_timeout=3.0) as env:
        env.add_node("n1", [gpu("GPU-a", 0), gpu("GPU-b", 1)])
        env.quota("default", 100000)
        await env.place("stay", "n1", ((d("GPU-b", 5000),),))
        pod = await env.place("p", "n1", ((d("GPU-a", 20000),),))
        await eventually(lambda: env.scheduler.ledger.quotas.used("default") == (25000, 0))
        rule = env.server.faults.add_latency(0.5, verb="patch", path_pattern="/pods/p$")
        refit = asyncio.create_task(env.mtls_client("system:node:n1").refit(request(pod, "n1", 0, ["GPU-b"])))
        uid = pod["metadata"]["uid"]
        await eventually(
            lambda: env.scheduler.ledger.reservation(uid).raw != pod["metadata"]["annotations"][AL]
        )
        env.server.delete("Pod", "default", "p")
        await eventually(lambda: env.scheduler.ledger.reservation(uid) is None)
        with pytest.raises(RefitError, match="cannot patch pod annotations"):
            await asyncio.wait_for(refit, 10)
        env.server.faults.remove(rule.id)
        assert env.scheduler.ledger.reservation(uid) is None
        assert env.scheduler.ledger.quotas.used("default") == (5000, 0)
        assert env.scheduler.ledger.snapshot()["n1"] == {"GPU-a": (0, 0, 0), "GPU-b": (1, 5000, 0)}


async def test_concurrent_refits_and_filters_never_over_commit(tls_files: TLSFiles, tmp_path: Path) -> None:
    rng = random.Random(7)
    async with refit_env(tls_files, tmp_path) as env:
        env.add_node("n1", [gpu(f"GPU-{i}", i // 2, 20000) for i in range(4)])
        placed = []
        for i in range(6):
            placed.append(await env.place(f"p{i}", "n1", ((d(f"GPU-{i % 2}", 6000),),)))
        env.server.faults.add_latency(0.02, verb="patch")
        client = env.mtls_client("system:node:n1")
        violations: list[list[str]] = []
        stop = asyncio.Event()

        async def watch() -> None:
            while not stop.is_set():
                bad = over_committed(env)
                if bad:
                    violations.append(bad)
                await asyncio.sleep(0.002)

        outcomes: list[str] = []

        async def one_refit(p: dict[str, Any]) -> None:
            allowed = rng.sample(["GPU-0", "GPU-1", "GPU-2", "GPU-3"], 2)
            try:
                await client.refit(request(p, "n1", 0, allowed))
                outcomes.append("refit")
            except RefitError:
                outcomes.append("refused")

        async def one_filter(i: int) -> None:
            answer = await filter_on(env, new_pod(env, f"f{i}", 5000), ["n1"])
            outcomes.append("placed" if answer.get("NodeNames") else "unfit")

        watcher = asyncio.create_task(watch())
        jobs = [one_refit(p) for p in placed] + [one_filter(i) for i in range(6)]
        rng.shuffle(jobs)
        await asyncio.wait_for(asyncio.gather(*jobs), 60)
        stop.set()
        await watcher
        assert not violations
        assert "refit" in outcomes and "placed" in outcomes, outcomes
        # the live state equals a rebuild from the annotations on the API server
        await asyncio.sleep(0.2)
        fresh = SchedulerState(env.scheduler.config)
        for node in env.server.list("Node"):
            fresh.on_node(node)
        for pod in env.server.list("Pod", "default"):
            fresh.ledger.on_pod(pod)
        await eventually(lambda: env.scheduler.ledger.snapshot() == fresh.ledger.snapshot())
        assert not over_committed(env)
