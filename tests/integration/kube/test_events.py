"""EventRecorder against the embedded API server: fields, aggregation, failures never raised."""

from __future__ import annotations

import math
from typing import Any

import pytest

from hamid.kube.client import EVENTS, KubeClient
from hamid.kube.events import EventRecorder
from hamid.model.reasons import (
    EVENT_BINDING_FAILED,
    EVENT_BINDING_SUCCEED,
    EVENT_FILTERING_FAILED,
    EVENT_FILTERING_SUCCEED,
    EVENT_NUMA_REFIT_SUCCEED,
)
from tests.builders import node, pod
from tests.integration.kube.helpers import create_namespace


async def events_for(kube: KubeClient, namespace: str, name: str) -> list[dict[str, Any]]:
    items, _ = await kube.list_objects(EVENTS, namespace)
    return [e for e in items if e["involvedObject"]["name"] == name]


async def test_event_fields(kube: KubeClient) -> None:
    await create_namespace(kube, "ml")
    target = await kube.create_pod(pod("trainer-0", "ml"))
    recorder = EventRecorder(kube, "hami-scheduler", "sched-1")
    await recorder.record(target, "Normal", EVENT_NUMA_REFIT_SUCCEED, "moved to GPU-b on NUMA 0")
    [event] = await events_for(kube, "ml", "trainer-0")
    assert event["metadata"]["namespace"] == "ml"
    assert event["metadata"]["name"].startswith("trainer-0.")
    assert event["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": "ml",
        "name": "trainer-0",
        "uid": target["metadata"]["uid"],
        "resourceVersion": target["metadata"]["resourceVersion"],
    }
    assert event["type"] == "Normal"
    assert event["reason"] == EVENT_NUMA_REFIT_SUCCEED
    assert event["message"] == "moved to GPU-b on NUMA 0"
    assert event["source"] == {"component": "hami-scheduler", "host": "sched-1"}
    assert event["reportingComponent"] == "hami-scheduler"
    assert event["reportingInstance"] == "sched-1"
    assert event["count"] == 1
    assert event["firstTimestamp"] == event["lastTimestamp"]
    assert event["firstTimestamp"].endswith("Z")


async def test_a_message_carries_no_control_character(kube: KubeClient) -> None:
    """Messages quote what tenants wrote (a pinned GPU list): escapes, not terminal sequences."""
    await create_namespace(kube, "ml")
    target = await kube.create_pod(pod("trainer-0", "ml"))
    recorder = EventRecorder(kube, "hami-scheduler", "sched-1")
    await recorder.record(
        target, "Warning", EVENT_NUMA_REFIT_SUCCEED, "pinned to [GPU-a \x1b]0;t\x07\x1b[2J\r]"
    )
    [event] = await events_for(kube, "ml", "trainer-0")
    assert event["message"] == "pinned to [GPU-a \\x1b]0;t\\x07\\x1b[2J\\r]"


async def test_repeats_are_aggregated(kube: KubeClient) -> None:
    target = await kube.create_pod(pod("again"))
    recorder = EventRecorder(kube, "hami-scheduler", "sched-1")
    for expected in (1, 2, 3):
        await recorder.record(target, "Warning", EVENT_FILTERING_FAILED, "no node fits")
        [event] = await events_for(kube, "default", "again")
        assert event["count"] == expected
    assert event["type"] == "Warning"
    # Another message is another Event.
    await recorder.record(target, "Warning", EVENT_FILTERING_FAILED, "still no node fits")
    events = await events_for(kube, "default", "again")
    assert sorted((e["message"], e["count"]) for e in events) == [
        ("no node fits", 3),
        ("still no node fits", 1),
    ]


async def test_expired_event_starts_a_new_series(kube: KubeClient) -> None:
    target = await kube.create_pod(pod("expire"))
    recorder = EventRecorder(kube, "hami-scheduler", "sched-1")
    await recorder.record(target, "Normal", EVENT_NUMA_REFIT_SUCCEED, "m")
    [event] = await events_for(kube, "default", "expire")
    await kube.delete(EVENTS, event["metadata"]["name"], "default")
    await recorder.record(target, "Normal", EVENT_NUMA_REFIT_SUCCEED, "m")
    [fresh] = await events_for(kube, "default", "expire")
    assert fresh["count"] == 1
    assert fresh["metadata"]["name"] != event["metadata"]["name"]


async def test_node_event_lands_in_default(kube: KubeClient) -> None:
    target = await kube.create_node(node("gpu-node"))
    recorder = EventRecorder(kube, "hami-device-plugin")
    await recorder.record(target, "Warning", "DeviceUnhealthy", "GPU-a lost")
    [event] = await events_for(kube, "default", "gpu-node")
    assert event["involvedObject"]["kind"] == "Node"
    assert "namespace" not in event["involvedObject"]
    assert event["reportingInstance"]


async def test_failures_are_logged_not_raised(kube: KubeClient, apiserver: Any) -> None:
    target = await kube.create_pod(pod("fails"))
    recorder = EventRecorder(kube, "hami-scheduler", "sched-1", timeout=0.5)
    apiserver.faults.fail_next(1, verb="create", path_pattern="/events", status=500)
    await recorder.record(target, "Normal", EVENT_NUMA_REFIT_SUCCEED, "lost")
    assert await events_for(kube, "default", "fails") == []
    # A slow API server costs at most the recorder's timeout.
    rule = apiserver.faults.add_latency(5.0, path_pattern="/events")
    await recorder.record(target, "Normal", EVENT_NUMA_REFIT_SUCCEED, "slow")
    apiserver.faults.remove(rule.id)
    # Bad arguments are refused without an API call.
    await recorder.record(target, "Informational", EVENT_NUMA_REFIT_SUCCEED, "bad type")  # type: ignore[arg-type]
    await recorder.record(target, "Normal", EVENT_NUMA_REFIT_SUCCEED, "works again")
    events = await events_for(kube, "default", "fails")
    assert [e["message"] for e in events] == ["works again"]


async def test_routine_successes_beyond_the_budget_are_shed_and_nothing_else_is(kube: KubeClient) -> None:
    recorder = EventRecorder(kube, "hami-scheduler", "sched-1", routine_burst=2, routine_per_s=0.0)
    targets = [await kube.create_pod(pod(f"burst-{i}")) for i in range(4)]
    for target in targets:
        await recorder.record(target, "Normal", EVENT_FILTERING_SUCCEED, "find fit node(n1)")
        await recorder.record(target, "Normal", EVENT_BINDING_SUCCEED, "Successfully binding node [n1]")
        await recorder.record(target, "Warning", EVENT_BINDING_FAILED, "node lock contention")
        await recorder.record(target, "Normal", EVENT_NUMA_REFIT_SUCCEED, "moved")
    reasons = {
        t["metadata"]["name"]: sorted(
            e["reason"] for e in await events_for(kube, "default", t["metadata"]["name"])
        )
        for t in targets
    }
    # The first two routine Events are recorded, the rest shed; failures and refits never are.
    assert reasons["burst-0"] == sorted(
        [EVENT_FILTERING_SUCCEED, EVENT_BINDING_SUCCEED, EVENT_BINDING_FAILED, EVENT_NUMA_REFIT_SUCCEED]
    )
    for name in ("burst-1", "burst-2", "burst-3"):
        assert reasons[name] == sorted([EVENT_BINDING_FAILED, EVENT_NUMA_REFIT_SUCCEED])
    assert recorder.shed == {EVENT_FILTERING_SUCCEED: 3, EVENT_BINDING_SUCCEED: 3}


async def test_the_routine_budget_refills_and_can_be_lifted(kube: KubeClient) -> None:
    target = await kube.create_pod(pod("refill"))
    now = [100.0]
    recorder = EventRecorder(
        kube, "hami-scheduler", "sched-1", routine_burst=1, routine_per_s=2.0, clock=lambda: now[0]
    )
    await recorder.record(target, "Normal", EVENT_FILTERING_SUCCEED, "first")
    now[0] += 0.4  # 0.8 of a token back at 2/s
    await recorder.record(target, "Normal", EVENT_FILTERING_SUCCEED, "shed")
    now[0] += 0.2  # one token again
    await recorder.record(target, "Normal", EVENT_FILTERING_SUCCEED, "refilled")
    messages = sorted(e["message"] for e in await events_for(kube, "default", "refill"))
    assert messages == ["first", "refilled"]
    unlimited = EventRecorder(kube, "hami-scheduler", "sched-1", routine_burst=0, routine_per_s=math.inf)
    for i in range(5):
        await unlimited.record(target, "Normal", EVENT_FILTERING_SUCCEED, f"all {i}")
    assert len(await events_for(kube, "default", "refill")) == 7
    assert not unlimited.shed
    with pytest.raises(ValueError, match="burst >= 0"):
        EventRecorder(kube, "hami-scheduler", routine_burst=-1)
