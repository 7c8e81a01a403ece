"""Per-device usage of a node and the phase-aware effective usage of one pod.

A pod's containers run in phases (Kubernetes init semantics): every regular init container runs
alone, together with the sidecars (init containers with ``restartPolicy: Always``) declared before
it; then all sidecars and app containers run concurrently. The usage a pod books on a GPU is, per
field, the maximum over those phases of the sum of the containers of that phase on that GPU
(HAMi's ``CollapseInitContainerUsage`` when sidecars come after the regular init containers,
exact when they do not). Once all regular init containers succeeded only the last phase remains
(HAMi's ``AppContainersOnlyDeviceUsage``; sidecars keep running and stay counted). On a GPU
the pod's MIG reservations name, every container's entry counts in every phase, init containers'
after their release too: each is an instance that lives until the pod ends.

The scheduler keeps :class:`NodeUsage` incrementally: :meth:`NodeUsage.add` when a pod is
reserved or seen, :meth:`NodeUsage.remove` when it ends, both with the same :class:`PodUsage`.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from hamid.fit.mig import profiles_by_name
from hamid.fit.policy import f32
from hamid.model.devices import MODE_MIG, NVIDIA, DeviceInfo, MigProfile, PodDevices
from hamid.model.mig import MigAllocation, placements_overlap
from hamid.model.resources import ContainerDeviceRequest, all_containers, init_container_count, is_sidecar


class ContainerKind(enum.Enum):
    """How a container takes part in the pod's phases."""

    INIT = "init"  #: regular init container: runs alone (with earlier sidecars), then exits
    SIDECAR = "sidecar"  #: init container with ``restartPolicy: Always``: runs until the pod ends
    APP = "app"  #: regular container


@dataclass(frozen=True, slots=True)
class DeviceAmount:
    """What one pod books on one GPU: vGPU slots, memory (MiB) and cores (percent).

    On a GPU in MIG mode also its reservations (their placements are occupied while booked) and
    how many of its device entries there have none (see :func:`with_mig`).
    """

    slots: int
    mem: int
    cores: int
    mig: tuple[MigAllocation, ...] = ()
    unreserved: int = 0


#: A pod's effective usage: GPU UUID -> amount.
PodUsage = Mapping[str, DeviceAmount]


@dataclass(slots=True)
class DeviceUsage:
    """One GPU of a node with its current usage (mutable; kept by the scheduler).

    A GPU in MIG mode also has its registered profiles, the reservations booked on it and how many
    inconsistencies those bookings hold (:func:`mig_faults`): while any does, the GPU
    is not fitted onto (HAMi marks it unhealthy).
    """

    id: str
    index: int
    count: int
    totalmem: int
    totalcore: int
    type: str
    numa: int
    mode: str
    health: bool
    used: int = 0
    usedmem: int = 0
    usedcores: int = 0
    mig_profiles: tuple[MigProfile, ...] = ()
    mig_used: list[MigAllocation] = field(default_factory=list)
    mig_faults: int = 0

    @property
    def fit_healthy(self) -> bool:
        """Healthy as registered and no inconsistent MIG booking on it."""
        return self.health and not self.mig_faults

    @classmethod
    def from_info(cls, info: DeviceInfo) -> DeviceUsage:
        """A device with zero usage from its registered record."""
        return cls(
            id=info.id,
            index=info.index,
            count=info.count,
            totalmem=info.devmem,
            totalcore=info.devcore,
            type=info.type,
            numa=info.numa,
            mode=info.mode,
            health=info.health,
            mig_profiles=info.mig_profiles,
        )

    def copy(self) -> DeviceUsage:
        """An independent copy (usage included)."""
        return DeviceUsage(
            self.id,
            self.index,
            self.count,
            self.totalmem,
            self.totalcore,
            self.type,
            self.numa,
            self.mode,
            self.health,
            self.used,
            self.usedmem,
            self.usedcores,
            self.mig_profiles,
            list(self.mig_used),
            self.mig_faults,
        )


class NodeUsage:
    """The GPUs of one node, their usage, GPU pair scores and cordoned UUIDs.

    ``devices`` keeps the register order; a device's registered fields are fixed, only its usage
    changes (through :meth:`add`/:meth:`remove`). Node-wide sums are maintained incrementally so
    :meth:`score` is O(1), and :meth:`room` is cached until the next change. ``on_change`` (if
    set) is called with the node name after every change, so an index over nodes stays current.
    """

    __slots__ = (
        "_room",
        "_sum_cores",
        "_sum_mem",
        "_sum_used",
        "_tot_cores",
        "_tot_count",
        "_tot_mem",
        "by_id",
        "candidates",
        "cordoned",
        "devices",
        "has_mig",
        "name",
        "on_change",
        "pair_scores",
    )

    def __init__(
        self,
        name: str,
        devices: Iterable[DeviceUsage],
        pair_scores: Mapping[str, Mapping[str, int]] | None = None,
        cordoned: Iterable[str] = (),
    ) -> None:
        self.name = name
        self.devices: tuple[DeviceUsage, ...] = tuple(devices)
        self.by_id: dict[str, DeviceUsage] = {d.id: d for d in self.devices}
        #: Devices an NVIDIA request may use (type contains "nvidia", case-insensitive).
        self.candidates: tuple[DeviceUsage, ...] = tuple(
            d for d in self.devices if NVIDIA.lower() in d.type.lower()
        )
        #: Whether a candidate is in MIG mode (the fit then places MIG instances).
        self.has_mig = any(d.mode == MODE_MIG for d in self.candidates)
        self.pair_scores: Mapping[str, Mapping[str, int]] = pair_scores or {}
        self.cordoned: frozenset[str] = frozenset(cordoned)
        self._tot_count = sum(d.count for d in self.devices)
        self._tot_mem = sum(d.totalmem for d in self.devices)
        self._tot_cores = sum(d.totalcore for d in self.devices)
        self._sum_used = sum(d.used for d in self.devices)
        self._sum_mem = sum(d.usedmem for d in self.devices)
        self._sum_cores = sum(d.usedcores for d in self.devices)
        self._room: tuple[int, int, int] | None = None
        self.on_change: Callable[[str], None] | None = None

    @classmethod
    def from_infos(
        cls,
        name: str,
        infos: Iterable[DeviceInfo],
        pair_scores: Mapping[str, Mapping[str, int]] | None = None,
        cordoned: Iterable[str] = (),
    ) -> NodeUsage:
        """A node with zero usage from its registered devices."""
        return cls(name, (DeviceUsage.from_info(i) for i in infos), pair_scores, cordoned)

    def copy(self) -> NodeUsage:
        """An independent copy (devices copied; pair scores and cordon set shared, immutable)."""
        return NodeUsage(self.name, (d.copy() for d in self.devices), self.pair_scores, self.cordoned)

    def add(self, usage: PodUsage) -> tuple[str, ...]:
        """Book a pod's usage; returns the UUIDs not on this node (ignored)."""
        return self._apply(usage, 1)

    def remove(self, usage: PodUsage) -> tuple[str, ...]:
        """Release a pod's usage booked with :meth:`add`; returns the UUIDs not on this node."""
        return self._apply(usage, -1)

    def _apply(self, usage: PodUsage, sign: int) -> tuple[str, ...]:
        unknown: list[str] = []
        for uuid, amount in usage.items():
            dev = self.by_id.get(uuid)
            if dev is None:
                unknown.append(uuid)
                continue
            slots = max(amount.slots, 1) * sign
            dev.used += slots
            dev.usedmem += amount.mem * sign
            dev.usedcores += amount.cores * sign
            self._sum_used += slots
            self._sum_mem += amount.mem * sign
            self._sum_cores += amount.cores * sign
            if amount.mig or amount.unreserved:
                _apply_mig(dev, amount, sign)
        self._room = None
        if self.on_change is not None:
            self.on_change(self.name)
        return tuple(unknown)

    def mig_problems(self, usage: PodUsage) -> list[str]:
        """What booking ``usage`` here would make inconsistent on MIG (nothing changes; for the log)."""
        out: list[str] = []
        for uuid, amount in usage.items():
            dev = self.by_id.get(uuid)
            if dev is not None and (amount.mig or amount.unreserved):
                out.extend(mig_faults(dev, amount))
        return out

    def room(self) -> tuple[int, int, int]:
        """(usable device slots, the most free MiB on one GPU, the most free cores on one GPU).

        Usable: an NVIDIA candidate with a free slot that is healthy (:attr:`DeviceUsage.fit_healthy`)
        and not cordoned; one GPU counts once, one in MIG mode as many times as it has placements
        (one container may take several instances there). Every container a pod places here needs
        ``nums`` such slots, each GPU with its memory and cores free, so a pod asking more than this
        cannot fit (see :func:`hamid.fit.fit.room_needed`). Cached until the usage changes.
        """
        room = self._room
        if room is None:
            slots = mem = cores = 0
            cordoned = self.cordoned
            for d in self.candidates:
                if d.used < d.count and d.fit_healthy and d.id not in cordoned:
                    if d.mode == MODE_MIG:
                        slots += sum(len(p.placements) for p in d.mig_profiles)
                    else:
                        slots += 1
                    mem = max(mem, d.totalmem - d.usedmem)
                    cores = max(cores, d.totalcore - d.usedcores)
            room = self._room = (slots, mem, cores)
        return room

    def score(self, release: PodUsage | None = None) -> float:
        """HAMi's node score ``10*(ΣUsed/ΣCount + ΣUsedcores/ΣTotalcore + ΣUsedmem/ΣTotalmem)``,
        in Go's float32 as upstream computes it (:func:`~hamid.fit.policy.f32`).

        Computed from the usage before the pod being scheduled (``release``: that pod's usage
        already booked here, left out); 0 when any total is 0.
        """
        if self._tot_count == 0 or self._tot_cores == 0 or self._tot_mem == 0:
            return 0.0
        used, mem, cores = self._sum_used, self._sum_mem, self._sum_cores
        if release:
            for uuid, amount in release.items():
                if uuid in self.by_id:
                    used -= max(amount.slots, 1)
                    mem -= amount.mem
                    cores -= amount.cores
        slots, core, memory = (
            f32(used / self._tot_count),
            f32(cores / self._tot_cores),
            f32(mem / self._tot_mem),
        )
        return f32(10.0 * f32(f32(slots + core) + memory))


def with_mig(
    usage: Mapping[str, DeviceAmount],
    layout: PodDevices,
    mig: Sequence[MigAllocation],
    devices: Mapping[str, DeviceUsage],
) -> dict[str, DeviceAmount]:
    """A pod's usage with its MIG reservations on each GPU they name, and on each MIG-mode GPU of
    ``devices`` the number of its device entries there beyond those reservations (``unreserved``:
    HAMi matches entries and reservations per GPU in order; an entry left over is an inconsistency).

    Reservations naming a GPU outside ``usage`` are left out (refused: :func:`~hamid.fit.mig.mig_refusal`).
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
    offered = profiles_by_name(dev.mig_profiles)
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


def _apply_mig(dev: DeviceUsage, amount: DeviceAmount, sign: int) -> None:
    """Occupy (or free) a booking's MIG placements and count its inconsistencies, symmetrically: its
    faults are judged against the other bookings both ways."""
    if sign > 0:
        dev.mig_faults += len(mig_faults(dev, amount))
        dev.mig_used.extend(amount.mig)
        return
    for a in amount.mig:
        dev.mig_used.remove(a)
    dev.mig_faults -= len(mig_faults(dev, amount))


def container_kinds(pod: Mapping[str, Any]) -> tuple[ContainerKind, ...]:
    """The kind of every container of a pod dict, init containers first."""
    n_init = init_container_count(pod)
    kinds: list[ContainerKind] = []
    for i, container in enumerate(all_containers(pod)):
        if i >= n_init:
            kinds.append(ContainerKind.APP)
        elif is_sidecar(container):
            kinds.append(ContainerKind.SIDECAR)
        else:
            kinds.append(ContainerKind.INIT)
    return tuple(kinds)


def init_containers_succeeded(pod: Mapping[str, Any]) -> bool:
    """Whether every regular init container of the pod terminated with exit code 0.

    False when the pod has no regular init container (there is nothing to release). Sidecars
    are not waited for: they keep running with the app containers.
    """
    spec = pod.get("spec") or {}
    regular = [c.get("name") for c in spec.get("initContainers") or () if not is_sidecar(c)]
    if not regular:
        return False
    statuses = {s.get("name"): s for s in (pod.get("status") or {}).get("initContainerStatuses") or ()}
    for name in regular:
        terminated = ((statuses.get(name) or {}).get("state") or {}).get("terminated")
        if not terminated or terminated.get("exitCode") != 0:
            return False
    return True


def phases(kinds: Sequence[ContainerKind], init_released: bool = False) -> tuple[tuple[int, ...], ...]:
    """The sets of container indexes that run concurrently.

    One phase per regular init container (itself plus the sidecars declared before it) unless
    ``init_released``, then the steady phase (all sidecars and app containers).
    """
    out: list[tuple[int, ...]] = []
    sidecars: list[int] = []
    for i, kind in enumerate(kinds):
        if kind is ContainerKind.INIT:
            if not init_released:
                out.append((*sidecars, i))
        elif kind is ContainerKind.SIDECAR:
            sidecars.append(i)
    steady = tuple(i for i, k in enumerate(kinds) if k is not ContainerKind.INIT)
    if steady:
        out.append(steady)
    return tuple(out)


def _held_gpus(mig: Iterable[MigAllocation]) -> frozenset[str]:
    """The GPUs whose entries a pod holds for its whole life: those its MIG reservations name (the
    plugin destroys an instance, an init container's too, only when the pod ends)."""
    return frozenset(a.gpu_uuid for a in mig)


def _phase_sums(
    layout: PodDevices, phase: Iterable[int], held: frozenset[str], skip: int = -1
) -> dict[str, list[int]]:
    """(slots, mem, cores) per GPU of the containers of ``phase``, and on a ``held`` GPU of every
    container (:func:`_held_gpus`); container ``skip`` left out."""
    sums: dict[str, list[int]] = {}
    members = frozenset(phase)
    for ci, entry in enumerate(layout):
        if ci == skip:
            continue
        running = ci in members
        for dev in entry:
            if dev.type != NVIDIA or not (running or dev.uuid in held):
                continue
            acc = sums.get(dev.uuid)
            if acc is None:
                sums[dev.uuid] = [1, dev.usedmem, dev.usedcores]
            else:
                acc[0] += 1
                acc[1] += dev.usedmem
                acc[2] += dev.usedcores
    return sums


def effective_pod_usage(
    layout: PodDevices,
    kinds: Sequence[ContainerKind],
    init_released: bool = False,
    mig: Iterable[MigAllocation] = (),
) -> dict[str, DeviceAmount]:
    """A pod's phase-aware usage per GPU UUID, from its positional allocation (init first).

    Per field, the maximum over :func:`phases` of the phase's sum; slots at least 1. On a GPU
    its MIG reservations (``mig``) name, the sum of all its entries there (they are instances held
    side by side). Entries of other device types than NVIDIA are ignored. ``kinds`` shorter than
    ``layout`` counts the extra entries as app containers.
    """
    kinds = _pad_kinds(kinds, len(layout))
    held = _held_gpus(mig)
    peak: dict[str, list[int]] = {}
    for phase in phases(kinds, init_released):
        for uuid, (s, m, c) in _phase_sums(layout, phase, held).items():
            acc = peak.get(uuid)
            if acc is None:
                peak[uuid] = [s, m, c]
            else:
                acc[0] = max(acc[0], s)
                acc[1] = max(acc[1], m)
                acc[2] = max(acc[2], c)
    return {u: DeviceAmount(max(s, 1), m, c) for u, (s, m, c) in sorted(peak.items())}


def allocation_refusal(
    layout: PodDevices,
    requests: Sequence[ContainerDeviceRequest | None],
    devices: Mapping[str, DeviceUsage] | None,
) -> str:
    """Why an allocation annotation must not be booked for a pod ("" when it may be).

    The annotation is the pod's own word, so it is booked only as far as the pod's requests and
    the node's register confirm it: the pod asks for a GPU; there are no more entries than the pod
    has containers; each container holds exactly as many GPUs as it requests, each GPU once, each
    registered on the node (``devices``; None = the node is not known yet), and never more memory
    or cores than the GPU has. A forged annotation thus never books a GPU for a pod that requests
    none, nor more than a GPU holds; what it books counts against the namespace's quota. (The
    amounts are not compared with the request: a refit keeps the MiB fitted on the first card.)
    """
    if not any(r is not None for r in requests):
        return "the pod requests no GPU"
    if len(layout) > len(requests):
        return f"{len(layout)} container entries for a pod of {len(requests)} containers"
    for index, entry in enumerate(layout):
        request = requests[index]
        want = request.nums if request is not None else 0
        if len(entry) != want:
            return f"container {index} holds {len(entry)} GPUs but requests {want}"
        if len({d.uuid for d in entry}) != len(entry):
            return f"container {index} holds one GPU twice"
        for d in entry:
            problem = _device_refusal(d.uuid, d.usedmem, d.usedcores, devices)
            if problem:
                return f"container {index}: {problem}"
    return ""


def overcommit_refusal(
    layout: PodDevices,
    kinds: Sequence[ContainerKind],
    devices: Mapping[str, DeviceUsage],
    mig: Sequence[MigAllocation] = (),
    init_released: bool = False,
) -> str:
    """Why booking ``layout`` (with its MIG reservations ``mig``; its init containers' only while
    they run, as :func:`effective_pod_usage`) beside what ``devices`` already book would
    over-commit a GPU ("" when it fits: slots, memory and cores within the registered capacity)."""
    for uuid, amount in effective_pod_usage(layout, kinds, init_released, mig).items():
        dev = devices.get(uuid)
        if dev is None:
            continue
        if (
            dev.used + amount.slots > dev.count
            or dev.usedmem + amount.mem > dev.totalmem
            or dev.usedcores + amount.cores > dev.totalcore
        ):
            return (
                f"GPU {uuid} holds {dev.usedmem} of {dev.totalmem} MiB, {dev.usedcores} of "
                f"{dev.totalcore} % and {dev.used} of {dev.count} slots: {amount.mem} MiB, "
                f"{amount.cores} % more do not fit"
            )
    return ""


def _device_refusal(uuid: str, mem: int, cores: int, devices: Mapping[str, DeviceUsage] | None) -> str:
    if mem < 0 or cores < 0:
        return f"GPU {uuid}: negative amounts"
    if devices is None:
        return ""
    dev = devices.get(uuid)
    if dev is None:
        return f"GPU {uuid} is not registered on the node"
    if mem > dev.totalmem or cores > dev.totalcore:
        return f"GPU {uuid}: {mem} MiB / {cores} % booked, the GPU has {dev.totalmem} MiB / {dev.totalcore} %"
    return ""


def usage_totals(usage: PodUsage) -> tuple[int, int]:
    """Total (memory, cores) of a pod's usage, as counted against a namespace quota."""
    return sum(a.mem for a in usage.values()), sum(a.cores for a in usage.values())


def _pad_kinds(kinds: Sequence[ContainerKind], n: int) -> Sequence[ContainerKind]:
    if len(kinds) >= n:
        return kinds
    return (*kinds, *([ContainerKind.APP] * (n - len(kinds))))


@dataclass(frozen=True, slots=True)
class OwnUsage:
    """The pod's own usage on one GPU as seen by the container being fitted (``t``).

    ``con_*``: per-field maximum over the phases containing ``t`` of the other containers'
    sums there (they run concurrently with ``t``); ``oth_*``: the same over the phases not
    containing ``t``. With ``t`` placed with (mem, cores) the pod books
    ``max(con + (1, mem, cores), oth)`` per field.
    """

    con_slots: int = 0
    con_mem: int = 0
    con_cores: int = 0
    oth_slots: int = 0
    oth_mem: int = 0
    oth_cores: int = 0

    def booked(self) -> tuple[int, int, int]:
        """(slots, mem, cores) the pod books here without ``t``."""
        return (
            max(self.con_slots, self.oth_slots),
            max(self.con_mem, self.oth_mem),
            max(self.con_cores, self.oth_cores),
        )


def own_usage_for(
    layout: PodDevices,
    kinds: Sequence[ContainerKind],
    target: int,
    init_released: bool = False,
    mig: Iterable[MigAllocation] = (),
) -> dict[str, OwnUsage]:
    """The pod's own usage per GPU as seen by container ``target`` (its own entry excluded; on a
    GPU its MIG reservations ``mig`` name, every other entry runs with it)."""
    kinds = _pad_kinds(kinds, max(len(layout), target + 1))
    held = _held_gpus(mig)
    con: dict[str, list[int]] = {}
    oth: dict[str, list[int]] = {}
    for phase in phases(kinds, init_released):
        dest = con if target in phase else oth
        for uuid, (s, m, c) in _phase_sums(layout, phase, held, target).items():
            acc = dest.get(uuid)
            if acc is None:
                dest[uuid] = [s, m, c]
            else:
                acc[0] = max(acc[0], s)
                acc[1] = max(acc[1], m)
                acc[2] = max(acc[2], c)
    out: dict[str, OwnUsage] = {}
    for uuid in con.keys() | oth.keys():
        cs, cm, cc = con.get(uuid, (0, 0, 0))
        os_, om, oc = oth.get(uuid, (0, 0, 0))
        out[uuid] = OwnUsage(cs, cm, cc, os_, om, oc)
    return out
