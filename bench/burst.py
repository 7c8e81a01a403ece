"""Burst benchmark: N GPU pods to one node through ``/filter`` and ``/bind``, as kube-scheduler sends them.

Runs the whole stack in-process on the simulator (:class:`~hamidsim.cluster.SimCluster`: embedded
API server, ``hamid scheduler``, simulated kubelet with the real plugin; no refit, no NUMA
publisher, so the node sees only the lock's traffic). The kube-scheduler stand-in is replaced by
kube-scheduler's own shape of a burst: the scheduling cycle is serial (one ``/filter`` at a time,
every pod to the one node), the binding cycle asynchronous (each ``/bind`` sent at once, so up to
N binds wait on the node lock together). A failed bind is filtered and bound again, as
kube-scheduler requeues it. Each size runs on a fresh cluster.

Figures per size: bound pods/s (first filter to last bind answer), node API calls per bound pod
(GET and PATCH of the Node object as the API server received them, scheduler and plugin together;
the kubelet's status heartbeat excluded), pod API calls per bound pod (every request about the
burst's pods, by verb and subresource, every writer's), time to all pods Running, bind retries;
peak RSS of the process (the whole stack runs in it). Usage: ``python bench/burst.py`` (sizes 40
and 80, under 5 minutes); ``--sizes 40,80,160``. The last output line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import Counter
from typing import Any

import aiohttp
from benchstats import peak_rss_mib, print_figures

from hamid.log import configure

configure("json", "error")  # before the modules below bind their loggers

from hamid.model import objects  # noqa: E402
from hamidsim.cluster import ClusterOptions, NodeSpec, SimCluster, wait_until  # noqa: E402

NODE = "burst-node"
GPUS = 8  # the demo machine's
GPU_MEM_MIB = 100
#: How often a pod whose bind failed is filtered and bound again before the run fails.
RETRIES = 5


def burst_pod(index: int) -> dict[str, Any]:
    """A one-GPU pod without CPU requests (BestEffort: only the device manager admits it)."""
    limits = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": GPU_MEM_MIB}
    return {
        "metadata": {"name": f"burst-{index}", "namespace": "default"},
        "spec": {"containers": [{"name": "work", "image": "cuda", "resources": {"limits": limits}}]},
    }


async def _post(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> dict[str, Any]:
    async with session.post(url, json=body) as resp:
        answer: dict[str, Any] = await resp.json(content_type=None)
        if resp.status != 200:
            raise RuntimeError(f"{url} answered {resp.status}: {answer}")
        return answer


async def schedule(session: aiohttp.ClientSession, base: str, pod: dict[str, Any]) -> None:
    """One scheduling cycle: ``/filter`` with the one node; raises when the node does not fit."""
    answer = await _post(session, base + "/filter", {"Pod": pod, "NodeNames": [NODE]})
    if answer.get("Error") or NODE not in (answer.get("NodeNames") or []):
        raise RuntimeError(f"filter of {objects.name(pod)}: {answer}")


async def bind(session: aiohttp.ClientSession, base: str, pod: dict[str, Any]) -> str:
    """One binding cycle; the extender's error ("" when bound)."""
    body = {"PodName": objects.name(pod), "PodNamespace": "default", "PodUID": objects.uid(pod), "Node": NODE}
    answer = await _post(session, base + "/bind", body)
    return str(answer.get("Error") or "")


def count_calls(cluster: SimCluster) -> Counter[str]:
    """Count GET and PATCH of the Node object itself (``node <verb>``; not ``/status``: the
    kubelet's heartbeat) and every request about one of the burst's pods (``pod <verb>``, or
    ``pod/<subresource> <verb>``; every writer's: scheduler, plugin, kubelet).

    Hooked into the API server's per-request fault check, which sees every request's verb and path.
    """
    calls: Counter[str] = Counter()
    faults = cluster.server.faults
    inner = faults.before
    node_path, pod_prefix = f"/api/v1/nodes/{NODE}", "/api/v1/namespaces/default/pods/burst-"

    async def before(verb: str, method: str, path: str) -> None:
        if path == node_path:
            calls[f"node {verb}"] += 1
        elif path.startswith(pod_prefix):
            parts = path[len(pod_prefix) :].split("/")
            calls[f"pod{'/' + parts[1] if len(parts) > 1 else ''} {verb}"] += 1
        await inner(verb, method, path)

    faults.before = before  # type: ignore[method-assign]
    return calls


async def burst(size: int) -> dict[str, Any]:
    """Run one burst of ``size`` pods on a fresh cluster; its figures."""
    split = max(10, -(-size // GPUS))
    options = ClusterOptions(
        nodes=(NodeSpec(NODE, split=split),), refit=False, numa_publish=False, kube_scheduler=False
    )
    async with SimCluster(options) as cluster, aiohttp.ClientSession() as session:
        base = cluster.extender_url
        pods = [await cluster.create_pod(burst_pod(i)) for i in range(size)]
        keys = [objects.namespaced_key(p) for p in pods]
        await wait_until(
            lambda: all(cluster.scheduler.pods.get(k) is not None for k in keys), 30, "pod cache"
        )
        calls = count_calls(cluster)
        retries = 0

        async def bind_until_bound(pod: dict[str, Any]) -> None:
            nonlocal retries
            for _ in range(RETRIES):
                error = await bind(session, base, pod)
                if not error:
                    return
                retries += 1
                await schedule(session, base, pod)
            raise RuntimeError(f"bind of {objects.name(pod)} kept failing: {error}")

        started = time.perf_counter()
        async with asyncio.TaskGroup() as binds:
            for pod in pods:
                await schedule(session, base, pod)
                binds.create_task(bind_until_bound(pod))
        bound_s = time.perf_counter() - started

        def all_running() -> bool:
            return all(
                objects.section(cluster.pod(objects.name(p)), "status").get("phase") == "Running"
                for p in pods
            )

        await wait_until(all_running, 120, "all pods Running")
        running_s = time.perf_counter() - started
    gets, patches = calls["node get"], calls["node patch"]
    pod_calls = {k: v for k, v in sorted(calls.items()) if k.startswith("pod")}
    return {
        "pods": size,
        "pods_per_s": round(size / bound_s, 1),
        "node_gets_per_pod": round(gets / size, 2),
        "node_patches_per_pod": round(patches / size, 2),
        "node_calls_per_pod": round((gets + patches) / size, 2),
        "pod_calls_per_pod": round(sum(pod_calls.values()) / size, 2),
        "pod_calls_by_kind_per_pod": {k: round(v / size, 2) for k, v in pod_calls.items()},
        "bind_retries": retries,
        "all_bound_s": round(bound_s, 2),
        "all_running_s": round(running_s, 2),
    }


async def main(sizes: list[int]) -> dict[str, Any]:
    results = []
    for size in sizes:
        figures = await burst(size)
        results.append(figures)
        print(
            f"{size} pods to one node: {figures['pods_per_s']} pods/s bound, "
            f"node calls per pod {figures['node_calls_per_pod']} "
            f"({figures['node_gets_per_pod']} GET, {figures['node_patches_per_pod']} PATCH), "
            f"pod calls per pod {figures['pod_calls_per_pod']} {figures['pod_calls_by_kind_per_pod']}, "
            f"all bound in {figures['all_bound_s']} s, all Running in {figures['all_running_s']} s, "
            f"{figures['bind_retries']} bind retries",
            flush=True,
        )
    out: dict[str, Any] = {f"n{r['pods']}_{k}": v for r in results for k, v in r.items() if k != "pods"}
    out["sizes"] = sizes
    out["peak_rss_mib"] = round(peak_rss_mib(), 1)
    out["target"] = "node calls per pod constant in the burst size"
    print(f"peak RSS {out['peak_rss_mib']} MiB (whole stack in this process)")
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="40,80", help="comma-separated burst sizes (default 40,80)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    if not sizes or min(sizes) < 1:
        parser.error("--sizes needs positive integers")
    print_figures(asyncio.run(main(sizes)))
