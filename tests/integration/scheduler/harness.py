"""A running scheduler (real HTTP listeners) against the embedded API server, for tests."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from hamid.kube.client import KubeClient
from hamid.scheduler.app import RouteFactory, SchedulerApp
from hamid.scheduler.core import Scheduler, SchedulerSettings
from hamid.scheduler.options import SchedulerOptions
from hamid.scheduler.signing import AllocationKeys
from hamidsim.apiserver import ApiServer
from tests.unit.scheduler.helpers import node as node_dict


@dataclass
class Env:
    """The API server, a client, the scheduler and its extender/cluster base URLs."""

    server: ApiServer
    kube: KubeClient
    scheduler: Scheduler
    session: aiohttp.ClientSession
    extender: str
    cluster: str
    #: The running scheduler process itself (a test may stop it midway).
    app: SchedulerApp

    def add_node(self, name: str, gpus: int = 2, **kw: Any) -> None:
        """Seed a registered GPU node."""
        body = node_dict(name, gpus, **kw)
        self.server.put({"apiVersion": "v1", "kind": "Node", **body})

    async def create_pod(self, pod: dict[str, Any]) -> dict[str, Any]:
        """Create a pod through the API and wait until the scheduler's cache has it."""
        created = await self.kube.create_pod({"apiVersion": "v1", "kind": "Pod", **pod})
        key = f"{created['metadata']['namespace']}/{created['metadata']['name']}"
        await wait_for(lambda: self.scheduler.pods.get(key) is not None)
        return created

    async def post(self, base: str, path: str, body: Any) -> tuple[int, Any]:
        """POST JSON; (status, decoded body or text)."""
        async with self.session.post(base + path, json=body) as resp:
            try:
                return resp.status, await resp.json(content_type=None)
            except ValueError:
                return resp.status, await resp.text()

    async def filter(self, pod: dict[str, Any], names: list[str]) -> dict[str, Any]:
        """POST /filter in node-names mode (HTTP 200 expected)."""
        status, body = await self.post(self.extender, "/filter", {"Pod": pod, "NodeNames": names})
        assert status == 200, body
        return body

    async def bind(self, pod: dict[str, Any], node: str) -> str:
        """POST /bind; returns the Error field ("" on success)."""
        meta = pod["metadata"]
        args = {
            "PodName": meta["name"],
            "PodNamespace": meta["namespace"],
            "PodUID": meta["uid"],
            "Node": node,
        }
        status, body = await self.post(self.extender, "/bind", args)
        assert status == 200, body
        return str(body.get("Error") or "")


async def wait_for(predicate: Any, limit: float = 10.0) -> None:
    """Poll an in-process predicate (cache state, not the API) until true; fail after ``limit`` s."""
    for _ in range(int(limit / 0.01)):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"condition not reached within {limit:g}s")


def loopback_options(server: ApiServer, **kw: Any) -> SchedulerOptions:
    """``hamid scheduler`` options for a test: every listener on a free loopback port."""
    listeners = {"extender_listen": "127.0.0.1:0", "listen": "127.0.0.1:0", "metrics_listen": "127.0.0.1:0"}
    return SchedulerOptions(**{**listeners, "api_server": server.url, **kw})


@contextlib.asynccontextmanager
async def running_app(
    options: SchedulerOptions, routes: Sequence[RouteFactory] = (), *, start: bool = True
) -> AsyncIterator[SchedulerApp]:
    """The product's :class:`SchedulerApp` started (caches synced unless ``start`` is False), then stopped."""
    app = SchedulerApp(options, routes=routes)
    try:
        await app.start(run=start)
        if start:
            await app.wait_synced(10)
        yield app
    finally:
        await app.stop()


@contextlib.asynccontextmanager
async def running_scheduler(
    settings: SchedulerSettings | None = None,
    start: bool = True,
    seed: Sequence[dict[str, Any]] = (),
    *,
    server: ApiServer | None = None,
    keys: AllocationKeys | None = None,
) -> AsyncIterator[Env]:
    """Start API server, scheduler (caches synced unless ``start`` is False) and its listeners;
    ``seed`` objects are in the API server before the scheduler starts. ``server``: an API server
    already running (another replica's); ``keys``: signed mode."""
    async with ApiServer() if server is None else contextlib.nullcontext(server) as api:
        api.put_many(seed)
        options = loopback_options(
            api, settings=settings or SchedulerSettings(bind_wait_s=19.0), allocation_keys=keys
        )
        async with (
            running_app(options, start=start) as app,
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session,
        ):
            yield Env(
                api,
                app.scheduler.kube,
                app.scheduler,
                session,
                f"http://127.0.0.1:{app.ports['extender']}",
                f"http://127.0.0.1:{app.ports['cluster']}",
                app,
            )
