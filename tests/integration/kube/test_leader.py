"""Lease-based leader election between two electors against the embedded API server."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from hamid.kube.client import KubeClient
from hamid.kube.leader import LeaderElector
from tests.integration.kube.helpers import eventually

FAST = {"lease_duration": 2.0, "renew_deadline": 1.5, "retry_period": 0.1}


def elector(kube: KubeClient, identity: str, log: list[str], **kwargs: Any) -> LeaderElector:
    return LeaderElector(
        kube,
        "kube-system",
        "hamid-scheduler",
        identity,
        on_started_leading=lambda: log.append(f"{identity}+"),
        on_stopped_leading=lambda: log.append(f"{identity}-"),
        **FAST,
        **kwargs,
    )


async def test_one_leader_then_failover_after_crash(kube: KubeClient) -> None:
    log: list[str] = []
    a = elector(kube, "a", log, release_on_cancel=False)
    b = elector(kube, "b", log)
    async with asyncio.TaskGroup() as tg:
        task_a = tg.create_task(a.run())
        await eventually(lambda: a.is_leader)
        task_b = tg.create_task(b.run())
        # b keeps trying for a few retry periods but cannot take a renewed lease.
        await asyncio.sleep(0.5)
        assert a.is_leader and not b.is_leader
        assert b.holder == "a"
        # a "crashes" (no release): b takes over once the lease expires.
        task_a.cancel()
        await eventually(lambda: b.is_leader, within=15)
        lease = await kube.get_lease("kube-system", "hamid-scheduler")
        assert lease["spec"]["holderIdentity"] == "b"
        assert lease["spec"]["leaseTransitions"] == 1
        task_b.cancel()
    assert log == ["a+", "a-", "b+", "b-"]


async def test_release_on_cancel_hands_over(kube: KubeClient) -> None:
    log: list[str] = []
    a = elector(kube, "a", log)
    async with asyncio.TaskGroup() as tg:
        task_a = tg.create_task(a.run())
        await eventually(lambda: a.is_leader)
        task_a.cancel()
    lease = await kube.get_lease("kube-system", "hamid-scheduler")
    assert lease["spec"]["holderIdentity"] == ""
    # A released lease is free at once: b needs no expiry wait.
    b = elector(kube, "b", log, release_on_cancel=False)
    async with asyncio.TaskGroup() as tg:
        task_b = tg.create_task(b.run())
        await eventually(lambda: b.is_leader)
        task_b.cancel()
    assert log == ["a+", "a-", "b+", "b-"]


async def test_leader_steps_down_when_renewals_fail(kube: KubeClient, apiserver: Any) -> None:
    log: list[str] = []
    a = elector(kube, "a", log)
    async with asyncio.TaskGroup() as tg:
        task_a = tg.create_task(a.run())
        await eventually(lambda: a.is_leader)
        apiserver.faults.fail_next(100_000, path_pattern="/leases", status=500)
        await eventually(lambda: not a.is_leader, within=15)
        assert log == ["a+", "a-"]
        apiserver.faults.clear()
        await eventually(lambda: a.is_leader, within=15)
        task_a.cancel()
    assert log == ["a+", "a-", "a+", "a-"]


def test_bad_durations_are_refused() -> None:
    with pytest.raises(ValueError):
        LeaderElector(None, "ns", "n", "id", lease_duration=1, renew_deadline=2, retry_period=0.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        LeaderElector(None, "ns", "n", "", lease_duration=3, renew_deadline=2, retry_period=0.5)  # type: ignore[arg-type]
