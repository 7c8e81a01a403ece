"""A scripted ``/refit`` server over real HTTP(S) for client and plugin tests."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from hamid.listen import serve
from hamid.tls import server_ssl_context
from tests.fixtures.tls import TLSFiles


@dataclass
class FakeScheduler:
    """Answers ``POST /refit`` with ``status``/``body`` (or redirects, or sleeps); records requests."""

    status: int = 200
    body: Any = field(
        default_factory=lambda: {"succeeded": True, "containerDevices": "GPU-2,NVIDIA,1000,10:"}
    )
    raw: bytes | None = None
    redirect_to: str | None = None
    delay: float = 0.0
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    url: str = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.headers.append(dict(request.headers))
        self.requests.append(json.loads(await request.read()))
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.redirect_to is not None:
            raise web.HTTPTemporaryRedirect(self.redirect_to)
        if self.raw is not None:
            return web.Response(status=self.status, body=self.raw, content_type="application/json")
        return web.json_response(self.body, status=self.status)


@contextlib.asynccontextmanager
async def fake_scheduler(tls: TLSFiles | None, **kw: Any) -> AsyncIterator[FakeScheduler]:
    """Serve a :class:`FakeScheduler` on 127.0.0.1 (https with ``tls``, else http)."""
    fake = FakeScheduler(**kw)
    app = web.Application(client_max_size=4 << 20)
    app.router.add_post("/refit", fake.handle)
    ctx = server_ssl_context(tls.server.cert_file, tls.server.key_file, tls.ca_file).context if tls else None
    runner, port = await serve(app, "127.0.0.1:0", ctx)
    fake.url = f"{'https' if tls else 'http'}://localhost:{port}"
    try:
        yield fake
    finally:
        await runner.cleanup()
