"""The simulated kubelet against a grpclib fake device plugin and the embedded API server."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from grpclib import GRPCError

from hamid.kube.client import EVENTS, KubeClient
from hamidsim.kubelet import (
    ASSIGNMENT_ANNOTATION,
    REASON_TOPOLOGY_AFFINITY,
    REASON_UNEXPECTED_ADMISSION,
    SimKubelet,
    devices_on_numa,
    read_assignment,
    sockets_in,
)
from hamidsim.machine import parse_machine_text
from tests import builders
from tests.integration.sim.fakeplugin import FakePlugin, device

R = "example.com/gpu"
NODE = "node-a"
MACHINE = parse_machine_text(
    """
numaNodes:
  - {id: 0, cpus: "0-7"}
  - {id: 1, cpus: "8-15"}
reservedCpus: "0,8"
"""
)
DEVICES = [device(f"a{i}", 0) for i in range(4)] + [device(f"b{i}", 1) for i in range(4)]


@pytest.fixture
def root() -> Iterator[Path]:
    # A short path: unix socket paths are limited to 107 bytes.
    path = Path(tempfile.mkdtemp(prefix="hk", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def plugin(root: Path) -> AsyncIterator[FakePlugin]:
    fake = FakePlugin(root, DEVICES, resource=R)
    try:
        yield fake
    finally:
        await fake.stop()


def make_kubelet(kube: KubeClient, root: Path, policy: str = "single-numa-node", **kw: Any) -> SimKubelet:
    return SimKubelet(
        kube, node_name=NODE, machine=MACHINE, root=root, topology_policy=policy, rpc_timeout=5.0, **kw
    )


async def started(kubelet: SimKubelet, plugin: FakePlugin) -> None:
    await kubelet.start()
    await plugin.start()
    await plugin.register()
    await kubelet.wait_registered(R)


def pod(name: str, cpu: str | None, gpus: int | None, *, init: list[dict] | None = None) -> dict[str, Any]:
    limits: dict[str, Any] = {}
    if cpu is not None:
        limits |= {"cpu": cpu, "memory": "1Gi"}
    if gpus is not None:
        limits[R] = str(gpus)
    containers = [builders.container(limits=limits)]
    return builders.pod(name, node=NODE, containers=containers, init_containers=init or ())


async def node_resource(kube: KubeClient, section: str) -> str | None:
    node = await kube.get_node(NODE)
    return (node.get("status") or {}).get(section, {}).get(R)


async def test_registration_list_and_watch_and_node_status(
    kube: KubeClient, root: Path, plugin: FakePlugin
) -> None:
    kubelet = make_kubelet(kube, root)
    try:
        await started(kubelet, plugin)
        state = kubelet.resources[R]
        assert state.options is not None and state.options.get_preferred_allocation_available
        assert state.all_devices["a0"] == (0,)
        assert devices_on_numa(state, 1) == ["b0", "b1", "b2", "b3"]
        (summary,) = kubelet.describe_resources()
        assert summary["healthy"] == 8 and summary["registrations"] == 1 and summary["connected"]
        await kubelet.sync_node_status()
        assert await node_resource(kube, "capacity") == "8"
        assert await node_resource(kube, "allocatable") == "8"
        node = await kube.get_node(NODE)
        assert node["status"]["allocatable"]["cpu"] == "14"

        # Each ListAndWatch message replaces the whole set.
        plugin.set_devices([device("a0", 0), device("a1", 0, healthy=False), device("b0", 1)])
        await kubelet.wait_until(lambda: len(state.all_devices) == 3, what="device update")
        assert state.healthy == {"a0", "b0"} and state.unhealthy == {"a1"}
        await kubelet.sync_node_status()
        assert await node_resource(kube, "capacity") == "3"
        assert await node_resource(kube, "allocatable") == "2"

        # The stream ending marks every device unhealthy: allocatable 0, capacity kept.
        plugin.end_stream()
        await kubelet.wait_until(lambda: not state.connected, what="disconnect")
        assert state.healthy == set() and state.unhealthy == {"a0", "a1", "b0"}
        await kubelet.sync_node_status()
        assert await node_resource(kube, "capacity") == "3"
        assert await node_resource(kube, "allocatable") == "0"
    finally:
        await kubelet.stop()


async def test_register_validation(kube: KubeClient, root: Path, plugin: FakePlugin) -> None:
    kubelet = make_kubelet(kube, root, dial_timeout=0.3)
    try:
        await kubelet.start()
        await plugin.start()
        with pytest.raises(GRPCError, match='requested API version "v1alpha1" is not supported by kubelet'):
            await plugin.register(version="v1alpha1")
        for bad in ("gpu", "kubernetes.io/gpu", "requests.example.com/gpu", "example.com/a/b"):
            with pytest.raises(GRPCError, match=r"the ResourceName .* is invalid"):
                await plugin.register(resource=bad)
        assert kubelet.resources == {}
        await plugin.stop()
        with pytest.raises(GRPCError, match="failed to dial device plugin"):
            await plugin.register()
        assert kubelet.resources == {}
    finally:
        await kubelet.stop()


async def test_admission_aligns_cpus_and_devices_and_calls_preferred_with_numa_set(
    kube: KubeClient, root: Path, plugin: FakePlugin
) -> None:
    kubelet = make_kubelet(kube, root)
    try:
        await started(kubelet, plugin)
        # 6 exclusive CPUs: both nodes tie, the lower one (NUMA 0) wins; CPUs 1-6 (7 stays free).
        await kube.create_pod(pod("filler", "6", None))
        first = await kubelet.wait_admission("default", "filler")
        assert first.admitted
        assert first.container("main").cpus == frozenset(range(1, 7))
        assert plugin.preferred_requests == []

        # cpu 4 + 1 GPU: NUMA 0 has one CPU left → TM picks NUMA 1, the plugin sees only NUMA 1's GPUs.
        await kube.create_pod(pod("trainer", "4", 1))
        record = await kubelet.wait_admission("default", "trainer")
        assert record.admitted, record.message
        main = record.container("main")
        assert main.numa_node == 1
        assert main.cpus == frozenset({9, 10, 11, 12})
        (call,) = plugin.preferred_requests
        assert sorted(call.available_deviceIDs) == ["b0", "b1", "b2", "b3"]
        assert list(call.must_include_deviceIDs) == []
        assert call.allocation_size == 1
        assert plugin.allocate_requests == [["b3"]]
        assert main.devices == {R: ("b3",)}
        assert main.env == {"FAKE_VISIBLE_DEVICES": "b3"}
        assert main.preferred_calls[0].available == ("b0", "b1", "b2", "b3")

        await kubelet.wait_admission("default", "trainer", published=True)
        live = await kube.get_pod("default", "trainer")
        assert live["status"]["phase"] == "Running"
        assert ASSIGNMENT_ANNOTATION in live["metadata"]["annotations"]
        assert live["status"]["containerStatuses"][0]["state"]["running"]
        from_pod = read_assignment(live)
        assert from_pod is not None
        assert from_pod.container("main").devices == {R: ("b3",)}
        assert from_pod.container("main").allocate[R]["mounts"][0]["containerPath"] == "/fake"
        assert kubelet.allocated_devices(R) == {"b3"}

        # An answer outside the offered set is dropped; kubelet falls back to the aligned devices.
        plugin.answer = lambda req: ["a0"]
        await kube.create_pod(pod("second", "2", 1))
        second = await kubelet.wait_admission("default", "second")
        assert second.admitted
        assert second.container("main").devices == {R: ("b0",)}
        assert sorted(plugin.preferred_requests[-1].available_deviceIDs) == ["b0", "b1", "b2"]

        # Termination releases CPUs and devices.
        await kubelet.terminate_pod("default", "trainer")
        assert kubelet.allocated_devices(R) == {"b0"}
        assert frozenset({9, 10, 11, 12}) <= kubelet.free_cpus()
        assert (await kube.get_pod("default", "trainer"))["status"]["phase"] == "Succeeded"
    finally:
        await kubelet.stop()


async def test_case_b_and_policy_none(kube: KubeClient, root: Path, plugin: FakePlugin) -> None:
    kubelet = make_kubelet(kube, root, policy="none")
    try:
        await started(kubelet, plugin)
        # Policy none: no hint → every free device is offered (case B).
        await kube.create_pod(pod("any", None, 2))
        record = await kubelet.wait_admission("default", "any")
        assert record.admitted
        assert record.container("main").hint is None
        (call,) = plugin.preferred_requests
        assert len(call.available_deviceIDs) == 8 and call.allocation_size == 2
        assert record.container("main").devices == {R: ("b2", "b3")}
    finally:
        await kubelet.stop()


def _events_at(logs: list[dict[str, Any]], level: str) -> list[str]:
    return [str(e.get("event")) for e in logs if e.get("log_level") == level]


async def test_empty_preferred_answer_and_own_shutdown_are_not_warnings(
    kube: KubeClient, root: Path, plugin: FakePlugin, logs: list[dict[str, Any]]
) -> None:
    plugin.answer = lambda _request: []  # "no preference" is legal
    kubelet = make_kubelet(kube, root, policy="none")
    try:
        await started(kubelet, plugin)
        await kube.create_pod(pod("any", None, 2))
        record = await kubelet.wait_admission("default", "any")
        assert record.admitted and len(record.container("main").devices[R]) == 2
        assert record.container("main").preferred_calls[0].answer == ()
    finally:
        await kubelet.stop()
    assert _events_at(logs, "warning") == []
    debug = _events_at(logs, "debug")
    assert "preferred_allocation_no_preference" in debug
    assert "list_and_watch_closed_on_shutdown" in debug


async def test_contract_breaking_answer_and_plugin_going_away_are_warnings(
    kube: KubeClient, root: Path, plugin: FakePlugin, logs: list[dict[str, Any]]
) -> None:
    plugin.answer = lambda request: list(request.available_deviceIDs)[:1]  # short answer
    kubelet = make_kubelet(kube, root, policy="none")
    try:
        await started(kubelet, plugin)
        await kube.create_pod(pod("any", None, 2))
        assert (await kubelet.wait_admission("default", "any")).admitted
        plugin.end_stream()  # the plugin ends ListAndWatch: unexpected for kubelet
        await kubelet.wait_until(lambda: not kubelet.resources[R].connected, what="stream end seen")
    finally:
        await kubelet.stop()
    warnings = _events_at(logs, "warning")
    assert "preferred_allocation_breaks_contract" in warnings
    assert "list_and_watch_ended_unexpectedly" in warnings


async def test_needed_equal_to_aligned_skips_plugin(kube: KubeClient, root: Path, plugin: FakePlugin) -> None:
    kubelet = make_kubelet(kube, root, policy="best-effort")
    try:
        await started(kubelet, plugin)
        await kube.create_pod(pod("four", None, 4))
        record = await kubelet.wait_admission("default", "four")
        assert record.admitted
        assert record.container("main").numa_node == 0
        assert record.container("main").devices == {R: ("a0", "a1", "a2", "a3")}
        assert plugin.preferred_requests == []
    finally:
        await kubelet.stop()


async def test_topology_affinity_error(kube: KubeClient, root: Path, plugin: FakePlugin) -> None:
    kubelet = make_kubelet(kube, root)
    try:
        await started(kubelet, plugin)
        await kube.create_pod(pod("wide", None, 5))
        record = await kubelet.wait_admission("default", "wide")
        assert not record.admitted
        assert record.reason == REASON_TOPOLOGY_AFFINITY
        assert record.message == "Resources cannot be allocated with Topology locality"
        assert plugin.allocate_requests == []

        # GPUs free only on NUMA 1 and CPUs free only on NUMA 0 → cross-NUMA → rejected.
        await kube.create_pod(pod("hog-gpu", None, 4))
        hog_gpu = await kubelet.wait_admission("default", "hog-gpu")
        assert hog_gpu.container("main").device_numa_nodes == {R: (0,)}
        await kube.create_pod(pod("hog-cpu", "7", 1))
        hog = await kubelet.wait_admission("default", "hog-cpu")
        assert hog.container("main").cpu_numa_nodes == (1,)
        assert hog.container("main").device_numa_nodes == {R: (1,)}
        await kube.create_pod(pod("split", "2", 1))
        split = await kubelet.wait_admission("default", "split")
        assert split.reason == REASON_TOPOLOGY_AFFINITY, split

        async def failed() -> dict[str, Any]:
            while True:
                p = await kube.get_pod("default", "split")
                if p["status"].get("phase") == "Failed":
                    return p
                await asyncio.sleep(0.02)

        live = await asyncio.wait_for(failed(), 5)
        assert live["status"]["reason"] == "TopologyAffinityError"
        assert (
            live["status"]["message"]
            == "Pod was rejected: Resources cannot be allocated with Topology locality"
        )

        async def event() -> dict[str, Any]:
            while True:
                items, _ = await kube.list_objects(EVENTS, "default")
                for item in items:
                    if item["involvedObject"]["name"] == "split":
                        return item
                await asyncio.sleep(0.02)

        ev = await asyncio.wait_for(event(), 5)
        assert (ev["type"], ev["reason"], ev["source"]["component"]) == (
            "Warning",
            "TopologyAffinityError",
            "kubelet",
        )
    finally:
        await kubelet.stop()


async def test_allocate_error_is_unexpected_admission_error(
    kube: KubeClient, root: Path, plugin: FakePlugin
) -> None:
    kubelet = make_kubelet(kube, root)
    try:
        await started(kubelet, plugin)
        plugin.allocate_error = "boom"
        await kube.create_pod(pod("broken", "2", 1))
        record = await kubelet.wait_admission("default", "broken")
        assert record.reason == REASON_UNEXPECTED_ADMISSION
        assert (
            record.message
            == "Allocate failed due to rpc error: code = Unknown desc = boom, which is unexpected"
        )
        assert kubelet.allocated_devices(R) == set()
        assert kubelet.free_cpus() == MACHINE.all_cpus - MACHINE.reserved_cpus
    finally:
        await kubelet.stop()


async def test_init_container_devices_are_reused(kube: KubeClient, root: Path, plugin: FakePlugin) -> None:
    kubelet = make_kubelet(kube, root)
    try:
        await started(kubelet, plugin)
        init = [{"name": "setup", "image": "busybox", "resources": {"limits": {R: "1"}}}]
        await kube.create_pod(pod("reuse", None, 2, init=init))
        record = await kubelet.wait_admission("default", "reuse")
        assert record.admitted
        setup, main = record.container("setup"), record.container("main")
        assert set(setup.devices[R]) < set(main.devices[R])
        # The second call offers the aligned devices plus the reused one, which must be included.
        last = plugin.preferred_requests[-1]
        assert list(last.must_include_deviceIDs) == list(setup.devices[R])
        assert last.allocation_size == 2
        assert kubelet.allocated_devices(R) == set(main.devices[R])
    finally:
        await kubelet.stop()


async def test_restart_wipes_sockets_and_plugin_reregisters(
    kube: KubeClient, root: Path, plugin: FakePlugin
) -> None:
    kubelet = make_kubelet(kube, root)
    try:
        await started(kubelet, plugin)
        await kube.create_pod(pod("before", "2", 1))
        before = await kubelet.wait_admission("default", "before")
        assert before.admitted
        (root / "kubelet_internal_checkpoint").write_text("{}")
        old_inode = kubelet.socket_path.stat().st_ino

        await kubelet.restart()
        names = await asyncio.to_thread(lambda: sorted(p.name for p in root.iterdir()))
        assert names == ["kubelet.sock", "kubelet_internal_checkpoint"]
        assert sockets_in(root) == ["kubelet.sock"]
        assert kubelet.socket_path.stat().st_ino != old_inode
        assert kubelet.allocatable(R) == 0
        await kubelet.wait_until(lambda: plugin.streams_cancelled == 1, what="old stream cut")
        await kubelet.sync_node_status()
        assert await node_resource(kube, "capacity") == "0"
        # Allocations survive the restart.
        assert kubelet.allocated_devices(R) == set(before.container("main").devices[R])

        await plugin.stop()
        await plugin.start()
        await plugin.register()
        state = await kubelet.wait_registered(R)
        assert state.registrations == 2
        assert len(state.healthy) == 8
        await kube.create_pod(pod("after", "2", 1))
        after = await kubelet.wait_admission("default", "after")
        assert after.admitted
        assert not set(after.container("main").devices[R]) & set(before.container("main").devices[R])
    finally:
        await kubelet.stop()


async def test_pre_start_container_called_when_required(kube: KubeClient, root: Path) -> None:
    fake = FakePlugin(root, DEVICES, resource=R, preferred=False, pre_start=True)
    kubelet = make_kubelet(kube, root)
    try:
        await started(kubelet, fake)
        await kube.create_pod(pod("pre", None, 2))
        record = await kubelet.wait_admission("default", "pre")
        assert record.admitted
        # No GetPreferredAllocation without the option; kubelet picks from the aligned set itself.
        assert fake.preferred_requests == []
        assert record.container("main").devices == {R: ("a0", "a1")}
        await kubelet.wait_until(lambda: fake.pre_start_requests != [], what="PreStartContainer")
        assert fake.pre_start_requests == [["a0", "a1"]]
    finally:
        await kubelet.stop()
        await fake.stop()


async def test_conditions_kubelet_does_not_own_survive_its_status_writes(
    kube: KubeClient, root: Path, plugin: FakePlugin
) -> None:
    """kubelet's status manager keeps every condition it does not own (``mergePodStatus``: only
    ``kubetypes.PodConditionsByKubelet`` are its to write; readiness gates rely on it): a
    condition written through ``pods/status`` before the pod was bound outlives admission, the
    Running status and the end of the pod."""
    kubelet = make_kubelet(kube, root)
    try:
        await started(kubelet, plugin)
        created = await kube.create_pod(
            builders.pod("gated", containers=pod("x", "1", 1)["spec"]["containers"])
        )
        foreign = {
            "type": "example.com/Gate",
            "status": "True",
            "reason": "Checked",
            "message": "by a controller",
        }
        await kube.patch_pod_status("default", "gated", {"conditions": [foreign]}, strategic=True)
        await kube.bind_pod("default", "gated", created["metadata"]["uid"], NODE)
        await kubelet.wait_admission("default", "gated", published=True)
        live = await kube.get_pod("default", "gated")
        assert live["status"]["phase"] == "Running"
        by_type = {c["type"]: c for c in live["status"]["conditions"]}
        assert {"PodScheduled", "Initialized", "ContainersReady", "Ready", "example.com/Gate"} <= set(by_type)
        assert {k: by_type["example.com/Gate"][k] for k in foreign} == foreign
        assert all("$patch" not in s for s in live["status"]["containerStatuses"])
        await kubelet.terminate_pod("default", "gated")
        ended = await kube.get_pod("default", "gated")
        assert ended["status"]["phase"] == "Succeeded"
        assert "example.com/Gate" in {c["type"] for c in ended["status"]["conditions"]}
        assert "running" not in ended["status"]["containerStatuses"][0]["state"]
    finally:
        await kubelet.stop()
