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
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from hamid.log import get_logger
from hamid.plugin.vgpu_monitor import (
    MAGIC,
    MAJOR_VERSION,
    MAX_DEVICES,
    RegionError,
    RegionHead,
    SharedRegion,
    cache_files,
    open_region,
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


class _Region:
    """One cache file, read and written with ``pread``/``pwrite`` on its descriptor (HAMi-core maps
    the same file: the page cache carries the writes to it at once). Never mapped here: the
    container may truncate its file at any moment, and touching a mapping past the end would
    kill this process (SIGBUS), which serves kubelet's Allocate too."""

    def __init__(self, path: str) -> None:
        self.fd = open_region(path, write=True)
        try:
            head = RegionHead.from_buffer_copy(self._read(0, ctypes.sizeof(RegionHead)))
            if head.initialized_flag != MAGIC or head.major_version != MAJOR_VERSION:
                raise RegionError(f"{path}: not a HAMi-core {MAJOR_VERSION}.x shared region")
            uuids = [bytes(head.uuids[i]) for i in range(MAX_DEVICES)]
            self.control = Control(
                gpus=tuple(u for u in uuids if u[0]),
                priority=self._int(_PRIORITY_AT),
                recent_kernel=self._int(_RECENT_KERNEL_AT),
                utilization_switch=self._int(_SWITCH_AT),
            )
        except BaseException:
            os.close(self.fd)
            raise

    def _read(self, at: int, size: int) -> bytes:
        data = os.pread(self.fd, size, at)
        if len(data) != size:
            raise RegionError(f"the file shrank below {at + size} bytes")
        return data

    def _int(self, at: int) -> int:
        return ctypes.c_int.from_buffer_copy(self._read(at, _INT)).value

    def write(self, at: int, value: int) -> None:
        os.pwrite(self.fd, bytes(ctypes.c_int(value)), at)


def feedback_pass(hook_path: str, keep: Callable[[str], bool]) -> FeedbackPass:
    """Read every region of the pods ``keep`` accepts, apply :func:`observe`, write what changed."""
    regions: list[_Region] = []
    skipped = 0
    try:
        for path in (path for uid, _container, path in cache_files(hook_path) if keep(uid)):
            try:
                regions.append(_Region(path))
            except (OSError, RegionError) as exc:
                log.debug("feedback_region_skipped", file=path, error=str(exc))
                skipped += 1
        changed = 0
        for region, (recent, switch) in zip(regions, observe([r.control for r in regions]), strict=True):
            before = region.control
            if recent != before.recent_kernel:
                region.write(_RECENT_KERNEL_AT, recent)
            if switch != before.utilization_switch:
                region.write(_SWITCH_AT, switch)
            changed += (recent, switch) != (before.recent_kernel, before.utilization_switch)
        return FeedbackPass(len(regions), changed, skipped)
    finally:
        for region in regions:
            os.close(region.fd)


class VgpuFeedback:
    """Runs :func:`feedback_pass` every ``interval`` s over the pods the plugin's cache holds."""

    def __init__(
        self, hook_path: str, pod_uids: Callable[[], Iterable[str]], interval: float = FEEDBACK_INTERVAL_S
    ) -> None:
        self.hook_path = hook_path
        self.pod_uids = pod_uids
        self.interval = interval

    async def pass_once(self) -> FeedbackPass:
        """One pass, off the event loop (the files are on local disk, but never block Allocate)."""
        known = frozenset(self.pod_uids())
        result = await asyncio.to_thread(feedback_pass, self.hook_path, known.__contains__)
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
