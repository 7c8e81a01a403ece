"""Benchmark of `hamid plugin`: Allocate and GetPreferredAllocation latency, plugin peak RSS.

Runs the real `hamid plugin` as a child process (static devices file, 8 GPUs x 16 replicas,
GetPreferredAllocation on) against the embedded API server, with 110 pods on the node, and calls it
over its unix socket as kubelet would: per cycle a freshly bound pod (annotations + node lock as the
scheduler writes them), then GetPreferredAllocation and Allocate. No arguments needed; prints a
summary and, as the last line, one JSON object. ``--patch-latency-ms N`` delays every PATCH the API
server receives by N ms (a remote API server): Allocate's latency then shows how many of its
writes wait one after the other.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import shutil
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchstats import peak_rss_mib, percentile, print_figures
from grpclib.client import Channel

from hamid._proto.deviceplugin.v1beta1 import api_pb2 as pb
from hamid._proto.deviceplugin.v1beta1.api_grpc import DevicePluginStub
from hamid.model.annotations import (
    BIND_PHASE,
    BIND_TIME,
    DEVICES_ALLOCATED,
    DEVICES_TO_ALLOCATE,
    NODE_LOCK,
    VGPU_NODE,
    encode_pod_devices,
    format_node_lock,
)
from hamid.model.devices import ContainerDevice
from hamid.plugin.discovery import PhysicalGpu, devices_file_json
from hamidsim.apiserver import ApiServer

NODE = "bench-node"
GPUS = 8
SPLIT = 16
BACKGROUND_PODS = 109  # plus the one being admitted = 110 pods on the node
CYCLES = 300


def pod(name: str, gpu: int, phase: str, to_allocate: bool) -> dict[str, Any]:
    value = encode_pod_devices(((ContainerDevice(f"GPU-{gpu:04d}", "NVIDIA", 1000, 10),),))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "default",
            "annotations": {
                DEVICES_TO_ALLOCATE: value if to_allocate else ";",
                DEVICES_ALLOCATED: value,
                VGPU_NODE: NODE,
                BIND_TIME: "1700000000",
                BIND_PHASE: phase,
            },
        },
        "spec": {"nodeName": NODE, "containers": [{"name": "main", "image": "cuda"}]},
        "status": {"phase": "Pending" if to_allocate else "Running"},
    }


async def main(patch_latency_ms: float = 0.0) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="hb", dir="/tmp"))
    gpus = [
        PhysicalGpu(f"GPU-{i:04d}", i, "Tesla T4", 15360, i // 4, f"0000:{i:02x}:00.0") for i in range(GPUS)
    ]
    (work / "devices.json").write_text(devices_file_json(gpus))
    config = {"nodeconfig": [{"name": NODE, "devicesplitcount": SPLIT, "enablegetpreferredallocation": True}]}
    (work / "config.json").write_text(json.dumps(config))
    async with ApiServer() as server:
        server.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        if patch_latency_ms:
            server.faults.add_latency(patch_latency_ms / 1000, verb="patch")
        for i in range(BACKGROUND_PODS):
            server.put(pod(f"bg-{i}", i % GPUS, "success", to_allocate=False))
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            "from hamid.cli import main; main()",
            "--log-level=error",
            "plugin",
            f"--node-name={NODE}",
            f"--devices-file={work / 'devices.json'}",
            f"--node-config-file={work / 'config.json'}",
            f"--device-plugin-dir={work}",
            f"--hook-path={work / 'hook'}",
            f"--api-server={server.url}",
            "--metrics-listen=127.0.0.1:0",  # served as in production, on a port no other run holds
        )
        socket = work / "nvidia-gpu.sock"
        alloc_ms: list[float] = []
        pref_ms: list[float] = []
        errors = 0
        try:
            async with asyncio.timeout(30):
                for _ in itertools.count():
                    if socket.exists():
                        break
                    await asyncio.sleep(0.05)
            channel = Channel(path=str(socket))
            stub = DevicePluginStub(channel)
            for cycle in range(CYCLES):
                gpu = cycle % GPUS
                name = f"job-{cycle}"
                server.put(pod(name, gpu, "allocating", to_allocate=True))
                server.patch(
                    "Node",
                    None,
                    NODE,
                    {
                        "metadata": {
                            "annotations": {NODE_LOCK: format_node_lock(datetime.now(UTC), "default", name)}
                        }
                    },
                )
                await asyncio.sleep(0.03)  # let the plugin's watch deliver the pod and the lock
                available = [f"GPU-{g:04d}-{r}" for g in range(GPUS) for r in range(SPLIT)]
                request = pb.PreferredAllocationRequest(
                    container_requests=[
                        pb.ContainerPreferredAllocationRequest(
                            available_deviceIDs=available, allocation_size=1
                        )
                    ]
                )
                t0 = time.perf_counter()
                preferred = await stub.GetPreferredAllocation(request, timeout=10)
                pref_ms.append((time.perf_counter() - t0) * 1000)
                ids = list(preferred.container_responses[0].deviceIDs) or [f"GPU-{gpu:04d}-0"]
                t0 = time.perf_counter()
                try:
                    await stub.Allocate(
                        pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)]),
                        timeout=10,
                    )
                    alloc_ms.append((time.perf_counter() - t0) * 1000)
                except Exception as exc:
                    errors += 1
                    print(f"cycle {cycle}: Allocate failed: {exc}", file=sys.stderr)
                server.delete("Pod", "default", name)
            channel.close()
            rss = peak_rss_mib(proc.pid)
        finally:
            proc.terminate()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(10):
                    await proc.wait()
            shutil.rmtree(work, ignore_errors=True)
    result = {
        "pods_on_node": BACKGROUND_PODS + 1,
        "cycles": CYCLES,
        "errors": errors,
        "allocate_p50_ms": round(statistics.median(alloc_ms), 2),
        "allocate_p99_ms": round(percentile(alloc_ms, 0.99), 2),
        "preferred_p50_ms": round(statistics.median(pref_ms), 2),
        "preferred_p99_ms": round(percentile(pref_ms, 0.99), 2),
        "rss_mib": round(rss, 1),
        "patch_latency_ms": patch_latency_ms,
        "targets": {"allocate_p99_ms": 20, "rss_mib": 80},
    }
    print(
        f"Allocate p50 {result['allocate_p50_ms']} ms, p99 {result['allocate_p99_ms']} ms; "
        f"GetPreferredAllocation p50 {result['preferred_p50_ms']} ms, p99 {result['preferred_p99_ms']} ms; "
        f"plugin peak RSS {result['rss_mib']} MiB; {errors} errors"
    )
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--patch-latency-ms", type=float, default=0.0, help="added to every PATCH (default 0)"
    )
    args = parser.parse_args()
    if not 0 <= args.patch_latency_ms <= 1000:
        parser.error("--patch-latency-ms must be between 0 and 1000")
    print_figures(asyncio.run(main(args.patch_latency_ms)))
