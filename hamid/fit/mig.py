"""HAMi's dynamic MIG in the fit: which profile and placement a device of a container takes (pure).

A GPU in ``mig`` mode registers the MIG profiles its plugin allows (docs/hami-wire.md §2.1), each
with the placements NVML reports. A device of a container there is an instance of the smallest
profile (by memory, then slice count) with at least the request's memory and a placement that
overlaps no occupied one; ``1g.`` and ``3g.`` profiles take the highest free start, the others the
lowest (HAMi ``selectMigCandidate``, ``orderedMigPlacements``). Booking the reservations, and
judging them against each other, is :mod:`hamid.fit.usage`'s (``with_mig``, ``mig_faults``).
"""

from __future__ import annotations

from collections.abc import Sequence

from hamid.model.devices import MigPlacement, MigProfile, PodDevices
from hamid.model.mig import MigAllocation, placements_overlap


def prefers_high(profile: str) -> bool:
    """Whether a profile packs from the top (``1g.``/``3g.``), leaving low starts to wider ones."""
    return profile.startswith(("1g.", "3g."))


def ordered_placements(profile: MigProfile) -> list[MigPlacement]:
    """The profile's placements in the order they are tried (stable for equal starts)."""
    return sorted(profile.placements, key=lambda p: -p.start if prefers_high(profile.name) else p.start)


def profiles_by_name(profiles: Sequence[MigProfile]) -> dict[str, MigProfile]:
    """The first profile of each name (HAMi looks a profile's placements up by name)."""
    out: dict[str, MigProfile] = {}
    for p in profiles:
        out.setdefault(p.name, p)
    return out


def select_candidate(
    profiles: Sequence[MigProfile], occupied: Sequence[MigPlacement], memory: int
) -> tuple[MigProfile, MigPlacement] | None:
    """The profile and placement a device asking ``memory`` MiB takes beside ``occupied``; None: none."""
    named = profiles_by_name(profiles)
    for profile in sorted(profiles, key=lambda p: (p.memory_mb, p.slice_count)):
        if profile.memory_mb < memory:
            continue
        for candidate in ordered_placements(named[profile.name]):
            if not any(placements_overlap(candidate, o) for o in occupied):
                return profile, candidate
    return None


def next_candidate(
    profiles: Sequence[MigProfile], occupied: Sequence[MigPlacement], earlier: Sequence[int], memory: int
) -> tuple[MigProfile, MigPlacement] | None:
    """The profile and placement one more device of ``memory`` MiB takes after the container's
    ``earlier`` devices on this GPU (their memory each, placed first in order) beside ``occupied``;
    None when it does not fit (HAMi ``CustomFilterRule``)."""
    taken = list(occupied)
    for mem in earlier:
        chosen = select_candidate(profiles, taken, mem)
        if chosen is None:
            return None
        taken.append(chosen[1])
    return select_candidate(profiles, taken, memory)


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
