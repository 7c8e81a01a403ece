"""GPU discovery: NVML (through ``pynvml``) or a static inventory file, and NVML XID health events.

Everything here blocks (NVML calls, file reads): call it in a thread (``asyncio.to_thread``).
Both sources produce the same :class:`PhysicalGpu` records, so everything downstream is shared.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

from hamid.log import get_logger
from hamid.model.errors import InvalidInput

log = get_logger("plugin.discovery")

#: XIDs that are application errors, never a GPU fault (NVIDIA device plugin v0.18 list).
IGNORED_XIDS = frozenset({13, 31, 43, 45, 68, 109})
#: How long one NVML event wait blocks (ms); bounds how fast the health thread notices a stop.
EVENT_WAIT_MS = 1000

_FILE_KEYS = ("uuid", "index", "name", "memoryMiB", "numa", "pciBusId", "migEnabled", "healthy")
_REQUIRED_FILE_KEYS = ("uuid", "index", "name", "memoryMiB", "numa", "pciBusId")


class NvmlUnavailable(RuntimeError):
    """NVML cannot be loaded or initialised on this machine."""


@dataclass(frozen=True, slots=True)
class PhysicalGpu:
    """One physical GPU as discovered (``numa`` None = unknown NUMA node)."""

    uuid: str
    index: int
    name: str
    memory_mib: int
    numa: int | None
    pci_bus_id: str
    mig_enabled: bool = False
    healthy: bool = True


# --- static inventory ---------------------------------------------------------------------------


def load_devices_file(path: str | os.PathLike[str]) -> list[PhysicalGpu]:
    """Read a static inventory (YAML or JSON): a top-level ``devices:`` list (see the module docs).

    Raises :class:`InvalidInput` naming the file and the offending item on any malformed entry.
    """
    text = Path(path).read_text(encoding="utf-8")
    return parse_devices_text(text, source=str(path))


def parse_devices_text(text: str, source: str = "<devices file>") -> list[PhysicalGpu]:
    """Parse the text of a static inventory (JSON is valid YAML, so one parser reads both)."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InvalidInput(f"{source}: not valid YAML/JSON: {exc}") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("devices"), list):
        raise InvalidInput(f"{source}: expected a top-level 'devices:' list")
    gpus: list[PhysicalGpu] = []
    for position, item in enumerate(doc["devices"]):
        gpus.append(_parse_device_item(item, f"{source}: devices[{position}]"))
    _check_unique(gpus, source)
    return gpus


def _parse_device_item(item: Any, where: str) -> PhysicalGpu:
    if not isinstance(item, dict):
        raise InvalidInput(f"{where}: expected a mapping")
    unknown = sorted(set(item) - set(_FILE_KEYS))
    if unknown:
        raise InvalidInput(f"{where}: unknown keys {unknown}; allowed: {list(_FILE_KEYS)}")
    missing = [k for k in _REQUIRED_FILE_KEYS if k not in item]
    if missing:
        raise InvalidInput(f"{where}: missing keys {missing}")
    uuid, name, bus = item["uuid"], item["name"], item["pciBusId"]
    if not isinstance(uuid, str) or not uuid.strip() or any(c in uuid for c in ",:; "):
        raise InvalidInput(f"{where}: uuid must be a non-empty string without ',', ':', ';' or spaces")
    if not isinstance(name, str) or not name:
        raise InvalidInput(f"{where}: name must be a non-empty string")
    if not isinstance(bus, str):
        raise InvalidInput(f"{where}: pciBusId must be a string")
    index = _int_field(item, "index", where, minimum=0)
    memory = _int_field(item, "memoryMiB", where, minimum=0)
    numa = _int_field(item, "numa", where, minimum=-1)
    mig = _bool_field(item, "migEnabled", where, default=False)
    healthy = _bool_field(item, "healthy", where, default=True)
    return PhysicalGpu(
        uuid=uuid,
        index=index,
        name=name,
        memory_mib=memory,
        numa=None if numa < 0 else numa,
        pci_bus_id=bus,
        mig_enabled=mig,
        healthy=healthy,
    )


def _int_field(item: Mapping[str, Any], key: str, where: str, *, minimum: int) -> int:
    value = item[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidInput(f"{where}: {key} must be an integer >= {minimum}, got {value!r}")
    return value


def _bool_field(item: Mapping[str, Any], key: str, where: str, *, default: bool) -> bool:
    value = item.get(key, default)
    if not isinstance(value, bool):
        raise InvalidInput(f"{where}: {key} must be true or false, got {value!r}")
    return value


def _check_unique(gpus: Iterable[PhysicalGpu], source: str) -> None:
    seen_uuid: set[str] = set()
    seen_index: set[int] = set()
    for gpu in gpus:
        if gpu.uuid in seen_uuid:
            raise InvalidInput(f"{source}: duplicate uuid {gpu.uuid}")
        if gpu.index in seen_index:
            raise InvalidInput(f"{source}: duplicate index {gpu.index}")
        seen_uuid.add(gpu.uuid)
        seen_index.add(gpu.index)


# --- NVML -----------------------------------------------------------------------------------------


def import_nvml() -> ModuleType:
    """Import ``pynvml`` and initialise NVML, or raise :class:`NvmlUnavailable` with the reason."""
    try:
        import pynvml
    except ImportError as exc:
        raise NvmlUnavailable(f"the pynvml module is not installed: {exc}") from exc
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise NvmlUnavailable(f"NVML could not be initialised: {exc}") from exc
    except OSError as exc:  # the library itself cannot be loaded
        raise NvmlUnavailable(f"the NVML library could not be loaded: {exc}") from exc
    return pynvml


def sysfs_bus_id(pci_bus_id: str) -> str:
    """NVML's ``00000000:3B:00.0`` → sysfs' ``0000:3b:00.0`` (4-digit domain, lower case)."""
    bus = pci_bus_id.strip().lower()
    domain, sep, rest = bus.partition(":")
    if not sep:
        return bus
    return f"{domain[-4:].rjust(4, '0')}:{rest}"


def numa_from_sysfs(pci_bus_id: str, sysfs_root: str | os.PathLike[str] = "/sys") -> int | None:
    """The NUMA node of a PCI device from ``<sysfs_root>/bus/pci/devices/<bdf>/numa_node``.

    Unreadable, non-integer or negative (``-1``) values mean unknown (None).
    """
    if not pci_bus_id:
        return None
    path = Path(sysfs_root, "bus", "pci", "devices", sysfs_bus_id(pci_bus_id), "numa_node")
    try:
        value = int(path.read_text(encoding="ascii").strip())
    except (OSError, ValueError):
        return None
    return value if value >= 0 else None


def _text(value: str | bytes) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def discover_nvml(
    sysfs_root: str | os.PathLike[str] = "/sys", nvml: ModuleType | None = None
) -> list[PhysicalGpu]:
    """Enumerate GPUs through NVML (blocking; call it in a thread).

    A GPU whose UUID cannot be read is skipped (logged); a GPU whose other attributes fail is kept
    and marked unhealthy, so one bad card never takes the node down. ``nvml`` is the ``pynvml``
    module (injected by tests); by default it is imported and initialised here.
    """
    lib = nvml if nvml is not None else import_nvml()
    try:
        count = lib.nvmlDeviceGetCount()
    except lib.NVMLError as exc:
        raise NvmlUnavailable(f"NVML could not count devices: {exc}") from exc
    gpus: list[PhysicalGpu] = []
    for index in range(count):
        gpu = _probe_device(lib, index, sysfs_root)
        if gpu is not None:
            gpus.append(gpu)
    return gpus


def _probe_device(lib: ModuleType, index: int, sysfs_root: str | os.PathLike[str]) -> PhysicalGpu | None:
    try:
        handle = lib.nvmlDeviceGetHandleByIndex(index)
        uuid = _text(lib.nvmlDeviceGetUUID(handle))
    except lib.NVMLError as exc:
        log.error("gpu skipped: NVML cannot identify it", index=index, error=str(exc))
        return None
    healthy = True
    name, memory, bus, mig = "", 0, "", False
    try:
        name = _text(lib.nvmlDeviceGetName(handle))
    except lib.NVMLError as exc:
        healthy = False
        log.error("gpu marked unhealthy: name unreadable", uuid=uuid, error=str(exc))
    try:
        memory = int(lib.nvmlDeviceGetMemoryInfo(handle).total) // (1024 * 1024)
    except lib.NVMLError as exc:
        if getattr(exc, "value", None) != lib.NVML_ERROR_NOT_SUPPORTED:
            healthy = False
        log.warning("gpu memory unreadable", uuid=uuid, error=str(exc))
    try:
        bus = _text(lib.nvmlDeviceGetPciInfo(handle).busId)
    except lib.NVMLError as exc:
        log.warning("gpu PCI bus id unreadable; NUMA unknown", uuid=uuid, error=str(exc))
    try:
        current, _pending = lib.nvmlDeviceGetMigMode(handle)
        mig = current == lib.NVML_DEVICE_MIG_ENABLE
    except lib.NVMLError as exc:
        if getattr(exc, "value", None) != lib.NVML_ERROR_NOT_SUPPORTED:
            log.warning("gpu MIG mode unreadable", uuid=uuid, error=str(exc))
    return PhysicalGpu(
        uuid=uuid,
        index=index,
        name=name or "Unknown",
        memory_mib=memory,
        numa=numa_from_sysfs(bus, sysfs_root),
        pci_bus_id=bus,
        mig_enabled=mig,
        healthy=healthy,
    )


# --- XID health --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HealthCheckPolicy:
    """Which XIDs mark a GPU unhealthy (from ``DP_DISABLE_HEALTHCHECKS``/``DP_ENABLE_HEALTHCHECKS``)."""

    enabled: bool = True
    ignored: frozenset[int] = IGNORED_XIDS
    forced: frozenset[int] = frozenset()
    force_all: bool = False

    def is_critical(self, xid: int) -> bool:
        """Whether XID ``xid`` marks the GPU unhealthy."""
        if self.force_all or xid in self.forced:
            return True
        return self.enabled and xid not in self.ignored

    @property
    def active(self) -> bool:
        """Whether any XID can mark a GPU unhealthy (else the event thread is not started)."""
        return self.enabled or self.force_all or bool(self.forced)


def _xid_list(value: str, env: str) -> frozenset[int]:
    xids: set[int] = set()
    for part in value.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            xids.add(int(part))
        except ValueError as exc:
            raise InvalidInput(f"{env}: {part!r} is not an XID number (or 'all'/'xids')") from exc
    return frozenset(xids)


def health_policy_from_env(env: Mapping[str, str]) -> HealthCheckPolicy:
    """Build the policy as the NVIDIA device plugin reads it from its environment."""
    disabled = env.get("DP_DISABLE_HEALTHCHECKS", "").strip().lower()
    enabled_env = env.get("DP_ENABLE_HEALTHCHECKS", "").strip().lower()
    off = disabled in ("all", "xids")
    ignored = IGNORED_XIDS if off else IGNORED_XIDS | _xid_list(disabled, "DP_DISABLE_HEALTHCHECKS")
    force_all = enabled_env in ("all", "xids")
    forced = frozenset() if force_all else _xid_list(enabled_env, "DP_ENABLE_HEALTHCHECKS")
    return HealthCheckPolicy(enabled=not off, ignored=ignored, forced=forced, force_all=force_all)


def watch_xid_events(
    uuids: Iterable[str],
    on_unhealthy: Callable[[str, str], None],
    stop: threading.Event,
    policy: HealthCheckPolicy,
    nvml: ModuleType,
    wait_ms: int = EVENT_WAIT_MS,
    on_xid: Callable[[str, int, bool], None] | None = None,
) -> None:
    """Block on NVML events until ``stop`` is set, calling ``on_unhealthy(uuid, reason)`` (blocking).

    ``on_xid(uuid, xid, critical)`` is told every XID event (uuid "" when unidentifiable; metrics).

    A GPU that cannot be registered for events is reported unhealthy at once (except "not
    supported": too old for health checks, logged). A wait error other than a timeout, or an event
    whose device cannot be identified, marks every GPU unhealthy. Anything else (the event set
    cannot be created, an unexpected error) propagates: the caller then serves without health checks.
    """
    wanted = set(uuids)
    event_set = nvml.nvmlEventSetCreate()
    types = nvml.nvmlEventTypeXidCriticalError | nvml.nvmlEventTypeDoubleBitEccError
    types |= nvml.nvmlEventTypeSingleBitEccError
    try:
        for uuid in sorted(wanted):
            try:
                handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
                supported = nvml.nvmlDeviceGetSupportedEventTypes(handle)
                nvml.nvmlDeviceRegisterEvents(handle, types & supported, event_set)
            except nvml.NVMLError as exc:
                if getattr(exc, "value", None) == nvml.NVML_ERROR_NOT_SUPPORTED:
                    log.warning("gpu too old for XID health checks", uuid=uuid)
                    continue
                on_unhealthy(uuid, f"cannot register for NVML events: {exc}")
        while not stop.is_set():
            try:
                data = nvml.nvmlEventSetWait_v2(event_set, wait_ms)
            except nvml.NVMLError as exc:
                if getattr(exc, "value", None) == nvml.NVML_ERROR_TIMEOUT:
                    continue
                for uuid in sorted(wanted):
                    on_unhealthy(uuid, f"NVML event wait failed: {exc}")
                return
            if data.eventType != nvml.nvmlEventTypeXidCriticalError:
                continue
            xid = int(data.eventData)
            if not policy.is_critical(xid):
                log.info("ignored XID", xid=xid)
                if on_xid is not None:
                    on_xid("", xid, False)
                continue
            try:
                uuid = _text(nvml.nvmlDeviceGetUUID(data.device))
            except nvml.NVMLError as exc:
                if on_xid is not None:
                    on_xid("", xid, True)
                for each in sorted(wanted):
                    on_unhealthy(each, f"XID {xid} on an unidentifiable device: {exc}")
                continue
            if on_xid is not None:
                on_xid(uuid, xid, True)
            if uuid in wanted:
                on_unhealthy(uuid, f"XID {xid}")
    finally:
        nvml.nvmlEventSetFree(event_set)


def devices_document(gpus: Iterable[PhysicalGpu]) -> dict[str, Any]:
    """GPUs as a ``--devices-file`` document (``{"devices": [...]}``; used by the simulator and tests)."""
    return {
        "devices": [
            {
                "uuid": g.uuid,
                "index": g.index,
                "name": g.name,
                "memoryMiB": g.memory_mib,
                "numa": -1 if g.numa is None else g.numa,
                "pciBusId": g.pci_bus_id,
                "migEnabled": g.mig_enabled,
                "healthy": g.healthy,
            }
            for g in gpus
        ]
    }


def devices_file_json(gpus: Iterable[PhysicalGpu]) -> str:
    """Serialise GPUs in the ``--devices-file`` format."""
    return json.dumps(devices_document(gpus), indent=2)
