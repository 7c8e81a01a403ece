"""Issue 16 on the plugin: serve only what the scheduler decided, answer every bad input cleanly.

Real unix-socket gRPC: grpclib stubs in-process, and an independent grpcio client (its own process)
for bytes no generated stub would send.
"""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap

import pytest
import structlog.testing
from grpclib import GRPCError
from grpclib.const import Status

from hamid.model.annotations import BIND_PHASE, DEVICES_TO_ALLOCATE, NODE_LOCK
from hamid.plugin.grpc_codec import MAX_REQUEST_BYTES
from hamid.plugin.service import MAX_STATUS_MESSAGE_CHARS
from tests.integration.plugin.helpers import dev, running_plugin, scheduled_pod, stored_annotations
from tests.integration.plugin.test_allocate import allocate, seeded, stub_for

RAW_CLIENT = textwrap.dedent(
    """
    import json, sys, time
    import grpc

    channel = grpc.insecure_channel("unix:" + sys.argv[1])
    out = {}
    unary = ["GetDevicePluginOptions", "GetPreferredAllocation", "Allocate", "PreStartContainer"]
    for payload in (b"\\x0f", b"\\x0a\\xff"):
        for name in unary + ["ListAndWatch"]:
            path = "/v1beta1.DevicePlugin/" + name
            call = channel.unary_stream(path) if name == "ListAndWatch" else channel.unary_unary(path)
            try:
                result = call(payload, timeout=10)
                if name == "ListAndWatch":
                    next(result)
                out[name + payload.hex()] = None
            except grpc.RpcError as exc:
                out[name + payload.hex()] = [exc.code().name, exc.details()]
    print(json.dumps(out))
    """
)


async def test_invalid_protobuf_bytes_answer_invalid_argument_on_every_rpc() -> None:
    async with running_plugin() as (env, _):
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            RAW_CLIENT,
            env.socket,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, err.decode()
        answers = json.loads(out)
    assert len(answers) == 10
    for name, answer in answers.items():
        assert answer is not None, name
        code, details = answer
        assert code == "INVALID_ARGUMENT", (name, answer)
        assert "is not a valid" in details and "protobuf message" in details


async def test_a_huge_device_id_is_refused_at_once_with_a_bounded_message() -> None:
    """A 2 MB device ID (it once stalled the plugin for minutes in the error trailer) is over the
    request limit; a 300 kB one is within it but no replica ID: both refused before any work."""
    pod = scheduled_pod("p", ((dev("GPU-1", 1000, 10),),))
    async with running_plugin() as (env, _), stub_for(env) as stub:
        await seeded(env, pod)
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(GRPCError) as err:
            await allocate(stub, "GPU-1-" + "x" * 2_000_000)
        assert err.value.status is Status.RESOURCE_EXHAUSTED
        assert f"exceeds the device plugin's limit of {MAX_REQUEST_BYTES}" in str(err.value.message)
        with pytest.raises(GRPCError) as err:
            await allocate(stub, "GPU-1-" + "x" * 300_000)
        assert loop.time() - start < 5  # a bound for a hang, not a timing assertion
        assert err.value.status is Status.INVALID_ARGUMENT
        message = str(err.value.message)
        assert "longer than 256 characters" in message and len(message) <= MAX_STATUS_MESSAGE_CHARS
        assert stored_annotations(env.server, "Pod", "p")[BIND_PHASE] == "allocating"  # nothing changed
        assert env.plugin.allocator.refusals == {}  # refused before the allocator
        r = await allocate(stub, "GPU-1-0")  # the plugin still serves the pod afterwards
        assert r.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-1"


async def test_many_unknown_ids_give_a_bounded_message() -> None:
    pod = scheduled_pod("p", ((dev("GPU-1", 1000, 10),) * 1,))
    async with running_plugin() as (env, _), stub_for(env) as stub:
        await seeded(env, pod)
        with pytest.raises(GRPCError) as err:
            await allocate(stub, *[f"GPU-{'z' * 200}-{i}" for i in range(2000)])
        message = str(err.value.message)
        assert err.value.status is Status.FAILED_PRECONDITION and "unknown device IDs" in message
        assert "and 1992 more" in message and len(message) <= MAX_STATUS_MESSAGE_CHARS


@pytest.mark.parametrize(
    ("devices", "ids", "unhealthy", "code", "message"),
    [
        (
            (dev("GPU-1", 1000, 10),),
            ("GPU-1-0",),
            "GPU-1",
            "unhealthy-gpu",
            "turned unhealthy after scheduling (XID 79)",
        ),
        ((dev("GPU-9", 1000, 10),), ("GPU-0-0",), None, "unknown-gpu", "names GPU 'GPU-9', which node"),
        (
            (dev("GPU-1", 2_000_000_000, 10),),
            ("GPU-1-0",),
            None,
            "over-capacity",
            "beyond its registered 15360 MiB",
        ),
        ((dev("GPU-1", 1000, 101),), ("GPU-1-0",), None, "over-capacity", "101 cores on GPU GPU-1"),
    ],
    ids=["unhealthy", "unknown-gpu", "memory", "cores"],
)
async def test_allocations_the_node_cannot_serve_are_refused_counted_and_logged(
    devices: tuple, ids: tuple[str, ...], unhealthy: str | None, code: str, message: str
) -> None:
    pod = scheduled_pod("p", (devices,))
    async with running_plugin() as (env, _), stub_for(env) as stub:
        await seeded(env, pod)
        if unhealthy is not None:
            assert env.plugin.inventory.mark_unhealthy(unhealthy, "XID 79")
        with structlog.testing.capture_logs() as logs, pytest.raises(GRPCError) as err:
            await allocate(stub, *ids)
        assert err.value.status is Status.FAILED_PRECONDITION and message in str(err.value.message)
        assert "delete the pod so the scheduler places it" in str(err.value.message)
        assert env.plugin.allocator.refusals == {code: 1}
        assert [e["code"] for e in logs if e["event"] == "allocate_refused"] == [code]
        notes = stored_annotations(env.server, "Pod", "p")
        assert notes[BIND_PHASE] == "failed"
        assert notes[DEVICES_TO_ALLOCATE] == pod["metadata"]["annotations"][DEVICES_TO_ALLOCATE]
        assert NODE_LOCK not in stored_annotations(env.server, "Node", "gpu-node-1", None)
