"""Every /filter and /bind body, however malformed, over real HTTP: an answer in the extender's
JSON (``Error`` with the reason, or a result) or a 4xx, never a 500 or a logged traceback.

One scheduler serves all examples (its own event loop, kept across hypothesis examples).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from tests.integration.scheduler.harness import Env, running_scheduler, wait_for
from tests.unit.scheduler.test_extender_json import FILTER_BODIES, JSON_VALUES

pytestmark = pytest.mark.slow


class Served:
    """A running scheduler on a private loop, for synchronous hypothesis examples."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._stack = contextlib.AsyncExitStack()
        self.env: Env = self.loop.run_until_complete(self._start())

    async def _start(self) -> Env:
        env = await self._stack.enter_async_context(running_scheduler())
        env.add_node("n1")
        await wait_for(lambda: "n1" in env.scheduler.ledger.nodes)
        return env

    def post(self, path: str, body: Any) -> tuple[int, Any]:
        return self.loop.run_until_complete(self.env.post(self.env.extender, path, body))

    def close(self) -> None:
        self.loop.run_until_complete(self._stack.aclose())
        self.loop.close()


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    server = Served()
    try:
        yield server
    finally:
        server.close()


def _answered(status: int, body: Any, keys: tuple[str, ...]) -> None:
    assert status in (200, 400, 413), (status, body)
    assert isinstance(body, dict), body
    if status == 200:
        assert body.get("Error") or any(k in body for k in keys), body
    else:
        assert body.get("error"), body


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=FILTER_BODIES)
def test_any_filter_body_gets_an_extender_answer(served: Served, body: Any) -> None:
    before = served.env.scheduler.ledger.snapshot()
    status, answer = served.post("/filter", body)
    _answered(status, answer, ("NodeNames", "Nodes", "FailedNodes"))
    if status != 200 or answer.get("Error"):
        assert served.env.scheduler.ledger.snapshot() == before


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=JSON_VALUES)
def test_any_bind_body_gets_an_extender_answer(served: Served, body: Any) -> None:
    status, answer = served.post("/bind", body)
    _answered(status, answer, ())
