"""Per-container GPU usage read from HAMi-core's shared-region cache files (HAMi's vGPU monitor).

HAMi-core (``libvgpu.so``) keeps, per container, a memory-mapped ``shared_region_t``
(``src/multiprocess/multiprocess_memory_limit.h``, version 1.x) in the file named by
``CUDA_DEVICE_MEMORY_SHARED_CACHE``; on the host it lies in the container's cache directory,
``<HOOK_PATH>/vgpu/containers/<podUID>_<container>/<token>.cache``. The structures below mirror
that header field by field with C layout (``ctypes``), so offsets follow the platform's ABI
(x86_64 and arm64 glibc: ``sem_t`` is 32 bytes). Only the parts needed are read (``pread``): the
header, the live process slots and the counters after them, never the whole 2 MB file.

A file is used only when its ``initialized_flag`` is HAMi-core's magic and its major version is 1;
anything else (a partly written file, another layout) is skipped and counted, never misread.
"""

from __future__ import annotations

import ctypes
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from hamid.log import get_logger
from hamid.model import hamicore
from hamid.plugin.cachedirs import pod_uid_of

log = get_logger("plugin.vgpu_monitor")

MAGIC = 19920718
MAJOR_VERSION = 1
MAX_DEVICES = 16
MAX_PROCESSES = 1024
UUID_BYTES = 96
SEM_T_BYTES = 32


class DeviceMemory(ctypes.Structure):
    """``device_memory_t``: bytes a process holds on one device, by kind."""

    _fields_ = [
        ("context_size", ctypes.c_uint64),
        ("module_size", ctypes.c_uint64),
        ("data_size", ctypes.c_uint64),
        ("offset", ctypes.c_uint64),
        ("total", ctypes.c_uint64),
        ("unused", ctypes.c_uint64 * 3),
    ]


class DeviceUtil(ctypes.Structure):
    """``device_util_t``: a process's decoder, encoder and SM utilisation (percent) on one device."""

    _fields_ = [
        ("dec_util", ctypes.c_uint64),
        ("enc_util", ctypes.c_uint64),
        ("sm_util", ctypes.c_uint64),
        ("unused", ctypes.c_uint64 * 3),
    ]


class ProcSlot(ctypes.Structure):
    """``shrreg_proc_slot_t``: one process of the container (``pid`` 0 = free slot)."""

    _fields_ = [
        ("pid", ctypes.c_int32),
        ("hostpid", ctypes.c_int32),
        ("used", DeviceMemory * MAX_DEVICES),
        ("monitorused", ctypes.c_uint64 * MAX_DEVICES),
        ("device_util", DeviceUtil * MAX_DEVICES),
        ("status", ctypes.c_int32),
        ("seqlock", ctypes.c_uint64),
        ("unused", ctypes.c_uint64 * 2),
    ]


class RegionHead(ctypes.Structure):
    """``shared_region_t`` up to (excluding) ``procs``: versions, devices, limits."""

    _fields_ = [
        ("initialized_flag", ctypes.c_int32),
        ("major_version", ctypes.c_uint32),
        ("minor_version", ctypes.c_uint32),
        ("sm_init_flag", ctypes.c_int32),
        ("owner_pid", ctypes.c_size_t),
        ("sem", ctypes.c_uint8 * SEM_T_BYTES),
        ("device_num", ctypes.c_uint64),
        ("uuids", (ctypes.c_char * UUID_BYTES) * MAX_DEVICES),
        ("limit", ctypes.c_uint64 * MAX_DEVICES),
        ("sm_limit", ctypes.c_uint64 * MAX_DEVICES),
    ]


class SharedRegion(ctypes.Structure):
    """The whole ``shared_region_t`` (used for its field offsets and size)."""

    _fields_ = [
        *RegionHead._fields_,
        ("procs", ProcSlot * MAX_PROCESSES),
        ("proc_num", ctypes.c_int),
        ("utilization_switch", ctypes.c_int),
        ("recent_kernel", ctypes.c_int),
        ("priority", ctypes.c_int),
        ("last_kernel_time", ctypes.c_uint64),
        ("sem_postinit", ctypes.c_uint8 * SEM_T_BYTES),
    ]


REGION_SIZE = ctypes.sizeof(SharedRegion)
_PROCS_AT = SharedRegion.procs.offset
_TAIL_AT = SharedRegion.proc_num.offset
_TAIL_BYTES = SharedRegion.last_kernel_time.offset + 8 - _TAIL_AT


class RegionError(Exception):
    """A cache file that is not (yet) a HAMi-core 1.x shared region."""


@dataclass(frozen=True, slots=True)
class DeviceUsage:
    """One device of one container: HAMi-core's limits and what its processes use now."""

    index: int
    uuid: str
    memory_used_bytes: int
    memory_limit_bytes: int
    sm_utilization_percent: int
    sm_limit_percent: int
    context_bytes: int
    module_bytes: int
    data_bytes: int
    #: What HAMi's monitor labels ``offset``: the used memory less context, module and data, in
    #: Go's uint64 arithmetic (it wraps rather than going negative).
    offset_bytes: int
    #: When a kernel last ran in the container (seconds since the epoch; 0: never), per region.
    last_kernel_time: int


def open_region(path: str, *, write: bool = False) -> int:
    """A descriptor of one cache file, opened only if it is a regular file of a region's size.

    The file lies in a directory the container writes to: its tenant may put a symbolic link
    there (to another container's region, or any host file), a FIFO or a device node, which this
    root process must neither follow, block on nor open (opening some devices acts: a watchdog
    arms). So the name is first resolved without opening anything (``O_PATH``), checked, and
    only then opened through that handle. :class:`RegionError` otherwise; the caller closes the fd.
    """
    try:
        handle = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise RegionError(f"{path}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(handle)
        if not stat.S_ISREG(st.st_mode) or st.st_size < REGION_SIZE:
            what = "not a regular file" if not stat.S_ISREG(st.st_mode) else f"{st.st_size} bytes"
            raise RegionError(f"{path}: {what}, a shared region is a file of {REGION_SIZE} bytes")
        flags = (os.O_RDWR if write else os.O_RDONLY) | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            return os.open(f"/proc/self/fd/{handle}", flags)
        except OSError as exc:
            raise RegionError(f"{path}: {exc.strerror or exc}") from None
    finally:
        os.close(handle)


def pread_exact(fd: int, size: int, at: int, path: str) -> bytes:
    """``size`` bytes at ``at``; :class:`RegionError` when the file is shorter (the container may
    truncate it at any moment after the open)."""
    data = os.pread(fd, size, at)
    if len(data) != size:
        raise RegionError(f"{path}: the file shrank below {at + size} bytes")
    return data


def read_region(path: str) -> tuple[DeviceUsage, ...]:
    """Per-device usage of one cache file (blocking); :class:`RegionError` when it is not one."""
    with open(open_region(path), "rb") as f:
        fd = f.fileno()

        def pread(size: int, at: int) -> bytes:
            return pread_exact(fd, size, at, path)

        head = RegionHead.from_buffer_copy(pread(ctypes.sizeof(RegionHead), 0))
        if head.initialized_flag != MAGIC or head.major_version != MAJOR_VERSION:
            raise RegionError(
                f"{path}: not a HAMi-core {MAJOR_VERSION}.x shared region "
                f"(flag {head.initialized_flag}, version {head.major_version}.{head.minor_version})"
            )
        tail = pread(_TAIL_BYTES, _TAIL_AT)
        proc_num = ctypes.c_int.from_buffer_copy(tail[:4]).value
        last_kernel = ctypes.c_uint64.from_buffer_copy(tail[-8:]).value
        count = max(0, min(proc_num, MAX_PROCESSES))
        raw = pread(count * ctypes.sizeof(ProcSlot), _PROCS_AT)
    slots = (ProcSlot * count).from_buffer_copy(raw) if count else ()
    live = [s for s in slots if s.status != 0]
    devices = min(int(head.device_num), MAX_DEVICES)
    return tuple(_device(head, live, i, last_kernel) for i in range(devices) if head.uuids[i].value)


def _device(head: RegionHead, live: list[ProcSlot], i: int, last_kernel: int) -> DeviceUsage:
    """Device ``i``'s usage summed over the processes as HAMi's monitor sums it: the slots up to
    ``proc_num`` whose ``status`` is set, memory as HAMi-core counts it (``used.total``)."""
    used = sum(s.used[i].total for s in live)
    context = sum(s.used[i].context_size for s in live)
    module = sum(s.used[i].module_size for s in live)
    data = sum(s.used[i].data_size for s in live)
    return DeviceUsage(
        index=i,
        uuid=head.uuids[i].value.decode(errors="replace"),
        memory_used_bytes=used,
        memory_limit_bytes=int(head.limit[i]),
        sm_utilization_percent=sum(int(s.device_util[i].sm_util) for s in live),
        sm_limit_percent=int(head.sm_limit[i]),
        context_bytes=context,
        module_bytes=module,
        data_bytes=data,
        offset_bytes=(used - context - module - data) % 2**64,
        last_kernel_time=last_kernel,
    )


@dataclass(frozen=True, slots=True)
class ContainerUsage:
    """The devices of one container's current region, named by pod UID and container."""

    pod_uid: str
    container: str
    devices: tuple[DeviceUsage, ...]


@dataclass(frozen=True, slots=True)
class UsageScan:
    """One pass over the containers directory: what was read and how many files were skipped."""

    containers: tuple[ContainerUsage, ...]
    skipped: int


#: Cache files per container directory at most, as HAMi's monitor allows (``loadCache``).
MAX_CACHE_FILES = 2
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class ContainerFiles:
    """One container's cache directory: its cache files, newest first.

    Each ``Allocate`` names a fresh ``<uuid4>.cache``, so a container allocated again while its
    pod lives (re-admitted after a node reboot) keeps its previous region beside the one its
    HAMi-core now writes, until the pod goes. HAMi's monitor (v2.10 ``loadCache``) reads one region
    per container directory, the first ``.cache`` by name (random), mapped once and kept; hamid
    reads one too, so every series is exported once per container and device, but the newest
    by modification time that reads as a region: the live one (HAMi-core created it last; a newer
    one still being created falls back to the older until it is complete).
    """

    pod_uid: str
    container: str
    #: Newest first (a tie: the later name first); None: more than :data:`MAX_CACHE_FILES`.
    paths: tuple[str, ...] | None

    def current(
        self, read: Callable[[str], _T], skipped: Callable[[str, Exception], None]
    ) -> tuple[str, _T] | None:
        """The newest file ``read`` accepts and what it read; each refused one is told to ``skipped``."""
        if self.paths is None:
            directory = f"{self.pod_uid}_{self.container}"
            skipped(directory, RegionError(f"{directory}: more than {MAX_CACHE_FILES} cache files"))
            return None
        for path in self.paths:
            try:
                return path, read(path)
            except (OSError, RegionError) as exc:
                skipped(path, exc)
        return None


def _newest_first(directory: str, files: list[str]) -> tuple[str, ...]:
    """``files`` by modification time, newest first (never following a link the tenant placed)."""
    stamped = []
    for name in files:
        path = os.path.join(directory, name)
        try:
            stamped.append((os.stat(path, follow_symlinks=False).st_mtime_ns, name, path))
        except OSError:
            continue  # gone meanwhile
    return tuple(path for _at, _name, path in sorted(stamped, reverse=True))


def cache_files(hook_path: str) -> Iterator[ContainerFiles]:
    """Each container's ``<uid>_<container>/*.cache`` under ``<hook_path>/vgpu/containers``, in
    name order (blocking). A directory holding more than :data:`MAX_CACHE_FILES` (the container
    writes it: thousands of files would cost every pass a descriptor and a read each) comes with
    ``paths`` None, read not at all."""
    root = hamicore.containers_dir(hook_path)
    try:
        entries = sorted(os.listdir(root))
    except OSError:
        return
    for name in entries:
        uid = pod_uid_of(name)
        directory = os.path.join(root, name)
        if uid is None or not os.path.isdir(directory):
            continue
        try:
            files = [f for f in os.listdir(directory) if f.endswith(hamicore.CACHE_SUFFIX)]
        except OSError:
            continue
        container = name[len(uid) + 1 :]
        if len(files) > MAX_CACHE_FILES:
            yield ContainerFiles(uid, container, None)
        elif files:
            yield ContainerFiles(uid, container, _newest_first(directory, files))


def scan(hook_path: str) -> UsageScan:
    """Read every container's current region (:meth:`ContainerFiles.current`; blocking)."""
    found: list[ContainerUsage] = []
    skipped = 0

    def skip(path: str, exc: Exception) -> None:
        nonlocal skipped
        log.debug("cache_file_skipped", file=path, error=str(exc))
        skipped += 1

    for files in cache_files(hook_path):
        current = files.current(read_region, skip)
        if current is not None:
            found.append(ContainerUsage(files.pod_uid, files.container, current[1]))
    return UsageScan(tuple(found), skipped)
