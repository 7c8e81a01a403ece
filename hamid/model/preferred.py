"""hamid's ``GetPreferredAllocation`` answer, pure: which of kubelet's replicas the plugin prefers.

One definition for the device plugin (which answers kubelet with it) and the NUMA predictor (which
replays it to know where kubelet puts a container's replicas on a hamid node): both map the
GPUs the scheduler annotated to kubelet's replica IDs with :func:`preferred_answer`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Protocol

#: The physical GPU UUID behind one of kubelet's replica IDs (None: not a known GPU's replica).
UuidOf = Callable[[str], "str | None"]


class Annotated(Protocol):
    """An annotated GPU (``hami.io/vgpu-devices-to-allocate`` entry): only its UUID matters here."""

    @property
    def uuid(self) -> str: ...


def select_preferred(
    annotated: Sequence[Annotated],
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    uuid_of: UuidOf,
) -> tuple[list[str], list[str]]:
    """Map annotated GPUs to kubelet's replica IDs (docs/hami-wire.md §4.8).

    Must-include replicas come first and count for the annotated GPUs they are replicas of; each
    remaining annotated GPU takes its first available replica. Returns ``(chosen, missing)`` where
    ``missing`` lists annotated GPU UUIDs that have no available replica, over every annotated GPU:
    also those left over once must-include replicas fill ``size`` (their annotation may sit on
    another NUMA node, which is exactly when a refit is needed).
    """
    chosen = list(must_include)
    covered = Counter(uuid_of(i) for i in must_include)
    taken = set(chosen)
    missing: list[str] = []
    for device in annotated:
        if covered[device.uuid] > 0:
            covered[device.uuid] -= 1
            continue
        replica = next((i for i in available if i not in taken and uuid_of(i) == device.uuid), None)
        if replica is None:
            missing.append(device.uuid)
        elif len(chosen) < size:
            chosen.append(replica)
            taken.add(replica)
    return chosen, missing


def distinct_gpu_preference(
    available: Sequence[str], must_include: Sequence[str], size: int, uuid_of: UuidOf
) -> list[str]:
    """``size`` replica IDs on distinct physical GPUs (the fallback preference), or ``[]`` if impossible.

    Used when the annotated GPUs cannot be offered (no refit, or it was refused): Allocate will serve
    the annotated GPUs anyway, so this only shapes kubelet's replica bookkeeping. One replica per GPU
    mirrors the allocation (each slot of a container is on its own GPU), where "no preference" would
    let kubelet count two replicas of one GPU for a multi-GPU container. Must-include replicas come
    first (they must name distinct known GPUs); the rest is one replica per GPU, GPUs with the most
    available replicas first, ties by UUID; each GPU gives its smallest replica ID.
    """
    if size <= 0 or len(must_include) > size:
        return []
    chosen = list(must_include)
    used: set[str] = set()
    for device_id in must_include:
        uuid = uuid_of(device_id)
        if uuid is None or uuid in used:
            return []
        used.add(uuid)
    replicas: dict[str, list[str]] = {}
    for device_id in dict.fromkeys(available):
        uuid = uuid_of(device_id)
        if uuid is not None and uuid not in used and device_id not in chosen:
            replicas.setdefault(uuid, []).append(device_id)
    ranked = sorted(replicas, key=lambda u: (-len(replicas[u]), u))
    chosen += [min(replicas[u]) for u in ranked[: size - len(chosen)]]
    return chosen if len(chosen) == size else []


def preferred_answer(
    annotated: Sequence[Annotated],
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    uuid_of: UuidOf,
) -> tuple[list[str], list[str]]:
    """The plugin's answer when every annotated GPU is offered: ``(deviceIDs, missing)``.

    ``missing`` non-empty is a NUMA mismatch (the plugin's mismatch policy decides: a refit, or the
    distinct-GPU fallback). Otherwise the answer is :func:`select_preferred`'s replicas, or ``[]``
    ("no preference", kubelet then picks in ID order) when they do not make up ``size``.
    """
    chosen, missing = select_preferred(annotated, available, must_include, size, uuid_of)
    return (chosen if len(chosen) == size else []), missing
