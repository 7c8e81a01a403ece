"""Watch through kubernetes-asyncio's Watch: resume from a resourceVersion, 410, bookmarks, selectors."""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import pytest
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from hamidsim.apiserver import ApiServer
from tests.builders import pod


async def collect(stream: Any, count: int, limit_s: float = 5.0) -> list[tuple[str, str]]:
    """The first ``count`` (type, name) pairs of a watch stream."""
    events: list[tuple[str, str]] = []

    async def run() -> None:
        async for event in stream:
            meta = event["raw_object"]["metadata"]
            events.append((event["type"], meta.get("name", meta["resourceVersion"])))
            if len(events) == count:
                return

    await asyncio.wait_for(run(), limit_s)
    return events


async def test_watch_from_resource_version_and_resume(core: client.CoreV1Api, apiserver: ApiServer) -> None:
    apiserver.put(pod("before"))
    listed = await core.list_namespaced_pod("default")
    start = listed.metadata.resource_version
    apiserver.put(pod("after"))
    apiserver.patch("Pod", "default", "after", {"metadata": {"labels": {"x": "y"}}})
    apiserver.delete("Pod", "default", "before")
    w = watch.Watch()
    async with w:
        events = await collect(w.stream(core.list_namespaced_pod, "default", resource_version=start), 3)
    assert events == [("ADDED", "after"), ("MODIFIED", "after"), ("DELETED", "before")]
    resume_from = w.resource_version
    assert resume_from == str(apiserver.resource_version)

    apiserver.put(pod("later"))
    w2 = watch.Watch()
    async with w2:
        events = await collect(
            w2.stream(core.list_namespaced_pod, "default", resource_version=resume_from), 1
        )
    assert events == [("ADDED", "later")]


async def test_live_events_and_timeout(core: client.CoreV1Api, apiserver: ApiServer) -> None:
    w = watch.Watch()
    stream = w.stream(
        core.list_namespaced_pod,
        "default",
        resource_version=str(apiserver.resource_version),
        timeout_seconds=1,
    )

    async def writer() -> None:
        await asyncio.sleep(0.05)
        await core.create_namespaced_pod("default", pod("live"))
        await core.delete_namespaced_pod("live", "default")

    task = asyncio.create_task(writer())
    events = []
    async with w:
        async for event in stream:
            events.append((event["type"], event["object"].metadata.name))
    await task
    assert events == [("ADDED", "live"), ("DELETED", "live")]


async def test_watch_without_resource_version_starts_with_state(
    core: client.CoreV1Api, apiserver: ApiServer
) -> None:
    apiserver.put(pod("one"))
    apiserver.put(pod("two"))
    w = watch.Watch()
    async with w:
        events = await collect(w.stream(core.list_namespaced_pod, "default", timeout_seconds=2), 2)
    assert sorted(events) == [("ADDED", "one"), ("ADDED", "two")]


async def test_too_old_resource_version_is_410() -> None:
    async with (
        ApiServer(history_size=3) as server,
        client.ApiClient(client.Configuration(host=server.url)) as small,
    ):
        core = client.CoreV1Api(small)
        for i in range(10):
            server.put(pod(f"p{i}"))
        w = watch.Watch()
        with pytest.raises(ApiException) as err:
            async with w:
                await collect(w.stream(core.list_namespaced_pod, "default", resource_version="1"), 1)
        assert err.value.status == 410
        raw = await core.list_namespaced_pod(
            "default", watch=True, resource_version="1", _preload_content=False
        )
        line = await raw.content.readline()
        raw.release()
        assert b'"type":"ERROR"' in line
        assert b'"code":410' in line
        assert b'"reason":"Expired"' in line
        recent = str(server.resource_version - 1)
        w2 = watch.Watch()
        async with w2:
            events = await collect(w2.stream(core.list_namespaced_pod, "default", resource_version=recent), 1)
        assert events == [("ADDED", "p9")]


async def test_bookmarks(core: client.CoreV1Api, apiserver: ApiServer) -> None:
    w = watch.Watch()
    async with w:
        events = await collect(
            w.stream(
                core.list_namespaced_pod,
                "default",
                resource_version=str(apiserver.resource_version),
                allow_watch_bookmarks=True,
                timeout_seconds=5,
            ),
            1,
        )
    assert events == [("BOOKMARK", str(apiserver.resource_version))]


async def test_send_initial_events_ends_with_bookmark(core: client.CoreV1Api, apiserver: ApiServer) -> None:
    apiserver.put(pod("x"))
    raw = await core.list_namespaced_pod(
        "default",
        watch=True,
        send_initial_events=True,
        resource_version_match="NotOlderThan",
        allow_watch_bookmarks=True,
        timeout_seconds=2,
        _preload_content=False,
    )
    first = await asyncio.wait_for(raw.content.readline(), 5)
    second = await asyncio.wait_for(raw.content.readline(), 5)
    raw.release()
    assert b'"type":"ADDED"' in first
    assert b'"type":"BOOKMARK"' in second
    assert b"k8s.io/initial-events-end" in second


async def test_selectors_apply_to_watch_events(core: client.CoreV1Api, apiserver: ApiServer) -> None:
    start = str(apiserver.resource_version)
    apiserver.put(pod("p", node=None, labels={"app": "a"}))
    apiserver.patch("Pod", "default", "p", {"spec": {"nodeName": "n1"}})
    apiserver.patch("Pod", "default", "p", {"metadata": {"labels": {"app": "b"}}})
    apiserver.put(pod("q", node="n2", labels={"app": "a"}))
    w = watch.Watch()
    async with w:
        node_events = await collect(
            w.stream(
                core.list_pod_for_all_namespaces, field_selector="spec.nodeName=n1", resource_version=start
            ),
            2,
        )
    assert node_events == [("ADDED", "p"), ("MODIFIED", "p")]
    w2 = watch.Watch()
    async with w2:
        label_events = await collect(
            w2.stream(core.list_namespaced_pod, "default", label_selector="app=a", resource_version=start), 3
        )
    assert label_events == [("ADDED", "p"), ("MODIFIED", "p"), ("DELETED", "p")]


async def test_close_watches_ends_streams(core: client.CoreV1Api, apiserver: ApiServer) -> None:
    raw = await core.list_namespaced_pod(
        "default", watch=True, resource_version=str(apiserver.resource_version), _preload_content=False
    )
    await asyncio.sleep(0.05)
    assert apiserver.close_watches("pods") == 1
    assert await asyncio.wait_for(raw.content.readline(), 5) == b""
    raw.release()
    assert apiserver.stats()["watchers"]["pods"] == 0


async def test_client_disconnect_frees_the_watcher(core: client.CoreV1Api, apiserver: ApiServer) -> None:
    raw = await core.list_namespaced_pod(
        "default", watch=True, resource_version=str(apiserver.resource_version), _preload_content=False
    )
    await asyncio.sleep(0.05)
    assert apiserver.stats()["watchers"]["pods"] == 1
    raw.close()
    for _ in range(100):
        if apiserver.stats()["watchers"]["pods"] == 0:
            break
        await asyncio.sleep(0.02)
    assert apiserver.stats()["watchers"]["pods"] == 0


async def test_watch_many_events_in_order(core: client.CoreV1Api, apiserver: ApiServer) -> None:
    start = str(apiserver.resource_version)
    for i in range(300):
        apiserver.put(pod(f"p{i}"))
    w = watch.Watch()
    async with w:
        events = await collect(w.stream(core.list_namespaced_pod, "default", resource_version=start), 300)
    assert events == [("ADDED", f"p{i}") for i in range(300)]


async def test_watch_mirror_equals_list_after_churn(core: client.CoreV1Api, apiserver: ApiServer) -> None:
    rng = random.Random(7)
    for i in range(50):
        apiserver.put(pod(f"p{i}", node=f"n{i % 3}"))
    listed = await core.list_pod_for_all_namespaces(_preload_content=False)
    body = json.loads(await listed.read())
    mirror = {p["metadata"]["name"]: p for p in body["items"]}
    start = body["metadata"]["resourceVersion"]
    for step in range(500):
        name = f"p{rng.randrange(60)}"
        action = rng.choice(("put", "patch", "delete"))
        if action == "put":
            apiserver.put(pod(name, node=f"n{rng.randrange(3)}", labels={"step": str(step)}))
        elif apiserver.get("Pod", "default", name) is None:
            continue
        elif action == "patch":
            apiserver.patch("Pod", "default", name, {"metadata": {"labels": {"step": str(step)}}})
        else:
            apiserver.delete("Pod", "default", name)
    resp = await core.list_pod_for_all_namespaces(watch=True, resource_version=start, _preload_content=False)
    target = str(apiserver.resource_version)
    while True:
        event = json.loads(await asyncio.wait_for(resp.content.readline(), 5))
        obj = event["object"]
        if event["type"] == "DELETED":
            mirror.pop(obj["metadata"]["name"], None)
        else:
            mirror[obj["metadata"]["name"]] = obj
        if obj["metadata"]["resourceVersion"] == target:
            break
    resp.release()
    final = {p["metadata"]["name"]: p for p in apiserver.list("pods")}
    assert mirror == final
