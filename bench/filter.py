"""Filter benchmark: latency in-process and over HTTP, pods/s, scheduler RSS.

Default: 1,000 nodes x 8 GPUs with 10,000 running pods (``--nodes 100`` for the small case).
In-process: the filter's compute (fit over the candidates, reserve, encode) on a state fed
directly with node and pod dicts; its peak RSS is the scheduler's. Over HTTP: the real extender
``/filter`` against the embedded API server (seeded with the same nodes and pods, caches synced
through the API), including the annotation patch. The last output line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import resource
import time
from typing import Any

from hamid.log import configure

configure("json", "error")  # before the modules below bind their loggers

import aiohttp  # noqa: E402

from hamid.fit.fit import PodFitSpec  # noqa: E402
from hamid.kube.client import connect  # noqa: E402
from hamid.model import annotations as ann  # noqa: E402
from hamid.model.devices import MODE_HAMI_CORE, DeviceInfo  # noqa: E402
from hamid.scheduler.core import Scheduler, SchedulerSettings  # noqa: E402
from hamid.scheduler.http import extender_app, serve  # noqa: E402
from hamid.sim.apiserver import ApiServer  # noqa: E402

GPU_MEM = 40960


def _node(i: int, gpus: int) -> dict[str, Any]:
    devices = [
        DeviceInfo(
            id=f"GPU-{i:05d}-{g}",
            index=g,
            count=10,
            devmem=GPU_MEM,
            devcore=100,
            type="NVIDIA-A100",
            numa=g // 4,
            mode=MODE_HAMI_CORE,
            health=True,
        )
        for g in range(gpus)
    ]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": f"node-{i:05d}",
            "annotations": {ann.NODE_REGISTER: ann.encode_node_devices(devices)},
        },
        "status": {"allocatable": {"nvidia.com/gpu": str(gpus * 10)}},
    }


def _pod(name: str, uid: str, mem: int, cores: int) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(mem), "nvidia.com/gpucores": str(cores)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": uid, "annotations": {}},
        "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": limits}}]},
        "status": {"phase": "Pending"},
    }


def _running(i: int, nodes: int, gpus: int, rng: random.Random) -> dict[str, Any]:
    n, g = rng.randrange(nodes), rng.randrange(gpus)
    mem, cores = rng.choice((1000, 2000, 4000)), rng.choice((5, 10, 20))
    p = _pod(f"run-{i}", f"uid-run-{i}", mem, cores)
    alloc = f"GPU-{n:05d}-{g},NVIDIA,{mem},{cores}:;"
    p["metadata"]["annotations"] = {
        ann.VGPU_NODE: f"node-{n:05d}",
        ann.DEVICES_ALLOCATED: alloc,
        ann.DEVICES_TO_ALLOCATE: "",
    }
    p["spec"]["nodeName"] = f"node-{n:05d}"
    p["status"]["phase"] = "Running"
    return p


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def bench_in_process(nodes: int, gpus: int, pods: int, filters: int) -> dict[str, float]:
    """Feed a state directly; time plan + reserve + encode per pod."""
    rng = random.Random(1)
    scheduler = Scheduler(None, settings=SchedulerSettings())  # type: ignore[arg-type]  # no API calls here
    state = scheduler.state
    names = []
    for i in range(nodes):
        node = _node(i, gpus)
        state.on_node(node)
        names.append(node["metadata"]["name"])
    for i in range(pods):
        state.on_pod(_running(i, nodes, gpus, rng))
    candidates = tuple(names)
    latencies = []
    started = time.perf_counter()
    for i in range(filters):
        pod = _pod(f"new-{i}", f"uid-new-{i}", 2000, 20)
        t0 = time.perf_counter()
        spec = PodFitSpec.from_pod(pod, scheduler.config, "spread", "binpack")
        node, fitted, _failed = scheduler.plan(pod, spec, candidates)
        if node is not None and fitted is not None:
            state.reserve(pod, node, fitted.devices, ann.encode_pod_devices(fitted.devices))
        latencies.append(time.perf_counter() - t0)
    elapsed = time.perf_counter() - started
    return {
        "filter_p50_ms": _pct(latencies, 0.5) * 1000,
        "filter_p99_ms": _pct(latencies, 0.99) * 1000,
        "in_process_pods_per_s": filters / elapsed,
        "rss_mib": _rss_mib(),
    }


async def bench_http(nodes: int, gpus: int, pods: int, filters: int) -> dict[str, float]:
    """Real /filter over HTTP against the embedded API server (patch included)."""
    rng = random.Random(2)
    async with ApiServer() as server:
        for i in range(nodes):
            server.put(_node(i, gpus))
        for i in range(pods):
            server.put(_running(i, nodes, gpus, rng))
        new_pods = [server.put(_pod(f"new-{i}", f"uid-http-{i}", 2000, 20)) for i in range(filters)]
        kube = await connect(api_server=server.url, request_timeout=30.0)
        scheduler = Scheduler(kube, settings=SchedulerSettings())
        task = asyncio.create_task(scheduler.run())
        runner, port = await serve(extender_app(scheduler), "127.0.0.1:0")
        try:
            for cache in (scheduler.pods, scheduler.nodes, scheduler.quotas):
                await cache.wait_synced(120)
            names = [f"node-{i:05d}" for i in range(nodes)]
            latencies = []
            async with aiohttp.ClientSession() as session:
                started = time.perf_counter()
                for pod in new_pods:
                    t0 = time.perf_counter()
                    async with session.post(
                        f"http://127.0.0.1:{port}/filter", json={"Pod": pod, "NodeNames": names}
                    ) as resp:
                        body = await resp.json()
                    latencies.append(time.perf_counter() - t0)
                    if not body.get("NodeNames"):
                        raise RuntimeError(f"filter failed: {body}")
                elapsed = time.perf_counter() - started
        finally:
            await runner.cleanup()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await kube.close()
    return {
        "http_filter_p50_ms": _pct(latencies, 0.5) * 1000,
        "http_filter_p99_ms": _pct(latencies, 0.99) * 1000,
        "pods_per_s": filters / elapsed,
    }


def main() -> None:
    """Run both phases and print the figures; the last line is JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000, help="number of nodes (default 1000)")
    parser.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (default 8)")
    parser.add_argument(
        "--pods", type=int, default=10_000, help="running pods already placed (default 10000)"
    )
    parser.add_argument("--filters", type=int, default=2000, help="in-process filter calls (default 2000)")
    parser.add_argument("--http-filters", type=int, default=300, help="HTTP filter calls (default 300)")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    result: dict[str, Any] = {"nodes": args.nodes, "gpus_per_node": args.gpus_per_node, "pods": args.pods}
    result.update(bench_in_process(args.nodes, args.gpus_per_node, args.pods, args.filters))
    print(
        f"in-process: p50 {result['filter_p50_ms']:.3f} ms, p99 {result['filter_p99_ms']:.3f} ms, "
        f"{result['in_process_pods_per_s']:.0f} pods/s, scheduler peak RSS {result['rss_mib']:.0f} MiB"
    )
    result.update(asyncio.run(bench_http(args.nodes, args.gpus_per_node, args.pods, args.http_filters)))
    result["process_peak_rss_mib"] = _rss_mib()
    print(
        f"http: p50 {result['http_filter_p50_ms']:.2f} ms, p99 {result['http_filter_p99_ms']:.2f} ms, "
        f"{result['pods_per_s']:.0f} pods/s (API server in the same process)"
    )
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()}))


if __name__ == "__main__":
    main()
