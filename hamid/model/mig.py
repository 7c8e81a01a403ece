"""HAMi's dynamic MIG contracts: the reservation annotation and the profile allowlist (pure data).

The scheduler reserves a GPU, a MIG profile and a placement (a run of memory slices) per device of a
container; the plugin creates the GPU and compute instance there at ``Allocate`` and adds their
runtime identity to the same record (docs/hami-wire.md §2.6).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from hamid.model._wire import (
    go_json_string,
    load_json,
    type_name,
    want_int,
    want_list,
    want_object,
    want_str,
)
from hamid.model.annotations import MIG_ALLOCATIONS
from hamid.model.devices import MigPlacement
from hamid.model.errors import InvalidInput

_UINT32_MAX = 2**32 - 1
_INT_MAX = 2**63 - 1


@dataclass(frozen=True, slots=True)
class MigAllocation:
    """One MIG device of one container: the scheduler's reservation, and once realized its runtime ids.

    ``container_index`` / ``device_index`` name the entry in the pod's device list (init containers
    first), so two instances on one GPU stay apart. The runtime ids are all set or all unset.
    """

    container_index: int
    device_index: int
    gpu_uuid: str
    profile: str
    placement: MigPlacement
    mig_uuid: str = ""
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None

    @property
    def realized(self) -> bool:
        """Whether the plugin created the instance and recorded it."""
        return bool(self.mig_uuid)

    @property
    def reservation_key(self) -> tuple[str, str, int, int]:
        """GPU, profile and placement: what a repeated ``Allocate`` converges on."""
        return (self.gpu_uuid, self.profile, self.placement.start, self.placement.size)


def reservation_text(allocations: Iterable[MigAllocation]) -> str:
    """The scheduler's part of a reservation list, canonical: runtime ids left out, sorted by container
    and device, encoded as HAMi does; ``""`` for none.

    This is what the scheduler signs and records (docs/trust.md §3): the plugin adds the runtime ids
    to the annotation later, which leaves this text unchanged.
    """
    reserved = sorted(
        (
            MigAllocation(a.container_index, a.device_index, a.gpu_uuid, a.profile, a.placement)
            for a in allocations
        ),
        key=lambda a: (a.container_index, a.device_index),
    )
    return encode_mig_allocations(reserved)


def placements_overlap(a: MigPlacement, b: MigPlacement) -> bool:
    """Whether two placements share a memory slice (``[start, start + size)``)."""
    return a.start < b.start + b.size and b.start < a.start + a.size


def _encode_one(a: MigAllocation) -> str:
    parts = [
        f'"containerIndex":{a.container_index}',
        f'"deviceIndex":{a.device_index}',
        f'"gpuUUID":{go_json_string(a.gpu_uuid)}',
        f'"profile":{go_json_string(a.profile)}',
        f'"placement":{{"start":{a.placement.start},"size":{a.placement.size}}}',
    ]
    if a.mig_uuid:
        parts.append(f'"migUUID":{go_json_string(a.mig_uuid)}')
    if a.gpu_instance_id is not None:
        parts.append(f'"gpuInstanceID":{a.gpu_instance_id}')
    if a.compute_instance_id is not None:
        parts.append(f'"computeInstanceID":{a.compute_instance_id}')
    return "{" + ",".join(parts) + "}"


def encode_mig_allocations(allocations: Iterable[MigAllocation]) -> str:
    """Encode as HAMi does (Go field order, runtime ids omitted while unset); ``""`` for none.

    HAMi writes no annotation for a pod without MIG devices, so the caller leaves it out on ``""``.
    Every record is checked first (:func:`check_mig_allocations`): hamid never writes one HAMi refuses.
    """
    items = tuple(allocations)
    if not items:
        return ""
    check_mig_allocations(items)
    return "[" + ",".join(_encode_one(a) for a in items) + "]"


def _optional_uint32(value: object, where: str) -> int | None:
    return None if value is None else want_int(value, where, 0, _UINT32_MAX)


def _decode_one(obj: object, where: str) -> MigAllocation:
    data = want_object(obj, where)
    placement_raw = data.get("placement")
    start = size = 0
    if placement_raw is not None:
        placement = want_object(placement_raw, f"{where}.placement")
        start = want_int(_zero_if_null(placement.get("start")), f"{where}.placement.start", 0, _UINT32_MAX)
        size = want_int(_zero_if_null(placement.get("size")), f"{where}.placement.size", 0, _UINT32_MAX)
    mig_uuid = data.get("migUUID")
    return MigAllocation(
        container_index=want_int(
            _zero_if_null(data.get("containerIndex")), f"{where}.containerIndex", -_INT_MAX - 1, _INT_MAX
        ),
        device_index=want_int(
            _zero_if_null(data.get("deviceIndex")), f"{where}.deviceIndex", -_INT_MAX - 1, _INT_MAX
        ),
        gpu_uuid=want_str(data.get("gpuUUID") or "", f"{where}.gpuUUID"),
        profile=want_str(data.get("profile") or "", f"{where}.profile"),
        placement=MigPlacement(start=start, size=size),
        mig_uuid=want_str(mig_uuid if mig_uuid is not None else "", f"{where}.migUUID"),
        gpu_instance_id=_optional_uint32(data.get("gpuInstanceID"), f"{where}.gpuInstanceID"),
        compute_instance_id=_optional_uint32(data.get("computeInstanceID"), f"{where}.computeInstanceID"),
    )


def _zero_if_null(value: object) -> object:
    """Go's decoder leaves a field at its zero value when the JSON value is null."""
    return 0 if value is None else value


def check_mig_allocations(allocations: Sequence[MigAllocation]) -> None:
    """HAMi's checks of a reservation list; raise :class:`InvalidInput` naming the first bad record.

    Each record needs non-negative indexes, a GPU, a profile and a placement of non-zero size; its
    runtime ids are all set or none; no two records name the same container and device.
    """
    seen: set[tuple[int, int]] = set()
    for i, a in enumerate(allocations):
        if (
            a.container_index < 0
            or a.device_index < 0
            or not a.gpu_uuid
            or not a.profile
            or a.placement.size == 0
        ):
            raise InvalidInput(f"{MIG_ALLOCATIONS}: MIG allocation {i} is incomplete")
        runtime = (bool(a.mig_uuid), a.gpu_instance_id is not None, a.compute_instance_id is not None)
        if any(runtime) and not all(runtime):
            raise InvalidInput(f"{MIG_ALLOCATIONS}: MIG allocation {i} has partial runtime identity")
        key = (a.container_index, a.device_index)
        if key in seen:
            container, device = key
            raise InvalidInput(
                f"{MIG_ALLOCATIONS}: duplicate MIG allocation for container {container} device {device}"
            )
        seen.add(key)


def decode_mig_allocations(value: object) -> tuple[MigAllocation, ...]:
    """Decode ``hami.io/vgpu-mig-allocations`` as HAMi does; ``""`` and ``null`` are no reservations.

    Unknown fields are ignored and null fields take Go's zero values; malformed JSON, wrong types,
    out-of-range numbers and every check of :func:`check_mig_allocations` raise :class:`InvalidInput`.
    """
    if not isinstance(value, str):
        raise InvalidInput(f"{MIG_ALLOCATIONS}: want a string, got {type_name(value)}")
    if value == "":
        return ()
    data = load_json(value, MIG_ALLOCATIONS)
    if data is None:
        return ()
    items = tuple(
        _decode_one(obj, f"{MIG_ALLOCATIONS}[{i}]") for i, obj in enumerate(want_list(data, MIG_ALLOCATIONS))
    )
    check_mig_allocations(items)
    return items


# --- the profile allowlist (device config ``nvidia.migProfileAllowlist``) --------------------


@dataclass(frozen=True, slots=True)
class AllowedMigProfiles:
    """The MIG profiles the cluster permits on GPUs of some models (policy only: NVML gives capacity)."""

    models: tuple[str, ...]
    profiles: tuple[str, ...]

    def matches(self, model: str) -> bool:
        """Whether a GPU's registered type (``NVIDIA-A100-SXM4-40GB``) contains one of the models (HAMi's
        case-sensitive substring test)."""
        return any(m in model for m in self.models)


def profile_slice_key(profile: str) -> str:
    """The part of a profile name before its first dot (``2g.10gb`` → ``2g``): its slice group."""
    head, dot, _ = profile.partition(".")
    return head if dot and head else profile


def _valid_profile_name(profile: str) -> bool:
    head, dot, _ = profile.partition(".")
    return bool(dot) and len(head) >= 2 and head.endswith("g")


def decode_mig_profile_allowlist(value: object, where: str) -> tuple[AllowedMigProfiles, ...]:
    """Decode and check the allowlist: every entry names models and profiles, each profile ``<n>g.<...>``.

    A missing list (``None``) is an empty allowlist. Raises :class:`InvalidInput` naming the entry.
    """
    if value is None:
        return ()
    out: list[AllowedMigProfiles] = []
    for i, raw in enumerate(want_list(value, where)):
        entry_where = f"{where}[{i}]"
        entry = want_object(raw, entry_where)
        models = tuple(
            want_str(m, f"{entry_where}.models")
            for m in want_list(entry.get("models") or [], f"{entry_where}.models")
        )
        profiles = tuple(
            want_str(p, f"{entry_where}.profiles")
            for p in want_list(entry.get("profiles") or [], f"{entry_where}.profiles")
        )
        if not models or not profiles:
            raise InvalidInput(f"{entry_where}: MIG profile allowlist must define models and profiles")
        for p in profiles:
            if not _valid_profile_name(p):
                raise InvalidInput(
                    f"{entry_where}: invalid MIG profile {p!r} (want <n>g.<memory>, e.g. 1g.5gb)"
                )
        out.append(AllowedMigProfiles(models=models, profiles=profiles))
    return tuple(out)


def allowed_profiles_for(model: str, allowlist: Sequence[AllowedMigProfiles]) -> tuple[str, ...]:
    """The profiles of the first allowlist entry naming ``model`` (HAMi takes the first), else ``()``."""
    for entry in allowlist:
        if entry.matches(model):
            return entry.profiles
    return ()
