"""kubelet's device-plugin registration (``devicemanager/plugin/v1beta1/server.go``): it serves
``v1beta1.Registration`` on ``<root>/kubelet.sock``, checks the version and resource name and hands a
valid request to the device manager. On start and on restart it wipes the plugin directory's sockets
(``CleanupPluginDirectory``), so plugins that watch ``kubelet.sock`` register again."""

# ruff: noqa: ASYNC109

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from grpclib import GRPCError
from grpclib.const import Status
from grpclib.server import Server, Stream

from hamid._proto.deviceplugin.v1beta1 import api_pb2 as pb
from hamid._proto.deviceplugin.v1beta1.api_grpc import RegistrationBase

KUBELET_SOCKET = "kubelet.sock"
CHECKPOINT_FILE = "kubelet_internal_checkpoint"
SUPPORTED_VERSIONS = ("v1beta1",)

_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_SUBDOMAIN = re.compile(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*")
_QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")


def is_extended_resource_name(name: str) -> bool:
    """``v1helper.IsExtendedResourceName`` (what kubelet's ``Register`` checks)."""
    if "/" not in name or "kubernetes.io/" in name or name.startswith("requests."):
        return False
    parts = f"requests.{name}".split("/")
    if len(parts) != 2:
        return False
    prefix, short = parts
    if not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.fullmatch(prefix):
        return False
    return 0 < len(short) <= 63 and _QUALIFIED_NAME.fullmatch(short) is not None


def validate_registration(request: pb.RegisterRequest) -> str | None:
    """kubelet's error for a bad ``RegisterRequest``, or None."""
    if request.version not in SUPPORTED_VERSIONS:
        supported = "[" + " ".join(json.dumps(v) for v in SUPPORTED_VERSIONS) + "]"
        return (
            f"requested API version {json.dumps(request.version)} is not supported by kubelet. "
            f"Supported version is {supported}"
        )
    if not is_extended_resource_name(request.resource_name):
        return f"the ResourceName {json.dumps(request.resource_name)} is invalid"
    return None


class _RegistrationService(RegistrationBase):
    def __init__(self, on_register: Callable[[str, str], Awaitable[None]], log: Any) -> None:
        self.on_register = on_register
        self.log = log

    async def Register(self, stream: Stream[pb.RegisterRequest, pb.Empty]) -> None:
        request = await stream.recv_message()
        if request is None:
            raise GRPCError(Status.INVALID_ARGUMENT, "empty RegisterRequest")
        bound = self.log.bind(resource=request.resource_name, endpoint=request.endpoint)
        bound.info("registration_request_received")
        error = validate_registration(request)
        if error is not None:
            bound.warning("registration_request_invalid", error=error)
            raise GRPCError(Status.UNKNOWN, error)
        try:
            await self.on_register(request.resource_name, request.endpoint)
        except GRPCError as exc:
            bound.warning("device_plugin_connect_failed", error=exc.message)
            raise
        await stream.send_message(pb.Empty())


def cleanup_plugin_dir(root: Path, keep: str = "") -> None:
    """kubelet's ``CleanupPluginDirectory``: remove every unix socket but the checkpoint (blocking)."""
    for entry in root.iterdir():
        if entry.name in (CHECKPOINT_FILE, keep):
            continue
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(entry.lstat().st_mode):
                entry.unlink()


def sockets_in(root: str | Path) -> list[str]:
    """Names of the unix sockets in ``root`` (blocking; for tests and diagnostics)."""
    result = []
    for entry in Path(root).iterdir():
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(entry.lstat().st_mode):
                result.append(entry.name)
    return sorted(result)


class RegistrationServer:
    """The ``kubelet.sock`` gRPC server."""

    def __init__(self, root: Path, on_register: Callable[[str, str], Awaitable[None]], log: Any) -> None:
        self.root = root
        self._service = _RegistrationService(on_register, log)
        self._server: Server | None = None

    @property
    def socket_path(self) -> Path:
        """``<root>/kubelet.sock``."""
        return self.root / KUBELET_SOCKET

    async def start(self) -> None:
        """Wipe the directory's sockets and serve ``kubelet.sock``."""
        await asyncio.to_thread(cleanup_plugin_dir, self.root)
        server = Server([self._service])
        await server.start(path=str(self.socket_path))
        self._server = server

    async def start_anew(self, stop_old: Callable[[], Awaitable[None]]) -> None:
        """Serve a new ``kubelet.sock`` with a new inode (plugins may watch the inode to spot restarts).

        The new socket is bound under a temporary name while the old file still exists, so the
        filesystem cannot hand the old inode back; then the old sockets are wiped and it is renamed.
        """
        staging = self.root / f".{KUBELET_SOCKET}.restart"
        await asyncio.to_thread(staging.unlink, missing_ok=True)
        server = Server([self._service])
        await server.start(path=str(staging))
        await stop_old()
        await asyncio.to_thread(cleanup_plugin_dir, self.root, staging.name)
        await asyncio.to_thread(staging.rename, self.socket_path)
        self._server = server

    async def stop(self, timeout: float) -> None:
        """Stop serving (open streams get ``timeout`` seconds)."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await server.wait_closed()
