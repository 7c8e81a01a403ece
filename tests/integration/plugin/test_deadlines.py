"""Allocate's deadlines: the prepare budget, the shielded commit, the last-resort gRPC error."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import pytest
import structlog.testing
from grpclib import GRPCError
from grpclib.const import Status

from hamid._proto.deviceplugin.v1beta1 import api_pb2 as pb
from hamid.kube.errors import Timeout
from hamid.kube.retry import RetryBudget
from hamid.model.annotations import BIND_PHASE, DEVICES_TO_ALLOCATE, NODE_LOCK
from hamid.plugin import allocator as allocate_module
from hamid.plugin.allocator import CALLS_AFTER_PREPARE, TRANSIENT_RETRIES, Allocator, HostFacts
from hamid.plugin.cdi_specs import CdiSpecs
from hamid.plugin.device_nodes import DeviceNodes
from tests.integration.plugin.helpers import (
    NODE,
    dev,
    eventually,
    running_plugin,
    scheduled_pod,
    stored_annotations,
)
from tests.integration.plugin.test_allocate import allocate, seeded, stub_for


async def test_a_timeout_before_the_commit_runs_the_failure_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The host directories stall past the prepare budget: the pod is marked failed and its lock
    released (instead of leaving bind-phase=allocating and a held lock behind)."""
    release = threading.Event()

    def stalled_prepare_host(
        paths: Sequence[str],
        license_path: str,
        nodes: DeviceNodes | None,
        wanted: Sequence[str],
        cdi_specs: CdiSpecs | None,
    ) -> HostFacts:
        release.wait(5)
        return HostFacts(False, frozenset(), None)

    monkeypatch.setattr(allocate_module, "_prepare_host", stalled_prepare_host)
    pod = scheduled_pod("slow", ((dev("GPU-0", 1000, 10),),))
    try:
        async with running_plugin() as (env, _), stub_for(env) as stub:
            env.plugin.allocator.prepare_timeout = 0.3
            await seeded(env, pod)
            with pytest.raises(GRPCError) as err:
                await allocate(stub, "GPU-0-0")
            assert err.value.status is Status.FAILED_PRECONDITION
            assert "did not finish preparing within 0.3s" in str(err.value.message)
            ann = stored_annotations(env.server, "Pod", "slow")
            assert ann[BIND_PHASE] == "failed"
            assert ann[DEVICES_TO_ALLOCATE] == pod["metadata"]["annotations"][DEVICES_TO_ALLOCATE]
            assert NODE_LOCK not in stored_annotations(env.server, "Node", NODE, None)
    finally:
        release.set()


async def test_a_cancelled_call_still_completes_the_commit_and_the_lock_release() -> None:
    """The consume patch is in flight when the call is cancelled (here: the caller's gRPC deadline):
    the patch and the node lock release still complete, so the annotation and the lock agree."""
    pod = scheduled_pod("p", ((dev("GPU-0", 1000, 10),),))
    async with running_plugin() as (env, _), stub_for(env) as stub:
        await seeded(env, pod)
        rule = env.server.faults.add_latency(1.0, verb="patch", path_pattern="/pods/p$")
        try:
            request = pb.AllocateRequest(
                container_requests=[pb.ContainerAllocateRequest(devices_ids=["GPU-0-0"])]
            )
            with pytest.raises(TimeoutError):  # grpclib's client deadline; the server cancels the handler
                await stub.Allocate(request, timeout=0.4)
            assert stored_annotations(env.server, "Pod", "p")[BIND_PHASE] == "allocating"  # still in flight
            await eventually(lambda: stored_annotations(env.server, "Pod", "p")[BIND_PHASE] == "success")
            await eventually(lambda: NODE_LOCK not in stored_annotations(env.server, "Node", NODE, None))
        finally:
            env.server.faults.remove(rule.id)


async def test_the_outer_deadline_covers_every_inner_budget() -> None:
    async with running_plugin() as (env, _):
        allocator: Allocator = env.plugin.allocator
        worst = (
            allocator.prepare_timeout
            + CALLS_AFTER_PREPARE * max(allocator.call_timeout, env.plugin.pods.call_timeout)
            + RetryBudget(TRANSIENT_RETRIES).worst_wait_s
        )
        assert allocator.deadline_s == worst
        assert env.plugin.service.handler_timeout > worst


async def test_an_unexpected_error_is_internal_with_a_message_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def broken(*args: object) -> None:
        raise RuntimeError("injected fault")

    pod = scheduled_pod("p", ((dev("GPU-0", 1000, 10),),))
    async with running_plugin() as (env, _), stub_for(env) as stub:
        await seeded(env, pod)
        monkeypatch.setattr(env.plugin.allocator, "_prepare", broken)
        with structlog.testing.capture_logs() as logs, pytest.raises(GRPCError) as err:
            await allocate(stub, "GPU-0-0")
        assert err.value.status is Status.INTERNAL
        assert str(err.value.message) == "device plugin internal error: RuntimeError: injected fault"
        (entry,) = [e for e in logs if e["event"] == "allocate_crashed"]
        assert entry["log_level"] == "error" and entry.get("exc_info")


@pytest.mark.parametrize("status", [429, 500, 503, 504])
async def test_a_transient_failure_of_the_commit_patch_is_retried(status: int) -> None:
    pod = scheduled_pod("p", ((dev("GPU-0", 1000, 10),),))
    async with running_plugin() as (env, _), stub_for(env) as stub:
        await seeded(env, pod)
        env.server.faults.fail_next(2, verb="patch", path_pattern="/pods/p$", status=status)
        await allocate(stub, "GPU-0-0")
        ann = stored_annotations(env.server, "Pod", "p")
        assert ann[BIND_PHASE] == "success"
        assert env.plugin.allocator.refusals.total() == 0


@pytest.mark.parametrize("landed", [True, False])
async def test_a_commit_patch_whose_answer_timed_out_is_read_back(landed: bool) -> None:
    """The first commit patch times out (the API server's answer is lost after it wrote, or it
    never wrote): the read-back tells which; a landed patch is done, not chased as a 409."""
    pod = scheduled_pod("p", ((dev("GPU-0", 1000, 10),),))
    async with running_plugin() as (env, _), stub_for(env) as stub:
        await seeded(env, pod)
        client = env.plugin.allocator.client
        real = client.patch_pod_metadata
        calls: list[str] = []

        async def answer_lost(namespace: str, name: str, **kwargs: Any) -> Any:
            calls.append(name)
            if len(calls) == 1:
                if landed:
                    await real(namespace, name, **kwargs)
                raise Timeout(f"PATCH pods/{name}: no answer within 3s (injected)")
            return await real(namespace, name, **kwargs)

        client.patch_pod_metadata = answer_lost  # type: ignore[method-assign]
        try:
            await allocate(stub, "GPU-0-0")
        finally:
            client.patch_pod_metadata = real  # type: ignore[method-assign]
        assert stored_annotations(env.server, "Pod", "p")[BIND_PHASE] == "success"
        assert calls == (["p"] if landed else ["p", "p"])
        assert env.plugin.allocator.refusals.total() == 0


async def test_transient_failures_past_the_budget_fail_the_pod() -> None:
    pod = scheduled_pod("p", ((dev("GPU-0", 1000, 10),),))
    async with running_plugin() as (env, _), stub_for(env) as stub:
        await seeded(env, pod)
        env.server.faults.fail_next(TRANSIENT_RETRIES + 1, verb="patch", path_pattern="/pods/p$", status=503)
        with pytest.raises(GRPCError) as err:
            await allocate(stub, "GPU-0-0")
        assert "503" in str(err.value.message)
        ann = stored_annotations(env.server, "Pod", "p")
        assert ann[BIND_PHASE] == "failed"
        assert ann[DEVICES_TO_ALLOCATE] == pod["metadata"]["annotations"][DEVICES_TO_ALLOCATE]


async def test_a_landed_commit_whose_answer_and_read_backs_were_lost_is_done_not_planned_again() -> None:
    """The consume patch of container c0 lands, its answer is lost and the two read-backs fail too
    (an API server in distress); the retry's 409 comes from that landed write. It is the commit
    done: c0 gets its own entry (it was served c1's, both entries consumed, and c1 then refused)."""
    pod = scheduled_pod(
        "two", ((dev("GPU-0", 1000, 10),), (dev("GPU-1", 5000, 50),)), containers=("c0", "c1")
    )
    async with running_plugin() as (env, _), stub_for(env) as stub:
        await seeded(env, pod)
        client = env.plugin.allocator.client
        real_patch, real_get = client.patch_pod_metadata, client.get_pod
        patches: list[str] = []
        failing_gets = [2]

        async def patch(namespace: str, name: str, **kw: Any) -> Any:
            patches.append(name)
            result = await real_patch(namespace, name, **kw)
            if len(patches) == 1:
                raise Timeout("PATCH: no answer (injected after it landed)")
            return result

        async def get(namespace: str, name: str, **kw: Any) -> Any:
            if failing_gets[0] > 0:
                failing_gets[0] -= 1
                raise Timeout("GET: no answer (injected)")
            return await real_get(namespace, name, **kw)

        client.patch_pod_metadata = patch  # type: ignore[method-assign]
        client.get_pod = get  # type: ignore[method-assign]
        try:
            served = await allocate(stub, "GPU-0-0")
        finally:
            client.patch_pod_metadata, client.get_pod = real_patch, real_get  # type: ignore[method-assign]
        assert served.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "1000m"
        annotations = stored_annotations(env.server, "Pod", "two")
        assert annotations[BIND_PHASE] == "allocating" and "GPU-1" in annotations[DEVICES_TO_ALLOCATE]
        served = await allocate(stub, "GPU-1-0")  # c1 still gets its own
        assert served.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "5000m"
