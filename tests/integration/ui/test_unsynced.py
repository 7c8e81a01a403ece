"""``/ui`` before the scheduler's caches have synced: a 503 that says so, never an empty cluster.

The listeners are bound before the first list of pods and nodes lands (seconds on a large
cluster, for as long as the API server cannot be reached): the pages say the figures are not
there yet, as ``/readyz`` does, and reload themselves once they are.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import re
from collections.abc import AsyncIterator

import aiohttp

from hamid.scheduler.app import SchedulerApp
from hamidsim.apiserver import ApiServer
from tests.integration.scheduler.harness import loopback_options, running_app, wait_for
from tests.unit.scheduler.helpers import node

#: The stamp an unsynced page carries (the page script reloads it when the stamp changes).
UNSYNCED_STAMP = "unsynced"


@contextlib.asynccontextmanager
async def unsynced() -> AsyncIterator[tuple[SchedulerApp, aiohttp.ClientSession, str]]:
    """A scheduler whose caches have not listed yet, its GPU node registered in the API server."""
    async with ApiServer() as server:
        server.put({"apiVersion": "v1", "kind": "Node", **node("node-a", 2)})
        async with (
            running_app(loopback_options(server), start=False) as app,
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as session,
        ):
            assert not app.scheduler.synced
            yield app, session, f"http://127.0.0.1:{app.ports['metrics']}"


def _text(page: str) -> str:
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page)))


async def test_every_page_says_the_caches_have_not_synced_rather_than_show_an_empty_cluster() -> None:
    async with unsynced() as (_app, session, base):
        for path in ("/ui", "/ui?sort=idle", "/ui/node/node-a", "/ui/pod/default/anyone"):
            async with session.get(base + path) as resp:
                page = await resp.text()
                assert resp.status == 503, (path, resp.status)
                assert resp.headers["Retry-After"] == "5"
            text = _text(page)
            assert "caches have not synced yet" in text and "/readyz answers 503" in text, text
            assert "registers no GPU" not in text and "No GPU pod runs off" not in text
            assert f'data-stamp="{UNSYNCED_STAMP}"' in page  # the page script reloads it once synced
        async with session.get(base + "/ui?sort=bogus") as resp:
            assert resp.status == 400  # bad input is refused all the same
        async with session.get(base + "/ui/static/ui.js") as resp:
            assert resp.status == 200  # what the 503 page itself needs


async def test_the_unsynced_page_reloads_itself_once_the_caches_have_synced() -> None:
    async with unsynced() as (app, session, base):
        stamp = base + "/ui/api/stamp/node/node-a"
        etag = f'"{UNSYNCED_STAMP}"'
        async with session.get(stamp, headers={"If-None-Match": etag}) as resp:
            assert resp.status == 304  # still unsynced: nothing to reload for
        run = asyncio.create_task(app.scheduler.run())
        try:
            await wait_for(lambda: app.scheduler.synced and "node-a" in app.scheduler.ledger.nodes)
            async with session.get(stamp, headers={"If-None-Match": etag}) as resp:
                assert resp.status == 200 and resp.headers["ETag"] != etag  # the page reloads
            async with session.get(base + "/ui/node/node-a") as resp:
                assert resp.status == 200
                assert "NUMA map" in await resp.text()
        finally:
            run.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await run
