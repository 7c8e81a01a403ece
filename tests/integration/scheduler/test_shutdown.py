"""Prompt shutdown of a real ``hamid scheduler`` process: SIGTERM while a bind waits for a node lock.

The listeners close first, the waiting bind is answered at once with a clear extender error, the
Lease is released, and the process exits within a few seconds (it once took ~18 s, past a bind's
wait, so a rolling update stalled binds).
"""

from __future__ import annotations

import asyncio
import signal
import time
from datetime import datetime

import aiohttp
import pytest

from hamid.model import nodelock
from hamidsim.apiserver import ApiServer
from hamidsim.replicas import PROBE_LEASE_NAME, PROBE_LEASE_NAMESPACE, SchedulerProcess, wait_for
from tests.unit.scheduler.helpers import node, pod

pytestmark = pytest.mark.slow

#: The exit the test accepts after SIGTERM (the bind alone would have waited 25 s).
EXIT_WITHIN_S = 5.0


async def test_sigterm_answers_a_bind_waiting_for_a_node_lock_and_exits_promptly(
    apiserver: ApiServer,
) -> None:
    locked = node("n1", gpus=1)
    # a Pending, unallocated holder keeps the lock: a bind for another pod waits (25 s by default)
    locked["metadata"]["annotations"].update(
        nodelock.take_annotations(datetime.now().astimezone(), "default", "holder")
    )
    apiserver.put({"apiVersion": "v1", "kind": "Node", **locked})
    apiserver.put({"apiVersion": "v1", "kind": "Pod", **pod("holder")})
    waiting = apiserver.put({"apiVersion": "v1", "kind": "Pod", **pod("waiting")})
    replica = SchedulerProcess("solo", apiserver.url)
    try:
        await replica.start()
        async with aiohttp.ClientSession() as session:
            await wait_for(lambda: replica.ready(session), 60, "the replica decides")
            answer = await replica.extender(session, "filter", {"Pod": waiting, "NodeNames": ["n1"]})
            assert answer.get("NodeNames") == ["n1"], answer
            meta = waiting["metadata"]
            args = {"PodName": "waiting", "PodNamespace": "default", "PodUID": meta["uid"], "Node": "n1"}
            bind = asyncio.create_task(replica.extender(session, "bind", args))
            await asyncio.sleep(1.0)  # the bind is in line for the lock now
            assert not bind.done()
            started = time.monotonic()
            replica.signal(signal.SIGTERM)
            bound = await asyncio.wait_for(bind, EXIT_WITHIN_S)
            answered = time.monotonic() - started
            assert await replica.wait_exit(EXIT_WITHIN_S) == 0
            exited = time.monotonic() - started
    finally:
        await replica.close()
    assert "scheduler shutting down" in bound["Error"], bound
    assert answered < 2.0 and exited < EXIT_WITHIN_S, (answered, exited)
    lease = apiserver.get("Lease", PROBE_LEASE_NAMESPACE, PROBE_LEASE_NAME) or {}
    assert lease["spec"]["holderIdentity"] == ""  # released on the way out
    assert nodelock.lock_value(apiserver.get("Node", None, "n1") or {}) is not None  # the holder's, untouched
