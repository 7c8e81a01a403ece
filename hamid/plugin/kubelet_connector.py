"""Serving the plugin socket and registering with kubelet; coming back after a kubelet restart.

A restarted kubelet wipes the plugin sockets and recreates ``kubelet.sock``. The connector polls
both (identity of ``kubelet.sock``, existence and identity of its own socket) and, on a change, closes
the old server, starts a fresh one and registers again — one server at a time, always.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from grpclib import GRPCError
from grpclib.client import Channel
from grpclib.exceptions import StreamTerminatedError
from grpclib.server import Server

from hamid._proto.deviceplugin.v1beta1 import api_pb2 as pb
from hamid._proto.deviceplugin.v1beta1.api_grpc import RegistrationStub
from hamid.log import get_logger
from hamid.plugin.grpc_codec import BoundedProtoCodec

if TYPE_CHECKING:
    from grpclib._typing import IServable

log = get_logger("plugin.kubelet_connector")

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"


def socket_name(resource_name: str) -> str:
    """``nvidia-<name part of the resource>.sock`` (``nvidia.com/gpu`` → ``nvidia-gpu.sock``)."""
    return f"nvidia-{resource_name.rsplit('/', 1)[-1]}.sock"


FileId = tuple[int, int, int]


def _inode(path: Path) -> FileId | None:
    """Identity of a file (device, inode, ctime): a recreated socket differs even if the inode is reused."""
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


class KubeletConnector:
    """Owns the plugin's gRPC server and its registration with kubelet (run it as a task)."""

    def __init__(
        self,
        handlers: Callable[[], Sequence[IServable]],
        plugin_dir: str | os.PathLike[str],
        resource_name: str,
        *,
        preferred_allocation: bool,
        poll_interval: float = 0.2,
        register_timeout: float = 5.0,
        retry_interval: float = 2.0,
    ) -> None:
        self.handlers = handlers
        self.plugin_dir = Path(plugin_dir)
        self.resource_name = resource_name
        self.endpoint = socket_name(resource_name)
        self.socket_path = self.plugin_dir / self.endpoint
        self.kubelet_socket = self.plugin_dir / KUBELET_SOCKET
        self.preferred_allocation = preferred_allocation
        self.poll_interval = poll_interval
        self.register_timeout = register_timeout
        self.retry_interval = retry_interval
        self.registrations = 0
        self.servers_started = 0
        #: True while registered with the kubelet now running (metrics, readiness).
        self.registered = False

    async def run(self) -> None:
        """Serve and register; after a kubelet restart serve afresh and register again. Never returns."""
        while True:
            await self._serve_once()

    async def _serve_once(self) -> None:
        await asyncio.to_thread(self.plugin_dir.mkdir, parents=True, exist_ok=True)
        await asyncio.to_thread(_unlink, self.socket_path)
        server = Server(list(self.handlers()), codec=BoundedProtoCodec())
        await server.start(path=str(self.socket_path))
        self.servers_started += 1
        own = await asyncio.to_thread(_inode, self.socket_path)
        log.info("device_plugin_serving", socket=str(self.socket_path))
        try:
            await self._watch(own)
        finally:
            self.registered = False
            server.close()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(5.0):
                    await server.wait_closed()
            if await asyncio.to_thread(_inode, self.socket_path) == own:
                await asyncio.to_thread(_unlink, self.socket_path)

    async def _watch(self, own: FileId | None) -> None:
        """Register when kubelet is there; return when kubelet restarted or the socket vanished."""
        loop = asyncio.get_running_loop()
        registered_with: FileId | None = None
        next_try = 0.0
        while True:
            kubelet = await asyncio.to_thread(_inode, self.kubelet_socket)
            mine = await asyncio.to_thread(_inode, self.socket_path)
            if mine != own:
                log.warning("plugin_socket_removed_restarting")
                return
            if registered_with is not None and kubelet != registered_with:
                log.warning("kubelet_socket_replaced_restarting")
                return
            if registered_with is None and kubelet is not None and loop.time() >= next_try:
                try:
                    await self.register()
                    registered_with = kubelet
                    self.registered = True
                except (GRPCError, OSError, TimeoutError, StreamTerminatedError) as exc:
                    log.warning("kubelet_registration_failed_retrying", error=str(exc))
                    next_try = loop.time() + self.retry_interval
            await asyncio.sleep(self.poll_interval)

    async def register(self) -> None:
        """One ``Register`` call to kubelet (bounded by ``register_timeout``)."""
        channel = Channel(path=str(self.kubelet_socket))
        try:
            request = pb.RegisterRequest(
                version=API_VERSION,
                endpoint=self.endpoint,
                resource_name=self.resource_name,
                options=pb.DevicePluginOptions(get_preferred_allocation_available=self.preferred_allocation),
            )
            await RegistrationStub(channel).Register(request, timeout=self.register_timeout)
        finally:
            channel.close()
        self.registrations += 1
        log.info("kubelet_registered", resource=self.resource_name, endpoint=self.endpoint)
