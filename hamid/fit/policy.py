"""GPU and node scheduling policies, device and node scores, and a pod's policy annotations."""

from __future__ import annotations

import array
import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from hamid.model import annotations as ann
from hamid.model.annotations import ScoringWeights
from hamid.model.resources import MEM_PERCENTAGE_UNSET, ContainerDeviceRequest

#: GPU policy tokens (``hami.io/gpu-scheduler-policy``, ``--gpu-scheduler-policy``).
BINPACK = "binpack"
SPREAD = "spread"
TOPOLOGY_AWARE = "topology-aware"
MUTEX = "mutex"
NUMA = "numa"
#: hamid's fragmentation policy (node and GPU; :mod:`hamid.fit.fgd`), not HAMi's.
FGD = "fgd"
GPU_POLICIES = (BINPACK, SPREAD, TOPOLOGY_AWARE, MUTEX, NUMA, FGD)
#: Node policies (``hami.io/node-scheduler-policy``, ``--node-scheduler-policy``).
NODE_POLICIES = (BINPACK, SPREAD, FGD)

_SORT_KEYS = (BINPACK, SPREAD, NUMA)


DEFAULT_WEIGHTS = ann.DEFAULT_SCORING_WEIGHTS


@dataclass(frozen=True, slots=True)
class GpuPolicy:
    """A parsed GPU policy value: single token or comma chain (HAMi PR #2621).

    ``chain`` holds the sort keys (``binpack``/``spread``/``numa``) when the value is a chain
    (contains ``,`` or equals ``numa``), else ``None``. ``mutex`` and ``topology-aware`` act
    as Fit filters wherever they appear (HAMi ``PolicyContains``).
    """

    value: str
    chain: tuple[str, ...] | None
    mutex: bool
    topology_aware: bool

    @classmethod
    def parse(cls, value: str) -> GpuPolicy:
        """Parse a policy value; unknown tokens are ignored as HAMi does (spread behaviour)."""
        value = value.strip()
        tokens = [t.strip() for t in value.split(",")]
        chain: tuple[str, ...] | None = None
        if "," in value or value == NUMA:
            keys: list[str] = []
            for t in tokens:
                if t in _SORT_KEYS and t not in keys:
                    keys.append(t)
            chain = tuple(keys) or (SPREAD,)
        return cls(value=value, chain=chain, mutex=MUTEX in tokens, topology_aware=TOPOLOGY_AWARE in tokens)

    def sort_chain(self, numa_bind: bool) -> tuple[str, ...] | None:
        """The chain's sort keys with ``numa`` moved first under numa-bind."""
        if self.chain is None:
            return None
        if numa_bind and self.chain[0] != NUMA:
            return (NUMA, *(k for k in self.chain if k != NUMA))
        return self.chain


def request_memory(request: ContainerDeviceRequest, totalmem: int) -> int:
    """Per-device memory booked for a request on a card of ``totalmem`` MiB (Fit step 9).

    ``Memreq`` if > 0, else ``totalmem * pct / 100`` when a percentage is set. A percentage of
    0 or less books the whole card (HAMi ``TestZeroMemoryPercentageIsAccountedAsWholeCard``:
    0 % is "unset", which without memory means 100 %).
    """
    if request.memreq > 0:
        return request.memreq
    pct = request.mem_percentage_req
    if pct == MEM_PERCENTAGE_UNSET:
        return 0
    if pct <= 0:
        return totalmem
    return totalmem * min(pct, 100) // 100


def device_score(
    count: int,
    totalcore: int,
    totalmem: int,
    used: int,
    usedcores: int,
    usedmem: int,
    request: ContainerDeviceRequest | None,
    weights: ScoringWeights = DEFAULT_WEIGHTS,
) -> float:
    """HAMi's ``ComputeScore`` of one device for one container's request.

    ``10*(Ws*(r+Used)/Count + Wc*(c+Usedcores)/Totalcore + Wm*(m+Usedmem)/Totalmem)``; 0 when a
    total is 0. The usage part is upstream's score, in float32 with each step rounded as Go's
    float32 arithmetic does (:func:`f32`); the request's part is added to it in float64 (the same
    amount on every GPU of one size), so GPUs of one size tie and order exactly as upstream's.
    Intended behaviour, unlike upstream
    (docs/hami-wire.md §8.2): the container's NVIDIA request always counts (``r=1``,
    ``c=Coresreq``, ``m`` from the percentage when set, else ``Memreq``) — upstream only counted
    requests whose type equals the device's model name exactly, i.e. never on real nodes.
    """
    if count == 0 or totalcore == 0 or totalmem == 0:
        return 0.0
    r = c = m = 0
    if request is not None and request.nums > 0:
        r = 1
        c = request.coresreq
        pct = request.mem_percentage_req
        m = totalmem * pct // 100 if pct not in (0, MEM_PERCENTAGE_UNSET) else request.memreq
    if weights is DEFAULT_WEIGHTS or weights == DEFAULT_WEIGHTS:  # 1 leaves a float32 as it is
        upstream = _default_usage_score(count, totalcore, totalmem, used, usedcores, usedmem)
    else:
        slot, core, memory = f32(used / count), f32(usedcores / totalcore), f32(usedmem / totalmem)
        slot = f32(f32(weights.slot) * slot)
        core = f32(f32(weights.core) * core)
        memory = f32(f32(weights.memory) * memory)
        upstream = f32(10.0 * f32(f32(slot + core) + memory))
    return upstream + 10.0 * (
        weights.slot * r / count + weights.core * c / totalcore + weights.memory * m / totalmem
    )


@functools.lru_cache(maxsize=1 << 16)
def _default_usage_score(
    count: int, totalcore: int, totalmem: int, used: int, usedcores: int, usedmem: int
) -> float:
    """Upstream's float32 usage score of a GPU under the default weights: it depends on the GPU's
    usage only, so GPUs in the same state (most of a cluster's) share one computation."""
    slot, core, memory = f32(used / count), f32(usedcores / totalcore), f32(usedmem / totalmem)
    return f32(10.0 * f32(f32(slot + core) + memory))


_FLOAT32 = array.array("f", [0.0])


def f32(value: float) -> float:
    """``value`` rounded to the nearest float32 (past its range: infinite, as Go converts): HAMi
    scores GPUs and nodes in Go's float32, one rounding per operation. For ``+ - * /`` of float32
    operands a double result rounded once more is the float32 result (the double has more than
    twice the bits), so Python's floats passed through this after every step give Go's values
    exactly; in float64 sums that are equal in float32 can differ (or the other way round), and
    ties order differently. Integers below 2**24 (every slot, core and MiB count of a GPU or a
    node) are exact in float32 and need no rounding before their division."""
    _FLOAT32[0] = value
    return _FLOAT32[0]


SortKey = Callable[[int, float, int, int], tuple[float, ...]]
"""``(numa, score, used, index) -> key``; HAMi's ascending ``DeviceUsageList.Less`` order."""


def _key_mutex(numa: int, score: float, used: int, index: int) -> tuple[float, ...]:
    return (-used, numa)


def _key_binpack_numa_bind(numa: int, score: float, used: int, index: int) -> tuple[float, ...]:
    return (-numa, score)


def _key_spread_numa_bind(numa: int, score: float, used: int, index: int) -> tuple[float, ...]:
    return (numa, -score)


def _key_binpack(numa: int, score: float, used: int, index: int) -> tuple[float, ...]:
    return (score, numa)


def _key_spread(numa: int, score: float, used: int, index: int) -> tuple[float, ...]:
    return (-score, numa)


@functools.lru_cache(maxsize=64)
def _chain_key(chain: tuple[str, ...]) -> SortKey:
    signs = tuple((key == NUMA, 1.0 if key == BINPACK else -1.0) for key in chain)

    def key(numa: int, score: float, used: int, index: int) -> tuple[float, ...]:
        return (*(numa if is_numa else sign * score for is_numa, sign in signs), index)

    return key


def sort_key(policy: GpuPolicy, numa_bind: bool) -> SortKey:
    """The ascending sort key of a policy (HAMi consumes the sorted list from its end).

    Chains compare key by key (binpack: score ascending, spread: score descending, numa: NUMA
    ascending) and end on the device index, as upstream's ``lessByChain`` does; single values
    compare exactly what upstream's ``Less`` compares (no index), so devices equal under it keep
    the node's order (see :func:`try_order`).
    """
    chain = policy.sort_chain(numa_bind)
    if chain is not None:
        return _chain_key(chain)
    if policy.value == MUTEX:
        return _key_mutex
    # fgd orders the GPUs itself (``fit_pod``'s ``prefer``); without that order it packs
    packs = policy.value in (BINPACK, FGD)
    if numa_bind:
        return _key_binpack_numa_bind if packs else _key_spread_numa_bind
    return _key_binpack if packs else _key_spread


def try_order(
    numas: Sequence[int],
    scores: Sequence[float],
    useds: Sequence[int],
    indexes: Sequence[int],
    policy: GpuPolicy,
    numa_bind: bool,
) -> list[int]:
    """Positions of the candidate devices in the order Fit tries them (first = tried first).

    HAMi sorts ascending with ``DeviceUsageList.Less`` and consumes from the end; this returns
    that list reversed (see :func:`sort_key`). Devices that compare equal: Go's ``sort.Sort``
    is not stable in general, but for up to 12 elements (every real node) it runs an insertion
    sort, which is; so equal devices keep the node's order and the **last** of them is tried
    first. Upstream's vectors pin this (``TestFit_*`` tables whose devices all have index 0 and
    equal scores take the last device first), so this sorts ascending, stably, then reverses —
    never ``sorted(..., reverse=True)``, which would try the first equal device first.
    """
    key = sort_key(policy, numa_bind)
    ascending = sorted(range(len(numas)), key=lambda i: key(numas[i], scores[i], useds[i], indexes[i]))
    ascending.reverse()
    return ascending


def best_first(
    ranked: Sequence[tuple[float, str]],
    node_policy: str,
    position: Mapping[str, int],
    own: tuple[float, str] | None = None,
) -> Iterator[list[str]]:
    """Candidate nodes in the order a filter tries them, in groups of equal node score.

    binpack (the default) takes the highest node score first, spread the lowest; within a group
    the earliest candidate (lowest ``position``) comes first, so the first node that fits is the
    one fitting every candidate and picking the best would choose. ``ranked`` is the ascending
    ``(score, name)`` list of the state's score index; names not in ``position`` (not
    candidates) are left out; ``own`` ``(score, name)`` is placed by its own score instead of
    its indexed one (a re-filtered pod sees its own booking as free). Lazy: a filter stops at
    the first group with a node that fits, so the work follows the nodes ahead of the winner.
    """
    spread = node_policy == SPREAD
    step = 1 if spread else -1
    i = 0 if spread else len(ranked) - 1
    end = len(ranked) if spread else -1
    own_name = own[1] if own is not None else None
    while i != end:
        score = ranked[i][0]
        group: list[str] = []
        while i != end and ranked[i][0] == score:
            name = ranked[i][1]
            i += step
            if name in position and name != own_name:
                group.append(name)
        if own is not None and (own[0] < score if spread else own[0] > score):
            yield [own[1]]
            own = None
        elif own is not None and own[0] == score:
            group.append(own[1])
            own = None
        if len(group) > 1:
            group.sort(key=position.__getitem__)
        if group:
            yield group
    if own is not None:
        yield [own[1]]


@dataclass(frozen=True, slots=True)
class PodPolicy:
    """Everything a pod's annotations change about its fit, parsed once per pod."""

    gpu_policy: GpuPolicy
    node_policy: str
    weights: ScoringWeights = DEFAULT_WEIGHTS
    numa_bind: bool = False
    use_uuids: frozenset[str] | None = None
    nouse_uuids: frozenset[str] = frozenset()
    use_types: tuple[str, ...] | None = None
    nouse_types: tuple[str, ...] = ()
    vgpu_mode: str | None = None

    @classmethod
    def default(cls, gpu_policy: str = SPREAD, node_policy: str = BINPACK) -> PodPolicy:
        """Policy of a pod without annotations."""
        return cls(gpu_policy=GpuPolicy.parse(gpu_policy), node_policy=node_policy)

    @classmethod
    def from_annotations(
        cls,
        annotations: Mapping[str, str] | None,
        default_gpu_policy: str = SPREAD,
        default_node_policy: str = BINPACK,
    ) -> PodPolicy:
        """Parse a pod's policy annotations (blank values mean "unset").

        Raises :class:`hamid.model.errors.InvalidInput` for invalid ``hami.io/device-scoring-weights``
        (the scheduler answers the filter with that error, as HAMi does) and for a
        ``nvidia.com/numa-bind`` that is not a Go boolean (HAMi silently ignores it; a clear
        error is better than scheduling without the binding the user asked for).
        """
        a = annotations or {}
        gpu = (a.get(ann.GPU_SCHEDULER_POLICY) or "").strip() or default_gpu_policy
        node = (a.get(ann.NODE_SCHEDULER_POLICY) or "").strip() or default_node_policy
        weights = ann.parse_scoring_weights(a.get(ann.DEVICE_SCORING_WEIGHTS))
        numa_bind = ann.parse_numa_bind((a.get(ann.NUMA_BIND) or "").strip() or None)
        use_uuids = ann.parse_uuid_list(a.get(ann.USE_GPU_UUID), ann.USE_GPU_UUID)
        nouse = ann.parse_uuid_list(a.get(ann.NOUSE_GPU_UUID), ann.NOUSE_GPU_UUID)
        use_types = ann.parse_type_list(a.get(ann.USE_GPU_TYPE), ann.USE_GPU_TYPE)
        nouse_types = ann.parse_type_list(a.get(ann.NOUSE_GPU_TYPE), ann.NOUSE_GPU_TYPE)
        mode = (a.get(ann.VGPU_MODE) or "").strip() or None
        return cls(
            gpu_policy=GpuPolicy.parse(gpu),
            node_policy=node,
            weights=weights,
            numa_bind=numa_bind,
            use_uuids=None if use_uuids is None else frozenset(use_uuids),
            nouse_uuids=frozenset(nouse or ()),
            use_types=None if use_types is None else tuple(t.upper() for t in use_types),
            nouse_types=tuple(t.upper() for t in nouse_types or ()),
            vgpu_mode=mode,
        )

    def type_allowed(self, device_type: str) -> bool:
        """``use-gputype``/``nouse-gputype``: case-insensitive substring rules."""
        upper = device_type.upper()
        if self.use_types is not None and not any(t in upper for t in self.use_types):
            return False
        return not any(t in upper for t in self.nouse_types)

    def uuid_allowed(self, uuid: str) -> bool:
        """``use-gpuuuid``/``nouse-gpuuuid``."""
        if self.use_uuids is not None and uuid not in self.use_uuids:
            return False
        return uuid not in self.nouse_uuids
