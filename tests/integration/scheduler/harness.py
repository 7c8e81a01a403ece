"""A running scheduler (real HTTP listeners) against the embedded API server, for tests."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from hamid.kube.client import KubeClient, connect
from hamid.scheduler.core import Scheduler, SchedulerSettings
from hamid.scheduler.http import RouteRegistrar, cluster_app, extender_app, serve
from hamid.sim.apiserver import ApiServer
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


@contextlib.asynccontextmanager
async def serving(
    scheduler: Scheduler,
    cluster_routes: Sequence[RouteRegistrar] = (),
    cluster_ssl: ssl.SSLContext | None = None,
    *,
    start: bool = True,
) -> AsyncIterator[tuple[int, int]]:
    """Serve the scheduler's extender and cluster apps on loopback and run it (caches synced unless
    ``start`` is False); yields ``(extender_port, cluster_port)``. Closes the scheduler and its client."""
    runners: list[web.AppRunner] = []
    task: asyncio.Task[None] | None = None
    try:
        ext_runner, ext_port = await serve(extender_app(scheduler), "127.0.0.1:0")
        runners.append(ext_runner)
        cl_runner, cl_port = await serve(cluster_app(scheduler, cluster_routes), "127.0.0.1:0", cluster_ssl)
        runners.append(cl_runner)
        if start:
            task = asyncio.create_task(scheduler.run())
            async with asyncio.timeout(10):
                await scheduler.pods.wait_synced()
                await scheduler.nodes.wait_synced()
                await scheduler.quotas.wait_synced()
        yield ext_port, cl_port
    finally:
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for runner in runners:
            await runner.cleanup()
        await scheduler.close()
        await scheduler.kube.close()


@contextlib.asynccontextmanager
async def running_scheduler(
    settings: SchedulerSettings | None = None, start: bool = True
) -> AsyncIterator[Env]:
    """Start API server, scheduler (caches synced unless ``start`` is False) and its listeners."""
    async with ApiServer() as server:
        kube = await connect(api_server=server.url, request_timeout=5.0)
        scheduler = Scheduler(kube, settings=settings or SchedulerSettings(bind_wait_s=20.0))
        async with (
            serving(scheduler, start=start) as (ext_port, cl_port),
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session,
        ):
            yield Env(
                server,
                kube,
                scheduler,
                session,
                f"http://127.0.0.1:{ext_port}",
                f"http://127.0.0.1:{cl_port}",
            )
