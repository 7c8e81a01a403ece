"""The kube-scheduler driver against a tiny aiohttp fake extender and the embedded API server."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from hamid.kube.client import EVENTS, KubeClient
from hamid.model.errors import InvalidInput
from hamidsim.kube_scheduler import (
    KubeSchedulerDriver,
    Resources,
    fit_error_message,
    node_allocatable,
    pod_requests,
    resource_fit_reasons,
)
from tests import builders

SCHEDULER = "hami-scheduler"
#: What each test node publishes (like the simulated kubelet does for its machine).
ALLOCATABLE = {"cpu": "4", "memory": "8Gi", "pods": "3"}


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
        await kube.patch_node_status(name, {"allocatable": ALLOCATABLE, "capacity": ALLOCATABLE})
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


def pod(
    name: str, scheduler: str = SCHEDULER, *, cpu: str | None = None, memory: str | None = None
) -> dict[str, Any]:
    limits = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v is not None}
    return builders.pod(name, scheduler=scheduler, containers=[builders.container(limits=limits or None)])


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


async def _poll(check: Any) -> None:
    """Return once ``check()`` holds (callers bound it with ``wait_for``)."""
    while True:
        if check():
            return
        await asyncio.sleep(0.02)


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


GI = 1024**3


def test_pod_requests_like_kube_scheduler() -> None:
    spec = {
        "initContainers": [
            {"name": "sidecar", "restartPolicy": "Always", "resources": {"requests": {"cpu": "500m"}}},
            {"name": "setup", "resources": {"limits": {"cpu": "3", "memory": "1Gi"}}},
        ],
        "containers": [
            {"name": "a", "resources": {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"cpu": "2"}}},
            {"name": "b", "resources": {"limits": {"memory": "512Mi", "nvidia.com/gpu": 1}}},
        ],
        "overhead": {"cpu": "100m"},
    }
    # containers 1 CPU + sidecar 0.5 = 1.5 < setup 3 + sidecar 0.5 = 3.5; memory 2.5Gi > 1Gi; + overhead
    assert pod_requests({"spec": spec}) == Resources(3600, 2 * GI + 512 * 1024**2)
    assert pod_requests({"spec": {"containers": [{"name": "x"}]}}) == Resources()
    with pytest.raises(InvalidInput, match=r"resources\.limits\.cpu"):
        pod_requests({"spec": {"containers": [{"name": "x", "resources": {"limits": {"cpu": "lots"}}}]}})


def test_resource_fit_reasons_and_allocatable() -> None:
    allocatable, pods = node_allocatable({"status": {"allocatable": ALLOCATABLE}})
    assert (allocatable, pods) == (Resources(4000, 8 * GI), 3)
    assert node_allocatable({"metadata": {"name": "bare"}}) == (Resources(), 0)
    used = Resources(3000, 7 * GI)
    assert resource_fit_reasons(Resources(1000, GI), allocatable, used, pods, 2) == []
    assert resource_fit_reasons(Resources(1001, GI + 1), allocatable, used, pods, 3) == [
        "Too many pods",
        "Insufficient cpu",
        "Insufficient memory",
    ]
    # a pod without requests fits anywhere there is room for one more pod
    assert resource_fit_reasons(Resources(), Resources(), Resources(), 1, 0) == []


async def test_cpu_fit_filters_nodes_before_the_extender(
    kube: KubeClient, extender: FakeExtender, driver: KubeSchedulerDriver
) -> None:
    await kube.create_pod(pod("big-1", cpu="3"))
    assert await driver.wait_bound("default", "big-1") == "node-b"
    await kube.create_pod(pod("big-2", cpu="3"))
    assert await driver.wait_bound("default", "big-2") == "node-a"
    # node-b cannot hold a second 3-CPU pod (assumed or watched): only node-a went to /filter
    assert [b["NodeNames"] for b in extender.filter_bodies] == [["node-a", "node-b"], ["node-a"]]

    await kube.create_pod(pod("big-3", cpu="3"))
    await driver.wait_until(lambda: bool(driver.attempts_for("default", "big-3")), what="big-3 attempted")
    assert driver.attempts_for("default", "big-3")[0].error == "0/2 nodes are available: 2 Insufficient cpu."
    assert len(extender.filter_bodies) == 2  # the extender is not asked when no node fits
    failed = await asyncio.wait_for(_until(lambda: events_for(kube, "big-3", "FailedScheduling")), 5)
    assert failed[0]["message"] == "0/2 nodes are available: 2 Insufficient cpu."
    condition = (await kube.get_pod("default", "big-3"))["status"]["conditions"][0]
    assert (condition["reason"], condition["message"]) == ("Unschedulable", failed[0]["message"])

    # a terminated pod no longer counts: big-3 fits on node-b after big-1 completes
    await kube.patch_pod_status("default", "big-1", {"phase": "Succeeded"})
    assert await driver.wait_bound("default", "big-3", timeout=10) == "node-b"


async def test_memory_and_pod_count_reasons_combine_with_the_extenders(
    kube: KubeClient, extender: FakeExtender, driver: KubeSchedulerDriver
) -> None:
    await kube.create_pod(pod("huge", memory="9Gi"))
    await driver.wait_until(lambda: bool(driver.attempts_for("default", "huge")), what="huge attempted")
    assert (
        driver.attempts_for("default", "huge")[0].error == "0/2 nodes are available: 2 Insufficient memory."
    )
    await kube.delete_pod("default", "huge")

    for i in range(3):
        node = {"metadata": {"name": f"filler-{i}", "namespace": "default"}, "spec": {"nodeName": "node-a"}}
        await kube.create_pod({**node, "spec": {**node["spec"], "containers": [{"name": "c", "image": "x"}]}})

    await asyncio.wait_for(_poll(lambda: driver.node_usage().get("node-a", (Resources(), 0))[1] == 3), 5)
    extender.filter_script = [
        (200, {"NodeNames": [], "FailedNodes": {"node-b": "CardInsufficientMemory"}, "Error": ""}),
    ]
    await kube.create_pod(pod("small", cpu="1"))
    await driver.wait_until(lambda: bool(driver.attempts_for("default", "small")), what="small attempted")
    assert driver.attempts_for("default", "small")[0].error == (
        "0/2 nodes are available: 1 CardInsufficientMemory, 1 Too many pods."
    )
    assert extender.filter_bodies[-1]["NodeNames"] == ["node-b"]
    assert await driver.wait_bound("default", "small", timeout=10) == "node-b"


async def test_node_selector_filters_nodes(
    kube: KubeClient, extender: FakeExtender, driver: KubeSchedulerDriver
) -> None:
    await kube.patch_node_metadata("node-a", labels={"zone": "a"})
    picky = pod("picky", cpu="1")
    picky["spec"]["nodeSelector"] = {"zone": "a"}
    await asyncio.wait_for(_poll(lambda: driver.prefilter(picky, ["node-a", "node-b"])[0] == ["node-a"]), 5)
    await kube.create_pod(picky)
    assert await driver.wait_bound("default", "picky", timeout=10) == "node-a"
    assert extender.filter_bodies[-1]["NodeNames"] == ["node-a"]
    lost = pod("lost")
    lost["spec"]["nodeSelector"] = {"zone": "c"}
    await kube.create_pod(lost)
    await driver.wait_until(lambda: bool(driver.attempts_for("default", "lost")), what="lost attempted")
    assert driver.attempts_for("default", "lost")[0].error == (
        "0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector."
    )
