"""The pure parts of the ``steer`` handshake: which pod a node lock steers for, and when a
steered list counts as sent (:mod:`hamid.plugin.steering`, :class:`hamid.plugin.service.SentLists`)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from hamid.model.annotations import (
    BIND_PHASE,
    DEVICES_ALLOCATED,
    DEVICES_TO_ALLOCATE,
    VGPU_NODE,
    encode_pod_devices,
)
from hamid.model.devices import ContainerDevice
from hamid.plugin.service import SentLists
from hamid.plugin.steering import binding_needs
from tests.builders import container, pod

RESOURCE = "nvidia.com/gpu"


def _booked(notes: dict[str, Any] | None = None, **kw: Any) -> Any:
    """A pod the filter booked on ``n1`` (two replicas of GPU-0, one of GPU-1), not bound yet."""
    devices = (
        (ContainerDevice("GPU-0", "NVIDIA", 1000, 10), ContainerDevice("GPU-1", "NVIDIA", 1000, 10)),
        (ContainerDevice("GPU-0", "NVIDIA", 1000, 10),),
    )
    value = encode_pod_devices(devices)
    annotations = {DEVICES_ALLOCATED: value, DEVICES_TO_ALLOCATE: value, VGPU_NODE: "n1", **(notes or {})}
    limits = {RESOURCE: 1}
    return pod("b", annotations=annotations, containers=[container(limits=limits)] * 2, **kw)


def test_the_locked_pods_pending_entries_are_what_it_needs() -> None:
    assert binding_needs(_booked(), "n1", RESOURCE) == {"GPU-0": 2, "GPU-1": 1}
    assert binding_needs(_booked(node="n1"), "n1", RESOURCE) == {"GPU-0": 2, "GPU-1": 1}


@pytest.mark.parametrize(
    ("notes", "kw", "why"),
    [
        ({VGPU_NODE: "n2"}, {}, "another node"),
        ({}, {"node": "n2"}, "another node"),
        ({BIND_PHASE: "failed"}, {}, "not waiting"),
        ({}, {"status": {"phase": "Running"}}, "not waiting"),
        ({DEVICES_TO_ALLOCATE: encode_pod_devices(((), ()))}, {}, "nothing pending"),
        ({DEVICES_ALLOCATED: "GPU-0,NVIDIA"}, {}, "cannot be decoded"),
        ({DEVICES_TO_ALLOCATE: ";;;,"}, {}, "cannot be decoded"),
    ],
)
def test_no_steering_for_a_pod_that_is_not_waiting_for_its_devices_here(
    notes: dict[str, str], kw: dict[str, Any], why: str
) -> None:
    needs = binding_needs(_booked(notes, **kw), "n1", RESOURCE)
    assert isinstance(needs, str) and why in needs, needs
    assert binding_needs(None, "n1", RESOURCE) == "pod not found"


async def test_a_generation_counts_as_sent_once_every_open_stream_sent_it() -> None:
    sent = SentLists()
    assert not sent.sent(0)  # no stream: kubelet has nothing
    waiting = asyncio.create_task(sent.wait_sent(3))
    with sent.stream() as first, sent.stream() as second:
        first(3)
        await asyncio.sleep(0)
        assert not waiting.done()  # the second stream has not sent it yet
        second(4)
        await asyncio.wait_for(waiting, 1)
        assert sent.sent(3) and not sent.sent(4)
    assert not sent.sent(0)
    late = asyncio.create_task(sent.wait_sent(5))
    with sent.stream() as third:  # a stream opened later: its first list is current
        third(5)
        await asyncio.wait_for(late, 1)
