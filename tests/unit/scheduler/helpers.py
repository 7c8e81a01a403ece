"""Builders of node and pod dicts (Kubernetes wire form) for scheduler tests."""

from __future__ import annotations

import itertools
from typing import Any

from hamid.model import annotations as ann
from hamid.model.devices import MODE_HAMI_CORE, DeviceInfo
from hamid.scheduler.ledger import Hold, Ledger
from hamid.scheduler.signing import AllocationKeys


def gpu(
    uuid: str, index: int = 0, numa: int = 0, count: int = 10, mem: int = 8000, core: int = 100
) -> DeviceInfo:
    """A healthy hami-core GPU record."""
    return DeviceInfo(
        id=uuid,
        index=index,
        count=count,
        devmem=mem,
        devcore=core,
        type="NVIDIA-A100",
        numa=numa,
        mode=MODE_HAMI_CORE,
        health=True,
    )


def node(name: str, gpus: int = 2, allocatable: int = 20, **annotations: str) -> dict[str, Any]:
    """A node registering ``gpus`` GPUs named ``<name>-gpu<i>``."""
    devices = [gpu(f"{name}-gpu{i}", index=i) for i in range(gpus)]
    annos = {ann.NODE_REGISTER: ann.encode_node_devices(devices), **annotations}
    return {
        "metadata": {"name": name, "annotations": annos},
        "status": {"allocatable": {"nvidia.com/gpu": str(allocatable)}},
    }


def container(
    name: str, gpus: int = 0, mem: int = 0, cores: int | None = None, **extra: Any
) -> dict[str, Any]:
    """A container asking for ``gpus`` GPUs with ``mem`` MiB and ``cores`` %."""
    limits: dict[str, str] = {}
    if gpus:
        limits["nvidia.com/gpu"] = str(gpus)
        if mem:
            limits["nvidia.com/gpumem"] = str(mem)
        if cores is not None:
            limits["nvidia.com/gpucores"] = str(cores)
    out: dict[str, Any] = {"name": name, "image": "busybox", **extra}
    if limits:
        out["resources"] = {"limits": limits}
    return out


def pod(
    name: str,
    uid: str | None = None,
    containers: list[dict[str, Any]] | None = None,
    init: list[dict[str, Any]] | None = None,
    namespace: str = "default",
    annotations: dict[str, str] | None = None,
    phase: str = "Pending",
    status: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A pod dict; default one container with 1 GPU, 1000 MiB, 10 % cores."""
    spec: dict[str, Any] = {"containers": containers or [container("main", 1, 1000, 10)]}
    if init:
        spec["initContainers"] = init
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid or f"uid-{name}",
            "annotations": dict(annotations or {}),
        },
        "spec": spec,
        "status": {"phase": phase, **(status or {})},
    }


def placed(p: dict[str, Any], node_name: str, allocated: str) -> dict[str, Any]:
    """The pod with the filter's annotations (node + allocation)."""
    p["metadata"]["annotations"].update(
        {ann.VGPU_NODE: node_name, ann.DEVICES_ALLOCATED: allocated, ann.DEVICES_TO_ALLOCATE: allocated}
    )
    return p


def ticking_keys(*keys: bytes) -> AllocationKeys:
    """A key ring whose signatures are issued 1 s apart (so "signed later" is never a tie)."""
    tick = itertools.count(1)
    return AllocationKeys(keys or (b"test-key-0123456789abcdef0123456789",), clock=lambda: float(next(tick)))


def signed(p: dict[str, Any], keys: AllocationKeys) -> dict[str, Any]:
    """The pod with ``keys``' signature over its current node and allocation annotations."""
    notes = p["metadata"]["annotations"]
    uid = p["metadata"]["uid"]
    notes[ann.ALLOCATION_SIGNATURE] = keys.sign(uid, notes[ann.VGPU_NODE], notes[ann.DEVICES_ALLOCATED])
    return p


def refit_in_flight(ledger: Ledger, uid: str, node_name: str, new: str) -> Hold:
    """This replica's refit of ``uid`` onto allocation ``new`` before its patch is answered:
    moved, its old GPUs held (no pod event decides the hold yet)."""
    res = ledger.reservation(uid)
    assert res is not None
    hold = ledger.hold(uid, node_name, res.applied, "default", 0, 0)
    sig = ledger.signature(uid, node_name, new)[ann.ALLOCATION_SIGNATURE]
    ledger.move(uid, tuple(ann.decode_pod_devices(new)), new, sig)
    return hold


def undecided_refit(ledger: Ledger, uid: str, node_name: str, new: str, version: str) -> Hold:
    """:func:`refit_in_flight` whose patch's outcome is unknown since the pod's resourceVersion
    ``version``."""
    hold = refit_in_flight(ledger, uid, node_name, new)
    ledger.settle_on_event(hold, version)
    return hold
