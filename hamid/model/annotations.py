"""Every HAMi annotation key and label (one definition each), and their codecs."""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone

from hamid.model._wire import (
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    INT64_MIN,
    go_json_string,
    go_quote,
    load_json,
    parse_go_bool,
    parse_go_int,
    type_name,
    want_bool,
    want_int,
    want_list,
    want_object,
    want_str,
)
from hamid.model.devices import (
    MODE_HAMI_CORE,
    ContainerDevice,
    ContainerDevices,
    DeviceInfo,
    MigPlacement,
    MigProfile,
    PodDevices,
)
from hamid.model.errors import InvalidInput
from hamid.model.numa import NUMA_PLACEMENT, NUMA_PREDICTED, NUMA_PROFILE

# --- node annotations ---------------------------------------------------------------------
NODE_REGISTER = "hami.io/node-nvidia-register"
NODE_SCORE = "hami.io/node-nvidia-score"
NODE_HANDSHAKE = "hami.io/node-handshake"
NODE_LOCK = "hami.io/mutex.lock"
DEVICE_CORDON = "hami.io/device-cordon"
#: hamid's plugin, under ``--hide-replicas steer``: the node lock value (exactly) whose pod's replicas
#: it has sent kubelet on every ListAndWatch stream; the scheduler's ``/bind`` waits for it before
#: the Binding (``--steer-wait``). On the Node: tenants may write their pods' annotations, not Nodes.
DEVICES_LISTED_FOR = "hamid.io/devices-listed-for"

# --- pod annotations written by the scheduler and the plugin --------------------------------
VGPU_NODE = "hami.io/vgpu-node"  # annotation and label
VGPU_TIME = "hami.io/vgpu-time"
DEVICES_TO_ALLOCATE = "hami.io/vgpu-devices-to-allocate"
DEVICES_ALLOCATED = "hami.io/vgpu-devices-allocated"
MIG_ALLOCATIONS = "hami.io/vgpu-mig-allocations"
BIND_TIME = "hami.io/bind-time"
BIND_PHASE = "hami.io/bind-phase"
BIND_PHASE_ALLOCATING = "allocating"
BIND_PHASE_SUCCESS = "success"
BIND_PHASE_FAILED = "failed"
#: hamid's proof that its scheduler wrote the allocation (HMAC over pod UID, node and
#: ``hami.io/vgpu-devices-allocated``; :mod:`hamid.scheduler.signing`). HAMi has no such key.
ALLOCATION_SIGNATURE = "hamid.io/allocation-signature"
#: The pod status condition in which the scheduler records the signed allocation it booked (written
#: through ``pods/status``, which tenants are not granted, and kept by kubelet, which keeps the
#: conditions it does not own): what a restart books when a tenant rewrote the annotations.
ALLOCATION_BOOKED_CONDITION = "hamid.io/AllocationBooked"
#: Pod annotations only hamid's scheduler and plugin write, for the pod's whole life: the webhook
#: removes them from a pod being created (a tenant's copy would be a forged allocation) and denies
#: any other identity's change to them on update (the chart's ValidatingAdmissionPolicy too); the
#: scheduler books them only as far as their signature, the pod's requests and the node's register
#: confirm them (docs/trust.md).
SCHEDULER_OWNED_ANNOTATIONS = (
    VGPU_NODE,
    VGPU_TIME,
    DEVICES_TO_ALLOCATE,
    DEVICES_ALLOCATED,
    MIG_ALLOCATIONS,
    BIND_TIME,
    BIND_PHASE,
    ALLOCATION_SIGNATURE,
    NUMA_PREDICTED,
    NUMA_PLACEMENT,  # the plugin's observation of kubelet's choice (a forged one misleads the ledger)
)
#: Pod labels only hamid's scheduler writes.
SCHEDULER_OWNED_LABELS = (VGPU_NODE,)

# --- pod annotations set by users ----------------------------------------------------------
USE_GPU_UUID = "nvidia.com/use-gpuuuid"
NOUSE_GPU_UUID = "nvidia.com/nouse-gpuuuid"
USE_GPU_TYPE = "nvidia.com/use-gputype"
NOUSE_GPU_TYPE = "nvidia.com/nouse-gputype"
NUMA_BIND = "nvidia.com/numa-bind"
VGPU_MODE = "nvidia.com/vgpu-mode"
GPU_SCHEDULER_POLICY = "hami.io/gpu-scheduler-policy"
NODE_SCHEDULER_POLICY = "hami.io/node-scheduler-policy"
DEVICE_SCORING_WEIGHTS = "hami.io/device-scoring-weights"
NUMA_ALIGNMENT = "hami.io/numa-alignment"

#: Every annotation key hamid defines (HAMi's, the user-set ones above, and hamid's NUMA keys, which
#: :mod:`hamid.model.numa` defines with their codecs): the annotations a scheduler pod record keeps.
HAMID_ANNOTATION_KEYS = (
    NODE_REGISTER,
    NODE_SCORE,
    NODE_HANDSHAKE,
    NODE_LOCK,
    DEVICE_CORDON,
    DEVICES_LISTED_FOR,
    *SCHEDULER_OWNED_ANNOTATIONS,
    USE_GPU_UUID,
    NOUSE_GPU_UUID,
    USE_GPU_TYPE,
    NOUSE_GPU_TYPE,
    NUMA_BIND,
    VGPU_MODE,
    GPU_SCHEDULER_POLICY,
    NODE_SCHEDULER_POLICY,
    DEVICE_SCORING_WEIGHTS,
    NUMA_ALIGNMENT,
    NUMA_PROFILE,
)

# --- labels -------------------------------------------------------------------------------
SCHEDULER_ROLE = "hami.io/scheduler-role"
ROLE_LEADER = "leader"
ROLE_FOLLOWER = "follower"
WEBHOOK = "hami.io/webhook"
WEBHOOK_IGNORE = "ignore"
HANDSHAKE_REQUESTING = "Requesting"
HANDSHAKE_REPORTED = "Reported"
HANDSHAKE_DELETED = "Deleted"

# ==========================================================================================
# Codecs. Every decoder raises InvalidInput (and nothing else) on malformed input.
# ==========================================================================================

_POD_DEVICE_FORMAT_ERROR = "pod annotation format error, missing fields, do not use nodeName in task spec"


# --- node device register (hami.io/node-nvidia-register) ------------------------------------


def _encode_mig_profile(profile: MigProfile) -> str:
    placements = ",".join(f'{{"start":{p.start},"size":{p.size}}}' for p in profile.placements)
    return (
        f'{{"name":{go_json_string(profile.name)},"memoryMB":{profile.memory_mb},"core":{profile.core},'
        f'"sliceCount":{profile.slice_count},"placements":[{placements}]}}'
    )


def _encode_device_json(device: DeviceInfo, where: str) -> str:
    _check_device_ranges(device, where)
    # Go's field order; every field omitempty (zero values are left out)
    fields: tuple[tuple[str, object], ...] = (
        ("id", device.id),
        ("index", device.index),
        ("count", device.count),
        ("devmem", device.devmem),
        ("devcore", device.devcore),
        ("type", device.type),
        ("numa", device.numa),
        ("mode", device.mode),
    )
    parts = [
        f'"{key}":{go_json_string(value) if isinstance(value, str) else value}'
        for key, value in fields
        if value
    ]
    if device.mig_profiles:
        parts.append('"migProfiles":[' + ",".join(_encode_mig_profile(p) for p in device.mig_profiles) + "]")
    if device.health:
        parts.append('"health":true')
    return "{" + ",".join(parts) + "}"


def _check_device_ranges(device: DeviceInfo, where: str) -> None:
    want_int(device.index, f"{where}.index", 0, 2**64 - 1)
    want_int(device.count, f"{where}.count", INT32_MIN, INT32_MAX)
    want_int(device.devmem, f"{where}.devmem", INT32_MIN, INT32_MAX)
    want_int(device.devcore, f"{where}.devcore", INT32_MIN, INT32_MAX)
    want_int(device.numa, f"{where}.numa")
    want_str(device.id, f"{where}.id")
    want_str(device.type, f"{where}.type")
    want_str(device.mode, f"{where}.mode")


def encode_node_devices(devices: Sequence[DeviceInfo]) -> str:
    """Encode the node register as HAMi v2.8+ does: a JSON array, Go field order, every field omitempty.

    Field order: ``id, index, count, devmem, devcore, type, numa, mode, migProfiles, health``; zero values
    (``index 0``, ``numa 0``, ``health false``, empty ``mode``) are omitted, exactly like Go's encoder.
    """
    encoded = (_encode_device_json(d, f"{NODE_REGISTER}[{i}]") for i, d in enumerate(devices))
    return "[" + ",".join(encoded) + "]"


def _decode_mig_profile(obj: object, where: str) -> MigProfile:
    data = want_object(obj, where)
    placements_raw = data.get("placements")
    placements: list[MigPlacement] = []
    if placements_raw is not None:
        for j, p in enumerate(want_list(placements_raw, f"{where}.placements")):
            pw = f"{where}.placements[{j}]"
            pd = want_object(p, pw)
            placements.append(
                MigPlacement(
                    start=want_int(pd.get("start", 0), f"{pw}.start"),
                    size=want_int(pd.get("size", 0), f"{pw}.size"),
                )
            )
    return MigProfile(
        name=want_str(_or(data.get("name"), ""), f"{where}.name"),
        memory_mb=want_int(_or(data.get("memoryMB"), 0), f"{where}.memoryMB"),
        core=want_int(_or(data.get("core"), 0), f"{where}.core"),
        slice_count=want_int(_or(data.get("sliceCount"), 0), f"{where}.sliceCount"),
        placements=tuple(placements),
    )


def _or(value: object, default: object) -> object:
    """Go's decoder leaves a field at its zero value when the JSON value is null."""
    return default if value is None else value


def _decode_device_json(obj: object, where: str) -> DeviceInfo:
    data = want_object(obj, where)
    profiles_raw = data.get("migProfiles")
    profiles: tuple[MigProfile, ...] = ()
    if profiles_raw is not None:
        profiles = tuple(
            _decode_mig_profile(p, f"{where}.migProfiles[{j}]")
            for j, p in enumerate(want_list(profiles_raw, f"{where}.migProfiles"))
        )
    return DeviceInfo(
        id=want_str(_or(data.get("id"), ""), f"{where}.id"),
        index=want_int(_or(data.get("index"), 0), f"{where}.index", 0, 2**64 - 1),
        count=want_int(_or(data.get("count"), 0), f"{where}.count", INT32_MIN, INT32_MAX),
        devmem=want_int(_or(data.get("devmem"), 0), f"{where}.devmem", INT32_MIN, INT32_MAX),
        devcore=want_int(_or(data.get("devcore"), 0), f"{where}.devcore", INT32_MIN, INT32_MAX),
        type=want_str(_or(data.get("type"), ""), f"{where}.type"),
        numa=want_int(_or(data.get("numa"), 0), f"{where}.numa"),
        mode=want_str(_or(data.get("mode"), ""), f"{where}.mode"),
        health=want_bool(_or(data.get("health"), False), f"{where}.health"),
        mig_profiles=profiles,
    )


def _decode_node_devices_legacy(value: str) -> tuple[DeviceInfo, ...]:
    if ":" not in value:
        raise InvalidInput(f"{NODE_REGISTER}: node annotation missing device separator in {value!r}")
    devices: list[DeviceInfo] = []
    for seg in value.split(":"):
        if not seg:
            continue
        if "," not in seg:
            raise InvalidInput(f"{NODE_REGISTER}: malformed node annotation segment: {go_quote(seg)}")
        items = seg.split(",")
        if len(items) not in (7, 9):
            raise InvalidInput(f"{NODE_REGISTER}: unexpected field count {len(items)} in node annotation")
        where = f"{NODE_REGISTER} device {items[0]!r}"
        index, mode = 0, MODE_HAMI_CORE
        if len(items) == 9:
            index = parse_go_int(items[7], 0, INT64_MAX, f"{where} index")
            mode = items[8]
        devices.append(
            DeviceInfo(
                id=items[0],
                index=index,
                count=parse_go_int(items[1], INT32_MIN, INT32_MAX, f"{where} count"),
                devmem=parse_go_int(items[2], INT32_MIN, INT32_MAX, f"{where} devmem"),
                devcore=parse_go_int(items[3], INT32_MIN, INT32_MAX, f"{where} devcore"),
                type=items[4],
                numa=parse_go_int(items[5], INT64_MIN, INT64_MAX, f"{where} numa"),
                health=parse_go_bool(items[6], f"{where} health"),
                mode=mode,
            )
        )
    return tuple(devices)


def decode_node_devices(value: str) -> tuple[DeviceInfo, ...]:
    """Decode ``hami.io/node-nvidia-register``: JSON iff the value starts with ``[``, else the legacy form.

    JSON: missing fields take Go's zero values (a missing ``health`` is false); unknown fields are
    ignored. Legacy: 7 fields (index 0, mode ``hami-core``) or 9 fields per ``:``-terminated device;
    empty segments are skipped (``":"`` decodes to no devices). An empty JSON array decodes to ``()``;
    deciding that a node without devices is an error is the caller's business.
    """
    if not isinstance(value, str):
        raise InvalidInput(f"{NODE_REGISTER}: want a string, got {type_name(value)}")
    if not value.lstrip().startswith("["):
        return _decode_node_devices_legacy(value)
    data = load_json(value, NODE_REGISTER)
    items = want_list(data, NODE_REGISTER)
    return tuple(_decode_device_json(item, f"{NODE_REGISTER}[{i}]") for i, item in enumerate(items))


# --- pod devices (hami.io/vgpu-devices-to-allocate / -allocated) ------------------------------


def _check_field(text: str, what: str, where: str) -> None:
    if any(sep in text for sep in ",:;"):
        raise InvalidInput(f"{where}: {what} {text!r} contains a separator (',', ':' or ';')")


def encode_container_devices(devices: Sequence[ContainerDevice]) -> str:
    """One container's devices: ``<uuid>,<type>,<usedmem>,<usedcores>:`` per device (``""`` if none)."""
    out: list[str] = []
    for i, d in enumerate(devices):
        where = f"container device {i}"
        want_str(d.uuid, f"{where} uuid")
        want_str(d.type, f"{where} type")
        _check_field(d.uuid, "uuid", where)
        _check_field(d.type, "type", where)
        want_int(d.usedmem, f"{where} usedmem", 0, INT32_MAX)
        want_int(d.usedcores, f"{where} usedcores", 0, INT32_MAX)
        out.append(f"{d.uuid},{d.type},{d.usedmem},{d.usedcores}:")
    return "".join(out)


def _decode_container(piece: str, where: str) -> ContainerDevices:
    devices: list[ContainerDevice] = []
    for seg in piece.split(":"):
        if not seg:
            continue
        fields = seg.split(",")
        if len(fields) < 4:
            raise InvalidInput(f"{where}: device {seg!r}: {_POD_DEVICE_FORMAT_ERROR}")
        dw = f"{where} device {fields[0]!r}"
        devices.append(
            ContainerDevice(
                uuid=fields[0],
                type=fields[1],
                usedmem=parse_go_int(fields[2], 0, INT32_MAX, f"{dw} usedmem"),
                usedcores=parse_go_int(fields[3], 0, INT32_MAX, f"{dw} usedcores"),
            )
        )
    return tuple(devices)


def decode_container_devices(value: str) -> ContainerDevices:
    """Decode one container's devices (the refit response's ``containerDevices``; ``""`` → ``()``).

    A ``;`` is rejected (that is a pod-level value); a non-empty segment without the four
    comma-separated fields raises InvalidInput; fields after the fourth are ignored, as in HAMi.
    """
    if not isinstance(value, str):
        raise InvalidInput(f"container devices: want a string, got {type_name(value)}")
    if ";" in value:
        raise InvalidInput(f"container devices {value!r}: contains ';' (a pod value, not one container)")
    return _decode_container(value, "container devices")


def encode_pod_devices(pod_devices: Sequence[Sequence[ContainerDevice]]) -> str:
    """Encode a pod's devices: every container (init first, GPU-less ones empty) terminated by ``;``."""
    return "".join(encode_container_devices(c) + ";" for c in pod_devices)


def decode_pod_devices(value: str, key: str = DEVICES_ALLOCATED) -> PodDevices:
    """Decode a pod device annotation into one entry per container (init containers first).

    Unlike Go's ``DecodePodDevices``, the phantom empty entry after the final ``;`` is *not* returned:
    ``"a,NVIDIA,1,2:;;"`` gives two containers, not three, so ``len(result)`` is the container count
    and ``encode_pod_devices(decode_pod_devices(s)) == s`` for every encoded ``s``. A value without the
    final ``;`` is accepted (its last piece is a container); ``""`` decodes to ``()``. ``key`` only
    names the annotation in error messages.
    """
    if not isinstance(value, str):
        raise InvalidInput(f"{key}: want a string, got {type_name(value)}")
    if not value:
        return ()
    pieces = value.split(";")
    if value.endswith(";"):
        pieces.pop()
    return tuple(_decode_container(p, f"{key} container {i}") for i, p in enumerate(pieces))


# --- node lock (hami.io/mutex.lock) ------------------------------------------------------------

_RFC3339 = re.compile(r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?(Z|[+-]\d{2}:\d{2})\Z")


@dataclass(frozen=True, slots=True)
class NodeLock:
    """A parsed node lock: when it was taken and by which pod (``None`` for the legacy bare form)."""

    time: datetime
    namespace: str | None = None
    name: str | None = None


def format_rfc3339(when: datetime) -> str:
    """Go's ``time.RFC3339`` (whole seconds; ``Z`` for UTC, else ``±hh:mm``). ``when`` must be aware."""
    offset = when.utcoffset()
    if offset is None:
        raise InvalidInput(f"time {when.isoformat()} has no time zone (RFC 3339 needs one)")
    base = when.strftime("%Y-%m-%dT%H:%M:%S")
    if not offset:
        return base + "Z"
    total = int(offset.total_seconds())
    sign = "+" if total >= 0 else "-"
    hours, minutes = divmod(abs(total) // 60, 60)
    return f"{base}{sign}{hours:02d}:{minutes:02d}"


def parse_rfc3339(text: str, where: str) -> datetime:
    """Parse Go ``time.RFC3339`` (fractional seconds accepted and truncated to microseconds)."""
    m = _RFC3339.match(text)
    if not m:
        raise InvalidInput(f"{where}: {text!r} is not an RFC 3339 time")
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    micro = int((m.group(7) or "0").ljust(6, "0")[:6])
    zone = m.group(8)
    try:
        if zone == "Z":
            tz = UTC
        else:
            sign = 1 if zone[0] == "+" else -1
            tz = timezone(sign * timedelta(hours=int(zone[1:3]), minutes=int(zone[4:6])))
        return datetime(year, month, day, hour, minute, second, micro, tzinfo=tz)
    except ValueError as exc:
        raise InvalidInput(f"{where}: {text!r} is not a valid time: {exc}") from None


def format_node_lock(when: datetime, namespace: str, name: str) -> str:
    """The lock value HAMi writes: ``<RFC3339>,<namespace>,<pod name>``."""
    for what, text in (("namespace", namespace), ("name", name)):
        if not isinstance(text, str) or "," in text:
            raise InvalidInput(f"{NODE_LOCK}: pod {what} {text!r} must be a string without ','")
    return f"{format_rfc3339(when)},{namespace},{name}"


def parse_node_lock(value: str) -> NodeLock:
    """Parse a node lock value: ``<RFC3339>,<ns>,<pod>`` or the legacy bare ``<RFC3339>``."""
    if not isinstance(value, str):
        raise InvalidInput(f"{NODE_LOCK}: want a string, got {type_name(value)}")
    if "," not in value:
        return NodeLock(parse_rfc3339(value, NODE_LOCK))
    parts = value.split(",")
    if len(parts) != 3:
        raise InvalidInput(f"{NODE_LOCK}: lock annotation {value!r} is invalid (want <time>,<ns>,<pod>)")
    return NodeLock(parse_rfc3339(parts[0], NODE_LOCK), parts[1], parts[2])


# --- handshake (hami.io/node-handshake) --------------------------------------------------------

_DATETIME_FORMAT = "%Y-%m-%d %H:%M:%S"
_DATETIME = re.compile(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}")


class HandshakeState(enum.StrEnum):
    """What the handshake value says (``Reported``/``Deleted`` only come from HAMi ≤ v2.7)."""

    REQUESTING = HANDSHAKE_REQUESTING
    REPORTED = HANDSHAKE_REPORTED
    DELETED = HANDSHAKE_DELETED


@dataclass(frozen=True, slots=True)
class Handshake:
    """A parsed handshake: the state and its (naive, local) time, ``None`` when unparsable."""

    state: HandshakeState
    time: datetime | None


def format_handshake(when: datetime) -> str:
    """``Requesting_<YYYY-MM-DD hh:mm:ss>`` (Go ``time.DateTime``; pass local time)."""
    return f"{HANDSHAKE_REQUESTING}_{when.strftime(_DATETIME_FORMAT)}"


def _parse_datetime(text: str) -> datetime | None:
    if not _DATETIME.fullmatch(text):
        return None
    try:
        return datetime.strptime(text, _DATETIME_FORMAT)
    except ValueError:
        return None


def parse_handshake(value: str) -> Handshake:
    """Classify a handshake value as HAMi's scheduler does.

    Contains ``Requesting`` → REQUESTING with the time after the first ``_`` (``time=None`` when
    unparsable: HAMi then treats the node as healthy and does not update). Contains ``Deleted`` →
    DELETED (time after ``_``). Contains ``Reported`` → REPORTED (the date/time that follows, if any).
    Anything else raises InvalidInput; the scheduler then writes a fresh ``Requesting_<now>``.
    """
    if not isinstance(value, str):
        raise InvalidInput(f"{NODE_HANDSHAKE}: want a string, got {type_name(value)}")
    for state in (HandshakeState.REQUESTING, HandshakeState.DELETED):
        if state.value in value:
            _, sep, rest = value.partition("_")
            return Handshake(state, _parse_datetime(rest) if sep else None)
    if HANDSHAKE_REPORTED in value:
        rest = value.partition(HANDSHAKE_REPORTED)[2].strip()
        return Handshake(HandshakeState.REPORTED, _parse_datetime(rest[:19]))
    raise InvalidInput(f"{NODE_HANDSHAKE}: unrecognized handshake value {value!r}")


# --- user annotations ---------------------------------------------------------------------------


def _parse_list(value: str | None, key: str) -> tuple[str, ...] | None:
    """Trimmed non-blank entries; None (no constraint) for an absent or blank value. A value of
    separators only (``","``) is a list naming nothing, as in HAMi (``CheckUUID``/``CheckType``):
    a ``use-*`` list then allows no GPU."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidInput(f"{key}: want a string, got {type_name(value)}")
    if not value.strip():
        return None
    return tuple(e.strip() for e in value.split(",") if e.strip())


def parse_uuid_list(value: str | None, key: str = USE_GPU_UUID) -> tuple[str, ...] | None:
    """A comma list of GPU UUIDs (``nvidia.com/use-gpuuuid`` / ``nouse-gpuuuid``).

    Entries are whitespace-trimmed and blank entries dropped; an absent or blank value means "no
    constraint" and returns ``None``; separators alone (``","``) name no GPU: ``()``.
    """
    return _parse_list(value, key)


def parse_type_list(value: str | None, key: str = USE_GPU_TYPE) -> tuple[str, ...] | None:
    """A comma list of GPU type substrings (``nvidia.com/use-gputype`` / ``nouse-gputype``).

    Same rules as :func:`parse_uuid_list`; matching (case-insensitive substring) is the caller's.
    """
    return _parse_list(value, key)


def parse_numa_bind(value: str | None) -> bool:
    """``nvidia.com/numa-bind`` with Go ``strconv.ParseBool`` semantics; absent → False."""
    if value is None:
        return False
    if not isinstance(value, str):
        raise InvalidInput(f"{NUMA_BIND}: want a string, got {type_name(value)}")
    return parse_go_bool(value, f"annotation {NUMA_BIND}")


@dataclass(frozen=True, slots=True)
class ScoringWeights:
    """Per-pod GPU score weights (``hami.io/device-scoring-weights``); HAMi's default is 1/1/1."""

    slot: int = 1
    core: int = 1
    memory: int = 1


#: HAMi's default device-score weights (slot=1, core=1, memory=1): one object, so a score can tell
#: it by identity (:func:`hamid.fit.policy.device_score`).
DEFAULT_SCORING_WEIGHTS = ScoringWeights()

_WEIGHT_KEYS = ("slot", "core", "memory")
_DIGITS = re.compile(r"[0-9]+\Z")


def parse_scoring_weights(value: str | None) -> ScoringWeights:
    """Parse ``slot=<n>,core=<n>,memory=<n>``: all three keys exactly once (any order), non-negative
    decimal integers, not all zero. Absent → default weights 1/1/1."""
    if value is None:
        return DEFAULT_SCORING_WEIGHTS
    if not isinstance(value, str):
        raise InvalidInput(f"{DEVICE_SCORING_WEIGHTS}: want a string, got {type_name(value)}")
    where = f"annotation {DEVICE_SCORING_WEIGHTS}={value!r}"
    found: dict[str, int] = {}
    for part in value.split(","):
        key, eq, num = part.partition("=")
        key, num = key.strip(), num.strip()
        if not eq or key not in _WEIGHT_KEYS:
            raise InvalidInput(f"{where}: entry {part.strip()!r} is not slot=<n>, core=<n> or memory=<n>")
        if key in found:
            raise InvalidInput(f"{where}: {key} given twice")
        if not _DIGITS.match(num) or len(num.lstrip("0")) > 10 or int(num) > INT32_MAX:
            raise InvalidInput(f"{where}: {key} weight {num!r} is not a non-negative integer")
        found[key] = int(num)
    missing = [k for k in _WEIGHT_KEYS if k not in found]
    if missing:
        raise InvalidInput(f"{where}: missing {', '.join(missing)}")
    if not any(found.values()):
        raise InvalidInput(f"{where}: at least one weight must be positive")
    return ScoringWeights(slot=found["slot"], core=found["core"], memory=found["memory"])


# --- pair scores (hami.io/node-nvidia-score) ----------------------------------------------------


def decode_pair_scores(value: str) -> dict[str, dict[str, int]]:
    """Decode ``[{"uuid":<gpu>,"score":{<other gpu>:<int>}}]`` into ``{gpu: {other: score}}``."""
    data = want_list(load_json(value, NODE_SCORE), NODE_SCORE)
    scores: dict[str, dict[str, int]] = {}
    for i, item in enumerate(data):
        where = f"{NODE_SCORE}[{i}]"
        obj = want_object(item, where)
        uuid = want_str(_or(obj.get("uuid"), ""), f"{where}.uuid")
        raw = obj.get("score")
        pairs = {} if raw is None else want_object(raw, f"{where}.score")
        scores[uuid] = {
            want_str(o, f"{where}.score key"): want_int(s, f"{where}.score[{o!r}]", INT32_MIN, INT32_MAX)
            for o, s in pairs.items()
        }
    return scores


def encode_pair_scores(scores: Mapping[str, Mapping[str, int]]) -> str:
    """Encode pair scores as the plugin does (``uuid`` then ``score``; Go sorts map keys)."""
    items = []
    for uuid, pairs in scores.items():
        body = ",".join(
            f"{go_json_string(o)}:{want_int(pairs[o], f'{NODE_SCORE} {uuid!r}->{o!r}', INT32_MIN, INT32_MAX)}"
            for o in sorted(pairs)
        )
        items.append(f'{{"uuid":{go_json_string(uuid)},"score":{{{body}}}}}')
    return "[" + ",".join(items) + "]"
