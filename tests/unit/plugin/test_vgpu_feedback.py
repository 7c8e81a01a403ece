"""HAMi's vGPU monitor feedback (``cmd/vGPUmonitor/feedback.go``): the rule and real region files."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from hamid.plugin.vgpu_feedback import _SWITCH_AT, Control, VgpuFeedback, _Region, feedback_pass, observe
from hamid.plugin.vgpu_monitor import MAGIC, REGION_SIZE, RegionError, SharedRegion, scan

A, B = b"GPU-a".ljust(96, b"\0"), b"GPU-b".ljust(96, b"\0")
#: HAMi-core sets recent_kernel to 2 at every kernel launch; a pass counts it down.
LAUNCHED = 2


def ctl(priority: int, recent: int, switch: int = 1, gpus: tuple[bytes, ...] = (A,)) -> Control:
    return Control(gpus=gpus, priority=priority, recent_kernel=recent, utilization_switch=switch)


@pytest.mark.parametrize(
    ("controls", "expected"),
    [
        # alone on its GPU: its core limit switched off (default policy runs it unthrottled)
        ([ctl(1, LAUNCHED)], [(1, 0)]),
        # a high-priority container (0) running blocks the low one (1) and switches its limit on
        ([ctl(0, LAUNCHED), ctl(1, LAUNCHED)], [(1, 0), (-1, 1)]),
        # two of one priority running: both limited, neither blocked
        ([ctl(1, LAUNCHED), ctl(1, LAUNCHED)], [(1, 1), (1, 1)]),
        # the high one went quiet (its count reaches 0): the low one is released
        ([ctl(0, 1), ctl(1, -1)], [(0, 0), (0, 0)]),
        # on another GPU nothing is blocked
        ([ctl(0, LAUNCHED, gpus=(A,)), ctl(1, LAUNCHED, gpus=(B,))], [(1, 0), (1, 0)]),
        # a container on both GPUs is blocked by the higher one on either
        ([ctl(0, LAUNCHED, gpus=(B,)), ctl(2, LAUNCHED, gpus=(A, B))], [(1, 0), (-1, 1)]),
        # a negative priority neither marks a GPU busy nor is ever blocked
        ([ctl(-1, LAUNCHED), ctl(0, LAUNCHED)], [(1, 0), (1, 0)]),
        # a blocked container stays blocked (it does not count itself busy) while the high one runs
        ([ctl(0, LAUNCHED), ctl(1, -1)], [(1, 0), (-1, 1)]),
        # one running and one idle container of one priority: the running one is alone
        ([ctl(1, LAUNCHED), ctl(1, 0)], [(1, 0), (0, 0)]),
    ],
)
def test_observe_is_hamis_rule(controls: list[Control], expected: list[tuple[int, int]]) -> None:
    assert observe(controls) == expected


def _region_file(hook: Path, uid: str, container: str, gpu: bytes, priority: int, recent: int) -> Path:
    region = SharedRegion()
    region.initialized_flag = MAGIC
    region.major_version = 1
    region.device_num = 1
    region.uuids[0].value = gpu.rstrip(b"\0")
    region.utilization_switch = 1  # HAMi-core's value at creation
    region.recent_kernel = recent
    region.priority = priority
    directory = hook / "vgpu" / "containers" / f"{uid}_{container}"
    directory.mkdir(parents=True)
    path = directory / "token.cache"
    path.write_bytes(bytes(region))
    return path


def _fields(path: Path) -> tuple[int, int]:
    region = SharedRegion.from_buffer_copy(path.read_bytes()[:REGION_SIZE])
    return region.recent_kernel, region.utilization_switch


UID_HI, UID_LO, UID_GONE = (f"{n}{n}{n}{n}{n}{n}{n}{n}-1111-2222-3333-444455556666" for n in "abc")


def test_a_pass_writes_the_regions_of_this_nodes_pods_only(tmp_path: Path) -> None:
    hi = _region_file(tmp_path, UID_HI, "main", A, priority=0, recent=LAUNCHED)
    lo = _region_file(tmp_path, UID_LO, "main", A, priority=1, recent=LAUNCHED)
    gone = _region_file(tmp_path, UID_GONE, "main", A, priority=0, recent=LAUNCHED)
    broken = tmp_path / "vgpu" / "containers" / f"{UID_HI}_side" / "token.cache"
    broken.parent.mkdir()
    broken.write_bytes(b"\0" * 64)  # being created: too short, skipped and left alone
    result = feedback_pass(str(tmp_path), {UID_HI, UID_LO}.__contains__)
    assert (result.regions, result.changed, result.skipped) == (2, 2, 1)
    assert _fields(hi) == (1, 0)
    assert _fields(lo) == (-1, 1)  # held while the high-priority pod runs
    assert _fields(gone) == (LAUNCHED, 1)  # not a pod of this node: untouched
    assert broken.read_bytes() == b"\0" * 64
    # the next pass: the high one did not launch again, so the low one is released
    feedback_pass(str(tmp_path), {UID_HI, UID_LO}.__contains__)
    assert _fields(hi) == (0, 0) and _fields(lo) == (0, 0)
    assert feedback_pass(str(tmp_path), {UID_HI, UID_LO}.__contains__).changed == 0


def test_the_plugins_loop_passes_over_the_pods_it_knows(tmp_path: Path) -> None:
    lone = _region_file(tmp_path, UID_HI, "main", A, priority=1, recent=LAUNCHED)
    feedback = VgpuFeedback(str(tmp_path), lambda: [UID_HI], interval=0.01)

    async def two_passes() -> None:
        task = asyncio.create_task(feedback.run())
        try:
            for _ in range(500):
                await asyncio.sleep(0.01)
                if _fields(lone) == (0, 0):
                    return
        finally:
            task.cancel()

    asyncio.run(two_passes())
    assert _fields(lone) == (0, 0)


def test_a_tenants_link_or_fifo_in_its_cache_directory_is_never_followed(tmp_path: Path) -> None:
    """The container writes its own cache directory: a symbolic link there to another pod's
    region (or any host file) must not be written through by this root process, and a FIFO must
    not block the pass (or the metrics scan) forever."""
    victim = _region_file(tmp_path, UID_LO, "main", A, priority=1, recent=LAUNCHED)
    attacker = tmp_path / "vgpu" / "containers" / f"{UID_HI}_main"
    attacker.mkdir(parents=True)
    (attacker / "token.cache").symlink_to(victim)
    os.mkfifo(attacker / "fifo.cache")
    result = feedback_pass(str(tmp_path), {UID_HI}.__contains__)  # only the attacker's pod is known
    assert (result.regions, result.changed, result.skipped) == (0, 0, 2)
    assert _fields(victim) == (LAUNCHED, 1)
    usage = scan(str(tmp_path))
    assert [c.pod_uid for c in usage.containers] == [UID_LO] and usage.skipped == 2


def test_a_region_truncated_during_a_pass_does_not_crash_the_plugin_and_is_skipped_next(
    tmp_path: Path,
) -> None:
    """The container may truncate its file between the read and the write: a mapping touched past
    the end kills the process (SIGBUS), and this process serves kubelet's Allocate too."""
    path = _region_file(tmp_path, UID_HI, "main", A, priority=1, recent=LAUNCHED)
    region = _Region(str(path))
    try:
        os.truncate(path, 0)
        region.write(_SWITCH_AT, 0)  # lands in the tenant's own (now sparse) file, no signal
    finally:
        os.close(region.fd)
    with pytest.raises(RegionError):
        _Region(str(path))  # too short now: skipped by the next pass
