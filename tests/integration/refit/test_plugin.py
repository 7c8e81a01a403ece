"""GetPreferredAllocation with NUMA refit over unix-socket gRPC: the best-effort/strict matrix and e2e."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from grpclib import GRPCError
from grpclib.client import Channel
from grpclib.const import Status

from hamid._proto.deviceplugin.v1beta1 import api_pb2 as pb
from hamid._proto.deviceplugin.v1beta1.api_grpc import DevicePluginStub
from hamid.model import annotations as ann
from hamid.model import hamicore
from hamid.model.devices import ContainerDevices
from hamid.model.nodeconfig import NodeConfig
from hamid.model.resources import ResourceConfig
from hamid.plugin.app import NodeSetup, PluginApp
from hamid.plugin.numa_policy import Door, MismatchHandler, NumaMismatch, make_mismatch_handler
from hamid.plugin.options import PluginOptions
from hamid.plugin.refit_client import RefitClient, RefitClientConfig
from tests.fixtures.tls import TLSFiles
from tests.integration.plugin.helpers import (
    GPUS,
    NODE,
    Env,
    lock_node,
    running_plugin,
    scheduled_pod,
    short_dir,
)
from tests.integration.refit.fake_scheduler import FakeScheduler, fake_scheduler
from tests.integration.refit.harness import d, eventually, refit_env

PREFERRED = NodeConfig(device_split_count=4, enable_numa_topology=True, enable_get_preferred_allocation=True)
NUMA1 = [f"GPU-{g}-{i}" for g in (2, 3) for i in range(4)]
#: No refit applied: one replica of the GPU with the most available replicas (ties by UUID); Allocate
#: then still serves the annotated GPU-0 (the accounted one), never kubelet's GPU-2.
FALLBACK_PREFERENCE = ["GPU-2-0"]


@contextlib.asynccontextmanager
async def stub(socket: str) -> AsyncIterator[DevicePluginStub]:
    channel = Channel(path=socket)
    try:
        yield DevicePluginStub(channel)
    finally:
        channel.close()


async def preferred(
    socket: str, available: list[str], size: int = 1, must: list[str] | None = None
) -> list[str]:
    request = pb.PreferredAllocationRequest(
        container_requests=[
            pb.ContainerPreferredAllocationRequest(
                available_deviceIDs=available, must_include_deviceIDs=must or [], allocation_size=size
            )
        ]
    )
    async with stub(socket) as s:
        response = await s.GetPreferredAllocation(request, timeout=10)
    return list(response.container_responses[0].deviceIDs)


async def allocate(socket: str, ids: list[str]) -> dict[str, str]:
    """One Allocate for one container; its envs."""
    request = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)])
    async with stub(socket) as s:
        response = await s.Allocate(request, timeout=10)
    return dict(response.container_responses[0].envs)


def assert_served_the_annotation(env: Env, envs: dict[str, str]) -> None:
    """Runtime == the (unchanged) allocation annotation == what the scheduler booked: GPU-0, 1000 MiB."""
    assert envs[hamicore.ENV_VISIBLE_DEVICES] == "GPU-0"
    assert envs[hamicore.memory_limit_env(0)] == "1000m"
    pod = env.server.get("Pod", "default", "p")
    assert pod is not None
    notes = pod["metadata"]["annotations"]
    assert notes[ann.DEVICES_ALLOCATED] == "GPU-0,NVIDIA,1000,10:;"
    assert notes[ann.DEVICES_TO_ALLOCATE] == ";" and notes[ann.BIND_PHASE] == ann.BIND_PHASE_SUCCESS


async def seed(env: Env, pod: dict[str, Any]) -> None:
    stored = env.server.put(pod)
    lock_node(env.server, pod["metadata"]["name"])
    key = f"default/{pod['metadata']['name']}"
    rv = stored["metadata"]["resourceVersion"]
    await eventually(
        lambda: (
            (env.plugin.pods.pod(key) or {}).get("metadata", {}).get("resourceVersion") == rv
            and env.plugin.pods.lock_owner() == key
        )
    )


def pod_with(mode: str | None, layout: tuple = ((d("GPU-0", 1000, 10),),), **kw: Any) -> dict[str, Any]:
    extra = {ann.NUMA_ALIGNMENT: mode} if mode is not None else {}
    return scheduled_pod("p", layout, extra=extra, **kw)


@contextlib.asynccontextmanager
async def plugin_with(
    fake: FakeScheduler | None, tls: TLSFiles, config: NodeConfig = PREFERRED
) -> AsyncIterator[Env]:
    client = (
        RefitClient(RefitClientConfig(endpoint=fake.url, ca_file=str(tls.ca_file), token_file=None))
        if fake is not None
        else None
    )
    async with running_plugin(config, mismatch_handler=make_mismatch_handler(client)) as (env, _):
        yield env


SUCCESS = {"succeeded": True, "containerDevices": "GPU-2,NVIDIA,1000,10:"}
REFUSED = {"succeeded": False, "failureReason": "no allowed device fits: 2/2 CardInsufficientMemory"}


@pytest.mark.parametrize("mode", ["best-effort", "strict", "BEST-EFFORT "])
async def test_enabled_success_returns_replicas_of_refitted_gpu(tls_files: TLSFiles, mode: str) -> None:
    async with fake_scheduler(tls_files, body=SUCCESS) as fake, plugin_with(fake, tls_files) as env:
        await seed(env, pod_with(mode))
        assert await preferred(env.socket, NUMA1) == ["GPU-2-0"]
        (sent,) = fake.requests
        assert sent["containerIndex"] == 0 and sent["containerName"] == "main"
        assert sent["allowedDeviceUUIDs"] == ["GPU-2", "GPU-3"] and sent["nodeName"] == NODE
        assert sent["deviceType"] == "NVIDIA"


async def test_enabled_refused_best_effort_runs_on_the_annotated_gpu(tls_files: TLSFiles) -> None:
    async with fake_scheduler(tls_files, body=REFUSED) as fake, plugin_with(fake, tls_files) as env:
        await seed(env, pod_with("best-effort"))
        assert await preferred(env.socket, NUMA1) == FALLBACK_PREFERENCE
        assert len(fake.requests) == 1
        pod = env.server.get("Pod", "default", "p")
        assert pod is not None and pod["metadata"]["annotations"][ann.BIND_PHASE] == ann.BIND_PHASE_ALLOCATING
        # "no allowed device fits": running on kubelet's GPU-2 would over-commit it; the accounted GPU-0
        assert_served_the_annotation(env, await allocate(env.socket, FALLBACK_PREFERENCE))


@pytest.mark.parametrize(
    ("kw", "want"),
    [
        ({"body": REFUSED}, "numa-alignment strict: scheduler refused refit: no allowed device fits"),
        ({"status": 503, "body": {}}, "numa-alignment strict: scheduler refit returned status 503"),
    ],
)
async def test_enabled_failure_strict_fails_allocation(tls_files: TLSFiles, kw: dict, want: str) -> None:
    async with fake_scheduler(tls_files, **kw) as fake, plugin_with(fake, tls_files) as env:
        await seed(env, pod_with("strict"))
        with pytest.raises(GRPCError) as info:
            await preferred(env.socket, NUMA1)
        assert info.value.status is Status.FAILED_PRECONDITION
        assert want in str(info.value.message)
        await eventually(lambda: env.plugin.pods.lock_owner() is None)
        pod = env.server.get("Pod", "default", "p")
        assert pod is not None and pod["metadata"]["annotations"][ann.BIND_PHASE] == ann.BIND_PHASE_FAILED
        node = env.server.get("Node", None, NODE)
        assert node is not None and ann.NODE_LOCK not in (node["metadata"].get("annotations") or {})


@pytest.mark.parametrize("mode", ["best-effort", "strict"])
async def test_committed_but_unmappable_fails_in_both_modes(tls_files: TLSFiles, mode: str) -> None:
    body = {"succeeded": True, "containerDevices": "GPU-1,NVIDIA,1000,10:"}
    async with fake_scheduler(tls_files, body=body) as fake, plugin_with(fake, tls_files) as env:
        await seed(env, pod_with(mode))
        with pytest.raises(GRPCError) as info:
            await preferred(env.socket, NUMA1)
        assert "numa refit committed but kubelet cannot honor the selection" in str(info.value.message)
        pod = env.server.get("Pod", "default", "p")
        assert pod is not None and pod["metadata"]["annotations"][ann.BIND_PHASE] == ann.BIND_PHASE_FAILED


@pytest.mark.parametrize("mode", ["best-effort", "strict", None, "true"])
async def test_disabled_only_logs(tls_files: TLSFiles, mode: str | None) -> None:
    async with plugin_with(None, tls_files) as env:
        await seed(env, pod_with(mode))
        assert await preferred(env.socket, NUMA1) == FALLBACK_PREFERENCE
        pod = env.server.get("Pod", "default", "p")
        assert pod is not None and pod["metadata"]["annotations"][ann.BIND_PHASE] == ann.BIND_PHASE_ALLOCATING
        assert_served_the_annotation(env, await allocate(env.socket, FALLBACK_PREFERENCE))


@pytest.mark.parametrize("mode", [None, "true", ""])
async def test_enabled_without_valid_opt_in_sends_nothing(tls_files: TLSFiles, mode: str | None) -> None:
    async with fake_scheduler(tls_files, body=SUCCESS) as fake, plugin_with(fake, tls_files) as env:
        await seed(env, pod_with(mode))
        assert await preferred(env.socket, NUMA1) == FALLBACK_PREFERENCE
        assert fake.requests == []
        assert_served_the_annotation(env, await allocate(env.socket, FALLBACK_PREFERENCE))


async def test_mig_node_never_refits(tls_files: TLSFiles) -> None:
    mig = NodeConfig(
        device_split_count=4,
        enable_numa_topology=True,
        enable_get_preferred_allocation=True,
        operating_mode="mig",
    )
    async with fake_scheduler(tls_files, body=SUCCESS) as fake, plugin_with(fake, tls_files, mig) as env:
        await seed(env, pod_with("strict"))
        assert await preferred(env.socket, NUMA1) == []
        assert fake.requests == []


async def test_available_superset_and_index_in_pending_annotation(tls_files: TLSFiles) -> None:
    layout = ((), (d("GPU-0", 1000, 10), d("GPU-1", 1000, 10)))
    body = {"succeeded": True, "containerDevices": "GPU-2,NVIDIA,1000,10:GPU-3,NVIDIA,1000,10:"}
    async with fake_scheduler(tls_files, body=body) as fake, plugin_with(fake, tls_files) as env:
        await seed(env, pod_with("strict", layout, init=("setup",)))
        # kubelet's must-include is narrower than what is available: all available GPUs are allowed,
        # and the answer still honours must-include
        assert await preferred(env.socket, NUMA1, size=2, must=["GPU-2-1"]) == ["GPU-2-1", "GPU-3-0"]
        (sent,) = fake.requests
        assert sent["allowedDeviceUUIDs"] == ["GPU-2", "GPU-3"]
        assert sent["containerIndex"] == 1 and sent["containerName"] == "main"


async def test_end_to_end_with_the_real_scheduler(tls_files: TLSFiles, tmp_path: Path) -> None:
    """Plugin → real /refit (mTLS) → one patch; Allocate then serves the refitted GPU."""
    async with refit_env(tls_files, tmp_path) as senv:
        senv.server.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        pair = tls_files.client(f"system:node:{NODE}")
        refit = RefitClientConfig(
            endpoint=senv.cluster,
            ca_file=str(tls_files.ca_file),
            client_cert_file=str(pair.cert_file),
            client_key_file=str(pair.key_file),
            token_file=None,
        )
        with short_dir() as directory:
            setup = NodeSetup(PREFERRED, ResourceConfig(), "nvidia.com/gpu", GPUS, None)
            options = PluginOptions(
                node_name=NODE,
                device_plugin_dir=str(directory),
                hook_path=str(directory / "hook"),
                refit=refit,
                metrics_listen="",
                api_server=senv.server.url,
            )
            app = PluginApp(options, setup=setup, numa=False)
            await app.start()
            plugin = app.plugin
            try:
                await app.wait_synced()
                await eventually(lambda: NODE in senv.scheduler.ledger.nodes)
                await eventually(lambda: plugin.connector.socket_path.exists())
                pod = await senv.place(
                    "p",
                    NODE,
                    ((d("GPU-0", 1000, 10),),),
                    annotations={ann.NUMA_ALIGNMENT: "strict"},
                )
                lock_node(senv.server, "p")
                await eventually(lambda: plugin.pods.lock_owner() == "default/p")
                socket = str(plugin.connector.socket_path)
                chosen = await preferred(socket, NUMA1)
                assert len(chosen) == 1 and chosen[0].rsplit("-", 1)[0] in ("GPU-2", "GPU-3")
                new_gpu = chosen[0].rsplit("-", 1)[0]
                async with stub(socket) as s:
                    answer = await s.Allocate(
                        pb.AllocateRequest(
                            container_requests=[pb.ContainerAllocateRequest(devices_ids=chosen)]
                        ),
                        timeout=10,
                    )
                envs = answer.container_responses[0].envs
                assert envs[hamicore.ENV_VISIBLE_DEVICES] == new_gpu
                annotations = senv.annotations("p")
                assert annotations[ann.DEVICES_ALLOCATED] == f"{new_gpu},NVIDIA,1000,10:;"
                assert annotations[ann.DEVICES_TO_ALLOCATE] == ";"
                assert annotations[ann.BIND_PHASE] == ann.BIND_PHASE_SUCCESS
                await eventually(
                    lambda: (
                        senv.scheduler.ledger.snapshot()[NODE][new_gpu] == (1, 1000, 10)
                        and senv.scheduler.ledger.snapshot()[NODE]["GPU-0"] == (0, 0, 0)
                    )
                )
                assert pod["metadata"]["uid"] == senv.server.get("Pod", "default", "p")["metadata"]["uid"]
            finally:
                await app.stop()


# -- one policy, two doors (issue 18) ----------------------------------------------------------

UNMAPPABLE = {"succeeded": True, "containerDevices": "GPU-1,NVIDIA,1000,10:"}
#: kubelet's pick on NUMA 1 when it asks for no preference (or after the preference).
KUBELET_PICK = ["GPU-2-0"]


def committing(policy: MismatchHandler, env_box: list[Env]) -> MismatchHandler:
    """The real policy; a committed refit is written to the pod as the scheduler's commit patch does."""

    async def handler(mismatch: NumaMismatch) -> ContainerDevices | None:
        devices = await policy(mismatch)
        if devices is not None:
            value = ann.encode_pod_devices((devices,))
            notes = {ann.DEVICES_ALLOCATED: value, ann.DEVICES_TO_ALLOCATE: value}
            env_box[0].server.patch("Pod", "default", "p", {"metadata": {"annotations": notes}})
        return devices

    return handler


async def through_door(env: Env, door: Door) -> dict[str, str]:
    """kubelet's calls for one container at ``door``: with or without GetPreferredAllocation first."""
    if door is Door.PREFERRED:
        answer = await preferred(env.socket, NUMA1)
        return await allocate(env.socket, answer)
    return await allocate(env.socket, KUBELET_PICK)


@pytest.mark.parametrize("door", list(Door))
@pytest.mark.parametrize(
    ("mode", "scheduler", "served", "requests"),
    [
        ("best-effort", SUCCESS, "GPU-2", 1),
        ("strict", SUCCESS, "GPU-2", 1),
        ("best-effort", REFUSED, "GPU-0", 1),
        ("strict", REFUSED, "numa-alignment strict: scheduler refused refit: no allowed device fits", 1),
        ("best-effort", None, "GPU-0", 0),
        ("strict", None, "GPU-0", 0),
        (None, SUCCESS, "GPU-0", 0),
        ("best-effort", UNMAPPABLE, "numa refit committed but kubelet cannot honor the selection", 1),
        ("strict", UNMAPPABLE, "numa refit committed but kubelet cannot honor the selection", 1),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
async def test_one_policy_at_both_doors(
    tls_files: TLSFiles, door: Door, mode: str | None, scheduler: dict | None, served: str, requests: int
) -> None:
    """The README's behaviour table, row by row, whether kubelet asks for a preference or not: a
    refit serves the refitted GPU, a refusal keeps the accounted GPU (best-effort) or fails the
    allocation (strict), refit disabled keeps it in both modes, and one policy run per container."""
    async with contextlib.AsyncExitStack() as stack:
        fake = (
            None
            if scheduler is None
            else await stack.enter_async_context(fake_scheduler(tls_files, body=scheduler))
        )
        client = (
            None
            if fake is None
            else RefitClient(
                RefitClientConfig(endpoint=fake.url, ca_file=str(tls_files.ca_file), token_file=None)
            )
        )
        box: list[Env] = []
        handler = committing(make_mismatch_handler(client), box)
        env, _ = await stack.enter_async_context(running_plugin(PREFERRED, mismatch_handler=handler))
        box.append(env)
        await seed(env, pod_with(mode))

        def pod_notes() -> dict[str, str]:
            return (env.server.get("Pod", "default", "p") or {})["metadata"]["annotations"]

        if served.startswith("GPU-"):
            envs = await through_door(env, door)
            assert envs[hamicore.ENV_VISIBLE_DEVICES] == served
            assert envs[hamicore.memory_limit_env(0)] == "1000m"
            assert pod_notes()[ann.DEVICES_ALLOCATED] == f"{served},NVIDIA,1000,10:;"
            assert pod_notes()[ann.BIND_PHASE] == ann.BIND_PHASE_SUCCESS
        else:
            with pytest.raises(GRPCError) as info:
                await through_door(env, door)
            assert info.value.status is Status.FAILED_PRECONDITION and served in str(info.value.message)
            assert pod_notes()[ann.BIND_PHASE] == ann.BIND_PHASE_FAILED
        await eventually(lambda: env.plugin.pods.lock_owner() is None)
        assert len(fake.requests if fake is not None else []) == requests
        if fake is not None and requests:
            assert fake.requests[0]["allowedDeviceUUIDs"] == (
                ["GPU-2", "GPU-3"] if door is Door.PREFERRED else ["GPU-2"]
            )
