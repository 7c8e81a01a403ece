"""HAMi's vGPU monitor feedback (``cmd/vGPUmonitor/feedback.go``): the rule and real region files."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from hamid.model.annotations import DEVICES_ALLOCATED
from hamid.plugin.vgpu_feedback import (
    MAX_PRIORITY,
    Control,
    Trusted,
    VgpuFeedback,
    feedback_pass,
    observe,
    trusted_containers,
)
from hamid.plugin.vgpu_monitor import MAGIC, REGION_SIZE, RegionError, SharedRegion, open_region, scan

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


def _set_recent(path: Path, recent: int) -> None:
    """The container's HAMi-core counts a launched kernel."""
    region = SharedRegion.from_buffer_copy(path.read_bytes()[:REGION_SIZE])
    region.recent_kernel = recent
    path.write_bytes(bytes(region))


def _fields(path: Path) -> tuple[int, int]:
    region = SharedRegion.from_buffer_copy(path.read_bytes()[:REGION_SIZE])
    return region.recent_kernel, region.utilization_switch


UID_HI, UID_LO, UID_GONE = (f"{n}{n}{n}{n}{n}{n}{n}{n}-1111-2222-3333-444455556666" for n in "abc")


def _pod(uid: str, gpu: bytes, priority: int | str | None = None) -> dict[str, Any]:
    """A pod on the node with one container, ``main``, booked one share of ``gpu``."""
    env = [] if priority is None else [{"name": "CUDA_TASK_PRIORITY", "value": str(priority)}]
    uuid = gpu.rstrip(b"\0").decode()
    return {
        "metadata": {
            "uid": uid,
            "name": uid[:4],
            "namespace": "default",
            "annotations": {DEVICES_ALLOCATED: f"{uuid},NVIDIA,1000,10:;"},
        },
        "spec": {"containers": [{"name": "main", "env": env}]},
    }


def _trusted(*pods: dict[str, Any]) -> dict[tuple[str, str], Trusted]:
    return trusted_containers(pods)


def test_a_pass_writes_the_regions_of_this_nodes_pods_only(tmp_path: Path) -> None:
    hi = _region_file(tmp_path, UID_HI, "main", A, priority=0, recent=LAUNCHED)
    lo = _region_file(tmp_path, UID_LO, "main", A, priority=1, recent=LAUNCHED)
    gone = _region_file(tmp_path, UID_GONE, "main", A, priority=0, recent=LAUNCHED)
    broken = tmp_path / "vgpu" / "containers" / f"{UID_HI}_side" / "token.cache"
    broken.parent.mkdir()
    broken.write_bytes(b"\0" * 64)  # being created: too short, skipped and left alone
    side = _pod(UID_HI, A, 0)
    side["spec"]["containers"].append({"name": "side"})
    side["metadata"]["annotations"][DEVICES_ALLOCATED] += "GPU-a,NVIDIA,1000,10:;"
    trusted = _trusted(side, _pod(UID_LO, A, 1))
    result = feedback_pass(str(tmp_path), trusted)
    assert (result.regions, result.changed, result.skipped) == (2, 2, 1)
    assert _fields(hi) == (1, 0)
    assert _fields(lo) == (-1, 1)  # held while the high-priority pod runs
    assert _fields(gone) == (LAUNCHED, 1)  # not a pod of this node: untouched
    assert broken.read_bytes() == b"\0" * 64
    # the next pass: the high one did not launch again, so the low one is released
    feedback_pass(str(tmp_path), trusted)
    assert _fields(hi) == (0, 0) and _fields(lo) == (0, 0)
    assert feedback_pass(str(tmp_path), trusted).changed == 0


def test_a_container_allocated_again_is_fed_back_through_its_newest_region_only(tmp_path: Path) -> None:
    """Each ``Allocate`` names a fresh cache file, so a container allocated again keeps its previous
    region beside the live one. Both were fed back as two containers sharing the GPU: the stale
    one, a peer of the same priority, switched the live one's core limit on."""
    live = _region_file(tmp_path, UID_HI, "main", A, priority=1, recent=LAUNCHED)
    stale = live.with_name("0000.cache")  # first by name, as HAMi's monitor would pick
    stale.write_bytes(live.read_bytes())
    earlier = live.stat().st_mtime_ns - 600 * 10**9
    os.utime(stale, ns=(earlier, earlier))
    result = feedback_pass(str(tmp_path), _trusted(_pod(UID_HI, A, 1)))
    assert (result.regions, result.changed, result.skipped) == (1, 1, 0)
    assert _fields(live) == (1, 0)  # alone on its GPU: unthrottled
    assert _fields(stale) == (LAUNCHED, 1)  # the previous run's region: left alone


def test_a_pass_that_fell_back_to_the_stale_region_does_not_pin_the_feedback_to_it(tmp_path: Path) -> None:
    """Review s24 R4: the live region, just created, did not read yet, so a pass wrote the previous
    run's region (intended); that write moved its modification time, and HAMi-core's writes through
    its mapping do not (never on tmpfs), so the stale region stayed "newest" for good: the live
    low-priority container was never held back. The feedback's writes keep the file's time."""
    high = _region_file(tmp_path, UID_HI, "main", A, priority=0, recent=LAUNCHED)
    stale = _region_file(tmp_path, UID_LO, "main", A, priority=1, recent=0)
    earlier = stale.stat().st_mtime_ns - 600 * 10**9
    os.utime(stale, ns=(earlier, earlier))
    live = stale.with_name("ffff.cache")  # re-admitted: HAMi-core created it, not yet initialised
    image = stale.read_bytes()
    live.write_bytes(b"\0" * len(image))
    created = live.stat().st_mtime_ns
    trusted = _trusted(_pod(UID_HI, A, 0), _pod(UID_LO, A, 1))
    feedback_pass(str(tmp_path), trusted)
    assert _fields(stale) == (-1, 1)  # the fallback, held back
    with live.open("r+b") as region:  # HAMi-core initialises it through its mapping: no new time
        region.write(image)
    os.utime(live, ns=(created, created))
    for _ in range(2):
        _set_recent(high, LAUNCHED)  # the high-priority container keeps launching kernels
        feedback_pass(str(tmp_path), trusted)
    assert _fields(live) == (-1, 1)


def test_the_plugins_loop_passes_over_the_pods_it_knows(tmp_path: Path) -> None:
    lone = _region_file(tmp_path, UID_HI, "main", A, priority=1, recent=LAUNCHED)
    feedback = VgpuFeedback(str(tmp_path), lambda: [_pod(UID_HI, A)], interval=0.01)

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


def test_a_tenant_holds_no_one_back_with_what_it_writes_into_its_own_region(tmp_path: Path) -> None:
    """A red team: a container wrote another pod's GPU, priority 0 and a huge kernel count into
    its own region, and the root plugin then held that pod's kernels for good; a priority of two
    billion made every pass allocate gigabytes. The GPUs are the ones booked for the container,
    the priority its spec's, and a count above HAMi-core's own counts as one launch."""
    attacker = _region_file(tmp_path, UID_HI, "main", A, priority=1, recent=2**31 - 1)
    _region_file(tmp_path, UID_HI[:-1] + "7", "main", B, priority=0, recent=2**31 - 1)  # ignored: unknown
    victim = _region_file(tmp_path, UID_LO, "main", B, priority=1, recent=LAUNCHED)
    forged = SharedRegion.from_buffer_copy(attacker.read_bytes())
    forged.uuids[1].value = b"GPU-b"  # the victim's GPU, not booked for the attacker
    forged.priority = 0
    attacker.write_bytes(bytes(forged))
    trusted = _trusted(_pod(UID_HI, A, 2**31 - 1), _pod(UID_LO, B))
    assert trusted[UID_HI, "main"].priority == MAX_PRIORITY
    feedback_pass(str(tmp_path), trusted)
    assert _fields(victim) == (1, 0)  # alone on GPU-b: neither held nor throttled
    assert _fields(attacker) == (1, 0)  # its count written back as one launch less


def test_a_tenants_link_fifo_device_or_many_files_are_never_opened(tmp_path: Path) -> None:
    """The container writes its own cache directory: a symbolic link there to another pod's
    region (or any host file) must not be written through by this root process, a FIFO must not
    block the pass (or the metrics scan), a device node must not even be opened, and thousands of
    files must not cost a descriptor and a read each."""
    victim = _region_file(tmp_path, UID_LO, "main", A, priority=1, recent=LAUNCHED)
    containers = tmp_path / "vgpu" / "containers"
    link, fifo, many = (containers / f"{UID_HI[:-1]}{n}_main" for n in "123")
    for directory in (link, fifo, many):
        directory.mkdir(parents=True)
    (link / "token.cache").symlink_to(victim)
    os.mkfifo(fifo / "token.cache")
    for i in range(3):
        (many / f"{i}.cache").write_bytes(victim.read_bytes())
    trusted = _trusted(*(_pod(d.name.split("_")[0], A, 0) for d in (link, fifo, many)))
    result = feedback_pass(str(tmp_path), trusted)
    assert (result.regions, result.changed, result.skipped) == (0, 0, 3)
    assert _fields(victim) == (LAUNCHED, 1)
    usage = scan(str(tmp_path))
    assert [c.pod_uid for c in usage.containers] == [UID_LO] and usage.skipped == 3
    with pytest.raises(RegionError, match="not a regular file"):
        open_region("/dev/null")  # a character device: refused before it is opened
