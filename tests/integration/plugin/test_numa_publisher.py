"""The NUMA publisher over real parts: the simulated kubelet's PodResources server on a unix socket,
a sysfs tree and a kubelet config file on disk, the embedded API server through kubernetes-asyncio."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import shutil
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from grpclib.const import Cardinality, Handler
from grpclib.server import Server, Stream

from hamid._proto.podresources.v1 import api_pb2 as pr
from hamid.kube.client import KubeClient, connect
from hamid.kube.errors import KubeError
from hamid.model.nodeconfig import NodeConfig
from hamid.model.numa import (
    NO_TOPOLOGY,
    ContainerPrediction,
    MemoryBlock,
    PodPrediction,
    decode_placement,
    decode_profile,
    encode_prediction,
)
from hamid.model.resources import ResourceConfig
from hamid.plugin.app import NodeSetup, PluginApp, PluginTimings
from hamid.plugin.numa_publisher import NumaPublisher, NumaSources
from hamid.plugin.options import PluginOptions
from hamid.plugin.podresources_client import PodResourcesClient, PodResourcesUnavailable
from hamid.plugin.pods import NodePods
from hamidsim.apiserver import ApiServer
from hamidsim.kubelet.assignment import ContainerAssignment, PodAdmission
from hamidsim.kubelet.devicemanager import ResourceState
from hamidsim.kubelet.podresources import PodResourcesServer, PodResourcesView
from hamidsim.machine import parse_machine_text
from hamidsim.sysfs import write_sysfs_tree
from tests.integration.plugin.helpers import GPUS, eventually, short_dir

NODE = "n1"
GPU = "nvidia.com/gpu"
PROFILE = "hamid.io/numa-profile"  # wire names spelled out
PLACEMENT = "hamid.io/numa-placement"
PREDICTED = "hamid.io/numa-predicted"
FILTERED_AT = "hami.io/vgpu-time"
MACHINE = "numaNodes: [{id: 0, cpus: '0-3'}, {id: 1, cpus: '4-7'}]\ndistances: [[10, 21], [21, 10]]\n"
CONFIG = (
    "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
    "cpuManagerPolicy: static\ntopologyManagerPolicy: single-numa-node\n"
)
TOPOLOGY = {"GPU-0-0": (0,), "GPU-0-1": (0,), "GPU-1-0": (1,), "NOTOPO-0": None}


@dataclass
class Kubelet:
    """What the fake PodResources view reports (mutable by the test)."""

    records: list[PodAdmission] = field(default_factory=list)
    allocatable: frozenset[int] = frozenset(range(1, 8))
    #: (NUMA node, memory type, bytes) the Static memory manager reports allocatable.
    memory: list[tuple[int, str, int]] = field(default_factory=list)


def record(name: str, cpus: set[int] = frozenset(), devices: tuple[str, ...] = ()) -> PodAdmission:  # type: ignore[assignment]
    container = ContainerAssignment(name="main", index=0, init=False, hint=None, cpus=frozenset(cpus))
    if devices:
        container.devices = {GPU: devices}
    return PodAdmission("default", name, f"uid-{name}", NODE, True, containers=[container])


def prediction(numa: int, generation: int = 1) -> str:
    c = ContainerPrediction("main", frozenset({numa}), frozenset(), {GPU: {numa: 1}})
    return encode_prediction(PodPrediction(generation, (c,)))


def pod(name: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": f"uid-{name}",
            "annotations": annotations or {},
        },
        "spec": {"nodeName": NODE, "containers": [{"name": "main", "image": "x"}]},
    }


@dataclass
class Env:
    server: ApiServer
    kubelet: Kubelet
    publisher: NumaPublisher
    results: list[str]
    causes: list[str]
    directory: Path
    socket: Path
    #: kubelet's device-plugin resources (the PodResources view reads them on every call).
    resources: dict[str, ResourceState]

    def annotations(self, kind: str, name: str) -> dict[str, str]:
        obj = self.server.get(kind, None if kind == "Node" else "default", name) or {}
        return dict((obj.get("metadata") or {}).get("annotations") or {})

    async def synced(self) -> None:
        """Let the publisher's node cache see what is stored now."""
        await asyncio.sleep(0.3)


@pytest.fixture
async def env(apiserver: ApiServer, kube: KubeClient) -> AsyncIterator[Env]:
    directory = Path(tempfile.mkdtemp(prefix="numa-pub-"))
    write_sysfs_tree(parse_machine_text(MACHINE), directory / "sys")
    (directory / "config.yaml").write_text(CONFIG)
    kubelet = Kubelet()
    resources = {GPU: ResourceState(GPU, all_devices=dict(TOPOLOGY), healthy=set(TOPOLOGY))}
    view = PodResourcesView(
        lambda: kubelet.records,
        lambda: resources,
        lambda: kubelet.allocatable,
        lambda r: resources[r].all_devices,
        lambda: kubelet.memory,
    )
    socket = directory / "pod-resources" / "kubelet.sock"
    server = PodResourcesServer(socket, view)
    await server.start()
    apiserver.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    pods = NodePods(kube, NODE)
    task = asyncio.create_task(pods.run())
    await asyncio.wait_for(pods.wait_synced(), 5)
    sources = NumaSources(
        sysfs_root=str(directory / "sys"),
        kubelet_config=str(directory / "config.yaml"),
        pod_resources_socket=str(socket),
        refresh_s=0.0,
    )
    results: list[str] = []
    causes: list[str] = []

    def judged(result: str, cause: str) -> None:
        results.append(result)
        if cause:
            causes.append(cause)

    publisher = NumaPublisher(kube, pods, sources, resource_name=GPU, on_prediction=judged)
    try:
        yield Env(apiserver, kubelet, publisher, results, causes, directory, socket, resources)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await server.stop(1.0)
        shutil.rmtree(directory, ignore_errors=True)


async def test_the_profile_names_other_device_resources_with_numa_affinity(env: Env) -> None:
    """kubelet weighs every device-plugin resource's hints; the profile names those besides the
    GPU whose devices sit on a NUMA node, so the scheduler's predictor can say it does not know."""
    nics: dict[str, tuple[int, ...] | None] = {"NIC-1": (1,)}
    env.resources["example.com/nic"] = ResourceState("example.com/nic", all_devices=nics, healthy=set(nics))
    flat: dict[str, tuple[int, ...] | None] = {"KEY-0": None}
    env.resources["example.com/key"] = ResourceState("example.com/key", all_devices=flat, healthy=set(flat))
    await env.publisher.publish_once()
    profile = decode_profile(env.annotations("Node", NODE)[PROFILE])
    assert profile.other_devices == ("example.com/nic",)  # not the GPU, not a device without NUMA


async def test_client_decodes_list_and_allocatable(env: Env) -> None:
    env.kubelet.records = [record("gpu", {1, 2}, ("GPU-0-0", "NOTOPO-0"))]
    client = PodResourcesClient(str(env.socket))
    allocatable = await client.allocatable()
    assert allocatable.cpus == frozenset(range(1, 8))
    assert allocatable.devices[GPU] == {
        NO_TOPOLOGY: ("NOTOPO-0",),
        0: ("GPU-0-0", "GPU-0-1"),
        1: ("GPU-1-0",),
    }
    (held,) = await client.list_pods()
    assert held.key == "default/gpu"
    assert held.containers[0].cpus == {1, 2}
    assert held.containers[0].devices == {GPU: {NO_TOPOLOGY: ("NOTOPO-0",), 0: ("GPU-0-0",)}}
    with pytest.raises(PodResourcesUnavailable, match=r"missing\.sock"):
        await PodResourcesClient(str(env.directory / "missing.sock"), timeout=1).list_pods()


async def test_profile_and_placements_are_published_and_judged(env: Env) -> None:
    for p in (
        pod("gpu", {PREDICTED: prediction(0)}),
        pod("miss", {PREDICTED: prediction(0)}),
        pod("nopred"),
        pod("cpu"),
        pod("shared"),
    ):
        env.server.put(p)
    env.kubelet.records = [
        record("gpu", {1, 2}, ("GPU-0-0", "NOTOPO-0")),
        record("miss", {4, 5}, ("GPU-1-0",)),
        record("nopred", set(), ("GPU-0-1",)),
        record("cpu", {6, 7}),
        record("shared"),
    ]
    await env.synced()
    await env.publisher.publish_once()

    profile = decode_profile(env.annotations("Node", NODE)[PROFILE])
    assert (profile.generation, profile.reserved_cpus) == (1, frozenset({0}))
    assert profile.distances == ((10, 21), (21, 10))
    assert profile.policies.topology_manager_policy == "single-numa-node"
    gpu = decode_placement(env.annotations("Pod", "gpu")[PLACEMENT])
    assert gpu.generation == 1
    # NOTOPO-0 is booked in bucket -1, as a prediction books it, and names no NUMA node
    assert gpu.containers[0].numa == {0} and gpu.containers[0].cpus == {1, 2}
    assert gpu.containers[0].devices == {GPU: {NO_TOPOLOGY: ("NOTOPO-0",), 0: ("GPU-0-0",)}}
    assert json.loads(env.annotations("Pod", "gpu")[PLACEMENT])["v"] == 3
    assert decode_placement(env.annotations("Pod", "cpu")[PLACEMENT]).containers[0].numa == {1}
    assert PLACEMENT not in env.annotations("Pod", "shared")
    assert sorted(env.results) == ["hit", "miss", "unknown"]  # the foreign CPU pod is not judged
    assert env.causes == ["unmodelled"]  # without the filter's time nothing is known to be later

    patches = (env.publisher.profile_patches, env.publisher.placement_patches)
    await env.synced()
    await env.publisher.publish_once()  # nothing changed: nothing written, nothing judged twice
    assert (env.publisher.profile_patches, env.publisher.placement_patches) == patches
    assert len(env.results) == 3


async def test_misses_are_classified_by_what_was_admitted_since_the_prediction(env: Env) -> None:
    """stale: another profile generation; foreign / order: a pod without / with a prediction first
    listed at or after the filter's time; unmodelled: nothing listed since."""
    t0 = time.time()
    rounds = [
        [record("cpu-early", {6, 7})],  # foreign, listed long before every prediction below
        [record("stale", {4}, ("GPU-1-0",)), record("lonely", {5}, ("GPU-1-0",))],
        [record("cpu-late", {3}), record("after-foreign", {2}, ("GPU-1-0",))],
        [record("hit", {1}, ("GPU-0-0",)), record("after-own", {4}, ("GPU-1-0",))],
    ]
    annotations = {
        "cpu-early": {},
        "stale": {PREDICTED: prediction(0, generation=2), FILTERED_AT: str(int(t0))},
        "lonely": {PREDICTED: prediction(0), FILTERED_AT: str(int(t0) + 15)},
        "cpu-late": {},
        "after-foreign": {PREDICTED: prediction(0), FILTERED_AT: str(int(t0) + 15)},
        "hit": {PREDICTED: prediction(0), FILTERED_AT: str(int(t0) + 25)},
        "after-own": {PREDICTED: prediction(0), FILTERED_AT: str(int(t0) + 25)},
    }
    for name, notes in annotations.items():
        env.server.put(pod(name, notes))
    await env.synced()
    for i, listed in enumerate(rounds):
        env.kubelet.records = [*env.kubelet.records, *listed]
        env.publisher.clock = functools.partial(float, t0 + 10 * i)  # round i lists its pods at t0 + 10 i
        await env.publisher.publish_once()
    assert sorted(env.results) == ["hit", "miss", "miss", "miss", "miss"]
    assert sorted(env.causes) == ["foreign", "order", "stale", "unmodelled"]


async def test_a_changed_profile_bumps_the_generation_and_rewrites_placements(env: Env) -> None:
    env.server.put(pod("cpu"))
    env.kubelet.records = [record("cpu", {6, 7})]
    await env.synced()
    await env.publisher.publish_once()
    env.kubelet.allocatable = frozenset(range(2, 8))  # kubelet restarted with more reserved CPUs
    await env.synced()
    await env.publisher.publish_once()
    profile = decode_profile(env.annotations("Node", NODE)[PROFILE])
    assert (profile.generation, profile.reserved_cpus) == (2, frozenset({0, 1}))
    assert decode_placement(env.annotations("Pod", "cpu")[PLACEMENT]).generation == 2


async def test_a_profile_of_a_newer_hamid_is_replaced_and_its_generation_continued(
    env: Env, logs: list[dict[str, Any]]
) -> None:
    """After a rollback the node carries a profile in a format this agent cannot read: it is
    replaced, said to be newer (not malformed), and the generation goes on from it, not back to 1."""
    newer = json.dumps({"v": 99, "gen": 41, "at": 1, "fromTheFuture": {"numa": 4}})
    env.server.put(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "annotations": {PROFILE: newer}}}
    )
    await env.synced()
    await env.publisher.publish_once()
    assert decode_profile(env.annotations("Node", NODE)[PROFILE]).generation == 42
    (warning,) = [e for e in logs if e["event"] == "numa_profile_undecodable_replacing"]
    assert "format version 99 is newer than this hamid reads" in warning["error"]


async def test_a_generation_at_the_top_of_its_range_starts_again_at_one(env: Env) -> None:
    """A profile on the node whose generation cannot grow (written by hand, or a newer format's
    claim) is replaced from generation 1: encoding the next one failed every round and ended the
    plugin."""
    top = json.dumps({"v": 99, "gen": 2**63 - 1, "at": 1})
    env.server.put(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "annotations": {PROFILE: top}}}
    )
    await env.synced()
    await env.publisher.publish_once()
    assert decode_profile(env.annotations("Node", NODE)[PROFILE]).generation == 1


async def test_an_unchanged_profile_is_restamped_with_the_same_generation(env: Env) -> None:
    now = [1_000_000.0]
    env.publisher.clock = lambda: now[0]
    await env.publisher.publish_once()
    first = decode_profile(env.annotations("Node", NODE)[PROFILE])
    now[0] += env.publisher.sources.restamp_s - 1
    await env.synced()
    await env.publisher.publish_once()
    assert env.publisher.profile_patches == 1
    now[0] += 2
    await env.synced()
    await env.publisher.publish_once()
    second = decode_profile(env.annotations("Node", NODE)[PROFILE])
    assert (second.generation, second.observed_at) == (
        first.generation,
        first.observed_at + env.publisher.sources.restamp_s + 1,
    )


async def test_pod_patches_are_rate_bounded(env: Env) -> None:
    names = [f"p{i}" for i in range(4)]
    for name in names:
        env.server.put(pod(name))
    env.kubelet.records = [record(name, {i + 1}) for i, name in enumerate(names)]
    env.publisher.bucket.rate, env.publisher.bucket.tokens = 0.0, 2.0
    await env.synced()
    await env.publisher.publish_once()
    assert sum(PLACEMENT in env.annotations("Pod", n) for n in names) == 2
    env.publisher.bucket.tokens = 10.0
    await env.publisher.publish_once()  # the rest on a later round
    assert all(PLACEMENT in env.annotations("Pod", n) for n in names)


async def test_missing_sources_publish_nothing_and_log_once(env: Env, logs: list[dict[str, Any]]) -> None:
    (env.directory / "config.yaml").unlink()
    for _ in range(3):
        await env.publisher.publish_once()
    assert PROFILE not in env.annotations("Node", NODE)
    warnings = [e for e in logs if e["log_level"] == "warning"]
    assert len(warnings) == 1 and warnings[0]["event"] == "numa_source_unavailable"
    assert warnings[0]["source"] == "kubelet config"
    assert "config.yaml" in warnings[0]["error"]

    (env.directory / "config.yaml").write_text(CONFIG)
    env.socket.rename(env.directory / "moved.sock")
    for _ in range(2):
        await env.publisher.publish_once()
    assert PROFILE not in env.annotations("Node", NODE)
    events = [(e["event"], e.get("source"), e.get("consequence")) for e in logs]
    assert events.count(("numa_source_available_again", "kubelet config", None)) == 1
    assert (
        events.count(
            (
                "numa_source_unavailable",
                "kubelet PodResources API",
                "NUMA profile and placements not published",
            )
        )
        == 1
    )


async def test_bad_kubelet_config_is_reported_not_raised(env: Env, logs: list[dict[str, Any]]) -> None:
    (env.directory / "config.yaml").write_bytes(b"\x00\xff not yaml")
    await env.publisher.publish_once()
    assert PROFILE not in env.annotations("Node", NODE)
    assert any("not UTF-8" in str(e.get("error")) for e in logs)


class _FailingFor:
    """An injected fault: the API server refuses placement writes of one pod."""

    def __init__(self, inner: KubeClient, pod: str) -> None:
        self.inner, self.pod = inner, pod

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def patch_pod_metadata(self, namespace: str, name: str, **kw: Any) -> Any:
        if name == self.pod:
            raise KubeError("metadata.annotations: Too long", status=422, reason="Invalid")
        return await self.inner.patch_pod_metadata(namespace, name, **kw)


async def test_a_refused_pod_does_not_block_the_others(env: Env, logs: list[dict[str, Any]]) -> None:
    for name in ("p0", "p1"):
        env.server.put(pod(name))
    env.kubelet.records = [record("p0", {1}), record("p1", {2})]
    env.publisher.client = _FailingFor(env.publisher.client, "p0")  # type: ignore[assignment]
    await env.synced()
    for _ in range(2):
        await env.publisher.publish_once()
    assert PLACEMENT not in env.annotations("Pod", "p0")
    assert PLACEMENT in env.annotations("Pod", "p1")
    assert PROFILE in env.annotations("Node", NODE)
    refused = [e for e in logs if e["event"] == "numa_placement_write_failed_retrying"]
    assert len(refused) == 1 and refused[0]["pod"] == "default/p0"


async def test_memory_of_the_static_memory_manager_is_published(env: Env) -> None:
    """Under ``memoryManagerPolicy: Static`` the profile carries PodResources' allocatable memory per
    NUMA node (format 4) and a placement each container's memory blocks (format 2); the memory's
    NUMA nodes count as the container's."""
    (env.directory / "config.yaml").write_text(CONFIG + "memoryManagerPolicy: Static\n")
    gi = 1 << 30
    env.kubelet.memory = [(0, "memory", 30 * gi), (1, "hugepages-1Gi", 4 * gi), (1, "memory", 27 * gi)]
    shared = record("shared")
    shared.containers[0].memory = {"memory": ((0, 1), 40 * gi)}
    env.kubelet.records = [shared]
    env.server.put(pod("shared"))
    await env.synced()
    await env.publisher.publish_once()
    raw = env.annotations("Node", NODE)[PROFILE]
    assert json.loads(raw)["v"] == 4
    profile = decode_profile(raw)
    assert profile.memory_allocatable() == {
        0: {"memory": 30 * gi},
        1: {"hugepages-1Gi": 4 * gi, "memory": 27 * gi},
    }
    placement = decode_placement(env.annotations("Pod", "shared")[PLACEMENT])
    (main,) = placement.containers
    assert main.memory == (MemoryBlock(frozenset({0, 1}), "memory", 40 * gi),)
    assert main.numa == {0, 1} and main.cpus == frozenset()


async def test_each_profile_set_is_told_also_one_taken_over_from_the_node(env: Env) -> None:
    """``on_profile`` (the replica rule in effect and the ``steer`` handshake depend on the profile's
    Topology Manager policy) fires when a profile is published and when an unchanged one on the
    Node is taken over after a restart, which writes nothing and so brings no Node event."""
    told: list[int] = []
    env.publisher.on_profile = lambda: told.append(
        env.publisher.profile.generation if env.publisher.profile else 0
    )
    now = [1_000_000.0]
    env.publisher.clock = lambda: now[0]
    await env.publisher.publish_once()
    assert told == [1] and env.publisher.profile_patches == 1
    env.publisher.profile = None  # a restarted plugin: the profile is only on the Node
    await env.synced()
    await env.publisher.publish_once()
    assert env.publisher.profile_patches == 1 and told == [1, 1]


class _Bytes:
    """A reply that serialises to bytes the test chooses (the injected fault: no valid protobuf)."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def SerializeToString(self) -> bytes:
        return self.data


class _CorruptLister:
    """A PodResources server that answers every call with ``data`` (a kubelet, shim or proxy on
    the socket that answers badly)."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    async def _reply(self, stream: Stream[Any, _Bytes]) -> None:
        await stream.recv_message()
        await stream.send_message(_Bytes(self.data))

    def __mapping__(self) -> dict[str, Handler]:
        return {
            "/v1.PodResourcesLister/List": Handler(
                self._reply, Cardinality.UNARY_UNARY, pr.ListPodResourcesRequest, _Bytes
            ),
            "/v1.PodResourcesLister/GetAllocatableResources": Handler(
                self._reply, Cardinality.UNARY_UNARY, pr.AllocatableResourcesRequest, _Bytes
            ),
        }


@contextlib.asynccontextmanager
async def corrupt_podresources(socket: Path, data: bytes = b"\x0a\x05ab") -> AsyncIterator[None]:
    """Serve ``data`` as every PodResources answer on ``socket`` (default: a truncated field)."""
    server = Server([_CorruptLister(data)])
    await server.start(path=str(socket))
    try:
        yield
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("data", [b"\x0a\x05ab", b"\xff\xff\xff"], ids=["truncated", "bad-tag"])
async def test_an_answer_that_does_not_decode_is_podresources_unavailable(env: Env, data: bytes) -> None:
    """grpclib decodes the reply inside the call: a protobuf DecodeError was let through, and
    through the publisher it ended the device plugin's TaskGroup."""
    socket = env.directory / "corrupt.sock"
    async with corrupt_podresources(socket, data):
        client = PodResourcesClient(str(socket), timeout=2)
        with pytest.raises(PodResourcesUnavailable, match=r"List on .*corrupt\.sock: DecodeError"):
            await client.list_pods()
        with pytest.raises(PodResourcesUnavailable, match="GetAllocatableResources"):
            await client.allocatable()


class _FailingProfileWrite:
    """An injected fault the publisher does not foresee: the Node write raises ``RuntimeError``
    while ``failing`` is set."""

    def __init__(self, inner: KubeClient) -> None:
        self.inner, self.failing = inner, True

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def patch_node_metadata(self, name: str, **kw: Any) -> Any:
        if self.failing:
            raise RuntimeError("injected")
        return await self.inner.patch_node_metadata(name, **kw)


async def test_an_unforeseen_fault_costs_its_rounds_only_and_is_logged_once(
    env: Env, logs: list[dict[str, Any]]
) -> None:
    """``run`` shares the device plugin's TaskGroup: whatever a round raises, it logs the reason
    once, retries at its interval, and says when it recovered."""
    faulty = _FailingProfileWrite(env.publisher.client)
    env.publisher.client = faulty  # type: ignore[assignment]
    env.publisher.sources = dataclasses.replace(env.publisher.sources, interval=0.02)
    task = asyncio.create_task(env.publisher.run())
    try:
        await asyncio.sleep(0.3)
        assert not task.done()
        failed = [e for e in logs if e["event"] == "numa_source_unavailable"]
        assert len(failed) == 1 and failed[0]["source"] == "NUMA publisher"
        assert failed[0]["error"] == "RuntimeError: injected"
        faulty.failing = False
        await eventually(lambda: PROFILE in env.annotations("Node", NODE))
        assert any(e["event"] == "numa_source_available_again" for e in logs)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_corrupt_podresources_answer_never_ends_the_device_plugin(logs: list[dict[str, Any]]) -> None:
    """The real PluginApp with its publisher on, kubelet's PodResources answering garbage on every
    poll: the plugin keeps running (it serves ``Allocate`` for every GPU pod of the node)."""
    with short_dir() as directory:
        write_sysfs_tree(parse_machine_text(MACHINE), directory / "sys")
        (directory / "config.yaml").write_text(CONFIG)
        socket = directory / "pr.sock"
        async with corrupt_podresources(socket), ApiServer() as server:
            server.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
            client = await connect(api_server=server.url, request_timeout=5.0)
            setup = NodeSetup(
                NodeConfig(device_split_count=4, enable_numa_topology=True),
                ResourceConfig(),
                GPU,
                GPUS,
                None,
                None,
            )
            options = PluginOptions(
                node_name=NODE,
                device_plugin_dir=str(directory),
                hook_path=str(directory / "hook"),
                metrics_listen="",
                api_server=server.url,
                kubelet_config=str(directory / "config.yaml"),
                sysfs_root=str(directory / "sys"),
                pod_resources_socket=str(socket),
            )
            app = PluginApp(options, kube=client, setup=setup, timings=PluginTimings(numa_interval=0.05))
            try:
                await app.start()
                with pytest.raises(TimeoutError):  # ten polls answered with garbage: still serving
                    await asyncio.wait_for(app.wait(), 0.5)
                assert app.plugin.connector.socket_path.exists()
                reported = [e for e in logs if e["event"] == "numa_source_unavailable"]
                assert [e["source"] for e in reported] == ["kubelet PodResources API"]
                assert "DecodeError" in reported[0]["error"]
            finally:
                await app.stop()
                await client.close()
