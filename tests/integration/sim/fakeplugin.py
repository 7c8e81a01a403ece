"""A small grpclib device plugin for driving the simulated kubelet in tests (records every call)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path

from grpclib import GRPCError
from grpclib.client import Channel
from grpclib.const import Status
from grpclib.server import Server, Stream

from hamid._proto.deviceplugin.v1beta1 import api_pb2 as pb
from hamid._proto.deviceplugin.v1beta1.api_grpc import DevicePluginBase, RegistrationStub

Answer = Callable[[pb.ContainerPreferredAllocationRequest], Sequence[str]]


def device(device_id: str, numa: int | None, healthy: bool = True) -> pb.Device:
    """A ``Device`` with topology on ``numa`` (None: no TopologyInfo)."""
    dev = pb.Device(ID=device_id, health="Healthy" if healthy else "Unhealthy")
    if numa is not None:
        dev.topology.nodes.add(ID=numa)
    return dev


class FakePlugin(DevicePluginBase):
    """Serves ``DevicePlugin`` on ``<root>/<name>`` and registers with ``<root>/kubelet.sock``."""

    def __init__(
        self,
        root: Path,
        devices: Sequence[pb.Device],
        *,
        resource: str = "example.com/gpu",
        name: str = "fake.sock",
        preferred: bool = True,
        pre_start: bool = False,
    ) -> None:
        self.root = root
        self.resource = resource
        self.name = name
        self.preferred = preferred
        self.pre_start = pre_start
        self.devices = list(devices)
        self.answer: Answer | None = None
        self.allocate_error: str | None = None
        #: When set, Allocate waits for it (an injected slow plugin); ``allocating`` is set meanwhile.
        self.allocate_gate: asyncio.Event | None = None
        self.allocating = asyncio.Event()
        self.preferred_requests: list[pb.ContainerPreferredAllocationRequest] = []
        self.allocate_requests: list[list[str]] = []
        self.pre_start_requests: list[list[str]] = []
        self.streams_cancelled = 0
        self._changed = asyncio.Event()
        self._end_stream = False
        self._server: Server | None = None

    @property
    def socket(self) -> Path:
        return self.root / self.name

    async def start(self) -> None:
        self._end_stream = False
        self._server = Server([self])
        await self._server.start(path=str(self.socket))

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await asyncio.wait_for(self._server.wait_closed(), 5)
            self._server = None

    async def register(self, *, version: str = "v1beta1", resource: str | None = None) -> None:
        channel = Channel(path=str(self.root / "kubelet.sock"))
        try:
            request = pb.RegisterRequest(
                version=version,
                endpoint=self.name,
                resource_name=resource or self.resource,
                options=pb.DevicePluginOptions(get_preferred_allocation_available=self.preferred),
            )
            await asyncio.wait_for(RegistrationStub(channel).Register(request), 5)
        finally:
            channel.close()

    def set_devices(self, devices: Sequence[pb.Device]) -> None:
        self.devices = list(devices)
        self._changed.set()

    def end_stream(self) -> None:
        self._end_stream = True
        self._changed.set()

    async def GetDevicePluginOptions(self, stream: Stream[pb.Empty, pb.DevicePluginOptions]) -> None:
        await stream.recv_message()
        await stream.send_message(
            pb.DevicePluginOptions(
                get_preferred_allocation_available=self.preferred, pre_start_required=self.pre_start
            )
        )

    async def ListAndWatch(self, stream: Stream[pb.Empty, pb.ListAndWatchResponse]) -> None:
        await stream.recv_message()
        try:
            while True:
                self._changed.clear()
                await stream.send_message(pb.ListAndWatchResponse(devices=self.devices))
                await self._changed.wait()
                if self._end_stream:
                    return
        except asyncio.CancelledError:
            self.streams_cancelled += 1
            raise

    async def GetPreferredAllocation(
        self, stream: Stream[pb.PreferredAllocationRequest, pb.PreferredAllocationResponse]
    ) -> None:
        request = await stream.recv_message()
        assert request is not None
        responses = []
        for creq in request.container_requests:
            self.preferred_requests.append(creq)
            if self.answer is not None:
                ids = list(self.answer(creq))
            else:
                chosen = list(creq.must_include_deviceIDs)
                for d in sorted(creq.available_deviceIDs, reverse=True):
                    if len(chosen) >= creq.allocation_size:
                        break
                    if d not in chosen:
                        chosen.append(d)
                ids = chosen
            responses.append(pb.ContainerPreferredAllocationResponse(deviceIDs=ids))
        await stream.send_message(pb.PreferredAllocationResponse(container_responses=responses))

    async def Allocate(self, stream: Stream[pb.AllocateRequest, pb.AllocateResponse]) -> None:
        request = await stream.recv_message()
        assert request is not None
        if self.allocate_gate is not None:
            self.allocating.set()
            await self.allocate_gate.wait()
        if self.allocate_error is not None:
            raise GRPCError(Status.UNKNOWN, self.allocate_error)
        responses = []
        for creq in request.container_requests:
            ids = list(creq.devices_ids)
            self.allocate_requests.append(ids)
            car = pb.ContainerAllocateResponse(envs={"FAKE_VISIBLE_DEVICES": ",".join(ids)})
            car.mounts.add(container_path="/fake", host_path="/tmp/fake", read_only=True)
            responses.append(car)
        await stream.send_message(pb.AllocateResponse(container_responses=responses))

    async def PreStartContainer(
        self, stream: Stream[pb.PreStartContainerRequest, pb.PreStartContainerResponse]
    ) -> None:
        request = await stream.recv_message()
        assert request is not None
        self.pre_start_requests.append(list(request.devices_ids))
        await stream.send_message(pb.PreStartContainerResponse())
