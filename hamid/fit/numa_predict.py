"""Predict the NUMA node(s) kubelet's Topology Manager will pick for each container of a pod.

Pure (no I/O). Written from kubelet's behaviour (``pkg/kubelet/cm/topologymanager``, ``cpumanager``
static policy, ``devicemanager`` topology hints) — never from the simulator, which is the oracle it
is judged against. Input: the node's :class:`NumaProfile`, its per-NUMA :class:`NumaLedger` (free
exclusive CPUs, free device replicas) and the pod. Output: a :class:`Prediction` that is
``placed`` (per container the NUMA node(s), exclusive CPUs and device counts kubelet will assign),
``reject`` (kubelet's admission reason) or ``unknown`` with the reason — never a guess.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import math
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from hamid.fit.numa_memory import (
    MemoryLedger,
    MemoryPinError,
    Reusable,
    memory_requests,
    update_reusable,
)
from hamid.model._wire import want_object
from hamid.model.devices import PodDevices
from hamid.model.errors import InvalidInput
from hamid.model.numa import (
    CPU_OPTION_ALIGN_BY_UNCORE_CACHE,
    CPU_OPTION_DISTRIBUTE_ACROSS_CORES,
    CPU_OPTION_DISTRIBUTE_ACROSS_NUMA,
    CPU_OPTION_FULL_PCPUS_ONLY,
    CPU_OPTION_STRICT_RESERVATION,
    DEFAULT_MAX_ALLOWABLE_NUMA_NODES,
    NO_TOPOLOGY,
    SINGLE_NUMA_NODE,
    TM_OPTION_MAX_NUMA_NODES,
    TM_OPTION_PREFER_CLOSEST,
    ContainerPlacement,
    ContainerPrediction,
    CpuInfo,
    KubeletPolicies,
    MemoryBlock,
    NumaProfile,
    PodPrediction,
)
from hamid.model.preferred import preferred_answer
from hamid.model.quantity import parse_quantity
from hamid.model.resources import is_sidecar

#: A profile not confirmed by the node agent for this long is stale (it re-stamps far more often).
DEFAULT_PROFILE_MAX_AGE_S = 30 * 60
#: Bound on merged hint permutations for the non-single-numa policies (kubelet enumerates them all).
MAX_PERMUTATIONS = 200_000
#: Bound on the admissions replayed, one per device split the plugin may choose.
MAX_SPLIT_REPLAYS = 64

TOPOLOGY_AFFINITY_ERROR = "TopologyAffinityError"
SMT_ALIGNMENT_ERROR = "SMTAlignmentError"
UNEXPECTED_ADMISSION_ERROR = "UnexpectedAdmissionError"
UNKNOWN_PROFILE_MISSING = "profile-missing"
UNKNOWN_PROFILE_STALE = "profile-stale"
UNKNOWN_UNMODELLED = "unmodelled"

_MODELLED_TM_OPTIONS = frozenset({TM_OPTION_PREFER_CLOSEST, TM_OPTION_MAX_NUMA_NODES})
_MODELLED_CPU_OPTIONS = frozenset(
    {
        CPU_OPTION_FULL_PCPUS_ONLY,
        CPU_OPTION_STRICT_RESERVATION,
        CPU_OPTION_DISTRIBUTE_ACROSS_CORES,
        CPU_OPTION_ALIGN_BY_UNCORE_CACHE,
        CPU_OPTION_DISTRIBUTE_ACROSS_NUMA,
    }
)


#: Pairs of CPU manager options kubelet refuses to start with (``NewStaticPolicyOptions``).
_EXCLUSIVE_CPU_OPTIONS = (
    (CPU_OPTION_FULL_PCPUS_ONLY, CPU_OPTION_DISTRIBUTE_ACROSS_CORES),
    (CPU_OPTION_DISTRIBUTE_ACROSS_NUMA, CPU_OPTION_DISTRIBUTE_ACROSS_CORES),
    (CPU_OPTION_ALIGN_BY_UNCORE_CACHE, CPU_OPTION_DISTRIBUTE_ACROSS_CORES),
    (CPU_OPTION_ALIGN_BY_UNCORE_CACHE, CPU_OPTION_DISTRIBUTE_ACROSS_NUMA),
)


class Outcome(enum.StrEnum):
    """What kubelet will do with the pod."""

    PLACED = "placed"
    REJECT = "reject"
    UNKNOWN = "unknown"


# ==========================================================================================
# Per-NUMA ledger
# ==========================================================================================


@dataclass(frozen=True, slots=True)
class NumaUsage:
    """What one pod takes from a node's ledger: exclusive CPUs and device replicas per NUMA bucket."""

    cpus: frozenset[int] = frozenset()
    devices: Mapping[str, Mapping[int, int]] = field(default_factory=dict)
    #: The Static memory manager's blocks, container by container.
    memory: tuple[MemoryBlock, ...] = ()

    def plus(self, other: NumaUsage) -> NumaUsage:
        """Both usages together (a placement and what its pod's unlisted containers keep beside it)."""
        devices = {r: dict(per) for r, per in self.devices.items()}
        for r, per in other.devices.items():
            into = devices.setdefault(r, {})
            for n, k in per.items():
                into[n] = into.get(n, 0) + k
        return NumaUsage(self.cpus | other.cpus, devices, self.memory + other.memory)

    def only(self, resources: frozenset[str]) -> NumaUsage:
        """The usage with the devices of ``resources`` only: a ledger that keeps no other resource
        (the scheduler's keeps its GPUs) books the rest of a pod's placement all the same."""
        if self.devices.keys() <= resources:
            return self
        devices = {r: per for r, per in self.devices.items() if r in resources}
        return NumaUsage(self.cpus, devices, self.memory)


class NumaLedger:
    """Free exclusive CPUs and free device replicas per NUMA node of one node.

    ``devices[resource][numa] = (total, free)``: total counts every device of the resource (kubelet
    sizes hints with it), free the healthy unallocated ones. It must list every device-plugin
    resource of the node (PodResources ``GetAllocatableResources`` does); a resource it does not list
    is not a device-plugin resource for the predictor. :meth:`apply` and :meth:`release` validate
    first and change nothing when they raise.
    """

    __slots__ = ("_devices", "_free_cpus", "generation", "memory")

    def __init__(
        self,
        generation: int,
        free_cpus: Iterable[int],
        devices: Mapping[str, Mapping[int, tuple[int, int]]],
        memory: MemoryLedger | None = None,
    ) -> None:
        """A ledger for profile ``generation`` (``memory``: the Static memory manager's state)."""
        self.generation = generation
        self.memory = memory
        # immutable, so ledgers (and their copies) in the same state share one set
        self._free_cpus = free_cpus if isinstance(free_cpus, frozenset) else frozenset(free_cpus)
        self._devices: dict[str, dict[int, list[int]]] = {}
        for res, per_numa in devices.items():
            self._devices[res] = {}
            for numa, (total, free) in per_numa.items():
                if not 0 <= free <= total:
                    raise InvalidInput(f"ledger {res} NUMA {numa}: free {free} not within 0..{total}")
                self._devices[res][numa] = [total, free]

    @classmethod
    def for_profile(cls, profile: NumaProfile, device_totals: Mapping[str, Mapping[int, int]]) -> NumaLedger:
        """An empty node: every assignable CPU (all minus reserved) and every replica free."""
        for res, per_numa in device_totals.items():
            unknown = [n for n in per_numa if n != NO_TOPOLOGY and n not in profile.numa_nodes]
            if unknown:
                raise InvalidInput(f"ledger {res}: NUMA node {unknown[0]} is not in the profile")
        return cls(
            profile.generation,
            profile.all_cpus - profile.reserved_cpus,
            {res: {n: (t, t) for n, t in per_numa.items()} for res, per_numa in device_totals.items()},
            MemoryLedger.for_profile(profile),
        )

    def copy(self) -> NumaLedger:
        """An independent copy."""
        return NumaLedger(
            self.generation,
            self._free_cpus,
            {res: {n: (t, f) for n, (t, f) in per.items()} for res, per in self._devices.items()},
            None if self.memory is None else self.memory.copy(),
        )

    @property
    def free_cpus(self) -> frozenset[int]:
        """Free exclusive-assignable CPUs (reserved CPUs are never in it)."""
        return self._free_cpus

    @property
    def resources(self) -> frozenset[str]:
        """The device-plugin resources of the node."""
        return frozenset(self._devices)

    def hiding(
        self, resource: str, hidden: Mapping[int, int], omitted: Mapping[int, int] | None = None
    ) -> NumaLedger:
        """The ledger as kubelet sees it when ``hidden`` free replicas of ``resource`` per NUMA bucket
        are reported Unhealthy (a GPU with no room, :mod:`hamid.fit.replica_room`): a copy with
        that many fewer free (totals unchanged: kubelet sizes hints with every device); ``self``
        when nothing is hidden."""
        if not any(hidden.values()) and not (omitted and any(omitted.values())):
            return self
        ledger = self.copy()
        for numa, n in hidden.items():
            counts = ledger._devices.get(resource, {}).get(numa)
            if counts is not None:
                counts[1] = max(counts[1] - n, 0)
        for numa, n in (omitted or {}).items():
            counts = ledger._devices.get(resource, {}).get(numa)
            if counts is not None:
                counts[0] = max(counts[0] - n, 0)
                counts[1] = max(counts[1] - n, 0)
        return ledger

    def fitting(self, usage: NumaUsage) -> NumaUsage:
        """The part of ``usage`` that is free now: a guess booked beside the truth (what a pod's
        unlisted containers keep) never displaces what an observed placement books."""
        devices: dict[str, dict[int, int]] = {}
        for res, per_numa in usage.devices.items():
            for numa, n in per_numa.items():
                k = min(n, self._devices.get(res, {}).get(numa, [0, 0])[1])
                if k > 0:
                    devices.setdefault(res, {})[numa] = k
        memory = self.memory.fitting(usage.memory) if self.memory is not None else ()
        return NumaUsage(usage.cpus & self._free_cpus, devices, memory)

    def device_counts(self, resource: str) -> dict[int, tuple[int, int]]:
        """``{numa: (total, free)}`` of one resource (empty when the node has none)."""
        return {n: (t, f) for n, (t, f) in self._devices.get(resource, {}).items()}

    def apply(self, usage: NumaUsage) -> None:
        """Book a pod's usage; InvalidInput (and no change) if a CPU is not free or replicas lack."""
        taken = usage.cpus - self._free_cpus
        if taken:
            raise InvalidInput(f"ledger: CPU {min(taken)} is not free")
        self._check_devices(usage, lambda total, free, n: n <= free, "free")
        memory = self._memory_for(usage)
        if memory is not None:
            memory.apply(usage.memory)
        if usage.cpus:
            self._free_cpus -= usage.cpus
        self._shift(usage, -1)

    def release(self, usage: NumaUsage) -> None:
        """Return a pod's usage; InvalidInput (and no change) if it was not booked."""
        free = usage.cpus & self._free_cpus
        if free:
            raise InvalidInput(f"ledger: CPU {min(free)} is already free")
        self._check_devices(usage, lambda total, free_, n: free_ + n <= total, "in use")
        memory = self._memory_for(usage)
        if memory is not None:
            memory.release(usage.memory)
        if usage.cpus:
            self._free_cpus |= usage.cpus
        self._shift(usage, 1)

    def _memory_for(self, usage: NumaUsage) -> MemoryLedger | None:
        """The memory state a usage with memory blocks books on (InvalidInput when the node has none)."""
        if not usage.memory:
            return None
        if self.memory is None:
            raise InvalidInput("ledger: memory blocks on a node without the Static memory manager's state")
        return self.memory

    def _check_devices(self, usage: NumaUsage, ok: Any, what: str) -> None:
        for res, per_numa in usage.devices.items():
            for numa, n in per_numa.items():
                total, free = self._devices.get(res, {}).get(numa, [0, 0])
                if n < 0 or not ok(total, free, n):
                    raise InvalidInput(f"ledger: {n} {res} on NUMA {numa} are not {what}")

    def _shift(self, usage: NumaUsage, sign: int) -> None:
        for res, per_numa in usage.devices.items():
            for numa, n in per_numa.items():
                self._devices[res][numa][1] += sign * n


@dataclass(frozen=True, slots=True)
class PluginView:
    """hamid's device plugin on the node, so the predictor can replay its ``GetPreferredAllocation``.

    ``resource`` is the resource it serves (with ``GetPreferredAllocation`` offered to kubelet),
    ``gpus`` each GPU's NUMA bucket and free replicas, ``annotated`` per container (init first) the
    GPUs the scheduler annotated — the plugin prefers a replica of each (:mod:`hamid.model.preferred`).
    """

    resource: str
    gpus: Mapping[str, tuple[int, int]]
    annotated: PodDevices


#: Separates a GPU UUID from a replica number in the replica IDs the predictor replays with.
_REPLICA_SEP = "\x00"


def _gpu_of_replica(replica: str) -> str:
    return replica.split(_REPLICA_SEP, 1)[0]


# ==========================================================================================
# CPU topology as kubelet's CPU manager sees it
# ==========================================================================================


class CpuTopology:
    """kubelet's ``CPUTopology`` of a profile: CPUs by core, socket, NUMA node and uncore cache
    (a profile without uncore caches: kubelet's fallback, the socket)."""

    def __init__(self, profile: NumaProfile) -> None:
        """Index the profile's CPUs."""
        self.numa_of = {c.cpu: c.numa for c in profile.cpus}
        self.socket_of = {c.cpu: c.socket for c in profile.cpus}
        self.core_of = {c.cpu: c.core for c in profile.cpus}
        self.uncore_of = {c.cpu: c.socket if c.uncore is None else c.uncore for c in profile.cpus}
        self.cpus_of_numa = _group(self.numa_of)
        self.cpus_of_socket = _group(self.socket_of)
        self.cpus_of_core = _group(self.core_of)
        self.cpus_of_uncore = _group(self.uncore_of)
        n_cpus = len(self.numa_of)
        self.cpus_per_core = n_cpus // len(self.cpus_of_core)
        self.cpus_per_socket = n_cpus // len(self.cpus_of_socket)
        self.numa_first = len(self.cpus_of_socket) >= len(self.cpus_of_numa)
        self.reserved = profile.reserved_cpus
        self.reserved_physical = frozenset(
            cpu for r in profile.reserved_cpus for cpu in self.cpus_of_core[self.core_of[r]]
        )


_TOPOLOGIES: OrderedDict[int, tuple[tuple[CpuInfo, ...], frozenset[int], CpuTopology]] = OrderedDict()
_TOPOLOGY_MEMO_SIZE = 4096  # more than the nodes of a large cluster


def topology_of(profile: NumaProfile) -> CpuTopology:
    """The profile's :class:`CpuTopology`, memoised per CPU list object (immutable; decoded profiles of
    one kind of node share theirs, so all their nodes share one topology)."""
    hit = _TOPOLOGIES.get(id(profile.cpus))
    if hit is not None and hit[0] is profile.cpus and hit[1] is profile.reserved_cpus:
        _TOPOLOGIES.move_to_end(id(profile.cpus))
        return hit[2]
    topo = CpuTopology(profile)
    _TOPOLOGIES[id(profile.cpus)] = (profile.cpus, profile.reserved_cpus, topo)
    while len(_TOPOLOGIES) > _TOPOLOGY_MEMO_SIZE:
        _TOPOLOGIES.popitem(last=False)
    return topo


def _group(owner: Mapping[int, int]) -> dict[int, frozenset[int]]:
    out: dict[int, set[int]] = {}
    for cpu, key in owner.items():
        out.setdefault(key, set()).add(cpu)
    return {k: frozenset(v) for k, v in sorted(out.items())}


class _Accumulator:
    """kubelet's ``cpuAccumulator`` for ``takeByTopologyNUMAPacked``."""

    def __init__(self, topo: CpuTopology, available: Iterable[int], count: int) -> None:
        self.topo = topo
        self.free = {c for c in available if c in topo.numa_of}
        self.result: set[int] = set()
        self.needed = count

    def take(self, cpus: Iterable[int]) -> None:
        cpus = set(cpus)
        self.result |= cpus
        self.free -= cpus
        self.needed -= len(cpus)

    def _free_in(self, groups: Mapping[int, frozenset[int]], key: int) -> int:
        return len(groups[key] & self.free)

    def _sorted(self, groups: Mapping[int, frozenset[int]], keys: Iterable[int]) -> list[int]:
        return sorted(keys, key=lambda k: (self._free_in(groups, k), k))

    def _present(self, owner: Mapping[int, int], within: frozenset[int] | None = None) -> set[int]:
        cpus = self.free if within is None else self.free & within
        return {owner[c] for c in cpus}

    def numa_nodes(self) -> list[int]:
        t = self.topo
        if t.numa_first:
            return self._sorted(t.cpus_of_numa, self._present(t.numa_of))
        return [
            n
            for s in self.sockets()
            for n in self._sorted(t.cpus_of_numa, self._present(t.numa_of, t.cpus_of_socket[s]))
        ]

    def sockets(self) -> list[int]:
        t = self.topo
        if not t.numa_first:
            return self._sorted(t.cpus_of_socket, self._present(t.socket_of))
        return [
            s
            for n in self.numa_nodes()
            for s in self._sorted(t.cpus_of_socket, self._present(t.socket_of, t.cpus_of_numa[n]))
        ]

    def cores(self) -> list[int]:
        t = self.topo
        parents, groups = (
            (self.sockets(), t.cpus_of_socket) if t.numa_first else (self.numa_nodes(), t.cpus_of_numa)
        )
        return [c for p in parents for c in self._sorted(t.cpus_of_core, self._present(t.core_of, groups[p]))]

    def uncore_caches(self) -> list[int]:
        """``sortAvailableUncoreCaches``: NUMA node by NUMA node (in their order), each one's caches
        with free CPUs by fewest free CPUs, then id."""
        t = self.topo
        return [
            u
            for n in self.numa_nodes()
            for u in self._sorted(t.cpus_of_uncore, self._present(t.uncore_of, t.cpus_of_numa[n]))
        ]

    def take_uncore_caches(self) -> None:
        """``takeUncoreCache``: whole free caches while the request needs one, then the first cache
        whose lowest free cores hold exactly the rest (the order is taken once, before any pick)."""
        order = self.uncore_caches()
        for u in order:
            cpus = self.topo.cpus_of_uncore[u]
            if cpus <= self.free and self.needed >= len(cpus):
                self.take(cpus)
        for u in order:
            if self.needed < 1:
                return
            self.take_partial_uncore(u)

    def take_partial_uncore(self, uncore: int) -> None:
        """``takePartialUncore``: the free CPUs of the cache's lowest ``ceil(needed / threads per
        core)`` cores with free CPUs, one thread fewer for an odd rest on SMT, if exactly enough."""
        t = self.topo
        in_cache = self.free & t.cpus_of_uncore[uncore]
        cores = sorted({t.core_of[c] for c in in_cache})[: -(-self.needed // t.cpus_per_core)]
        cpus = sorted(c for c in in_cache if t.core_of[c] in cores)
        if self.needed % 2 and t.cpus_per_core > 1 and len(cpus) > self.needed:
            cpus = cpus[:-1]
        if len(cpus) == self.needed:
            self.take(cpus)

    def take_full(self, ids: list[int], groups: Mapping[int, frozenset[int]], whole: Any) -> None:
        for key in [k for k in ids if self._free_in(groups, k) == whole(k)]:
            if self.needed >= len(groups[key]):
                self.take(groups[key])

    def take_remaining(self, spread: bool) -> None:
        """Single threads: core by core (packed), or socket by socket in CPU id order (spread)."""
        t = self.topo
        if spread:
            order = [c for s in self.sockets() for c in sorted(t.cpus_of_socket[s] & self.free)]
        else:
            order = [c for core in self.cores() for c in sorted(t.cpus_of_core[core] & self.free)]
        for cpu in order:
            self.take({cpu})
            if self.needed < 1:
                return


@dataclass(frozen=True, slots=True)
class Packing:
    """The CPU manager options that change how the static policy takes CPUs (``takeByTopology``)."""

    #: ``distribute-cpus-across-cores`` (sorting strategy spread): no whole cores, threads spread.
    spread: bool = False
    #: ``prefer-align-cpus-by-uncorecache``: whole uncore caches, then one holding the rest, before cores.
    uncore: bool = False
    #: ``distribute-cpus-across-numa``: CPUs spread evenly over NUMA nodes in groups of this size
    #: (the threads per core with ``full-pcpus-only``, else 1); 0 when off.
    numa_group: int = 0

    @classmethod
    def of(cls, policies: KubeletPolicies, cpus_per_core: int) -> Packing:
        """The packing kubelet's static policy uses with these options."""
        options = policies.cpu_manager_options
        distribute = policies.option_enabled(options, CPU_OPTION_DISTRIBUTE_ACROSS_NUMA)
        full_pcpus = policies.option_enabled(options, CPU_OPTION_FULL_PCPUS_ONLY)
        return cls(
            spread=policies.option_enabled(options, CPU_OPTION_DISTRIBUTE_ACROSS_CORES),
            uncore=policies.option_enabled(options, CPU_OPTION_ALIGN_BY_UNCORE_CACHE),
            numa_group=(cpus_per_core if full_pcpus else 1) if distribute else 0,
        )


def take_cpus(
    topo: CpuTopology, available: Iterable[int], count: int, packing: Packing
) -> frozenset[int] | None:
    """``takeByTopology``: distributed over NUMA nodes with that option, else packed."""
    if packing.numa_group:
        return take_by_topology_distributed(topo, available, count, packing.numa_group)
    return take_by_topology_packed(topo, available, count, packing)


def take_by_topology_packed(
    topo: CpuTopology, available: Iterable[int], count: int, packing: Packing = Packing()
) -> frozenset[int] | None:
    """The CPUs kubelet's packed allocator takes: whole NUMA nodes/sockets, (uncore caches,) whole
    cores, then threads. ``None`` when kubelet would fail ("not enough cpus available" / "failed
    to allocate cpus")."""
    acc = _Accumulator(topo, available, count)
    if acc.needed < 1:
        return frozenset()
    if acc.needed > len(acc.free):
        return None
    t = topo
    numa = (acc.numa_nodes, t.cpus_of_numa, lambda k: len(t.cpus_of_numa[k]))
    socket = (acc.sockets, t.cpus_of_socket, lambda _k: t.cpus_per_socket)
    for order, groups, whole in (numa, socket) if t.numa_first else (socket, numa):
        acc.take_full(order(), groups, whole)
        if acc.needed < 1:
            return frozenset(acc.result)
    if packing.uncore:
        acc.take_uncore_caches()
        if acc.needed < 1:
            return frozenset(acc.result)
    if not packing.spread:
        acc.take_full(acc.cores(), t.cpus_of_core, lambda _k: t.cpus_per_core)
        if acc.needed < 1:
            return frozenset(acc.result)
    acc.take_remaining(packing.spread)
    return frozenset(acc.result) if acc.needed < 1 else None


def take_by_topology_distributed(
    topo: CpuTopology, available: Iterable[int], count: int, group: int
) -> frozenset[int] | None:
    """``takeByTopologyNUMADistributed`` (KEP-2902): ``count`` CPUs in groups of ``group`` spread
    evenly over the fewest NUMA nodes that can hold them, choosing the combination (and the nodes
    of any remainder) that leaves the free CPUs per NUMA node most balanced; packed when ``count``
    is not a multiple of ``group`` or no combination balances."""
    if count % group:
        return take_by_topology_packed(topo, available, count)
    free = {c for c in available if c in topo.numa_of}
    if count < 1:
        return frozenset()
    if count > len(free):
        return None
    numas = _Accumulator(topo, free, count).numa_nodes()
    free_in = {n: len(free & topo.cpus_of_numa[n]) for n in numas}
    low, high = _numa_range(topo, len(numas), count, group)
    for k in range(low, high + 1):
        best: tuple[Fraction, tuple[int, ...], tuple[int, ...]] | None = None
        for combo in itertools.combinations(numas, k):
            scored = _distribution_balance(free_in, combo, count, group)
            if scored is not None and (best is None or scored[0] < best[0]):
                best = (scored[0], scored[1], combo)
            if best is not None and best[0] == 0:
                break
        if best is not None:
            return _take_distributed(topo, free, count, group, best[2], best[1])
    return take_by_topology_packed(topo, free, count)


def _numa_range(topo: CpuTopology, free_numa: int, count: int, group: int) -> tuple[int, int]:
    """``rangeNUMANodesNeededToSatisfy``: the fewest NUMA nodes from the CPU groups per NUMA node of
    the whole machine, the most bounded by the NUMA nodes with free CPUs."""
    groups_per_numa = math.ceil(math.ceil(len(topo.numa_of) / group) / len(topo.cpus_of_numa))
    groups_needed = math.ceil(count / group)
    return math.ceil(groups_needed / groups_per_numa), min(groups_needed, free_numa)


def _variance(values: Iterable[int]) -> Fraction:
    """Orders balances as kubelet's standard deviation does (exactly)."""
    items = list(values)
    mean = Fraction(sum(items), len(items))
    return sum(((v - mean) ** 2 for v in items), Fraction(0)) / len(items)


def _stripe(after: Mapping[int, int], nodes: Sequence[int], remainder: int, group: int) -> dict[int, int]:
    """The free CPUs per NUMA node once ``remainder`` CPUs are taken ``group`` by ``group`` from
    ``nodes`` in turn (skipping nodes with fewer than ``group`` left)."""
    left = dict(after)
    while remainder > 0:
        before = remainder
        for n in nodes:
            if remainder == 0:
                break
            if left[n] >= group:
                left[n] -= group
                remainder -= group
        if remainder == before:
            break  # no node can give a group any more
    return left


def _distribution_balance(
    free_in: Mapping[int, int], combo: Sequence[int], count: int, group: int
) -> tuple[Fraction, tuple[int, ...]] | None:
    """The best balance of one NUMA combination and the nodes its remainder comes from; None when
    it cannot hold ``count`` CPUs evenly in groups."""
    if sum(free_in[n] for n in combo) < count or sum(free_in[n] // group for n in combo) * group < count:
        return None
    share = count // len(combo) // group * group
    if any(free_in[n] < share for n in combo):
        return None
    after = {n: free_in[n] - (share if n in combo else 0) for n in free_in}
    remainder = count - share * len(combo)
    if remainder == 0:
        return _variance(after.values()), ()
    candidates = [n for n in combo if after[n] >= group]
    best: tuple[Fraction, tuple[int, ...]] | None = None
    for size in range(len(candidates), 0, -1):
        for subset in itertools.combinations(candidates, size):
            if sum(after[n] for n in subset) < remainder:
                continue
            balance = _variance(_stripe(after, subset, remainder, group).values())
            if best is None or balance < best[0]:
                best = (balance, subset)
    return best


def _take_distributed(
    topo: CpuTopology, free: set[int], count: int, group: int, combo: Sequence[int], rest: Sequence[int]
) -> frozenset[int] | None:
    """The even share from each node of ``combo`` (packed within it), then the remainder group by
    group from the nodes of ``rest`` in turn."""
    share = count // len(combo) // group * group
    taken: set[int] = set()
    for n in combo:
        taken |= take_by_topology_packed(topo, (free - taken) & topo.cpus_of_numa[n], share) or set()
    remainder = count - share * len(combo)
    while remainder > 0:
        before = remainder
        for n in rest:
            cpus = (free - taken) & topo.cpus_of_numa[n]
            if remainder == 0 or len(cpus) < group:
                continue
            taken |= take_by_topology_packed(topo, cpus, group) or set()
            remainder -= group
        if remainder == before:
            return None
    return frozenset(taken) if len(taken) == count else None


# ==========================================================================================
# Topology hints and their merge (topologymanager policy.go, policy_*.go)
# ==========================================================================================


@dataclass(frozen=True, slots=True)
class Hint:
    """kubelet's ``TopologyHint``: a NUMA bitmask (``None`` = any node) and whether it is preferred."""

    mask: int | None
    preferred: bool


DONT_CARE = Hint(None, True)
CANNOT = Hint(None, False)


def mask_of(nodes: Iterable[int]) -> int:
    """The bitmask of NUMA ids (bit n = node n)."""
    return sum(1 << n for n in set(nodes))


def nodes_of(mask: int) -> frozenset[int]:
    """The NUMA ids of a bitmask."""
    return frozenset(i for i in range(mask.bit_length()) if mask >> i & 1)


def iterate_masks(nodes: Sequence[int], max_size: int | None = None) -> Iterator[int]:
    """``bitmask.IterateBitMasks``: every non-empty subset, by size, in combination order."""
    for size in range(1, (len(nodes) if max_size is None else max_size) + 1):
        for combo in itertools.combinations(nodes, size):
            yield mask_of(combo)


def is_narrower(a: int, b: int) -> bool:
    """``IsNarrowerThan``: fewer nodes; as many nodes and a numerically smaller mask."""
    ca, cb = a.bit_count(), b.bit_count()
    return a < b if ca == cb else ca < cb


def generate_hints(
    nodes: Sequence[int],
    totals: Mapping[int, int],
    free: Mapping[int, int],
    reusable: Mapping[int, int],
    request: int,
    single_only: bool,
) -> list[Hint]:
    """The hint scheme the CPU and device managers share.

    A mask is a hint when every reusable item lies inside it and reusable + free items inside it
    cover the request; preferred when its size is the smallest whose *total* items cover the request.
    With ``single_only`` (policy ``single-numa-node``, which drops every other hint) only
    single-node masks are generated; the preference is computed exactly the same.
    """
    reuse_mask = mask_of(n for n, k in reusable.items() if k > 0)
    reused = sum(reusable.values())
    min_size = len(nodes)
    hints: list[Hint] = []
    for mask in iterate_masks(nodes, 1 if single_only else None):
        members = nodes_of(mask)
        if sum(totals.get(n, 0) for n in members) >= request:
            min_size = min(min_size, len(members))
        if reuse_mask & ~mask:
            continue
        if reused + sum(free.get(n, 0) for n in members) >= request:
            hints.append(Hint(mask, False))
    if single_only and min_size > 1:
        return hints  # no single node can ever hold the request: none of them is preferred
    return [Hint(h.mask, (h.mask or 0).bit_count() == min_size) for h in hints]


class _Merger:
    """kubelet's ``HintMerger``: the best merged hint over every permutation of provider hints."""

    def __init__(self, profile: NumaProfile, hints: list[list[Hint]], closest: bool) -> None:
        self.default = mask_of(profile.numa_nodes)
        self.hints = hints
        self.profile = profile
        self.closest = closest
        counts = [
            min((h.mask for h in hs if h.mask is not None), key=_narrow_key, default=None) for hs in hints
        ]
        self.best_non_preferred = max((m.bit_count() for m in counts if m is not None), default=0)

    def _average_distance(self, mask: int) -> Fraction:
        members = sorted(nodes_of(mask))
        total = sum(self.profile.distance(a, b) or 0 for a in members for b in members)
        return Fraction(total, len(members) ** 2)

    def _fitter(self, current: Hint, candidate: Hint) -> Hint:
        cur, cand = current.mask or 0, candidate.mask or 0
        if cur == cand:
            return current
        if self.closest and cur.bit_count() == cand.bit_count():
            dc, dd = self._average_distance(cur), self._average_distance(cand)
            if dc != dd:
                return current if dc < dd else candidate
            return current if cur < cand else candidate
        return current if is_narrower(cur, cand) else candidate

    def _compare(self, current: Hint | None, candidate: Hint) -> Hint | None:
        cand = (candidate.mask or 0).bit_count()
        if cand == 0:
            return current
        if current is None:
            return candidate
        if current.preferred != candidate.preferred:
            return current if current.preferred else candidate
        if current.preferred:
            return self._fitter(current, candidate)
        cur, best = (current.mask or 0).bit_count(), self.best_non_preferred
        if cur > best:
            return self._fitter(current, candidate)
        if cur == best:
            return self._fitter(current, candidate) if cand == best else current
        if cand > best:
            return current
        if cand == best or cand > cur:
            return candidate
        return current if cand < cur else self._fitter(current, candidate)

    def merge(self) -> Hint:
        best: Hint | None = None
        for permutation in itertools.product(*self.hints):
            best = self._compare(best, _merge_permutation(self.default, permutation))
        return best if best is not None else Hint(self.default, False)


def _narrow_key(mask: int) -> tuple[int, int]:
    return (mask.bit_count(), mask)


def _merge_permutation(default: int, permutation: Sequence[Hint]) -> Hint:
    masks = [h.mask for h in permutation if h.mask is not None]
    preferred = all(h.preferred for h in permutation) and all(m == masks[0] for m in masks)
    merged = default
    for m in masks:
        merged &= m
    return Hint(merged, preferred)


def merge_hints(profile: NumaProfile, providers: Sequence[list[Hint]]) -> tuple[Hint, bool] | None:
    """The Topology Manager's ``Merge`` for the profile's policy: ``(best hint, admit)``.

    ``providers`` is one (already normalised) hint list per provider resource. ``None`` when the
    permutations are too many to enumerate (only possible off ``single-numa-node``).
    """
    policies = profile.policies
    policy = policies.topology_manager_policy
    lists = [list(hs) for hs in providers]
    if policy == SINGLE_NUMA_NODE:
        lists = [
            [h for h in hs if h.preferred and (h.mask is None or h.mask.bit_count() == 1)] for hs in lists
        ]
    elif math.prod(len(hs) for hs in lists) > MAX_PERMUTATIONS:
        return None
    closest = policy != SINGLE_NUMA_NODE and policies.option_enabled(
        policies.topology_manager_options, TM_OPTION_PREFER_CLOSEST
    )
    best = _Merger(profile, lists, closest).merge()
    if policy == SINGLE_NUMA_NODE:
        if best.mask == mask_of(profile.numa_nodes):
            best = Hint(None, best.preferred)
        return best, best.preferred
    return best, not policies.rejects_unpreferred or best.preferred


# ==========================================================================================
# The pod as kubelet's managers read it
# ==========================================================================================

_QOS_RESOURCES = ("cpu", "memory")


@dataclass(frozen=True, slots=True)
class _Container:
    name: str
    kind: str  # "init", "sidecar" or "app"
    requests: Mapping[str, Fraction]  # after the API server's defaulting (requests default to limits)
    limits: Mapping[str, Fraction]
    index: int  # init containers first, as the annotations count them


def _containers(pod: Mapping[str, Any]) -> list[_Container]:
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        raise InvalidInput("pod: no spec")
    out: list[_Container] = []
    for section in ("initContainers", "containers"):
        listed = spec.get(section)
        listed = [] if listed is None else listed
        if not isinstance(listed, list):
            raise InvalidInput(f"pod spec.{section}: want an array")
        for i, c in enumerate(listed):
            where = f"pod {section}[{i}]"
            if not isinstance(c, Mapping) or not isinstance(c.get("name"), str):
                raise InvalidInput(f"{where}: not a container")
            res = _object_or_empty(c.get("resources"), f"{where} resources")
            raw_limits = _object_or_empty(res.get("limits"), f"{where} limits")
            raw_requests = _object_or_empty(res.get("requests"), f"{where} requests")
            limits = {k: parse_quantity(v, f"{where} limits.{k}") for k, v in raw_limits.items()}
            requests = dict(limits)
            requests.update({k: parse_quantity(v, f"{where} requests.{k}") for k, v in raw_requests.items()})
            kind = "app" if section == "containers" else ("sidecar" if is_sidecar(c) else "init")
            out.append(_Container(c["name"], kind, requests, limits, len(out)))
    return out


def _object_or_empty(value: object, where: str) -> Mapping[str, Any]:
    return {} if value is None else want_object(value, where)


def pod_qos(pod: Mapping[str, Any], containers: Sequence[_Container]) -> str:
    """kubelet's ``GetPodQOS``: ``status.qosClass`` when set, else computed like ``ComputePodQOS``."""
    status = pod.get("status") or {}
    if isinstance(status, Mapping) and status.get("qosClass") in ("Guaranteed", "Burstable", "BestEffort"):
        return str(status["qosClass"])
    requests: dict[str, Fraction] = {}
    limits: dict[str, Fraction] = {}
    guaranteed = True
    for c in containers:
        for name in _QOS_RESOURCES:
            if c.requests.get(name, 0) > 0:
                requests[name] = requests.get(name, Fraction(0)) + c.requests[name]
            if c.limits.get(name, 0) > 0:
                limits[name] = limits.get(name, Fraction(0)) + c.limits[name]
        if not all(c.limits.get(name, 0) > 0 for name in _QOS_RESOURCES):
            guaranteed = False
    if not requests and not limits:
        return "BestEffort"
    if guaranteed and all(limits.get(k) == v for k, v in requests.items()) and len(requests) == len(limits):
        return "Guaranteed"
    return "Burstable"


def _pod_effective(containers: Sequence[_Container], value: Callable[[_Container], int]) -> int:
    """A pod-level amount with sidecars: max(app + sidecars, any init + the sidecars before it)."""
    init_max = sidecars = 0
    for c in containers:
        if c.kind == "sidecar":
            sidecars += value(c)
            init_max = max(init_max, sidecars)
        elif c.kind == "init":
            init_max = max(init_max, sidecars + value(c))
    long_running = sidecars + sum(value(c) for c in containers if c.kind == "app")
    return max(init_max, long_running)


# ==========================================================================================
# The prediction
# ==========================================================================================


@dataclass(frozen=True, slots=True)
class Prediction:
    """The predictor's answer for one pod on one node.

    ``placed``: ``containers`` holds each container's NUMA node(s) (empty when it gets neither
    exclusive CPUs nor topology-aware devices), exclusive CPUs and device counts per NUMA bucket, and
    ``usage`` what the pod takes from the ledger. ``reject``: ``reason`` is kubelet's admission
    reason. ``unknown``: ``reason`` is ``profile-missing``, ``profile-stale`` or ``unmodelled``.
    """

    outcome: Outcome
    reason: str = ""
    message: str = ""
    containers: tuple[ContainerPrediction, ...] = ()
    usage: NumaUsage = field(default_factory=NumaUsage)
    #: ``unknown`` because a device plugin chooses among aligned replicas: per resource, the
    #: container (index, init first) and the NUMA nodes kubelet offers it from. A scheduler whose
    #: plugin that is fits the container's devices there, so the plugin's choice becomes known.
    offered: Mapping[str, Mapping[int, frozenset[int]]] = field(default_factory=dict)

    def record(self, generation: int) -> PodPrediction:
        """The ``hamid.io/numa-predicted`` record of a ``placed`` prediction."""
        if self.outcome is not Outcome.PLACED:
            raise InvalidInput(f"only a placed prediction is recorded, this one is {self.outcome}")
        return PodPrediction(generation, self.containers)


class _Stop(Exception):
    """Ends a prediction early with a reject or unknown answer."""

    def __init__(self, prediction: Prediction) -> None:
        super().__init__(prediction.message)
        self.prediction = prediction


def _unknown(reason: str, message: str) -> Prediction:
    return Prediction(Outcome.UNKNOWN, reason, message)


def _reject(reason: str, message: str) -> _Stop:
    return _Stop(Prediction(Outcome.REJECT, reason, message))


def unmodelled_reason(profile: NumaProfile) -> str | None:
    """Why the profile's kubelet configuration cannot be predicted exactly, or ``None``."""
    pol = profile.policies
    tm_opts, cpu_opts = pol.topology_manager_options, pol.cpu_manager_options
    extra = sorted(set(tm_opts) - _MODELLED_TM_OPTIONS)
    if extra:
        return f"topology manager option {extra[0]!r} is not modelled"
    try:
        closest = pol.option_enabled(tm_opts, TM_OPTION_PREFER_CLOSEST)
        limit = pol.max_allowable_numa_nodes()
        enabled = {name for name in cpu_opts if pol.option_enabled(cpu_opts, name)}
    except InvalidInput as exc:
        return f"kubelet would not start with this option value: {exc}"
    pcpus = CPU_OPTION_FULL_PCPUS_ONLY in enabled
    clash = next(((a, b) for a, b in _EXCLUSIVE_CPU_OPTIONS if {a, b} <= enabled), None)
    if clash is not None:
        return f"kubelet would not start: {clash[0]} and {clash[1]} exclude each other"
    if limit < DEFAULT_MAX_ALLOWABLE_NUMA_NODES:
        return f"kubelet would not start: {TM_OPTION_MAX_NUMA_NODES} {limit} is below the minimum 8"
    if pol.topology_manager_policy != "none" and len(profile.numa_nodes) > limit:
        return f"kubelet's topology manager refuses {len(profile.numa_nodes)} NUMA nodes (max {limit})"
    if (
        closest
        and pol.topology_manager_policy not in ("none", SINGLE_NUMA_NODE)
        and profile.distances is None
    ):
        return "prefer-closest-numa-nodes needs the NUMA distances, which the profile lacks"
    if pol.cpu_manager_policy == "static":
        extra = sorted(set(cpu_opts) - _MODELLED_CPU_OPTIONS)
        if extra:
            return f"CPU manager option {extra[0]!r} is not modelled"
        if not profile.reserved_cpus:
            return "the static CPU manager policy needs reserved CPUs; kubelet would not start"
        if CPU_OPTION_ALIGN_BY_UNCORE_CACHE in enabled and profile.cpus[0].uncore is None:
            return "prefer-align-cpus-by-uncorecache needs the uncore caches, which the profile lacks"
    elif pcpus:
        return "CPU manager options without the static policy are not modelled"
    return None


class _Admission:
    """Replays kubelet's admission of one pod against a scratch copy of the node's free resources."""

    def __init__(
        self,
        profile: NumaProfile,
        ledger: NumaLedger,
        containers: list[_Container],
        qos: str,
        splits: Sequence[dict[int, int]] = (),
        plugin: PluginView | None = None,
    ) -> None:
        self.profile = profile
        self.plugin = plugin
        #: Free replicas per GPU of the plugin's resource, and the NUMA buckets where they are not known.
        self.gpu_free = {u: f for u, (_n, f) in plugin.gpus.items()} if plugin is not None else {}
        self.gpu_unknown: set[int] = set()
        #: The plugin resource's GPUs (one entry per replica) later containers may reuse, and those
        #: the last pick took; None where which ones is not known.
        self.gpu_reusable: list[str] | None = []
        self.gpu_last: list[str] | None = []
        #: The device splits to assume, in order, where kubelet's pick is the plugin's choice.
        self.splits = list(splits)
        self.split_count = 0
        #: Per resource, per container index: the NUMA nodes kubelet offers the plugin to choose
        #: from, where it chose among aligned replicas (each resource's first such choice).
        self.offered: dict[str, dict[int, frozenset[int]]] = {}
        self.topo = topology_of(profile)
        self.containers = containers
        self.exclusive = profile.policies.cpu_manager_policy == "static" and qos == "Guaranteed"
        self.full_pcpus = profile.policies.option_enabled(
            profile.policies.cpu_manager_options, CPU_OPTION_FULL_PCPUS_ONLY
        )
        self.packing = Packing.of(profile.policies, self.topo.cpus_per_core)
        self.free_cpus = set(ledger.free_cpus)
        self.reusable_cpus: set[int] = set()
        self.resources = ledger.resources
        self.dev_total = {r: {n: t for n, (t, _f) in ledger.device_counts(r).items()} for r in self.resources}
        self.dev_free = {r: {n: f for n, (_t, f) in ledger.device_counts(r).items()} for r in self.resources}
        self.dev_reusable: dict[str, dict[int, int]] = {r: {} for r in self.resources}
        if plugin is not None:
            self._check_gpus(plugin)
        #: The Static memory manager's state (None: policy None or a pod that is not Guaranteed).
        static_memory = profile.policies.memory_manager_policy == "Static" and qos == "Guaranteed"
        self.memory = ledger.memory.copy() if static_memory and ledger.memory is not None else None
        self.memory_reusable: Reusable = {}
        self.masks = list(iterate_masks(profile.numa_nodes))

    # --- requests -------------------------------------------------------------------------

    def cpu_request(self, c: _Container) -> int:
        """``guaranteedCPUs``: a positive integer CPU request of a Guaranteed pod, else 0."""
        cpu = c.requests.get("cpu", Fraction(0))
        return int(cpu) if self.exclusive and cpu.denominator == 1 and cpu > 0 else 0

    def device_requests(self, c: _Container) -> dict[str, int]:
        return {r: math.ceil(q) for r, q in c.limits.items() if r in self.resources}

    def memory_request(self, c: _Container) -> dict[str, int]:
        """The bytes per memory type the Static memory manager pins for the container."""
        if self.memory is None:
            return {}
        try:
            return memory_requests(c.requests)
        except MemoryPinError as exc:
            raise _reject(
                UNEXPECTED_ADMISSION_ERROR, f"Allocate failed due to {exc}, which is unexpected"
            ) from exc

    def pod_memory_request(self) -> dict[str, int]:
        """``getPodRequestedResources``: per type the app containers request, the pod's effective amount."""
        names = sorted({r for c in self.containers if c.kind == "app" for r in self.memory_request(c)})

        def amount(r: str) -> Callable[[_Container], int]:
            return lambda c: self.memory_request(c).get(r, 0)

        return {r: _pod_effective(self.containers, amount(r)) for r in names}

    # --- hints ----------------------------------------------------------------------------

    def _single_only(self) -> bool:
        return self.profile.policies.topology_manager_policy == SINGLE_NUMA_NODE

    def cpu_hints(self, request: int) -> list[Hint]:
        if request == 0:
            return [DONT_CARE]
        nodes = sorted(self.topo.cpus_of_numa)
        totals = {n: len(cpus) for n, cpus in self.topo.cpus_of_numa.items()}
        free = _count_by(self.free_cpus, self.topo.numa_of)
        reusable = _count_by(self.reusable_cpus, self.topo.numa_of)
        return generate_hints(nodes, totals, free, reusable, request, self._single_only()) or [CANNOT]

    def device_hints(self, resource: str, request: int) -> list[Hint]:
        totals = {n: t for n, t in self.dev_total[resource].items() if n != NO_TOPOLOGY}
        if not any(totals.values()):
            return [DONT_CARE]
        free, reusable = self.dev_free[resource], self.dev_reusable[resource]
        if sum(free.values()) + sum(reusable.values()) < request:
            return [CANNOT]
        free_t = {n: k for n, k in free.items() if n != NO_TOPOLOGY}
        reuse_t = {n: k for n, k in reusable.items() if n != NO_TOPOLOGY}
        nodes = self.profile.numa_nodes
        return generate_hints(nodes, totals, free_t, reuse_t, request, self._single_only()) or [CANNOT]

    def memory_hints(self, request: Mapping[str, int]) -> list[list[Hint]]:
        """The memory manager's hints, one list per memory type ("no preference" without any)."""
        if self.memory is None:
            return [[DONT_CARE]]
        hints = self.memory.hints(self.masks, request, self.memory_reusable)
        return [[Hint(m, p) for m, p in hints[r]] for r in sorted(hints)] or [[DONT_CARE]]

    def affinity(
        self, cpu_request: int, device_requests: Mapping[str, int], memory: Mapping[str, int]
    ) -> Hint:
        """The Topology Manager's chosen hint for these requests; raises a reject or unknown.
        Policy none gives kubelet's empty hint (no mask, not preferred)."""
        if self.profile.policies.topology_manager_policy == "none":
            return Hint(None, False)
        providers = [self.cpu_hints(cpu_request)]
        providers += [self.device_hints(r, n) for r, n in sorted(device_requests.items())] or [[DONT_CARE]]
        providers += self.memory_hints(memory)
        merged = merge_hints(self.profile, providers)
        if merged is None:
            raise _Stop(_unknown(UNKNOWN_UNMODELLED, "too many hint permutations to replay"))
        best, admit = merged
        if not admit:
            raise _reject(TOPOLOGY_AFFINITY_ERROR, "Resources cannot be allocated with Topology locality")
        return best

    # --- allocation -----------------------------------------------------------------------

    def allocate_cpus(self, c: _Container, mask: int | None) -> frozenset[int]:
        """The static policy's ``Allocate``: aligned CPUs first (packed), the rest from anywhere."""
        n = self.cpu_request(c)
        if n == 0:
            return frozenset()
        if self.full_pcpus:
            per_core = self.topo.cpus_per_core
            if n % per_core:
                raise _reject(
                    SMT_ALIGNMENT_ERROR, f"requested {n} cpus not multiple cpus per core = {per_core}"
                )
            physical = len(self.free_cpus - self.topo.reserved_physical)
            if n > physical:
                raise _reject(
                    SMT_ALIGNMENT_ERROR, f"not enough free physical CPUs: available {physical}, requested {n}"
                )
        allocatable = self.free_cpus | self.reusable_cpus
        result: frozenset[int] = frozenset()
        if mask is not None:
            aligned = {cpu for cpu in allocatable if mask >> self.topo.numa_of[cpu] & 1}
            result = _take_or_fail(self.topo, aligned, min(n, len(aligned)), self.packing)
        if n > len(result):
            result |= _take_or_fail(self.topo, allocatable - result, n - len(result), self.packing)
        self.free_cpus -= result
        if c.kind == "init":
            self.reusable_cpus |= result
        else:
            self.reusable_cpus -= result
        return result

    def allocate_devices(self, c: _Container, mask: int | None) -> tuple[dict[str, dict[int, int]], set[int]]:
        """The device manager's ``devicesToAllocate`` per NUMA bucket; unknown when the plugin picks.

        Returns the replicas the container newly takes (replicas it reuses from an init container
        stay counted on the container that took them, so a pod's usage is the sum over containers)
        and the NUMA buckets of every replica it holds, reused ones included.
        """
        out: dict[str, dict[int, int]] = {}
        held: set[int] = set()
        for res, need in sorted(self.device_requests(c).items()):
            reusable, free = self.dev_reusable[res], self.dev_free[res]
            got = self.take_counts(reusable, need, f"which reusable {res} devices are reused")
            left = need - sum(got.values())
            if sum(free.values()) < left:
                raise _reject(
                    UNEXPECTED_ADMISSION_ERROR,
                    f"requested number of devices unavailable for {res}. Requested: {left}, "
                    f"Available: {sum(free.values())}",
                )
            has_topology = any(t for n, t in self.dev_total[res].items() if n != NO_TOPOLOGY)
            aligned = nodes_of(mask) if mask is not None and has_topology else frozenset()
            reused = self.reused_gpus(res, got, reusable)
            before = dict(self.gpu_free), set(self.gpu_unknown)
            new = self.take_new(res, c.index, free, aligned, left, reused)
            self.note_taken_gpus(before, new)
            self.track_reusable_gpus(res, c.kind, got, reusable)
            for n, k in new.items():
                free[n] -= k
            sign = 1 if c.kind == "init" else -1
            for n, k in (new if c.kind == "init" else got).items():
                reusable[n] = reusable.get(n, 0) + sign * k
            if any(new.values()):
                out[res] = {n: k for n, k in new.items() if k}
            held |= {n for part in (got, new) for n, k in part.items() if k}
        return out, held

    def reused_gpus(self, res: str, got: Mapping[int, int], reusable: Mapping[int, int]) -> list[str] | None:
        """The GPUs (one entry per replica) of the plugin's resource a container reuses: kubelet's
        must-include replicas. ``[]`` when it reuses none; None when which ones is not known."""
        if not any(got.values()):
            return []
        if self.plugin is None or res != self.plugin.resource or self.gpu_reusable is None:
            return None
        return list(self.gpu_reusable) if sum(got.values()) == sum(reusable.values()) else None

    def track_reusable_gpus(
        self, res: str, kind: str, got: Mapping[int, int], reusable: Mapping[int, int]
    ) -> None:
        """Which GPUs later containers may reuse: an init container's new ones join them, a
        container reusing all of them consumes them (some of them: which is not known)."""
        if self.plugin is None or res != self.plugin.resource or self.gpu_reusable is None:
            return
        if kind == "init":
            self.gpu_reusable = None if self.gpu_last is None else self.gpu_reusable + self.gpu_last
        elif any(got.values()):
            self.gpu_reusable = [] if sum(got.values()) == sum(reusable.values()) else None

    def note_taken_gpus(self, before: tuple[dict[str, int], set[int]], picked: Mapping[int, int]) -> None:
        """Which GPUs a pick took (``gpu_last``), from the per-GPU free replicas ``before`` it;
        None when a bucket it took from is not known per GPU."""
        free_before, unknown_before = before
        touched = {n for n, k in picked.items() if k}
        if self.gpu_unknown != unknown_before or touched & self.gpu_unknown:
            self.gpu_last = None
        else:
            self.gpu_last = [u for u, f in sorted(free_before.items()) for _ in range(f - self.gpu_free[u])]

    def take_new(
        self,
        res: str,
        index: int,
        free: Mapping[int, int],
        aligned: frozenset[int],
        need: int,
        reused: list[str] | None,
    ) -> dict[int, int]:
        """``devicesToAllocate`` after the ``reused`` devices (None: not known which): from the
        aligned buckets (the plugin choosing when they hold more than needed), else all of them and
        the rest elsewhere (the plugin choosing among the rest)."""
        inside = {n: k for n, k in free.items() if n in aligned and k > 0}
        outside = {n: k for n, k in free.items() if n not in aligned and k > 0}
        what = f"which {res} device"
        if need < sum(inside.values()):
            picked = None if reused is None else self.plugin_pick(res, index, inside, {}, need, reused)
            if picked is None:
                self.offered.setdefault(res, {index: frozenset(inside)})
                picked = self.taken(res, inside, self.take_counts(inside, need, what))
            return picked
        rest = need - sum(inside.values())
        picked = (
            None
            if reused is None or rest <= 0
            else self.plugin_pick(res, index, outside, inside, rest, reused)
        )
        self.taken(res, inside, inside)
        if picked is None:
            picked = self.taken(res, outside, self.take_counts(outside, rest, what))
        return {n: inside.get(n, 0) + picked.get(n, 0) for n in inside.keys() | picked.keys()}

    def _check_gpus(self, plugin: PluginView) -> None:
        """Buckets whose GPUs' free replicas do not add up to the ledger's are not known per GPU."""
        free = self.dev_free.get(plugin.resource, {})
        for n in free.keys() | {b for b, _f in plugin.gpus.values()}:
            if sum(f for b, f in plugin.gpus.values() if b == n) != free.get(n, 0):
                self.gpu_unknown.add(n)

    def taken(self, res: str, pool: Mapping[int, int], counts: dict[int, int]) -> dict[int, int]:
        """Note which GPUs of the plugin's resource a pick without its preference took: all of a
        bucket (then none is free), or some (then which is not known)."""
        if self.plugin is not None and res == self.plugin.resource:
            for n, k in counts.items():
                if k < pool.get(n, 0):
                    self.gpu_unknown.add(n)
            for u, (b, _f) in self.plugin.gpus.items():
                if counts.get(b, 0) and counts[b] >= pool.get(b, 0):
                    self.gpu_free[u] = 0
        return counts

    def plugin_pick(
        self,
        res: str,
        index: int,
        pool: Mapping[int, int],
        must: Mapping[int, int],
        need: int,
        reused: Sequence[str] = (),
    ) -> dict[int, int] | None:
        """hamid's ``GetPreferredAllocation`` replayed: the buckets of the ``need`` replicas kubelet
        takes from ``pool`` (after the ``reused`` GPUs' replicas and all of ``must``), or None when
        the plugin gives no definite answer (another plugin, a NUMA mismatch, no preference, GPUs
        not known)."""
        plugin = self.plugin
        if plugin is None or res != plugin.resource or index >= len(plugin.annotated):
            return None
        if (pool.keys() | must.keys()) & self.gpu_unknown:
            return None

        def replicas(buckets: Mapping[int, int]) -> list[str]:
            return [
                f"{u}{_REPLICA_SEP}{k}"
                for u, (b, _f) in sorted(plugin.gpus.items())
                if b in buckets
                for k in range(self.gpu_free.get(u, 0))
            ]

        inside_ids = replicas(must)
        must_ids = [f"{u}{_REPLICA_SEP}reused-{i}" for i, u in enumerate(reused)] + inside_ids
        answer, missing = preferred_answer(
            plugin.annotated[index],
            sorted(must_ids + replicas(pool)),
            must_ids,
            len(must_ids) + need,
            _gpu_of_replica,
        )
        picks = [_gpu_of_replica(r) for r in answer if r not in set(must_ids)]
        if missing or len(picks) != need:
            return None
        for u in inside_ids:
            self.gpu_free[_gpu_of_replica(u)] = 0
        counts: dict[int, int] = {}
        for u in picks:
            self.gpu_free[u] -= 1
            counts[plugin.gpus[u][0]] = counts.get(plugin.gpus[u][0], 0) + 1
        return counts

    def take_counts(self, pool: Mapping[int, int], need: int, what: str) -> dict[int, int]:
        """Take ``need`` items from per-bucket counts: determined when it is all of them or one
        bucket; otherwise the next assumed split, or :class:`_Split` listing every possible one."""
        nonzero = {n: k for n, k in pool.items() if k > 0}
        if need <= 0 or not nonzero:
            return {}
        if need >= sum(nonzero.values()):
            return dict(nonzero)
        if len(nonzero) == 1:
            (n,) = nonzero
            return {n: need}
        self.split_count += 1
        if self.split_count <= len(self.splits):
            return dict(self.splits[self.split_count - 1])
        raise _Split(what, _splits(nonzero, need))

    def allocate_memory(self, c: _Container, hint: Hint) -> tuple[MemoryBlock, ...]:
        """The Static memory manager's ``Allocate``: pin the request to the hint's NUMA nodes."""
        if self.memory is None:
            return ()
        request = self.memory_request(c)
        try:
            mask = self.memory.pin_mask(
                self.masks, request, self.memory_reusable, (hint.mask or 0, hint.preferred), is_narrower
            )
        except MemoryPinError as exc:
            raise _reject(
                UNEXPECTED_ADMISSION_ERROR, f"Allocate failed due to {exc}, which is unexpected"
            ) from exc
        blocks = self.memory.pin(mask, request, self.memory_reusable)
        update_reusable(self.memory_reusable, mask, request, c.kind == "init")
        return blocks

    def place(self, c: _Container, hint: Hint) -> ContainerPrediction:
        """Allocate in kubelet's hint-provider order: the device manager, the CPU manager, then the
        memory manager (``container_manager_linux.go`` adds them so), which decides whose error a pod gets."""
        mask = hint.mask
        devices, held = self.allocate_devices(c, mask)
        cpus = self.allocate_cpus(c, mask)
        memory = self.allocate_memory(c, hint)
        if mask is not None:
            numa = nodes_of(mask)
        else:
            numa = frozenset(self.topo.numa_of[x] for x in cpus) | frozenset(held - {NO_TOPOLOGY})
        numa |= frozenset(n for b in memory for n in b.numa)  # pinned memory may extend the hint
        return ContainerPrediction(c.name, numa, cpus, devices, memory)

    def admit(self) -> tuple[ContainerPrediction, ...]:
        """Every container in kubelet's order, with container or pod scope."""
        if self.profile.policies.topology_manager_scope == "pod":
            cpu = _pod_effective(self.containers, self.cpu_request)
            names = sorted({r for c in self.containers for r in self.device_requests(c)})

            def amount(r: str) -> Callable[[_Container], int]:
                return lambda c: self.device_requests(c).get(r, 0)

            devices = {r: _pod_effective(self.containers, amount(r)) for r in names}
            hint = self.affinity(cpu, devices, self.pod_memory_request())
            return tuple(self.place(c, hint) for c in self.containers)
        return tuple(
            self.place(c, self.affinity(self.cpu_request(c), self.device_requests(c), self.memory_request(c)))
            for c in self.containers
        )


def _count_by(cpus: Iterable[int], owner: Mapping[int, int]) -> dict[int, int]:
    out: dict[int, int] = {}
    for cpu in cpus:
        out[owner[cpu]] = out.get(owner[cpu], 0) + 1
    return out


def _take_or_fail(
    topo: CpuTopology, available: Iterable[int], count: int, packing: Packing
) -> frozenset[int]:
    taken = take_cpus(topo, available, count, packing)
    if taken is None:
        raise _reject(
            UNEXPECTED_ADMISSION_ERROR, f"not enough cpus available to satisfy request: requested={count}"
        )
    return taken


class _Split(Exception):
    """kubelet's device pick is the device plugin's choice: ``options`` are the possible splits."""

    def __init__(self, what: str, options: list[dict[int, int]]) -> None:
        super().__init__(what)
        self.what = what
        self.options = options


def _splits(pool: Mapping[int, int], need: int) -> list[dict[int, int]]:
    """Every way to take ``need`` items from per-bucket counts (buckets in ascending order)."""
    buckets = sorted(pool)
    out: list[dict[int, int]] = []

    def walk(i: int, left: int, taken: dict[int, int]) -> None:
        if i == len(buckets):
            if left == 0:
                out.append({n: k for n, k in taken.items() if k})
            return
        rest = sum(pool[n] for n in buckets[i + 1 :])
        for k in range(max(0, left - rest), min(pool[buckets[i]], left) + 1):
            walk(i + 1, left - k, {**taken, buckets[i]: k})

    walk(0, need, {})
    return out


def _same(a: Prediction, b: Prediction) -> bool:
    """Two replays end alike: one rejection, or the same placement and usage."""
    return (a.outcome, a.reason, a.containers, a.usage) == (b.outcome, b.reason, b.containers, b.usage)


def _admit_every_split(
    profile: NumaProfile,
    ledger: NumaLedger,
    containers: list[_Container],
    qos: str,
    plugin: PluginView | None,
) -> Prediction:
    """Replay the admission once per possible device split the plugin may choose.

    Where every split ends alike (one rejection, or one placement with one usage), kubelet does
    that whichever replicas it picks: that is the answer. Otherwise the outcome depends on the
    plugin's choice (``unknown``, with the NUMA nodes of the first choice kubelet offers it).
    At most :data:`MAX_SPLIT_REPLAYS` replays.
    """
    pending: list[list[dict[int, int]]] = [[]]
    outcomes: list[Prediction] = []
    first: tuple[_Split, _Admission] | None = None
    while pending:
        script = pending.pop()
        admission = _Admission(profile, ledger, containers, qos, script, plugin)
        try:
            placed = admission.admit()
        except _Stop as stop:
            outcomes.append(stop.prediction)
        except _Split as split:
            first = first or (split, admission)
            pending += [[*script, option] for option in reversed(split.options)]
        else:
            outcomes.append(Prediction(Outcome.PLACED, containers=placed, usage=usage_of_prediction(placed)))
        if len(outcomes) + len(pending) > MAX_SPLIT_REPLAYS or (
            outcomes and not _same(outcomes[0], outcomes[-1])
        ):
            break
    if first is None or (not pending and _same(outcomes[0], outcomes[-1])):
        return outcomes[0]
    what = f"{first[0].what} kubelet takes is the device plugin's choice"
    return dataclasses.replace(_unknown(UNKNOWN_UNMODELLED, what), offered=first[1].offered)


def predict(
    profile: NumaProfile | None,
    ledger: NumaLedger | None,
    pod: Mapping[str, Any],
    *,
    now: float,
    max_age_s: float = DEFAULT_PROFILE_MAX_AGE_S,
    plugin: PluginView | None = None,
) -> Prediction:
    """What kubelet will do with ``pod`` on the node described by ``profile`` and ``ledger``.

    ``now`` is unix seconds (the caller's clock; the function reads none). ``plugin``: hamid's
    device plugin serves a resource of the node and the pod's GPUs are annotated; where kubelet
    lets the plugin choose among replicas, its answer is replayed (else that is ``unknown``).
    The ledger is not changed: book ``prediction.usage`` with :meth:`NumaLedger.apply` once the pod is placed.
    InvalidInput when the pod itself is malformed.
    """
    if profile is None:
        return _unknown(UNKNOWN_PROFILE_MISSING, "the node publishes no NUMA profile")
    if now - profile.observed_at > max_age_s:
        return _unknown(UNKNOWN_PROFILE_STALE, f"the NUMA profile is older than {max_age_s:.0f} s")
    if ledger is None or ledger.generation != profile.generation:
        return _unknown(UNKNOWN_PROFILE_STALE, "the NUMA ledger was built for another profile generation")
    if not ledger.free_cpus <= profile.all_cpus - profile.reserved_cpus:
        return _unknown(UNKNOWN_PROFILE_STALE, "the NUMA ledger holds CPUs the profile does not assign")
    why = unmodelled_reason(profile)
    if why is not None:
        return _unknown(UNKNOWN_UNMODELLED, why)
    spec = pod.get("spec") if isinstance(pod, Mapping) else None
    if isinstance(spec, Mapping) and spec.get("resources"):
        return _unknown(UNKNOWN_UNMODELLED, "pod-level resources (spec.resources) are not modelled")
    containers = _containers(pod)
    other = sorted({r for c in containers for r in c.limits if r in profile.other_devices})
    if other:
        return _unknown(
            UNKNOWN_UNMODELLED,
            f"the pod asks {other[0]}, a device resource with NUMA affinity the prediction does not replay",
        )
    qos = pod_qos(pod, containers)
    if profile.policies.memory_manager_policy == "Static" and qos == "Guaranteed":
        if profile.memory is None:
            return _unknown(
                UNKNOWN_UNMODELLED, "the profile carries no memory per NUMA node (Static memory manager)"
            )
        if ledger.memory is None:
            return _unknown(UNKNOWN_PROFILE_STALE, "the NUMA ledger was built without the node's memory")
    return _admit_every_split(profile, ledger, containers, qos, plugin)


def usage_of_prediction(containers: Iterable[ContainerPrediction]) -> NumaUsage:
    """A predicted pod's ledger usage (also from a decoded ``hamid.io/numa-predicted`` record)."""
    cpus: set[int] = set()
    devices: dict[str, dict[int, int]] = {}
    memory: list[MemoryBlock] = []
    for c in containers:
        cpus |= c.cpus
        memory += c.memory
        for res, per_numa in c.devices.items():
            into = devices.setdefault(res, {})
            for n, k in per_numa.items():
                into[n] = into.get(n, 0) + k
    return NumaUsage(frozenset(cpus), devices, tuple(memory))


def kept_usage(booked: NumaUsage, unlisted: NumaUsage, observed: NumaUsage) -> NumaUsage:
    """What a pod holds that its placement cannot show: the exclusive CPUs, replicas and memory of
    its regular init containers beyond what its listed containers reuse of them.

    kubelet keeps an init container's resources until the pod ends (later containers only reuse
    them), but PodResources lists app and restartable init containers only. ``booked`` is the
    pod's predicted usage, ``unlisted`` the share of it the unlisted containers took (replicas and
    memory newly taken, CPUs with those they reused), ``observed`` what the listed containers hold.
    Exact when the prediction was: the pod holds the booked total, of which the listed part is
    observed, CPU by CPU, per NUMA bucket and per memory mask. After a miss (or a replay other than
    kubelet's admission) it is a guess placed where the prediction put the init containers, sized
    never below kubelet's where the prediction's init containers were as large: a listed CPU or
    memory block counts as reused only where the prediction's init containers held it (whether
    kubelet's later containers reused them is not in the placement, and taking the prediction's
    reuse for kubelet's under-booked); replicas by count, as kubelet reuses an init container's
    devices first whatever their NUMA node. One memory block per unlisted block, in order, as
    kubelet keeps an init container's block shrunk by what later containers reused, to 0 bytes if
    need be.
    """
    cpus = unlisted.cpus - observed.cpus
    devices: dict[str, dict[int, int]] = {}
    for res, per_numa in unlisted.devices.items():
        total, seen = booked.devices.get(res, {}), observed.devices.get(res, {})
        spare = sum(total.values()) - sum(seen.values())
        for n, took in sorted(per_numa.items()):
            k = min(took, total.get(n, 0) - seen.get(n, 0), spare)
            if k > 0:
                devices.setdefault(res, {})[n] = k
                spare -= k
    by_mask: dict[tuple[frozenset[int], str], int] = {}
    for sign, blocks in ((1, booked.memory), (-1, observed.memory)):
        for b in blocks:
            by_mask[b.numa, b.resource] = by_mask.get((b.numa, b.resource), 0) + sign * b.size
    memory = []
    for b in unlisted.memory:
        size = max(0, min(b.size, by_mask.get((b.numa, b.resource), 0)))
        by_mask[b.numa, b.resource] = by_mask.get((b.numa, b.resource), 0) - size
        memory.append(MemoryBlock(b.numa, b.resource, size))
    return NumaUsage(cpus, devices, tuple(memory))


def usage_of_placement(containers: Iterable[ContainerPlacement]) -> NumaUsage:
    """An observed pod's ledger usage: its exclusive CPUs and distinct device IDs per NUMA bucket."""
    cpus: set[int] = set()
    ids: dict[str, dict[int, set[str]]] = {}
    memory: list[MemoryBlock] = []
    for c in containers:
        cpus |= c.cpus
        memory += c.memory
        for res, per_numa in c.devices.items():
            for n, held in per_numa.items():
                ids.setdefault(res, {}).setdefault(n, set()).update(held)
    devices = {r: {n: len(v) for n, v in per.items()} for r, per in ids.items()}
    return NumaUsage(frozenset(cpus), devices, tuple(memory))
