"""Watch-fed caches against the embedded API server: sync, callbacks, resume, 410 re-list, scoping."""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import pytest

from hamid.kube.cache import NodeCache, PodCache, ResourceQuotaCache, WatchCache, creation_order, trim_pod
from hamid.kube.client import RESOURCE_QUOTAS, KubeClient, connect
from hamid.kube.errors import Timeout
from hamid.model.kube import Pod
from hamidsim.apiserver import ApiServer
from tests.builders import node, pod, quota
from tests.integration.kube.helpers import Recorder, create_namespace, eventually, fast_backoff


def recorded_cache(cls: type[WatchCache], kube: KubeClient, **kwargs: Any) -> tuple[Any, Recorder]:
    rec = Recorder()
    cache = cls(
        kube,
        on_add=rec.on_add,
        on_update=rec.on_update,
        on_delete=rec.on_delete,
        backoff=fast_backoff(),
        **kwargs,
    )
    return cache, rec


async def test_sync_and_callbacks(kube: KubeClient) -> None:
    await kube.create_pod(pod("before"))
    cache, rec = recorded_cache(PodCache, kube)
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(cache.run())
        await cache.wait_synced(10)
        assert cache.synced
        assert "default/before" in cache
        assert rec.kinds("default/before") == ["add"]

        await kube.create_pod(pod("after"))
        await eventually(lambda: "default/after" in cache)
        await kube.patch_pod_metadata("default", "after", annotations={"x": "1"})
        await eventually(
            lambda: (cache.get("default/after") or {}).get("metadata", {}).get("annotations") == {"x": "1"}
        )
        await kube.delete_pod("default", "after")
        await eventually(lambda: "default/after" not in cache)
        assert rec.kinds("default/after") == ["add", "update", "delete"]
        assert len(cache) == 1
        assert [p["metadata"]["name"] for p in cache.values()] == ["before"]
        assert cache.keys() == ["default/before"]
        task.cancel()


async def test_a_list_is_told_oldest_first_not_in_key_order(kube: KubeClient) -> None:
    """The API server lists by namespace/name; a consumer weighing what it saw by recency (fgd's
    learned workload) must see a list as the watch told it: by creation (then resourceVersion)."""
    for name in ("z", "m", "a"):
        await kube.create_pod(pod(name))
    cache, rec = recorded_cache(PodCache, kube)
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(cache.run())
        await cache.wait_synced(10)
        assert [key for kind, key, _ in rec.events if kind == "add"] == [
            "default/z",
            "default/m",
            "default/a",
        ]
        task.cancel()
    older = {"metadata": {"name": "b", "creationTimestamp": "2024-01-01T00:00:00Z", "resourceVersion": "90"}}
    newer = {"metadata": {"name": "a", "creationTimestamp": "2024-01-01T00:00:01Z", "resourceVersion": "10"}}
    assert creation_order(older) < creation_order(newer)


async def test_records_are_trimmed(kube: KubeClient) -> None:
    created = await kube.create_pod(pod("trim"))
    await kube.patch_pod_status(
        "default",
        "trim",
        {"phase": "Running", "hostIP": "10.0.0.1", "podIPs": [{"ip": "10.1.0.1"}], "conditions": []},
    )
    cache = PodCache(kube, backoff=fast_backoff())
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(cache.run())
        await cache.wait_synced(10)
        record = cache.get("default/trim")
        assert record is not None
        assert record["metadata"]["uid"] == created["metadata"]["uid"]
        assert "managedFields" not in record["metadata"]
        # hostIP and podIPs are trimmed; qosClass (set by the API server on create) is kept.
        assert record["status"] == {"phase": "Running", "conditions": [], "qosClass": "BestEffort"}
        assert record["kind"] == "Pod" and record["apiVersion"] == "v1"
        task.cancel()
    # The trim function itself, on a record carrying managedFields.
    raw = {
        "metadata": {"name": "x", "managedFields": [{"manager": "kubectl"}]},
        "status": {"phase": "Pending"},
    }
    assert trim_pod(raw) == {"metadata": {"name": "x"}, "status": {"phase": "Pending"}}


async def test_wait_synced_times_out_when_the_list_fails(kube: KubeClient, apiserver: Any) -> None:
    apiserver.faults.fail_next(1000, verb="list", path_pattern="/pods", status=500)
    cache = PodCache(kube, backoff=fast_backoff())
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(cache.run())
        with pytest.raises(Timeout):
            await cache.wait_synced(0.3)
        assert not cache.synced
        apiserver.faults.clear()
        await cache.wait_synced(10)
        task.cancel()


async def test_node_scoped_pod_cache(kube: KubeClient) -> None:
    await kube.create_pod(pod("on-n1", node="n1"))
    await kube.create_pod(pod("on-n2", node="n2"))
    await kube.create_pod(pod("unbound"))
    cache, rec = recorded_cache(PodCache, kube, node_name="n1")
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(cache.run())
        await cache.wait_synced(10)
        assert cache.keys() == ["default/on-n1"]
        # Binding a pod to n1 brings it into the scoped cache.
        created = await kube.get_pod("default", "unbound")
        await kube.create_node(node("n1"))
        await kube.bind_pod("default", "unbound", created["metadata"]["uid"], "n1")
        await eventually(lambda: "default/unbound" in cache)
        await kube.create_pod(pod("later-n2", node="n2"))
        await kube.create_pod(pod("later-n1", node="n1"))
        await eventually(lambda: "default/later-n1" in cache)
        assert sorted(cache.keys()) == ["default/later-n1", "default/on-n1", "default/unbound"]
        assert {key for _, key, _ in rec.events} == set(cache.keys())
        task.cancel()


async def test_label_scoped_pod_cache(kube: KubeClient) -> None:
    await kube.create_pod(pod("gpu", labels={"app": "gpu"}))
    await kube.create_pod(pod("cpu", labels={"app": "cpu"}))
    cache, rec = recorded_cache(PodCache, kube, label_selector="app=gpu")
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(cache.run())
        await cache.wait_synced(10)
        assert cache.keys() == ["default/gpu"]
        # Relabelling out of the selector is a delete for this cache.
        await kube.patch_pod_metadata("default", "gpu", labels={"app": "other"})
        await eventually(lambda: len(cache) == 0)
        assert rec.kinds("default/gpu") == ["add", "delete"]
        task.cancel()


async def test_watch_resumes_after_dropped_stream(kube: KubeClient, apiserver: Any) -> None:
    await kube.create_pod(pod("r0"))
    cache, rec = recorded_cache(PodCache, kube)
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(cache.run())
        await cache.wait_synced(10)
        for round_ in range(3):
            apiserver.close_watches()
            await kube.create_pod(pod(f"r{round_ + 1}"))
            await kube.patch_pod_metadata("default", "r0", annotations={"round": str(round_)})
            await eventually(functools.partial(cache.__contains__, f"default/r{round_ + 1}"))
        # A watch that fails a few times with 500 is retried (with backoff) from the same version.
        apiserver.faults.fail_next(3, verb="watch", path_pattern="/pods", status=500)
        apiserver.close_watches()
        await kube.delete_pod("default", "r1")
        await eventually(lambda: "default/r1" not in cache)
        assert cache.relists == 1, "resumed streams must not re-list"
        assert rec.kinds("default/r0") == ["add", "update", "update", "update"]
        assert rec.kinds("default/r1") == ["add", "delete"]
        items, _ = await kube.list_pods()
        assert sorted(cache.keys()) == sorted(f"default/{p['metadata']['name']}" for p in items)
        task.cancel()


async def test_gone_relists_and_emits_differences(kube: KubeClient, apiserver: Any) -> None:
    for name in ("keep", "change", "remove"):
        await kube.create_pod(pod(name))
    cache, rec = recorded_cache(PodCache, kube)
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(cache.run())
        await cache.wait_synced(10)
        # Cut the cache off from watching while things change.
        apiserver.faults.fail_next(100_000, verb="watch", path_pattern="/pods", status=503)
        apiserver.close_watches()
        await kube.patch_pod_metadata("default", "change", annotations={"v": "2"})
        await kube.delete_pod("default", "remove")
        await kube.create_pod(pod("new"))
        # Now its next watch is told its resourceVersion is too old.
        apiserver.faults.clear()
        apiserver.faults.fail_next(1, verb="watch", path_pattern="/pods", status=410)
        await eventually(lambda: cache.relists == 2)
        assert sorted(cache.keys()) == ["default/change", "default/keep", "default/new"]
        assert rec.kinds("default/keep") == ["add"]
        assert rec.kinds("default/change") == ["add", "update"]
        assert rec.kinds("default/remove") == ["add", "delete"]
        assert rec.kinds("default/new") == ["add"]
        # And it keeps watching afterwards.
        await kube.create_pod(pod("after-relist"))
        await eventually(lambda: "default/after-relist" in cache)
        task.cancel()


async def test_node_cache_and_quota_cache(kube: KubeClient) -> None:
    await kube.create_node(node("n-a", allocatable={"cpu": "8"}, capacity={"cpu": "8"}))
    await create_namespace(kube, "q")
    await kube.create(RESOURCE_QUOTAS, quota("rq", "q", {}))
    nodes, node_rec = recorded_cache(NodeCache, kube)
    quotas = ResourceQuotaCache(kube, backoff=fast_backoff())
    async with asyncio.TaskGroup() as tg:
        tasks = [tg.create_task(nodes.run()), tg.create_task(quotas.run())]
        await nodes.wait_synced(10)
        await quotas.wait_synced(10)
        record = nodes.get("n-a")
        assert record is not None and record["status"]["allocatable"] == {"cpu": "8"}
        assert quotas.keys() == ["q/rq"]
        await kube.patch_node_metadata("n-a", annotations={"hami.io/node-nvidia-register": "x"})
        await eventually(lambda: bool((nodes.get("n-a") or {})["metadata"].get("annotations")))
        assert node_rec.kinds("n-a") == ["add", "update"]
        for task in tasks:
            task.cancel()


async def test_callback_errors_do_not_stop_the_cache(kube: KubeClient) -> None:
    seen: list[str] = []

    def broken(obj: Pod) -> None:
        raise RuntimeError("consumer bug")

    cache = PodCache(kube, on_add=broken, backoff=fast_backoff())
    cache.add_handlers(on_add=lambda obj: seen.append(obj["metadata"]["name"]))
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(cache.run())
        await cache.wait_synced(10)
        await kube.create_pod(pod("x1"))
        await kube.create_pod(pod("x2"))
        await eventually(lambda: seen == ["x1", "x2"])
        task.cancel()


async def test_real_gone_from_a_short_history() -> None:
    """The server's bounded history expires the cache's resourceVersion: a true 410, then a re-list."""
    async with ApiServer(history_size=5) as server:
        client = await connect(api_server=server.url, request_timeout=5)
        try:
            await client.create_pod(pod("old"))
            cache, rec = recorded_cache(PodCache, client)
            async with asyncio.TaskGroup() as tg:
                task = tg.create_task(cache.run())
                await cache.wait_synced(10)
                server.faults.fail_next(100_000, verb="watch", status=503)
                server.close_watches()
                for i in range(30):
                    await client.create_pod(pod(f"p{i}"))
                await client.delete_pod("default", "old")
                server.faults.clear()
                await eventually(lambda: cache.relists == 2)
                assert len(cache) == 30
                assert rec.kinds("default/old") == ["add", "delete"]
                assert all(rec.kinds(f"default/p{i}") == ["add"] for i in range(30))
                task.cancel()
        finally:
            await client.close()


async def test_forget_missing_drops_only_objects_older_than_the_list(kube: KubeClient) -> None:
    for name in ("kept", "gone", "late"):
        await kube.create_pod(pod(name))
    cache, rec = recorded_cache(PodCache, kube)
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(cache.run())
        await cache.wait_synced(10)
        items, list_version = await kube.list_pods()
        listed = {f"default/{p['metadata']['name']}" for p in items} - {"default/gone", "default/late"}
        await kube.patch_pod_metadata("default", "late", annotations={"x": "1"})  # changed after the list

        def late_changed() -> bool:
            return "x" in (cache.get("default/late") or {})["metadata"].get("annotations", {})

        await eventually(late_changed)

        assert cache.forget_missing(listed, list_version) == 1

        assert "default/gone" not in cache and "default/late" in cache and "default/kept" in cache
        assert rec.kinds("default/gone") == ["add", "delete"]
        assert cache.forget_missing(listed, list_version) == 0
        task.cancel()


async def test_a_list_is_trimmed_page_by_page(kube: KubeClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cache keeps trimmed records: each page's whole objects are trimmed before the next page
    is asked for, so a re-list of 10,000 pods never holds them all whole (a real scheduler's RSS
    after its first sync fell from 414 to 155 MiB at 1,213 nodes and 10,000 pods)."""
    for i in range(7):
        await kube.create_pod(pod(f"paged-{i}"))
    steps: list[str] = []
    request = kube.request

    async def logged(method: str, path: str, **kwargs: Any) -> Any:
        if method == "GET" and "watch" not in (kwargs.get("query") or {}):
            steps.append("page")
        return await request(method, path, **kwargs)

    def trim(obj: dict[str, Any]) -> Pod:
        steps.append("trim")
        return trim_pod(obj)

    monkeypatch.setattr(kube, "request", logged)
    cache = PodCache(kube, trim=trim, page_size=3, backoff=fast_backoff())
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(cache.run())
        await cache.wait_synced(10)
        task.cancel()
    assert "".join(step[0] for step in steps) == "ptttptttpt"  # p: a page asked for, t: a trim
