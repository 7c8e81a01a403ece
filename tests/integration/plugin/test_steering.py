"""The plugin's side of the ``steer`` handshake (:mod:`hamid.plugin.steering`): the node lock names
a pod booked here and not yet bound, the plugin lists kubelet free replicas only on the NUMA nodes
of the GPUs that pod needs, and once every open ListAndWatch stream was sent that list it writes
the lock value into the Node's ``hamid.io/devices-listed-for``. The real PluginApp, its gRPC
server over a unix socket with kubelet's side dialling it, the embedded API server."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, MutableMapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from hamid._proto.deviceplugin.v1beta1 import api_pb2 as pb
from hamid.kube.errors import Conflict
from hamid.model.annotations import (
    BIND_PHASE,
    BIND_TIME,
    DEVICES_ALLOCATED,
    DEVICES_LISTED_FOR,
    NODE_LOCK,
    VGPU_NODE,
    format_rfc3339,
)
from hamid.model.devices import PodDevices
from hamid.model.objects import resource_version
from hamid.plugin import steering
from hamid.plugin.pods import NodePods
from hamid.plugin.replica_room import ReplicaRoom
from hamid.plugin.service import list_response
from tests.integration.plugin.helpers import (
    NODE,
    Env,
    dev,
    eventually,
    lock_node,
    running_plugin,
    scheduled_pod,
    stored_annotations,
)
from tests.integration.plugin.test_allocate import allocate, stub_for
from tests.integration.plugin.test_device_lists import gpu_spec

Logs = list[MutableMapping[str, Any]]


def booked_pod(name: str, devices: PodDevices, node: str = NODE, **notes: str) -> dict[str, Any]:
    """A pod as the filter left it and the bind finds it: booked on ``node``, not bound yet."""
    pod = scheduled_pod(name, devices, node=node, extra=notes)
    del pod["spec"]["nodeName"]
    for key in (BIND_PHASE, BIND_TIME):
        del pod["metadata"]["annotations"][key]
    return pod


def _node_notes(env: Env) -> dict[str, str]:
    return stored_annotations(env.server, "Node", NODE, None)


def _healthy(env: Env) -> set[str]:
    """The replicas the plugin lists kubelet Healthy now."""
    return {d.ID for d in list_response(env.plugin.inventory).devices if d.health == "Healthy"}


def _sent_healthy(listed: pb.ListAndWatchResponse) -> set[str]:
    return {d.ID for d in listed.devices if d.health == "Healthy"}


def _restricted(room: ReplicaRoom | None) -> ReplicaRoom:
    """``steer`` acts only where kubelet's Topology Manager merges hints (here ``restricted``), which
    the NUMA publisher (off here) would announce."""
    assert room is not None
    room.topology_policy = lambda: "restricted"
    room.sync()
    return room


def _skipped(logs: Logs, pod: str) -> list[str]:
    return [e["reason"] for e in logs if e["event"] == "steer_skipped" and e.get("pod") == pod]


async def test_a_locked_pod_not_yet_bound_is_listed_alone_then_acknowledged() -> None:
    """A running pod holds GPU-0-0; ``b``, booked on GPU-2 (NUMA 1) and not bound, takes the lock:
    kubelet is sent the held replica and NUMA 1's free replicas Healthy, every free replica of NUMA
    0 Unhealthy, and then the Node says the lock value. Once ``b`` is bound and Allocate served it
    (the plugin releases the lock after its own acknowledgement write, without a conflict), the
    steering ends."""
    async with running_plugin(with_kubelet=True, hide_replicas="steer") as (env, kubelet):
        assert kubelet is not None
        _restricted(env.plugin.room)
        env.server.put(scheduled_pod("a", ((dev("GPU-0", 4000, 30),),)))
        lock_node(env.server, "a")
        async with stub_for(env) as stub:
            await allocate(stub, "GPU-0-0")
        await eventually(lambda: NODE_LOCK not in _node_notes(env))
        await eventually(lambda: bool(kubelet.lists) and len(kubelet.lists[-1].devices) == 16)
        unsteered = _sent_healthy(kubelet.lists[-1])
        assert len(unsteered) > 2  # busy: GPU-0's free replicas hidden, the idle GPUs' listed

        env.server.put(booked_pod("b", ((dev("GPU-2", 4000, 30),),)))
        lock_node(env.server, "b")
        value = _node_notes(env)[NODE_LOCK]
        await eventually(lambda: _node_notes(env).get(DEVICES_LISTED_FOR) == value)
        numa1 = {f"GPU-{g}-{r}" for g in (2, 3) for r in range(4)}
        assert _sent_healthy(kubelet.lists[-1]) == {"GPU-0-0"} | numa1

        conflicts: list[Conflict] = []
        patch = env.client.patch_node_metadata

        async def recording(name: str, **kw: Any) -> Any:
            try:
                return await patch(name, **kw)
            except Conflict as exc:
                conflicts.append(exc)
                raise

        env.client.patch_node_metadata = recording  # type: ignore[method-assign]
        env.server.put(scheduled_pod("b", ((dev("GPU-2", 4000, 30),),)))
        await eventually(lambda: env.plugin.pods.pod("default/b") is not None)
        async with stub_for(env) as stub:
            await allocate(stub, "GPU-2-0")
        await eventually(lambda: NODE_LOCK not in _node_notes(env))
        assert conflicts == []
        await eventually(lambda: len(_sent_healthy(kubelet.lists[-1])) > 2)  # busy again
        assert _node_notes(env)[DEVICES_LISTED_FOR] == value  # kept: a nonce no later bind matches


async def test_a_gpu_healed_by_its_cdi_spec_is_never_offered_off_the_steered_numa_node(
    tmp_path: Path,
) -> None:
    """Steering for ``p`` (booked on GPU-0, NUMA 0) on an idle node; GPU-3 (NUMA 1) is unhealthy for
    want of a CDI spec, so none of its replicas was hidden or left out. Its spec appears: kubelet is
    sent one list, offering nothing on NUMA 1. The list sent before the room judged again offered
    all four of GPU-3's replicas."""
    specs = tmp_path / "cdi"
    gpu_spec(specs, "GPU-0", "GPU-1", "GPU-2")
    async with running_plugin(
        with_kubelet=True,
        hide_replicas="steer",
        device_list_strategy=("cdi-cri",),
        cdi_spec_dirs=(str(specs),),
    ) as (env, kubelet):
        cdi, room = env.plugin.cdi, _restricted(env.plugin.room)
        assert kubelet is not None and cdi is not None
        env.server.put(booked_pod("p", ((dev("GPU-0", 1000, 10),),)))
        lock_node(env.server, "p")
        value = _node_notes(env)[NODE_LOCK]
        await eventually(lambda: _node_notes(env).get(DEVICES_LISTED_FOR) == value)
        sent = len(kubelet.lists)
        gpu_spec(specs, "GPU-0", "GPU-1", "GPU-2", "GPU-3")
        cdi.apply(cdi.specs.scan())  # as each scan does
        assert env.plugin.inventory.is_healthy("GPU-3") and room.steering_applied
        await eventually(lambda: len(kubelet.lists) > sent)
        await asyncio.sleep(0.1)  # a second list would be here by now
        offered = [_sent_healthy(listed) for listed in kubelet.lists[sent:]]
        assert offered == [{"GPU-0-0", "GPU-1-0"}]


async def test_no_acknowledgement_before_a_stream_was_sent_the_list() -> None:
    """No ListAndWatch stream open: the plugin steers but acknowledges nothing; once kubelet opens
    one (its first answer is the steered list), it does."""
    async with running_plugin(hide_replicas="steer") as (env, _):
        _restricted(env.plugin.room)
        env.server.put(booked_pod("b", ((dev("GPU-1", 4000, 30),),)))
        lock_node(env.server, "b")
        value = _node_notes(env)[NODE_LOCK]
        await eventually(lambda: _healthy(env) == {"GPU-0-0", "GPU-1-0"})  # NUMA 0's listed one each
        await asyncio.sleep(0.3)
        assert DEVICES_LISTED_FOR not in _node_notes(env)
        async with stub_for(env) as stub, stub.ListAndWatch.open() as stream:
            await stream.send_message(pb.Empty(), end=True)
            first = await stream.recv_message()
            assert first is not None and _sent_healthy(first) == {"GPU-0-0", "GPU-1-0"}
            await eventually(lambda: _node_notes(env).get(DEVICES_LISTED_FOR) == value)
            await stream.cancel()  # the plugin's stream never ends on its own


@pytest.mark.parametrize(
    ("lock", "pod", "reason"),
    [
        ("not a lock", None, None),
        ("2026-01-01T00:00:00Z", None, None),  # HAMi's legacy form names no pod
        (None, None, "pod not found"),
        (None, {VGPU_NODE: "other-node"}, "booked or bound on another node"),
        (None, {DEVICES_ALLOCATED: "GPU-1,NVIDIA,oops"}, "cannot be decoded"),
    ],
)
async def test_a_lock_that_names_no_pod_to_steer_for_is_not_acknowledged(
    lock: str | None, pod: Mapping[str, str] | None, reason: str | None, logs: Logs
) -> None:
    """A malformed or legacy lock, a pod that is gone, booked on another node or whose booking
    cannot be decoded: no steering, no acknowledgement, logged; the next lock is served."""
    async with running_plugin(with_kubelet=True, hide_replicas="steer") as (env, kubelet):
        assert kubelet is not None
        _restricted(env.plugin.room)
        await eventually(lambda: bool(kubelet.lists) and len(kubelet.lists[-1].devices) == 4)
        before = _healthy(env)
        if pod is not None:
            env.server.put(booked_pod("b", ((dev("GPU-1", 4000, 30),),), **pod))
        if lock is None:
            lock_node(env.server, "b")
        else:
            env.server.patch("Node", None, NODE, {"metadata": {"annotations": {NODE_LOCK: lock}}})
        if reason is not None:
            await eventually(lambda: any(reason in r for r in _skipped(logs, "default/b")))
        else:
            await asyncio.sleep(0.3)
        assert DEVICES_LISTED_FOR not in _node_notes(env)
        assert _healthy(env) == before
        env.server.put(booked_pod("c", ((dev("GPU-3", 4000, 30),),)))
        lock_node(env.server, "c")
        value = _node_notes(env)[NODE_LOCK]
        await eventually(lambda: _node_notes(env).get(DEVICES_LISTED_FOR) == value)
        assert _sent_healthy(kubelet.lists[-1]) == {"GPU-2-0", "GPU-3-0"}  # NUMA 1's


async def test_steering_ends_when_the_lock_names_the_pod_no_more() -> None:
    """A bind that failed releases the lock: the pod is not bound here, its replicas are no longer
    steered for; a lock taken for another pod steers for that one alone."""
    async with running_plugin(with_kubelet=True, hide_replicas="steer") as (env, kubelet):
        assert kubelet is not None
        _restricted(env.plugin.room)
        await eventually(lambda: bool(kubelet.lists) and len(kubelet.lists[-1].devices) == 4)
        idle = _healthy(env)
        env.server.put(booked_pod("b", ((dev("GPU-1", 4000, 30),),)))
        env.server.put(booked_pod("c", ((dev("GPU-3", 4000, 30),),)))
        lock_node(env.server, "b")
        await eventually(lambda: DEVICES_LISTED_FOR in _node_notes(env))
        assert _healthy(env) == {"GPU-0-0", "GPU-1-0"}
        lock_node(env.server, "c")
        await eventually(lambda: _healthy(env) == {"GPU-2-0", "GPU-3-0"})
        env.server.patch("Node", None, NODE, {"metadata": {"annotations": {NODE_LOCK: None}}})
        await eventually(lambda: _healthy(env) == idle)


async def test_steering_for_a_pod_never_bound_ends_after_the_bind_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The lock stays on a pod deleted before it was bound (its scheduler stopped mid-bind): once
    no bind can still be waiting (``BIND_WINDOW_S``, 0.5 s here) the idle node's list is back."""
    monkeypatch.setattr(steering, "BIND_WINDOW_S", 0.5)
    async with running_plugin(with_kubelet=True, hide_replicas="steer") as (env, kubelet):
        assert kubelet is not None
        _restricted(env.plugin.room)
        await eventually(lambda: bool(kubelet.lists) and len(kubelet.lists[-1].devices) == 4)
        idle = _healthy(env)
        env.server.put(booked_pod("b", ((dev("GPU-1", 4000, 30),),)))
        lock_node(env.server, "b")
        await eventually(lambda: DEVICES_LISTED_FOR in _node_notes(env))
        assert _healthy(env) == {"GPU-0-0", "GPU-1-0"}
        env.server.delete("Pod", "default", "b")
        await eventually(lambda: _sent_healthy(kubelet.lists[-1]) == idle)
        assert NODE_LOCK in _node_notes(env)  # still naming the pod that is gone


async def test_the_plugins_own_node_write_is_read_back_before_the_watch_has_it() -> None:
    """The acknowledgement is the plugin's write right before the lock release after Allocate,
    which is guarded by the Node's resourceVersion: the node the plugin reads is its own write's
    until the watch caught up (else the release's first try conflicts)."""
    async with running_plugin(hide_replicas="steer") as (env, _):
        pods: NodePods = env.plugin.pods
        value = f"{format_rfc3339(datetime.now(UTC))},default,b"
        patched = await env.client.patch_node_metadata(NODE, annotations={DEVICES_LISTED_FOR: value})
        pods.remember_node(patched)
        node = pods.node()
        assert node is not None and resource_version(node) == resource_version(patched)
        await eventually(lambda: pods.node_cache.get(NODE) is not None and pods.node() is not patched)
        assert resource_version(pods.node()) == resource_version(patched)


async def test_no_acknowledgement_while_the_steering_cannot_be_applied() -> None:
    """A pod on the node whose booking cannot be read (its GPUs' room unknown) makes the plugin
    hide nothing: it confirms no list kubelet would choose by, and does once the pod is gone."""
    async with running_plugin(with_kubelet=True, hide_replicas="steer") as (env, kubelet):
        assert kubelet is not None
        _restricted(env.plugin.room)
        await eventually(lambda: bool(kubelet.lists) and len(kubelet.lists[-1].devices) == 4)
        bad = scheduled_pod("bad", ((dev("GPU-0", 1000, 10),),))
        bad["metadata"]["annotations"][DEVICES_ALLOCATED] = "garbage"
        env.server.put(bad)
        await eventually(lambda: env.plugin.pods.pod("default/bad") is not None)
        env.server.put(booked_pod("b", ((dev("GPU-3", 4000, 30),),)))
        lock_node(env.server, "b")
        value = _node_notes(env)[NODE_LOCK]
        await asyncio.sleep(0.5)
        assert DEVICES_LISTED_FOR not in _node_notes(env)
        env.server.delete("Pod", "default", "bad")
        await eventually(lambda: _node_notes(env).get(DEVICES_LISTED_FOR) == value)
        assert not any(h.startswith(("GPU-0", "GPU-1")) for h in _sent_healthy(kubelet.lists[-1]))
