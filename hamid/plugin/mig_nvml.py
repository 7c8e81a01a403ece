"""Dynamic MIG through NVML: a GPU's profiles and placements, and its GPU / compute instances.

Everything here blocks (NVML calls): run it in a thread, one GPU at a time (the caller's lock).
``lib`` is the ``pynvml`` module. The calls follow NVML's C API as ``pynvml`` passes it through:
list functions fill a ctypes array and a count, a placement goes by reference, and the id that
lists, creates and placements take is the one ``nvmlDeviceGetGpuInstanceProfileInfo`` reports
(19 for an A100's one-slice profile), not the ``NVML_GPU_INSTANCE_PROFILE_*`` index asked with.

A profile is named by its slice group (``2g`` of ``2g.10gb``), as HAMi maps an allowlisted name to
NVML's profile of that many compute slices. The compute instance always spans its GPU instance.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from hamid.log import get_logger
from hamid.model.devices import MigPlacement

log = get_logger("plugin.mig")

#: The GPU and compute instance profile constants of each slice group (HAMi's table).
SLICE_GROUPS: dict[str, tuple[str, str]] = {
    f"{n}g": (f"NVML_GPU_INSTANCE_PROFILE_{n}_SLICE", f"NVML_COMPUTE_INSTANCE_PROFILE_{n}_SLICE")
    for n in (1, 2, 3, 4, 6, 7, 8)
}


class MigNvmlError(RuntimeError):
    """A MIG operation NVML refused or could not finish; the message names the step and NVML's error."""


class MigInstanceInUse(MigNvmlError):
    """NVML keeps an instance because a process runs on it: a destroy to try again later, no fault."""


@dataclass(frozen=True, slots=True)
class MigSliceProfile:
    """What NVML reports for one slice group of a GPU: the capability a profile name registers."""

    slices: str
    memory_mb: int
    multiprocessors: int
    slice_count: int
    instance_count: int
    placements: tuple[MigPlacement, ...]


@dataclass(frozen=True, slots=True)
class LiveInstance:
    """A GPU instance with its compute instance, as NVML shows it: ids, placement and MIG UUID."""

    gpu_instance_id: int
    compute_instance_id: int
    mig_uuid: str
    placement: MigPlacement


def _text(value: str | bytes) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _code(exc: Exception) -> int | None:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def _slice_group(slices: str) -> tuple[str, str]:
    """The NVML profile constants of a slice group; :class:`MigNvmlError` for one without any (a
    record naming an unknown profile is bad input, never a crash)."""
    group = SLICE_GROUPS.get(slices)
    if group is None:
        raise MigNvmlError(f"no NVML MIG profile for slice group {slices!r} (known: {list(SLICE_GROUPS)})")
    return group


def _gi_info(lib: ModuleType, handle: Any, slices: str) -> Any:
    """NVML's GPU instance profile of a slice group (its ``id`` is what creation takes)."""
    return lib.nvmlDeviceGetGpuInstanceProfileInfo(handle, getattr(lib, _slice_group(slices)[0]))


def _ci_info(lib: ModuleType, gpu_instance: Any, slices: str) -> Any:
    return lib.nvmlGpuInstanceGetComputeInstanceProfileInfo(
        gpu_instance, getattr(lib, _slice_group(slices)[1]), lib.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
    )


def _placements(lib: ModuleType, handle: Any, profile_id: int) -> tuple[MigPlacement, ...]:
    """The placements NVML allows for a profile (asked for the count first, as its API documents)."""
    count = ctypes.c_uint(0)
    lib.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, None, ctypes.byref(count))
    array = (lib.c_nvmlGpuInstancePlacement_t * max(count.value, 1))()
    lib.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, array, ctypes.byref(count))
    return tuple(MigPlacement(int(p.start), int(p.size)) for p in array[: count.value])


def _listed(fill: Callable[[Any, Any], Any], element: Any, capacity: int) -> list[Any]:
    """The handles an NVML list call fills into an array of ``capacity`` (its profile's instance count)."""
    count = ctypes.c_uint(0)
    array = (element * max(capacity, 1))()
    fill(array, ctypes.byref(count))
    return list(array[: count.value])


def _gpu_instances(lib: ModuleType, handle: Any, info: Any) -> list[Any]:
    return _listed(
        lambda a, c: lib.nvmlDeviceGetGpuInstances(handle, info.id, a, c),
        lib.c_nvmlGpuInstance_t,
        int(info.instanceCount),
    )


def _compute_instances(lib: ModuleType, gpu_instance: Any, info: Any) -> list[Any]:
    return _listed(
        lambda a, c: lib.nvmlGpuInstanceGetComputeInstances(gpu_instance, info.id, a, c),
        lib.c_nvmlComputeInstance_t,
        int(info.instanceCount),
    )


def _placement_of(info: Any) -> MigPlacement:
    return MigPlacement(int(info.placement.start), int(info.placement.size))


def _offered_groups(lib: ModuleType, handle: Any) -> Iterator[tuple[str, Any]]:
    """Each slice group the GPU offers with NVML's profile of it (one the GPU does not know, NVML's
    NOT_SUPPORTED or INVALID_ARGUMENT, is left out); another NVML error is raised as it comes."""
    for slices in SLICE_GROUPS:
        try:
            info = _gi_info(lib, handle, slices)
        except lib.NVMLError as exc:
            if _code(exc) in (lib.NVML_ERROR_NOT_SUPPORTED, lib.NVML_ERROR_INVALID_ARGUMENT):
                continue
            raise
        yield slices, info


def read_slice_profiles(lib: ModuleType, handle: Any) -> tuple[MigSliceProfile, ...]:
    """Every slice group the GPU offers, with its placements (a group NVML does not know is left out).

    Raises :class:`MigNvmlError` for another NVML failure, which leaves the GPU's capability unknown.
    """
    out: list[MigSliceProfile] = []
    try:
        offered = list(_offered_groups(lib, handle))
    except lib.NVMLError as exc:
        raise MigNvmlError(f"read MIG profiles: {exc}") from exc
    for slices, info in offered:
        try:
            placements = _placements(lib, handle, int(info.id))
        except lib.NVMLError as exc:
            raise MigNvmlError(f"read MIG placements of profile {slices}: {exc}") from exc
        out.append(
            MigSliceProfile(
                slices=slices,
                memory_mb=int(info.memorySizeMB),
                multiprocessors=int(info.multiprocessorCount),
                slice_count=int(info.sliceCount),
                instance_count=int(info.instanceCount),
                placements=placements,
            )
        )
    return tuple(out)


def _mig_uuid(lib: ModuleType, handle: Any, gpu_instance_id: int, compute_instance_id: int) -> str | None:
    """The UUID of the MIG device of this GPU and compute instance (None: NVML shows none)."""
    return _devices_by_id(lib, handle).get((gpu_instance_id, compute_instance_id))


def _destroy_quietly(lib: ModuleType, destroy: Callable[[Any], Any], handle: Any, what: str) -> None:
    """Undo one step of a failed creation; a failure here is logged (the orphan needs a hand)."""
    try:
        destroy(handle)
    except lib.NVMLError as exc:
        log.error("mig_rollback_failed_orphan_left", instance=what, nvml_error=str(exc))
    else:
        log.info("mig_rollback_destroyed", instance=what)


def create_instance(
    lib: ModuleType, uuid: str, slices: str, placement: MigPlacement
) -> tuple[LiveInstance, bool]:
    """Realize a GPU instance of ``slices`` at exactly ``placement`` with a compute instance spanning it.

    Returns the instance and whether this call created it: an idle GPU instance already at that
    placement with that profile is taken over (a plugin that died between creating and recording
    leaves one), given a compute instance if it has none; one running processes is refused. Never
    tries another placement. On any failure what this call created is destroyed again, and
    :class:`MigNvmlError` names the step and NVML's error.
    """
    where = f"{slices} at start {placement.start} size {placement.size} on {uuid}"
    try:
        handle = lib.nvmlDeviceGetHandleByUUID(uuid)
        info = _gi_info(lib, handle, slices)
        allowed = _placements(lib, handle, int(info.id))
    except lib.NVMLError as exc:
        raise MigNvmlError(f"read MIG profile {where}: {exc}") from exc
    if placement not in allowed:
        raise MigNvmlError(
            f"placement start {placement.start} size {placement.size} is not one NVML allows for "
            f"profile {slices} on {uuid} (allowed: {[(p.start, p.size) for p in allowed]})"
        )
    try:
        existing = [
            g
            for g in _gpu_instances(lib, handle, info)
            if _placement_of(lib.nvmlGpuInstanceGetInfo(g)) == placement
        ]
    except lib.NVMLError as exc:
        raise MigNvmlError(f"list GPU instances {where}: {exc}") from exc
    created_gi = not existing
    if existing:
        gpu_instance = existing[0]
        try:
            busy = _has_processes(lib, handle, int(lib.nvmlGpuInstanceGetInfo(gpu_instance).id))
        except lib.NVMLError as exc:
            raise MigNvmlError(f"check the processes on GPU instance {where}: {exc}") from exc
        if busy:
            raise MigNvmlError(f"GPU instance {where} exists and runs processes: not taken over")
    else:
        request = lib.c_nvmlGpuInstancePlacement_t(placement.start, placement.size)
        try:
            gpu_instance = lib.nvmlDeviceCreateGpuInstanceWithPlacement(
                handle, info.id, ctypes.byref(request)
            )
        except lib.NVMLError as exc:
            raise MigNvmlError(f"create GPU instance {where}: {exc}") from exc
    try:
        live = _with_compute_instance(lib, handle, gpu_instance, slices, placement, where)
    except MigNvmlError:
        if created_gi:
            _destroy_quietly(lib, lib.nvmlGpuInstanceDestroy, gpu_instance, f"GPU instance {where}")
        raise
    return live, created_gi


def _with_compute_instance(
    lib: ModuleType, handle: Any, gpu_instance: Any, slices: str, placement: MigPlacement, where: str
) -> LiveInstance:
    """The GPU instance's compute instance (created when it has none) and MIG UUID; what this step
    created is destroyed again when a later step fails."""
    try:
        gi_id = int(lib.nvmlGpuInstanceGetInfo(gpu_instance).id)
        ci_info = _ci_info(lib, gpu_instance, slices)
        present = _compute_instances(lib, gpu_instance, ci_info)
    except lib.NVMLError as exc:
        raise MigNvmlError(f"read compute instance profile {where}: {exc}") from exc
    if present:
        compute_instance, created = present[0], False
    else:
        try:
            compute_instance, created = (
                lib.nvmlGpuInstanceCreateComputeInstance(gpu_instance, ci_info.id),
                True,
            )
        except lib.NVMLError as exc:
            raise MigNvmlError(f"create compute instance {where}: {exc}") from exc
    try:
        ci_id = int(lib.nvmlComputeInstanceGetInfo(compute_instance).id)
        mig_uuid = _mig_uuid(lib, handle, gi_id, ci_id)
        if mig_uuid is None:
            raise MigNvmlError(f"no MIG device for GPU instance {gi_id} compute instance {ci_id} {where}")
    except (lib.NVMLError, MigNvmlError) as exc:
        if created:
            _destroy_quietly(
                lib, lib.nvmlComputeInstanceDestroy, compute_instance, f"compute instance {where}"
            )
        if isinstance(exc, MigNvmlError):
            raise
        raise MigNvmlError(f"identify the MIG device {where}: {exc}") from exc
    return LiveInstance(gi_id, ci_id, mig_uuid, placement)


def destroy_instance(lib: ModuleType, uuid: str, expected: LiveInstance) -> bool:
    """Destroy one compute instance and its GPU instance; False when ``expected`` is already gone.

    The GPU instance id alone proves nothing (the driver reuses ids once an instance goes outside
    this plugin): it must sit at the expected placement, and its compute instance of the expected id
    must be the expected MIG device; otherwise another instance took the id and is left alone. A
    GPU instance whose compute instance is gone (an earlier destroy stopped half way) is destroyed
    when it has no other. A process on it raises :class:`MigInstanceInUse`.
    """
    gi_id, ci_id = expected.gpu_instance_id, expected.compute_instance_id
    where = f"GPU instance {gi_id} compute instance {ci_id} ({expected.mig_uuid}) on {uuid}"
    try:
        handle = lib.nvmlDeviceGetHandleByUUID(uuid)
        try:
            gpu_instance = lib.nvmlDeviceGetGpuInstanceById(handle, gi_id)
        except lib.NVMLError as exc:
            if _code(exc) == lib.NVML_ERROR_NOT_FOUND:
                return False
            raise
        if _placement_of(lib.nvmlGpuInstanceGetInfo(gpu_instance)) != expected.placement:
            return False
        devices = _devices_by_id(lib, handle)
        found = devices.get((gi_id, ci_id))
        if found is not None and found != expected.mig_uuid:
            return False
        if found is None and any(g == gi_id for g, _c in devices):
            return False  # its compute instances are another's
        if found is not None:
            lib.nvmlComputeInstanceDestroy(lib.nvmlGpuInstanceGetComputeInstanceById(gpu_instance, ci_id))
        lib.nvmlGpuInstanceDestroy(gpu_instance)
    except lib.NVMLError as exc:
        error = MigInstanceInUse if _code(exc) == lib.NVML_ERROR_IN_USE else MigNvmlError
        raise error(f"destroy {where}: {exc}") from exc
    return True


def destroy_all(lib: ModuleType, uuid: str) -> int:
    """Destroy every compute and GPU instance on the GPU (every profile NVML knows); how many GPU
    instances were destroyed. Raises :class:`MigNvmlError` at the first one NVML keeps."""
    destroyed = 0
    try:
        handle = lib.nvmlDeviceGetHandleByUUID(uuid)
        for profile in range(int(lib.NVML_GPU_INSTANCE_PROFILE_COUNT)):
            try:
                info = lib.nvmlDeviceGetGpuInstanceProfileInfo(handle, profile)
            except lib.NVMLError:
                continue  # a profile this GPU does not offer
            for gpu_instance in _gpu_instances(lib, handle, info):
                for ci_profile in range(int(lib.NVML_COMPUTE_INSTANCE_PROFILE_COUNT)):
                    try:
                        ci_info = lib.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                            gpu_instance, ci_profile, lib.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
                        )
                    except lib.NVMLError:
                        continue
                    for compute_instance in _compute_instances(lib, gpu_instance, ci_info):
                        lib.nvmlComputeInstanceDestroy(compute_instance)
                lib.nvmlGpuInstanceDestroy(gpu_instance)
                destroyed += 1
    except lib.NVMLError as exc:
        raise MigNvmlError(f"destroy the MIG instances on {uuid}: {exc}") from exc
    return destroyed


def find_instance(
    lib: ModuleType, uuid: str, slices: str, placement: MigPlacement, expected: LiveInstance
) -> bool:
    """Whether NVML shows exactly ``expected``: a GPU instance of ``slices`` at ``placement`` with its
    id, a compute instance with its id, and its MIG UUID (what a restarted plugin adopts)."""
    try:
        handle = lib.nvmlDeviceGetHandleByUUID(uuid)
        info = _gi_info(lib, handle, slices)
        for gpu_instance in _gpu_instances(lib, handle, info):
            gi = lib.nvmlGpuInstanceGetInfo(gpu_instance)
            if int(gi.id) != expected.gpu_instance_id or _placement_of(gi) != placement:
                continue
            cis = _compute_instances(lib, gpu_instance, _ci_info(lib, gpu_instance, slices))
            ids = {int(lib.nvmlComputeInstanceGetInfo(c).id) for c in cis}
            if expected.compute_instance_id not in ids:
                return False
            found = _mig_uuid(lib, handle, expected.gpu_instance_id, expected.compute_instance_id)
            return found == expected.mig_uuid
    except lib.NVMLError as exc:
        raise MigNvmlError(f"look up MIG instance {expected.mig_uuid} on {uuid}: {exc}") from exc
    return False


def live_instances(lib: ModuleType, uuid: str) -> list[tuple[str, LiveInstance]]:
    """Every GPU instance of a known slice group on the GPU that has a MIG device, with that slice
    group: its id, placement, and its first compute instance's id and MIG UUID. A GPU instance
    without a compute instance is left out. Raises :class:`MigNvmlError` when NVML cannot tell."""
    out: list[tuple[str, LiveInstance]] = []
    try:
        handle = lib.nvmlDeviceGetHandleByUUID(uuid)
        devices = _devices_by_id(lib, handle)
        for slices, info in _offered_groups(lib, handle):
            for gpu_instance in _gpu_instances(lib, handle, info):
                gi = lib.nvmlGpuInstanceGetInfo(gpu_instance)
                gi_id = int(gi.id)
                ci_id = min((c for g, c in devices if g == gi_id), default=None)
                if ci_id is not None:
                    live = LiveInstance(gi_id, ci_id, devices[(gi_id, ci_id)], _placement_of(gi))
                    out.append((slices, live))
    except lib.NVMLError as exc:
        raise MigNvmlError(f"list the MIG instances on {uuid}: {exc}") from exc
    return out


def _devices_by_id(lib: ModuleType, handle: Any) -> dict[tuple[int, int], str]:
    """The GPU's MIG device UUIDs by (GPU instance id, compute instance id)."""
    return {
        (int(lib.nvmlDeviceGetGpuInstanceId(d)), int(lib.nvmlDeviceGetComputeInstanceId(d))): _text(
            lib.nvmlDeviceGetUUID(d)
        )
        for d in _mig_devices(lib, handle)
    }


def _mig_devices(lib: ModuleType, handle: Any) -> list[Any]:
    """The GPU's MIG devices (one per compute instance)."""
    devices = []
    for index in range(int(lib.nvmlDeviceGetMaxMigDeviceCount(handle))):
        try:
            devices.append(lib.nvmlDeviceGetMigDeviceHandleByIndex(handle, index))
        except lib.NVMLError as exc:
            if _code(exc) != lib.NVML_ERROR_NOT_FOUND:
                raise
    return devices


def _runs_processes(lib: ModuleType, device: Any) -> bool:
    return bool(lib.nvmlDeviceGetComputeRunningProcesses(device)) or bool(
        lib.nvmlDeviceGetGraphicsRunningProcesses(device)
    )


def _has_processes(lib: ModuleType, handle: Any, gpu_instance_id: int) -> bool:
    """Whether a MIG device of this GPU instance runs a process."""
    return any(
        _runs_processes(lib, d)
        for d in _mig_devices(lib, handle)
        if int(lib.nvmlDeviceGetGpuInstanceId(d)) == gpu_instance_id
    )


def busy_reason(lib: ModuleType, uuid: str) -> str | None:
    """Why the GPU counts as in use for NVML (processes on one of its MIG devices, or a query that
    failed: assumed busy, as HAMi does); None when idle."""
    try:
        handle = lib.nvmlDeviceGetHandleByUUID(uuid)
        for device in _mig_devices(lib, handle):
            if _runs_processes(lib, device):
                return f"processes on MIG device {_text(lib.nvmlDeviceGetUUID(device))}"
    except lib.NVMLError as exc:
        return f"NVML process query failed ({exc}); assumed busy"
    return None
