"""A fake ``pynvml`` module (NVML is the one thing tests mock)."""

from __future__ import annotations

import ctypes
import itertools
import queue
import uuid as uuidlib
from dataclasses import dataclass, field
from types import ModuleType, SimpleNamespace
from typing import Any

import pynvml as real  # its ctypes structures and constants only: the library is never loaded

from hamid.model.mig import AllowedMigProfiles

NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_FEATURE_ENABLED = 1
NVML_NVLINK_DEVICE_TYPE_GPU = 0
NVML_NVLINK_DEVICE_TYPE_SWITCH = 2
NVML_TOPOLOGY_NODE = 40
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_GPU_IS_LOST = 15
NVML_DEVICE_MIG_ENABLE = 1
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_IN_USE = 19
NVML_ERROR_INSUFFICIENT_RESOURCES = 23
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
    #: MIG GPU instance profiles by NVML_GPU_INSTANCE_PROFILE_* index (empty: no MIG support)
    mig_profiles: dict[int, FakeGiProfile] = field(default_factory=dict)
    #: live GPU instances by GPU instance id
    instances: dict[int, FakeGi] = field(default_factory=dict)
    max_mig_devices: int = 7


@dataclass(frozen=True)
class FakeGiProfile:
    """One GPU instance profile as the driver describes it (``id``: what creation takes)."""

    id: int
    slice_count: int
    instance_count: int
    multiprocessors: int
    memory_mb: int
    placements: tuple[tuple[int, int], ...]


@dataclass
class FakeCi:
    """A compute instance and the MIG device it makes."""

    id: int
    profile: int
    slice_count: int
    gi: FakeGi
    uuid: str
    processes: list[Any] = field(default_factory=list)


@dataclass
class FakeGi:
    """A GPU instance: its profile, the memory slices it occupies, its compute instances."""

    id: int
    profile: FakeGiProfile
    start: int
    size: int
    gpu: FakeGpu
    cis: dict[int, FakeCi] = field(default_factory=dict)

    def slices(self) -> set[int]:
        return set(range(self.start, self.start + self.size))


#: An A100-SXM4-40GB as ``nvidia-smi mig -lgip`` describes it (profile index: the profile).
A100_PROFILES = {
    real.NVML_GPU_INSTANCE_PROFILE_1_SLICE: FakeGiProfile(
        19, 1, 7, 14, 4864, tuple((i, 1) for i in range(7))
    ),
    real.NVML_GPU_INSTANCE_PROFILE_2_SLICE: FakeGiProfile(14, 2, 3, 28, 9984, ((0, 2), (2, 2), (4, 2))),
    real.NVML_GPU_INSTANCE_PROFILE_3_SLICE: FakeGiProfile(9, 3, 2, 42, 20096, ((0, 4), (4, 4))),
    real.NVML_GPU_INSTANCE_PROFILE_4_SLICE: FakeGiProfile(5, 4, 1, 56, 20096, ((0, 4),)),
    real.NVML_GPU_INSTANCE_PROFILE_7_SLICE: FakeGiProfile(0, 7, 1, 98, 40192, ((0, 8),)),
    real.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2: FakeGiProfile(
        15, 1, 4, 14, 9856, ((0, 2), (2, 2), (4, 2), (6, 2))
    ),
}
#: Compute slices of each NVML_COMPUTE_INSTANCE_PROFILE_* index.
CI_SLICES = {
    real.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE: 1,
    real.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE: 2,
    real.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE: 3,
    real.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE: 4,
    real.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE: 7,
    real.NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE: 8,
    real.NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE: 6,
}


#: The allowlist entry of :func:`a100` (HAMi's chart list for the model).
A100_ALLOWLIST = (AllowedMigProfiles(("A100-SXM4-40GB",), ("1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb")),)


def a100(uuid: str, **kwargs: Any) -> FakeGpu:
    """An A100-SXM4-40GB in MIG mode without instances."""
    return FakeGpu(
        uuid,
        name="NVIDIA A100-SXM4-40GB",
        memory_bytes=40960 * 1024**2,
        mig=1,
        mig_profiles=dict(A100_PROFILES),
        **kwargs,
    )


def _out(ref: Any) -> Any:
    """The object a ``ctypes.byref`` (or a plain ctypes object) points at."""
    return getattr(ref, "_obj", ref)


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
    NVML_ERROR_NOT_FOUND = NVML_ERROR_NOT_FOUND
    NVML_ERROR_IN_USE = NVML_ERROR_IN_USE
    NVML_ERROR_INSUFFICIENT_RESOURCES = NVML_ERROR_INSUFFICIENT_RESOURCES
    c_nvmlGpuInstancePlacement_t = real.c_nvmlGpuInstancePlacement_t
    c_nvmlGpuInstance_t = real.c_nvmlGpuInstance_t
    c_nvmlComputeInstance_t = real.c_nvmlComputeInstance_t
    NVML_GPU_INSTANCE_PROFILE_COUNT = real.NVML_GPU_INSTANCE_PROFILE_COUNT
    NVML_COMPUTE_INSTANCE_PROFILE_COUNT = real.NVML_COMPUTE_INSTANCE_PROFILE_COUNT
    NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED = real.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
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
        #: GPU / compute instances behind the opaque ctypes handles handed out (by handle key).
        self._handles: dict[int, tuple[Any, ctypes.c_int]] = {}
        self._keys = itertools.count(1)
        #: MIG mutations in order, e.g. ("create_gi", uuid, start, size): what tests assert on.
        self.mig_log: list[tuple[Any, ...]] = []

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

    def nvmlDeviceGetUUID(self, device: FakeGpu | FakeCi) -> bytes:
        self._check_any(device, "uuid")
        return device.uuid.encode()

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

    # -- MIG: GPU instances, compute instances and MIG devices, as the driver keeps them --------

    def _handle(self, obj: Any, kind: Any) -> Any:
        """An opaque ctypes handle of ``kind`` for a fake GPU or compute instance."""
        key = next(self._keys)
        cell = ctypes.c_int(key)
        self._handles[key] = (obj, cell)
        return ctypes.cast(ctypes.pointer(cell), kind)

    def _resolve(self, handle: Any, kind: type) -> Any:
        key = ctypes.cast(handle, ctypes.POINTER(ctypes.c_int)).contents.value
        obj = self._handles.get(key, (None, None))[0]
        if not isinstance(obj, kind) or not self._alive(obj):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return obj

    @staticmethod
    def _alive(obj: Any) -> bool:
        if isinstance(obj, FakeGi):
            return obj.gpu.instances.get(obj.id) is obj
        return obj.gi.gpu.instances.get(obj.gi.id) is obj.gi and obj.gi.cis.get(obj.id) is obj

    def _mig_on(self, gpu: FakeGpu) -> None:
        if gpu.mig != NVML_DEVICE_MIG_ENABLE or not gpu.mig_profiles:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)

    def _profile_by_id(self, gpu: FakeGpu, profile_id: int) -> FakeGiProfile:
        self._mig_on(gpu)
        for profile in gpu.mig_profiles.values():
            if profile.id == profile_id:
                return profile
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)

    @staticmethod
    def _fill(array: Any, count_ref: Any, items: list[Any]) -> None:
        _out(count_ref).value = len(items)
        if array is None:
            return
        if len(array) < len(items):
            raise NVMLError(NVML_ERROR_INSUFFICIENT_SIZE)
        for i, item in enumerate(items):
            array[i] = item

    def nvmlDeviceGetGpuInstanceProfileInfo(self, gpu: FakeGpu, profile: int, version: int = 2) -> Any:
        self._check(gpu, "gi_profile")
        self._mig_on(gpu)
        found = gpu.mig_profiles.get(profile)
        if found is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        info = real.c_nvmlGpuInstanceProfileInfo_v2_t()
        info.id, info.sliceCount, info.instanceCount = found.id, found.slice_count, found.instance_count
        info.multiprocessorCount, info.memorySizeMB = found.multiprocessors, found.memory_mb
        return info

    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self, gpu: FakeGpu, profile_id: int, placements: Any, count_ref: Any
    ) -> int:
        profile = self._profile_by_id(gpu, profile_id)
        items = [real.c_nvmlGpuInstancePlacement_t(start, size) for start, size in profile.placements]
        self._fill(placements, count_ref, items)
        return 0

    def nvmlDeviceGetGpuInstances(self, gpu: FakeGpu, profile_id: int, array: Any, count_ref: Any) -> int:
        profile = self._profile_by_id(gpu, profile_id)
        found = [g for _id, g in sorted(gpu.instances.items()) if g.profile == profile]
        self._fill(array, count_ref, [self._handle(g, real.c_nvmlGpuInstance_t) for g in found])
        return 0

    def nvmlDeviceGetGpuInstanceById(self, gpu: FakeGpu, gi_id: int) -> Any:
        self._mig_on(gpu)
        gi = gpu.instances.get(gi_id)
        if gi is None:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return self._handle(gi, real.c_nvmlGpuInstance_t)

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, gpu: FakeGpu, profile_id: int, placement: Any) -> Any:
        self._check(gpu, "create_gi")
        profile = self._profile_by_id(gpu, profile_id)
        wanted = _out(placement)
        start, size = int(wanted.start), int(wanted.size)
        if (start, size) not in profile.placements:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        taken = set().union(*(g.slices() for g in gpu.instances.values()))
        if taken & set(range(start, start + size)):
            raise NVMLError(NVML_ERROR_INSUFFICIENT_RESOURCES)
        gi_id = next(i for i in itertools.count(1) if i not in gpu.instances)
        gpu.instances[gi_id] = gi = FakeGi(gi_id, profile, start, size, gpu)
        self.mig_log.append(("create_gi", gpu.uuid, start, size))
        return self._handle(gi, real.c_nvmlGpuInstance_t)

    def nvmlGpuInstanceGetInfo(self, handle: Any) -> Any:
        gi = self._resolve(handle, FakeGi)
        info = real.c_nvmlGpuInstanceInfo_t()
        info.id, info.profileId = gi.id, gi.profile.id
        info.placement = real.c_nvmlGpuInstancePlacement_t(gi.start, gi.size)
        return info

    def nvmlGpuInstanceDestroy(self, handle: Any) -> int:
        gi = self._resolve(handle, FakeGi)
        self._check(gi.gpu, "destroy_gi")
        if gi.cis:
            raise NVMLError(NVML_ERROR_IN_USE)
        del gi.gpu.instances[gi.id]
        self.mig_log.append(("destroy_gi", gi.gpu.uuid, gi.start, gi.size))
        return 0

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, handle: Any, profile: int, engine: int, version: int = 2
    ) -> Any:
        gi = self._resolve(handle, FakeGi)
        if engine != real.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        slices = CI_SLICES.get(profile)
        if slices is None or slices > gi.profile.slice_count:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        info = real.c_nvmlComputeInstanceProfileInfo_v2_t()
        info.id, info.sliceCount = profile, slices
        info.instanceCount = gi.profile.slice_count // slices
        info.multiprocessorCount = gi.profile.multiprocessors * slices // gi.profile.slice_count
        return info

    def nvmlGpuInstanceCreateComputeInstance(self, handle: Any, profile_id: int) -> Any:
        gi = self._resolve(handle, FakeGi)
        self._check(gi.gpu, "create_ci")
        slices = CI_SLICES.get(profile_id)
        if slices is None or slices > gi.profile.slice_count:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if sum(c.slice_count for c in gi.cis.values()) + slices > gi.profile.slice_count:
            raise NVMLError(NVML_ERROR_INSUFFICIENT_RESOURCES)
        ci_id = next(i for i in itertools.count(0) if i not in gi.cis)
        gi.cis[ci_id] = ci = FakeCi(ci_id, profile_id, slices, gi, f"MIG-{uuidlib.uuid4()}")
        self.mig_log.append(("create_ci", gi.gpu.uuid, gi.start, ci_id))
        return self._handle(ci, real.c_nvmlComputeInstance_t)

    def nvmlGpuInstanceGetComputeInstances(
        self, handle: Any, profile_id: int, array: Any, count_ref: Any
    ) -> int:
        gi = self._resolve(handle, FakeGi)
        found = [c for _id, c in sorted(gi.cis.items()) if c.profile == profile_id]
        self._fill(array, count_ref, [self._handle(c, real.c_nvmlComputeInstance_t) for c in found])
        return 0

    def nvmlGpuInstanceGetComputeInstanceById(self, handle: Any, ci_id: int) -> Any:
        gi = self._resolve(handle, FakeGi)
        ci = gi.cis.get(ci_id)
        if ci is None:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return self._handle(ci, real.c_nvmlComputeInstance_t)

    def nvmlComputeInstanceGetInfo(self, handle: Any) -> Any:
        ci = self._resolve(handle, FakeCi)
        info = real.c_nvmlComputeInstanceInfo_t()
        info.id, info.profileId = ci.id, ci.profile
        return info

    def nvmlComputeInstanceDestroy(self, handle: Any) -> int:
        ci = self._resolve(handle, FakeCi)
        if ci.processes:
            raise NVMLError(NVML_ERROR_IN_USE)
        del ci.gi.cis[ci.id]
        self.mig_log.append(("destroy_ci", ci.gi.gpu.uuid, ci.gi.start, ci.id))
        return 0

    def nvmlDeviceGetMaxMigDeviceCount(self, gpu: FakeGpu) -> int:
        return gpu.max_mig_devices if gpu.mig_profiles else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, gpu: FakeGpu, index: int) -> FakeCi:
        self._mig_on(gpu)
        devices = [c for _g, gi in sorted(gpu.instances.items()) for _c, c in sorted(gi.cis.items())]
        if index >= gpu.max_mig_devices:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if index >= len(devices):
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return devices[index]

    def nvmlDeviceGetGpuInstanceId(self, device: FakeCi) -> int:
        return device.gi.id

    def nvmlDeviceGetComputeInstanceId(self, device: FakeCi) -> int:
        return device.id

    def nvmlDeviceGetComputeRunningProcesses(self, device: FakeGpu | FakeCi) -> list[Any]:
        self._check_any(device, "processes")
        return list(device.processes) if isinstance(device, FakeCi) else []

    def nvmlDeviceGetGraphicsRunningProcesses(self, device: FakeGpu | FakeCi) -> list[Any]:
        self._check_any(device, "processes")
        return []

    def _check_any(self, device: FakeGpu | FakeCi, call: str) -> None:
        gpu = device if isinstance(device, FakeGpu) else device.gi.gpu
        self._check(gpu, call)

    def live(self, gpu: FakeGpu) -> list[tuple[int, int, int, str]]:
        """The GPU's MIG devices: (start, size, GPU instance id, MIG UUID) of every compute instance."""
        return [
            (gi.start, gi.size, gi.id, c.uuid)
            for _g, gi in sorted(gpu.instances.items())
            for c in gi.cis.values()
        ]

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


for _name in dir(real):  # the instance profile constants, as pynvml names them
    if _name.startswith(("NVML_GPU_INSTANCE_PROFILE_", "NVML_COMPUTE_INSTANCE_PROFILE_")):
        setattr(FakeNvml, _name, getattr(real, _name))
