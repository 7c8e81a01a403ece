"""What ``Allocate`` answers for a served container: HAMi-core's environment and mounts (pure), to
which the runtime-facing part (:mod:`hamid.plugin.device_lists`) and the device nodes when they are
declared (:mod:`hamid.plugin.device_nodes`) are added."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hamid.model import hamicore
from hamid.model._wire import parse_go_bool
from hamid.model.devices import ContainerDevices
from hamid.model.errors import InvalidInput
from hamid.plugin.device_nodes import DeviceSpec


def env_is_true(container: Mapping[str, Any] | None, name: str) -> bool:
    """Whether some entry of env ``name`` in the container spec is a Go ``ParseBool`` true value
    (HAMi skips the false and unparsable ones and acts on any true one)."""
    for env in (container or {}).get("env") or []:
        if env.get("name") == name:
            try:
                if parse_go_bool(str(env.get("value", "")), name):
                    return True
            except InvalidInput:
                continue
    return False


@dataclass(frozen=True, slots=True)
class HamiCoreSettings:
    """Node settings that shape the HAMi-core part of an Allocate answer."""

    hook_path: str
    oversubscribe: bool = False
    log_level: str = ""
    disable_core_limit: bool = False


@dataclass(frozen=True, slots=True)
class MountSpec:
    """One bind mount of the answer."""

    container_path: str
    host_path: str
    read_only: bool


@dataclass(frozen=True, slots=True)
class ContainerAnswer:
    """Envs, mounts, device nodes (``--pass-device-specs``), annotations and CDI devices for one
    container, plus the host directory that must exist."""

    envs: dict[str, str]
    mounts: tuple[MountSpec, ...]
    cache_dir: str
    devices: tuple[DeviceSpec, ...] = ()
    annotations: dict[str, str] = field(default_factory=dict)
    cdi_devices: tuple[str, ...] = ()


def hami_core_answer(
    devices: ContainerDevices,
    pod_uid: str,
    container: Mapping[str, Any] | None,
    settings: HamiCoreSettings,
    cache_token: str,
    *,
    licensed: bool = False,
) -> ContainerAnswer:
    """The env vars and mounts HAMi-core needs for one container (docs/hami-wire.md §4.9).

    ``licensed``: ``<HOOK_PATH>/vgpu/license`` exists on the host (checked by the caller, in a
    thread); the license and ``vgpuvalidator`` are then mounted read-only as HAMi does.
    """
    envs: dict[str, str] = {}
    for position, device in enumerate(devices):
        envs[hamicore.memory_limit_env(position)] = hamicore.memory_limit_value(device.usedmem)
    envs[hamicore.ENV_SM_LIMIT] = str(devices[0].usedcores)
    envs[hamicore.ENV_SHARED_CACHE] = hamicore.shared_cache_path(settings.hook_path, cache_token)
    if settings.oversubscribe:
        envs[hamicore.ENV_OVERSUBSCRIBE] = "true"
    if settings.log_level:
        envs[hamicore.ENV_LOG_LEVEL] = settings.log_level
    if settings.disable_core_limit:
        envs[hamicore.ENV_CORE_UTILIZATION_POLICY] = hamicore.CORE_UTILIZATION_POLICY_DISABLE
    name = str((container or {}).get("name", ""))
    cache_dir = hamicore.container_cache_dir(settings.hook_path, pod_uid, name)
    lib = hamicore.libvgpu_path(settings.hook_path)
    mounts = [
        MountSpec(lib, lib, True),
        MountSpec(hamicore.vgpu_dir(settings.hook_path), cache_dir, False),
        MountSpec(hamicore.VGPU_LOCK_DIR, hamicore.VGPU_LOCK_DIR, False),
    ]
    if not env_is_true(container, hamicore.ENV_DISABLE_CONTROL):
        mounts.append(
            MountSpec(hamicore.LD_SO_PRELOAD, hamicore.ld_so_preload_host_path(settings.hook_path), True)
        )
    if licensed:
        mounts.append(MountSpec(hamicore.LICENSE, hamicore.license_host_path(settings.hook_path), True))
        mounts.append(
            MountSpec(hamicore.VGPU_VALIDATOR, hamicore.vgpu_validator_host_path(settings.hook_path), True)
        )
    return ContainerAnswer(envs, tuple(mounts), cache_dir)
