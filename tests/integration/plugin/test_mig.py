"""Dynamic MIG end to end: unix-socket gRPC, the embedded API server, a fake NVML with driver-like
GPU/compute instance state. Allocate realizes the scheduler's reservation, records the runtime ids,
refuses what it cannot realize leaving nothing behind; deleted pods' instances are reclaimed; a
restarted plugin resets idle GPUs, keeps busy ones and adopts what it made."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from grpclib import GRPCError
from grpclib.const import Status
from prometheus_client import generate_latest

from hamid.model.annotations import (
    BIND_PHASE,
    MIG_ALLOCATIONS,
    NODE_LOCK,
    NODE_REGISTER,
    decode_node_devices,
)
from hamid.model.devices import ContainerDevices, MigPlacement
from hamid.model.mig import (
    MigAllocation,
    decode_mig_allocations,
    encode_mig_allocations,
    reservation_text,
)
from hamid.model.nodeconfig import NodeConfig
from hamid.plugin import allocator, mig_nvml
from hamid.plugin.app import PluginStartupError
from hamid.plugin.discovery import PhysicalGpu, discover_nvml
from tests.integration.plugin.helpers import (
    NODE,
    Env,
    dev,
    eventually,
    running_plugin,
    scheduled_pod,
    stored_annotations,
)
from tests.integration.plugin.test_allocate import allocate, seeded, stub_for
from tests.unit.plugin.fake_nvml import A100_ALLOWLIST, FakeNvml, a100

ALLOW = A100_ALLOWLIST
MIG = NodeConfig(operating_mode="mig", device_split_count=7)
MEMORY = {"1g.5gb": 4864, "2g.10gb": 9984, "3g.20gb": 20096, "7g.40gb": 40192}


def gpus_of(lib: FakeNvml) -> tuple[PhysicalGpu, ...]:
    return tuple(discover_nvml("/nonexistent-sysfs", lib))


@contextlib.asynccontextmanager
async def mig_plugin(lib: FakeNvml, **kwargs: Any) -> AsyncIterator[Env]:
    async with running_plugin(MIG, gpus=gpus_of(lib), nvml=lib, mig_allowlist=ALLOW, **kwargs) as (env, _):
        yield env


def r(gpu: str, profile: str, start: int, size: int, container: int = 0, device: int = 0) -> MigAllocation:
    return MigAllocation(container, device, gpu, profile, MigPlacement(start, size))


def mig_pod(name: str, records: Sequence[MigAllocation], **kwargs: Any) -> dict[str, Any]:
    """A pod as the scheduler leaves it on a MIG node: each container's devices and their reservations."""
    containers = 1 + max(x.container_index for x in records)
    devices: list[ContainerDevices] = []
    for index in range(containers):
        mine = sorted((x for x in records if x.container_index == index), key=lambda x: x.device_index)
        devices.append(tuple(dev(x.gpu_uuid, MEMORY[x.profile], 0) for x in mine))
    extra = {MIG_ALLOCATIONS: encode_mig_allocations(records)}
    return scheduled_pod(name, tuple(devices), extra=extra, mig=reservation_text(records), **kwargs)


def recorded(env: Env, name: str) -> tuple[MigAllocation, ...]:
    return decode_mig_allocations(stored_annotations(env.server, "Pod", name)[MIG_ALLOCATIONS])


async def test_allocate_creates_the_reserved_instance_and_records_its_ids() -> None:
    gpu = a100("GPU-a")
    lib = FakeNvml([gpu])
    async with mig_plugin(lib) as env, stub_for(env) as stub:
        await eventually(lambda: NODE_REGISTER in stored_annotations(env.server, "Node", NODE, None))
        (info,) = decode_node_devices(stored_annotations(env.server, "Node", NODE, None)[NODE_REGISTER])
        assert [p.name for p in info.mig_profiles] == ["1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"]
        assert (info.count, info.mode) == (7, "mig")

        await seeded(env, mig_pod("p", [r("GPU-a", "2g.10gb", 2, 2)]))
        response = await allocate(stub, "GPU-a-3")
        ((start, size, gi, mig_uuid),) = lib.live(gpu)
        assert (start, size) == (2, 2) and mig_uuid.startswith("MIG-")
        # the MIG UUID for the NVIDIA runtime, nothing of HAMi-core (MIG isolates in hardware)
        assert dict(response.envs) == {"NVIDIA_VISIBLE_DEVICES": mig_uuid}
        assert list(response.mounts) == [] and list(response.devices) == []

        stored = stored_annotations(env.server, "Pod", "p")
        assert stored[MIG_ALLOCATIONS] == (
            '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"2g.10gb",'
            f'"placement":{{"start":2,"size":2}},"migUUID":"{mig_uuid}","gpuInstanceID":{gi},'
            '"computeInstanceID":0}]'
        )
        assert stored[BIND_PHASE] == "success"
        assert NODE_LOCK not in stored_annotations(env.server, "Node", NODE, None)
        assert env.plugin.mig is not None and env.plugin.mig.events == {"reset": 1, "created": 1}
        assert not env.plugin.allocator.refusals


async def test_two_containers_each_get_their_instance() -> None:
    gpu = a100("GPU-a")
    lib = FakeNvml([gpu])
    records = [r("GPU-a", "1g.5gb", 0, 1, container=0), r("GPU-a", "3g.20gb", 4, 4, container=1)]
    async with mig_plugin(lib) as env, stub_for(env) as stub:
        await seeded(env, mig_pod("p", records, init=("setup",), containers=("main",)))
        first = await allocate(stub, "GPU-a-0")
        assert [x.realized for x in recorded(env, "p")] == [True, False]
        assert stored_annotations(env.server, "Pod", "p")[BIND_PHASE] == "allocating"
        second = await allocate(stub, "GPU-a-1")
        done = recorded(env, "p")
        assert all(x.realized for x in done)
        assert [x.placement for x in done] == [MigPlacement(0, 1), MigPlacement(4, 4)]  # unchanged
        assert first.envs["NVIDIA_VISIBLE_DEVICES"] == done[0].mig_uuid
        assert second.envs["NVIDIA_VISIBLE_DEVICES"] == done[1].mig_uuid
        assert sorted((s, z) for s, z, _g, _u in lib.live(gpu)) == [(0, 1), (4, 4)]
        assert stored_annotations(env.server, "Pod", "p")[BIND_PHASE] == "success"


async def test_an_instance_left_by_a_plugin_that_died_is_taken_over_not_created_twice() -> None:
    gpu = a100("GPU-a")
    lib = FakeNvml([gpu])
    left, _ = mig_nvml.create_instance(lib, "GPU-a", "1g", MigPlacement(5, 1))
    pod = mig_pod("p", [r("GPU-a", "1g.5gb", 5, 1)])
    async with mig_plugin(lib, pods=(pod,)) as env, stub_for(env) as stub:  # reserved: not reset
        await seeded(env, pod)
        mutations = list(lib.mig_log)
        response = await allocate(stub, "GPU-a-0")
        assert response.envs["NVIDIA_VISIBLE_DEVICES"] == left.mig_uuid
        assert lib.mig_log == mutations  # nothing created (nor destroyed)
        assert recorded(env, "p")[0].mig_uuid == left.mig_uuid
        # registered at start without an owner, then taken over for the pod it is reserved for
        assert env.plugin.mig is not None and env.plugin.mig.events == {"unowned": 1, "reused": 1}


@pytest.mark.parametrize(
    ("records", "devices_gpu", "code", "text"),
    [
        ([r("GPU-a", "2g.10gb", 1, 2)], "GPU-a", "mig-reservation-invalid", "is not one of profile 2g.10gb"),
        ([r("GPU-a", "4g.20gb", 0, 4)], "GPU-a", "mig-reservation-invalid", "is not registered"),
        ([r("GPU-b", "1g.5gb", 0, 1)], "GPU-a", "mig-reservation-invalid", "names GPU GPU-b"),
        ([r("GPU-a", "1g.5gb", 0, 1, container=1)], "GPU-a", "mig-reservation-missing", "no MIG reservation"),
    ],
)
async def test_a_reservation_that_cannot_be_realized_is_refused_creating_nothing(
    records: list[MigAllocation], devices_gpu: str, code: str, text: str
) -> None:
    gpu = a100("GPU-a")
    lib = FakeNvml([gpu, a100("GPU-b")])
    pod = scheduled_pod(
        "p",
        ((dev(devices_gpu, 4864, 0),), ()),
        containers=("main", "side"),
        extra={MIG_ALLOCATIONS: encode_mig_allocations(records)},
        mig=reservation_text(records),
    )
    async with mig_plugin(lib) as env, stub_for(env) as stub:
        await seeded(env, pod)
        with pytest.raises(GRPCError, match=text) as refused:
            await allocate(stub, f"{devices_gpu}-0")
        assert refused.value.status == Status.FAILED_PRECONDITION
        assert env.plugin.allocator.refusals == {code: 1}
        assert lib.mig_log == []
        assert stored_annotations(env.server, "Pod", "p")[BIND_PHASE] == "failed"


@pytest.mark.parametrize(
    "rewritten",
    [
        [r("GPU-a", "7g.40gb", 0, 8)],  # the whole GPU instead of the booked 1g
        [r("GPU-a", "1g.5gb", 5, 1)],  # the victim's instance
    ],
)
async def test_a_reservation_rewritten_after_the_bind_is_refused_not_realized(
    rewritten: list[MigAllocation], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review finding (s21 #1): Allocate realized whatever the annotation said; the status record's
    booked reservation is what counts (the annotation is tenant-writable)."""
    monkeypatch.setattr(allocator, "BOOKED_RECORD_WAIT_S", 0.3)  # the record never changes
    gpu = a100("GPU-a")
    lib = FakeNvml([gpu])
    async with mig_plugin(lib) as env, stub_for(env) as stub:
        await seeded(env, mig_pod("v", [r("GPU-a", "1g.5gb", 5, 1)]))
        victim = await allocate(stub, "GPU-a-1")
        p = mig_pod("p", [r("GPU-a", "1g.5gb", 6, 1)])  # books the 1g at slice 6
        p["metadata"]["annotations"][MIG_ALLOCATIONS] = encode_mig_allocations(rewritten)
        await seeded(env, p)
        before = list(lib.live(gpu))
        with pytest.raises(GRPCError, match="are not what the scheduler booked") as refused:
            await allocate(stub, "GPU-a-0")
        assert refused.value.status == Status.FAILED_PRECONDITION
        assert env.plugin.allocator.refusals == {"unbooked-allocation": 1}
        assert lib.live(gpu) == before  # nothing created, the victim's instance its own
        assert [u for *_x, u in lib.live(gpu)] == [victim.envs["NVIDIA_VISIBLE_DEVICES"]]


async def test_a_failed_second_device_destroys_the_first_leaving_no_orphan() -> None:
    gpu = a100("GPU-a")
    lib = FakeNvml([gpu])
    records = [r("GPU-a", "1g.5gb", 4, 1, device=0), r("GPU-a", "1g.5gb", 1, 1, device=1)]
    async with mig_plugin(lib) as env, stub_for(env) as stub:
        foreign, _ = mig_nvml.create_instance(lib, "GPU-a", "2g", MigPlacement(0, 2))  # not hamid's
        await seeded(env, mig_pod("p", records))
        with pytest.raises(GRPCError, match="create GPU instance 1g at start 1 size 1 on GPU-a"):
            await allocate(stub, "GPU-a-0", "GPU-a-1")
        assert env.plugin.allocator.refusals == {"mig-create-failed": 1}
        assert [u for _s, _z, _g, u in lib.live(gpu)] == [foreign.mig_uuid]
        assert lib.mig_log[-4:] == [
            ("create_gi", "GPU-a", 4, 1),
            ("create_ci", "GPU-a", 4, 0),
            ("destroy_ci", "GPU-a", 4, 0),
            ("destroy_gi", "GPU-a", 4, 1),
        ]
        assert not any(x.realized for x in recorded(env, "p"))


async def test_a_deleted_pods_instance_is_reclaimed() -> None:
    gpu = a100("GPU-a")
    lib = FakeNvml([gpu])
    async with mig_plugin(lib, mig_interval=0.05) as env, stub_for(env) as stub:
        await seeded(env, mig_pod("p", [r("GPU-a", "7g.40gb", 0, 8)]))
        await allocate(stub, "GPU-a-0")
        assert len(lib.live(gpu)) == 1
        env.server.patch("Pod", "default", "p", {"status": {"phase": "Running"}})
        await eventually(
            lambda: env.plugin.mig is not None and env.plugin.mig.events["reconcile_skipped"] == 0
        )
        assert len(lib.live(gpu)) == 1  # still running: kept across reconciles
        env.server.delete("Pod", "default", "p")
        await eventually(lambda: lib.live(gpu) == [])
        assert env.plugin.mig is not None and env.plugin.mig.events["destroyed"] == 1


async def test_restart_adopts_what_it_made_and_resets_only_idle_gpus() -> None:
    used, idle = a100("GPU-a"), a100("GPU-b")
    lib = FakeNvml([used, idle])
    async with mig_plugin(lib) as env, stub_for(env) as stub:
        await seeded(env, mig_pod("p", [r("GPU-a", "3g.20gb", 0, 4)]))
        await allocate(stub, "GPU-a-0")
        pod = env.server.get("Pod", "default", "p")
    assert pod is not None
    made = list(lib.live(used))
    mig_nvml.create_instance(lib, "GPU-b", "1g", MigPlacement(6, 1))  # a leftover on an idle GPU
    pod["status"]["phase"] = "Running"
    del pod["metadata"]["resourceVersion"]
    async with mig_plugin(lib, mig_interval=0.05, pods=(pod,)) as env:
        assert env.plugin.mig is not None
        assert lib.live(used) == made  # reserved by an active pod: untouched, and adopted
        assert lib.live(idle) == []  # idle: reset
        assert env.plugin.mig.events == {"reset": 1, "adopted": 1}
        env.server.delete("Pod", "default", "p")
        await eventually(lambda: lib.live(used) == [])  # adopted means owned: reclaimed when gone


async def test_without_nvml_a_mig_node_refuses_allocate() -> None:
    lib = FakeNvml([a100("GPU-a")])
    async with running_plugin(MIG, gpus=gpus_of(lib), nvml=None, mig_allowlist=ALLOW) as (env, _):
        async with stub_for(env) as stub:
            await seeded(env, mig_pod("p", [r("GPU-a", "1g.5gb", 0, 1)]))
            with pytest.raises(GRPCError, match="no NVML to create MIG instances"):
                await allocate(stub, "GPU-a-0")
        assert env.plugin.allocator.refusals == {"mig-unsupported": 1}


async def test_cdi_strategies_are_refused_at_start_on_a_mig_node() -> None:
    lib = FakeNvml([a100("GPU-a")])
    with pytest.raises(PluginStartupError, match="dynamic MIG"):
        async with mig_plugin(lib, device_list_strategy=("cdi-cri",)):
            pass


async def test_mig_metrics() -> None:
    lib = FakeNvml([a100("GPU-a")])
    async with mig_plugin(lib) as env, stub_for(env) as stub:
        await seeded(env, mig_pod("p", [r("GPU-a", "1g.5gb", 0, 1)]))
        await allocate(stub, "GPU-a-0")
        text = generate_latest(env.plugin.metrics.registry).decode()
        assert 'hamid_plugin_mig_instances{device_uuid="GPU-a"} 1.0' in text
        assert 'hamid_plugin_mig_events_total{event="created"} 1.0' in text
        assert 'hamid_plugin_mig_events_total{event="reset"} 1.0' in text


async def test_pass_device_specs_declares_the_mig_capability_nodes(tmp_path: Path) -> None:
    gpu = a100("GPU-a", minor=3)
    lib = FakeNvml([gpu])
    root = tmp_path / "root"
    caps = ("/dev/nvidia-caps/nvidia-cap21", "/dev/nvidia-caps/nvidia-cap22")
    nodes = ("/dev/nvidiactl", "/dev/nvidia3", *caps)
    for node in nodes:
        (root / node.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (root / node.lstrip("/")).touch()
    minors = tmp_path / "mig-minors"
    minors.write_text("config 1\nmonitor 2\ngpu3/gi1/access 21\ngpu3/gi1/ci0/access 22\n")
    async with mig_plugin(lib, pass_device_specs=True, dev_root=str(root)) as env, stub_for(env) as stub:
        env.plugin.allocator.mig_minors = str(minors)
        await seeded(env, mig_pod("p", [r("GPU-a", "7g.40gb", 0, 8)]))
        response = await allocate(stub, "GPU-a-0")
        declared = [(d.container_path, d.host_path) for d in response.devices]
        assert declared == [(n, f"{root}{n}") for n in nodes]
        # an instance whose capability the driver does not list: refused, and destroyed again (the
        # deleted pod's overlapping instance is reclaimed first)
        await seeded(env, mig_pod("q", [r("GPU-a", "3g.20gb", 4, 4)]))
        env.server.delete("Pod", "default", "p")
        await eventually(lambda: env.plugin.pods.pod("default/p") is None)
        minors.write_text("config 1\n")
        with pytest.raises(GRPCError, match="lists no MIG capability gpu3/gi"):
            await allocate(stub, "GPU-a-1")
        assert lib.live(gpu) == []
