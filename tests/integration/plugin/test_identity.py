"""Which pod kubelet is admitting: pods that bypassed hamid, API errors, lagging watches (I6)."""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import pytest
import structlog.testing
from grpclib import GRPCError
from grpclib.const import Status

from hamid.model.annotations import (
    BIND_PHASE,
    DEVICES_ALLOCATED,
    DEVICES_TO_ALLOCATE,
    NODE_LOCK,
    VGPU_NODE,
    encode_pod_devices,
)
from hamid.model.booked import booked_condition
from hamid.model.devices import ContainerDevices
from hamid.plugin import allocator
from hamid.plugin.numa_policy import NumaMismatch
from tests.integration.plugin.helpers import (
    NODE,
    dev,
    eventually,
    lock_node,
    running_plugin,
    scheduled_pod,
    stored_annotations,
    stranger_pod,
)
from tests.integration.plugin.test_allocate import PREFERRED, allocate, preferred, seeded, stub_for

NUMA0 = [f"GPU-{g}-{i}" for g in (0, 1) for i in range(4)]


class Recorder:
    """Mismatch handler that records calls (a refit would be sent here)."""

    def __init__(self) -> None:
        self.calls: list[NumaMismatch] = []

    async def __call__(self, mismatch: NumaMismatch) -> ContainerDevices | None:
        self.calls.append(mismatch)
        return None


async def test_a_pod_that_bypassed_hamid_fails_closed_and_marks_nothing() -> None:
    """The reviewer's reproduction: stranger S (default-scheduler, no annotations) on the node while
    p1 holds the lock. Allocate must not hand S p1's GPU and limits, nor consume p1's entry."""
    p1 = scheduled_pod("p1", ((dev("GPU-2", 3000, 30),),))
    recorder = Recorder()
    async with running_plugin(PREFERRED, mismatch_handler=recorder) as (env, _), stub_for(env) as stub:
        await seeded(env, p1)
        env.server.put(stranger_pod("s"))
        await eventually(lambda: env.plugin.pods.pod("default/s") is not None)

        with pytest.raises(GRPCError) as err:
            await allocate(stub, "GPU-2-0")
        assert err.value.status is Status.FAILED_PRECONDITION
        message = str(err.value.message)
        assert "pod default/s requests nvidia.com/gpu but was not bound by hamid's scheduler" in message
        assert "no hamid.io/AllocationBooked condition" in message
        assert "MutatingWebhookConfiguration" in message
        ann = stored_annotations(env.server, "Pod", "p1")
        assert ann[BIND_PHASE] == "allocating"  # p1 is not marked failed ...
        assert (
            ann[DEVICES_TO_ALLOCATE] == p1["metadata"]["annotations"][DEVICES_TO_ALLOCATE]
        )  # ... nor consumed
        assert NODE_LOCK in stored_annotations(env.server, "Node", NODE, None)  # the lock stays with p1
        assert BIND_PHASE not in (env.server.get("Pod", "default", "s")["metadata"].get("annotations") or {})

        # GetPreferredAllocation: no opinion, and no refit for p1's missing GPU
        assert await preferred(stub, NUMA0, 1) == []
        assert recorder.calls == []

        # kubelet rejected S (phase Failed): p1's own Allocate is served again
        env.server.put(stranger_pod("s", status={"phase": "Failed", "reason": "UnexpectedAdmissionError"}))
        await eventually(lambda: env.plugin.pods.pod("default/s")["status"]["phase"] == "Failed")
        r = await allocate(stub, "GPU-2-1")
        assert r.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m"
        assert stored_annotations(env.server, "Pod", "p1")[BIND_PHASE] == "success"


async def test_a_bypassing_pod_with_hamids_annotations_is_still_a_stranger() -> None:
    """Red-team finding: a pod that skipped the webhook (``hami.io/webhook: ignore``, node preset)
    carrying a forged ``hami.io/vgpu-node`` (and even a whole allocating allocation of its own) was
    no stranger, so kubelet admitting it got the lock holder's GPU and limits and consumed the
    holder's entry. Only the record hamid's /bind writes in the status (not writable by tenants)
    counts now."""
    victim = scheduled_pod("victim", ((dev("GPU-2", 3000, 30),),))
    async with running_plugin(PREFERRED) as (env, _), stub_for(env) as stub:

        def attacker_cached_as(annotations: dict[str, str]) -> bool:
            cached = env.plugin.pods.pod("default/attacker")
            return cached is not None and cached["metadata"].get("annotations") == annotations

        await seeded(env, victim)
        for forged in (
            {VGPU_NODE: NODE},
            {**victim["metadata"]["annotations"], DEVICES_TO_ALLOCATE: "GPU-2,NVIDIA,3000,30:;"},
        ):
            attacker = stranger_pod("attacker")
            attacker["metadata"]["labels"] = {"hami.io/webhook": "ignore"}
            attacker["metadata"]["annotations"] = forged
            env.server.put(attacker)
            await eventually(functools.partial(attacker_cached_as, forged))
            with pytest.raises(GRPCError) as err:
                await allocate(stub, "GPU-2-0")
            assert err.value.status is Status.FAILED_PRECONDITION
            assert "pod default/attacker requests nvidia.com/gpu" in str(err.value.message)
            ann = stored_annotations(env.server, "Pod", "victim")
            assert ann[BIND_PHASE] == "allocating"  # the victim is neither marked ...
            assert (
                ann[DEVICES_TO_ALLOCATE] == victim["metadata"]["annotations"][DEVICES_TO_ALLOCATE]
            )  # nor consumed


@pytest.mark.parametrize(
    "status",
    [
        {"phase": "Running", "containerStatuses": [{"name": "main", "state": {"running": {}}}]},
        # admitted by kubelet, still starting (image pull): kubelet already wrote container statuses
        {
            "phase": "Pending",
            "containerStatuses": [{"name": "main", "state": {"waiting": {"reason": "ContainerCreating"}}}],
        },
        {"phase": "Succeeded"},
    ],
    ids=["running", "admitted-starting", "succeeded"],
)
async def test_admitted_or_finished_non_hamid_pods_never_block(status: dict) -> None:
    p1 = scheduled_pod("p1", ((dev("GPU-0", 1000, 10),),))
    async with running_plugin() as (env, _), stub_for(env) as stub:
        env.server.put(stranger_pod("old", status=status))
        await seeded(env, p1)
        assert env.plugin.pods.pod("default/old") is not None
        r = await allocate(stub, "GPU-0-0")
        assert r.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "1000m"


async def test_pending_pods_without_the_resource_never_block() -> None:
    p1 = scheduled_pod("p1", ((dev("GPU-0", 1000, 10),),))
    async with running_plugin() as (env, _), stub_for(env) as stub:
        env.server.put(stranger_pod("cpu-only", resource="cpu"))
        zero = stranger_pod("zero")
        zero["spec"]["containers"][0]["resources"] = {"requests": {"nvidia.com/gpu": "0"}}
        env.server.put(zero)
        await seeded(env, p1)
        await eventually(lambda: env.plugin.pods.pod("default/zero") is not None)
        r = await allocate(stub, "GPU-0-0")
        assert r.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-0"


async def test_api_errors_during_identification_are_a_clear_refusal() -> None:
    """The lock names a pod the cache does not hold and its GET fails: a FAILED_PRECONDITION with the
    API error (not UNKNOWN "Internal Server Error" with a traceback), and nothing is marked."""
    p1 = scheduled_pod("p1", ((dev("GPU-0", 1000, 10),),))
    async with running_plugin(PREFERRED) as (env, _), stub_for(env) as stub:
        await seeded(env, p1, lock=False)
        lock_node(env.server, "ghost")
        await eventually(lambda: env.plugin.pods.lock_owner() == "default/ghost")
        env.server.faults.fail_next(
            2, verb="get", path_pattern="/pods/ghost$", status=500, message="etcd down"
        )
        with pytest.raises(GRPCError) as err:
            await allocate(stub, "GPU-0-0")
        assert err.value.status is Status.FAILED_PRECONDITION
        assert str(err.value.message).startswith("cannot identify the pending pod: 500")
        assert "etcd down" in str(err.value.message)
        assert await preferred(stub, NUMA0, 1) == []  # GetPreferredAllocation: no opinion
        assert stored_annotations(env.server, "Pod", "p1")[BIND_PHASE] == "allocating"
        assert stored_annotations(env.server, "Node", NODE, None)[NODE_LOCK]


async def test_a_lagging_watch_is_caught_up_by_one_fresh_read() -> None:
    """kubelet admits pod A before the plugin's watches deliver it (or the node lock): Allocate reads
    the node and the node's pods once and serves A instead of refusing."""
    async with running_plugin() as (env, _), stub_for(env) as stub:
        rule = env.server.faults.add_latency(60, verb="watch")
        try:
            env.server.close_watches()
            env.server.put(scheduled_pod("a", ((dev("GPU-1", 1500, 15),),)))
            lock_node(env.server, "a")
            assert env.plugin.pods.pod("default/a") is None and env.plugin.pods.lock_owner() is None
            with structlog.testing.capture_logs() as logs:
                r = await allocate(stub, "GPU-1-0")
            assert r.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "1500m"
            assert stored_annotations(env.server, "Pod", "a")[BIND_PHASE] == "success"
            assert NODE_LOCK not in stored_annotations(env.server, "Node", NODE, None)
            assert any(e["event"] == "pending_pod_not_cached_reading_once" for e in logs)
            assert env.server.requests["list pods"] >= 2  # the cache's initial list and the fresh read
        finally:
            env.server.faults.remove(rule.id)


async def test_no_pending_pod_still_refuses_after_the_fresh_read() -> None:
    async with running_plugin() as (env, _), stub_for(env) as stub:
        lists = env.server.requests["list pods"]
        with pytest.raises(GRPCError, match="no pod on this node is waiting"):
            await allocate(stub, "GPU-0-0")
        assert env.server.requests["list pods"] == lists + 1  # exactly one fresh read


async def test_a_pending_entry_the_scheduler_did_not_book_is_not_served(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Red-team finding: past admission a tenant rewrote to-allocate between the filter and
    kubelet's Allocate and ran with limits nobody booked (3000 MiB / 30 % booked, 15000 MiB / 100 %
    served). The entry must be the booked one: the status record's, even when the tenant rewrote
    the allocated annotation to match."""
    monkeypatch.setattr(allocator, "BOOKED_RECORD_WAIT_S", 0.3)  # the record never comes
    tampered = encode_pod_devices(((dev("GPU-2", 15000, 100),),))
    for rewritten in (
        {DEVICES_TO_ALLOCATE: tampered},
        {DEVICES_TO_ALLOCATE: tampered, DEVICES_ALLOCATED: tampered},
    ):
        p = scheduled_pod("p", ((dev("GPU-2", 3000, 30),),))
        p["metadata"]["annotations"].update(rewritten)
        async with running_plugin(PREFERRED) as (env, _), stub_for(env) as stub:
            await seeded(env, p)
            with pytest.raises(GRPCError) as err:
                await allocate(stub, "GPU-2-0")
            assert err.value.status is Status.FAILED_PRECONDITION
            message = str(err.value.message)
            assert "pending allocation GPU-2,NVIDIA,15000,100: is not what the scheduler booked" in message
            assert "(GPU-2,NVIDIA,3000,30:, from the pod's status record)" in message
            assert env.plugin.allocator.refusals["unbooked-allocation"] == 1


async def test_a_pod_this_plugin_served_whole_is_no_stranger_before_kubelet_starts_it() -> None:
    """A review: HAMi's scheduler writes no status record. Once this plugin had served pod A whole
    (releasing the lock) and before kubelet wrote A's statuses, HAMi's scheduler bound B; A, no
    longer the lock holder, counted as a stranger and B was refused."""

    def hami_pod(name: str, gpu: str) -> dict[str, Any]:
        pod = scheduled_pod(name, ((dev(gpu, 1000, 10),),))
        pod["status"] = {"phase": "Pending"}  # no hamid.io/AllocationBooked
        pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
        return pod

    async with running_plugin() as (env, _), stub_for(env) as stub:
        await seeded(env, hami_pod("a", "GPU-0"))
        await allocate(stub, "GPU-0-0")
        assert stored_annotations(env.server, "Pod", "a")[BIND_PHASE] == "success"
        await seeded(env, hami_pod("b", "GPU-1"))  # A still Pending, without container statuses
        served = await allocate(stub, "GPU-1-0")
        assert served.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-1"


async def test_an_entry_whose_record_follows_a_moment_later_is_served() -> None:
    """A review: a refit landed while its answer was lost (best effort falls back), so the pod's
    entry was the refit's while its status record, written off the refit's path, still named the
    old one: the plugin refused the pod. It reads the pod again until the record follows."""
    pod = scheduled_pod("p1", ((dev("GPU-0", 1000, 10),),))
    moved = ((dev("GPU-1", 1000, 10),),)
    holder: dict[str, Any] = {}

    async def landed_but_lost(mismatch: NumaMismatch) -> ContainerDevices | None:
        env = holder["env"]
        raw = encode_pod_devices(moved)
        env.server.patch(
            "Pod",
            "default",
            "p1",
            {"metadata": {"annotations": {DEVICES_TO_ALLOCATE: raw, DEVICES_ALLOCATED: raw}}},
        )

        async def record_later() -> None:
            await asyncio.sleep(0.5)
            env.server.put(
                {
                    **env.server.get("Pod", "default", "p1"),
                    "status": {
                        "phase": "Pending",
                        "conditions": [booked_condition(NODE, raw, "", 1700000002.0)],
                    },
                }
            )

        holder["later"] = asyncio.create_task(record_later())
        return None  # best effort: the refit's answer never came

    async with running_plugin(mismatch_handler=landed_but_lost) as (env, _), stub_for(env) as stub:
        holder["env"] = env
        await seeded(env, pod)
        served = await allocate(stub, "GPU-1-0")
        assert served.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-1"
        assert stored_annotations(env.server, "Pod", "p1")[BIND_PHASE] == "success"
