"""Pure plugin logic: inventory/replicas/register value, preferred selection, pod choice, Allocate answer."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from hamid.model.annotations import (
    BIND_PHASE,
    BIND_TIME,
    DEVICES_TO_ALLOCATE,
    VGPU_NODE,
    encode_node_devices,
)
from hamid.model.devices import ContainerDevice, MigPlacement
from hamid.model.mig import AllowedMigProfiles
from hamid.model.nodeconfig import NodeConfig
from hamid.model.preferred import distinct_gpu_preference, select_preferred
from hamid.plugin.allocator_rules import (
    GpuFacts,
    PendingEntry,
    allowed_uuids,
    choose_pod,
    consume,
    is_allocation_candidate,
    kubelet_differs,
    pending_entries,
    refuse_unservable,
    to_allocate,
)
from hamid.plugin.discovery import PhysicalGpu
from hamid.plugin.errors import AllocationError, summarize
from hamid.plugin.hamicore_answer import HamiCoreSettings, MountSpec, hami_core_answer
from hamid.plugin.inventory import ConditionChange, GpuInventory, device_type
from hamid.plugin.mig_nvml import MigSliceProfile

V100_A = "GPU-00552014-5c87-89ac-b1a6-7b53aa24b0ec"
V100_B = "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448"


def gpu(uuid: str, index: int, numa: int | None = 0, **kw: Any) -> PhysicalGpu:
    return PhysicalGpu(
        uuid, index, kw.pop("name", "Tesla V100-PCIE-32GB"), kw.pop("mem", 32768), numa, "", **kw
    )


def test_register_value_matches_hami_bytes() -> None:
    inv = GpuInventory([gpu(V100_B, 1, None), gpu(V100_A, 0, None)], NodeConfig())
    assert encode_node_devices(inv.device_infos()) == (
        f'[{{"id":"{V100_A}","count":10,"devmem":32768,"devcore":100,"type":"NVIDIA-Tesla V100-PCIE-32GB",'
        f'"mode":"hami-core","health":true}},{{"id":"{V100_B}","index":1,"count":10,"devmem":32768,'
        '"devcore":100,"type":"NVIDIA-Tesla V100-PCIE-32GB","mode":"hami-core","health":true}]'
    )


def test_register_scaling_numa_filter_and_mig() -> None:
    config = NodeConfig(
        device_split_count=4,
        device_memory_scaling=1.5,
        device_core_scaling=2,
        preconfigured_device_memory=1000,
        filter_uuids=("GPU-x",),
        filter_indices=(3,),
    )
    gpus = [
        gpu("GPU-a", 0, 1, mem=1000),
        gpu("GPU-x", 1),
        gpu("GPU-m", 2, mig_enabled=True),
        gpu("GPU-f", 3),
        gpu("GPU-z", 4, None, mem=0),
    ]
    infos = GpuInventory(gpus, config).device_infos()
    assert [(i.id, i.devmem, i.devcore, i.numa, i.count) for i in infos] == [
        ("GPU-a", 1500, 200, 1, 4),
        ("GPU-z", 1500, 200, 0, 4),  # preconfigured memory when NVML gives none; numa unknown → 0
    ]
    # MIG mode: no scaling, and only GPUs with MIG on and an allowlisted profile NVML offers
    one = MigSliceProfile("1g", 4864, 14, 1, 7, (MigPlacement(0, 1),))
    gpus[2] = dataclasses.replace(gpus[2], mig_profiles=(one,))
    allow = (AllowedMigProfiles(("V100",), ("1g.5gb",)),)
    mig = GpuInventory(gpus[:3], NodeConfig(operating_mode="mig", device_memory_scaling=2), allow)
    assert [(i.id, i.mode, i.devmem, i.devcore, i.count) for i in mig.device_infos()] == [
        ("GPU-m", "mig", 32768, 100, 7),
    ]
    assert mig.is_mig


def test_device_type_prefix() -> None:
    assert device_type("Tesla P4") == "NVIDIA-Tesla P4"
    assert device_type("NVIDIA A100-SXM4-40GB") == "NVIDIA A100-SXM4-40GB"


def test_replicas_topology_and_health() -> None:
    gpus = [gpu("GPU-a", 0, 3), gpu("GPU-b", 1, None)]
    plain = GpuInventory(gpus, NodeConfig(device_split_count=2))
    assert [(r.id, r.numa) for r in plain.replicas()] == [
        ("GPU-a-0", None),
        ("GPU-a-1", None),
        ("GPU-b-0", None),
        ("GPU-b-1", None),
    ]
    topo = GpuInventory(gpus, NodeConfig(device_split_count=2, enable_numa_topology=True))
    assert [r.numa for r in topo.replicas()] == [3, 3, None, None]
    assert topo.uuid_of("GPU-b-1") == "GPU-b" and topo.uuid_of("GPU-b-2") is None
    assert topo.mark_unhealthy("GPU-a", "XID 79") and not topo.mark_unhealthy("GPU-a", "again")
    assert topo.generation == 1
    assert [r.healthy for r in topo.replicas()] == [False, False, True, True]


def test_conditions_are_recoverable_and_apart_from_sticky_xid_health() -> None:
    inv = GpuInventory([gpu("GPU-a", 0, 0), gpu("GPU-b", 1, 0)], NodeConfig(device_split_count=1))
    pokes: list[None] = []
    inv.on_health_change = lambda: pokes.append(None)
    assert inv.set_condition("cdi-spec-missing", ["GPU-a", "GPU-z"]) == ConditionChange(began=("GPU-a",))
    assert inv.set_condition("cdi-spec-missing", ["GPU-a"]) == ConditionChange()  # no change, no wake-up
    assert inv.set_condition("other", ["GPU-a", "GPU-b"]) == ConditionChange(began=("GPU-a", "GPU-b"))
    assert (inv.generation, len(pokes)) == (2, 2)
    assert [r.healthy for r in inv.replicas()] == [False, False]
    assert inv.set_condition("other", []) == ConditionChange(ended=("GPU-a", "GPU-b"))
    assert [r.healthy for r in inv.replicas()] == [False, True]  # GPU-a still holds the first one
    assert [d.health for d in inv.device_infos()] == [False, True]
    assert inv.facts("GPU-a") == GpuFacts(32768, 100, None)  # Allocate checks the cause itself
    inv.mark_unhealthy("GPU-a", "XID 79")
    assert inv.set_condition("cdi-spec-missing", []) == ConditionChange(ended=("GPU-a",))
    assert not inv.is_healthy("GPU-a") and inv.is_healthy("GPU-b")  # the XID is sticky
    assert (inv.generation, len(pokes)) == (5, 5)


def test_a_health_change_is_judged_again_before_watchers_wake() -> None:
    """The hook (the replica room's re-judgement) runs before the generation moves, so kubelet is
    sent one list with the new health and the hidden replicas that go with it, never one between."""
    inv = GpuInventory([gpu("GPU-a", 0, 0), gpu("GPU-b", 1, 0)], NodeConfig(device_split_count=1))
    seen: list[int] = []
    inv.on_health_change = lambda: seen.append(inv.generation)
    inv.set_condition("cdi-spec-missing", ["GPU-a"])
    inv.mark_unhealthy("GPU-b", "XID 79")
    assert (seen, inv.generation) == ([0, 1], 2)


def cd(uuid: str, mem: int = 1000, cores: int = 30) -> ContainerDevice:
    return ContainerDevice(uuid, "NVIDIA", mem, cores)


def uuid_of(device_id: str) -> str | None:
    head, _, tail = device_id.rpartition("-")
    return head if tail.isdigit() else None


def test_select_preferred_hami_vector() -> None:
    a, b = "GPU-8dcd427f-483b-b48f-d7e5-75fb19a5267a", "GPU-8dcd427f-483b-b48f-d7e5-75fb19a5267b"
    available = [f"{a}-0", f"{a}-1", f"{b}-0", f"{b}-1"]
    assert select_preferred((cd(a), cd(b)), available, [], 2, uuid_of) == ([f"{a}-0", f"{b}-0"], [])


def test_select_preferred_must_include_and_missing() -> None:
    available = ["GPU-a-0", "GPU-a-1", "GPU-b-0", "GPU-c-0"]
    # must-include covers GPU-a; GPU-b takes its first replica
    assert select_preferred((cd("GPU-a"), cd("GPU-b")), available, ["GPU-a-1"], 2, uuid_of) == (
        ["GPU-a-1", "GPU-b-0"],
        [],
    )
    chosen, missing = select_preferred((cd("GPU-a"), cd("GPU-d")), available, [], 2, uuid_of)
    assert chosen == ["GPU-a-0"] and missing == ["GPU-d"]
    assert allowed_uuids(["GPU-c-0", "GPU-a-0", "GPU-a-1", "bogus"], uuid_of) == ("GPU-c", "GPU-a")


def test_distinct_gpu_preference_spreads_over_physical_gpus() -> None:
    # Two replicas of GPU-a sort first; the fallback must not answer both of them.
    available = ["GPU-a-0", "GPU-a-1", "GPU-a-2", "GPU-b-0", "GPU-b-1", "GPU-c-0", "bogus"]
    assert distinct_gpu_preference(available, [], 2, uuid_of) == ["GPU-a-0", "GPU-b-0"]
    assert distinct_gpu_preference(list(reversed(available)), [], 2, uuid_of) == ["GPU-a-0", "GPU-b-0"]
    assert distinct_gpu_preference(available, [], 3, uuid_of) == ["GPU-a-0", "GPU-b-0", "GPU-c-0"]
    # ties on replica count: by UUID
    assert distinct_gpu_preference(["GPU-d-0", "GPU-c-0"], [], 1, uuid_of) == ["GPU-c-0"]


def test_distinct_gpu_preference_must_include_first() -> None:
    available = ["GPU-a-0", "GPU-a-1", "GPU-a-2", "GPU-b-0", "GPU-c-0", "GPU-c-1"]
    # GPU-a is taken by the must-include replica: the rest comes from other GPUs
    assert distinct_gpu_preference(available, ["GPU-a-1"], 2, uuid_of) == ["GPU-a-1", "GPU-c-0"]
    assert distinct_gpu_preference(available, ["GPU-b-0", "GPU-a-2"], 2, uuid_of) == ["GPU-b-0", "GPU-a-2"]


def test_distinct_gpu_preference_impossible_is_no_preference() -> None:
    assert distinct_gpu_preference(["GPU-a-0", "GPU-a-1", "GPU-a-2"], [], 2, uuid_of) == []
    assert (
        distinct_gpu_preference(["GPU-a-0", "GPU-a-1", "GPU-b-0"], ["GPU-a-0", "GPU-a-1"], 2, uuid_of) == []
    )
    assert distinct_gpu_preference(["GPU-a-0", "GPU-b-0"], ["GPU-a-0", "GPU-b-0"], 1, uuid_of) == []
    assert distinct_gpu_preference(["GPU-a-0", "GPU-b-0"], ["bogus"], 2, uuid_of) == []
    assert distinct_gpu_preference(["GPU-a-0"], [], 0, uuid_of) == []


def pod(
    name: str, value: str, *, phase: str = "allocating", node: str = "n1", **extra: str
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": f"uid-{name}",
            "annotations": {
                DEVICES_TO_ALLOCATE: value,
                BIND_PHASE: phase,
                BIND_TIME: "1700000000",
                VGPU_NODE: node,
                **extra,
            },
        },
        "spec": {"containers": [{"name": "main"}]},
        "status": {"phase": "Pending"},
    }


def test_candidates() -> None:
    assert is_allocation_candidate(pod("p", "GPU-a,NVIDIA,1,1:;"), "n1")
    assert not is_allocation_candidate(pod("p", "GPU-a,NVIDIA,1,1:;", phase="failed"), "n1")
    assert not is_allocation_candidate(pod("p", "GPU-a,NVIDIA,1,1:;", node="n2"), "n1")
    gone = pod("p", "GPU-a,NVIDIA,1,1:;")
    gone["metadata"]["deletionTimestamp"] = "2024-01-01T00:00:00Z"
    assert not is_allocation_candidate(gone, "n1")


P1, P2 = pod("p1", "GPU-a,NVIDIA,1000,10:;"), pod("p2", "GPU-b,NVIDIA,3000,10:;")
TWIN = pod("p3", "GPU-a,NVIDIA,2000,10:;")


def _admitted(p: dict) -> dict:
    """``p`` as kubelet shows it once admitted (its container statuses written)."""
    return {**p, "status": {**p["status"], "containerStatuses": [{"name": "main"}]}}


@pytest.mark.parametrize(
    ("candidates", "lock", "requested", "expected"),
    [
        ([_admitted(P1), P2], "default/p2", None, P2),
        ([P2], "default/p2", None, P2),
        ([P2], "default/p2", ["GPU-z"], P2),  # the holder after a fallback pick
        ([_admitted(P1), TWIN], "default/p3", ["GPU-a"], TWIN),  # the lock decides between twins
        ([P1, P2], "default/p2", ["GPU-b"], P2),  # two wait: kubelet's GPUs are the holder's alone
        # two wait (the scheduler took the lock from one that stalled): the lock no longer says
        ([P1, P2], "default/p2", None, "cannot tell which pod kubelet is admitting"),
        ([P1, P2], "default/p1", ["GPU-z"], "cannot tell which pod kubelet is admitting"),
        ([P1, TWIN], "default/p3", ["GPU-a"], "cannot tell which pod kubelet is admitting"),
        # the holder and an exact match disagree: refuse
        ([P1, P2], "default/p1", ["GPU-b"], "node lock holder default/p1 waits for other GPUs"),
        # issue 16: a pod's own annotations never prove it, only the lock the scheduler's /bind took
        ([P1, P2], None, ["GPU-b"], "no pod holds the node lock"),
        ([P1], None, ["GPU-z"], "no pod holds the node lock"),
        ([P1, P2], None, None, "no pod holds the node lock"),
        ([P1], "default/gone", ["GPU-a"], "names default/gone, which is not waiting"),
        ([], None, ["GPU-a"], "no pod on this node"),
    ],
)
def test_choose_pod_fails_closed(
    candidates: list, lock: str | None, requested: list | None, expected: object
) -> None:
    if isinstance(expected, str):
        with pytest.raises(AllocationError, match=expected) as err:
            choose_pod(candidates, lock, requested)
        assert err.value.code in ("ambiguous-pod", "unproven-pod", "no-pod")
    else:
        assert choose_pod(candidates, lock, requested) is expected


def test_entries_and_consume() -> None:
    devices = to_allocate(pod("p", ";GPU-a,NVIDIA,1000,10:GPU-b,NVIDIA,1000,10:;;GPU-c,NVIDIA,5,5:;"))
    entries = pending_entries(devices)
    assert [e.index for e in entries] == [1, 3]
    after = consume(devices, 1)
    assert [e.index for e in pending_entries(after)] == [3]
    assert len(after) == 4


def test_kubelet_differs_checks_count_only() -> None:
    entry = PendingEntry(0, (cd("GPU-a", 1000), cd("GPU-b", 2000)))
    assert kubelet_differs(entry, ["GPU-b", "GPU-a"]) is False  # same GPUs, any order
    assert kubelet_differs(entry, ["GPU-a", "GPU-c"]) is True  # another GPU: Allocate still serves a, b
    assert kubelet_differs(entry, ["GPU-c", "GPU-c"]) is True  # two replicas of one GPU: allowed too
    with pytest.raises(AllocationError, match="device number not matched"):
        kubelet_differs(entry, ["GPU-a"])
    with pytest.raises(AllocationError, match="has 2 GPU"):
        kubelet_differs(entry, ["GPU-a", "GPU-b", "GPU-c"])


def test_hami_core_answer() -> None:
    container = {"name": "main", "env": [{"name": "CUDA_DISABLE_CONTROL", "value": "true"}]}
    settings = HamiCoreSettings("/usr/local", oversubscribe=True, log_level="3", disable_core_limit=True)
    answer = hami_core_answer(
        (cd("GPU-a", 3000, 50), cd("GPU-b", 4000, 60)), "uid1", container, settings, "tok"
    )
    assert answer.envs == {  # NVIDIA_VISIBLE_DEVICES is the device list's (test_device_lists.py)
        "CUDA_DEVICE_MEMORY_LIMIT_0": "3000m",
        "CUDA_DEVICE_MEMORY_LIMIT_1": "4000m",
        "CUDA_DEVICE_SM_LIMIT": "50",
        "CUDA_DEVICE_MEMORY_SHARED_CACHE": "/usr/local/vgpu/tok.cache",
        "CUDA_OVERSUBSCRIBE": "true",
        "LIBCUDA_LOG_LEVEL": "3",
        "GPU_CORE_UTILIZATION_POLICY": "disable",
    }
    assert answer.cache_dir == "/usr/local/vgpu/containers/uid1_main"
    assert answer.mounts == (
        MountSpec("/usr/local/vgpu/libvgpu.so", "/usr/local/vgpu/libvgpu.so", True),
        MountSpec("/usr/local/vgpu", "/usr/local/vgpu/containers/uid1_main", False),
        MountSpec("/tmp/vgpulock", "/tmp/vgpulock", False),
    )
    plain = hami_core_answer((cd("GPU-a"),), "uid1", {"name": "main"}, HamiCoreSettings("/h"), "t")
    assert MountSpec("/etc/ld.so.preload", "/h/vgpu/ld.so.preload", True) in plain.mounts
    assert "CUDA_OVERSUBSCRIBE" not in plain.envs and "LIBCUDA_LOG_LEVEL" not in plain.envs


def test_select_preferred_reports_missing_gpus_after_must_include_fills_the_size() -> None:
    """kubelet's must-include replica fills the size: the annotated GPU it excluded (other NUMA node)
    is still reported missing, so a refit is attempted."""
    available = ["GPU-a-0", "GPU-a-1", "GPU-b-0"]
    assert select_preferred((cd("GPU-d"),), available, ["GPU-a-1"], 1, uuid_of) == (["GPU-a-1"], ["GPU-d"])
    # an annotated GPU kubelet still offers is not missing, even when there is no room for it
    assert select_preferred((cd("GPU-b"),), available, ["GPU-a-1"], 1, uuid_of) == (["GPU-a-1"], [])
    chosen, missing = select_preferred(
        (cd("GPU-a"), cd("GPU-d"), cd("GPU-e")), available, ["GPU-a-0"], 1, uuid_of
    )
    assert chosen == ["GPU-a-0"] and missing == ["GPU-d", "GPU-e"]


@pytest.mark.parametrize(
    ("value", "mounted"),
    [("true", False), ("T", False), ("1", False), ("false", True), ("yes", True), ("", True)],
)
def test_cuda_disable_control_is_a_go_bool(value: str, mounted: bool) -> None:
    container = {"name": "main", "env": [{"name": "CUDA_DISABLE_CONTROL", "value": value}]}
    answer = hami_core_answer((cd("GPU-a"),), "uid1", container, HamiCoreSettings("/h"), "t")
    assert (MountSpec("/etc/ld.so.preload", "/h/vgpu/ld.so.preload", True) in answer.mounts) is mounted


def test_cuda_disable_control_given_twice_is_true_when_any_entry_is() -> None:
    """HAMi skips the false and unparsable entries and leaves the preload out for any true one
    (the container sees the last: here true)."""
    for values in (("false", "true"), ("nonsense", "1"), ("true", "false")):
        env = [{"name": "CUDA_DISABLE_CONTROL", "value": v} for v in values]
        answer = hami_core_answer(
            (cd("GPU-a"),), "uid1", {"name": "m", "env": env}, HamiCoreSettings("/h"), "t"
        )
        assert MountSpec("/etc/ld.so.preload", "/h/vgpu/ld.so.preload", True) not in answer.mounts, values


def test_inventory_facts_follow_scaling_and_health() -> None:
    inv = GpuInventory(
        [gpu("GPU-a", 0, mem=1000), gpu("GPU-b", 1, mem=0)],
        NodeConfig(device_memory_scaling=2.0, device_core_scaling=1.5),
    )
    assert inv.facts("GPU-a") == GpuFacts(2000, 150, None)
    assert inv.facts("GPU-b") is None  # memory unknown: never registered, so never servable
    assert inv.facts("GPU-z") is None
    inv.mark_unhealthy("GPU-a", "XID 79")
    assert inv.facts("GPU-a") == GpuFacts(2000, 150, "XID 79")


@pytest.mark.parametrize(
    ("facts", "device", "code"),
    [
        (GpuFacts(1000, 100, None), cd("GPU-a", 1000, 100), None),
        (None, cd("GPU-a", 1000), "unknown-gpu"),
        (GpuFacts(1000, 100, "XID 48"), cd("GPU-a", 10), "unhealthy-gpu"),
        (GpuFacts(1000, 100, None), cd("GPU-a", 1001), "over-capacity"),
        (GpuFacts(1000, 100, None), cd("GPU-a", 10, 101), "over-capacity"),
    ],
)
def test_refuse_unservable(facts: GpuFacts | None, device: ContainerDevice, code: str | None) -> None:
    entry = PendingEntry(2, (device,))
    if code is None:
        refuse_unservable(entry, "n1", lambda _uuid: facts)
        return
    with pytest.raises(AllocationError, match="container 2") as err:
        refuse_unservable(entry, "n1", lambda _uuid: facts)
    assert err.value.code == code and "delete the pod" in str(err.value)


def test_summarize_bounds_what_goes_into_a_message() -> None:
    assert summarize(["a", "b"]) == "['a', 'b']"
    text = summarize(["x" * 1000] * 20)
    assert "(1000 chars)" in text and text.endswith("and 12 more") and len(text) < 1200
