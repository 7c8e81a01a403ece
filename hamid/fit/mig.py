"""HAMi's dynamic MIG in the fit: which profile and placement a device of a container takes (pure).

A GPU in ``mig`` mode registers the MIG profiles its plugin allows (docs/hami-wire.md §2.1), each
with the placements NVML reports. A device of a container there is an instance of the smallest
profile (by memory, then slice count) with at least the request's memory and a placement that
overlaps no occupied one; ``1g.`` and ``3g.`` profiles take the highest free start, the others the
lowest (HAMi ``selectMigCandidate``, ``orderedMigPlacements``). The booking of a pod carries its
reservations (:class:`~hamid.model.mig.MigAllocation`) per GPU, and a GPU whose bookings disagree
with its profiles or with each other is not fitted onto (:func:`mig_faults`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from hamid.model.devices import MODE_MIG, MigPlacement, MigProfile, PodDevices
from hamid.model.mig import MigAllocation, placements_overlap

if TYPE_CHECKING:
    from hamid.fit.usage import DeviceAmount, DeviceUsage


def prefers_high(profile: str) -> bool:
    """Whether a profile packs from the top (``1g.``/``3g.``), leaving low starts to wider ones."""
    return profile.startswith(("1g.", "3g."))


def ordered_placements(profile: MigProfile) -> list[MigPlacement]:
    """The profile's placements in the order they are tried (stable for equal starts)."""
    return sorted(profile.placements, key=lambda p: -p.start if prefers_high(profile.name) else p.start)


def _by_name(profiles: Sequence[MigProfile]) -> dict[str, MigProfile]:
    """The first profile of each name (HAMi looks a profile's placements up by name)."""
    out: dict[str, MigProfile] = {}
    for p in profiles:
        out.setdefault(p.name, p)
    return out


def select_candidate(
    profiles: Sequence[MigProfile], occupied: Sequence[MigPlacement], memory: int
) -> tuple[MigProfile, MigPlacement] | None:
    """The profile and placement a device asking ``memory`` MiB takes beside ``occupied``; None: none."""
    named = _by_name(profiles)
    for profile in sorted(profiles, key=lambda p: (p.memory_mb, p.slice_count)):
        if profile.memory_mb < memory:
            continue
        for candidate in ordered_placements(named[profile.name]):
            if not any(placements_overlap(candidate, o) for o in occupied):
                return profile, candidate
    return None


def fits_another(
    profiles: Sequence[MigProfile], occupied: Sequence[MigPlacement], earlier: Sequence[int], memory: int
) -> bool:
    """Whether one more device of ``memory`` MiB fits after the container's ``earlier`` devices on
    this GPU (their memory each, placed first in order) beside ``occupied`` (HAMi ``CustomFilterRule``)."""
    taken = list(occupied)
    for mem in earlier:
        chosen = select_candidate(profiles, taken, mem)
        if chosen is None:
            return False
        taken.append(chosen[1])
    return select_candidate(profiles, taken, memory) is not None


def mig_refusal(layout: PodDevices, mig: Sequence[MigAllocation]) -> str:
    """Why a pod's MIG reservations cannot ride on its allocation ``layout`` ("" when they can).

    Each reservation must name a GPU the allocation holds: its instance is booked with that GPU's
    device entry. (HAMi would also restore a reservation on a GPU the pod's cached devices lack.)
    """
    held = {d.uuid for entry in layout for d in entry}
    for a in mig:
        if a.gpu_uuid not in held:
            return (
                f"its MIG reservation for container {a.container_index} device {a.device_index} "
                f"names GPU {a.gpu_uuid}, which the allocation does not hold"
            )
    return ""


def with_mig(
    usage: Mapping[str, DeviceAmount],
    layout: PodDevices,
    mig: Sequence[MigAllocation],
    devices: Mapping[str, DeviceUsage],
) -> dict[str, DeviceAmount]:
    """A pod's usage with its MIG reservations on each GPU they name, and on each MIG-mode GPU of
    ``devices`` the number of its device entries there beyond those reservations (``unreserved``:
    HAMi matches entries and reservations per GPU in order; an entry left over is an inconsistency).

    Reservations naming a GPU outside ``usage`` are left out (:func:`mig_refusal` refuses them).
    """
    out = dict(usage)
    on_gpu: dict[str, list[MigAllocation]] = {}
    for a in mig:
        on_gpu.setdefault(a.gpu_uuid, []).append(a)
    mig_gpus = {uuid for uuid, dev in devices.items() if dev.mode == MODE_MIG}
    entries = Counter(d.uuid for entry in layout for d in entry if d.uuid in mig_gpus)
    for uuid in on_gpu.keys() | entries.keys():
        amount = out.get(uuid)
        if amount is None:
            continue
        reserved = tuple(on_gpu.get(uuid, ()))
        out[uuid] = replace(amount, mig=reserved, unreserved=max(entries[uuid] - len(reserved), 0))
    return out


def _span(a: MigAllocation) -> str:
    return f"{a.profile} at [{a.placement.start},{a.placement.start + a.placement.size})"


def mig_faults(dev: DeviceUsage, amount: DeviceAmount) -> list[str]:
    """What is inconsistent about booking ``amount`` on ``dev`` beside its other bookings (one line each).

    A reservation on a GPU not in MIG mode; on a MIG GPU, a device entry without a reservation, a
    reservation of a profile or placement the GPU does not offer, or one overlapping another booked
    placement (the pod's own earlier ones included). ``dev.mig_used`` must not hold ``amount``'s own.
    """
    if dev.mode != MODE_MIG:
        return [f"GPU {dev.id} is not in MIG mode but {_span(a)} is reserved on it" for a in amount.mig]
    faults = [f"a device on MIG GPU {dev.id} has no profile/placement reservation"] * amount.unreserved
    offered = _by_name(dev.mig_profiles)
    seen = list(dev.mig_used)
    for a in amount.mig:
        profile = offered.get(a.profile)
        if profile is None:
            faults.append(f"GPU {dev.id} does not offer profile {a.profile}")
        elif a.placement not in profile.placements:
            faults.append(f"GPU {dev.id} does not offer {_span(a)}")
        faults.extend(
            f"{_span(a)} overlaps {_span(b)} booked on GPU {dev.id}"
            for b in seen
            if placements_overlap(a.placement, b.placement)
        )
        seen.append(a)
    return faults
