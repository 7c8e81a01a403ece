"""The kube-scheduler driver against a tiny aiohttp fake extender and the embedded API server."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from hamid.kube.client import EVENTS, KubeClient
from hamid.sim.kube_scheduler import KubeSchedulerDriver, fit_error_message

SCHEDULER = "hami-scheduler"


class FakeExtender:
    """Answers /filter from a script of canned answers, binds for real on /bind."""

    def __init__(self, kube: KubeClient) -> None:
        self.kube = kube
        self.filter_bodies: list[dict[str, Any]] = []
        self.bind_bodies: list[dict[str, Any]] = []
        self.filter_script: list[tuple[int, dict[str, Any]]] = []
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def filter(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.filter_bodies.append(body)
        if self.filter_script:
            status, answer = self.filter_script.pop(0)
            return web.json_response(answer, status=status)
        return web.json_response({"NodeNames": body["NodeNames"][-1:], "FailedNodes": {}, "Error": ""})

    async def bind(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.bind_bodies.append(body)
        await self.kube.bind_pod(body["PodNamespace"], body["PodName"], body["PodUID"], body["Node"])
        return web.json_response({"Error": ""})

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/ext/filter", self.filter)
        app.router.add_post("/ext/bind", self.bind)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = self.runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}/ext/"


@pytest.fixture
async def extender(kube: KubeClient) -> AsyncIterator[FakeExtender]:
    fake = FakeExtender(kube)
    await fake.start()
    try:
        yield fake
    finally:
        assert fake.runner is not None
        await fake.runner.cleanup()


@pytest.fixture
async def driver(kube: KubeClient, extender: FakeExtender) -> AsyncIterator[KubeSchedulerDriver]:
    for name in ("node-b", "node-a"):
        await kube.create_node({"metadata": {"name": name}})
    drv = KubeSchedulerDriver(
        kube,
        scheduler_name=SCHEDULER,
        extender_url=extender.url,
        http_timeout=2.0,
        initial_backoff=0.05,
        max_backoff=0.08,
    )
    task = asyncio.create_task(drv.run())
    try:
        yield drv
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def pod(name: str, scheduler: str = SCHEDULER) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"schedulerName": scheduler, "containers": [{"name": "main", "image": "busybox"}]},
    }


async def events_for(kube: KubeClient, name: str, reason: str) -> list[dict[str, Any]]:
    items, _ = await kube.list_objects(EVENTS, "default")
    return [e for e in items if e["involvedObject"]["name"] == name and e["reason"] == reason]


def test_backoff_doubles_and_caps(kube: KubeClient) -> None:
    drv = KubeSchedulerDriver(kube, scheduler_name="s", extender_url="http://127.0.0.1:1")
    assert [drv.backoff_delay(n) for n in range(1, 7)] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    with pytest.raises(ValueError):
        KubeSchedulerDriver(kube, scheduler_name="s", extender_url="127.0.0.1:1")


def test_fit_error_message() -> None:
    statuses = {"a": ["CardInsufficientMemory"], "b": ["CardInsufficientMemory", "NumaNotFit"]}
    assert (
        fit_error_message(3, statuses) == "0/3 nodes are available: 1 NumaNotFit, 2 CardInsufficientMemory."
    )
    assert fit_error_message(2, {}) == "0/2 nodes are available:"


async def test_filter_then_bind_with_go_cased_bodies(
    kube: KubeClient, extender: FakeExtender, driver: KubeSchedulerDriver
) -> None:
    await kube.create_pod(pod("other", scheduler="default-scheduler"))
    created = await kube.create_pod(pod("p1"))
    node = await driver.wait_bound("default", "p1")
    assert node == "node-b"
    (body,) = extender.filter_bodies
    assert set(body) == {"Pod", "NodeNames"}
    assert body["NodeNames"] == ["node-a", "node-b"]
    assert body["Pod"]["metadata"]["name"] == "p1"
    assert extender.bind_bodies == [
        {"PodName": "p1", "PodNamespace": "default", "PodUID": created["metadata"]["uid"], "Node": "node-b"}
    ]
    assert (await kube.get_pod("default", "p1"))["spec"]["nodeName"] == "node-b"
    assert (await kube.get_pod("default", "other"))["spec"].get("nodeName") is None
    scheduled = await asyncio.wait_for(_until(lambda: events_for(kube, "p1", "Scheduled")), 5)
    assert scheduled[0]["message"] == "Successfully assigned default/p1 to node-b"


async def _until(fetch: Any) -> list[dict[str, Any]]:
    while True:
        found = await fetch()
        if found:
            return found
        await asyncio.sleep(0.02)


async def test_retry_with_backoff_after_errors_and_fit_failures(
    kube: KubeClient, extender: FakeExtender, driver: KubeSchedulerDriver
) -> None:
    extender.filter_script = [
        (500, {}),
        (200, {"nodenames": [], "failednodes": {"node-a": "CardInsufficientMemory"}, "error": ""}),
        (200, {"NodeNames": None, "FailedNodes": {}, "Error": "extender is busy"}),
        (200, {"NodeNames": ["node-z"], "FailedNodes": {}, "Error": ""}),
    ]
    await kube.create_pod(pod("p2"))
    assert await driver.wait_bound("default", "p2", timeout=10) == "node-b"
    attempts = driver.attempts_for("default", "p2")
    assert [a.attempt for a in attempts] == [1, 2, 3, 4, 5]
    assert attempts[0].error == f"failed filter with extender at URL {extender.url}filter, code 500"
    assert attempts[1].error == "0/2 nodes are available: 1 CardInsufficientMemory."
    assert attempts[2].error == "extender is busy"
    assert attempts[3].error == (
        f'extender "{extender.url.rstrip("/")}" claims a filtered node "node-z" '
        "which is not found in the input node list"
    )
    assert [a.retry_in for a in attempts] == [0.05, 0.08, 0.08, 0.08, 0.0]
    assert attempts[4].node == "node-b"
    failed = await asyncio.wait_for(_until(lambda: events_for(kube, "p2", "FailedScheduling")), 5)
    assert {e["type"] for e in failed} == {"Warning"}
    assert len(extender.filter_bodies) == 5
    assert len(extender.bind_bodies) == 1
