"""/bind on a node whose plugin hides replicas by ``steer`` waits, after taking the node lock and
before the Binding, until the Node's ``hamid.io/devices-listed-for`` equals the lock value it wrote
(the plugin's word that kubelet was sent the pod's replicas); without it the bind fails after
``--steer-wait`` and leaves nothing behind. Real HTTP, the embedded API server; the plugin's
acknowledgement is written here, as the plugin writes it (the plugin's side end to end:
tests/e2e/test_steer_replicas.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from hamid.model import annotations as ann
from hamid.model import objects
from hamid.model.numa import NUMA_PROFILE, ReplicaHiding, encode_profile
from hamid.scheduler.core import SchedulerSettings
from tests.integration.scheduler.harness import Env, running_scheduler, wait_for
from tests.unit.scheduler.test_numa_ledger import GPU, PROFILE, _node, _pod


async def _steer_node(env: Env, rule: str = "steer", policy: str = "restricted", **notes: str) -> None:
    """Node ``n1`` whose plugin announces ``rule`` under Topology Manager ``policy``."""
    node = _node()
    policies = dataclasses.replace(PROFILE.policies, topology_manager_policy=policy)
    profile = dataclasses.replace(
        PROFILE, observed_at=int(time.time()), policies=policies, hide_replicas=ReplicaHiding(GPU, rule)
    )
    node["metadata"]["annotations"] |= {NUMA_PROFILE: encode_profile(profile), **notes}
    env.server.put({"apiVersion": "v1", "kind": "Node", **node})
    await wait_for(lambda: env.scheduler.numa.hide_rule("n1") is not None)


def _node_notes(env: Env) -> dict[str, str]:
    return dict(objects.annotations(env.server.get("Node", None, "n1")))


def _lock_names_a(env: Env) -> bool:
    value = _node_notes(env).get(ann.NODE_LOCK, "")
    return value.endswith(",default,a")


def _bound(env: Env) -> bool:
    return bool(env.server.get("Pod", "default", "a")["spec"].get("nodeName"))


def _waits(env: Env, outcome: str) -> float | None:
    return env.scheduler.metrics.registry.get_sample_value(
        "hamid_bind_steer_wait_seconds_count", {"outcome": outcome}
    )


async def _filtered(env: Env) -> dict[str, Any]:
    pod = await env.create_pod(_pod("a"))
    assert (await env.filter(pod, ["n1"]))["NodeNames"] == ["n1"]
    return pod


@pytest.mark.parametrize("policy", ["restricted", "single-numa-node", "best-effort"])
async def test_the_bind_waits_for_the_plugins_acknowledgement_of_its_lock(policy: str) -> None:
    """Under every Topology Manager policy whose merged hint follows the devices' hint."""
    async with running_scheduler(SchedulerSettings(bind_wait_s=19.0, steer_wait_s=10.0)) as env:
        await _steer_node(env, policy=policy)
        pod = await _filtered(env)
        seen: list[str] = []

        async def plugin() -> None:
            """The plugin's part: the lock names the pod, kubelet is sent its list, acknowledge."""
            await wait_for(lambda: _lock_names_a(env))
            await asyncio.sleep(0.3)
            assert not _bound(env)  # the bind is still waiting
            value = _node_notes(env)[ann.NODE_LOCK]
            seen.append(value)
            await env.kube.patch_node_metadata("n1", annotations={ann.DEVICES_LISTED_FOR: value})

        acking = asyncio.create_task(plugin())
        started = time.monotonic()
        assert await env.bind(pod, "n1") == ""
        await acking
        assert time.monotonic() - started >= 0.3
        assert _bound(env)
        assert _node_notes(env)[ann.NODE_LOCK] == seen[0]  # held for the plugin's Allocate
        assert _waits(env, "confirmed") == 1 and _waits(env, "unconfirmed") == 0


async def test_without_the_acknowledgement_of_its_own_lock_the_bind_fails_and_leaves_nothing() -> None:
    """An acknowledgement of an earlier take (on the Node before the lock was taken, or written
    during the wait) is not this bind's: after ``--steer-wait`` it fails, the lock released,
    ``bind-phase`` removed, the pod unbound, counted; the take removed the stale value."""
    earlier = ann.format_node_lock(datetime.now(UTC) - timedelta(minutes=1), "default", "a")
    async with running_scheduler(SchedulerSettings(bind_wait_s=19.0, steer_wait_s=0.5)) as env:
        await _steer_node(env, **{ann.DEVICES_LISTED_FOR: earlier})
        pod = await _filtered(env)

        async def stale_plugin() -> None:
            await wait_for(lambda: _lock_names_a(env))
            assert ann.DEVICES_LISTED_FOR not in _node_notes(env)  # the take removed it
            await env.kube.patch_node_metadata("n1", annotations={ann.DEVICES_LISTED_FOR: earlier})

        acking = asyncio.create_task(stale_plugin())
        error = await env.bind(pod, "n1")
        await acking
        assert "node n1" in error and "--steer-wait 0.5s" in error, error
        assert ann.NODE_LOCK not in _node_notes(env)
        assert not _bound(env)
        assert ann.BIND_PHASE not in objects.annotations(env.server.get("Pod", "default", "a"))
        assert _waits(env, "unconfirmed") == 1 and _waits(env, "confirmed") == 0
        assert env.scheduler.bind_backoff.failures("n1") == 1


@pytest.mark.parametrize(
    ("rule", "policy", "wait"),
    [("busy", "restricted", 5.0), ("steer", "none", 5.0), ("steer", "restricted", 0.0)],
)
async def test_no_wait_where_the_plugin_does_not_steer_or_the_wait_is_off(
    rule: str, policy: str, wait: float
) -> None:
    """``busy``, ``steer`` where it is ``busy`` (Topology Manager ``none``: no hints), or
    ``--steer-wait 0``: the bind goes on without an acknowledgement."""
    async with running_scheduler(SchedulerSettings(bind_wait_s=19.0, steer_wait_s=wait)) as env:
        await _steer_node(env, rule, policy)
        pod = await _filtered(env)
        assert await env.bind(pod, "n1") == ""
        assert _bound(env)
        assert _waits(env, "confirmed") == 0 and _waits(env, "unconfirmed") == 0


async def test_a_lock_the_pod_still_holds_from_an_earlier_attempt_is_never_confirmed_by_its_ack() -> None:
    """The node lock and the plugin's acknowledgement both name this pod's earlier attempt (fenced
    by a takeover, or of unknown outcome: nothing was undone). The lock is re-entered without a
    new take, and the acknowledgement was for that attempt's booking: the bind fails at once,
    releasing the lock, and kube-scheduler's retry takes it afresh."""
    earlier = ann.format_node_lock(datetime.now().astimezone(), "default", "a")
    async with running_scheduler(SchedulerSettings(bind_wait_s=19.0, steer_wait_s=5.0)) as env:
        await _steer_node(env, **{ann.NODE_LOCK: earlier, ann.DEVICES_LISTED_FOR: earlier})
        pod = await _filtered(env)
        started = time.monotonic()
        error = await env.bind(pod, "n1")
        assert "earlier bind attempt" in error, error
        assert time.monotonic() - started < 5.0  # no wait for an acknowledgement that cannot come
        assert not _bound(env) and ann.NODE_LOCK not in _node_notes(env)
