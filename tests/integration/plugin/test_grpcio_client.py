"""An independent gRPC stack (grpcio, stubs generated now from proto/) acting as kubelet.

The client runs in its own process: its generated descriptors and hamid's describe the same
``v1beta1`` package and cannot share one protobuf descriptor pool.
"""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap
from pathlib import Path

from hamid._proto.deviceplugin.v1beta1 import api_pb2 as pb
from hamid.model.annotations import BIND_PHASE
from hamid.model.nodeconfig import NodeConfig
from hamid.plugin.service import list_response
from tests.integration.plugin.helpers import (
    dev,
    eventually,
    lock_node,
    running_plugin,
    scheduled_pod,
    stored_annotations,
)

REPO = Path(__file__).resolve().parents[3]

CLIENT = textwrap.dedent(
    """
    import json, sys
    import grpc
    from deviceplugin.v1beta1 import api_pb2 as pb, api_pb2_grpc as rpc

    channel = grpc.insecure_channel("unix:" + sys.argv[1])
    stub = rpc.DevicePluginStub(channel)
    out = {}
    out["options"] = stub.GetDevicePluginOptions(pb.Empty(), timeout=10).SerializeToString().hex()
    stream = stub.ListAndWatch(pb.Empty(), timeout=10)
    out["list"] = next(stream).SerializeToString().hex()
    stream.cancel()
    pref = pb.PreferredAllocationRequest(container_requests=[pb.ContainerPreferredAllocationRequest(
        available_deviceIDs=["GPU-0-0", "GPU-2-0", "GPU-2-1", "GPU-3-0"], allocation_size=1)])
    out["preferred"] = stub.GetPreferredAllocation(pref, timeout=10).SerializeToString().hex()
    alloc = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=["GPU-2-1"])])
    out["allocate"] = stub.Allocate(alloc, timeout=10).SerializeToString().hex()
    out["prestart"] = stub.PreStartContainer(
        pb.PreStartContainerRequest(devices_ids=["GPU-2-1"]), timeout=10).SerializeToString().hex()
    bad = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=["GPU-7-0"])])
    try:
        stub.Allocate(bad, timeout=10)
        out["bad"] = None
    except grpc.RpcError as exc:
        out["bad"] = [exc.code().name, exc.details()]
    print(json.dumps(out))
    """
)


async def generate_stubs(out: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"-I{REPO / 'proto'}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        "deviceplugin/v1beta1/api.proto",
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()


async def test_grpcio_kubelet_calls_every_rpc(tmp_path: Path) -> None:
    await generate_stubs(tmp_path)
    await asyncio.to_thread((tmp_path / "client.py").write_text, CLIENT)
    config = NodeConfig(device_split_count=2, enable_numa_topology=True, enable_get_preferred_allocation=True)
    # ``off``: the list is compared byte for byte after Allocate, and ``busy`` would hide GPU-2's
    # free replica once the job holds it while other GPUs are idle
    async with running_plugin(config, hide_replicas="off") as (env, _):
        env.server.put(scheduled_pod("job", ((dev("GPU-2", 4000, 25),),)))
        lock_node(env.server, "job")
        await eventually(lambda: env.plugin.pods.lock_owner() == "default/job")
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(tmp_path / "client.py"),
            env.socket,
            cwd=tmp_path,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        async with asyncio.timeout(60):
            stdout, stderr = await proc.communicate()
        assert proc.returncode == 0, stderr.decode()
        out = json.loads(stdout)

        assert bytes.fromhex(out["options"]) == b"\x10\x01"  # get_preferred_allocation_available = true
        assert bytes.fromhex(out["list"]) == list_response(env.plugin.inventory).SerializeToString()
        listed = pb.ListAndWatchResponse.FromString(bytes.fromhex(out["list"]))
        assert [(d.ID, d.health, d.topology.nodes[0].ID) for d in listed.devices][:3] == [
            ("GPU-0-0", "Healthy", 0),
            ("GPU-0-1", "Healthy", 0),
            ("GPU-1-0", "Healthy", 0),
        ]
        expected_preferred = pb.PreferredAllocationResponse(
            container_responses=[pb.ContainerPreferredAllocationResponse(deviceIDs=["GPU-2-0"])]
        )
        assert bytes.fromhex(out["preferred"]) == expected_preferred.SerializeToString()
        allocated = pb.AllocateResponse.FromString(bytes.fromhex(out["allocate"]))
        (car,) = allocated.container_responses
        assert car.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-2"
        assert car.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "4000m"
        assert car.envs["CUDA_DEVICE_SM_LIMIT"] == "25"
        assert {m.container_path for m in car.mounts} == {
            f"{env.hook}/vgpu/libvgpu.so",
            f"{env.hook}/vgpu",
            "/tmp/vgpulock",
            "/etc/ld.so.preload",
        }
        assert out["prestart"] == ""  # empty PreStartContainerResponse
        assert out["bad"][0] == "FAILED_PRECONDITION"
        assert "no pod on this node" in out["bad"][1]
        assert stored_annotations(env.server, "Pod", "job")[BIND_PHASE] == "success"
