"""HAMi's vGPU monitor feedback: task priority and the ``default`` core policy.

HAMi-core limits a container's SM share only while its shared region's ``utilization_switch`` is
1, and holds its kernels while ``recent_kernel`` is negative; it never sets either by itself.
HAMi's vGPU monitor does, every 5 s (``cmd/vGPUmonitor/feedback.go``, ``Observe``), and this
module does the same for ``hamid plugin``:

* a container whose kernels ran lately (``recent_kernel`` counts down from HAMi-core's last
  launch) marks its GPUs busy at its priority (``CUDA_TASK_PRIORITY``, 0 the highest);
* a container sharing a GPU with a busier container of a higher priority is blocked
  (``recent_kernel = -1``) until that one goes quiet, then released (0);
* a container's core limit is switched on only while a higher priority, or another container
  of its own priority, uses one of its GPUs: a pod alone on its GPU under
  ``GPU_CORE_UTILIZATION_POLICY=default`` runs unthrottled (``force`` throttles whatever the switch).

:func:`observe` is the rule (pure); :func:`feedback_pass` applies it to the cache files of the
pods on this node (blocking: run it in a thread); :class:`VgpuFeedback` runs it every 5 s.
"""

from __future__ import annotations

import asyncio
import ctypes
import dataclasses
import functools
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from hamid.log import get_logger
from hamid.model import hamicore, objects
from hamid.model.errors import InvalidInput
from hamid.model.kube import PodBody
from hamid.model.resources import all_containers
from hamid.plugin.allocator_rules import booked_entries
from hamid.plugin.vgpu_monitor import (
    MAGIC,
    MAJOR_VERSION,
    MAX_DEVICES,
    UUID_BYTES,
    RegionError,
    RegionHead,
    SharedRegion,
    cache_files,
    open_region,
    pread_exact,
)

log = get_logger("plugin.vgpu_feedback")

#: HAMi's monitor observes every 5 s (``watchAndFeedback``'s ticker).
FEEDBACK_INTERVAL_S = 5.0

_INT = ctypes.sizeof(ctypes.c_int)
_RECENT_KERNEL_AT = SharedRegion.recent_kernel.offset
_SWITCH_AT = SharedRegion.utilization_switch.offset
_PRIORITY_AT = SharedRegion.priority.offset


@dataclass(frozen=True, slots=True)
class Control:
    """What the rule reads of one container's shared region."""

    #: The GPUs it uses (HAMi's valid UUID slots).
    gpus: tuple[bytes, ...]
    priority: int
    recent_kernel: int
    utilization_switch: int


def _busy_at(busy: dict[bytes, list[int]], gpus: Iterable[bytes], below: int) -> bool:
    """Whether a container of priority < ``below`` ran lately on one of ``gpus`` (``CheckBlocking``)."""
    return any(n > 0 for gpu in gpus for n in busy.get(gpu, [])[: max(below, 0)])


def observe(controls: Sequence[Control]) -> list[tuple[int, int]]:
    """HAMi's ``Observe``: each container's new ``(recent_kernel, utilization_switch)``."""
    busy: dict[bytes, list[int]] = {}
    kernels: list[int] = []
    for c in controls:
        recent = c.recent_kernel
        if recent > 0:
            recent -= 1
            if recent > 0 and c.priority >= 0:
                for gpu in c.gpus:
                    counts = busy.setdefault(gpu, [])
                    counts.extend([0] * (c.priority + 1 - len(counts)))
                    counts[c.priority] += 1
        kernels.append(recent)
    out: list[tuple[int, int]] = []
    for c, recent in zip(controls, kernels, strict=True):
        higher = _busy_at(busy, c.gpus, c.priority)
        if higher:
            recent = -1 if recent >= 0 else recent
        elif recent < 0:
            recent = 0
        shared = higher or any(
            0 <= c.priority < len(busy.get(gpu, [])) and busy[gpu][c.priority] > 1 for gpu in c.gpus
        )
        out.append((recent, 1 if shared else 0))
    return out


@dataclass(frozen=True, slots=True)
class FeedbackPass:
    """One pass: the regions read, those whose fields were written, the files skipped."""

    regions: int
    changed: int
    skipped: int


@dataclass(frozen=True, slots=True)
class Trusted:
    """What the plugin, not the container, says about one container: the GPUs the scheduler booked
    for it and its task priority as HAMi-core reads it from the spec (``CUDA_TASK_PRIORITY``, else 1).

    The region is the container's own file: a tenant may write any UUID, priority or kernel count
    there. Only these are used, so a container holds back only pods sharing a GPU it was given,
    at the priority its spec (and admission) allows."""

    gpus: frozenset[bytes]
    priority: int


#: HAMi-core's own ``recent_kernel`` at a launch: a larger value is the tenant's, counted as this.
LAUNCHED = 2
#: Priorities are small integers (0 the highest); larger ones all rank last.
MAX_PRIORITY = 1023
#: HAMi-core's priority without ``CUDA_TASK_PRIORITY``.
DEFAULT_PRIORITY = 1


def trusted_containers(pods: Iterable[PodBody]) -> dict[tuple[str, str], Trusted]:
    """Per (pod UID, container name), the GPUs booked for it and its spec priority."""
    out: dict[tuple[str, str], Trusted] = {}
    for pod in pods:
        _source, layout = booked_entries(pod)
        try:
            containers = all_containers(pod)
        except InvalidInput:
            continue
        if layout is None:
            continue
        for index, container in enumerate(containers):
            if index >= len(layout) or not layout[index]:
                continue
            gpus = frozenset(d.uuid.encode()[:UUID_BYTES].ljust(UUID_BYTES, b"\0") for d in layout[index])
            out[objects.uid(pod), str(container.get("name"))] = Trusted(gpus, _spec_priority(container))
    return out


def _spec_priority(container: Mapping[str, object]) -> int:
    """``CUDA_TASK_PRIORITY`` of the container's spec as HAMi-core's ``atoi`` reads it (the last
    entry wins, as in a container's environment), else 1; clamped to ``-1..MAX_PRIORITY``."""
    value: object = None
    env = container.get("env")
    for var in env if isinstance(env, list) else ():
        if isinstance(var, Mapping) and var.get("name") == hamicore.ENV_TASK_PRIORITY:
            value = var.get("value")
    if value is None:
        return DEFAULT_PRIORITY
    digits = re.match(r"\s*([-+]?\d+)", str(value))
    number = int(digits.group(1)) if digits else 0
    return max(-1, min(number, MAX_PRIORITY))


def _read_control(path: str, trusted: Trusted) -> Control:
    """The region's counters, the GPUs it names that the container was given, the trusted priority.

    Opened, read with ``pread`` and closed at once: never mapped (the container may truncate the
    file at any moment, and a mapping touched past its end kills this process, which serves
    kubelet's Allocate too), never more than one descriptor held."""
    fd = open_region(path)
    try:

        def read(at: int, size: int) -> bytes:
            return pread_exact(fd, size, at, path)

        head = RegionHead.from_buffer_copy(read(0, ctypes.sizeof(RegionHead)))
        if head.initialized_flag != MAGIC or head.major_version != MAJOR_VERSION:
            raise RegionError(f"{path}: not a HAMi-core {MAJOR_VERSION}.x shared region")
        named = {bytes(head.uuids[i]) for i in range(MAX_DEVICES)}
        return Control(
            gpus=tuple(sorted(named & trusted.gpus)),
            priority=trusted.priority,
            recent_kernel=ctypes.c_int.from_buffer_copy(read(_RECENT_KERNEL_AT, _INT)).value,
            utilization_switch=ctypes.c_int.from_buffer_copy(read(_SWITCH_AT, _INT)).value,
        )
    finally:
        os.close(fd)


def _write(path: str, values: Sequence[tuple[int, int]]) -> None:
    """Write ``(offset, int)`` pairs into one region (reopened: the file may have been replaced).

    The file keeps its modification time: a container's current region is its newest file by that
    time (:class:`~hamid.plugin.vgpu_monitor.ContainerFiles`), and HAMi-core's own writes, through
    its mapping, rarely move it, so a write here would make a stale region look current for good."""
    fd = open_region(path, write=True)
    try:
        before = os.fstat(fd)
        for at, value in values:
            os.pwrite(fd, bytes(ctypes.c_int(value)), at)
        os.utime(fd, ns=(before.st_atime_ns, before.st_mtime_ns))
    finally:
        os.close(fd)


def feedback_pass(hook_path: str, trusted: Mapping[tuple[str, str], Trusted]) -> FeedbackPass:
    """Read the region of every container ``trusted`` names, apply :func:`observe`, write what changed."""
    paths: list[str] = []
    raw: list[tuple[int, int]] = []
    controls: list[Control] = []
    skipped = 0

    def skip(path: str, exc: Exception) -> None:
        nonlocal skipped
        log.debug("feedback_region_skipped", file=path, error=str(exc))
        skipped += 1

    for files in cache_files(hook_path):
        known = trusted.get((files.pod_uid, files.container))
        if known is None:
            continue
        current = files.current(functools.partial(_read_control, trusted=known), skip)
        if current is None:
            continue
        path, control = current
        paths.append(path)
        raw.append((control.recent_kernel, control.utilization_switch))
        # a count above HAMi-core's own is the tenant's: it counts as a launch, and is written back
        controls.append(dataclasses.replace(control, recent_kernel=min(control.recent_kernel, LAUNCHED)))
    changed = 0
    for path, (was_recent, was_switch), (recent, switch) in zip(paths, raw, observe(controls), strict=True):
        writes = [
            (at, v)
            for at, v, was in ((_RECENT_KERNEL_AT, recent, was_recent), (_SWITCH_AT, switch, was_switch))
            if v != was
        ]
        if not writes:
            continue
        try:
            _write(path, writes)
        except (OSError, RegionError) as exc:
            log.debug("feedback_region_skipped", file=path, error=str(exc))
            continue
        changed += 1
    return FeedbackPass(len(paths), changed, skipped)


class VgpuFeedback:
    """Runs :func:`feedback_pass` every ``interval`` s over the pods the plugin's cache holds."""

    def __init__(
        self, hook_path: str, pods: Callable[[], Iterable[PodBody]], interval: float = FEEDBACK_INTERVAL_S
    ) -> None:
        self.hook_path = hook_path
        self.pods = pods
        self.interval = interval

    async def pass_once(self) -> FeedbackPass:
        """One pass, off the event loop (the files are on local disk, but never block Allocate)."""
        trusted = trusted_containers(self.pods())
        result = await asyncio.to_thread(feedback_pass, self.hook_path, trusted)
        if result.changed:
            log.debug("vgpu_feedback", regions=result.regions, changed=result.changed)
        return result

    async def run(self) -> None:
        """A pass every ``interval`` until cancelled; a failed pass is logged and retried."""
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.pass_once()
            except Exception as exc:  # never take the plugin down: the next pass retries
                log.warning("vgpu_feedback_failed", error=f"{type(exc).__name__}: {exc}")
