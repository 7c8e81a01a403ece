"""The grpclib ``v1beta1.DevicePlugin`` service kubelet calls on the plugin's unix socket.

Requests are checked before any work (:func:`check_requests`): too many containers or IDs, or an
ID longer than any replica ID, answer ``INVALID_ARGUMENT`` at once. Every status message is cut to
:data:`MAX_STATUS_MESSAGE_CHARS` (gRPC sends it in a trailer; a huge one stalls the connection).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable, Iterator

from grpclib import GRPCError
from grpclib.const import Status
from grpclib.server import Stream

from hamid._proto.deviceplugin.v1beta1 import api_pb2 as pb
from hamid._proto.deviceplugin.v1beta1.api_grpc import DevicePluginBase
from hamid.log import get_logger
from hamid.plugin.allocator import Allocator, PreferredRequest
from hamid.plugin.errors import AllocationError, summarize
from hamid.plugin.hamicore_answer import ContainerAnswer
from hamid.plugin.inventory import GpuInventory

log = get_logger("plugin.service")

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
#: Slack on top of the allocator's own worst case (:attr:`Allocator.deadline_s`) for the outer
#: bound of one Allocate / GetPreferredAllocation (kubelet sets no deadline of its own). The
#: allocator ends first; this bound only catches a bug.
HANDLER_SLACK_S = 2.0
#: Bounds of one request: containers per call, device IDs per container, characters per device ID
#: (a replica ID is a GPU UUID plus ``-<i>``, about 45 characters).
MAX_CONTAINER_REQUESTS = 128
MAX_IDS_PER_CONTAINER = 4096
MAX_DEVICE_ID_CHARS = 256
#: Longest status message sent to kubelet (longer ones are cut, with a note).
MAX_STATUS_MESSAGE_CHARS = 2048


def grpc_error(status: Status, message: str) -> GRPCError:
    """A :class:`GRPCError` whose message fits a trailer (:data:`MAX_STATUS_MESSAGE_CHARS`)."""
    if len(message) > MAX_STATUS_MESSAGE_CHARS:
        message = f"{message[: MAX_STATUS_MESSAGE_CHARS - 40]}… ({len(message)} characters, cut)"
    return GRPCError(status, message)


def check_requests(kind: str, id_lists: list[list[str]]) -> None:
    """Refuse an oversized request before any work (``INVALID_ARGUMENT``, a bounded message)."""
    if len(id_lists) > MAX_CONTAINER_REQUESTS:
        raise grpc_error(
            Status.INVALID_ARGUMENT,
            f"{kind} with {len(id_lists)} container requests exceeds {MAX_CONTAINER_REQUESTS}",
        )
    for index, ids in enumerate(id_lists):
        if len(ids) > MAX_IDS_PER_CONTAINER:
            raise grpc_error(
                Status.INVALID_ARGUMENT,
                f"{kind} container request {index} lists {len(ids)} device IDs, "
                f"more than {MAX_IDS_PER_CONTAINER}",
            )
        long = [i for i in ids if len(i) > MAX_DEVICE_ID_CHARS]
        if long:
            raise grpc_error(
                Status.INVALID_ARGUMENT,
                f"{kind} container request {index}: device IDs longer than {MAX_DEVICE_ID_CHARS} "
                f"characters are not replica IDs of this plugin: {summarize(long)}",
            )


class SentLists:
    """Which inventory generation each open ``ListAndWatch`` stream has sent kubelet (event-loop
    owned): the ``steer`` handshake acknowledges a steered list only once kubelet was sent it."""

    def __init__(self) -> None:
        #: Per open stream (a number of this process), the last generation sent on it (-1: none yet).
        self._streams: dict[int, int] = {}
        self._opened = itertools.count()
        self._changed = asyncio.Event()

    @contextlib.contextmanager
    def stream(self) -> Iterator[Callable[[int], None]]:
        """Count one stream as open while inside; yields what records a generation sent on it."""
        key = next(self._opened)
        self._streams[key] = -1

        def sent(generation: int) -> None:
            self._streams[key] = generation
            self._wake()

        try:
            yield sent
        finally:
            del self._streams[key]
            self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def sent(self, generation: int) -> bool:
        """Whether some stream is open and every open one has sent ``generation`` or a later one."""
        return bool(self._streams) and min(self._streams.values()) >= generation

    async def wait_sent(self, generation: int) -> None:
        """Wait until :meth:`sent` (with no stream open: until kubelet opens one and it has sent)."""
        while not self.sent(generation):
            await self._changed.wait()


def list_response(inventory: GpuInventory) -> pb.ListAndWatchResponse:
    """The full device list: one ``Device`` per replica, topology only when the NUMA node is sent."""
    devices = []
    for replica in inventory.replicas():
        device = pb.Device(ID=replica.id, health=HEALTHY if replica.healthy else UNHEALTHY)
        if replica.numa is not None:
            device.topology.nodes.append(pb.NUMANode(ID=replica.numa))
        devices.append(device)
    return pb.ListAndWatchResponse(devices=devices)


def allocate_response(answers: list[ContainerAnswer]) -> pb.AllocateResponse:
    """Protobuf form of the per-container answers."""
    out = pb.AllocateResponse()
    for answer in answers:
        car = out.container_responses.add()
        car.envs.update(answer.envs)
        for m in answer.mounts:
            car.mounts.append(
                pb.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
            )
        for d in answer.devices:
            car.devices.append(
                pb.DeviceSpec(
                    container_path=d.container_path, host_path=d.host_path, permissions=d.permissions
                )
            )
        car.annotations.update(answer.annotations)
        car.cdi_devices.extend(pb.CDIDevice(name=name) for name in answer.cdi_devices)
    return out


class DevicePluginService(DevicePluginBase):
    """Serves kubelet: options, the replica list, preferred allocation, Allocate, PreStartContainer."""

    def __init__(self, inventory: GpuInventory, allocator: Allocator, *, preferred_allocation: bool) -> None:
        self.inventory = inventory
        self.allocator = allocator
        self.preferred_allocation = preferred_allocation
        #: What the open ListAndWatch streams have sent.
        self.sent = SentLists()

    @property
    def handler_timeout(self) -> float:
        """Outer bound of one Allocate / GetPreferredAllocation: the allocator's worst case plus slack."""
        return self.allocator.deadline_s + HANDLER_SLACK_S

    def options(self) -> pb.DevicePluginOptions:
        """The options kubelet reads (upstream #2844: the preferred flag follows the node config)."""
        return pb.DevicePluginOptions(
            pre_start_required=False, get_preferred_allocation_available=self.preferred_allocation
        )

    async def GetDevicePluginOptions(self, stream: Stream[pb.Empty, pb.DevicePluginOptions]) -> None:
        """Answer the plugin options."""
        await stream.recv_message()
        await stream.send_message(self.options())

    async def ListAndWatch(self, stream: Stream[pb.Empty, pb.ListAndWatchResponse]) -> None:
        """Send the full list now and again after every health change; never returns on its own."""
        await stream.recv_message()
        with self.sent.stream() as sent:
            while True:
                generation = self.inventory.generation
                await stream.send_message(list_response(self.inventory))
                sent(generation)
                await self.inventory.wait_changed(generation)

    async def GetPreferredAllocation(
        self, stream: Stream[pb.PreferredAllocationRequest, pb.PreferredAllocationResponse]
    ) -> None:
        """Annotation-driven preference; an empty list is "no opinion", errors only when deliberate."""
        request = await stream.recv_message()
        assert request is not None
        check_requests(
            "GetPreferredAllocation",
            [[*r.available_deviceIDs, *r.must_include_deviceIDs] for r in request.container_requests],
        )
        requests = [
            PreferredRequest(
                tuple(r.available_deviceIDs), tuple(r.must_include_deviceIDs), int(r.allocation_size)
            )
            for r in request.container_requests
        ]
        try:
            async with asyncio.timeout(self.handler_timeout):
                chosen = await self.allocator.preferred(requests)
        except AllocationError as exc:
            raise grpc_error(Status.FAILED_PRECONDITION, str(exc)) from exc
        except Exception as exc:  # never fail admission by accident: no opinion instead
            log.exception("preferred_allocation_crashed_no_preference", error=str(exc))
            chosen = [[] for _ in requests]
        response = pb.PreferredAllocationResponse()
        for ids in chosen:
            response.container_responses.add().deviceIDs.extend(ids)
        await stream.send_message(response)

    async def Allocate(self, stream: Stream[pb.AllocateRequest, pb.AllocateResponse]) -> None:
        """Allocate from the pending pod's annotation; fails closed with a clear message."""
        request = await stream.recv_message()
        assert request is not None
        ids = [list(r.devices_ids) for r in request.container_requests]
        check_requests("Allocate", ids)
        try:
            async with asyncio.timeout(self.handler_timeout):
                answers = await self.allocator.allocate(ids)
        except AllocationError as exc:
            raise grpc_error(Status.FAILED_PRECONDITION, str(exc)) from exc
        except TimeoutError as exc:
            log.error("allocate_deadline_passed", timeout=self.handler_timeout)
            raise GRPCError(
                Status.DEADLINE_EXCEEDED, f"Allocate did not finish in {self.handler_timeout:g}s"
            ) from exc
        except Exception as exc:  # last resort: a message for kubelet, the traceback in our log
            log.exception("allocate_crashed", error=str(exc))
            raise grpc_error(
                Status.INTERNAL, f"device plugin internal error: {type(exc).__name__}: {exc}"
            ) from exc
        await stream.send_message(allocate_response(answers))

    async def PreStartContainer(
        self, stream: Stream[pb.PreStartContainerRequest, pb.PreStartContainerResponse]
    ) -> None:
        """No-op (``pre_start_required`` is false)."""
        await stream.recv_message()
        await stream.send_message(pb.PreStartContainerResponse())
