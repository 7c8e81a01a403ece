"""Fit a pod onto one node (HAMi's NVIDIA ``Fit`` and ``fitInDevices``) and the restricted refit.

Per-device checks run in HAMi's order (docs/hami-wire.md §3.5) with HAMi's reasons, aggregated as
``"<n>/<m> Reason"`` sorted and ``", "``-joined. Capacity is checked phase-aware: a container
is checked against the other pods' usage plus the pod's own usage in the phases it runs in, and
the pod's usage in its other phases must still fit (see :mod:`hamid.fit.usage`). Nothing here
mutates a :class:`NodeUsage`; the caller books a result with ``NodeUsage.add``.

On a GPU in MIG mode the fit also needs a free MIG placement (:mod:`hamid.fit.mig`), may give one
container several instances of that GPU (HAMi revisits it after each one it accepts), and books
each instance as its profile's memory and cores.
"""

from __future__ import annotations

import functools
import itertools
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from hamid.fit.mig import next_candidate, select_candidate
from hamid.fit.policy import PodPolicy, device_score, request_memory, try_order
from hamid.fit.usage import (
    ContainerKind,
    DeviceUsage,
    NodeUsage,
    OwnUsage,
    PodUsage,
    container_kinds,
    effective_pod_usage,
    own_usage_for,
    usage_totals,
)
from hamid.model import objects
from hamid.model import reasons as R
from hamid.model.devices import (
    MODE_MIG,
    NVIDIA,
    ContainerDevice,
    ContainerDevices,
    MigPlacement,
    MigProfile,
    PodDevices,
)
from hamid.model.errors import InvalidInput
from hamid.model.mig import MigAllocation
from hamid.model.quantity import integer_quantity
from hamid.model.resources import (
    MEM_PERCENTAGE_UNSET,
    ContainerDeviceRequest,
    ResourceConfig,
    pod_requests,
)

_NO_OWN = OwnUsage()


@dataclass(frozen=True, slots=True)
class Quota:
    """A namespace's GPU quota headroom as one pod's fit sees it.

    ``mem_limit`` is ``limits.<gpumem>`` x memoryFactor, ``cores_limit`` ``limits.<gpucores>``
    (``None`` = no limit); ``used_*`` the namespace's tracked usage **excluding** the pod
    being fitted (HAMi ``FitQuota``; docs/hami-wire.md §3.10). An explicit limit of 0 blocks.
    """

    mem_limit: int | None = None
    cores_limit: int | None = None
    used_mem: int = 0
    used_cores: int = 0

    def fits(self, mem: int, cores: int) -> bool:
        """Whether the pod's total (memory, cores) fits the headroom."""
        if self.mem_limit is not None and self.used_mem + mem > self.mem_limit:
            return False
        return self.cores_limit is None or self.used_cores + cores <= self.cores_limit

    def keeping(self, mem: int, cores: int) -> Quota:
        """This headroom for a pod that replaces a booking counting ``mem``/``cores``: a limit the
        namespace exceeds with that booking (a quota lowered later) stands at that usage, so only
        growth is refused; a replacement that grows nothing is never refused for the quota."""
        return replace(
            self,
            mem_limit=None if self.mem_limit is None else max(self.mem_limit, self.used_mem + mem),
            cores_limit=None if self.cores_limit is None else max(self.cores_limit, self.used_cores + cores),
        )

    @property
    def limited(self) -> bool:
        """Whether any limit is set."""
        return self.mem_limit is not None or self.cores_limit is not None


def quota_limits(hard: Mapping[str, object], config: ResourceConfig) -> tuple[int | None, int | None]:
    """(memory limit x memoryFactor, cores limit) from a ResourceQuota's ``spec.hard``.

    Reads ``limits.<resourceMemoryName>`` and ``limits.<resourceCoreName>``; absent ⇒ ``None``.
    Raises :class:`InvalidInput` for a value that is not an integer quantity.
    """
    mem_key = "limits." + config.resource_memory_name
    core_key = "limits." + config.resource_core_name
    mem = hard.get(mem_key)
    cores = hard.get(core_key)
    return (
        None if mem is None else integer_quantity(mem, mem_key) * max(config.memory_factor, 1),
        None if cores is None else integer_quantity(cores, core_key),
    )


@dataclass(frozen=True, slots=True)
class PodFitSpec:
    """A pod's requests (one per container, init first), container kinds and policy."""

    requests: tuple[ContainerDeviceRequest | None, ...]
    kinds: tuple[ContainerKind, ...]
    policy: PodPolicy

    @property
    def wants_gpu(self) -> bool:
        """Whether any container requests an NVIDIA device."""
        return any(r is not None and r.nums > 0 for r in self.requests)

    @property
    def takes_node_lock(self) -> bool:
        """Whether a regular container requests an NVIDIA device: only then does HAMi's bind take
        the node lock (and, under ``steer``, wait for the plugin's list)."""
        return any(
            r is not None and r.nums > 0
            for r, kind in zip(self.requests, self.kinds, strict=True)
            if kind is ContainerKind.APP
        )

    @classmethod
    def from_pod(
        cls,
        pod: Mapping[str, Any],
        config: ResourceConfig,
        default_gpu_policy: str,
        default_node_policy: str,
    ) -> PodFitSpec:
        """Parse a pod dict once (requests, kinds, policy annotations).

        Raises :class:`InvalidInput` for invalid policy annotations (e.g. scoring weights).
        """
        return cls(
            requests=tuple(pod_requests(pod, config)),
            kinds=container_kinds(pod),
            policy=PodPolicy.from_annotations(
                objects.annotations(pod), default_gpu_policy, default_node_policy
            ),
        )


@dataclass(frozen=True, slots=True)
class Fitted:
    """A pod fits a node: per-container devices (init first, GPU-less containers empty), and the
    MIG reservation of each device placed on a GPU in MIG mode (indexes into ``devices``)."""

    devices: PodDevices
    score: float  #: node score before placing the pod (HAMi ``ComputeDefaultScore``)
    mig: tuple[MigAllocation, ...] = ()


@dataclass(frozen=True, slots=True)
class Refitted:
    """A restricted fit succeeded: the container's new devices and the pod's new layout."""

    devices: ContainerDevices
    layout: PodDevices


@dataclass(frozen=True, slots=True)
class Unfit:
    """The pod (or container) does not fit: HAMi's reason string, e.g. ``2/2 CardCordoned``."""

    reason: str


def gen_reason(reasons: Mapping[str, int], considered: int) -> str:
    """HAMi's ``GenReason``: ``"<n>/<m> <Reason>"`` entries, sorted, ``", "``-joined."""
    return ", ".join(sorted(f"{n}/{considered} {r}" for r, n in reasons.items()))


def _pair_score(scores: Mapping[str, Mapping[str, int]], a: str, b: str) -> int:
    """The score ``a`` publishes for ``b``; a missing entry scores 0 (HAMi reads a nil map)."""
    return (scores.get(a) or {}).get(b, 0)


def _worst_single(
    collected: Sequence[ContainerDevice], scores: Mapping[str, Mapping[str, int]]
) -> ContainerDevice:
    """HAMi ``computeWorstSingleCard``: the device with the lowest sum of its scores to the others.

    The search starts from no best, so negative sums win as any other; the first minimum in
    try order wins (``TestFit_TopologyWorstSingleCard``, ``TestFit_TopologyNegativeScores``).
    """
    best: ContainerDevice | None = None
    best_total = 0
    for d in collected:
        total = sum(_pair_score(scores, d.uuid, o.uuid) for o in collected if o.uuid != d.uuid)
        if best is None or total < best_total:
            best, best_total = d, total
    assert best is not None  # callers pass more devices than requested, so at least two
    return best


def _best_combination(
    collected: Sequence[ContainerDevice], nums: int, scores: Mapping[str, Mapping[str, int]]
) -> tuple[ContainerDevice, ...]:
    """HAMi ``computeBestCombination``: the ``nums``-combination with the highest pair-score sum.

    Combinations come in lexicographic order of the accepted (try-order) list; each pair counts
    once, as the score its earlier member publishes for the later one. The search starts from no
    best (never from an empty pick), so all-negative or all-zero scores still choose ``nums``
    devices; the first maximum wins (``TestFit_TopologyBestCombination*``, ``...NegativeScores``).
    """
    best: tuple[ContainerDevice, ...] | None = None
    best_total = 0
    for combo in itertools.combinations(collected, nums):
        total = sum(_pair_score(scores, a.uuid, b.uuid) for a, b in itertools.combinations(combo, 2))
        if best is None or total > best_total:
            best, best_total = combo, total
    assert best is not None  # len(collected) > nums >= 2, so there is at least one combination
    return best


def _topology_pick(
    collected: Sequence[ContainerDevice], nums: int, scores: Mapping[str, Mapping[str, int]]
) -> tuple[ContainerDevice, ...]:
    """HAMi's topology-aware choice among more accepted devices than needed."""
    if nums == 1:
        return (_worst_single(collected, scores),)
    return _best_combination(collected, nums, scores)


@dataclass(slots=True)
class _Row:
    """One candidate device's effective usage as the container being fitted sees it.

    ``used``/``usedmem``/``usedcores``: the device's usage by other pods (the pod's own booking,
    when re-fitted, released); ``own``: the pod's other containers there (see :class:`OwnUsage`).
    """

    device: DeviceUsage
    used: int
    usedmem: int
    usedcores: int
    own: OwnUsage


_RowFields = tuple[DeviceUsage, int, int, int, OwnUsage]


@dataclass(slots=True)
class _ContainerFit:
    """One container's fit in progress: what it asks, the device being checked, what it collected.

    ``memreq``/``need_mem``/``need_cores`` size the device being checked (:meth:`size`): what
    the request books on that card (Fit step 9) and what the pod then books there in its
    heaviest phase.
    """

    request: ContainerDeviceRequest
    policy: PodPolicy
    cordoned: frozenset[str]
    cores: int  #: the core request clamped to 100 (Fit step 8)
    quota: Quota | None  #: only when it limits anything
    mig: bool = False  #: whether a candidate is in MIG mode
    base_mem: int = 0  #: the pod's booking without this container (its quota use)
    base_cores: int = 0
    extra_mem: int = 0  #: what the collected devices add to it
    extra_cores: int = 0
    numa: int | None = None  #: the NUMA group being collected under numa-bind
    collected: list[ContainerDevice] = field(default_factory=list)
    memreq: int = 0
    need_mem: int = 0
    need_cores: int = 0
    release: PodUsage = field(default_factory=dict)  #: the pod's own booking, treated as free
    own_mig: Mapping[str, Sequence[MigPlacement]] = field(default_factory=dict)  #: the pod's placements
    _occupied: dict[str, list[MigPlacement]] = field(default_factory=dict)

    def occupied(self, device: DeviceUsage) -> list[MigPlacement]:
        """The MIG placements taken on ``device`` before this container (cached per device)."""
        taken = self._occupied.get(device.id)
        if taken is None:
            taken = self._occupied[device.id] = mig_occupied(device, self.release, self.own_mig)
        return taken

    def size(self, row: _Row) -> None:
        """Size the request on ``row``'s device (before the capacity checks)."""
        own = row.own
        self.memreq = request_memory(self.request, row.device.totalmem)
        self.need_mem = max(own.con_mem + self.memreq, own.oth_mem)
        self.need_cores = max(own.con_cores + self.cores, own.oth_cores)

    def extra(self, row: _Row) -> tuple[int, int]:
        """(memory, cores) placing the container on the sized device adds to the pod's booking: on a
        GPU in MIG mode the instance's profile, which is what gets booked (HAMi counts the request
        against the quota and books the profile, so a pod could end up over its quota)."""
        own = row.own
        mem = self.need_mem - max(own.con_mem, own.oth_mem)
        cores = self.need_cores - max(own.con_cores, own.oth_cores)
        chosen = self.mig_choice(row.device) if self.mig and row.device.mode == MODE_MIG else None
        if chosen is not None:
            mem += chosen[0].memory_mb - self.memreq
            cores += chosen[0].core - self.cores
        return mem, cores

    def mig_choice(self, device: DeviceUsage) -> tuple[MigProfile, MigPlacement] | None:
        """The instance the sized request takes on ``device`` after this container's earlier ones."""
        earlier = [d.usedmem for d in self.collected if d.uuid == device.id]
        return next_candidate(device.mig_profiles, self.occupied(device), earlier, self.memreq)

    def enter_group(self, numa: int, reasons: Counter[str]) -> None:
        """Fit step 4 under numa-bind: a new NUMA group discards what the previous one collected."""
        if numa == self.numa:
            return
        if self.collected:
            reasons[R.NUMA_NOT_FIT] += len(self.collected)
            self.collected = []
            self.extra_mem = self.extra_cores = 0
        self.numa = numa

    def book(self, row: _Row) -> None:
        """Accept the sized ``row`` (Fit step 16)."""
        self.collected.append(ContainerDevice(row.device.id, NVIDIA, self.memreq, self.cores))
        if self.quota is not None:
            mem, cores = self.extra(row)
            self.extra_mem += mem
            self.extra_cores += cores


Check = Callable[[_ContainerFit, _Row], bool]
"""A per-device check: True when the device fails it."""


def _unhealthy(fit: _ContainerFit, row: _Row) -> bool:
    return not row.device.fit_healthy


def _cordoned(fit: _ContainerFit, row: _Row) -> bool:
    return row.device.id in fit.cordoned


def _type_mismatch(fit: _ContainerFit, row: _Row) -> bool:
    policy, device = fit.policy, row.device
    return (
        not policy.type_allowed(device.type)
        or (policy.vgpu_mode is not None and device.mode not in policy.vgpu_mode)
        or fit.request.type != NVIDIA
    )


def _uuid_excluded(fit: _ContainerFit, row: _Row) -> bool:
    return not fit.policy.uuid_allowed(row.device.id)


def _no_free_slot(fit: _ContainerFit, row: _Row) -> bool:
    return row.used + max(row.own.con_slots + 1, row.own.oth_slots) > row.device.count


def _mutex_busy(fit: _ContainerFit, row: _Row) -> bool:
    return fit.policy.gpu_policy.mutex and row.used + row.own.con_slots > 0


def _over_quota(fit: _ContainerFit, row: _Row) -> bool:
    if fit.quota is None:
        return False
    mem, cores = fit.extra(row)
    return not fit.quota.fits(fit.base_mem + fit.extra_mem + mem, fit.base_cores + fit.extra_cores + cores)


def _short_of_memory(fit: _ContainerFit, row: _Row) -> bool:
    return row.usedmem + fit.need_mem > row.device.totalmem


def _short_of_cores(fit: _ContainerFit, row: _Row) -> bool:
    return row.usedcores + fit.need_cores > row.device.totalcore


def _exclusive_busy(fit: _ContainerFit, row: _Row) -> bool:
    return row.device.totalcore == 100 and fit.cores == 100 and row.used + row.own.con_slots > 0


def _compute_exhausted(fit: _ContainerFit, row: _Row) -> bool:
    device = row.device
    return device.totalcore != 0 and row.usedcores + row.own.con_cores == device.totalcore and fit.cores == 0


def _mig_infeasible(fit: _ContainerFit, row: _Row) -> bool:
    return row.device.mode == MODE_MIG and fit.mig_choice(row.device) is None


def mig_occupied(
    device: DeviceUsage, release: PodUsage, own: Mapping[str, Sequence[MigPlacement]]
) -> list[MigPlacement]:
    """The placements taken on ``device``: its bookings less the pod's own (``release``, a re-filter)
    plus those the pod's earlier containers took (all of a pod's instances live as long as it does)."""
    booked = list(device.mig_used)
    released = release.get(device.id) if release else None
    for a in released.mig if released is not None else ():
        if a in booked:
            booked.remove(a)
    return [a.placement for a in booked] + list(own.get(device.id, ()))


#: Gates of checks that cannot fail for most containers (left out when their gate is off).
CORDON, TYPE_RULES, UUID_RULES, MUTEX, QUOTA = "cordon", "type-rules", "uuid-rules", "mutex", "quota"
MIG = "mig"
CheckRow = tuple[str, Check, str | None]
"""(HAMi reason, check, gate): the check runs only when its gate (None: always) is on."""

#: HAMi's per-device checks before the NUMA group step (docs/hami-wire.md §3.5 steps 1-3).
DEVICE_CHECKS: tuple[CheckRow, ...] = (
    (R.CARD_NOT_HEALTH, _unhealthy, None),
    (R.CARD_CORDONED, _cordoned, CORDON),
    (R.CARD_TYPE_MISMATCH, _type_mismatch, TYPE_RULES),
)
#: HAMi's per-device checks after it (steps 5-15); the first that fails counts its reason.
CAPACITY_CHECKS: tuple[CheckRow, ...] = (
    (R.CARD_UUID_MISMATCH, _uuid_excluded, UUID_RULES),
    (R.CARD_TIME_SLICING_EXHAUSTED, _no_free_slot, None),
    (R.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT, _mutex_busy, MUTEX),
    (R.RESOURCE_QUOTA_NOT_FIT, _over_quota, QUOTA),
    (R.CARD_INSUFFICIENT_MEMORY, _short_of_memory, None),
    (R.CARD_INSUFFICIENT_CORE, _short_of_cores, None),
    (R.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT, _exclusive_busy, None),
    (R.CARD_COMPUTE_UNITS_EXHAUSTED, _compute_exhausted, None),
    (R.CARD_MIG_TOPOLOGY_INFEASIBLE, _mig_infeasible, MIG),
)
ActiveChecks = tuple[tuple[str, Check], ...]


@functools.lru_cache(maxsize=64)
def _active_checks(gates: frozenset[str]) -> tuple[ActiveChecks, ActiveChecks]:
    """The two tables with the checks whose gate is off left out (they cannot fail)."""

    def active(table: tuple[CheckRow, ...]) -> ActiveChecks:
        return tuple((reason, check) for reason, check, gate in table if gate is None or gate in gates)

    return active(DEVICE_CHECKS), active(CAPACITY_CHECKS)


def _gates(fit: _ContainerFit) -> frozenset[str]:
    policy = fit.policy
    gates: list[str] = []
    if fit.cordoned:
        gates.append(CORDON)
    if (
        policy.use_types is not None
        or policy.nouse_types
        or policy.vgpu_mode is not None
        or fit.request.type != NVIDIA
    ):
        gates.append(TYPE_RULES)
    if policy.use_uuids is not None or policy.nouse_uuids:
        gates.append(UUID_RULES)
    if policy.gpu_policy.mutex:
        gates.append(MUTEX)
    if fit.quota is not None:
        gates.append(QUOTA)
    if fit.mig:
        gates.append(MIG)
    return frozenset(gates)


def _first_failure(checks: ActiveChecks, fit: _ContainerFit, row: _Row) -> str | None:
    for reason, failed in checks:
        if failed(fit, row):
            return reason
    return None


def _ranked_rows(
    node_cands: Sequence[DeviceUsage],
    request: ContainerDeviceRequest,
    policy: PodPolicy,
    own: Mapping[str, OwnUsage],
    release: PodUsage,
) -> tuple[list[_RowFields], list[int]]:
    """Every candidate's row fields and the order Fit tries them (``device_score``/``try_order``).

    A device's score counts the pod's own booking there (it will be the pod's usage after the
    placement); its ``used`` for the sort counts only the containers running with this one.
    The :class:`_Row` records are made only for the devices the fit reaches.
    """
    rows: list[_RowFields] = []
    numas: list[int] = []
    scores: list[float] = []
    useds: list[int] = []
    indexes: list[int] = []
    weights = policy.weights
    for d in node_cands:
        used, usedmem, usedcores = d.used, d.usedmem, d.usedcores
        released = release.get(d.id) if release else None
        if released is not None:
            used -= max(released.slots, 1)
            usedmem -= released.mem
            usedcores -= released.cores
        o = own.get(d.id, _NO_OWN) if own else _NO_OWN
        booked_slots, booked_mem, booked_cores = o.booked() if o is not _NO_OWN else (0, 0, 0)
        scores.append(
            device_score(
                d.count,
                d.totalcore,
                d.totalmem,
                used + booked_slots,
                usedcores + booked_cores,
                usedmem + booked_mem,
                request,
                weights,
            )
        )
        numas.append(d.numa)
        useds.append(used + o.con_slots)
        indexes.append(d.index)
        rows.append((d, used, usedmem, usedcores, o))
    return rows, try_order(numas, scores, useds, indexes, policy.gpu_policy, policy.numa_bind)


def _start(
    request: ContainerDeviceRequest,
    policy: PodPolicy,
    cordoned: frozenset[str],
    own: Mapping[str, OwnUsage],
    quota: Quota | None,
) -> _ContainerFit:
    fit = _ContainerFit(request, policy, cordoned, min(request.coresreq, 100), None)
    if quota is not None and quota.limited:
        fit.quota = quota
        for o in own.values():
            _, mem, cores = o.booked()
            fit.base_mem += mem
            fit.base_cores += cores
    return fit


def _mig_request(
    node_cands: Sequence[DeviceUsage], request: ContainerDeviceRequest, policy: PodPolicy
) -> bool:
    """HAMi ``isMIGRequest``: an NVIDIA request that may take MIG instances (its ``vgpu-mode``, if
    any, names ``mig``) on a node with a GPU in MIG mode; it may ask more devices than the node has."""
    return (
        request.type == NVIDIA
        and (policy.vgpu_mode is None or MODE_MIG in policy.vgpu_mode)
        and any(d.mode == MODE_MIG for d in node_cands)
    )


def _fit_container(
    node_cands: Sequence[DeviceUsage],
    cordoned: frozenset[str],
    pair_scores: Mapping[str, Mapping[str, int]],
    request: ContainerDeviceRequest,
    policy: PodPolicy,
    own: Mapping[str, OwnUsage],
    release: PodUsage,
    quota: Quota | None,
    prefer: Sequence[str] = (),
    own_mig: Mapping[str, Sequence[MigPlacement]] | None = None,
) -> ContainerDevices | str:
    """Fit one container's request onto candidate devices; devices or a reason string.

    Devices are tried in policy order (the ``prefer`` ids first, in their order); each one runs
    :data:`DEVICE_CHECKS`, HAMi's numa-bind
    group step, then :data:`CAPACITY_CHECKS` (less the checks that cannot fail for this
    container), and counts the first failing check's reason. A GPU in MIG mode is tried again
    after each device it gives (HAMi's ``i++``) until it fails a check; ``own_mig`` holds the MIG
    placements the pod's earlier containers took. Devices carry the memory asked there, not yet
    the MIG profile's (:func:`fit_pod` places them).
    """
    nums = request.nums
    mig = own_mig is not None and _mig_request(node_cands, request, policy)
    if nums > len(node_cands) and not mig:
        return R.NODE_INSUFFICIENT_DEVICE
    rows, order = _ranked_rows(node_cands, request, policy, own, release)
    if prefer:
        rank = {device: k for k, device in enumerate(prefer)}
        order.sort(key=lambda i: rank.get(rows[i][0].id, len(rank)))
    fit = _start(request, policy, cordoned, own, quota)
    if mig:
        fit.mig, fit.release, fit.own_mig = True, release, own_mig or {}
    reasons: Counter[str] = Counter()
    topology = policy.gpu_policy.topology_aware
    device_checks, capacity_checks = _active_checks(_gates(fit))
    k = 0
    while k < len(order):
        row = _Row(*rows[order[k]])
        reason = _first_failure(device_checks, fit, row)
        if reason is None:
            if policy.numa_bind:
                fit.enter_group(row.device.numa, reasons)
            fit.size(row)
            reason = _first_failure(capacity_checks, fit, row)
        if reason is not None:
            reasons[reason] += 1
            k += 1
            continue
        fit.book(row)
        if not topology and len(fit.collected) == nums:
            return tuple(fit.collected)
        if not fit.mig or row.device.mode != MODE_MIG:
            k += 1
    return _finish(fit.collected, nums, topology, pair_scores, reasons, len(node_cands))


def _finish(
    collected: list[ContainerDevice],
    nums: int,
    topology: bool,
    pair_scores: Mapping[str, Mapping[str, int]],
    reasons: Counter[str],
    considered: int,
) -> ContainerDevices | str:
    """After every device was tried: topology-aware's choice, or the reasons (HAMi's tail of Fit)."""
    if topology:
        if len(collected) == nums:
            return tuple(collected)
        if len(collected) > nums:
            return _topology_pick(collected, nums, pair_scores)
    if collected:
        reasons[R.ALLOCATED_CARDS_INSUFFICIENT_REQUEST] = len(collected)
    return gen_reason(reasons, considered)


def fit_pod(
    node: NodeUsage,
    spec: PodFitSpec,
    quota: Quota | None = None,
    release: PodUsage | None = None,
    targets: Sequence[frozenset[int] | None] = (),
    prefer: Sequence[str] = (),
) -> Fitted | Unfit:
    """Fit every container of a pod onto one :class:`~hamid.fit.usage.NodeUsage`.

    Containers are fitted in order (init first); each sees the pod's own earlier containers
    that run concurrently with it (regular init containers each on their own with earlier
    sidecars, sidecars and app containers cumulatively) and must keep the pod's other phases
    within capacity. ``release`` is usage already booked on the node for this same pod (a
    re-filter), treated as free. ``quota`` is the namespace headroom without this pod.
    ``targets[t]``, when given and not None, restricts container ``t`` to GPUs on those NUMA
    nodes (the predicted placement, :mod:`hamid.fit.numa_fit`). ``prefer`` lists device ids every
    container tries first, in that order (the ``fgd`` GPU choice); the others follow in policy order.
    Returns one entry per container (GPU-less ones empty — the intended format of
    docs/hami-wire.md §8.1) and the node score, or the first failing container's reason.
    A device on a GPU in MIG mode books its profile's memory and cores and comes with its
    reservation (:attr:`Fitted.mig`); a pod's instances never share a slice, whatever their phases,
    and its later containers there run beside all of them (each lives until the pod ends).
    """
    score = node.score(release)
    n = len(spec.requests)
    layout: list[ContainerDevices] = [()] * n
    any_placed = False
    own_mig: dict[str, list[MigPlacement]] | None = {} if node.has_mig else None
    reservations: list[MigAllocation] = []
    for t, request in enumerate(spec.requests):
        if request is None or request.nums <= 0:
            continue
        allowed = targets[t] if t < len(targets) else None
        cands = node.candidates if allowed is None else [d for d in node.candidates if d.numa in allowed]
        own = own_usage_for(tuple(layout), spec.kinds, t, mig=reservations) if any_placed else {}
        result = _fit_container(
            cands,
            node.cordoned,
            node.pair_scores,
            request,
            spec.policy,
            own,
            release or {},
            quota,
            prefer,
            own_mig,
        )
        if isinstance(result, str):
            return Unfit(result)
        if own_mig is not None:
            placed = _place_mig(node, result, t, release or {}, own_mig, reservations)
            if isinstance(placed, str):
                return Unfit(placed)
            result = placed
        layout[t] = result
        any_placed = True
    return Fitted(tuple(layout), score, tuple(reservations))


def _place_mig(
    node: NodeUsage,
    devices: ContainerDevices,
    container: int,
    release: PodUsage,
    own_mig: dict[str, list[MigPlacement]],
    reservations: list[MigAllocation],
) -> ContainerDevices | str:
    """HAMi ``AddResourceUsage`` for one fitted container: each device on a MIG GPU, in order, takes
    the profile and placement :func:`~hamid.fit.mig.select_candidate` gives for its memory and books
    the profile's memory and cores; its reservation joins ``reservations`` and ``own_mig``."""
    out: list[ContainerDevice] = []
    for j, d in enumerate(devices):
        device = node.by_id.get(d.uuid)
        if device is None or device.mode != MODE_MIG:
            out.append(d)
            continue
        chosen = select_candidate(device.mig_profiles, mig_occupied(device, release, own_mig), d.usedmem)
        if chosen is None:
            return f"AddResourceUsage failed for device {d.uuid}: MIG profile and placement allocation failed"
        profile, placement = chosen
        own_mig.setdefault(d.uuid, []).append(placement)
        out.append(ContainerDevice(d.uuid, d.type, profile.memory_mb, profile.core))
        reservations.append(MigAllocation(container, j, d.uuid, profile.name, placement))
    return tuple(out)


def room_needed(spec: PodFitSpec) -> tuple[int, int, int]:
    """The least :meth:`NodeUsage.room` a node needs for :func:`fit_pod` to possibly fit ``spec``.

    (most GPUs one container asks, most MiB one container asks per GPU as a fixed amount,
    most cores one container asks per GPU). Each container needs that many usable GPUs with a
    free slot, its memory and its cores free beyond every other pod's usage (the pod's own
    usage only adds), so a node whose room is below this in any field cannot fit the pod
    without ``release`` — a cheap test that skips full nodes without running the fit.
    Percentage and whole-card memory requests depend on each card's size and add no bound.
    """
    nums = mem = cores = 0
    for request in spec.requests:
        if request is None or request.nums <= 0:
            continue
        nums = max(nums, request.nums)
        mem = max(mem, request.memreq)
        cores = max(cores, min(request.coresreq, 100))
    return nums, mem, cores


def is_heterogeneous(devices: ContainerDevices) -> bool:
    """Whether a multi-device reservation books differing memory or cores per device."""
    return len({(d.usedmem, d.usedcores) for d in devices}) > 1


def reservation_request(devices: ContainerDevices) -> ContainerDeviceRequest:
    """The request that re-fits a reservation: its device count and per-device amounts.

    Raises :class:`InvalidInput` for an empty or heterogeneous reservation.
    """
    if not devices:
        raise InvalidInput("the container has no reserved device")
    if is_heterogeneous(devices):
        raise InvalidInput("the reservation books differing amounts per device")
    first = devices[0]
    return ContainerDeviceRequest(
        nums=len(devices),
        type=NVIDIA,
        memreq=first.usedmem,
        mem_percentage_req=MEM_PERCENTAGE_UNSET,
        coresreq=first.usedcores,
    )


def replace_entry(layout: PodDevices, index: int, devices: ContainerDevices) -> PodDevices:
    """The layout with container ``index``'s entry replaced (padded with empty entries)."""
    entries = list(layout) + [()] * max(0, index + 1 - len(layout))
    entries[index] = devices
    return tuple(entries)


def pod_quota_usage(
    layout: PodDevices,
    kinds: Sequence[ContainerKind],
    init_released: bool = False,
    mig: Sequence[MigAllocation] = (),
) -> tuple[int, int]:
    """(memory, cores) a pod counts against its namespace quota, from its positional layout and
    MIG reservations (``mig``), as :func:`~hamid.fit.usage.effective_pod_usage` books them.

    Upstream #2836's ``effectivePodDeviceUsage`` + sum: e.g. init@A 5000, app@A 5000,
    app@A 5000 counts 10000; with the init container moved to B it counts 15000.
    """
    return usage_totals(effective_pod_usage(layout, kinds, init_released, mig))


def fit_container_restricted(
    node: NodeUsage,
    layout: PodDevices,
    kinds: Sequence[ContainerKind],
    index: int,
    allowed: Collection[str],
    policy: PodPolicy,
    *,
    init_released: bool = False,
    quota: Quota | None = None,
    booked: PodUsage | None = None,
) -> Refitted | Unfit:
    """Re-fit container ``index``'s reservation onto the allowed GPU UUIDs of ``node`` (refit).

    The request keeps the reservation's amounts (count and per-device memory/cores; see
    :func:`reservation_request`, which raises :class:`InvalidInput` when heterogeneous). Every
    policy of the normal fit applies (GPU policy and chains, mutex, numa-bind, topology-aware,
    use/nouse lists, vgpu-mode). The pod's own booked usage (``booked``, default the layout's
    effective usage — what the scheduler booked for it) is released from ``node`` and its
    other containers are seeded phase-correctly, so capacity is judged exactly as the pod will
    be booked after the move; other pods stay counted. ``quota`` is the namespace headroom
    without this pod; it is checked on the positional layout (upstream #2828/#2836).
    Fails with ``AllowedDeviceSetUnmatched`` when no allowed UUID is an NVIDIA device of the node.
    """
    request = reservation_request(layout[index] if index < len(layout) else ())
    allowed_set = allowed if isinstance(allowed, (set, frozenset)) else frozenset(allowed)
    cands = [d for d in node.candidates if d.id in allowed_set]
    if not cands:
        return Unfit(R.ALLOWED_DEVICE_SET_UNMATCHED)
    if booked is None:
        booked = effective_pod_usage(layout, kinds, init_released)
    own = own_usage_for(layout, kinds, index, init_released)
    result = _fit_container(cands, node.cordoned, node.pair_scores, request, policy, own, booked, quota)
    if isinstance(result, str):
        return Unfit(result)
    return Refitted(result, replace_entry(layout, index, result))
