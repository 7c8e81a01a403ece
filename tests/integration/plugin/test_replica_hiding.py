"""The replicas the plugin hides from kubelet (``--hide-replicas``) across a restart of the plugin
and a GPU turning unhealthy or healthy again: the real PluginApp, the simulated kubelet's PodResources server,
the embedded API server."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

import pytest

from hamid._proto.deviceplugin.v1beta1 import api_pb2 as pb
from hamid.kube.client import connect
from hamid.model.annotations import (
    BIND_PHASE,
    DEVICES_ALLOCATED,
    DEVICES_TO_ALLOCATE,
    NODE_LOCK,
    encode_pod_devices,
)
from hamid.model.nodeconfig import NodeConfig
from hamid.model.resources import ResourceConfig
from hamid.plugin.app import NodeSetup, PluginApp, PluginTimings
from hamid.plugin.options import PluginOptions
from hamid.plugin.service import list_response
from hamidsim.apiserver import ApiServer
from hamidsim.kubelet.assignment import ContainerAssignment, PodAdmission
from hamidsim.kubelet.devicemanager import ResourceState
from hamidsim.kubelet.podresources import PodResourcesServer, PodResourcesView
from hamidsim.machine import parse_machine_text
from hamidsim.sysfs import write_sysfs_tree
from tests.integration.plugin.helpers import (
    GPUS,
    NODE,
    dev,
    eventually,
    lock_node,
    running_plugin,
    scheduled_pod,
    stored_annotations,
)
from tests.integration.plugin.test_allocate import allocate, stub_for
from tests.integration.plugin.test_device_lists import gpu_spec

GPU = "nvidia.com/gpu"
MACHINE = "numaNodes: [{id: 0, cpus: '0-3'}, {id: 1, cpus: '4-7'}]\ndistances: [[10, 21], [21, 10]]\n"
CONFIG = (
    "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
    "cpuManagerPolicy: static\ntopologyManagerPolicy: single-numa-node\n"
)
REPLICAS = {f"GPU-{g}-{i}": (g // 2,) for g in range(4) for i in range(4)}


def running_pod() -> dict:
    """A hamid pod admitted and running, booked on all of GPU-0's memory (15360 MiB)."""
    devices = ((dev("GPU-0", 15360, 30),),)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "a",
            "namespace": "default",
            "uid": "uid-a",
            "annotations": {
                DEVICES_ALLOCATED: encode_pod_devices(devices),
                DEVICES_TO_ALLOCATE: encode_pod_devices(((),)),
            },
        },
        "spec": {
            "nodeName": NODE,
            "containers": [{"name": "main", "image": "cuda", "resources": {"limits": {GPU: "1"}}}],
        },
        "status": {"phase": "Running", "containerStatuses": [{"name": "main", "ready": True}]},
    }


@pytest.mark.parametrize("config_present", [True, False])
async def test_after_a_restart_hiding_resumes_without_the_kubelet_config(config_present: bool) -> None:
    """A plugin audit: after a restart beside a running pod, the replicas stayed offered for as
    long as the pod ran when the kubelet config (or sysfs) could not be read: PodResources, which
    says which replicas the pod holds, was read only for the NUMA profile. It costs the profile
    only now."""
    directory = Path(tempfile.mkdtemp(prefix="hr", dir="/tmp"))
    try:
        write_sysfs_tree(parse_machine_text(MACHINE), directory / "sys")
        if config_present:
            (directory / "config.yaml").write_text(CONFIG)
        container = ContainerAssignment(name="main", index=0, init=False, hint=None, cpus=frozenset())
        container.devices = {GPU: ("GPU-0-2",)}
        records = [PodAdmission("default", "a", "uid-a", NODE, True, containers=[container])]
        resources = {GPU: ResourceState(GPU, all_devices=dict(REPLICAS), healthy=set(REPLICAS))}
        view = PodResourcesView(
            lambda: records,
            lambda: resources,
            lambda: frozenset(range(1, 8)),
            lambda _r: REPLICAS,
            lambda: [],
        )
        socket = directory / "pod-resources" / "kubelet.sock"
        pr = PodResourcesServer(socket, view)
        await pr.start()
        async with ApiServer() as server:
            server.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
            server.put(running_pod())
            client = await connect(api_server=server.url, request_timeout=5.0)
            config = NodeConfig(device_split_count=4, enable_numa_topology=True)
            setup = NodeSetup(config, ResourceConfig(), GPU, GPUS, None, None)
            options = PluginOptions(
                node_name=NODE,
                device_plugin_dir=str(directory / "dp"),
                hook_path=str(directory / "hook"),
                metrics_listen="",
                api_server=server.url,
                hide_replicas="full",
                sysfs_root=str(directory / "sys"),
                kubelet_config=str(directory / "config.yaml"),
                pod_resources_socket=str(socket),
            )
            app = PluginApp(options, kube=client, setup=setup, timings=PluginTimings(numa_interval=0.1))
            try:
                await app.start()
                await app.wait_synced()
                inv = app.plugin.inventory

                def gpu0() -> list[str]:
                    return [d.health for d in list_response(inv).devices if d.ID.startswith("GPU-0-")]

                # PodResources read: GPU-0 (no room) hides its 3 free replicas, the held one stays
                await eventually(lambda: gpu0() == ["Unhealthy", "Unhealthy", "Healthy", "Unhealthy"])
            finally:
                await app.stop()
                await client.close()
        await pr.stop(1.0)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _health(listed: pb.ListAndWatchResponse) -> dict[str, str]:
    return {d.ID: d.health for d in listed.devices}


async def test_a_gpu_turning_unhealthy_re_judges_the_hidden_replicas() -> None:
    """A plugin audit: under ``busy`` a partly booked GPU hides its free replicas while a healthy
    GPU is idle; when the idle ones turned unhealthy (XID) nothing re-judged them, and on a quiet
    node kubelet saw one replica where the scheduler's rule offers the GPU's free ones."""
    async with running_plugin(with_kubelet=True, hide_replicas="busy") as (env, kubelet):
        assert kubelet is not None and env.plugin.room is not None
        await eventually(lambda: bool(kubelet.lists))
        env.server.put(scheduled_pod("a", ((dev("GPU-0", 4000, 30),),)))
        lock_node(env.server, "a")
        async with stub_for(env) as stub:
            await allocate(stub, "GPU-0-0")
        await eventually(lambda: _health(kubelet.lists[-1])["GPU-0-1"] == "Unhealthy")
        for gpu in ("GPU-1", "GPU-2", "GPU-3"):
            env.plugin.inventory.mark_unhealthy(gpu, "XID 79")
        await eventually(
            lambda: [_health(kubelet.lists[-1])[f"GPU-0-{i}"] for i in range(4)] == ["Healthy"] * 4
        )
        assert env.plugin.inventory.hidden("GPU-0") == frozenset()


async def test_a_cdi_health_change_reaches_kubelet_as_one_list_judged_by_the_rule(tmp_path: Path) -> None:
    """``busy``: GPU-0 is partly booked and held, GPU-1 idle, so GPU-0's free replicas are hidden.
    GPU-1's CDI device goes (no idle healthy GPU: they are offered) and comes back (hidden again):
    one list per change, judged by the rule. There were two, the first sent before the room judged
    again: with GPU-1 healthy and idle, GPU-0's free replicas were still offered."""
    specs = tmp_path / "cdi"
    gpu_spec(specs, "GPU-0", "GPU-1")  # GPU-2 and GPU-3 stay unhealthy
    async with running_plugin(
        with_kubelet=True,
        hide_replicas="busy",
        device_list_strategy=("cdi-cri",),
        cdi_spec_dirs=(str(specs),),
    ) as (env, kubelet):
        cdi = env.plugin.cdi
        assert kubelet is not None and cdi is not None
        await eventually(lambda: bool(kubelet.lists))
        env.server.put(scheduled_pod("a", ((dev("GPU-0", 4000, 30),),)))
        lock_node(env.server, "a")
        async with stub_for(env) as stub:
            await allocate(stub, "GPU-0-0")
        free0 = [f"GPU-0-{i}" for i in (1, 2, 3)]
        await eventually(lambda: [_health(kubelet.lists[-1])[r] for r in free0] == ["Unhealthy"] * 3)

        async def rescan(*defined: str) -> list[list[str]]:
            """Write a spec defining ``defined`` and apply a scan as each does: what kubelet is
            sent for GPU-1's and GPU-0's free replicas."""
            gpu_spec(specs, *defined)
            sent = len(kubelet.lists)
            cdi.apply(cdi.specs.scan())
            await eventually(lambda: len(kubelet.lists) > sent)
            await asyncio.sleep(0.1)  # a second list would be here by now
            lists = [_health(listed) for listed in kubelet.lists[sent:]]
            return [[h[r] for r in ("GPU-1-0", *free0)] for h in lists]

        assert await rescan("GPU-0") == [["Unhealthy"] + ["Healthy"] * 3]
        assert await rescan("GPU-0", "GPU-1") == [["Healthy"] + ["Unhealthy"] * 3]


async def test_an_allocate_cancelled_mid_commit_still_tells_which_replicas_the_pod_holds() -> None:
    """A plugin audit: the consume patch completes when the caller goes away, but the replicas it
    served went untold, so the room knew a holder it could not place and hid nothing node-wide."""
    async with running_plugin(hide_replicas="busy") as (env, _):
        room = env.plugin.room
        assert room is not None
        env.server.put(scheduled_pod("a", ((dev("GPU-0", 4000, 30),),)))
        lock_node(env.server, "a")
        async with stub_for(env) as stub:
            await allocate(stub, "GPU-0-0")
        await eventually(lambda: env.plugin.inventory.hidden("GPU-0") != frozenset())
        env.server.put(scheduled_pod("p", ((dev("GPU-1", 1000, 10),),)))
        await eventually(lambda: NODE_LOCK not in stored_annotations(env.server, "Node", NODE, None))
        lock_node(env.server, "p")
        await eventually(lambda: env.plugin.pods.pod("default/p") is not None)
        slow = env.server.faults.add_latency(1.0, verb="patch", path_pattern="/pods/p$")
        request = pb.AllocateRequest(
            container_requests=[pb.ContainerAllocateRequest(devices_ids=["GPU-1-0"])]
        )
        try:
            async with stub_for(env) as stub:
                with pytest.raises(TimeoutError):  # kubelet goes away while the commit is on its way
                    await stub.Allocate(request, timeout=0.4)
            await eventually(lambda: stored_annotations(env.server, "Pod", "p")[BIND_PHASE] == "success")
        finally:
            env.server.faults.remove(slow.id)
        await eventually(lambda: room._allocated.get("default/p") == frozenset({"GPU-1-0"}))
        assert env.plugin.inventory.hidden("GPU-0") != frozenset()  # hiding goes on


async def test_span_lists_one_replica_per_gpu_to_kubelet_over_list_and_watch_until_one_is_held() -> None:
    """``span`` over the real ListAndWatch stream: while nothing is held kubelet receives one
    replica per GPU (the rest not sent at all); after Allocate served a pod every replica is sent
    again (``busy``: GPU-0's free ones Unhealthy while other GPUs are idle). ``span`` acts only
    under kubelet's ``restricted`` policy, which this plugin (no kubelet config here) learns as its
    NUMA publisher would announce it; before that it lists every replica."""
    async with running_plugin(with_kubelet=True, hide_replicas="span") as (env, kubelet):
        room = env.plugin.room
        assert kubelet is not None and room is not None
        await eventually(lambda: bool(kubelet.lists) and len(kubelet.lists[-1].devices) == 16)
        room.topology_policy = lambda: "restricted"
        room.sync()
        await eventually(lambda: len(kubelet.lists[-1].devices) == 4)
        assert sorted(_health(kubelet.lists[-1])) == ["GPU-0-0", "GPU-1-0", "GPU-2-0", "GPU-3-0"]
        env.server.put(scheduled_pod("a", ((dev("GPU-0", 4000, 30),),)))
        lock_node(env.server, "a")
        async with stub_for(env) as stub:
            await allocate(stub, "GPU-0-0")
        await eventually(lambda: len(kubelet.lists[-1].devices) == 16)
        health = _health(kubelet.lists[-1])
        assert [health[f"GPU-0-{i}"] for i in range(4)] == ["Healthy"] + ["Unhealthy"] * 3
        assert all(health[f"GPU-1-{i}"] == "Healthy" for i in range(4))
