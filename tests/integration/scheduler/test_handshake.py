"""The leader's handshake loop (``scheduler/handshake.py``): ``Requesting_<now>`` on nodes that lack one."""

from __future__ import annotations

import asyncio

from hamid.model import annotations as ann
from hamid.scheduler.settings import SchedulerSettings
from tests.integration.scheduler.harness import running_scheduler, wait_for


async def test_only_the_replica_that_decides_writes_a_missing_handshake() -> None:
    async with running_scheduler(SchedulerSettings(handshake_interval_s=0.05)) as env:
        state, readiness = env.scheduler.state, env.scheduler.readiness
        readiness.follow()
        env.add_node("n1")
        await wait_for(lambda: "n1" in state.ledger.nodes)
        assert state.ledger.handshake_wanted == {"n1"}
        await asyncio.sleep(0.3)  # several rounds as a follower: nothing written
        node = await env.kube.get_node("n1")
        assert ann.NODE_HANDSHAKE not in node["metadata"]["annotations"]
        assert state.ledger.handshake_wanted == {"n1"}

        readiness.lead()
        readiness.caught_up()
        await wait_for(lambda: not state.ledger.handshake_wanted)
        node = await env.kube.get_node("n1")
        assert node["metadata"]["annotations"][ann.NODE_HANDSHAKE].startswith("Requesting_")
