"""Dynamic MIG on the node: profile discovery and registration, NVML GPU/compute instances, the
instance manager (idempotence, reconcile, start: reset and adoption), MIG device nodes."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import time
from typing import Any

import pytest
import structlog.testing

from hamid.kube.errors import KubeError
from hamid.model.annotations import (
    DEVICES_ALLOCATED,
    MIG_ALLOCATIONS,
    decode_node_devices,
    encode_node_devices,
    encode_pod_devices,
)
from hamid.model.booked import booked_condition
from hamid.model.devices import ContainerDevice, MigPlacement
from hamid.model.errors import InvalidInput
from hamid.model.mig import AllowedMigProfiles, MigAllocation, encode_mig_allocations, reservation_text
from hamid.model.nodeconfig import NodeConfig
from hamid.plugin import mig_nvml
from hamid.plugin.device_nodes import mig_nodes, parse_mig_minors
from hamid.plugin.discovery import devices_file_json, discover_nvml, parse_devices_text
from hamid.plugin.errors import AllocationError
from hamid.plugin.inventory import GpuInventory
from hamid.plugin.mig_manager import MigManager, read_reservations
from tests.unit.plugin.fake_nvml import A100_ALLOWLIST, FakeGpu, FakeNvml, a100

ALLOW = A100_ALLOWLIST
MIG = NodeConfig(operating_mode="mig", device_split_count=10)


def reservation(
    gpu: str, profile: str, start: int, size: int, container: int = 0, device: int = 0
) -> MigAllocation:
    return MigAllocation(container, device, gpu, profile, MigPlacement(start, size))


def pod(
    name: str,
    *records: MigAllocation,
    phase: str = "Running",
    deleting: bool = False,
    gpu: bool = True,
    admitted: bool = True,
) -> dict[str, Any]:
    """A pod of the node holding ``records`` (``gpu``: its container requests the plugin's resource,
    as every pod Allocate serves does; ``admitted``: kubelet wrote its container statuses)."""
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "default",
        "annotations": {MIG_ALLOCATIONS: encode_mig_allocations(records)},
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    limits = {"nvidia.com/gpu": "1"} if gpu else {"cpu": "1"}
    status: dict[str, Any] = {"phase": phase}
    if admitted:
        status["containerStatuses"] = [{"name": "main"}]
    return {
        "metadata": meta,
        "spec": {"containers": [{"name": "main", "resources": {"limits": limits}}]},
        "status": status,
    }


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
        ({**item, "migProfiles": [{**item["migProfiles"][0], "slices": ["1g"]}]}, "slices must be one of"),
        ({**item, "migProfiles": [{**item["migProfiles"][0], "slices": {"n": 1}}]}, "slices must be one of"),
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


def test_reservations_of_the_pods_that_may_hold_an_instance() -> None:
    live = reservation("GPU-a", "1g.5gb", 6, 1)
    broken_here = pod("broken-here", gpu=True)
    broken_here["metadata"]["annotations"] |= {
        MIG_ALLOCATIONS: "[{",
        DEVICES_ALLOCATED: encode_pod_devices(((ContainerDevice("GPU-b", "NVIDIA", 4864, 15),),)),
    }
    pods = [
        pod("running", live),
        pod("pending", reservation("GPU-b", "2g.10gb", 0, 2), phase="Pending", admitted=False),
        pod("done", reservation("GPU-c", "1g.5gb", 0, 1), phase="Succeeded"),
        pod("failed", reservation("GPU-c", "1g.5gb", 1, 1), phase="Failed"),
        # its containers run through their grace period: it still holds its instance
        pod("deleting", reservation("GPU-d", "1g.5gb", 0, 1), deleting=True),
        # requests no GPU: Allocate never serves it, so its annotation pins nothing
        pod("cpu-only", reservation("GPU-a", "7g.40gb", 0, 8), gpu=False),
        broken_here,
    ]
    read = read_reservations(pods, "nvidia.com/gpu")
    assert [(h.pod, h.record.gpu_uuid, h.running) for h in read.holdings] == [
        ("default/running", "GPU-a", True),
        ("default/pending", "GPU-b", False),
        ("default/deleting", "GPU-d", True),
    ]
    (bad,) = read.unreadable
    assert (bad.pod, bad.gpus) == ("default/broken-here", frozenset({"GPU-b"}))
    assert read.known("GPU-a") and not read.known("GPU-b")
    cpu_broken = pod("cpu-broken", gpu=False)
    cpu_broken["metadata"]["annotations"][MIG_ALLOCATIONS] = "not json"
    assert read_reservations([cpu_broken], "nvidia.com/gpu").unreadable == ()
    nowhere = pod("nowhere")
    nowhere["metadata"]["annotations"][MIG_ALLOCATIONS] = "not json"
    assert not read_reservations([nowhere], "nvidia.com/gpu").known("GPU-a")  # its GPUs unknown: all


def test_a_recorded_pods_reservations_are_the_records_not_a_rewritten_annotation() -> None:
    booked = reservation("GPU-a", "1g.5gb", 6, 1)
    p = pod("p", reservation("GPU-a", "7g.40gb", 0, 8), gpu=False)  # the tenant's rewrite
    p["status"]["conditions"] = [booked_condition("node", "", "", 1.0, reservation_text([booked]))]
    (held,) = read_reservations([p], "nvidia.com/gpu").holdings
    assert held.record == booked
    realized = dataclasses.replace(booked, mig_uuid="MIG-x", gpu_instance_id=1, compute_instance_id=0)
    p["metadata"]["annotations"][MIG_ALLOCATIONS] = encode_mig_allocations([realized])
    (held,) = read_reservations([p], "nvidia.com/gpu").holdings
    assert held.record == realized  # the annotation agrees with the record: its runtime ids count


async def test_ensure_converges_and_reconcile_reclaims_only_from_a_complete_list() -> None:
    gpu = a100("GPU-a")
    lib = FakeNvml([gpu])
    r = reservation("GPU-a", "3g.20gb", 4, 4)
    pods = Pods(pod("p", r, phase="Pending"))
    manager = MigManager(lib, ["GPU-a"], pods)
    live, created = await manager.ensure(r, "default/p")
    assert created and (await manager.ensure(r, "default/p")) == (live, False)
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
    await manager.ensure(old, "default/old")
    new = reservation("GPU-a", "1g.5gb", 0, 1)
    with pytest.raises(AllocationError) as busy:
        await manager.ensure(new, "default/new")  # the old pod is still active: its slices are not free
    assert busy.value.code == "mig-placement-busy"
    pods.items = [pod("new", new, phase="Pending")]
    live, created = await manager.ensure(new, "default/new")
    assert created and lib.live(gpu) == [(0, 1, live.gpu_instance_id, live.mig_uuid)]


async def test_nvml_refusal_is_a_clear_refusal() -> None:
    gpu = a100("GPU-a")
    lib = FakeNvml([gpu])
    mig_nvml.create_instance(lib, "GPU-a", "1g", MigPlacement(0, 1))  # not this plugin's
    manager = MigManager(lib, ["GPU-a"], Pods())
    with pytest.raises(
        AllocationError, match=r"creating MIG instance 2g\.10gb failed: create GPU instance"
    ) as err:
        await manager.ensure(reservation("GPU-a", "2g.10gb", 0, 2), "default/p")
    assert err.value.code == "mig-create-failed"
    with pytest.raises(AllocationError) as unknown:
        await manager.ensure(reservation("GPU-x", "1g.5gb", 0, 1), "default/p")
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
    # the busy GPU's instance, which no record names, is registered without an owner
    assert [(m.live, m.owner) for m in manager.instances()] == [
        (realized, "default/p"),
        (manager.instances()[1].live, None),
    ]
    assert manager.events == {"reset": 1, "adopted": 1, "unowned": 1}
    (started,) = [e for e in logs if e["event"] == "mig_started"]
    assert (started["reset"], started["in_use"], started["adopted"]) == (["GPU-idle"], ["GPU-res"], 1)
    # the adopted instance converges: nothing is created for its reservation again
    before = list(lib.mig_log)
    assert await manager.ensure(record, "default/p") == (realized, False)
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
    assert any(e["event"] == "mig_instance_not_adopted" and e["mig_uuid"] == "MIG-other" for e in logs)
    # not adopted, but the running pod's reservation covers it: kept by every reconcile
    assert [m.owner for m in manager.instances()] == [None]
    assert await manager.reconcile() and len(lib.live(gpu)) == 1


async def test_start_preserves_every_gpu_when_a_reservation_is_unreadable() -> None:
    gpu = a100("GPU-a")
    lib = FakeNvml([gpu])
    mig_nvml.create_instance(lib, "GPU-a", "1g", MigPlacement(0, 1))
    broken = pod("broken")
    broken["metadata"]["annotations"][MIG_ALLOCATIONS] = "not json"
    manager = MigManager(lib, ["GPU-a"], Pods(broken))
    with structlog.testing.capture_logs() as logs:
        await manager.start()
        assert not await manager.reconcile()
    assert len(lib.live(gpu)) == 1
    assert manager.events == {"reservation_unreadable": 1, "unowned": 1, "reconcile_skipped": 1}
    (unreadable,) = [e for e in logs if e["event"] == "mig_reservation_unreadable_instances_kept"]
    assert unreadable["pod"] == "default/broken"  # named, and logged once


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
    ensuring = asyncio.create_task(manager.ensure(r, "default/p"))
    await asyncio.to_thread(started.wait, 5)
    ensuring.cancel()
    with pytest.raises(asyncio.CancelledError):
        await ensuring
    ((_s, _z, _g, mig_uuid),) = lib.live(gpu)
    assert [m.live.mig_uuid for m in manager.instances()] == [mig_uuid]
    live, created = await manager.ensure(r, "default/p")  # the retry converges on it
    assert (live.mig_uuid, created) == (mig_uuid, False)


# --- review findings (session 21): ownership, races, bad records, orphans ------------------------------


async def test_an_instance_is_never_handed_to_another_active_pod() -> None:
    gpu = a100("GPU-a")
    lib = FakeNvml([gpu])
    r = reservation("GPU-a", "1g.5gb", 5, 1)
    pods = Pods(pod("victim", r), pod("tenant", r, phase="Pending", admitted=False))  # no record: unsigned
    manager = MigManager(lib, ["GPU-a"], pods)
    victim, _ = await manager.ensure(r, "default/victim")
    with pytest.raises(AllocationError) as busy:
        await manager.ensure(r, "default/tenant")  # the tenant's annotation names the victim's key
    assert busy.value.code == "mig-placement-busy" and victim.mig_uuid in str(busy.value)
    pods.items = [pod("victim", r, phase="Succeeded"), pod("tenant", r, phase="Pending", admitted=False)]
    live, created = await manager.ensure(r, "default/tenant")  # its owner ended: a fresh instance
    assert created and live.mig_uuid != victim.mig_uuid
    assert [m.owner for m in manager.instances()] == ["default/tenant"]


async def test_start_survives_a_record_of_an_unknown_profile() -> None:
    gpu = a100("GPU-a")
    lib = FakeNvml([gpu])
    bad = MigAllocation(0, 0, "GPU-a", "x.y", MigPlacement(0, 1), "MIG-x", 1, 0)
    with pytest.raises(mig_nvml.MigNvmlError, match="no NVML MIG profile for slice group 'x'"):
        mig_nvml.find_instance(
            lib, "GPU-a", "x", MigPlacement(0, 1), mig_nvml.LiveInstance(1, 0, "MIG-x", bad.placement)
        )
    good, _ = mig_nvml.create_instance(lib, "GPU-a", "1g", MigPlacement(6, 1))
    record = MigAllocation(
        0, 0, "GPU-a", "1g.5gb", MigPlacement(6, 1), good.mig_uuid, good.gpu_instance_id, 0
    )
    manager = MigManager(lib, ["GPU-a"], Pods(pod("bad", bad), pod("good", record)))
    await manager.start()
    assert manager.events == {"adopt_failed": 1, "adopted": 1}
    assert [m.live for m in manager.instances()] == [good]


async def test_a_reconcile_never_destroys_an_instance_handed_out_meanwhile() -> None:
    gpu = a100("GPU-a")
    lib = FakeNvml([gpu])
    destroy = lib.nvmlGpuInstanceDestroy

    def slow_destroy(handle: Any) -> int:  # a real GPU instance destroy takes a while
        time.sleep(0.3)
        return destroy(handle)

    lib.nvmlGpuInstanceDestroy = slow_destroy  # type: ignore[method-assign]
    first, second = reservation("GPU-a", "1g.5gb", 6, 1), reservation("GPU-a", "1g.5gb", 5, 1)
    pods = Pods(pod("a1", first), pod("a2", second))
    manager = MigManager(lib, ["GPU-a"], pods)
    await manager.ensure(first, "default/a1")
    await manager.ensure(second, "default/a2")
    pods.items = [pod("a1", first, phase="Succeeded"), pod("a2", second, phase="Succeeded")]
    reconciling = asyncio.create_task(manager.reconcile())
    await asyncio.sleep(0.05)  # it destroys a1's instance; a2's is next on its list
    # the scheduler gave a2's slice to b, whose Allocate comes now
    pods.items.append(pod("b", second, phase="Pending", admitted=False))
    live, _created = await manager.ensure(second, "default/b")
    await reconciling
    assert live.mig_uuid in [u for *_x, u in lib.live(gpu)]
    assert [m.owner for m in manager.instances()] == ["default/b"]


async def test_an_unreadable_reservation_keeps_only_its_pods_gpus() -> None:
    a, b = a100("GPU-a"), a100("GPU-b")
    lib = FakeNvml([a, b])
    on_a, on_b = reservation("GPU-a", "1g.5gb", 6, 1), reservation("GPU-b", "1g.5gb", 6, 1)
    pods = Pods(pod("pa", on_a), pod("pb", on_b))
    manager = MigManager(lib, ["GPU-a", "GPU-b"], pods)
    await manager.ensure(on_a, "default/pa")
    await manager.ensure(on_b, "default/pb")
    cpu_only = pod("cpu-only", gpu=False)
    cpu_only["metadata"]["annotations"][MIG_ALLOCATIONS] = "not json"
    broken = pod("broken")
    broken["metadata"]["annotations"] |= {
        MIG_ALLOCATIONS: "not json",
        DEVICES_ALLOCATED: encode_pod_devices(((ContainerDevice("GPU-b", "NVIDIA", 4864, 15),),)),
    }
    pods.items = [pod("pa", on_a, phase="Succeeded"), pod("pb", on_b, phase="Succeeded"), cpu_only, broken]
    with structlog.testing.capture_logs() as logs:
        assert await manager.reconcile()
    assert lib.live(a) == [] and len(lib.live(b)) == 1  # GPU-b's reservations are unknown: kept
    (logged,) = [e for e in logs if e["event"] == "mig_reservation_unreadable_instances_kept"]
    assert (logged["pod"], logged["gpus"]) == ("default/broken", ["GPU-b"])
    new = reservation("GPU-a", "3g.20gb", 4, 4)
    pods.items.append(pod("new", new, phase="Pending", admitted=False))
    _live, created = await manager.ensure(new, "default/new")
    assert created


async def test_instances_of_pods_gone_while_down_are_reclaimed_on_a_kept_gpu() -> None:
    gpu = a100("GPU-a")
    lib = FakeNvml([gpu])
    kept, _ = mig_nvml.create_instance(lib, "GPU-a", "1g", MigPlacement(6, 1))  # pod a, still running
    mig_nvml.create_instance(lib, "GPU-a", "1g", MigPlacement(5, 1))  # pod b, deleted meanwhile
    record = dataclasses.replace(
        reservation("GPU-a", "1g.5gb", 6, 1),
        mig_uuid=kept.mig_uuid,
        gpu_instance_id=kept.gpu_instance_id,
        compute_instance_id=kept.compute_instance_id,
    )
    pods = Pods(pod("a", record))
    manager = MigManager(lib, ["GPU-a"], pods)
    await manager.start()
    assert manager.events == {"adopted": 1, "unowned": 1}
    assert await manager.reconcile()
    assert [(s, z) for s, z, *_ in lib.live(gpu)] == [(6, 1)]
    new = reservation("GPU-a", "2g.10gb", 4, 2)  # the scheduler's books: slices 4-5 are free
    pods.items.append(pod("c", new, phase="Pending", admitted=False))
    _live, created = await manager.ensure(new, "default/c")
    assert created and sorted((s, z) for s, z, *_ in lib.live(gpu)) == [(4, 2), (6, 1)]


def test_destroy_by_a_reused_gpu_instance_id_leaves_the_new_instance() -> None:
    gpu = a100("GPU-a")
    lib = FakeNvml([gpu])
    old, _ = mig_nvml.create_instance(lib, "GPU-a", "1g", MigPlacement(3, 1))
    mig_nvml.destroy_all(lib, "GPU-a")  # gone outside the manager (nvidia-smi mig -dgi)
    new, _ = mig_nvml.create_instance(lib, "GPU-a", "1g", MigPlacement(3, 1))
    other, _ = mig_nvml.create_instance(lib, "GPU-a", "2g", MigPlacement(0, 2))
    assert new.gpu_instance_id == old.gpu_instance_id  # the driver reused the id
    assert not mig_nvml.destroy_instance(lib, "GPU-a", old)  # same id and place, another MIG device
    moved = dataclasses.replace(old, gpu_instance_id=other.gpu_instance_id, mig_uuid=other.mig_uuid)
    assert not mig_nvml.destroy_instance(lib, "GPU-a", moved)  # that id sits elsewhere
    assert len(lib.live(gpu)) == 2
    assert mig_nvml.destroy_instance(lib, "GPU-a", new) and len(lib.live(gpu)) == 1


async def test_a_deleting_pod_keeps_its_instance_and_a_busy_destroy_is_deferred() -> None:
    gpu = a100("GPU-a")
    lib = FakeNvml([gpu])
    r = reservation("GPU-a", "1g.5gb", 0, 1)
    pods = Pods(pod("p", r, deleting=True))  # its containers run through their grace period
    manager = MigManager(lib, ["GPU-a"], pods)
    live, _ = await manager.ensure(r, "default/p")
    assert await manager.reconcile() and len(lib.live(gpu)) == 1 and manager.events == {"created": 1}
    gpu.instances[live.gpu_instance_id].cis[0].processes.append(object())
    pods.items = []  # gone while a process still runs on it
    assert await manager.reconcile() and len(lib.live(gpu)) == 1
    assert manager.events == {"created": 1, "destroy_deferred": 1}  # no destroy_failed to alert on
    gpu.instances[live.gpu_instance_id].cis[0].processes.clear()
    assert await manager.reconcile() and lib.live(gpu) == []
