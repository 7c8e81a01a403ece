"""GPU discovery: NVML (through ``pynvml``) or a static inventory file, and NVML XID health events.

Everything here blocks (NVML calls, file reads): call it in a thread (``asyncio.to_thread``).
Both sources produce the same :class:`PhysicalGpu` records, so everything downstream is shared.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from hamid.log import get_logger
from hamid.model._wire import load_yaml
from hamid.model.devices import MigPlacement
from hamid.model.errors import InvalidInput
from hamid.model.gpulinks import MAX_SCORED_NVLINKS, NVML_TOPOLOGY_LEVELS, P2P_LEVEL_SCORES, GpuLink, GpuLinks
from hamid.plugin.mig_nvml import SLICE_GROUPS, MigNvmlError, MigSliceProfile, read_slice_profiles

log = get_logger("plugin.discovery")

#: XIDs that are application errors, never a GPU fault (NVIDIA device plugin v0.18 list).
IGNORED_XIDS = frozenset({13, 31, 43, 45, 68, 109})
#: How long one NVML event wait blocks (ms); bounds how fast the health thread notices a stop.
EVENT_WAIT_MS = 1000

_FILE_KEYS = (
    "uuid",
    "index",
    "name",
    "memoryMiB",
    "numa",
    "pciBusId",
    "migEnabled",
    "healthy",
    "minor",
    "migProfiles",
)
_REQUIRED_FILE_KEYS = ("uuid", "index", "name", "memoryMiB", "numa", "pciBusId")
_LINK_KEYS = ("level", "nvlinks")
_MIG_PROFILE_KEYS = ("slices", "memoryMB", "multiprocessors", "sliceCount", "instanceCount", "placements")
#: Bounds of a MIG profile in a devices file: slices and placements of real GPUs fit well inside.
MAX_MIG_SLICES = 64
MAX_MIG_MULTIPROCESSORS = 4096
#: Bounds that keep every registered value inside HAMi's int32 fields even at the largest
#: scaling the node config allows (16 TiB x 100 < 2^31), and indices/NUMA ids real machines have.
MAX_MEMORY_MIB = 2**24
MAX_GPU_INDEX = 65535
MAX_NUMA_NODE = 1023  # Linux's MAX_NUMNODES is at most 1024
#: The driver's highest minor number of a GPU node (``NV_MINOR_DEVICE_NUMBER_REGULAR_MAX`` in its
#: ``nv-chardev-numbers.h``; 254 and 255 are nvidia-modeset's and nvidiactl's).
MAX_GPU_MINOR = 247
MAX_TEXT = 256
#: A UUID or bus id: printable ASCII without spaces, and without the register codec's separators.
_TOKEN = re.compile(r"[\x21-\x7e]+\Z")
_UUID_FORBIDDEN = frozenset(",:;")


class NvmlUnavailable(RuntimeError):
    """NVML cannot be loaded or initialised on this machine."""


class NvmlTopologyError(RuntimeError):
    """NVML could not report the links between two GPUs (HAMi's score then fails too)."""


@dataclass(frozen=True, slots=True)
class PhysicalGpu:
    """One physical GPU as discovered (``numa`` None = unknown NUMA node; ``minor``: the minor
    number of its ``/dev/nvidia<minor>`` node, None = unknown; ``mig_profiles``: what NVML offers
    per MIG slice group, read only while MIG mode is on)."""

    uuid: str
    index: int
    name: str
    memory_mib: int
    numa: int | None
    pci_bus_id: str
    mig_enabled: bool = False
    healthy: bool = True
    minor: int | None = None
    mig_profiles: tuple[MigSliceProfile, ...] = ()


@dataclass(frozen=True, slots=True)
class DevicesInventory:
    """A node's GPUs and, when known, the links between them (None: no topology, no pair scores)."""

    gpus: tuple[PhysicalGpu, ...]
    links: GpuLinks | None = None


# --- static inventory ---------------------------------------------------------------------------


def _read_text(path: str | os.PathLike[str]) -> str:
    data = Path(path).read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"{path}: not valid UTF-8 (byte offset {exc.start}: {exc.reason})") from None


def load_devices_file(path: str | os.PathLike[str]) -> list[PhysicalGpu]:
    """Read a static inventory's GPUs (YAML or JSON; see :func:`parse_devices_document`)."""
    return list(load_devices_inventory(path).gpus)


def load_devices_inventory(path: str | os.PathLike[str]) -> DevicesInventory:
    """Read a static inventory (GPUs and optional ``links``). Raises :class:`InvalidInput`."""
    return parse_devices_document(_read_text(path), source=str(path))


def parse_devices_text(text: str, source: str = "<devices file>") -> list[PhysicalGpu]:
    """The GPUs of a static inventory's text."""
    return list(parse_devices_document(text, source).gpus)


def parse_devices_document(text: str, source: str = "<devices file>") -> DevicesInventory:
    """Parse a static inventory (JSON is valid YAML, so one parser reads both).

    Top-level keys: ``devices`` (a list of GPUs) and optional ``links``, the GPU link matrix
    ``{<uuid>: {<other uuid>: {"level": <NVML topology level>, "nvlinks": <count>}}}`` — what
    NVML reports between two GPUs (common ancestor ``INTERNAL``/``SINGLE``/``MULTIPLE``/
    ``HOSTBRIDGE``/``NODE``/``SYSTEM``, i.e. nvidia-smi's board/PIX/PXB/PHB/NODE/SYS, and 0-18
    NVLinks). A pair given in one direction holds for both; give both directions to describe an
    asymmetric pair. Other top-level keys are left to the caller (the simulator's machine files
    carry theirs). Every error is an :class:`InvalidInput` naming the file and the item.
    """
    doc = load_yaml(text, source)
    if not isinstance(doc, dict) or not isinstance(doc.get("devices"), list):
        raise InvalidInput(f"{source}: expected a top-level 'devices:' list")
    gpus: list[PhysicalGpu] = []
    for position, item in enumerate(doc["devices"]):
        gpus.append(_parse_device_item(item, f"{source}: devices[{position}]"))
    _check_unique(gpus, source)
    links = None
    if doc.get("links") is not None:
        links = _parse_links(doc["links"], {g.uuid for g in gpus}, f"{source}: links")
    return DevicesInventory(tuple(gpus), links)


def _parse_device_item(item: Any, where: str) -> PhysicalGpu:
    if not isinstance(item, dict):
        raise InvalidInput(f"{where}: expected a mapping")
    unknown = sorted(str(k) for k in set(item) - set(_FILE_KEYS))
    if unknown:
        raise InvalidInput(f"{where}: unknown keys {unknown}; allowed: {list(_FILE_KEYS)}")
    missing = [k for k in _REQUIRED_FILE_KEYS if k not in item]
    if missing:
        raise InvalidInput(f"{where}: missing keys {missing}")
    uuid, name, bus = item["uuid"], item["name"], item["pciBusId"]
    if not _is_uuid(uuid):
        raise InvalidInput(
            f"{where}: uuid must be 1-{MAX_TEXT} printable ASCII characters without spaces, "
            f"',', ':' or ';', got {_shown(uuid)}"
        )
    if not isinstance(name, str) or not name or len(name) > MAX_TEXT or not name.isprintable():
        raise InvalidInput(f"{where}: name must be 1-{MAX_TEXT} printable characters, got {_shown(name)}")
    if not isinstance(bus, str) or len(bus) > MAX_TEXT or (bus and not _TOKEN.match(bus)):
        raise InvalidInput(f"{where}: pciBusId must be a string without spaces, got {_shown(bus)}")
    index = _int_field(item, "index", where, 0, MAX_GPU_INDEX)
    memory = _int_field(item, "memoryMiB", where, 0, MAX_MEMORY_MIB)
    numa = _int_field(item, "numa", where, -1, MAX_NUMA_NODE)
    mig = _bool_field(item, "migEnabled", where, default=False)
    healthy = _bool_field(item, "healthy", where, default=True)
    minor = _int_field(item, "minor", where, 0, MAX_GPU_MINOR) if "minor" in item else None
    profiles = _parse_mig_profiles(item.get("migProfiles"), f"{where}.migProfiles")
    if profiles and not mig:
        raise InvalidInput(f"{where}: migProfiles needs migEnabled: true (NVML offers them in MIG mode only)")
    return PhysicalGpu(
        uuid=uuid,
        index=index,
        name=name,
        memory_mib=memory,
        numa=None if numa < 0 else numa,
        pci_bus_id=bus,
        mig_enabled=mig,
        healthy=healthy,
        minor=minor,
        mig_profiles=profiles,
    )


def _parse_mig_profiles(raw: Any, where: str) -> tuple[MigSliceProfile, ...]:
    """A devices file's ``migProfiles``: what NVML would report per slice group (absent: none)."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise InvalidInput(f"{where}: expected a list of MIG profiles")
    out: list[MigSliceProfile] = []
    for position, item in enumerate(raw):
        at = f"{where}[{position}]"
        if not isinstance(item, dict):
            raise InvalidInput(f"{at}: expected a mapping")
        unknown = sorted(str(k) for k in set(item) - set(_MIG_PROFILE_KEYS))
        missing = [k for k in _MIG_PROFILE_KEYS if k not in item]
        if unknown or missing:
            raise InvalidInput(
                f"{at}: keys must be exactly {list(_MIG_PROFILE_KEYS)} (unknown {unknown}, missing {missing})"
            )
        slices = item["slices"]
        if not isinstance(slices, str) or slices not in SLICE_GROUPS:
            raise InvalidInput(f"{at}: slices must be one of {list(SLICE_GROUPS)}, got {_shown(slices)}")
        if any(p.slices == slices for p in out):
            raise InvalidInput(f"{at}: slice group {slices} given twice")
        placements = item["placements"]
        if not isinstance(placements, list) or not placements:
            raise InvalidInput(f"{at}: placements must be a non-empty list of {{start, size}}")
        out.append(
            MigSliceProfile(
                slices=slices,
                memory_mb=_int_field(item, "memoryMB", at, 1, MAX_MEMORY_MIB),
                multiprocessors=_int_field(item, "multiprocessors", at, 1, MAX_MIG_MULTIPROCESSORS),
                slice_count=_int_field(item, "sliceCount", at, 1, MAX_MIG_SLICES),
                instance_count=_int_field(item, "instanceCount", at, 1, MAX_MIG_SLICES),
                placements=tuple(
                    _parse_placement(p, f"{at}.placements[{i}]") for i, p in enumerate(placements)
                ),
            )
        )
    return tuple(out)


def _parse_placement(raw: Any, where: str) -> MigPlacement:
    if not isinstance(raw, dict) or set(raw) != {"start", "size"}:
        raise InvalidInput(f"{where}: expected a mapping with exactly 'start' and 'size'")
    return MigPlacement(
        start=_int_field(raw, "start", where, 0, MAX_MIG_SLICES - 1),
        size=_int_field(raw, "size", where, 1, MAX_MIG_SLICES),
    )


def _is_uuid(value: object) -> bool:
    return (
        isinstance(value, str)
        and len(value) <= MAX_TEXT
        and _TOKEN.match(value) is not None
        and not _UUID_FORBIDDEN.intersection(value)
    )


def _shown(value: object) -> str:
    """A value for an error message: repr'd (control characters visible), and cut short."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _int_field(item: Mapping[str, Any], key: str, where: str, minimum: int, maximum: int) -> int:
    value = item[key]
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise InvalidInput(
            f"{where}: {key} must be an integer in [{minimum}, {maximum}], got {_shown(value)}"
        )
    return value


def _bool_field(item: Mapping[str, Any], key: str, where: str, *, default: bool) -> bool:
    value = item.get(key, default)
    if not isinstance(value, bool):
        raise InvalidInput(f"{where}: {key} must be true or false, got {_shown(value)}")
    return value


def _check_unique(gpus: Iterable[PhysicalGpu], source: str) -> None:
    seen_uuid: set[str] = set()
    seen_index: set[int] = set()
    seen_minor: set[int] = set()
    for gpu in gpus:
        if gpu.uuid in seen_uuid:
            raise InvalidInput(f"{source}: duplicate uuid {gpu.uuid}")
        if gpu.index in seen_index:
            raise InvalidInput(f"{source}: duplicate index {gpu.index}")
        if gpu.minor in seen_minor:
            raise InvalidInput(f"{source}: duplicate minor {gpu.minor} (one device node per GPU)")
        seen_uuid.add(gpu.uuid)
        seen_index.add(gpu.index)
        if gpu.minor is not None:
            seen_minor.add(gpu.minor)


def _parse_links(raw: Any, uuids: set[str], where: str) -> dict[str, dict[str, GpuLink]]:
    """The ``links`` matrix, mirrored: a direction not given takes the other one's link."""
    if not isinstance(raw, dict):
        raise InvalidInput(f"{where}: expected a mapping of GPU UUID to a mapping of GPU UUID to a link")
    given: dict[tuple[str, str], GpuLink] = {}
    for a, row in raw.items():
        if a not in uuids:
            raise InvalidInput(f"{where}: {_shown(a)} is not a uuid under 'devices'")
        if not isinstance(row, dict):
            raise InvalidInput(f"{where}.{a}: expected a mapping of GPU UUID to a link")
        for b, link in row.items():
            if b not in uuids or b == a:
                raise InvalidInput(f"{where}.{a}: {_shown(b)} is not another uuid under 'devices'")
            given[(a, b)] = _parse_link(link, f"{where}.{a}.{b}")
    links: dict[str, dict[str, GpuLink]] = {}
    for (a, b), link in given.items():
        links.setdefault(a, {})[b] = link
        if (b, a) not in given:
            links.setdefault(b, {})[a] = link
    return links


def _parse_link(raw: Any, where: str) -> GpuLink:
    if not isinstance(raw, dict):
        raise InvalidInput(f"{where}: expected a mapping with 'level' and optional 'nvlinks'")
    unknown = sorted(str(k) for k in set(raw) - set(_LINK_KEYS))
    if unknown:
        raise InvalidInput(f"{where}: unknown keys {unknown}; allowed: {list(_LINK_KEYS)}")
    level = raw.get("level")
    if not isinstance(level, str) or level not in P2P_LEVEL_SCORES:
        raise InvalidInput(f"{where}: level must be one of {list(P2P_LEVEL_SCORES)}, got {_shown(level)}")
    nvlinks = raw.get("nvlinks", 0)
    if isinstance(nvlinks, bool) or not isinstance(nvlinks, int) or not 0 <= nvlinks <= MAX_SCORED_NVLINKS:
        raise InvalidInput(
            f"{where}: nvlinks must be an integer in [0, {MAX_SCORED_NVLINKS}], got {_shown(nvlinks)}"
        )
    return GpuLink(level=level, nvlinks=nvlinks)


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
    module: ModuleType = pynvml
    return module


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
        log.error("gpu_skipped_unidentified", index=index, error=str(exc))
        return None
    healthy = True
    name, memory, bus, mig, minor = "", 0, "", False, None
    try:
        name = _text(lib.nvmlDeviceGetName(handle))
    except lib.NVMLError as exc:
        healthy = False
        log.error("gpu_unhealthy_name_unreadable", uuid=uuid, error=str(exc))
    try:
        memory = int(lib.nvmlDeviceGetMemoryInfo(handle).total) // (1024 * 1024)
    except lib.NVMLError as exc:
        if getattr(exc, "value", None) != lib.NVML_ERROR_NOT_SUPPORTED:
            healthy = False
        log.warning("gpu_memory_unreadable", uuid=uuid, error=str(exc))
    try:
        bus = _text(lib.nvmlDeviceGetPciInfo(handle).busId)
    except lib.NVMLError as exc:
        log.warning("gpu_pci_bus_id_unreadable", numa="unknown", uuid=uuid, error=str(exc))
    try:
        current, _pending = lib.nvmlDeviceGetMigMode(handle)
        mig = current == lib.NVML_DEVICE_MIG_ENABLE
    except lib.NVMLError as exc:
        if getattr(exc, "value", None) != lib.NVML_ERROR_NOT_SUPPORTED:
            log.warning("gpu_mig_mode_unreadable", uuid=uuid, error=str(exc))
    profiles: tuple[MigSliceProfile, ...] = ()
    if mig:
        try:
            profiles = read_slice_profiles(lib, handle)
        except MigNvmlError as exc:
            log.error("gpu_mig_profiles_unreadable", uuid=uuid, error=str(exc))
    try:
        minor = int(lib.nvmlDeviceGetMinorNumber(handle))
    except lib.NVMLError as exc:  # only --pass-device-specs needs it: not a fault
        log.warning("gpu_minor_number_unreadable", uuid=uuid, error=str(exc))
    return PhysicalGpu(
        uuid=uuid,
        index=index,
        name=name or "Unknown",
        memory_mib=memory,
        numa=numa_from_sysfs(bus, sysfs_root),
        pci_bus_id=bus,
        mig_enabled=mig,
        healthy=healthy,
        minor=minor,
        mig_profiles=profiles,
    )


def normalized_bus_id(bus_id: str) -> str:
    """HAMi's ``PciInfo.BusID``: up to the first NUL, lower case, one leading ``0000`` dropped."""
    bus = bus_id.split("\x00", 1)[0].lower()
    return bus if bus == "0000" else bus.removeprefix("0000")


def _nvml_skippable(lib: ModuleType, exc: Exception) -> bool:
    """NVML answers "not supported"/"invalid argument" for links a GPU does not have."""
    code = getattr(exc, "value", None)
    return code in (lib.NVML_ERROR_NOT_SUPPORTED, lib.NVML_ERROR_INVALID_ARGUMENT)


def _enabled_links(lib: ModuleType, handle: Any) -> list[int]:
    """The NVLink numbers whose state is enabled (HAMi loops over ``NVLINK_MAX_LINKS``)."""
    enabled: list[int] = []
    for link in range(int(lib.NVML_NVLINK_MAX_LINKS)):
        try:
            state = lib.nvmlDeviceGetNvLinkState(handle, link)
        except lib.NVMLError as exc:
            if _nvml_skippable(lib, exc):
                continue
            raise NvmlTopologyError(f"failed to get nvlink state: {exc}") from exc
        if state == lib.NVML_FEATURE_ENABLED:
            enabled.append(link)
    return enabled


@dataclass(frozen=True, slots=True)
class _NvLinkEnds:
    """One GPU's enabled NVLinks: the remote PCI bus of each, and how many end on an NVSwitch."""

    remote_buses: tuple[str, ...]
    switch_links: int


def _nvlink_ends(lib: ModuleType, handle: Any) -> _NvLinkEnds:
    buses: list[str] = []
    switches = 0
    for link in _enabled_links(lib, handle):
        try:
            buses.append(normalized_bus_id(_text(lib.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId)))
        except lib.NVMLError as exc:
            if not _nvml_skippable(lib, exc):
                raise NvmlTopologyError(f"failed to get remote pci info: {exc}") from exc
        try:
            kind = lib.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link)
        except lib.NVMLError as exc:
            if _nvml_skippable(lib, exc):
                continue
            raise NvmlTopologyError(f"failed to get nvlink remote device type: {exc}") from exc
        switches += kind == lib.NVML_NVLINK_DEVICE_TYPE_SWITCH
    return _NvLinkEnds(tuple(buses), switches)


def _nvlink_count(first: _NvLinkEnds, second: _NvLinkEnds, second_bus: str) -> int:
    """HAMi ``GetNVLink``: direct links to the peer's bus, else the smaller NVSwitch link count."""
    direct = first.remote_buses.count(second_bus)
    if 1 <= direct <= MAX_SCORED_NVLINKS:
        return direct
    if not first.remote_buses:
        return 0
    if first.switch_links and second.switch_links:
        return min(first.switch_links, second.switch_links)
    return 0


def discover_nvml_links(gpus: Iterable[PhysicalGpu], nvml: ModuleType) -> GpuLinks:
    """The links between every ordered pair of ``gpus`` from NVML (blocking; call in a thread).

    For each pair: the common-ancestor level (``nvmlDeviceGetTopologyCommonAncestor``) and the
    NVLink count, direct (remote PCI bus equals the peer's) or through NVSwitches, as HAMi's
    ``links.go`` reads them. Raises :class:`NvmlTopologyError` when NVML fails for a pair,
    where HAMi fails the whole score.
    """
    chosen = list(gpus)
    try:
        handles = {g.uuid: nvml.nvmlDeviceGetHandleByUUID(g.uuid) for g in chosen}
        ends = {uuid: _nvlink_ends(nvml, handle) for uuid, handle in handles.items()}
        links: dict[str, dict[str, GpuLink]] = {}
        for a in chosen:
            row = links.setdefault(a.uuid, {})
            for b in chosen:
                if a.uuid == b.uuid:
                    continue
                level = nvml.nvmlDeviceGetTopologyCommonAncestor(handles[a.uuid], handles[b.uuid])
                if level not in NVML_TOPOLOGY_LEVELS:
                    raise NvmlTopologyError(f"unknown topology level {level} between {a.uuid} and {b.uuid}")
                nvlinks = _nvlink_count(ends[a.uuid], ends[b.uuid], normalized_bus_id(b.pci_bus_id))
                row[b.uuid] = GpuLink(NVML_TOPOLOGY_LEVELS[level], nvlinks)
    except nvml.NVMLError as exc:
        raise NvmlTopologyError(f"NVML could not report GPU links: {exc}") from exc
    return links


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


def _names_all(value: str) -> bool:
    """Whether a health-check list names every XID: ``all`` or ``xids`` anywhere in it, as the
    NVIDIA plugin HAMi ships reads it (``48,xids`` disables them all)."""
    return any(part.strip() in ("all", "xids") for part in value.split(","))


def health_policy_from_env(env: Mapping[str, str]) -> HealthCheckPolicy:
    """Build the policy as the NVIDIA device plugin reads it from its environment."""
    disabled = env.get("DP_DISABLE_HEALTHCHECKS", "").strip().lower()
    enabled_env = env.get("DP_ENABLE_HEALTHCHECKS", "").strip().lower()
    off = _names_all(disabled)
    ignored = IGNORED_XIDS if off else IGNORED_XIDS | _xid_list(disabled, "DP_DISABLE_HEALTHCHECKS")
    force_all = _names_all(enabled_env)
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
        _register_xid_events(wanted, types, event_set, on_unhealthy, nvml)
        while not stop.is_set():
            try:
                data = nvml.nvmlEventSetWait_v2(event_set, wait_ms)
            except nvml.NVMLError as exc:
                if getattr(exc, "value", None) == nvml.NVML_ERROR_TIMEOUT:
                    continue
                for uuid in sorted(wanted):
                    on_unhealthy(uuid, f"NVML event wait failed: {exc}")
                return
            if data.eventType == nvml.nvmlEventTypeXidCriticalError:
                _on_xid_event(data, wanted, on_unhealthy, policy, nvml, on_xid or _no_xid_observer)
    finally:
        nvml.nvmlEventSetFree(event_set)


def _no_xid_observer(uuid: str, xid: int, critical: bool) -> None:
    """The default XID observer of :func:`watch_xid_events`: nobody counts them."""


def _register_xid_events(
    wanted: set[str], types: int, event_set: Any, on_unhealthy: Callable[[str, str], None], nvml: ModuleType
) -> None:
    """Register every wanted GPU for health events; one that cannot be registered is unhealthy."""
    for uuid in sorted(wanted):
        try:
            handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
            supported = nvml.nvmlDeviceGetSupportedEventTypes(handle)
            nvml.nvmlDeviceRegisterEvents(handle, types & supported, event_set)
        except nvml.NVMLError as exc:
            if getattr(exc, "value", None) == nvml.NVML_ERROR_NOT_SUPPORTED:
                log.warning("gpu_xid_checks_unsupported", uuid=uuid)
                continue
            on_unhealthy(uuid, f"cannot register for NVML events: {exc}")


def _on_xid_event(
    data: Any,
    wanted: set[str],
    on_unhealthy: Callable[[str, str], None],
    policy: HealthCheckPolicy,
    nvml: ModuleType,
    on_xid: Callable[[str, int, bool], None],
) -> None:
    """One XID event: ignored by policy, or its GPU (every GPU, when unidentifiable) unhealthy."""
    xid = int(data.eventData)
    if not policy.is_critical(xid):
        log.info("xid_ignored", xid=xid)
        on_xid("", xid, False)
        return
    try:
        uuid = _text(nvml.nvmlDeviceGetUUID(data.device))
    except nvml.NVMLError as exc:
        on_xid("", xid, True)
        for each in sorted(wanted):
            on_unhealthy(each, f"XID {xid} on an unidentifiable device: {exc}")
        return
    on_xid(uuid, xid, True)
    if uuid in wanted:
        on_unhealthy(uuid, f"XID {xid}")


def devices_document(gpus: Iterable[PhysicalGpu], links: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """GPUs as a ``--devices-file`` document (``{"devices": [...]}``; used by the simulator and tests).

    ``links`` is a ``links`` matrix in the file's own format, put in unchanged when given.
    """
    document: dict[str, Any] = {"devices": [_device_item(g) for g in gpus]}
    if links is not None:
        document["links"] = links
    return document


def _device_item(gpu: PhysicalGpu) -> dict[str, Any]:
    """One GPU of a ``--devices-file`` document (``minor`` only when known: it is optional)."""
    item: dict[str, Any] = {
        "uuid": gpu.uuid,
        "index": gpu.index,
        "name": gpu.name,
        "memoryMiB": gpu.memory_mib,
        "numa": -1 if gpu.numa is None else gpu.numa,
        "pciBusId": gpu.pci_bus_id,
        "migEnabled": gpu.mig_enabled,
        "healthy": gpu.healthy,
    }
    if gpu.minor is not None:
        item["minor"] = gpu.minor
    if gpu.mig_profiles:
        item["migProfiles"] = [
            {
                "slices": p.slices,
                "memoryMB": p.memory_mb,
                "multiprocessors": p.multiprocessors,
                "sliceCount": p.slice_count,
                "instanceCount": p.instance_count,
                "placements": [{"start": x.start, "size": x.size} for x in p.placements],
            }
            for p in gpu.mig_profiles
        ]
    return item


def devices_file_json(gpus: Iterable[PhysicalGpu], links: Mapping[str, Any] | None = None) -> str:
    """Serialise GPUs (and an optional ``links`` matrix) in the ``--devices-file`` format."""
    return json.dumps(devices_document(gpus, links), indent=2)
