"""How ``Allocate`` names a container's GPUs to the container runtime (``--device-list-strategy``).

The answer has the shapes of HAMi's ``getAllocateResponse`` (NVIDIA's plugin's), for the GPUs the
container is booked (never those kubelet's replicas sit on): ``envvar`` sets
``NVIDIA_VISIBLE_DEVICES`` to their UUIDs; ``volume-mounts`` sets it to a directory and mounts
``/dev/null`` there once per GPU, named by its UUID (the NVIDIA runtime reads the names, which an
image cannot override through its env); ``cdi-annotations`` and ``cdi-cri`` name CDI devices
(``nvidia.com/gpu=<UUID>``), in an annotation or in the answer's ``cdi_devices``. When every
strategy is a CDI one the runtime's env and device nodes are left to the CDI spec, as upstream does:
no ``NVIDIA_VISIBLE_DEVICES`` (the spec of ``nvidia-ctk`` sets it to ``void``), no ``DeviceSpec``,
no feature switches (the features are CDI devices then). HAMi-core's env and mounts are added by
the caller in every case: they are what enforce the limits. Pure.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from hamid.model import cdi, hamicore
from hamid.model import nvidia_runtime as nv
from hamid.plugin.hamicore_answer import ContainerAnswer, MountSpec


def check_strategies(values: Iterable[str]) -> tuple[str, ...]:
    """The strategies named (blank entries skipped, each once, in order); ValueError for an unknown
    one or for none."""
    chosen = tuple(dict.fromkeys(v.strip() for v in values if v.strip()))
    unknown = [v for v in chosen if v not in nv.STRATEGIES]
    if unknown:
        raise ValueError(
            f"{', '.join(map(repr, unknown))}: not a device list strategy; "
            f"choose from {', '.join(nv.STRATEGIES)}"
        )
    if not chosen:
        raise ValueError(f"no device list strategy; at least one of {', '.join(nv.STRATEGIES)}")
    return chosen


@dataclass(frozen=True, slots=True)
class DeviceListAnswer:
    """The runtime-facing part of one container's answer (HAMi-core's part follows it)."""

    envs: dict[str, str] = field(default_factory=dict)
    mounts: tuple[MountSpec, ...] = ()
    annotations: dict[str, str] = field(default_factory=dict)
    cdi_devices: tuple[str, ...] = ()

    def before(self, core: ContainerAnswer) -> ContainerAnswer:
        """``core`` (HAMi-core's answer) with this part first, as HAMi appends its own to it."""
        return ContainerAnswer(
            envs={**self.envs, **core.envs},
            mounts=(*self.mounts, *core.mounts),
            cache_dir=core.cache_dir,
            devices=core.devices,
            annotations=dict(self.annotations),
            cdi_devices=self.cdi_devices,
        )


@dataclass(frozen=True, slots=True)
class DeviceLists:
    """The strategies in use and the features (``--gdrcopy-enabled`` ...) every GPU container gets."""

    strategies: tuple[str, ...] = (nv.ENVVAR,)
    features: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "strategies", check_strategies(self.strategies))
        unknown = set(self.features) - set(nv.FEATURES)
        if unknown:
            raise ValueError(f"unknown features {sorted(unknown)}")

    @property
    def any_cdi(self) -> bool:
        """Whether devices are named through CDI (a spec must define them)."""
        return any(s in nv.CDI_STRATEGIES for s in self.strategies)

    @property
    def all_cdi(self) -> bool:
        """Whether devices are named through CDI only (no env, no device nodes from the plugin)."""
        return all(s in nv.CDI_STRATEGIES for s in self.strategies)

    @staticmethod
    def gpu_cdi_name(uuid: str) -> str:
        """The CDI device a GPU is named by (by UUID: the only ``--device-id-strategy`` built)."""
        return cdi.qualified_name(nv.GPU_KIND, uuid)

    def cdi_names(self, uuids: Sequence[str]) -> tuple[str, ...]:
        """The CDI devices of a container with these GPUs: each GPU's, then each feature's."""
        if not self.any_cdi:
            return ()
        gpus = (self.gpu_cdi_name(u) for u in uuids)
        features = (cdi.qualified_name(nv.feature_kind(f), nv.FEATURE_DEVICE) for f in self.features)
        return (*gpus, *features)

    def answer(self, uuids: Sequence[str], response_id: str) -> DeviceListAnswer:
        """The runtime-facing answer for a container booked these GPUs (distinct, in booking
        order); ``response_id`` makes the annotation key unique (HAMi: a random UUID per answer)."""
        names = self.cdi_names(uuids)
        annotations: dict[str, str] = {}
        if names and nv.CDI_ANNOTATIONS in self.strategies:
            key = cdi.annotation_key(nv.CDI_ANNOTATION_PLUGIN, response_id)
            annotations[key] = cdi.annotation_value(names)
        cdi_devices = names if nv.CDI_CRI in self.strategies else ()
        if self.all_cdi:
            return DeviceListAnswer(annotations=annotations, cdi_devices=cdi_devices)
        envs: dict[str, str] = {}
        mounts: tuple[MountSpec, ...] = ()
        if nv.ENVVAR in self.strategies:
            envs[hamicore.ENV_VISIBLE_DEVICES] = ",".join(uuids)
        if nv.VOLUME_MOUNTS in self.strategies:
            envs[hamicore.ENV_VISIBLE_DEVICES] = nv.VOLUME_MOUNTS_ROOT
            mounts = tuple(
                MountSpec(posixpath.join(nv.VOLUME_MOUNTS_ROOT, u), nv.VOLUME_MOUNTS_HOST_PATH, False)
                for u in uuids
            )
        for feature in self.features:
            envs[nv.FEATURE_ENVS[feature]] = nv.FEATURE_ENABLED
        return DeviceListAnswer(envs, mounts, annotations, cdi_devices)
