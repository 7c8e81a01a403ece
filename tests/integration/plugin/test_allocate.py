"""GetPreferredAllocation and Allocate end to end: unix-socket gRPC, embedded API server, real annotations."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import structlog.testing
from grpclib import GRPCError
from grpclib.client import Channel
from grpclib.const import Status

from hamid._proto.deviceplugin.v1beta1 import api_pb2 as pb
from hamid._proto.deviceplugin.v1beta1.api_grpc import DevicePluginStub
from hamid.model.annotations import (
    BIND_PHASE,
    BIND_PHASE_ALLOCATING,
    DEVICES_ALLOCATED,
    DEVICES_TO_ALLOCATE,
    NODE_LOCK,
    NODE_REGISTER,
    NUMA_ALIGNMENT,
    decode_node_devices,
)
from hamid.model.devices import ContainerDevices
from hamid.model.nodeconfig import NodeConfig
from hamid.plugin.errors import AllocationError
from hamid.plugin.numa_policy import NumaMismatch
from tests.integration.plugin.helpers import (
    NODE,
    Env,
    dev,
    eventually,
    lock_node,
    running_plugin,
    scheduled_pod,
    stored_annotations,
)

PREFERRED = NodeConfig(device_split_count=4, enable_numa_topology=True, enable_get_preferred_allocation=True)


@contextlib.asynccontextmanager
async def stub_for(env: Env) -> AsyncIterator[DevicePluginStub]:
    channel = Channel(path=env.socket)
    try:
        yield DevicePluginStub(channel)
    finally:
        channel.close()


async def allocate(stub: DevicePluginStub, *ids: str) -> pb.ContainerAllocateResponse:
    response = await stub.Allocate(
        pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=list(ids))]),
        timeout=10,
    )
    assert len(response.container_responses) == 1
    return response.container_responses[0]


async def preferred(
    stub: DevicePluginStub, available: list[str], size: int, must: list[str] | None = None
) -> list[str]:
    request = pb.PreferredAllocationRequest(
        container_requests=[
            pb.ContainerPreferredAllocationRequest(
                available_deviceIDs=available, must_include_deviceIDs=must or [], allocation_size=size
            )
        ]
    )
    response = await stub.GetPreferredAllocation(request, timeout=10)
    assert len(response.container_responses) == 1
    return list(response.container_responses[0].deviceIDs)


async def seeded(env: Env, pod: dict, *, lock: bool = True) -> None:
    env.server.put(pod)
    name = pod["metadata"]["name"]
    if lock:
        lock_node(env.server, name)
    await eventually(lambda: env.plugin.pods.pod(f"default/{name}") is not None)
    if lock:
        await eventually(lambda: env.plugin.pods.lock_owner() == f"default/{name}")


async def test_multi_container_with_init_containers() -> None:
    devices = (
        (dev("GPU-0", 1000, 30),),  # init i0
        (),  # init i1 (no GPU)
        (dev("GPU-1", 2000, 40), dev("GPU-2", 2500, 40)),  # c0
        (),  # c1 (no GPU)
        (dev("GPU-3", 500, 10),),  # c2
    )
    pod = scheduled_pod(
        "multi",
        devices,
        init=("i0", "i1"),
        containers=("c0", "c1", "c2"),
        env={"c2": [{"name": "CUDA_DISABLE_CONTROL", "value": "true"}]},
    )
    async with running_plugin() as (env, _), stub_for(env) as stub:
        await seeded(env, pod)
        uid = env.server.get("Pod", "default", "multi")["metadata"]["uid"]

        r0 = await allocate(stub, "GPU-0-2")
        assert dict(r0.envs) | {"CUDA_DEVICE_MEMORY_SHARED_CACHE": ""} == {
            "NVIDIA_VISIBLE_DEVICES": "GPU-0",
            "CUDA_DEVICE_MEMORY_LIMIT_0": "1000m",
            "CUDA_DEVICE_SM_LIMIT": "30",
            "CUDA_DEVICE_MEMORY_SHARED_CACHE": "",
        }
        assert r0.envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"].startswith(f"{env.hook}/vgpu/")
        mounts = {m.container_path: (m.host_path, m.read_only) for m in r0.mounts}
        assert mounts == {
            f"{env.hook}/vgpu/libvgpu.so": (f"{env.hook}/vgpu/libvgpu.so", True),
            f"{env.hook}/vgpu": (f"{env.hook}/vgpu/containers/{uid}_i0", False),
            "/tmp/vgpulock": ("/tmp/vgpulock", False),
            "/etc/ld.so.preload": (f"{env.hook}/vgpu/ld.so.preload", True),
        }
        assert await asyncio.to_thread(Path(env.hook, "vgpu", "containers", f"{uid}_i0").is_dir)
        ann = stored_annotations(env.server, "Pod", "multi")
        assert (
            ann[DEVICES_TO_ALLOCATE] == ";;GPU-1,NVIDIA,2000,40:GPU-2,NVIDIA,2500,40:;;GPU-3,NVIDIA,500,10:;"
        )
        assert ann[BIND_PHASE] == "allocating"

        r1 = await allocate(stub, "GPU-2-0", "GPU-1-3")  # the very next call: the overlay, not a stale cache
        assert r1.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-1,GPU-2"
        assert (r1.envs["CUDA_DEVICE_MEMORY_LIMIT_0"], r1.envs["CUDA_DEVICE_MEMORY_LIMIT_1"]) == (
            "2000m",
            "2500m",
        )
        assert {m.host_path for m in r1.mounts} >= {f"{env.hook}/vgpu/containers/{uid}_c0"}

        r2 = await allocate(stub, "GPU-3-1")
        assert r2.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-3" and r2.envs["CUDA_DEVICE_SM_LIMIT"] == "10"
        assert "/etc/ld.so.preload" not in {m.container_path for m in r2.mounts}  # CUDA_DISABLE_CONTROL
        assert f"{env.hook}/vgpu/containers/{uid}_c2" in {m.host_path for m in r2.mounts}

        ann = stored_annotations(env.server, "Pod", "multi")
        assert ann[DEVICES_TO_ALLOCATE] == ";;;;;"
        assert ann[BIND_PHASE] == "success"
        assert ann[DEVICES_ALLOCATED] == pod["metadata"]["annotations"][DEVICES_ALLOCATED]  # never touched
        assert NODE_LOCK not in stored_annotations(env.server, "Node", NODE, None)


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        (("GPU-1-0", "GPU-1-1"), "device number not matched"),
        (("GPU-9-0",), "unknown device IDs"),
    ],
)
async def test_mismatch_fails_closed(ids: tuple[str, ...], message: str) -> None:
    pod = scheduled_pod("bad", ((dev("GPU-1", 1000, 10),),))
    async with running_plugin() as (env, _), stub_for(env) as stub:
        await seeded(env, pod)
        with pytest.raises(GRPCError) as err:
            await allocate(stub, *ids)
        assert err.value.status is Status.FAILED_PRECONDITION and message in str(err.value.message)
        ann = stored_annotations(env.server, "Pod", "bad")
        assert ann[BIND_PHASE] == "failed"
        assert ann[DEVICES_TO_ALLOCATE] == pod["metadata"]["annotations"][DEVICES_TO_ALLOCATE]  # unchanged
        assert NODE_LOCK not in stored_annotations(env.server, "Node", NODE, None)


async def test_no_pending_pod_refuses_and_changes_nothing() -> None:
    stranger = scheduled_pod("stranger", ((dev("GPU-0", 1000, 10),),))
    del stranger["metadata"]["annotations"][BIND_PHASE]  # never bound by hamid
    async with running_plugin() as (env, _), stub_for(env) as stub:
        await seeded(env, stranger, lock=False)
        with pytest.raises(GRPCError, match="no pod on this node"):
            await allocate(stub, "GPU-0-0")
        assert BIND_PHASE not in stored_annotations(env.server, "Pod", "stranger")


async def test_identity_from_lock_and_exact_match() -> None:
    """Only the node lock proves a pod (issue 16): without it nothing is served, however well the
    pod's own annotations match kubelet's pick."""
    p1 = scheduled_pod("p1", ((dev("GPU-0", 1000, 10),),))
    p2 = scheduled_pod("p2", ((dev("GPU-0", 3000, 10),),))
    async with running_plugin() as (env, _), stub_for(env) as stub:
        await seeded(env, p1, lock=False)
        await seeded(env, p2, lock=False)
        with pytest.raises(GRPCError, match="no pod holds the node lock"):  # both want GPU-0, no lock
            await allocate(stub, "GPU-0-0")
        for name in ("p1", "p2"):  # the refused call marked nothing: no pod was proven
            assert stored_annotations(env.server, "Pod", name)[BIND_PHASE] == "allocating"
        lock_node(env.server, "p2")
        await eventually(lambda: env.plugin.pods.lock_owner() == "default/p2")
        # p1 waits too (a holder the scheduler took the lock from): kubelet may be admitting either
        with pytest.raises(GRPCError, match="cannot tell which pod kubelet is admitting"):
            await allocate(stub, "GPU-0-1")
        env.server.delete("Pod", "default", "p1")  # refused, deleted: its controller places it again
        await eventually(lambda: env.plugin.pods.pod("default/p1") is None)
        r = await allocate(stub, "GPU-0-1")
        assert r.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m"  # p2's limit, not p1's
        assert stored_annotations(env.server, "Pod", "p2")[BIND_PHASE] == "success"
        await eventually(lambda: env.plugin.pods.lock_owner() is None)
        await seeded(env, p1, lock=False)
        # p1 is the only one waiting and its annotation matches exactly: still not proof
        with pytest.raises(GRPCError, match="no pod holds the node lock") as err:
            await allocate(stub, "GPU-0-2")
        assert err.value.status is Status.FAILED_PRECONDITION
        assert stored_annotations(env.server, "Pod", "p1")[BIND_PHASE] == "allocating"
        assert env.plugin.allocator.refusals["unproven-pod"] == 2
        assert env.plugin.allocator.refusals["ambiguous-pod"] == 1
        lock_node(env.server, "p1")
        await eventually(lambda: env.plugin.pods.lock_owner() == "default/p1")
        r = await allocate(stub, "GPU-0-2")
        assert r.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "1000m"


@pytest.mark.parametrize("config", [None, PREFERRED], ids=["preferred-off", "preferred-on"])
@pytest.mark.parametrize("alignment", ["", "best-effort"])
async def test_runtime_follows_the_annotation_not_kubelets_gpus(
    config: NodeConfig | None, alignment: str
) -> None:
    """kubelet's replicas on other GPUs than the annotation: the runtime gets the annotated (accounted)
    GPUs and amounts in both modes, and a log line names both sets (a warning when kubelet was given a
    preference it did not honour, info when GetPreferredAllocation is off and its pick is arbitrary)."""
    extra = {NUMA_ALIGNMENT: alignment} if alignment else {}
    pod = scheduled_pod("p", ((dev("GPU-3", 1200, 20), dev("GPU-2", 800, 20)),), extra=extra)
    allocated = pod["metadata"]["annotations"][DEVICES_ALLOCATED]
    async with running_plugin(config) as (env, _), stub_for(env) as stub:
        await seeded(env, pod)
        with structlog.testing.capture_logs() as logs:
            r = await allocate(stub, "GPU-0-0", "GPU-1-2")  # kubelet's pick: two other GPUs (NUMA 0)
        assert r.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-3,GPU-2"
        assert (r.envs["CUDA_DEVICE_MEMORY_LIMIT_0"], r.envs["CUDA_DEVICE_MEMORY_LIMIT_1"]) == (
            "1200m",
            "800m",
        )
        assert r.envs["CUDA_DEVICE_SM_LIMIT"] == "20"
        notes = stored_annotations(env.server, "Pod", "p")
        assert notes[DEVICES_ALLOCATED] == allocated  # the accounted allocation, untouched
        assert notes[DEVICES_TO_ALLOCATE] == ";" and notes[BIND_PHASE] == "success"
        assert NODE_LOCK not in stored_annotations(env.server, "Node", NODE, None)
        level = "info" if config is None else "warning"
        (warning,) = [
            e
            for e in logs
            if e["log_level"] == level and e["event"] == "kubelet_pick_differs_from_annotation"
        ]
        assert "other GPUs" in warning["reason"]
        assert "the runtime follows the scheduler's accounting" in warning["reason"]
        assert "NUMA alignment was not achieved" in warning["reason"]
        assert warning["annotated"] == ["GPU-3", "GPU-2"] and warning["kubelet"] == ["GPU-0", "GPU-1"]
        assert warning["numa_alignment"] == alignment


async def test_kubelet_on_the_annotated_gpus_logs_no_warning() -> None:
    pod = scheduled_pod("p", ((dev("GPU-3", 1200, 20), dev("GPU-2", 800, 20)),))
    async with running_plugin(PREFERRED) as (env, _), stub_for(env) as stub:
        await seeded(env, pod)
        with structlog.testing.capture_logs() as logs:
            r = await allocate(stub, "GPU-2-1", "GPU-3-0")
        assert r.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-3,GPU-2"
        assert not [e for e in logs if e["log_level"] in ("warning", "error")]


async def test_two_replicas_of_one_gpu_still_serve_the_annotation() -> None:
    """kubelet's replica bookkeeping put both slots on one GPU (no distinct preference was possible):
    Allocate still serves the two annotated GPUs instead of refusing."""
    pod = scheduled_pod("p", ((dev("GPU-2", 900, 9), dev("GPU-3", 800, 8)),))
    async with running_plugin(PREFERRED) as (env, _), stub_for(env) as stub:
        await seeded(env, pod)
        r = await allocate(stub, "GPU-0-0", "GPU-0-1")
        assert r.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-2,GPU-3"
        assert stored_annotations(env.server, "Pod", "p")[BIND_PHASE] == "success"


async def test_preferred_allocation_annotation_driven() -> None:
    pod = scheduled_pod(
        "p",
        ((), (dev("GPU-1", 1000, 10), dev("GPU-0", 1000, 10)), (dev("GPU-3", 500, 5),)),
        init=("i0",),
        containers=("a", "b"),
    )
    available = [f"GPU-{g}-{i}" for g in range(4) for i in range(4)]
    async with running_plugin(PREFERRED) as (env, _), stub_for(env) as stub:
        await seeded(env, pod)
        assert await preferred(stub, available, 2) == ["GPU-1-0", "GPU-0-0"]
        assert await preferred(stub, available, 2, ["GPU-0-3"]) == ["GPU-0-3", "GPU-1-0"]
        assert await preferred(stub, available, 3) == []  # annotation cannot fill: no opinion
        await allocate(stub, "GPU-1-0", "GPU-0-0")
        assert await preferred(stub, available, 1) == ["GPU-3-0"]  # next pending entry
        # GPU-3 is not offered (kubelet restricted to NUMA 0): the default handler logs, the annotation
        # stands, and the answer is one replica of the GPU with the most free replicas (ties by UUID)
        assert await preferred(stub, available[:8], 1) == ["GPU-0-0"]
        assert stored_annotations(env.server, "Pod", "p")[BIND_PHASE] == "allocating"


@pytest.mark.parametrize("alignment", ["", "best-effort", "strict"])
async def test_fallback_preference_is_distinct_gpus(alignment: str) -> None:
    """Refit off (default handler): a 2-GPU container is offered replicas of two GPUs, never one GPU
    twice (kubelet's bookkeeping keeps one slot per GPU); Allocate serves the annotated GPUs."""
    extra = {NUMA_ALIGNMENT: alignment} if alignment else {}
    pod = scheduled_pod("p", ((dev("GPU-2", 900, 9), dev("GPU-3", 800, 8)),), extra=extra)
    numa0 = [f"GPU-{g}-{i}" for g in (0, 1) for i in range(4)]
    async with running_plugin(PREFERRED) as (env, _), stub_for(env) as stub:
        await seeded(env, pod)
        # sorted, "no preference" would let kubelet take GPU-0-0 and GPU-0-1 (one GPU twice)
        assert await preferred(stub, numa0, 2) == ["GPU-0-0", "GPU-1-0"]
        # GPU-0 has fewer free replicas now: GPU-1 first; a must-include replica is kept
        assert await preferred(stub, numa0[1:], 2) == ["GPU-1-0", "GPU-0-1"]
        assert await preferred(stub, numa0, 2, ["GPU-0-2"]) == ["GPU-0-2", "GPU-1-0"]
        # only one physical GPU offered: distinct GPUs impossible, no preference
        assert await preferred(stub, numa0[:4], 2) == []
        r = await allocate(stub, "GPU-0-0", "GPU-1-0")
        assert r.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-2,GPU-3"  # the accounted GPUs, not kubelet's
        assert r.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "900m"
        assert r.envs["CUDA_DEVICE_MEMORY_LIMIT_1"] == "800m"


async def test_fallback_preference_keeps_the_annotated_gpu_it_offers() -> None:
    """A partial mismatch prefers the annotated GPU kubelet still offers; the other slot goes elsewhere."""
    pod = scheduled_pod("p", ((dev("GPU-1", 900, 9), dev("GPU-3", 800, 8)),))
    numa0 = [f"GPU-{g}-{i}" for g in (0, 1) for i in range(4)]
    async with running_plugin(PREFERRED) as (env, _), stub_for(env) as stub:
        await seeded(env, pod)
        assert await preferred(stub, numa0, 2) == ["GPU-1-0", "GPU-0-0"]


async def test_preferred_without_pending_pod_is_no_opinion() -> None:
    async with running_plugin(PREFERRED) as (env, _), stub_for(env) as stub:
        assert await preferred(stub, ["GPU-0-0", "GPU-1-0"], 1) == []


class Handler:
    """A stand-in for the refit client behind the mismatch seam."""

    def __init__(self, result: ContainerDevices | None = None, error: str | None = None) -> None:
        self.result, self.error = result, error
        self.calls: list[NumaMismatch] = []

    async def __call__(self, mismatch: NumaMismatch) -> ContainerDevices | None:
        self.calls.append(mismatch)
        if self.error:
            raise AllocationError(self.error)
        return self.result


async def test_mismatch_seam_replacement_and_failures() -> None:
    pod = scheduled_pod(
        "p",
        ((), (dev("GPU-3", 700, 7),)),
        init=("setup",),
        containers=("main",),
        extra={NUMA_ALIGNMENT: "strict"},
    )
    numa0 = [f"GPU-{g}-{i}" for g in (0, 1) for i in range(4)]
    handler = Handler(result=(dev("GPU-1", 700, 7),))
    async with running_plugin(PREFERRED, mismatch_handler=handler) as (env, _), stub_for(env) as stub:
        await seeded(env, pod)
        assert await preferred(stub, numa0, 1) == ["GPU-1-0"]
        call = handler.calls[0]
        assert (call.container_index, call.container_name, call.node_name) == (1, "main", NODE)
        assert [d.uuid for d in call.annotated] == ["GPU-3"] and call.missing == ("GPU-3",)
        assert call.allowed_uuids == ("GPU-0", "GPU-1")

        handler.result = (dev("GPU-2", 700, 7),)  # committed but not offered by kubelet
        with pytest.raises(GRPCError, match="numa refit committed but kubelet cannot honor"):
            await preferred(stub, numa0, 1)
        assert stored_annotations(env.server, "Pod", "p")[BIND_PHASE] == "failed"
        assert NODE_LOCK not in stored_annotations(env.server, "Node", NODE, None)


async def test_mismatch_seam_refusal_is_a_grpc_error() -> None:
    pod = scheduled_pod("p", ((dev("GPU-3", 700, 7),),))
    handler = Handler(error="numa-alignment strict: no GPU on NUMA 0 fits")
    async with running_plugin(PREFERRED, mismatch_handler=handler) as (env, _), stub_for(env) as stub:
        await seeded(env, pod)
        with pytest.raises(GRPCError) as err:
            await preferred(stub, ["GPU-0-0", "GPU-1-0"], 1)
        assert err.value.status is Status.FAILED_PRECONDITION and "strict" in str(err.value.message)
        assert stored_annotations(env.server, "Pod", "p")[BIND_PHASE] == "failed"


async def test_registration_annotation_written_once_and_rewritten_on_change() -> None:
    async with running_plugin(register_interval=0.05) as (env, _):
        registrar = env.plugin.registrar
        await eventually(lambda: registrar.patches == 1)
        value = stored_annotations(env.server, "Node", NODE, None)[NODE_REGISTER]
        assert [d.numa for d in decode_node_devices(value)] == [0, 0, 1, 1]
        await eventually(
            lambda: env.plugin.pods.node()["metadata"]["annotations"].get(NODE_REGISTER) == value
        )
        assert not await registrar.register_once()  # unchanged: no patch
        env.server.patch("Node", None, NODE, {"metadata": {"annotations": {NODE_REGISTER: None}}})
        await eventually(lambda: registrar.patches == 2)  # someone removed it: written again
        env.plugin.inventory.mark_unhealthy("GPU-2", "XID 79")
        await eventually(lambda: registrar.patches == 3)
        latest = decode_node_devices(stored_annotations(env.server, "Node", NODE, None)[NODE_REGISTER])
        assert [d.health for d in latest] == [True, True, False, True]


async def test_must_include_filling_the_size_still_asks_for_a_refit() -> None:
    """kubelet must include a GPU-0 replica and the size is 1: the annotated GPU-3 (NUMA 1) is still
    reported to the refit seam, and its replacement is preferred."""
    pod = scheduled_pod("p", ((dev("GPU-3", 700, 7),),), extra={NUMA_ALIGNMENT: "best-effort"})
    numa0 = [f"GPU-{g}-{i}" for g in (0, 1) for i in range(4)]
    handler = Handler(result=(dev("GPU-0", 700, 7),))
    async with running_plugin(PREFERRED, mismatch_handler=handler) as (env, _), stub_for(env) as stub:
        await seeded(env, pod)
        assert await preferred(stub, numa0, 1, ["GPU-0-2"]) == ["GPU-0-2"]
        (call,) = handler.calls
        assert call.missing == ("GPU-3",)


async def test_an_allocate_never_serves_nor_marks_a_new_pod_of_the_same_name() -> None:
    """The pod being allocated is force-deleted and created again under its name (a StatefulSet
    replica) while its consume patch is on the wire: the retry after the conflict finds the new pod
    and refuses, serving it nothing (it served the old container the new pod's booking and consumed
    it), and the failure path marks and unlocks nothing of the new pod (it set it failed and
    released the lock it holds)."""
    old = scheduled_pod("a", ((dev("GPU-0", 1000, 10),),))
    new = scheduled_pod("a", ((dev("GPU-1", 7000, 60),),))
    async with running_plugin() as (env, _), stub_for(env) as stub:
        await seeded(env, old)
        old_uid = env.plugin.pods.pod("default/a")["metadata"]["uid"]
        rule = env.server.faults.add_latency(1.0, verb="patch", path_pattern="/pods/a$")

        async def recreate() -> None:
            await asyncio.sleep(0.3)  # the old pod's consume patch is on the wire
            env.server.faults.remove(rule.id)
            env.server.delete("Pod", "default", "a")
            env.server.put(new)  # the new pod, bound here, its /bind took the lock (named default/a)
            lock_node(env.server, "a")
            await eventually(lambda: env.plugin.pods.pod("default/a")["metadata"]["uid"] != old_uid)

        task = asyncio.create_task(recreate())
        with pytest.raises(GRPCError, match="replaced by a new pod of that name"):
            await allocate(stub, "GPU-0-0")
        await task
        annotations = stored_annotations(env.server, "Pod", "a")
        assert annotations[BIND_PHASE] == BIND_PHASE_ALLOCATING  # not marked failed
        assert annotations[DEVICES_TO_ALLOCATE] == new["metadata"]["annotations"][DEVICES_TO_ALLOCATE]
        assert NODE_LOCK in stored_annotations(env.server, "Node", NODE, None)  # still the new pod's
