"""What the scheduler booked stays booked under interleavings of /filter, /bind, the reconcile and
the watch (an outside race hunt): writes whose answer is lost, pods that ask no cpu/memory, a
cancelled request, two filters of one pod."""

from __future__ import annotations

import asyncio
from typing import Any

from hamid.kube.errors import Timeout
from hamid.model import annotations as ann
from hamid.model import objects
from hamid.model import reasons as R
from hamid.scheduler.extender_json import decode_filter_args
from hamid.scheduler.signing import AllocationKeys
from hamidsim.apiserver import ApiServer
from tests.integration.scheduler.harness import Env, running_scheduler, wait_for
from tests.unit.scheduler.helpers import container, pod

BIG = [container("main", 1, 6000, 50)]


def _lose_the_answer_of(env: Env, victim: str) -> None:
    """The first allocation patch of pod ``victim`` lands (and its watch event is seen) but its
    answer is lost: the filter undoes its booking while the annotations stay."""
    s = env.scheduler
    real = s.kube.patch_pod_metadata
    lost = {victim}

    async def lossy(namespace: str, name: str, **kw: Any) -> Any:
        result = await real(namespace, name, **kw)
        if name in lost and ann.DEVICES_ALLOCATED in (kw.get("annotations") or {}):
            lost.discard(name)
            key = f"{namespace}/{name}"
            await wait_for(lambda: ann.DEVICES_ALLOCATED in objects.annotations(s.pods.get(key)))
            raise Timeout("the answer was lost after the write landed")
        return result

    s.kube.patch_pod_metadata = lossy  # type: ignore[method-assign]


async def test_the_reconcile_never_books_a_refused_late_write_past_a_gpus_capacity() -> None:
    """A's write landed after its filter failed; B took the GPU and was bound. The reconcile lists A
    before B: judged against what the others hold, A's allocation is not adopted (in list order
    it was: 12,000 of 8,000 MiB booked, and A's stale /bind then passed)."""
    async with running_scheduler() as env:
        s = env.scheduler
        env.add_node("n1", gpus=1)
        await wait_for(lambda: "n1" in s.ledger.nodes)
        a = await env.create_pod(pod("a", containers=BIG))
        b = await env.create_pod(pod("b", containers=BIG))
        _lose_the_answer_of(env, "a")
        assert (await env.filter(a, ["n1"])).get("Error")
        assert s.ledger.reservation(a["metadata"]["uid"]) is None
        assert (await env.filter(b, ["n1"]))["NodeNames"] == ["n1"]
        assert await env.bind(b, "n1") == ""
        report = await s.reconciler.reconcile_once()
        assert report is not None and not [d for d in report.drifts if d.pod == "default/a"]
        gpu = s.ledger.nodes["n1"].usage.devices[0]
        assert (gpu.usedmem, gpu.usedcores) == (6000, 50)
        assert "no GPU reservation" in await env.bind(a, "n1")


async def test_pods_asking_no_cpu_or_memory_are_filtered_again_whole() -> None:
    """Two such pods on n1 filtered again onto n2 (their binds failed): the second one's filter
    completes (a node's CPU/memory sum dropped at zero while pods were still counted raised
    KeyError halfway, leaving its booking pending on n2 while its annotations named n1)."""
    async with running_scheduler() as env:
        s = env.scheduler
        env.add_node("n1", gpus=2)
        env.add_node("n2", gpus=2)
        await wait_for(lambda: {"n1", "n2"} <= set(s.ledger.nodes))
        p, q = await env.create_pod(pod("p")), await env.create_pod(pod("q"))
        assert (await env.filter(p, ["n1"]))["NodeNames"] == ["n1"]
        assert (await env.filter(q, ["n1"]))["NodeNames"] == ["n1"]
        assert (await env.filter(env.server.get("Pod", "default", "p"), ["n2"]))["NodeNames"] == ["n2"]
        assert (await env.filter(env.server.get("Pod", "default", "q"), ["n2"]))["NodeNames"] == ["n2"]
        res = s.ledger.reservation(q["metadata"]["uid"])
        notes = env.server.get("Pod", "default", "q")["metadata"]["annotations"]
        assert (
            res is not None
            and not res.pending
            and (res.node, res.raw)
            == (
                notes[ann.VGPU_NODE],
                notes[ann.DEVICES_ALLOCATED],
            )
        )
        env.server.delete("Pod", "default", "p")
        env.server.delete("Pod", "default", "q")
        await wait_for(lambda: s.pods.get("default/q") is None)
        assert s.cpu_mem.requested("n2").cpu == 0


async def test_a_cancelled_filter_leaves_no_booking() -> None:
    """A filter cancelled while its patch is on the wire (a server shutting down) undoes its booking."""
    async with running_scheduler() as env:
        s = env.scheduler
        env.add_node("n1", gpus=1)
        await wait_for(lambda: "n1" in s.ledger.nodes)
        p = await env.create_pod(pod("p"))
        uid = p["metadata"]["uid"]

        async def hung(*_args: Any, **_kw: Any) -> Any:
            await asyncio.sleep(30)

        s.kube.patch_pod_metadata = hung  # type: ignore[method-assign]
        task = asyncio.create_task(s.filtering.filter(decode_filter_args({"Pod": p, "NodeNames": ["n1"]})))
        await wait_for(lambda: s.ledger.reservation(uid) is not None)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert s.ledger.reservation(uid) is None
        assert s.ledger.nodes["n1"].usage.devices[0].usedmem == 0


async def test_a_second_filter_of_a_pod_whose_write_is_on_the_wire_waits_for_its_retry() -> None:
    """kube-scheduler gave up on a slow filter and filters the pod again: the second is refused
    until the first's write is done (else the slower write could land last and name GPUs the
    ledger no longer books); annotations and ledger then agree, and the retry goes through."""
    async with running_scheduler() as env:
        s = env.scheduler
        env.add_node("n1", gpus=1)
        env.add_node("n2", gpus=1)
        await wait_for(lambda: {"n1", "n2"} <= set(s.ledger.nodes))
        a = await env.create_pod(pod("a"))
        uid = a["metadata"]["uid"]
        real = s.kube.patch_pod_metadata
        slow = asyncio.Event()

        async def patch(namespace: str, name: str, **kw: Any) -> Any:
            if not slow.is_set():
                slow.set()
                await asyncio.sleep(0.3)  # the first filter's write is slow on the wire
            return await real(namespace, name, **kw)

        s.kube.patch_pod_metadata = patch  # type: ignore[method-assign]
        first = asyncio.create_task(env.filter(a, ["n1"]))
        await wait_for(lambda: s.ledger.reservation(uid) is not None)
        second = await env.filter(a, ["n2"])
        assert "still writing its allocation" in second["Error"]
        assert (await first)["NodeNames"] == ["n1"]
        await asyncio.sleep(0.1)
        res = s.ledger.reservation(uid)
        notes = env.server.get("Pod", "default", "a")["metadata"]["annotations"]
        assert res is not None and (res.node, res.raw) == (notes[ann.VGPU_NODE], notes[ann.DEVICES_ALLOCATED])
        assert (await env.filter(env.server.get("Pod", "default", "a"), ["n2"]))["NodeNames"] == ["n2"]


async def test_a_late_filter_write_past_the_namespace_quota_is_neither_booked_nor_bound() -> None:
    """An HA audit: the old leader's filter write landed after the new leader, not seeing it, had
    admitted another pod of the namespace under its GPU quota; the new leader booked the late
    write from its valid signature (its GPU had room) and bound both, 2x the quota. It is refused
    now: its bind fails for want of a booking, and kube-scheduler filters it again."""
    keys = AllocationKeys.generate()  # one Secret, mounted by both replicas
    async with (
        ApiServer() as server,
        running_scheduler(server=server, keys=keys) as a,
        running_scheduler(server=server, keys=keys) as b,
    ):
        a.add_node("n1", gpus=2)
        server.put(
            {
                "apiVersion": "v1",
                "kind": "ResourceQuota",
                "metadata": {"name": "gpu", "namespace": "team"},
                "spec": {"hard": {"limits.nvidia.com/gpumem": "6000"}},  # room for one pod
            }
        )
        for env in (a, b):
            await wait_for(lambda env=env: env.scheduler.ledger.quota_usage("team")[0][0] == 6000)
            await wait_for(lambda env=env: "n1" in env.scheduler.ledger.nodes)
        p1 = await a.create_pod(pod("p1", namespace="team", containers=BIG))
        p2 = await b.create_pod(pod("p2", namespace="team", containers=BIG))
        await wait_for(lambda: b.scheduler.pods.get("team/p1") is not None)
        # A (leading) books p1 under the quota; its write is slow at the API server
        slow = server.faults.add_latency(2.0, verb="patch", path_pattern="/pods/p1$")
        first = asyncio.create_task(a.filter(p1, ["n1"]))
        await wait_for(lambda: a.scheduler.ledger.reservation(p1["metadata"]["uid"]) is not None)
        # B takes over (here it simply decides, as a new leader does) and admits p2 under the quota
        assert (await b.filter(p2, ["n1"]))["NodeNames"] == ["n1"]
        assert (await first)["NodeNames"] == ["n1"]  # A's write landed; kube-scheduler binds p1
        server.faults.remove(slow.id)
        await wait_for(lambda: ann.DEVICES_ALLOCATED in objects.annotations(b.scheduler.pods.get("team/p1")))
        assert b.scheduler.ledger.reservation(p1["metadata"]["uid"]) is None
        assert b.scheduler.ledger.quota_usage("team") == ((6000, None), (6000, 50))
        await wait_for(
            lambda: any(
                e["involvedObject"]["name"] == "p1" and "GPU quota" in e["message"]
                for e in server.list("Event", "team")
                if e.get("reason") == R.EVENT_ALLOCATION_REFUSED
            )
        )
        assert "no GPU reservation" in await b.bind(p1, "n1")
        assert await b.bind(p2, "n1") == ""
