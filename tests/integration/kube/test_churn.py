"""Churn: 5,000 pod updates (with dropped streams and a 410) leave every cache equal to a fresh list."""

from __future__ import annotations

import asyncio
import random
from typing import Any

from hamid.kube.cache import NodeCache, PodCache, WatchCache, trim_node, trim_pod
from hamid.kube.client import KubeClient
from tests.builders import node, pod
from tests.integration.kube.helpers import create_namespace, eventually, fast_backoff

UPDATES = 5_000
PODS = 150
CONCURRENCY = 64


class Mirror:
    """A consumer that keeps its own pod-UID-keyed state from callbacks alone."""

    def __init__(self, cache: WatchCache) -> None:
        self.by_uid: dict[str, str] = {}
        cache.add_handlers(on_add=self.add, on_update=self.update, on_delete=self.delete)

    def add(self, obj: dict[str, Any]) -> None:
        uid = obj["metadata"]["uid"]
        assert uid not in self.by_uid, "add for a UID already present"
        self.by_uid[uid] = obj["metadata"]["resourceVersion"]

    def update(self, old: dict[str, Any], new: dict[str, Any]) -> None:
        assert self.by_uid.get(old["metadata"]["uid"]) == old["metadata"]["resourceVersion"]
        self.by_uid[new["metadata"]["uid"]] = new["metadata"]["resourceVersion"]

    def delete(self, obj: dict[str, Any]) -> None:
        assert self.by_uid.pop(obj["metadata"]["uid"], None) is not None, "delete of an unknown UID"


def snapshot(items: list[dict[str, Any]], trim: Any) -> dict[str, dict[str, Any]]:
    out = {}
    for item in items:
        meta = item["metadata"]
        key = f"{meta['namespace']}/{meta['name']}" if meta.get("namespace") else meta["name"]
        out[key] = trim(item)
    return out


async def test_churn_leaves_caches_equal_to_a_fresh_list(kube: KubeClient, apiserver: Any) -> None:
    rng = random.Random(7)
    await create_namespace(kube, "churn")
    for name in ("n1", "n2"):
        await kube.create_node(node(name))
    names = [f"p{i}" for i in range(PODS)]

    def placed(name: str) -> str | None:
        return ("n1", "n2", None)[int(name[1:]) % 3]

    await asyncio.gather(*(kube.create_pod(pod(n, "churn", node=placed(n))) for n in names))

    all_pods = PodCache(kube, namespace="churn", backoff=fast_backoff())
    on_n1 = PodCache(kube, node_name="n1", backoff=fast_backoff())
    nodes = NodeCache(kube, backoff=fast_backoff())
    mirror_all, mirror_n1 = Mirror(all_pods), Mirror(on_n1)
    semaphore = asyncio.Semaphore(CONCURRENCY)

    async def one_update(i: int) -> None:
        name = rng.choice(names)
        async with semaphore:
            if i % 97 == 0:
                await kube.patch_node_metadata(rng.choice(["n1", "n2"]), annotations={"beat": str(i)})
            elif i % 7 == 0:
                await kube.patch_pod_status("churn", name, {"phase": rng.choice(["Pending", "Running"])})
            else:
                await kube.patch_pod_metadata("churn", name, annotations={"seq": str(i), "gone": None})

    async with asyncio.TaskGroup() as tg:
        tasks = [tg.create_task(c.run()) for c in (all_pods, on_n1, nodes)]
        for cache in (all_pods, on_n1, nodes):
            await cache.wait_synced(10)
        step = 1_000
        for start in range(0, UPDATES, step):
            # Concurrent writes to one pod may race: fine, the last one wins on the server too.
            await asyncio.gather(*(one_update(i) for i in range(start, start + step)))
            for name in rng.sample(names, 2):
                # Delete and recreate under the same name: a new UID behind the same key.
                await kube.delete_pod("churn", name)
                await kube.create_pod(pod(name, "churn", node=placed(name)))
            if start == 2_000:
                apiserver.faults.fail_next(1, verb="watch", status=410)
            apiserver.close_watches()

        pods_now, _ = await kube.list_pods("churn")
        n1_now, _ = await kube.list_pods(field_selector="spec.nodeName=n1")
        nodes_now, _ = await kube.list_nodes()
        expected = {
            "all": snapshot(pods_now, trim_pod),
            "n1": snapshot(n1_now, trim_pod),
            "nodes": snapshot(nodes_now, trim_node),
        }

        def matches() -> bool:
            return (
                {k: all_pods.get(k) for k in all_pods} == expected["all"]
                and {k: on_n1.get(k) for k in on_n1} == expected["n1"]
                and {k: nodes.get(k) for k in nodes} == expected["nodes"]
            )

        await eventually(matches, within=30, what="caches equal to a fresh list")
        assert len(expected["all"]) == PODS
        assert len(expected["n1"]) == PODS // 3
        # The callback-fed consumers are exact too.
        assert mirror_all.by_uid == {p["metadata"]["uid"]: p["metadata"]["resourceVersion"] for p in pods_now}
        assert mirror_n1.by_uid == {p["metadata"]["uid"]: p["metadata"]["resourceVersion"] for p in n1_now}
        assert all_pods.relists >= 2, "the injected 410 forces a re-list"
        for task in tasks:
            task.cancel()
