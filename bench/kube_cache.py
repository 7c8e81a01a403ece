"""Benchmark: a watch-fed pod cache of lightweight raw-JSON records vs kubernetes-asyncio models.

Run with no arguments (``.venv/bin/python bench/kube_cache.py``). For each variant it starts a
fresh embedded API server (``hamidsim.apiserver``) in a subprocess seeded with 20,000 pods, and
a fresh worker process that

1. syncs a pod cache (paged list of all pods) -> ``sync_20k_s``;
2. stops watching, lets the server apply 10,000 pod updates (annotations and status), then
   resumes the watch from its last resourceVersion and times applying the 10,000 queued watch
   events -> ``events_per_s``;
3. reports its peak RSS -> ``rss_mib`` (and the RSS growth caused by the cache).

Variants: ``light`` = :class:`hamid.kube.cache.PodCache` (trimmed wire-form dicts);
``model`` = ``CoreV1Api.list_pod_for_all_namespaces`` + ``kubernetes_asyncio.watch.Watch``,
keeping deserialized ``V1Pod`` objects (the usual way with generated models).
The last line printed is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import random
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

PODS = 20_000
EVENTS = 10_000
NAMESPACES = 20
NODES = 200
PAGE_SIZE = 500
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchstats import peak_rss_mib, print_figures  # noqa: E402

from hamid.log import configure  # noqa: E402
from hamid.model.kube import Pod  # noqa: E402


def rss_now_mib() -> float:
    """Current resident set size of this process."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * resource.getpagesize() / 2**20


def make_pod(i: int) -> dict[str, Any]:
    """A realistically sized GPU pod with HAMi annotations and a populated status."""
    # Imported here, in the server subprocess only: the worker's RSS is a measured figure.
    from hamid.scheduler.core import DEFAULT_SCHEDULER_NAME

    name = f"worker-{i:05d}"
    namespace = f"team-{i % NAMESPACES:02d}"
    node = f"gpu-node-{i % NODES:03d}"
    containers = [
        {
            "name": f"c{c}",
            "image": "nvcr.io/nvidia/pytorch:24.05-py3",
            "command": ["python", "-m", "train", "--epochs", "10"],
            "env": [{"name": f"VAR_{k}", "value": f"value-{k}"} for k in range(6)],
            "resources": {
                "limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8000", "cpu": "4", "memory": "16Gi"},
                "requests": {"cpu": "4", "memory": "16Gi"},
            },
            "volumeMounts": [
                {"name": "data", "mountPath": "/data"},
                {"name": "shm", "mountPath": "/dev/shm"},
            ],
        }
        for c in range(2)
    ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app": "trainer", "job": f"job-{i // 8}", "tier": "gpu"},
            "annotations": {
                "hami.io/vgpu-node": node,
                "hami.io/vgpu-devices-allocated": f"GPU-{i:08x}-aaaa-bbbb-cccc-000000000000,NVIDIA,8000,30:;",
                "hami.io/bind-phase": "success",
                "hami.io/bind-time": "1735689600",
            },
            "ownerReferences": [
                {"apiVersion": "batch/v1", "kind": "Job", "name": f"job-{i // 8}", "uid": f"u-{i}"}
            ],
        },
        "spec": {
            "schedulerName": DEFAULT_SCHEDULER_NAME,
            "nodeName": node,
            "restartPolicy": "Never",
            "containers": containers,
            "volumes": [{"name": "data", "emptyDir": {}}, {"name": "shm", "emptyDir": {"medium": "Memory"}}],
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        },
        "status": {
            "phase": "Running",
            "qosClass": "Guaranteed",
            "hostIP": "10.0.0.1",
            "podIP": f"10.1.{i // 250}.{i % 250}",
            "podIPs": [{"ip": f"10.1.{i // 250}.{i % 250}"}],
            "startTime": "2025-01-01T00:00:00Z",
            "conditions": [
                {"type": t, "status": "True", "lastTransitionTime": "2025-01-01T00:00:00Z"}
                for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")
            ],
            "containerStatuses": [
                {
                    "name": f"c{c}",
                    "ready": True,
                    "restartCount": 0,
                    "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                    "imageID": "sha256:" + "ab" * 32,
                    "containerID": f"containerd://{i:064x}",
                    "started": True,
                    "state": {"running": {"startedAt": "2025-01-01T00:00:01Z"}},
                }
                for c in range(2)
            ],
        },
    }


# --- server subprocess ------------------------------------------------------------------------


async def serve() -> None:
    """Seed an embedded API server, print its URL, then obey ``churn N`` / ``quit`` on stdin."""
    from hamidsim.apiserver import ApiServer

    async with ApiServer(history_size=4 * EVENTS) as server:
        for i in range(PODS):
            server.put(make_pod(i))
        print(server.url, flush=True)
        rng = random.Random(1)
        while True:
            line = (await asyncio.to_thread(sys.stdin.readline)).split()
            if not line or line[0] == "quit":
                return
            count = int(line[1])
            for n in range(count):
                # A unique value each time, so every patch is a real change (one watch event each).
                i = rng.randrange(PODS)
                namespace, name = f"team-{i % NAMESPACES:02d}", f"worker-{i:05d}"
                server.patch("pods", namespace, name, {"metadata": {"annotations": {"hami.io/seq": str(n)}}})
            print(server.resource_version, flush=True)


# --- worker subprocess ------------------------------------------------------------------------


async def light_worker(url: str) -> dict[str, Any]:
    """Lightweight records: hamid's PodCache."""
    from hamid.kube.cache import PodCache
    from hamid.kube.client import connect

    client = await connect(api_server=url, request_timeout=120)
    gc.collect()
    base = rss_now_mib()
    target = 0
    caught_up = asyncio.Event()

    def on_change(*objs: Pod) -> None:
        if int(objs[-1]["metadata"]["resourceVersion"]) >= target > 0:
            caught_up.set()

    cache = PodCache(client, page_size=PAGE_SIZE, on_update=on_change)
    started = time.perf_counter()
    task = asyncio.create_task(cache.run())
    await cache.wait_synced(600)
    sync_s = time.perf_counter() - started
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert len(cache) == PODS, len(cache)
    target = await handshake()
    started = time.perf_counter()
    task = asyncio.create_task(cache.run())
    await asyncio.wait_for(caught_up.wait(), 600)
    events_s = time.perf_counter() - started
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    gc.collect()
    result = {"sync_s": sync_s, "events_s": events_s, "cache_mib": rss_now_mib() - base, "count": len(cache)}
    await client.close()
    return result


async def model_worker(url: str) -> dict[str, Any]:
    """Generated models: CoreV1Api list + kubernetes_asyncio Watch, keeping V1Pod objects."""
    from kubernetes_asyncio.client import CoreV1Api
    from kubernetes_asyncio.watch import Watch

    from hamid.kube.client import connect

    client = await connect(api_server=url, request_timeout=120)
    api = CoreV1Api(client.api_client)
    gc.collect()
    base = rss_now_mib()
    pods: dict[str, Any] = {}
    started = time.perf_counter()
    continue_token: str | None = None
    resource_version = ""
    while True:
        page = await api.list_pod_for_all_namespaces(
            limit=PAGE_SIZE,
            _continue=continue_token,  # type: ignore[arg-type]  # None is its default; the annotation omits it
            _request_timeout=120,
        )
        resource_version = resource_version or page.metadata.resource_version
        for pod in page.items:
            pods[f"{pod.metadata.namespace}/{pod.metadata.name}"] = pod
        continue_token = page.metadata._continue
        if not continue_token:
            break
    sync_s = time.perf_counter() - started
    assert len(pods) == PODS, len(pods)
    target = await handshake()
    started = time.perf_counter()
    watch = Watch()
    async with watch.stream(
        api.list_pod_for_all_namespaces, resource_version=resource_version, timeout_seconds=600
    ) as stream:
        async for event in stream:
            pod = event["object"]
            key = f"{pod.metadata.namespace}/{pod.metadata.name}"
            if event["type"] == "DELETED":
                pods.pop(key, None)
            else:
                pods[key] = pod
            if int(pod.metadata.resource_version) >= target:
                break
    events_s = time.perf_counter() - started
    gc.collect()
    result = {"sync_s": sync_s, "events_s": events_s, "cache_mib": rss_now_mib() - base, "count": len(pods)}
    await client.close()
    return result


async def handshake() -> int:
    """Tell the orchestrator the cache is synced; read back the resourceVersion to catch up to."""
    print("synced", flush=True)
    return int(await asyncio.to_thread(sys.stdin.readline))


def worker(variant: str, url: str) -> None:
    """Run one variant and print its figures as JSON."""
    configure(level="warning")
    run = light_worker if variant == "light" else model_worker
    result = asyncio.run(run(url))
    result["rss_peak_mib"] = peak_rss_mib()
    print(json.dumps(result), flush=True)


# --- orchestrator -----------------------------------------------------------------------------


def spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=REPO,
    )


def send(proc: subprocess.Popen[str], line: str) -> None:
    assert proc.stdin is not None
    proc.stdin.write(line + "\n")
    proc.stdin.flush()


def read(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"{proc.args!r} exited early with code {proc.wait()}")
    return line.strip()


def measure(variant: str) -> dict[str, Any]:
    """One variant against its own freshly seeded server."""
    server = spawn("--role", "server")
    try:
        url = read(server)
        work = spawn("--role", "worker", "--variant", variant, "--url", url)
        try:
            while read(work) != "synced":
                continue
            send(server, f"churn {EVENTS}")
            send(work, read(server))
            figures: dict[str, Any] = json.loads(read(work))
            return figures
        finally:
            work.kill()
            work.wait()
    finally:
        send(server, "quit")
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def main() -> None:
    """Measure both variants, print a table and the JSON summary line."""
    results = {variant: measure(variant) for variant in ("light", "model")}
    rows = [
        ("sync 20k pods (s)", "sync_s", "{:.2f}"),
        ("apply 10k watch events (events/s)", "events_s", None),
        ("peak RSS (MiB)", "rss_peak_mib", "{:.0f}"),
        ("RSS held by the cache (MiB)", "cache_mib", "{:.0f}"),
    ]
    print(f"pod cache, {PODS} pods, {EVENTS} watch events (embedded API server in a subprocess)")
    print(f"{'':36} {'light records':>14} {'V1Pod models':>14}")
    for label, key, fmt in rows:
        cells = []
        for variant in ("light", "model"):
            value = results[variant][key]
            cells.append(f"{EVENTS / value:.0f}" if fmt is None else fmt.format(value))
        print(f"{label:36} {cells[0]:>14} {cells[1]:>14}")
    light, model = results["light"], results["model"]
    summary = {
        "pods": PODS,
        "events": EVENTS,
        "sync_20k_s": round(light["sync_s"], 3),
        "events_per_s": round(EVENTS / light["events_s"]),
        "rss_mib": round(light["rss_peak_mib"], 1),
        "cache_mib": round(light["cache_mib"], 1),
        "model_sync_20k_s": round(model["sync_s"], 3),
        "model_events_per_s": round(EVENTS / model["events_s"]),
        "model_rss_mib": round(model["rss_peak_mib"], 1),
        "model_cache_mib": round(model["cache_mib"], 1),
    }
    print_figures(summary)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--role", choices=("main", "server", "worker"), default="main", help=argparse.SUPPRESS
    )
    parser.add_argument("--variant", choices=("light", "model"), default="light", help=argparse.SUPPRESS)
    parser.add_argument("--url", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "server":
        configure(level="warning")
        asyncio.run(serve())
    elif args.role == "worker":
        worker(args.variant, args.url)
    else:
        main()
