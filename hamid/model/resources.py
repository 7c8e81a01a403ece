"""Resource names and per-container device requests (HAMi ``ContainerDeviceRequest``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hamid.model._wire import (
    INT32_MAX,
    INT32_MIN,
    is_decimal,
    load_yaml,
    type_name,
    want_bool,
    want_int,
    want_list,
    want_number,
    want_object,
    want_str,
)
from hamid.model.devices import NVIDIA
from hamid.model.errors import InvalidInput
from hamid.model.mig import AllowedMigProfiles, decode_mig_profile_allowlist
from hamid.model.nodeconfig import NodeConfig
from hamid.model.quantity import quantity_as_int

#: ``MemPercentagereq`` sentinel meaning "no percentage given".
MEM_PERCENTAGE_UNSET = 101


@dataclass(frozen=True, slots=True)
class ContainerDeviceRequest:
    """What one container asks of one device type (HAMi field names in snake case)."""

    nums: int
    type: str = NVIDIA
    memreq: int = 0
    mem_percentage_req: int = MEM_PERCENTAGE_UNSET
    coresreq: int = 0


@dataclass(frozen=True, slots=True)
class ResourceConfig:
    """HAMi's ``nvidia:`` device-config section (resource names and request defaults)."""

    resource_count_name: str = "nvidia.com/gpu"
    resource_memory_name: str = "nvidia.com/gpumem"
    resource_memory_percentage_name: str = "nvidia.com/gpumem-percentage"
    resource_core_name: str = "nvidia.com/gpucores"
    resource_priority_name: str = "nvidia.com/priority"
    default_memory: int = 0
    default_cores: int = 0
    default_gpu_num: int = 1
    memory_factor: int = 1
    overwrite_env: bool = False
    disable_core_limit: bool = False
    gpu_core_policy: str = "default"
    runtime_class_name: str = ""

    @property
    def resource_names(self) -> tuple[str, ...]:
        """Every HAMi resource name of the NVIDIA path (for ``managedResources``)."""
        return (
            self.resource_count_name,
            self.resource_memory_name,
            self.resource_memory_percentage_name,
            self.resource_core_name,
            self.resource_priority_name,
        )


# ==========================================================================================
# Device config (HAMi's device-config YAML, ``nvidia:`` section)
# ==========================================================================================


@dataclass(frozen=True, slots=True)
class DeviceConfig:
    """The ``nvidia:`` section of HAMi's device-config YAML: resource names and request defaults for
    the scheduler, and the node defaults (``deviceSplitCount`` ...) for the device plugin."""

    resources: ResourceConfig = field(default_factory=ResourceConfig)
    node_defaults: NodeConfig = field(default_factory=NodeConfig)
    #: ``migProfileAllowlist``: the dynamic MIG profiles permitted per GPU model (policy; NVML on the
    #: node gives each profile's memory, compute and placements).
    mig_profile_allowlist: tuple[AllowedMigProfiles, ...] = ()


_RESOURCE_KEYS: dict[str, tuple[str, str]] = {
    # YAML key -> (ResourceConfig field, kind)
    "resourceCountName": ("resource_count_name", "name"),
    "resourceMemoryName": ("resource_memory_name", "name"),
    "resourceMemoryPercentageName": ("resource_memory_percentage_name", "name"),
    "resourceCoreName": ("resource_core_name", "name"),
    "resourcePriorityName": ("resource_priority_name", "name"),
    "defaultMemory": ("default_memory", "count"),
    "defaultCores": ("default_cores", "count"),
    "defaultGPUNum": ("default_gpu_num", "count"),
    "memoryFactor": ("memory_factor", "count"),
    "overwriteEnv": ("overwrite_env", "bool"),
    "disableCoreLimit": ("disable_core_limit", "bool"),
    "gpuCorePolicy": ("gpu_core_policy", "policy"),
    "runtimeClassName": ("runtime_class_name", "str"),
}
_NODE_KEYS: dict[str, tuple[str, str]] = {
    "deviceSplitCount": ("device_split_count", "int"),
    "deviceMemoryScaling": ("device_memory_scaling", "number"),
    "deviceCoreScaling": ("device_core_scaling", "number"),
    "preConfiguredDeviceMemory": ("preconfigured_device_memory", "int"),
    "libCudaLogLevel": ("lib_cuda_log_level", "loglevel"),
    "enableNumaTopology": ("enable_numa_topology", "bool"),
}
GPU_CORE_POLICIES = ("default", "force", "disable")


def _config_value(value: object, kind: str, where: str) -> object:
    if kind == "name":
        text = want_str(value, where)
        if not text:
            raise InvalidInput(f"{where}: resource name must not be empty")
        return text
    if kind == "str":
        return want_str(value, where)
    if kind == "bool":
        return want_bool(value, where)
    if kind == "count":
        return want_int(value, where, 0, INT32_MAX)
    if kind == "int":
        return want_int(value, where, INT32_MIN, INT32_MAX)
    if kind == "number":
        return want_number(value, where)
    if kind == "policy":
        policy = want_str(value, where) or "default"
        if policy not in GPU_CORE_POLICIES:
            raise InvalidInput(
                f"{where}: unknown gpuCorePolicy {policy!r} (want {', '.join(GPU_CORE_POLICIES)})"
            )
        return policy
    # kind == "loglevel": YAML writes it as a number (chart: 1) or a string
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return str(value)
    text = want_str(value, where)
    if not is_decimal(text):
        raise InvalidInput(f"{where}: libCudaLogLevel {text!r} is not a non-negative integer")
    return text


def load_device_config(text: str) -> DeviceConfig:
    """Parse HAMi's device-config YAML and return its ``nvidia:`` section.

    Missing keys (or a missing ``nvidia:`` section, or an empty document) keep HAMi's defaults;
    unknown keys (other vendors, the legacy ``knownMigGeometries``, ...) are ignored. Wrong types,
    negative defaults, an empty resource name, an unknown ``gpuCorePolicy`` or a bad
    ``migProfileAllowlist`` entry raise InvalidInput naming the key.
    """
    if not isinstance(text, str):
        raise InvalidInput(f"device config: want YAML text, got {type_name(text)}")
    doc = load_yaml(text, "device config")
    if doc is None:
        return DeviceConfig()
    section_raw = want_object(doc, "device config").get("nvidia")
    if section_raw is None:
        return DeviceConfig()
    section = want_object(section_raw, "device config nvidia")
    resources: dict[str, object] = {}
    node: dict[str, object] = {}
    for keys, out in ((_RESOURCE_KEYS, resources), (_NODE_KEYS, node)):
        for key, (attr, kind) in keys.items():
            value = section.get(key)
            if value is not None:
                out[attr] = _config_value(value, kind, f"device config nvidia.{key}")
    try:
        node_defaults = NodeConfig(**node)  # type: ignore[arg-type]
    except InvalidInput as exc:
        raise InvalidInput(f"device config nvidia: {exc}") from None
    allowlist = decode_mig_profile_allowlist(
        section.get("migProfileAllowlist"), "device config nvidia.migProfileAllowlist"
    )
    return DeviceConfig(
        resources=ResourceConfig(**resources),  # type: ignore[arg-type]
        node_defaults=node_defaults,
        mig_profile_allowlist=allowlist,
    )


# ==========================================================================================
# Pods, containers and requests (pods are plain dicts in Kubernetes wire JSON form)
# ==========================================================================================

_META_STRINGS = ("name", "namespace", "uid", "generateName", "resourceVersion")


def check_pod_metadata(pod: Mapping[str, Any]) -> None:
    """Raise :class:`InvalidInput` unless ``pod.metadata`` has the shape of an ObjectMeta.

    ``metadata`` an object (or absent), its name, namespace, uid, generateName and
    resourceVersion strings, its labels and annotations objects of strings: what every reader of
    a pod's metadata may then rely on.
    """
    if not isinstance(pod, Mapping):
        raise InvalidInput(f"pod: want an object, got {type_name(pod)}")
    meta = pod.get("metadata")
    if meta is None:
        return
    want_object(meta, "pod metadata")
    for key in _META_STRINGS:
        if meta.get(key) is not None and not isinstance(meta[key], str):
            raise InvalidInput(f"pod metadata.{key}: want a string, got {type_name(meta[key])}")
    for key in ("labels", "annotations"):
        values = meta.get(key)
        if values is None:
            continue
        want_object(values, f"pod metadata.{key}")
        for name, value in values.items():
            if not isinstance(value, str):
                raise InvalidInput(f"pod metadata.{key}[{name!r:.80}]: want a string, got {type_name(value)}")


def _spec(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    if not isinstance(pod, Mapping):
        raise InvalidInput(f"pod: want an object, got {type_name(pod)}")
    spec = pod.get("spec")
    return {} if spec is None else want_object(spec, "pod spec")


def _container_list(spec: Mapping[str, Any], key: str) -> list[dict[str, Any]]:
    raw = spec.get(key)
    if raw is None:
        return []
    items = want_list(raw, f"pod spec.{key}")
    for i, c in enumerate(items):
        want_object(c, f"pod spec.{key}[{i}]")
    return list(items)


def all_containers(pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``spec.initContainers`` then ``spec.containers`` (the "container index" order everywhere)."""
    spec = _spec(pod)
    return _container_list(spec, "initContainers") + _container_list(spec, "containers")


def init_container_count(pod: Mapping[str, Any]) -> int:
    """How many init containers lead :func:`all_containers`."""
    return len(_container_list(_spec(pod), "initContainers"))


def is_sidecar(container: Mapping[str, Any]) -> bool:
    """True for a sidecar: an *init* container with ``restartPolicy: Always`` (call it on init containers)."""
    return isinstance(container, Mapping) and container.get("restartPolicy") == "Always"


def unlisted_containers(pod: Mapping[str, Any]) -> frozenset[str]:
    """The names of the containers kubelet's PodResources API does not report: the regular init
    containers. ``List`` and ``Get`` walk the restartable init containers (SidecarContainers, GA
    since 1.33) and ``spec.containers`` only (``server_v1.go``), yet kubelet keeps what a regular
    init container was given, less what later containers reused, until the pod ends."""
    regular = (c for c in _container_list(_spec(pod), "initContainers") if not is_sidecar(c))
    return frozenset(str(c.get("name") or "") for c in regular)


def resource_value(container: Mapping[str, Any], name: str, where: str = "container") -> tuple[bool, object]:
    """``(present, raw value)`` of resource ``name``: limits first, then requests (HAMi's order)."""
    resources_raw = container.get("resources")
    resources = {} if resources_raw is None else want_object(resources_raw, f"{where} resources")
    for section in ("limits", "requests"):
        raw = resources.get(section)
        values = {} if raw is None else want_object(raw, f"{where} resources.{section}")
        if name in values:
            return True, values[name]
    return False, None


def container_request(container: Mapping[str, Any], config: ResourceConfig) -> ContainerDeviceRequest | None:
    """HAMi's ``GenerateResourceRequests`` for one container; ``None`` when it asks for no GPU.

    Each resource is read from ``limits``, else ``requests``. Count absent, not an exact integer or
    ``< 1`` → ``None``. Memory must be an integer in ``[0, MaxInt32 // factor]`` (factor =
    ``max(memoryFactor, 1)``) or the whole request is ``None``; it is multiplied by the factor.
    Percentage: 101 = unset, ``> 100`` → 100, ``<= 0`` (or not an integer) → unset. With no memory and
    no percentage: ``defaultMemory`` if set (percentage stays 101), else 100 %. Cores: given value, else
    ``defaultCores`` (also for one that is not an integer); an integer outside ``[0, MaxInt32]`` makes
    the whole request ``None``.
    """
    where = f"container {container.get('name')!r}" if isinstance(container, Mapping) else "container"
    if not isinstance(container, Mapping):
        raise InvalidInput(f"{where}: want an object, got {type_name(container)}")
    found, raw = resource_value(container, config.resource_count_name, where)
    if not found:
        return None
    nums = quantity_as_int(raw, f"{where} {config.resource_count_name}")
    if nums is None or nums < 1 or nums > INT32_MAX:
        return None

    factor = max(config.memory_factor, 1)
    memnum = 0
    found, raw = resource_value(container, config.resource_memory_name, where)
    if found:
        mem = quantity_as_int(raw, f"{where} {config.resource_memory_name}")
        if mem is None or not 0 <= mem <= INT32_MAX // factor:
            return None
        memnum = mem * factor

    mempct = MEM_PERCENTAGE_UNSET
    found, raw = resource_value(container, config.resource_memory_percentage_name, where)
    if found:
        pct = quantity_as_int(raw, f"{where} {config.resource_memory_percentage_name}")
        if pct is not None and pct > 0:
            mempct = min(pct, 100)
    if mempct == MEM_PERCENTAGE_UNSET and memnum == 0:
        if config.default_memory != 0:
            memnum = config.default_memory
        else:
            mempct = 100

    cores = config.default_cores
    found, raw = resource_value(container, config.resource_core_name, where)
    if found:  # not an integer: the default, as HAMi (its webhook refuses one out of range)
        value = quantity_as_int(raw, f"{where} {config.resource_core_name}")
        if value is not None and not 0 <= value <= INT32_MAX:
            return None
        cores = cores if value is None else value
    return ContainerDeviceRequest(
        nums=nums, type=NVIDIA, memreq=memnum, mem_percentage_req=mempct, coresreq=cores
    )


def pod_requests(pod: Mapping[str, Any], config: ResourceConfig) -> list[ContainerDeviceRequest | None]:
    """One entry per container, init containers first (``None`` where a container asks for no GPU)."""
    return [container_request(c, config) for c in all_containers(pod)]
