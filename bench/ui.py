"""``/ui`` benchmark: time per page at cluster scale, in-process and over HTTP on loopback.

The scheduler's state is built as ``bench/filter.py`` builds it (its nodes with NUMA profiles, its
realistic running pods with observed placements, trimmed as the pod cache keeps them), and the
view's pod index is fed the same pods. Then each page is requested many times: the cluster page
(a random sort column, direction and page), a random node's page, a random pod's page and the
cluster page's refresh stamp. In-process times the page's rendering (what one request costs the
event loop), as wall time and as CPU time (which other processes on a busy machine do not
inflate); HTTP adds aiohttp's serving through the real ``/ui`` routes. The cluster page reads the
background snapshot; its builds (which no request waits for) are timed separately.
Default 1,000 nodes x 10,000 pods; ``--nodes 5000 --pods 50000`` is the large size (the target: a
page's p99 <= 50 ms in-process). The last output line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web
from benchstats import peak_rss_mib, percentile, print_figures
from filter import _node, _running, _shrink, numa_profile

from hamid.listen import serve
from hamid.log import configure
from hamid.model.kube import Pod
from hamid.model.numa import encode_profile
from hamid.scheduler.core import Scheduler, SchedulerSettings
from hamid.scheduler.podtrim import trim_scheduler_pod
from hamid.scheduler.ui.pages import ClusterQuery, cluster_page, cluster_stamp, node_page, pod_page
from hamid.scheduler.ui.routes import SNAPSHOTS_KEY, add_ui, document
from hamid.scheduler.ui.snapshot import Snapshots
from hamid.scheduler.ui.source import PodIndex, UiSource

PAGES = ("cluster", "node", "pod", "stamp")


class _Pods:
    """The pod cache's lookups (the bench feeds the index itself)."""

    def __init__(self) -> None:
        self.items: dict[str, Pod] = {}

    def get(self, key: str) -> Pod | None:
        return self.items.get(key)

    def add_handlers(self, on_add: Any = None, on_update: Any = None, on_delete: Any = None) -> None:
        return None


def build(nodes: int, gpus: int, pods: int) -> tuple[UiSource, list[str], list[str]]:
    """A scheduler state and the view's source over it; the node names and pod keys."""
    rng = random.Random(1)
    scheduler = Scheduler(None, settings=SchedulerSettings())  # type: ignore[arg-type]  # no API calls here
    shrink = _shrink(nodes, gpus, pods)
    profile = encode_profile(numa_profile(time.time()))
    names = []
    for i in range(nodes):
        node = _node(i, gpus, shrink, profile)
        scheduler._node_seen(node)
        names.append(node["metadata"]["name"])
    feed, index = _Pods(), PodIndex()
    for i in range(pods):
        running = _running(i, nodes, gpus, rng, shrink, placement=True)
        running["metadata"]["resourceVersion"] = str(1000 + i)
        pod = trim_scheduler_pod(json.loads(json.dumps(running)))
        feed.items[f"default/run-{i}"] = pod
        scheduler._pod_seen(pod)
        index.put(pod)
    source = UiSource(scheduler.ledger, scheduler.numa, feed, index, scheduler.metrics, scheduler.history)
    return source, names, list(feed.items)


def _paths(rng: random.Random, names: list[str], keys: list[str], pages: int) -> dict[str, Callable[[], str]]:
    def cluster() -> str:
        sort = rng.choice(("name", "gpus", "allocated", "idle", "stranded", "aligned", "unaligned", "pods"))
        return f"/ui?sort={sort}&order={rng.choice(('asc', 'desc'))}&page={rng.randint(1, pages)}"

    return {
        "cluster": cluster,
        "node": lambda: f"/ui/node/{rng.choice(names)}",
        "pod": lambda: "/ui/pod/" + rng.choice(keys),
        "stamp": lambda: "/ui/api/stamp/cluster",
    }


async def bench_in_process(
    source: UiSource, names: list[str], keys: list[str], requests: int
) -> dict[str, Any]:
    """Render each page ``requests`` times (as one request does); p50/p99 per page in ms."""
    rng = random.Random(2)
    snapshots = Snapshots(source)
    t0, c0 = time.perf_counter(), time.process_time()
    await snapshots.refresh()
    build_ms, build_cpu_ms = (time.perf_counter() - t0) * 1000, (time.process_time() - c0) * 1000
    t0, c0 = time.perf_counter(), time.process_time()
    await snapshots.refresh()  # the steady state: the figures of unchanged nodes are reused
    rebuild_ms, rebuild_cpu_ms = (time.perf_counter() - t0) * 1000, (time.process_time() - c0) * 1000
    pages = max(1, -(-len(names) // 50))

    async def cluster() -> str:
        query = ClusterQuery(
            rng.choice(("name", "gpus", "stranded", "unaligned")), rng.random() < 0.5, rng.randint(1, pages)
        )
        return document(cluster_page(source, await snapshots.get(), query, ""), "")

    async def node() -> str:
        return document(node_page(source, rng.choice(names), "../../"), "../../")

    async def pod() -> str:
        namespace, _, name = rng.choice(keys).partition("/")
        return document(pod_page(source, namespace, name, "../../../"), "../../../")

    async def stamp() -> str:
        return cluster_stamp(source, await snapshots.get())

    renders: dict[str, Callable[[], Awaitable[str]]] = {
        "cluster": cluster,
        "node": node,
        "pod": pod,
        "stamp": stamp,
    }
    figures: dict[str, Any] = {
        "snapshot_build_ms": build_ms,
        "snapshot_build_cpu_ms": build_cpu_ms,
        "snapshot_rebuild_ms": rebuild_ms,
        "snapshot_rebuild_cpu_ms": rebuild_cpu_ms,
    }
    for page, render in renders.items():
        times, cpu = [], []
        for _ in range(requests):
            t0, c0 = time.perf_counter(), time.process_time()
            await render()
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        for q in (50, 99):
            figures[f"{page}_p{q}_ms"] = percentile(times, q / 100) * 1000
            figures[f"{page}_cpu_p{q}_ms"] = percentile(cpu, q / 100) * 1000
    return figures


async def bench_http(source: UiSource, names: list[str], keys: list[str], requests: int) -> dict[str, Any]:
    """The same pages through the real ``/ui`` routes on a loopback listener."""
    app = web.Application()
    add_ui(app, source)
    runner, port = await serve(app, "127.0.0.1:0", None, what="ui bench")
    rng = random.Random(3)
    paths = _paths(rng, names, keys, max(1, -(-len(names) // 50)))
    figures: dict[str, Any] = {}
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/ui") as resp:  # starts the first build
                assert resp.status == 200, await resp.text()
            await app[SNAPSHOTS_KEY].built()
            for page in PAGES:
                times = []
                for _ in range(requests):
                    t0 = time.perf_counter()
                    async with session.get(f"http://127.0.0.1:{port}{paths[page]()}") as resp:
                        await resp.read()
                        assert resp.status == 200, resp.status
                    times.append(time.perf_counter() - t0)
                figures[f"http_{page}_p50_ms"] = percentile(times, 0.5) * 1000
                figures[f"http_{page}_p99_ms"] = percentile(times, 0.99) * 1000
    finally:
        await runner.cleanup()
    return figures


def main() -> None:
    """Build, time both phases, print the figures; the last line is JSON."""
    configure("json", "error")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000, help="number of nodes (default 1000)")
    parser.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (default 8)")
    parser.add_argument("--pods", type=int, default=10_000, help="running pods (default 10000)")
    parser.add_argument("--requests", type=int, default=300, help="requests per page and phase (default 300)")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    t0 = time.perf_counter()
    source, names, keys = build(args.nodes, args.gpus_per_node, args.pods)
    result: dict[str, Any] = {"nodes": args.nodes, "gpus_per_node": args.gpus_per_node, "pods": args.pods}
    result["build_s"] = time.perf_counter() - t0
    result.update(asyncio.run(bench_in_process(source, names, keys, args.requests)))
    result.update(asyncio.run(bench_http(source, names, keys, args.requests)))
    result["rss_mib"] = peak_rss_mib()
    for page in PAGES:
        r = {k.removeprefix(f"{page}_"): v for k, v in result.items() if k.startswith(f"{page}_")}
        h = {k.removeprefix(f"http_{page}_"): v for k, v in result.items() if k.startswith(f"http_{page}_")}
        print(
            f"{page:8s} in-process p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms "
            f"(CPU p50 {r['cpu_p50_ms']:.2f} ms, p99 {r['cpu_p99_ms']:.2f} ms); "
            f"HTTP p50 {h['p50_ms']:.2f} ms, p99 {h['p99_ms']:.2f} ms"
        )
    print(
        f"cluster snapshot (background): first build {result['snapshot_build_ms']:.0f} ms "
        f"(CPU {result['snapshot_build_cpu_ms']:.0f} ms), rebuild {result['snapshot_rebuild_ms']:.0f} ms "
        f"(CPU {result['snapshot_rebuild_cpu_ms']:.0f} ms); peak RSS {result['rss_mib']:.0f} MiB"
    )
    print_figures(result)


if __name__ == "__main__":
    main()
