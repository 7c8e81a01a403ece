"""Shared pieces of the plugin integration tests: embedded API server, fake kubelet, seeded pods."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

from grpclib.client import Channel
from grpclib.server import Server, Stream

from hamid._proto.deviceplugin.v1beta1 import api_pb2 as pb
from hamid._proto.deviceplugin.v1beta1.api_grpc import DevicePluginStub, RegistrationBase
from hamid.kube.client import KubeClient, connect
from hamid.model.annotations import (
    BIND_PHASE,
    BIND_PHASE_ALLOCATING,
    BIND_TIME,
    DEVICES_ALLOCATED,
    DEVICES_TO_ALLOCATE,
    NODE_LOCK,
    VGPU_NODE,
    VGPU_TIME,
    encode_pod_devices,
    format_node_lock,
)
from hamid.model.booked import booked_condition
from hamid.model.devices import ContainerDevice, PodDevices
from hamid.model.gpulinks import GpuLinks
from hamid.model.mig import AllowedMigProfiles
from hamid.model.nodeconfig import NodeConfig
from hamid.model.resources import ResourceConfig
from hamid.plugin.app import NodeSetup, Plugin, PluginApp, PluginTimings
from hamid.plugin.discovery import PhysicalGpu
from hamid.plugin.numa_policy import MismatchHandler, log_mismatch
from hamid.plugin.options import PluginOptions
from hamidsim.apiserver import ApiServer

NODE = "gpu-node-1"
#: Four GPUs, two per NUMA node.
GPUS = tuple(PhysicalGpu(f"GPU-{i}", i, "Tesla T4", 15360, i // 2, f"0000:{i:02x}:00.0") for i in range(4))


async def eventually(check: Callable[[], bool], within: float = 10.0) -> None:
    """Poll until ``check()``; fail after ``within`` s (a bound, not a timing assertion)."""
    async with asyncio.timeout(within):
        for _ in itertools.count():
            if check():
                return
            await asyncio.sleep(0.01)


@contextlib.contextmanager
def short_dir() -> Any:
    """A short directory under /tmp (unix socket paths are limited to 108 bytes)."""
    path = tempfile.mkdtemp(prefix="hp", dir="/tmp")
    try:
        yield Path(path)
    finally:
        shutil.rmtree(path, ignore_errors=True)


def dev(uuid: str, mem: int, cores: int) -> ContainerDevice:
    return ContainerDevice(uuid, "NVIDIA", mem, cores)


def scheduled_pod(
    name: str,
    devices: PodDevices,
    *,
    init: tuple[str, ...] = (),
    containers: tuple[str, ...] = ("main",),
    node: str = NODE,
    extra: dict[str, str] | None = None,
    env: dict[str, list[dict[str, str]]] | None = None,
    mig: str = "",
) -> dict[str, Any]:
    """A pod as it looks after hamid's /filter and /bind: annotations set, the booking recorded in
    its status (unsigned: the plugin reads only that the record is there; ``mig``: the MIG
    reservations it books, as ``reservation_text`` writes them), bound, Pending."""
    value = encode_pod_devices(devices)
    env = env or {}

    def spec_of(n: str) -> dict[str, Any]:
        return {"name": n, "image": "cuda", "env": env.get(n, [])}

    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "default",
            "annotations": {
                DEVICES_TO_ALLOCATE: value,
                DEVICES_ALLOCATED: value,
                VGPU_NODE: node,
                VGPU_TIME: "1700000000",
                BIND_TIME: "1700000001",
                BIND_PHASE: BIND_PHASE_ALLOCATING,
                **(extra or {}),
            },
        },
        "spec": {
            "nodeName": node,
            "initContainers": [spec_of(n) for n in init],
            "containers": [spec_of(n) for n in containers],
        },
        "status": {"phase": "Pending", "conditions": [booked_condition(node, value, "", 1700000001.0, mig)]},
    }


def stranger_pod(
    name: str, *, status: dict[str, Any] | None = None, resource: str = "nvidia.com/gpu"
) -> dict[str, Any]:
    """A pod bound to this node that requests GPUs but never went through hamid (no annotations)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": NODE,
            "containers": [{"name": "main", "image": "cuda", "resources": {"limits": {resource: "1"}}}],
        },
        "status": status or {"phase": "Pending"},
    }


def lock_node(server: ApiServer, name: str, node: str = NODE) -> None:
    """Set the node lock as the scheduler's /bind does."""
    value = format_node_lock(datetime.now(UTC), "default", name)
    server.patch("Node", None, node, {"metadata": {"annotations": {NODE_LOCK: value}}})


def stored_annotations(
    server: ApiServer, kind: str, name: str, namespace: str | None = "default"
) -> dict[str, str]:
    """The annotations of a stored object (empty when it has none)."""
    obj = server.get(kind, namespace, name)
    assert obj is not None
    return obj["metadata"].get("annotations") or {}


class FakeKubelet(RegistrationBase):
    """kubelet's Registration service: on Register it dials the plugin and follows ListAndWatch."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.requests: list[pb.RegisterRequest] = []
        self.options: list[pb.DevicePluginOptions] = []
        self.lists: list[pb.ListAndWatchResponse] = []
        self._server: Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._channels: list[Channel] = []

    async def Register(self, stream: Stream[pb.RegisterRequest, pb.Empty]) -> None:
        request = await stream.recv_message()
        assert request is not None
        channel = Channel(path=str(self.directory / request.endpoint))
        self._channels.append(channel)
        stub = DevicePluginStub(channel)
        self.options.append(await stub.GetDevicePluginOptions(pb.Empty(), timeout=5))
        self.requests.append(request)
        task = asyncio.create_task(self._follow(stub))
        self._tasks.add(task)
        await stream.send_message(pb.Empty())

    async def _follow(self, stub: DevicePluginStub) -> None:
        with contextlib.suppress(Exception):
            async with stub.ListAndWatch.open() as s:
                await s.send_message(pb.Empty(), end=True)
                async for message in s:
                    self.lists.append(message)

    async def start(self) -> None:
        self._server = Server([self])
        await self._server.start(path=str(self.directory / "kubelet.sock"))

    async def stop(self) -> None:
        """Stop like a restarting kubelet: close everything and remove kubelet.sock."""
        for task in self._tasks:
            task.cancel()
        for channel in self._channels:
            channel.close()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        with contextlib.suppress(FileNotFoundError):
            (self.directory / "kubelet.sock").unlink()


@dataclass
class Env:
    """A running plugin against an embedded API server."""

    server: ApiServer
    client: KubeClient
    plugin: Plugin
    directory: Path
    hook: Path
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @property
    def socket(self) -> str:
        return str(self.plugin.connector.socket_path)


@contextlib.asynccontextmanager
async def running_plugin(
    config: NodeConfig | None = None,
    *,
    gpus: tuple[PhysicalGpu, ...] = GPUS,
    mismatch_handler: MismatchHandler = log_mismatch,
    with_kubelet: bool = False,
    register_interval: float = 30.0,
    nvml: ModuleType | None = None,
    cleanup_interval: float = 300.0,
    cleanup_min_age: float | None = None,
    links: GpuLinks | None = None,
    hide_replicas: str = "auto",
    devices_file: Path | None = None,
    mig_allowlist: tuple[AllowedMigProfiles, ...] = (),
    mig_interval: float = 300.0,
    cdi_interval: float = 300.0,
    pods: tuple[dict[str, Any], ...] = (),
    **options: Any,
) -> AsyncIterator[tuple[Env, FakeKubelet | None]]:
    """Start an API server, a node, optionally a fake kubelet, and the plugin (``hide_replicas``:
    its ``--hide-replicas``; ``devices_file``: discover the GPUs from it as ``--devices-file`` does,
    with the default node config, instead of ``gpus`` and ``config``; ``mig_allowlist``: the
    device config's ``migProfileAllowlist``; ``mig_interval``: how often MIG instances are
    reconciled; ``cdi_interval``: how often the CDI specs are read for the GPUs' health; ``pods``:
    stored before the plugin starts, as after a restart; ``options``: more :class:`PluginOptions`
    fields); tear all down."""
    config = config or NodeConfig(device_split_count=4, enable_numa_topology=True)
    with short_dir() as directory:
        async with ApiServer() as server:
            server.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
            server.put_many(pods)
            client = await connect(api_server=server.url, request_timeout=5.0)
            kubelet = FakeKubelet(directory) if with_kubelet else None
            if kubelet is not None:
                await kubelet.start()
            setup = NodeSetup(config, ResourceConfig(), "nvidia.com/gpu", gpus, nvml, links, mig_allowlist)
            if devices_file is not None:
                options |= {"devices_file": str(devices_file), "node_config_file": str(directory / "none")}
            hook = directory / "hook"
            plugin_options = PluginOptions(
                node_name=NODE,
                device_plugin_dir=str(directory),
                hook_path=str(hook),
                metrics_listen="127.0.0.1:0",
                api_server=server.url,
                hide_replicas=hide_replicas,
                **options,
            )
            timings = PluginTimings(
                register_interval=register_interval,
                error_interval=0.05,
                cleanup_interval=cleanup_interval,
                cleanup_min_age=cleanup_min_age,
                mig_interval=mig_interval,
                cdi_interval=cdi_interval,
            )
            app = PluginApp(
                plugin_options,
                kube=client,
                setup=setup if devices_file is None else None,
                mismatch_handler=mismatch_handler,
                timings=timings,
                numa=False,
            )
            try:
                await app.start()
                env = Env(server, client, app.plugin, directory, hook)
                await app.wait_synced()
                if app.plugin.inventory.gpus:
                    await eventually(lambda: os.path.exists(env.socket))
                yield env, kubelet
            finally:
                await app.stop()
                if kubelet is not None:
                    await kubelet.stop()
                await client.close()
