"""Builders shared by the fit tests."""

from __future__ import annotations

from hamid.fit import ContainerKind, DeviceUsage, Fitted, NodeUsage, PodFitSpec, PodPolicy, Unfit
from hamid.model.devices import MODE_HAMI_CORE, NVIDIA, ContainerDevice
from hamid.model.resources import MEM_PERCENTAGE_UNSET, ContainerDeviceRequest

GPU_TYPE = "NVIDIA-A100"


def dev(
    uuid: str,
    index: int = 0,
    *,
    count: int = 10,
    mem: int = 40000,
    core: int = 100,
    numa: int = 0,
    used: int = 0,
    usedmem: int = 0,
    usedcores: int = 0,
    health: bool = True,
    type: str = GPU_TYPE,
    mode: str = MODE_HAMI_CORE,
) -> DeviceUsage:
    """A device with the given usage."""
    return DeviceUsage(
        id=uuid,
        index=index,
        count=count,
        totalmem=mem,
        totalcore=core,
        type=type,
        numa=numa,
        mode=mode,
        health=health,
        used=used,
        usedmem=usedmem,
        usedcores=usedcores,
    )


def node(*devices: DeviceUsage, name: str = "n1", cordoned=(), pair_scores=None) -> NodeUsage:
    """A node of the given devices."""
    return NodeUsage(name, devices, pair_scores=pair_scores, cordoned=cordoned)


def req(
    nums: int = 1, mem: int = 0, cores: int = 0, pct: int = MEM_PERCENTAGE_UNSET
) -> ContainerDeviceRequest:
    """An NVIDIA request."""
    return ContainerDeviceRequest(nums=nums, type=NVIDIA, memreq=mem, mem_percentage_req=pct, coresreq=cores)


def cd(uuid: str, mem: int, cores: int = 0) -> ContainerDevice:
    """One allocated device entry."""
    return ContainerDevice(uuid, NVIDIA, mem, cores)


def spec(*requests, kinds=None, policy: PodPolicy | None = None, **policy_kw) -> PodFitSpec:
    """A pod fit spec; all containers are app containers unless ``kinds`` says otherwise."""
    if policy is None:
        policy = PodPolicy.default(**policy_kw)
    return PodFitSpec(
        requests=tuple(requests),
        kinds=tuple(kinds) if kinds is not None else (ContainerKind.APP,) * len(requests),
        policy=policy,
    )


#: Short names for container kinds in layouts: regular init, sidecar, app.
I = ContainerKind.INIT  # noqa: E741
S = ContainerKind.SIDECAR
A = ContainerKind.APP


def fitted(result: Fitted | Unfit) -> Fitted:
    """``result``, which the test expects to be a fit."""
    assert isinstance(result, Fitted), result
    return result
