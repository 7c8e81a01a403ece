"""Registration with a grpclib fake kubelet over real unix sockets, kubelet restart, health updates."""

from __future__ import annotations

import asyncio
from pathlib import Path

from hamid._proto.deviceplugin.v1beta1 import api_pb2 as pb
from hamid.model.nodeconfig import NodeConfig
from tests.integration.plugin.helpers import FakeKubelet, eventually, running_plugin


async def test_registers_and_lists_replicas_with_topology() -> None:
    config = NodeConfig(device_split_count=2, enable_numa_topology=True, enable_get_preferred_allocation=True)
    async with running_plugin(config, with_kubelet=True) as (env, kubelet):
        assert kubelet is not None
        await eventually(lambda: bool(kubelet.lists))
        request = kubelet.requests[0]
        assert (request.version, request.endpoint, request.resource_name) == (
            "v1beta1",
            "nvidia-gpu.sock",
            "nvidia.com/gpu",
        )
        assert request.options.get_preferred_allocation_available
        assert kubelet.options[0] == pb.DevicePluginOptions(get_preferred_allocation_available=True)
        devices = kubelet.lists[0].devices
        assert [d.ID for d in devices] == [f"GPU-{g}-{i}" for g in range(4) for i in range(2)]
        assert {d.health for d in devices} == {"Healthy"}
        assert [d.topology.nodes[0].ID for d in devices] == [0, 0, 0, 0, 1, 1, 1, 1]

        env.plugin.inventory.mark_unhealthy("GPU-3", "XID 79")
        await eventually(lambda: len(kubelet.lists) >= 2)
        latest = kubelet.lists[-1].devices
        assert len(latest) == 8  # always the full list
        assert [d.health for d in latest][-2:] == ["Unhealthy", "Unhealthy"]
        assert {d.health for d in latest[:-2]} == {"Healthy"}


async def test_options_follow_node_config_and_no_topology_when_off() -> None:
    config = NodeConfig(
        device_split_count=1, enable_numa_topology=False, enable_get_preferred_allocation=False
    )
    async with running_plugin(config, with_kubelet=True) as (_env, kubelet):
        assert kubelet is not None
        await eventually(lambda: bool(kubelet.lists))
        assert not kubelet.options[0].get_preferred_allocation_available
        assert not kubelet.requests[0].options.get_preferred_allocation_available
        assert all(not d.HasField("topology") for d in kubelet.lists[0].devices)


async def test_kubelet_restart_reregisters_with_a_fresh_server() -> None:
    async with running_plugin(with_kubelet=True) as (env, first):
        assert first is not None
        await eventually(lambda: bool(first.lists))
        assert env.plugin.connector.servers_started == 1
        # kubelet restarts: stops, wipes plugin sockets, recreates kubelet.sock
        await first.stop()
        await asyncio.to_thread(Path(env.socket).unlink)
        second = FakeKubelet(env.directory)
        await second.start()
        try:
            await eventually(lambda: bool(second.lists))
            assert env.plugin.connector.servers_started == 2
            assert second.requests[0].endpoint == "nvidia-gpu.sock"
            assert len(second.lists[0].devices) == 16
        finally:
            await second.stop()


async def test_kubelet_socket_recreated_without_wiping_plugin_socket() -> None:
    async with running_plugin(with_kubelet=True) as (env, first):
        assert first is not None
        await eventually(lambda: bool(first.requests))
        await first.stop()
        second = FakeKubelet(env.directory)
        await second.start()
        try:
            await eventually(lambda: bool(second.lists))
            assert env.plugin.connector.servers_started == 2
        finally:
            await second.stop()


async def test_kubelet_appears_after_plugin() -> None:
    async with running_plugin(with_kubelet=False) as (env, _):
        assert env.plugin.connector.registrations == 0
        kubelet = FakeKubelet(env.directory)
        await kubelet.start()
        try:
            await eventually(lambda: bool(kubelet.lists))
            assert env.plugin.connector.servers_started == 1
        finally:
            await kubelet.stop()


async def test_zero_gpus_registers_nothing() -> None:
    async with running_plugin(gpus=(), with_kubelet=True) as (env, kubelet):
        assert kubelet is not None
        await env.plugin.pods.wait_synced()
        assert env.plugin.connector.servers_started == 0
        assert not await asyncio.to_thread(Path(env.socket).exists)
        assert env.plugin.registrar.patches == 0
