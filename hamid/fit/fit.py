"""Fit a pod onto one node (HAMi's NVIDIA ``Fit`` and ``fitInDevices``) and the restricted refit.

Per-device checks run in HAMi's order (hami-wire §3.5) with HAMi's reasons, aggregated as
``"<n>/<m> Reason"`` sorted and ``", "``-joined. Capacity is checked phase-aware: a container
is checked against the other pods' usage plus the pod's own usage in the phases it runs in, and
the pod's usage in its other phases must still fit (see :mod:`hamid.fit.usage`). Nothing here
mutates a :class:`NodeUsage`; the caller books a result with ``NodeUsage.add``.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

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
from hamid.model import reasons as R
from hamid.model.devices import MODE_MIG, NVIDIA, ContainerDevice, ContainerDevices, PodDevices
from hamid.model.errors import InvalidInput
from hamid.model.resources import (
    MEM_PERCENTAGE_UNSET,
    ContainerDeviceRequest,
    ResourceConfig,
    pod_requests,
    quantity_as_int,
)

_NO_OWN = OwnUsage()


@dataclass(frozen=True, slots=True)
class Quota:
    """A namespace's GPU quota headroom as one pod's fit sees it.

    ``mem_limit`` is ``limits.<gpumem>`` x memoryFactor, ``cores_limit`` ``limits.<gpucores>``
    (``None`` = no limit); ``used_*`` the namespace's tracked usage **excluding** the pod
    being fitted (HAMi ``FitQuota``; hami-wire §3.10). An explicit limit of 0 blocks.
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

    @property
    def limited(self) -> bool:
        """Whether any limit is set."""
        return self.mem_limit is not None or self.cores_limit is not None


def _quantity(value: object, where: str) -> int:
    n = quantity_as_int(value, where)
    if n is None:
        raise InvalidInput(f"{where}: {value!r} is not an integer quantity")
    return n


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
        None if mem is None else _quantity(mem, mem_key) * max(config.memory_factor, 1),
        None if cores is None else _quantity(cores, core_key),
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

    @classmethod
    def from_pod(
        cls,
        pod: Mapping,
        config: ResourceConfig,
        default_gpu_policy: str,
        default_node_policy: str,
    ) -> PodFitSpec:
        """Parse a pod dict once (requests, kinds, policy annotations).

        Raises :class:`InvalidInput` for invalid policy annotations (e.g. scoring weights).
        """
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        return cls(
            requests=tuple(pod_requests(pod, config)),
            kinds=container_kinds(pod),
            policy=PodPolicy.from_annotations(annotations, default_gpu_policy, default_node_policy),
        )


@dataclass(frozen=True, slots=True)
class Fitted:
    """A pod fits a node: per-container devices (init first, GPU-less containers empty)."""

    devices: PodDevices
    score: float  #: node score before placing the pod (HAMi ``ComputeDefaultScore``)


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


def _fit_container(
    node_cands: Sequence[DeviceUsage],
    cordoned: frozenset[str],
    pair_scores: Mapping[str, Mapping[str, int]],
    request: ContainerDeviceRequest,
    policy: PodPolicy,
    own: Mapping[str, OwnUsage],
    release: PodUsage,
    quota: Quota | None,
) -> ContainerDevices | str:
    """Fit one container's request onto candidate devices; devices or a reason string."""
    nums = request.nums
    if nums > len(node_cands):
        return R.NODE_INSUFFICIENT_DEVICE
    n = len(node_cands)
    gpu_policy = policy.gpu_policy
    weights = policy.weights
    # Effective usage of every candidate: other pods (minus released) plus the pod's own; its
    # score and the try order come from policy.device_score and policy.try_order.
    rows: list[tuple[DeviceUsage, int, int, int, OwnUsage]] = []
    numas: list[int] = []
    scores: list[float] = []
    useds: list[int] = []
    indexes: list[int] = []
    for d in node_cands:
        used, umem, ucore = d.used, d.usedmem, d.usedcores
        if release:
            rel = release.get(d.id)
            if rel is not None:
                used -= max(rel.slots, 1)
                umem -= rel.mem
                ucore -= rel.cores
        o = own.get(d.id, _NO_OWN) if own else _NO_OWN
        s_used, s_mem, s_core = used, umem, ucore
        if o is not _NO_OWN:
            bs, bm, bc = o.booked()
            s_used, s_mem, s_core = used + bs, umem + bm, ucore + bc
        scores.append(device_score(d.count, d.totalcore, d.totalmem, s_used, s_core, s_mem, request, weights))
        numas.append(d.numa)
        useds.append(used + o.con_slots)
        indexes.append(d.index)
        rows.append((d, used, umem, ucore, o))
    order = try_order(numas, scores, useds, indexes, gpu_policy, policy.numa_bind)
    cores = min(request.coresreq, 100)
    reasons: Counter[str] = Counter()
    collected: list[ContainerDevice] = []
    topology = gpu_policy.topology_aware
    mutex = gpu_policy.mutex
    numa_bind = policy.numa_bind
    cur_numa: int | None = None
    quota_on = quota is not None and quota.limited
    base_mem = base_cores = extra_mem = extra_cores = 0
    if quota_on:
        for o in own.values():
            _, bm, bc = o.booked()
            base_mem += bm
            base_cores += bc

    for i in order:
        d, used, umem, ucore, o = rows[i]
        if not d.health:
            reasons[R.CARD_NOT_HEALTH] += 1
            continue
        if d.id in cordoned:
            reasons[R.CARD_CORDONED] += 1
            continue
        if (
            not policy.type_allowed(d.type)
            or (policy.vgpu_mode is not None and d.mode not in policy.vgpu_mode)
            or request.type != NVIDIA
        ):
            reasons[R.CARD_TYPE_MISMATCH] += 1
            continue
        if d.mode == MODE_MIG:
            reasons[R.MODE_NOT_FIT] += 1
            continue
        if numa_bind and d.numa != cur_numa:
            if collected:
                reasons[R.NUMA_NOT_FIT] += len(collected)
                collected = []
                extra_mem = extra_cores = 0
            cur_numa = d.numa
        if not policy.uuid_allowed(d.id):
            reasons[R.CARD_UUID_MISMATCH] += 1
            continue
        if used + max(o.con_slots + 1, o.oth_slots) > d.count:
            reasons[R.CARD_TIME_SLICING_EXHAUSTED] += 1
            continue
        if mutex and used + o.con_slots > 0:
            reasons[R.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT] += 1
            continue
        memreq = request_memory(request, d.totalmem)
        need_mem = max(o.con_mem + memreq, o.oth_mem)
        need_cores = max(o.con_cores + cores, o.oth_cores)
        if quota_on:
            inc_mem = need_mem - max(o.con_mem, o.oth_mem)
            inc_cores = need_cores - max(o.con_cores, o.oth_cores)
            if not quota.fits(base_mem + extra_mem + inc_mem, base_cores + extra_cores + inc_cores):
                reasons[R.RESOURCE_QUOTA_NOT_FIT] += 1
                continue
        if umem + need_mem > d.totalmem:
            reasons[R.CARD_INSUFFICIENT_MEMORY] += 1
            continue
        if ucore + need_cores > d.totalcore:
            reasons[R.CARD_INSUFFICIENT_CORE] += 1
            continue
        if d.totalcore == 100 and cores == 100 and used + o.con_slots > 0:
            reasons[R.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT] += 1
            continue
        if d.totalcore != 0 and ucore + o.con_cores == d.totalcore and cores == 0:
            reasons[R.CARD_COMPUTE_UNITS_EXHAUSTED] += 1
            continue
        collected.append(ContainerDevice(d.id, NVIDIA, memreq, cores))
        if quota_on:
            extra_mem += need_mem - max(o.con_mem, o.oth_mem)
            extra_cores += need_cores - max(o.con_cores, o.oth_cores)
        if not topology and len(collected) == nums:
            return tuple(collected)
    if topology:
        if len(collected) == nums:
            return tuple(collected)
        if len(collected) > nums:
            return _topology_pick(collected, nums, pair_scores)
    if collected:
        reasons[R.ALLOCATED_CARDS_INSUFFICIENT_REQUEST] = len(collected)
    return gen_reason(reasons, n)


def fit_pod(
    node: NodeUsage,
    spec: PodFitSpec,
    quota: Quota | None = None,
    release: PodUsage | None = None,
) -> Fitted | Unfit:
    """Fit every container of a pod onto one :class:`~hamid.fit.usage.NodeUsage`.

    Containers are fitted in order (init first); each sees the pod's own earlier containers
    that run concurrently with it (regular init containers each on their own with earlier
    sidecars, sidecars and app containers cumulatively) and must keep the pod's other phases
    within capacity. ``release`` is usage already booked on the node for this same pod (a
    re-filter), treated as free. ``quota`` is the namespace headroom without this pod.
    Returns one entry per container (GPU-less ones empty — the intended format of
    hami-wire §8.1) and the node score, or the first failing container's reason.
    """
    score = node.score(release)
    n = len(spec.requests)
    layout: list[ContainerDevices] = [()] * n
    any_placed = False
    for t, request in enumerate(spec.requests):
        if request is None or request.nums <= 0:
            continue
        own = own_usage_for(tuple(layout), spec.kinds, t) if any_placed else {}
        result = _fit_container(
            node.candidates, node.cordoned, node.pair_scores, request, spec.policy, own, release or {}, quota
        )
        if isinstance(result, str):
            return Unfit(result)
        layout[t] = result
        any_placed = True
    return Fitted(tuple(layout), score)


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
    layout: PodDevices, kinds: Sequence[ContainerKind], init_released: bool = False
) -> tuple[int, int]:
    """(memory, cores) a pod counts against its namespace quota, from its positional layout.

    Upstream #2836's ``effectivePodDeviceUsage`` + sum: e.g. init@A 5000, app@A 5000,
    app@A 5000 counts 10000; with the init container moved to B it counts 15000.
    """
    return usage_totals(effective_pod_usage(layout, kinds, init_released))


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
