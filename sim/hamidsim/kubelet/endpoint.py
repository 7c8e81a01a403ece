"""The device manager's connection to one device plugin (``devicemanager/plugin/v1beta1`` client and
``endpoint.go``): a blocking dial, ``GetDevicePluginOptions``, the ``ListAndWatch`` stream and the
per-container RPCs, each bounded by a deadline (kubelet itself sets none)."""

# Every ``timeout`` parameter here is a deadline enforced inside with ``asyncio.timeout``.
# ruff: noqa: ASYNC109

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass

from grpclib import GRPCError
from grpclib.client import Channel
from grpclib.const import Status
from grpclib.exceptions import StreamTerminatedError

from hamid._proto.deviceplugin.v1beta1 import api_pb2 as pb
from hamid._proto.deviceplugin.v1beta1.api_grpc import DevicePluginStub

#: What a failed plugin RPC raises in grpclib.
RPC_ERRORS = (GRPCError, TimeoutError, OSError, StreamTerminatedError)


def _go_status_name(status: Status) -> str:
    return "".join(part.capitalize() for part in status.name.split("_"))


def rpc_error_text(exc: BaseException) -> str:
    """A gRPC failure as Go's ``status.Error`` prints it (``rpc error: code = ... desc = ...``)."""
    if isinstance(exc, GRPCError):
        return f"rpc error: code = {_go_status_name(exc.status)} desc = {exc.message or ''}"
    if isinstance(exc, TimeoutError):
        return "rpc error: code = DeadlineExceeded desc = context deadline exceeded"
    return f"rpc error: code = Unavailable desc = {type(exc).__name__}: {exc}"


@dataclass(eq=False)
class Endpoint:
    """One registered plugin: its channel, stub and the options it answered."""

    resource: str
    socket: str
    channel: Channel
    stub: DevicePluginStub
    options: pb.DevicePluginOptions
    rpc_timeout: float
    stopped: bool = False
    updates: int = 0
    task: asyncio.Task[None] | None = None

    def close(self) -> None:
        """Stop the endpoint (kubelet's ``stop``): the channel closes, the stream ends."""
        self.stopped = True
        self.channel.close()

    async def preferred(self, request: pb.PreferredAllocationRequest) -> pb.PreferredAllocationResponse:
        """``GetPreferredAllocation`` with the deadline."""
        async with asyncio.timeout(self.rpc_timeout):
            return await self.stub.GetPreferredAllocation(request)

    async def allocate(self, request: pb.AllocateRequest) -> pb.AllocateResponse:
        """``Allocate`` with the deadline."""
        async with asyncio.timeout(self.rpc_timeout):
            return await self.stub.Allocate(request)

    async def pre_start(self, devices: list[str]) -> None:
        """``PreStartContainer`` (kubelet's 30 s ``KubeletPreStartContainerRPCTimeoutInSecs``)."""
        async with asyncio.timeout(min(self.rpc_timeout, 30.0)):
            await self.stub.PreStartContainer(pb.PreStartContainerRequest(devices_ids=devices))

    async def list_and_watch(self, on_update: Callable[[Endpoint, pb.ListAndWatchResponse], None]) -> str:
        """Consume ``ListAndWatch`` until it ends; the reason it ended."""
        try:
            async with self.stub.ListAndWatch.open() as stream:
                await stream.send_message(pb.Empty(), end=True)
                while True:
                    response = await stream.recv_message()
                    if response is None:
                        return "stream closed"
                    on_update(self, response)
        except (GRPCError, OSError, StreamTerminatedError, ConnectionError) as exc:
            return rpc_error_text(exc)


async def dial(socket: str, timeout: float) -> Channel:
    """A blocking dial like ``grpc.WithBlock`` with a deadline of ``timeout``; raises GRPCError(UNKNOWN)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    delay = 0.02
    last = "no attempt"
    while True:
        try:
            async with asyncio.timeout(max(0.01, deadline - loop.time())):
                _, writer = await asyncio.open_unix_connection(socket)
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            return Channel(path=socket)
        except (OSError, TimeoutError) as exc:
            last = f"{type(exc).__name__}: {exc}"
        if loop.time() + delay >= deadline:
            message = f"failed to dial device plugin: context deadline exceeded (last error: {last})"
            raise GRPCError(Status.UNKNOWN, message)
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.5)


async def connect(resource: str, socket: str, dial_timeout: float, rpc_timeout: float) -> Endpoint:
    """``client.Connect``: dial, then ``GetDevicePluginOptions``; GRPCError(UNKNOWN) with kubelet's text."""
    channel = await dial(socket, dial_timeout)
    stub = DevicePluginStub(channel)
    try:
        async with asyncio.timeout(rpc_timeout):
            options = await stub.GetDevicePluginOptions(pb.Empty())
    except RPC_ERRORS as exc:
        channel.close()
        raise GRPCError(
            Status.UNKNOWN, f"failed to get device plugin options: {rpc_error_text(exc)}"
        ) from exc
    return Endpoint(resource, socket, channel, stub, options, rpc_timeout)
