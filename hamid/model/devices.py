"""Device records shared by the scheduler, the plugin and the simulator (pure data)."""

from __future__ import annotations

from dataclasses import dataclass

#: HAMi's common word (vendor type) of the NVIDIA path, used in pod device entries and requests.
NVIDIA = "NVIDIA"
#: Operating modes a device registers with (``mode`` in the node register).
MODE_HAMI_CORE = "hami-core"
MODE_MIG = "mig"
MODE_MPS = "mps"
OPERATING_MODES = (MODE_HAMI_CORE, MODE_MIG, MODE_MPS)


def replica_id(uuid: str, i: int) -> str:
    """HAMi's replica ID ``<UUID>-<i>``: the device ID kubelet sees for replica ``i`` of a GPU."""
    return f"{uuid}-{i}"


def replica_gpu(device_id: str) -> str:
    """The GPU UUID of a replica ID (:func:`replica_id` read back; an ID of another form as it is)."""
    uuid, sep, index = device_id.rpartition("-")
    return uuid if sep and index.isdigit() else device_id


@dataclass(frozen=True, slots=True)
class MigPlacement:
    """A MIG placement (``{"start","size"}``)."""

    start: int
    size: int


@dataclass(frozen=True, slots=True)
class MigProfile:
    """A MIG profile of a device in ``mig`` mode (HAMi's compact wire form)."""

    name: str
    memory_mb: int
    core: int
    slice_count: int
    placements: tuple[MigPlacement, ...] = ()


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """One physical GPU as registered in ``hami.io/node-nvidia-register``.

    ``numa`` is the NUMA node (HAMi writes 0 when unknown); ``count`` the vGPU split count;
    ``devmem`` MiB after scaling; ``devcore`` 100 x core scaling.
    """

    id: str
    index: int = 0
    count: int = 0
    devmem: int = 0
    devcore: int = 0
    type: str = ""
    numa: int = 0
    mode: str = ""
    health: bool = False
    mig_profiles: tuple[MigProfile, ...] = ()


@dataclass(frozen=True, slots=True)
class ContainerDevice:
    """One device of one container's allocation: ``<uuid>,<type>,<usedmem>,<usedcores>``."""

    uuid: str
    type: str
    usedmem: int
    usedcores: int


#: One container's devices.
ContainerDevices = tuple[ContainerDevice, ...]
#: One entry per container, init containers first (GPU-less containers have an empty entry).
PodDevices = tuple[ContainerDevices, ...]
