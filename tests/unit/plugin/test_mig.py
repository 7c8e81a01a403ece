"""Dynamic MIG on the node: profile discovery and registration, NVML GPU/compute instances, the
instance manager (idempotence, reconcile, start: reset and adoption), MIG device nodes."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import pytest
import structlog.testing

from hamid.kube.errors import KubeError
from hamid.model.annotations import MIG_ALLOCATIONS, decode_node_devices, encode_node_devices
from hamid.model.devices import MigPlacement
from hamid.model.errors import InvalidInput
from hamid.model.mig import AllowedMigProfiles, MigAllocation, encode_mig_allocations
from hamid.model.nodeconfig import NodeConfig
from hamid.plugin import mig_nvml
from hamid.plugin.device_nodes import mig_nodes, parse_mig_minors
from hamid.plugin.discovery import devices_file_json, discover_nvml, parse_devices_text
from hamid.plugin.errors import AllocationError
from hamid.plugin.inventory import GpuInventory
from hamid.plugin.mig_manager import MigManager, active_reservations
from tests.unit.plugin.fake_nvml import FakeGpu, FakeNvml, a100

ALLOW = (AllowedMigProfiles(("A100-SXM4-40GB",), ("1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb")),)
MIG = NodeConfig(operating_mode="mig", device_split_count=10)


def reservation(
    gpu: str, profile: str, start: int, size: int, container: int = 0, device: int = 0
) -> MigAllocation:
    return MigAllocation(container, device, gpu, profile, MigPlacement(start, size))


def pod(name: str, *records: MigAllocation, phase: str = "Running", deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "default",
        "annotations": {MIG_ALLOCATIONS: encode_mig_allocations(records)},
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "status": {"phase": phase}}


# --- discovery and registration --------------------------------------------------------------------


def test_a100_registers_the_allowlisted_profiles_as_hami_does(tmp_path: Any) -> None:
    lib = FakeNvml([a100("GPU-a")])
    gpus = discover_nvml(tmp_path, lib)
    (info,) = GpuInventory(gpus, MIG, ALLOW).device_infos()
    assert (info.count, info.devmem, info.devcore, info.mode) == (7, 40960, 100, "mig")
    encoded = encode_node_devices([info])
    # core: the profile's share of the full GPU's 98 SMs, rounded up (HAMi's docs: 2g.10gb → 29)
    assert (
        '"migProfiles":[{"name":"1g.5gb","memoryMB":4864,"core":15,"sliceCount":1,"placements":'
        '[{"start":0,"size":1},{"start":1,"size":1},{"start":2,"size":1},{"start":3,"size":1},'
        '{"start":4,"size":1},{"start":5,"size":1},{"start":6,"size":1}]},'
        '{"name":"2g.10gb","memoryMB":9984,"core":29,"sliceCount":2,"placements":'
        '[{"start":0,"size":2},{"start":2,"size":2},{"start":4,"size":2}]},'
        '{"name":"3g.20gb","memoryMB":20096,"core":43,"sliceCount":3,"placements":'
        '[{"start":0,"size":4},{"start":4,"size":4}]},'
        '{"name":"7g.40gb","memoryMB":40192,"core":100,"sliceCount":7,"placements":[{"start":0,"size":8}]}]'
    ) in encoded
    assert decode_node_devices(encoded)[0].mig_profiles == info.mig_profiles


def test_gpus_that_cannot_register_mig_are_skipped_with_a_warning(tmp_path: Any) -> None:
    off = a100("GPU-off")
    off.mig = 0
    other = FakeGpu("GPU-t4", mig=0)
    h100 = a100("GPU-h")
    h100.name = "NVIDIA H100 80GB HBM3"
    gpus = discover_nvml(tmp_path, FakeNvml([off, other, h100, a100("GPU-a")]))
    with structlog.testing.capture_logs() as logs:
        infos = GpuInventory(gpus, MIG, ALLOW).device_infos()
    assert [i.id for i in infos] == ["GPU-a"]
    events = {(e["event"], e.get("uuid")) for e in logs}
    assert ("gpu_mig_disabled_not_registered", "GPU-off") in events
    assert ("gpu_mig_disabled_not_registered", "GPU-t4") in events
    assert ("gpu_model_not_in_mig_allowlist_not_registered", "GPU-h") in events


def test_allowlisted_profile_the_gpu_lacks_is_left_out(tmp_path: Any) -> None:
    gpu = a100("GPU-a")
    del gpu.mig_profiles[3]  # no 4g profile offered
    allow = (AllowedMigProfiles(("A100",), ("4g.20gb", "1g.5gb")),)
    with structlog.testing.capture_logs() as logs:
        (info,) = GpuInventory(discover_nvml(tmp_path, FakeNvml([gpu])), MIG, allow).device_infos()
    assert [p.name for p in info.mig_profiles] == ["1g.5gb"]
    assert any(e["event"] == "mig_profile_not_offered_by_gpu" and e["profile"] == "4g.20gb" for e in logs)


def test_devices_file_carries_mig_profiles_and_checks_them(tmp_path: Any) -> None:
    gpus = discover_nvml(tmp_path, FakeNvml([a100("GPU-a")]))
    again = parse_devices_text(devices_file_json(gpus))
    assert again == gpus
    doc = json.loads(devices_file_json(gpus))
    item = doc["devices"][0]
    bad_cases = [
        ({**item, "migEnabled": False}, "migProfiles needs migEnabled: true"),
        ({**item, "migProfiles": [{**item["migProfiles"][0], "slices": "5g"}]}, "slices must be one of"),
        ({**item, "migProfiles": [item["migProfiles"][0]] * 2}, "slice group 1g given twice"),
        ({**item, "migProfiles": [{**item["migProfiles"][0], "placements": []}]}, "non-empty list"),
        ({**item, "migProfiles": [{**item["migProfiles"][0], "extra": 1}]}, "unknown ['extra']"),
    ]
    for bad, message in bad_cases:
        with pytest.raises(InvalidInput, match=message.replace("[", r"\[").replace("]", r"\]")):
            parse_devices_text(json.dumps({"devices": [bad]}))


# --- NVML instances ----------------------------------------------------------------------------------


def test_create_is_exact_idempotent_and_refuses_overlap() -> None:
    gpu = a100("GPU-a")
    lib = FakeNvml([gpu])
    live, created = mig_nvml.create_instance(lib, "GPU-a", "2g", MigPlacement(2, 2))
    assert created and live.mig_uuid.startswith("MIG-") and live.placement == MigPlacement(2, 2)
    assert lib.live(gpu) == [(2, 2, live.gpu_instance_id, live.mig_uuid)]
    assert mig_nvml.create_instance(lib, "GPU-a", "2g", MigPlacement(2, 2)) == (live, False)
    with pytest.raises(mig_nvml.MigNvmlError, match=r"create GPU instance 1g at start 3 size 1.*23"):
        mig_nvml.create_instance(lib, "GPU-a", "1g", MigPlacement(3, 1))  # NVML: insufficient resources
    with pytest.raises(mig_nvml.MigNvmlError, match="not one NVML allows"):
        mig_nvml.create_instance(lib, "GPU-a", "2g", MigPlacement(1, 2))
    assert mig_nvml.find_instance(lib, "GPU-a", "2g", MigPlacement(2, 2), live)
    assert len(lib.live(gpu)) == 1
    gpu.instances[live.gpu_instance_id].cis[0].processes.append(object())
    with pytest.raises(mig_nvml.MigNvmlError, match="runs processes: not taken over"):
        mig_nvml.create_instance(lib, "GPU-a", "2g", MigPlacement(2, 2))


def test_compute_instance_failure_destroys_the_gpu_instance() -> None:
    gpu = a100("GPU-a")
    lib = FakeNvml([gpu])
    gpu.fail.add("create_ci")
    with (
        structlog.testing.capture_logs() as logs,
        pytest.raises(mig_nvml.MigNvmlError, match="create compute instance"),
    ):
        mig_nvml.create_instance(lib, "GPU-a", "1g", MigPlacement(0, 1))
    assert gpu.instances == {}
    assert lib.mig_log == [("create_gi", "GPU-a", 0, 1), ("destroy_gi", "GPU-a", 0, 1)]
    assert any(e["event"] == "mig_rollback_destroyed" for e in logs)


def test_destroy_all_and_busy() -> None:
    gpu = a100("GPU-a")
    lib = FakeNvml([gpu])
    for start in (0, 1):
        mig_nvml.create_instance(lib, "GPU-a", "1g", MigPlacement(start, 1))
    assert mig_nvml.busy_reason(lib, "GPU-a") is None
    gpu.instances[1].cis[0].processes.append(object())
    assert "processes on MIG device MIG-" in str(mig_nvml.busy_reason(lib, "GPU-a"))
    gpu.fail.add("processes")
    assert "assumed busy" in str(mig_nvml.busy_reason(lib, "GPU-a"))
    gpu.fail.clear()
    gpu.instances[1].cis[0].processes.clear()
    assert mig_nvml.destroy_all(lib, "GPU-a") == 2 and gpu.instances == {}


# --- device nodes ------------------------------------------------------------------------------------


def test_mig_device_nodes_from_mig_minors() -> None:
    minors = parse_mig_minors("config 1\nmonitor 2\ngpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\nbad line\n")
    assert minors == {"gpu0/gi1/access": 12, "gpu0/gi1/ci0/access": 13}
    nodes = mig_nodes(minors, "GPU-a", {"GPU-a": 0}.get, "MIG-x", (1, 0))
    assert list(nodes.values()) == [
        "/dev/nvidia0",
        "/dev/nvidia-caps/nvidia-cap12",
        "/dev/nvidia-caps/nvidia-cap13",
    ]
    with pytest.raises(AllocationError, match="gpu0/gi2/access") as missing:
        mig_nodes(minors, "GPU-a", {"GPU-a": 0}.get, "MIG-x", (2, 0))
    assert missing.value.code == "device-node-missing"


# --- the manager -------------------------------------------------------------------------------------


class Pods:
    """The node's pods as the API server would list them (``fail``: the LIST fails)."""

    def __init__(self, *pods: dict[str, Any]) -> None:
        self.items = list(pods)
        self.fail = False
        self.calls = 0

    async def __call__(self) -> list[Any]:
        self.calls += 1
        if self.fail:
            raise KubeError("API server unavailable")
        return list(self.items)


def test_active_reservations_follow_hami() -> None:
    live = reservation("GPU-a", "1g.5gb", 6, 1)
    pods = [
        pod("running", live),
        pod("pending", reservation("GPU-b", "2g.10gb", 0, 2), phase="Pending"),
        pod("done", reservation("GPU-c", "1g.5gb", 0, 1), phase="Succeeded"),
        pod("failed", reservation("GPU-c", "1g.5gb", 1, 1), phase="Failed"),
        pod("deleting", reservation("GPU-d", "1g.5gb", 0, 1), deleting=True),
    ]
    assert [(p, r.gpu_uuid) for p, r in active_reservations(pods)] == [
        ("default/running", "GPU-a"),
        ("default/pending", "GPU-b"),
    ]
    broken = pod("broken")
    broken["metadata"]["annotations"][MIG_ALLOCATIONS] = "[{"
    with pytest.raises(InvalidInput, match="pod default/broken"):
        active_reservations([broken])


async def test_ensure_converges_and_reconcile_reclaims_only_from_a_complete_list() -> None:
    gpu = a100("GPU-a")
    lib = FakeNvml([gpu])
    r = reservation("GPU-a", "3g.20gb", 4, 4)
    pods = Pods(pod("p", r, phase="Pending"))
    manager = MigManager(lib, ["GPU-a"], pods)
    live, created = await manager.ensure(r)
    assert created and (await manager.ensure(r)) == (live, False)
    assert [e[0] for e in lib.mig_log] == ["create_gi", "create_ci"]
    assert await manager.reconcile() and len(lib.live(gpu)) == 1  # still reserved
    pods.items.clear()
    pods.fail = True
    assert not await manager.reconcile() and len(lib.live(gpu)) == 1  # no list: nothing destroyed
    pods.fail = False
    assert await manager.reconcile()
    assert lib.live(gpu) == [] and manager.instances() == []
    assert manager.events == {"created": 1, "destroyed": 1, "reconcile_skipped": 1}


async def test_an_overlapping_instance_of_a_gone_pod_is_reclaimed_before_creating() -> None:
    gpu = a100("GPU-a")
    lib = FakeNvml([gpu])
    old = reservation("GPU-a", "7g.40gb", 0, 8)
    pods = Pods(pod("old", old))
    manager = MigManager(lib, ["GPU-a"], pods)
    await manager.ensure(old)
    new = reservation("GPU-a", "1g.5gb", 0, 1)
    with pytest.raises(AllocationError) as busy:
        await manager.ensure(new)  # the old pod is still active: its slices are not free
    assert busy.value.code == "mig-placement-busy"
    pods.items = [pod("new", new, phase="Pending")]
    live, created = await manager.ensure(new)
    assert created and lib.live(gpu) == [(0, 1, live.gpu_instance_id, live.mig_uuid)]


async def test_nvml_refusal_is_a_clear_refusal() -> None:
    gpu = a100("GPU-a")
    lib = FakeNvml([gpu])
    mig_nvml.create_instance(lib, "GPU-a", "1g", MigPlacement(0, 1))  # not this plugin's
    manager = MigManager(lib, ["GPU-a"], Pods())
    with pytest.raises(
        AllocationError, match=r"creating MIG instance 2g\.10gb failed: create GPU instance"
    ) as err:
        await manager.ensure(reservation("GPU-a", "2g.10gb", 0, 2))
    assert err.value.code == "mig-create-failed"
    with pytest.raises(AllocationError) as unknown:
        await manager.ensure(reservation("GPU-x", "1g.5gb", 0, 1))
    assert unknown.value.code == "mig-reservation-invalid"


async def test_start_resets_idle_gpus_preserves_busy_ones_and_adopts() -> None:
    idle, reserved, busy = a100("GPU-idle"), a100("GPU-res"), a100("GPU-busy")
    lib = FakeNvml([idle, reserved, busy])
    leftover, _ = mig_nvml.create_instance(lib, "GPU-idle", "2g", MigPlacement(0, 2))
    realized, _ = mig_nvml.create_instance(lib, "GPU-res", "1g", MigPlacement(3, 1))
    mig_nvml.create_instance(lib, "GPU-busy", "1g", MigPlacement(0, 1))
    busy.instances[1].cis[0].processes.append(object())
    record = MigAllocation(
        0, 0, "GPU-res", "1g.5gb", MigPlacement(3, 1), realized.mig_uuid, realized.gpu_instance_id, 0
    )
    pods = Pods(pod("p", record), pod("gone", reservation("GPU-idle", "2g.10gb", 0, 2), phase="Succeeded"))
    manager = MigManager(lib, ["GPU-idle", "GPU-res", "GPU-busy"], pods)
    with structlog.testing.capture_logs() as logs:
        await manager.start()
    assert lib.live(idle) == [] and len(lib.live(reserved)) == 1 and len(lib.live(busy)) == 1
    assert [m.live for m in manager.instances()] == [realized]
    assert manager.events == {"reset": 1, "adopted": 1}
    (started,) = [e for e in logs if e["event"] == "mig_started"]
    assert (started["reset"], started["in_use"], started["adopted"]) == (["GPU-idle"], ["GPU-res"], 1)
    # the adopted instance converges: nothing is created for its reservation again
    before = list(lib.mig_log)
    assert await manager.ensure(record) == (realized, False)
    assert lib.mig_log == before
    assert leftover.mig_uuid not in {m.live.mig_uuid for m in manager.instances()}


async def test_start_touches_nothing_until_the_pods_are_read_and_adopts_only_what_nvml_confirms() -> None:
    gpu = a100("GPU-a")
    lib = FakeNvml([gpu])
    live, _ = mig_nvml.create_instance(lib, "GPU-a", "1g", MigPlacement(0, 1))
    wrong = MigAllocation(0, 0, "GPU-a", "1g.5gb", MigPlacement(0, 1), "MIG-other", live.gpu_instance_id, 0)
    pods = Pods(pod("p", wrong))
    pods.fail = True
    manager = MigManager(lib, ["GPU-a"], pods, retry=0.01)
    starting = asyncio.create_task(manager.start())
    await asyncio.sleep(0.1)  # several tries (every 0.01 s), each refused
    assert pods.calls > 1 and not starting.done() and len(lib.live(gpu)) == 1
    pods.fail = False
    with structlog.testing.capture_logs() as logs:
        await asyncio.wait_for(starting, 5)
    assert len(lib.live(gpu)) == 1 and manager.instances() == []  # reserved: kept, but not adopted
    assert any(e["event"] == "mig_instance_not_adopted" and e["mig_uuid"] == "MIG-other" for e in logs)


async def test_start_preserves_every_gpu_when_a_reservation_is_unreadable() -> None:
    gpu = a100("GPU-a")
    lib = FakeNvml([gpu])
    mig_nvml.create_instance(lib, "GPU-a", "1g", MigPlacement(0, 1))
    broken = pod("broken")
    broken["metadata"]["annotations"][MIG_ALLOCATIONS] = "not json"
    manager = MigManager(lib, ["GPU-a"], Pods(broken))
    await manager.start()
    assert len(lib.live(gpu)) == 1 and manager.events == {}


async def test_a_creation_cut_off_by_a_cancel_is_recorded_not_orphaned() -> None:
    gpu = a100("GPU-a")
    lib = FakeNvml([gpu])
    started = threading.Event()
    create = lib.nvmlDeviceCreateGpuInstanceWithPlacement

    def slow_create(*args: Any) -> Any:
        started.set()
        time.sleep(0.2)  # the driver takes its time; the caller's deadline passes meanwhile
        return create(*args)

    lib.nvmlDeviceCreateGpuInstanceWithPlacement = slow_create  # type: ignore[method-assign,assignment]
    r = reservation("GPU-a", "1g.5gb", 2, 1)
    manager = MigManager(lib, ["GPU-a"], Pods(pod("p", r, phase="Pending")))
    ensuring = asyncio.create_task(manager.ensure(r))
    await asyncio.to_thread(started.wait, 5)
    ensuring.cancel()
    with pytest.raises(asyncio.CancelledError):
        await ensuring
    ((_s, _z, _g, mig_uuid),) = lib.live(gpu)
    assert [m.live.mig_uuid for m in manager.instances()] == [mig_uuid]
    live, created = await manager.ensure(r)  # the retry converges on it
    assert (live.mig_uuid, created) == (mig_uuid, False)
