"""The simulated kubelet's PodResources API, pod scope, SMT machines, admission order, lifetime of a
terminating pod, allocatable admission, status-write retry and re-admission after a restart —
against a grpclib fake device plugin and the embedded API server."""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from grpclib import GRPCError
from grpclib.client import Channel

from hamid._proto.podresources.v1 import api_pb2 as pr
from hamid._proto.podresources.v1.api_grpc import PodResourcesListerStub
from hamid.kube.client import KubeClient, connect
from hamidsim.apiserver import ApiServer
from hamidsim.kubelet import ASSIGNMENT_ANNOTATION, SimKubelet, read_assignment
from hamidsim.kubelet.config import KubeletConfig
from hamidsim.machine import load_machine_file, parse_machine_text, sample_machine_path
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
memory: 16Gi
pods: 10
"""
)
SMT = load_machine_file(sample_machine_path("smt-2socket-8gpu"))
DEVICES = (
    [device(f"a{i}", 0) for i in range(4)] + [device(f"b{i}", 1) for i in range(4)] + [device("x0", None)]
)


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="hl", dir="/tmp"))
    (path / "device-plugins").mkdir()
    try:
        yield path / "device-plugins"
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def plugin(root: Path) -> AsyncIterator[FakePlugin]:
    fake = FakePlugin(root, DEVICES, resource=R)
    try:
        yield fake
    finally:
        await fake.stop()


async def started(kube: KubeClient, root: Path, plugin: FakePlugin, **kw: Any) -> SimKubelet:
    kw.setdefault("machine", MACHINE)
    kubelet = SimKubelet(kube, node_name=NODE, root=root, rpc_timeout=5.0, **kw)
    await kubelet.start()
    await plugin.start()
    await plugin.register()
    await kubelet.wait_registered(R)
    return kubelet


def container(
    name: str, cpu: str | None, gpus: int | None, memory: str = "1Gi", **extra: Any
) -> dict[str, Any]:
    limits: dict[str, Any] = {}
    if cpu is not None:
        limits |= {"cpu": cpu, "memory": memory}
    if gpus is not None:
        limits[R] = str(gpus)
    return builders.container(name, limits=limits, **extra)


def pod(name: str, *containers: dict[str, Any], grace: int | None = None) -> dict[str, Any]:
    spec = {} if grace is None else {"terminationGracePeriodSeconds": grace}
    return builders.pod(name, node=NODE, containers=containers, spec=spec)


async def lister(kubelet: SimKubelet) -> tuple[Channel, PodResourcesListerStub]:
    channel = Channel(path=str(kubelet.pod_resources.socket))
    return channel, PodResourcesListerStub(channel)


async def test_pod_resources_matches_the_annotation(
    kube: KubeClient, apiserver: Any, root: Path, plugin: FakePlugin
) -> None:
    kubelet = await started(kube, root, plugin)
    channel, stub = await lister(kubelet)
    try:
        assert kubelet.pod_resources.socket == root.parent / "pod-resources" / "kubelet.sock"
        apiserver.faults.fail_next(1, "patch", r"/pods/train$", 500)  # the first annotation write fails
        await kube.create_pod(pod("train", container("main", "4", 2), container("side", "500m", None)))
        record = await kubelet.wait_admission("default", "train")
        assert record.admitted, record.message
        # Until the annotation holds the record, PodResources does not report the pod (a List that
        # returned while the record was still unannotated answered before it was).
        while True:
            listed_early = (await stub.List(pr.ListPodResourcesRequest())).pod_resources
            if record.annotated:
                break
            assert listed_early == []
            await asyncio.sleep(0.01)
        await kubelet.wait_admission("default", "train", published=True)
        listed = await stub.List(pr.ListPodResourcesRequest())
        (resources,) = listed.pod_resources
        stored = read_assignment(await kube.get_pod("default", "train"))
        assert stored is not None
        for got in resources.containers:
            want = stored.container(got.name)
            assert sorted(got.cpu_ids) == sorted(want.cpus)
            assert sorted(i for d in got.devices for i in d.device_ids) == sorted(want.devices.get(R, ()))
            for d in got.devices:
                assert [n.ID for n in d.topology.nodes] == list(want.device_numa_nodes[R])
        main = next(c for c in resources.containers if c.name == "main")
        assert (
            len(main.cpu_ids) == 4 and not next(c for c in resources.containers if c.name == "side").cpu_ids
        )
        one = await stub.Get(pr.GetPodResourcesRequest(pod_name="train", pod_namespace="default"))
        assert one.pod_resources == resources
        with pytest.raises(GRPCError, match="pod nope in namespace default not found"):
            await stub.Get(pr.GetPodResourcesRequest(pod_name="nope", pod_namespace="default"))
        allocatable = await stub.GetAllocatableResources(pr.AllocatableResourcesRequest())
        assert sorted(allocatable.cpu_ids) == sorted(set(range(16)) - {0, 8})
        by_device = {d.device_ids[0]: [n.ID for n in d.topology.nodes] for d in allocatable.devices}
        assert by_device["a0"] == [0] and by_device["b3"] == [1] and by_device["x0"] == []
        # Terminated: gone from List at once, like the annotation says released.
        await kubelet.terminate_pod("default", "train")
        assert (await stub.List(pr.ListPodResourcesRequest())).pod_resources == []
    finally:
        channel.close()
        await kubelet.stop()


async def test_pod_scope_puts_the_whole_pod_on_one_numa_node(
    kube: KubeClient, root: Path, plugin: FakePlugin
) -> None:
    config = KubeletConfig(
        cpu_manager_policy="static", topology_manager_policy="single-numa-node", topology_manager_scope="pod"
    )
    kubelet = await started(kube, root, plugin, config=config)
    try:
        # 2 x (3 CPUs + 1 GPU): one pod-level hint; both containers land on NUMA 0.
        await kube.create_pod(pod("duo", container("a", "3", 1), container("b", "3", 1)))
        record = await kubelet.wait_admission("default", "duo")
        assert record.admitted and record.topology_scope == "pod"
        assert {c.numa_node for c in record.containers} == {0}
        assert all(c.cpus <= frozenset(range(1, 8)) for c in record.containers)
        # 2 x 4 CPUs: 8 > 7 free per node → the pod as a whole cannot fit one node (container scope could).
        await kube.create_pod(pod("wide", container("a", "4", None), container("b", "4", None)))
        wide = await kubelet.wait_admission("default", "wide")
        assert (wide.admitted, wide.reason) == (False, "TopologyAffinityError")
    finally:
        await kubelet.stop()


async def test_smt_machine_full_pcpus_only(kube: KubeClient, root: Path, plugin: FakePlugin) -> None:
    config = KubeletConfig(
        cpu_manager_policy="static",
        cpu_manager_policy_options={"full-pcpus-only": "true"},
        topology_manager_policy="single-numa-node",
        reserved_system_cpus=frozenset({0, 64}),
    )
    kubelet = await started(kube, root, plugin, machine=SMT, config=config)
    try:
        await kube.create_pod(pod("odd", container("main", "3", None)))
        odd = await kubelet.wait_admission("default", "odd", published=True)
        assert (odd.admitted, odd.reason) == (False, "SMTAlignmentError")
        assert "requested 3 cpus not multiple cpus per core = 2" in odd.message
        failed = await kube.get_pod("default", "odd")
        assert failed["status"]["reason"] == "SMTAlignmentError"
        await kube.create_pod(pod("even", container("main", "4", 1)))
        even = await kubelet.wait_admission("default", "even")
        assert even.admitted, even.message
        cpus = even.container("main").cpus
        # Two whole cores (thread siblings N and N+64) on the GPU's NUMA node.
        assert all((c + 64) % 128 in cpus for c in cpus)
        assert even.container("main").cpu_numa_nodes == (0,)
    finally:
        await kubelet.stop()


async def test_batch_admitted_by_creation_time(kube: KubeClient, root: Path, plugin: FakePlugin) -> None:
    kubelet = await started(kube, root, plugin)
    try:
        # Created in one order, bound (seen by the kubelet) in the other, admitted as one batch.
        uids = {}
        for name in ("older", "newer"):
            body = pod(name, container("main", "7", None))
            del body["spec"]["nodeName"]
            uids[name] = (await kube.create_pod(body))["metadata"]["uid"]
            await asyncio.sleep(1.05)  # creationTimestamp has one-second resolution
        async with kubelet._admit_lock:
            for name in ("newer", "older"):
                await kube.bind_pod("default", name, uids[name], NODE)
            await asyncio.sleep(0.5)
        older = await kubelet.wait_admission("default", "older")
        newer = await kubelet.wait_admission("default", "newer")
        # Both want 7 CPUs of one node: the older pod goes first and gets NUMA 0 (lower node on a tie).
        assert older.container("main").cpus == frozenset(range(1, 8))
        assert newer.container("main").cpus == frozenset(range(9, 16))
    finally:
        await kubelet.stop()


@pytest.fixture
async def graceful_kube() -> AsyncIterator[KubeClient]:
    """An API server that deletes bound pods gracefully (the kubelet confirms), and a client."""
    async with ApiServer("127.0.0.1", 0, graceful_pod_deletion=True) as server:
        client = await connect(api_server=server.url, request_timeout=5.0)
        try:
            yield client
        finally:
            await client.close()


async def test_terminating_pod_keeps_resources_until_containers_stop(
    graceful_kube: KubeClient, root: Path, plugin: FakePlugin
) -> None:
    kube = graceful_kube
    kubelet = await started(kube, root, plugin, container_stop_seconds=1.0)
    try:
        await kube.create_pod(pod("old", container("main", "7", 4)))
        old = await kubelet.wait_admission("default", "old", published=True)
        assert old.container("main").numa_node == 0
        await kube.delete_pod("default", "old")
        await kubelet.wait_until(lambda: old.uid in kubelet._deleting, what="termination started")
        # Still holding NUMA 0's CPUs and GPUs while its containers stop: the next pod goes to NUMA 1.
        await kube.create_pod(pod("new", container("main", "7", 4)))
        new = await kubelet.wait_admission("default", "new")
        assert new.admitted and new.container("main").numa_node == 1
        assert not old.released
        await kubelet.wait_until(lambda: old.released, timeout=5.0, what="release after stop")
        assert kubelet.allocated_devices(R) == set(new.container("main").devices[R])
        # The kubelet confirmed the deletion once the containers had stopped.
        for _ in range(50):
            if "old" not in {p["metadata"]["name"] for p in (await kube.list_pods("default"))[0]}:
                break
            await asyncio.sleep(0.1)
        assert "old" not in {p["metadata"]["name"] for p in (await kube.list_pods("default"))[0]}
    finally:
        await kubelet.stop()


async def test_a_pod_deleted_during_its_admission_gives_its_cpus_back(
    kube: KubeClient, root: Path, plugin: FakePlugin
) -> None:
    """kubelet's removeStaleState: CPUs allocated after the pod was already gone are not leaked."""
    kubelet = await started(kube, root, plugin)
    try:
        plugin.allocate_gate = asyncio.Event()
        await kube.create_pod(pod("gone", container("main", "7", 1)))
        await asyncio.wait_for(plugin.allocating.wait(), 5)
        await kube.delete_pod("default", "gone")  # immediate: its Allocate is still in flight
        for _ in range(500):  # until the kubelet saw the deletion
            if "default/gone" not in kubelet._pods:
                break
            await asyncio.sleep(0.01)
        plugin.allocate_gate.set()
        plugin.allocate_gate = None
        gone = await kubelet.wait_admission("default", "gone")
        assert gone.container("main").cpus == frozenset(range(1, 8))  # allocated after the deletion
        await kube.create_pod(pod("next", container("main", "7", 1)))
        new = await kubelet.wait_admission("default", "next")
        assert new.admitted and new.container("main").cpus == frozenset(range(1, 8))
        assert kubelet.free_cpus() == frozenset(range(9, 16))
        assert kubelet.allocated_devices(R) == set(new.container("main").devices[R])
    finally:
        await kubelet.stop()


async def test_allocatable_admission(kube: KubeClient, root: Path, plugin: FakePlugin) -> None:
    kubelet = await started(kube, root, plugin)
    try:
        # 14 allocatable CPUs (16 - 2 reserved) = 14000m; Burstable pods count their requests.
        burst = container("main", None, None)
        burst["resources"] = {"requests": {"cpu": "10", "memory": "1Gi"}}
        await kube.create_pod(pod("big", burst))
        assert (await kubelet.wait_admission("default", "big")).admitted
        await kube.create_pod(pod("more", dict(burst, resources={"requests": {"cpu": "5"}})))
        more = await kubelet.wait_admission("default", "more")
        assert (more.reason, more.message) == (
            "OutOfcpu",
            "Node didn't have enough resource: cpu, requested: 5000, used: 10000, capacity: 14000",
        )
        await kube.create_pod(pod("mem", dict(burst, resources={"requests": {"memory": "15.5Gi"}})))
        mem = await kubelet.wait_admission("default", "mem")
        assert (
            mem.reason == "OutOfmemory"
            and "requested: 16642998272, used: 1073741824, capacity: 17179869184" in mem.message
        )
        # A rejected pod holds nothing.
        assert kubelet.free_cpus() == frozenset(range(1, 8)) | frozenset(range(9, 16))
    finally:
        await kubelet.stop()


async def test_failed_status_write_is_retried(
    kube: KubeClient, apiserver: Any, root: Path, plugin: FakePlugin
) -> None:
    kubelet = await started(kube, root, plugin, status_retry_interval=0.2)
    try:
        apiserver.faults.fail_next(2, "patch", r"/pods/flaky/status$", 500)
        await kube.create_pod(pod("flaky", container("main", "2", None)))
        await kubelet.wait_admission("default", "flaky", published=True)
        for _ in range(50):
            current = await kube.get_pod("default", "flaky")
            if (current.get("status") or {}).get("phase") == "Running":
                break
            await asyncio.sleep(0.1)
        assert current["status"]["phase"] == "Running"
        assert kubelet.status.retries >= 2 and kubelet.status.pending == 0
    finally:
        await kubelet.stop()


async def test_new_process_readmits_running_pods(kube: KubeClient, root: Path, plugin: FakePlugin) -> None:
    first = await started(kube, root, plugin)
    await kube.create_pod(pod("keep", container("main", "4", 1)))
    await kube.create_pod(pod("bent", container("main", "2", None)))
    kept = await first.wait_admission("default", "keep", published=True)
    bent = await first.wait_admission("default", "bent", published=True)
    await first.stop()
    # The checkpoint of "bent" now records fewer CPUs than it requests: kubelet's CPU hints for it
    # are empty, so re-admission under single-numa-node rejects it and frees what it held.
    document = json.loads(
        (await kube.get_pod("default", "bent"))["metadata"]["annotations"][ASSIGNMENT_ANNOTATION]
    )
    document["containers"][0]["cpus"] = str(min(bent.container("main").cpus))
    await kube.patch_pod_metadata(
        "default", "bent", annotations={ASSIGNMENT_ANNOTATION: json.dumps(document)}
    )
    second = SimKubelet(kube, node_name=NODE, machine=MACHINE, root=root, rpc_timeout=5.0)
    await second.start()
    try:

        def restored() -> bool:
            return all(second.admission("default", n) is not None for n in ("keep", "bent"))

        await second.wait_until(restored, what="restore")
        again = second.admission("default", "keep")
        assert again is not None and again.admitted
        assert second.cpus.assignments[kept.uid]["main"] == kept.container("main").cpus
        assert second.allocated_devices(R) == set(kept.container("main").devices[R])
        rejected = second.admission("default", "bent")
        assert rejected is not None and (rejected.admitted, rejected.reason) == (
            False,
            "TopologyAffinityError",
        )
        assert bent.uid not in second.cpus.assignments
        for _ in range(50):
            if (await kube.get_pod("default", "bent"))["status"].get("phase") == "Failed":
                break
            await asyncio.sleep(0.1)
        assert (await kube.get_pod("default", "bent"))["status"]["reason"] == "TopologyAffinityError"
    finally:
        await second.stop()


async def test_in_process_restart_readmits_from_the_checkpoint(
    kube: KubeClient, root: Path, plugin: FakePlugin
) -> None:
    kubelet = await started(kube, root, plugin)
    try:
        await kube.create_pod(pod("keep", container("main", "4", 1)))
        kept = await kubelet.wait_admission("default", "keep", published=True)
        await kubelet.restart()
        assert kubelet.admission("default", "keep") is kept and kept.admitted
        assert kubelet.allocated_devices(R) == set(kept.container("main").devices[R])
        assert kubelet.free_cpus().isdisjoint(kept.container("main").cpus)
    finally:
        await kubelet.stop()
