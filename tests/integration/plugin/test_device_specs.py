"""``--pass-device-specs``: the device nodes Allocate declares to kubelet, over the plugin's unix socket.

The dev root is a temporary directory whose ``dev/`` holds the nodes a test says exist (plain files:
only their existence is looked up). GPU ``GPU-<i>`` has minor number ``10 + i``, so a node named
after the GPU's index rather than its minor number shows.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from grpclib import GRPCError
from grpclib.const import Status

from hamid._proto.deviceplugin.v1beta1 import api_pb2 as pb
from hamid.model.annotations import BIND_PHASE, DEVICES_TO_ALLOCATE, NODE_LOCK
from hamid.plugin.app import PluginStartupError
from hamid.plugin.discovery import PhysicalGpu, devices_file_json
from tests.integration.plugin.helpers import (
    GPUS,
    NODE,
    dev,
    running_plugin,
    scheduled_pod,
    stored_annotations,
)
from tests.integration.plugin.test_allocate import allocate, seeded, stub_for

#: The helpers' four GPUs, with minor numbers 10-13.
MINORED = tuple(dataclasses.replace(g, minor=10 + g.index) for g in GPUS)
CONTROL = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")


def dev_root(base: Path, *nodes: str) -> Path:
    """A dev root whose ``dev/`` holds exactly ``nodes``."""
    (base / "dev").mkdir(parents=True)
    for node in nodes:
        (base / node.lstrip("/")).touch()
    return base


def specs(response: pb.ContainerAllocateResponse) -> list[tuple[str, str, str]]:
    return [(d.container_path, d.host_path, d.permissions) for d in response.devices]


def declared(root: str, *nodes: str) -> list[tuple[str, str, str]]:
    """What Allocate should declare: each node, its host path under ``root``, ``rw``."""
    return [(n, f"{root.rstrip('/')}{n}", "rw") for n in nodes]


async def test_off_by_default_no_device_specs(tmp_path: Path) -> None:
    root = dev_root(tmp_path, *CONTROL, "/dev/nvidia11")
    async with running_plugin(gpus=MINORED, dev_root=str(root)) as (env, _), stub_for(env) as stub:
        assert env.plugin.allocator.device_nodes is None
        await seeded(env, scheduled_pod("p", ((dev("GPU-1", 1000, 10),),)))
        r = await allocate(stub, "GPU-1-0")
        assert r.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-1"
        assert list(r.devices) == []


async def test_one_gpu_gets_its_node_and_the_control_nodes_that_exist(tmp_path: Path) -> None:
    # nvidia10 exists too: another GPU's node is never declared
    root = dev_root(tmp_path, "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia10", "/dev/nvidia11")
    async with (
        running_plugin(gpus=MINORED, pass_device_specs=True, dev_root=str(root)) as (env, _),
        stub_for(env) as stub,
    ):
        await seeded(env, scheduled_pod("p", ((dev("GPU-1", 1000, 10),),)))
        r = await allocate(stub, "GPU-1-0")
        assert specs(r) == declared(str(root), "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia11")
        assert r.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-1"  # the env and the mounts stay as they were
        assert "/etc/ld.so.preload" in {m.container_path for m in r.mounts}
        assert stored_annotations(env.server, "Pod", "p")[BIND_PHASE] == "success"


async def test_several_gpus_follow_the_booking_not_kubelets_replicas(tmp_path: Path) -> None:
    """Host paths under --dev-root (the driver container's root), looked up under
    --dev-root-ctr-path; every control node present; the GPUs are the annotation's, in its order,
    though kubelet's replicas sit on other GPUs (the fallback serves the booking)."""
    seen = dev_root(tmp_path, *CONTROL, *(f"/dev/nvidia{10 + i}" for i in range(4)))
    async with (
        running_plugin(
            gpus=MINORED, pass_device_specs=True, dev_root="/run/nvidia/driver", dev_root_ctr_path=str(seen)
        ) as (env, _),
        stub_for(env) as stub,
    ):
        await seeded(env, scheduled_pod("p", ((dev("GPU-2", 1000, 10), dev("GPU-1", 1000, 10)),)))
        r = await allocate(stub, "GPU-3-0", "GPU-0-1")
        assert r.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-2,GPU-1"
        assert specs(r) == declared("/run/nvidia/driver", *CONTROL, "/dev/nvidia12", "/dev/nvidia11")


async def test_each_container_of_a_pod_gets_its_own_gpus_nodes(tmp_path: Path) -> None:
    root = dev_root(tmp_path, "/dev/nvidiactl", *(f"/dev/nvidia{10 + i}" for i in range(4)))
    pod = scheduled_pod(
        "multi",
        (
            (dev("GPU-0", 500, 10),),
            (),
            (dev("GPU-1", 500, 10),),
            (dev("GPU-2", 500, 10), dev("GPU-3", 500, 10)),
        ),
        init=("i0",),
        containers=("c0", "c1", "c2"),
    )
    async with (
        running_plugin(gpus=MINORED, pass_device_specs=True, dev_root=str(root)) as (env, _),
        stub_for(env) as stub,
    ):
        await seeded(env, pod)
        r0 = await allocate(stub, "GPU-0-0")
        assert specs(r0) == declared(str(root), "/dev/nvidiactl", "/dev/nvidia10")
        # kubelet may ask for several containers in one call: each answer holds its own GPUs only
        both = await stub.Allocate(
            pb.AllocateRequest(
                container_requests=[
                    pb.ContainerAllocateRequest(devices_ids=["GPU-1-0"]),
                    pb.ContainerAllocateRequest(devices_ids=["GPU-2-0", "GPU-3-0"]),
                ]
            ),
            timeout=10,
        )
        c1, c2 = both.container_responses
        assert specs(c1) == declared(str(root), "/dev/nvidiactl", "/dev/nvidia11")
        assert specs(c2) == declared(str(root), "/dev/nvidiactl", "/dev/nvidia12", "/dev/nvidia13")
        assert stored_annotations(env.server, "Pod", "multi")[BIND_PHASE] == "success"


async def test_the_devices_file_minor_names_the_node(tmp_path: Path) -> None:
    devices = tmp_path / "devices.json"
    devices.write_text(devices_file_json(MINORED))
    root = dev_root(tmp_path / "root", "/dev/nvidiactl", "/dev/nvidia12")
    async with (
        running_plugin(devices_file=devices, pass_device_specs=True, dev_root=str(root)) as (env, _),
        stub_for(env) as stub,
    ):
        assert [env.plugin.inventory.minor_of(g.uuid) for g in GPUS] == [10, 11, 12, 13]
        await seeded(env, scheduled_pod("p", ((dev("GPU-2", 1000, 10),),)))
        r = await allocate(stub, "GPU-2-5")
        assert specs(r) == declared(str(root), "/dev/nvidiactl", "/dev/nvidia12")


@pytest.mark.parametrize(
    ("gpus", "nodes", "code", "message"),
    [
        (
            GPUS,
            ("/dev/nvidiactl", "/dev/nvidia11"),
            "minor-unknown",
            "the minor number of GPU GPU-1 is unknown",
        ),
        (
            MINORED,
            ("/dev/nvidiactl", "/dev/nvidia10"),
            "device-node-missing",
            "no device node /dev/nvidia11 of GPU GPU-1",
        ),
    ],
)
async def test_refuses_rather_than_serve_a_container_without_its_node(
    tmp_path: Path, gpus: tuple[PhysicalGpu, ...], nodes: tuple[str, ...], code: str, message: str
) -> None:
    root = dev_root(tmp_path, *nodes)
    pod = scheduled_pod("p", ((dev("GPU-1", 1000, 10),),))
    async with (
        running_plugin(gpus=gpus, pass_device_specs=True, dev_root=str(root)) as (env, _),
        stub_for(env) as stub,
    ):
        await seeded(env, pod)
        with pytest.raises(GRPCError) as err:
            await allocate(stub, "GPU-1-0")
        assert err.value.status is Status.FAILED_PRECONDITION and message in str(err.value.message)
        assert env.plugin.allocator.refusals[code] == 1
        ann = stored_annotations(env.server, "Pod", "p")
        assert ann[BIND_PHASE] == "failed"
        assert ann[DEVICES_TO_ALLOCATE] == pod["metadata"]["annotations"][DEVICES_TO_ALLOCATE]  # not consumed
        assert NODE_LOCK not in stored_annotations(env.server, "Node", NODE, None)


async def test_start_refuses_a_dev_root_it_cannot_see(tmp_path: Path) -> None:
    with pytest.raises(
        PluginStartupError, match=r"/absent/dev is not a directory: mount the host's /run/nvidia/driver/dev"
    ):
        async with running_plugin(
            gpus=MINORED,
            pass_device_specs=True,
            dev_root="/run/nvidia/driver",
            dev_root_ctr_path=str(tmp_path / "absent"),
        ):
            pass
