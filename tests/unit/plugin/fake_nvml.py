"""A fake ``pynvml`` module (NVML is the one thing tests mock)."""

from __future__ import annotations

import queue
from dataclasses import dataclass, field
from types import ModuleType, SimpleNamespace
from typing import Any

NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_FEATURE_ENABLED = 1
NVML_NVLINK_DEVICE_TYPE_GPU = 0
NVML_NVLINK_DEVICE_TYPE_SWITCH = 2
NVML_TOPOLOGY_NODE = 40
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_GPU_IS_LOST = 15
NVML_DEVICE_MIG_ENABLE = 1
nvmlEventTypeSingleBitEccError = 1
nvmlEventTypeDoubleBitEccError = 2
nvmlEventTypeXidCriticalError = 8


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


@dataclass
class FakeGpu:
    uuid: str
    name: str = "Tesla T4"
    memory_bytes: int = 16 * 1024**3
    bus_id: str = "00000000:3B:00.0"
    mig: int = 0
    #: minor number of its /dev/nvidia<minor> node
    minor: int = 0
    #: NVLinks: (remote PCI bus id, remote device type, enabled), one per link number
    nvlinks: list[tuple[str, int, bool]] = field(default_factory=list)
    memory_used_bytes: int = 0
    #: (GPU, memory controller) utilisation, percent
    utilization: tuple[int, int] = (0, 0)
    fail: set[str] = field(default_factory=set)  # names of calls that fail
    fail_code: int = NVML_ERROR_GPU_IS_LOST


class FakeNvml(ModuleType):
    """Instance exposes the pynvml functions hamid uses (a module, as ``import pynvml`` gives)."""

    NVMLError = NVMLError
    NVML_ERROR_NOT_SUPPORTED = NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_INVALID_ARGUMENT = NVML_ERROR_INVALID_ARGUMENT
    NVML_FEATURE_ENABLED = NVML_FEATURE_ENABLED
    NVML_NVLINK_DEVICE_TYPE_SWITCH = NVML_NVLINK_DEVICE_TYPE_SWITCH
    NVML_NVLINK_MAX_LINKS = 18
    NVML_ERROR_TIMEOUT = NVML_ERROR_TIMEOUT
    NVML_DEVICE_MIG_ENABLE = NVML_DEVICE_MIG_ENABLE
    nvmlEventTypeSingleBitEccError = nvmlEventTypeSingleBitEccError
    nvmlEventTypeDoubleBitEccError = nvmlEventTypeDoubleBitEccError
    nvmlEventTypeXidCriticalError = nvmlEventTypeXidCriticalError

    def __init__(self, gpus: list[FakeGpu]) -> None:
        super().__init__("pynvml")
        self.gpus = gpus
        self.events: queue.Queue[Any] = queue.Queue()
        self.registered: list[str] = []
        self.freed = False
        #: Common-ancestor level per GPU pair (either order); NODE when not given.
        self.topology: dict[tuple[str, str], int] = {}
        #: Raised by ``nvmlEventSetCreate`` when set (an injected fault).
        self.event_set_error: Exception | None = None

    def _check(self, gpu: FakeGpu, call: str) -> None:
        if call in gpu.fail:
            raise NVMLError(gpu.fail_code)

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        gpu = self.gpus[index]
        self._check(gpu, "handle")
        return gpu

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> FakeGpu:
        for gpu in self.gpus:
            if gpu.uuid == uuid:
                self._check(gpu, "handle")
                return gpu
        raise NVMLError(13)

    def nvmlDeviceGetUUID(self, gpu: FakeGpu) -> bytes:
        self._check(gpu, "uuid")
        return gpu.uuid.encode()

    def nvmlDeviceGetName(self, gpu: FakeGpu) -> str:
        self._check(gpu, "name")
        return gpu.name

    def nvmlDeviceGetMemoryInfo(self, gpu: FakeGpu) -> Any:
        self._check(gpu, "memory")
        return SimpleNamespace(total=gpu.memory_bytes, used=gpu.memory_used_bytes)

    def nvmlDeviceGetUtilizationRates(self, gpu: FakeGpu) -> Any:
        self._check(gpu, "utilization")
        return SimpleNamespace(gpu=gpu.utilization[0], memory=gpu.utilization[1])

    def nvmlDeviceGetPciInfo(self, gpu: FakeGpu) -> Any:
        self._check(gpu, "pci")
        return SimpleNamespace(busId=gpu.bus_id.encode())

    def nvmlDeviceGetMigMode(self, gpu: FakeGpu) -> list[int]:
        self._check(gpu, "mig")
        return [gpu.mig, gpu.mig]

    def nvmlDeviceGetMinorNumber(self, gpu: FakeGpu) -> int:
        self._check(gpu, "minor")
        return gpu.minor

    def nvmlDeviceGetTopologyCommonAncestor(self, first: FakeGpu, second: FakeGpu) -> int:
        self._check(first, "topology")
        pair = (first.uuid, second.uuid)
        return self.topology.get(pair, self.topology.get(pair[::-1], NVML_TOPOLOGY_NODE))

    def _link(self, gpu: FakeGpu, link: int) -> tuple[str, int, bool]:
        self._check(gpu, "nvlink")
        if not gpu.nvlinks:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if link >= len(gpu.nvlinks):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return gpu.nvlinks[link]

    def nvmlDeviceGetNvLinkState(self, gpu: FakeGpu, link: int) -> int:
        return NVML_FEATURE_ENABLED if self._link(gpu, link)[2] else 0

    def nvmlDeviceGetNvLinkRemotePciInfo(self, gpu: FakeGpu, link: int) -> Any:
        return SimpleNamespace(busId=self._link(gpu, link)[0].encode())

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, gpu: FakeGpu, link: int) -> int:
        return self._link(gpu, link)[1]

    def nvmlEventSetCreate(self) -> str:
        if self.event_set_error is not None:
            raise self.event_set_error
        return "set"

    def nvmlEventSetFree(self, event_set: str) -> None:
        self.freed = True

    def nvmlDeviceGetSupportedEventTypes(self, gpu: FakeGpu) -> int:
        self._check(gpu, "events")
        return 0xFF

    def nvmlDeviceRegisterEvents(self, gpu: FakeGpu, types: int, event_set: str) -> None:
        self._check(gpu, "register")
        self.registered.append(gpu.uuid)

    def nvmlEventSetWait_v2(self, event_set: str, timeout_ms: int) -> Any:
        try:
            item = self.events.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise NVMLError(NVML_ERROR_TIMEOUT) from None
        if isinstance(item, Exception):
            raise item
        return item

    def xid(self, gpu: FakeGpu, xid: int) -> None:
        """Queue an XID critical-error event for ``gpu``."""
        self.events.put(SimpleNamespace(device=gpu, eventType=nvmlEventTypeXidCriticalError, eventData=xid))
