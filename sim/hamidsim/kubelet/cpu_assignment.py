"""kubelet's CPU pickers (``cpumanager/cpu_assignment.go``): ``takeByTopologyNUMAPacked`` and
``takeByTopologyNUMADistributed``, on real thread siblings, sockets and NUMA nodes.

Packed takes whole NUMA nodes or sockets (whichever is higher in the hierarchy first), then whole
cores, then single threads, each time from the group with the fewest free CPUs (lowest id on ties).
Distributed (``distribute-cpus-across-numa``) spreads the request evenly over the fewest NUMA nodes
that can hold it, choosing the combination that leaves the free CPUs most balanced. With
``distribute-cpus-across-cores`` (sorting strategy spread) whole cores are not taken and single
threads come socket by socket in CPU id order.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from fractions import Fraction

from hamidsim.kubelet.cadvisor import CpuTopology


class CpuAllocationError(Exception):
    """The static policy could not take the requested CPUs (kubelet's error text)."""


class _Accumulator:
    """``cpuAccumulator``: the free CPUs (``details``), what is taken and how many are still needed."""

    def __init__(self, topo: CpuTopology, available: Iterable[int], count: int, spread: bool = False) -> None:
        self.topo = topo
        self.free = set(available) & topo.cpus
        self.needed = count
        self.result: set[int] = set()
        self.numa_first = len(topo.sockets) >= len(topo.numa_nodes)
        #: ``CPUSortingStrategySpread`` (``distribute-cpus-across-cores``).
        self.spread = spread

    def take(self, cpus: Iterable[int]) -> None:
        taken = set(cpus)
        self.result |= taken
        self.free -= taken
        self.needed -= len(taken)

    def satisfied(self) -> bool:
        return self.needed < 1

    def failed(self) -> bool:
        return self.needed > len(self.free)

    def _sort(self, ids: Iterable[int], cpus_of: Callable[[int], frozenset[int]]) -> list[int]:
        return sorted(set(ids), key=lambda i: (len(self.free & cpus_of(i)), i))

    def _free_numa(self) -> set[int]:
        return {self.topo.details[c].numa for c in self.free}

    def _free_sockets_of(self, numa: int | None = None) -> set[int]:
        return {
            self.topo.details[c].socket
            for c in self.free
            if numa is None or self.topo.details[c].numa == numa
        }

    def sorted_numa(self) -> list[int]:
        if self.numa_first:
            return self._sort(self._free_numa(), lambda n: self.topo.numa_cpus[n])
        result: list[int] = []
        for socket in self.sorted_sockets():
            nodes = {self.topo.details[c].numa for c in self.free if self.topo.details[c].socket == socket}
            result += self._sort(nodes, lambda n: self.topo.numa_cpus[n])
        return result

    def sorted_sockets(self) -> list[int]:
        if not self.numa_first:
            return self._sort(self._free_sockets_of(), lambda s: self.topo.socket_cpus[s])
        result: list[int] = []
        for numa in self.sorted_numa():
            result += self._sort(self._free_sockets_of(numa), lambda s: self.topo.socket_cpus[s])
        return result

    def sorted_cores(self) -> list[int]:
        result: list[int] = []
        groups = self.sorted_sockets() if self.numa_first else self.sorted_numa()
        for group in groups:
            cores = {
                info.core
                for c in self.free
                if (info := self.topo.details[c]) and (info.socket if self.numa_first else info.numa) == group
            }
            result += self._sort(cores, lambda k: self.topo.core_cpus[k])
        return result

    def sorted_cpus(self) -> list[int]:
        """``sortAvailableCPUsPacked``: by core order, then by CPU id within a core; spread
        (``sortAvailableCPUsSpread``): by socket order, then by CPU id within a socket."""
        if self.spread:
            return [c for s in self.sorted_sockets() for c in sorted(self.free & self.topo.socket_cpus[s])]
        return [c for core in self.sorted_cores() for c in sorted(self.free & self.topo.core_cpus[core])]

    def _take_whole(self, groups: Sequence[int], cpus_of: Callable[[int], frozenset[int]], size: int) -> None:
        for group in groups:
            cpus = cpus_of(group)
            if len(self.free & cpus) == size and self.needed >= len(cpus):
                self.take(cpus)

    def sorted_uncores(self) -> list[int]:
        """``sortAvailableUncoreCaches``: NUMA node by NUMA node, each one's uncore caches with
        free CPUs by fewest free CPUs, then id."""
        result: list[int] = []
        for numa in self.sorted_numa():
            caches = {self.topo.details[c].uncore_id for c in self.free if self.topo.details[c].numa == numa}
            result += self._sort(caches, lambda u: self.topo.uncore_cpus[u])
        return result

    def take_uncore_cache(self) -> None:
        """``takeUncoreCache``: whole free uncore caches while the request needs one, then the
        first cache whose lowest free cores hold exactly what is left (``takePartialUncore``)."""
        order = self.sorted_uncores()  # Go ranges over the order taken before any pick
        for uncore in order:
            cpus = self.topo.uncore_cpus[uncore]
            if cpus <= self.free and self.needed >= len(cpus):
                self.take(cpus)
        if self.satisfied():
            return
        for uncore in order:
            self.take_partial_uncore(uncore)
            if self.satisfied():
                return

    def take_partial_uncore(self, uncore: int) -> None:
        """``takePartialUncore``: the free CPUs of the lowest ``ceil(needed / threads per core)``
        cores with free CPUs in the cache (one thread fewer when an odd count is left on SMT),
        taken only if that is exactly what is needed."""
        per_core = self.topo.cpus_per_core()
        in_cache = self.free & self.topo.uncore_cpus[uncore]
        cores = sorted({self.topo.details[c].core for c in in_cache})[: -(-self.needed // per_core)]
        cpus = sorted(c for c in in_cache if self.topo.details[c].core in cores)
        if self.needed % 2 and per_core > 1 and len(cpus) > self.needed:
            cpus = cpus[:-1]
        if len(cpus) == self.needed:
            self.take(cpus)

    def take_full_numa_nodes(self) -> None:
        for numa in self.sorted_numa():
            cpus = self.topo.numa_cpus[numa]
            if cpus <= self.free and self.needed >= len(cpus):
                self.take(cpus)

    def take_full_sockets(self) -> None:
        self._take_whole(
            self.sorted_sockets(), lambda s: self.topo.socket_cpus[s], self.topo.cpus_per_socket()
        )

    def take_full_cores(self) -> None:
        self._take_whole(self.sorted_cores(), lambda k: self.topo.core_cpus[k], self.topo.cpus_per_core())

    def take_remaining_cpus(self) -> None:
        for cpu in self.sorted_cpus():
            self.take([cpu])
            if self.satisfied():
                return


def _not_enough(count: int, available: int) -> CpuAllocationError:
    return CpuAllocationError(
        f"not enough cpus available to satisfy request: requested={count}, available={available}"
    )


def take_by_topology(
    topo: CpuTopology, available: Iterable[int], count: int, spread: bool = False, uncore: bool = False
) -> frozenset[int]:
    """``takeByTopologyNUMAPacked``. ``spread``: the CPU sorting of ``distribute-cpus-across-cores``,
    which skips taking whole cores and spreads the threads; ``uncore``
    (``prefer-align-cpus-by-uncorecache``): after whole NUMA nodes and sockets, whole uncore caches
    and then one cache holding the rest, before whole cores."""
    acc = _Accumulator(topo, available, count, spread)
    if acc.satisfied():
        return frozenset(acc.result)
    if acc.failed():
        raise _not_enough(count, len(acc.free))
    steps = (
        (acc.take_full_numa_nodes, acc.take_full_sockets)
        if acc.numa_first
        else (acc.take_full_sockets, acc.take_full_numa_nodes)
    )
    caches = (acc.take_uncore_cache,) if uncore else ()
    cores = () if spread else (acc.take_full_cores,)
    for step in (*steps, *caches, *cores, acc.take_remaining_cpus):
        step()
        if acc.satisfied():
            return frozenset(acc.result)
    raise CpuAllocationError("failed to allocate cpus")


def _numa_range(acc: _Accumulator, group: int) -> tuple[int, int]:
    """``rangeNUMANodesNeededToSatisfy``: the minimum from the CPU groups per NUMA node of the whole
    machine (not of the free CPUs), the maximum bounded by the NUMA nodes with free CPUs."""
    groups_in_machine = (len(acc.topo.cpus) - 1) // group + 1
    per_node = (groups_in_machine - 1) // len(acc.topo.numa_nodes) + 1
    groups_needed = (acc.needed - 1) // group + 1
    return (groups_needed - 1) // per_node + 1, min(groups_needed, len(acc._free_numa()))


def _variance(values: Iterable[int]) -> Fraction:
    """The population variance (kubelet compares standard deviations; the order is the same)."""
    items = list(values)
    mean = Fraction(sum(items), len(items))
    return sum(((v - mean) ** 2 for v in items), Fraction(0)) / len(items)


def _spread_remainder(
    after: dict[int, int], subset: Sequence[int], remainder: int, group: int
) -> dict[int, int]:
    after = dict(after)
    while remainder > 0:
        for numa in subset:
            if remainder == 0:
                break
            if after[numa] < group:
                continue
            after[numa] -= group
            remainder -= group
    return after


def _score_combo(
    acc: _Accumulator, numas: Sequence[int], combo: Sequence[int], count: int, group: int
) -> tuple[Fraction, tuple[int, ...]] | None:
    """The best balance of one NUMA combination and the nodes the remainder comes from (None: unusable)."""
    free_in = {n: len(acc.free & acc.topo.numa_cpus[n]) for n in numas}
    if sum(free_in[n] for n in combo) < count or sum(free_in[n] // group for n in combo) * group < count:
        return None
    distribution = (count // len(combo) // group) * group
    if any(free_in[n] < distribution for n in combo):
        return None
    after = dict(free_in)
    for n in combo:
        after[n] -= distribution
    remainder = count - distribution * len(combo)
    if remainder == 0:
        return _variance(after.values()), ()
    candidates = [n for n in combo if after[n] >= group]
    best: tuple[Fraction, tuple[int, ...]] | None = None
    for size in range(len(candidates), 0, -1):
        for subset in itertools.combinations(candidates, size):
            if sum(after[n] for n in subset) < remainder:
                continue
            balance = _variance(_spread_remainder(after, subset, remainder, group).values())
            if best is None or balance < best[0]:
                best = (balance, subset)
    return best


def take_by_topology_distributed(
    topo: CpuTopology, available: Iterable[int], count: int, group: int = 1
) -> frozenset[int]:
    """``takeByTopologyNUMADistributed``: ``group`` is the CPU group size (threads per core with
    ``full-pcpus-only``, else 1); falls back to packing when no combination balances."""
    if count % group != 0:
        return take_by_topology(topo, available, count)
    acc = _Accumulator(topo, available, count)
    if acc.satisfied():
        return frozenset()
    if acc.failed():
        raise _not_enough(count, len(acc.free))
    numas = acc.sorted_numa()
    low, high = _numa_range(acc, group)
    for k in range(low, high + 1):
        best: tuple[Fraction, tuple[int, ...], tuple[int, ...]] | None = None
        for combo in itertools.combinations(numas, k):
            scored = _score_combo(acc, numas, combo, count, group)
            if scored is not None and (best is None or scored[0] < best[0]):
                best = (scored[0], scored[1], combo)
            if best is not None and best[0] == 0:
                break
        if best is None:
            continue
        _, remainder_nodes, combo = best
        distribution = (count // len(combo) // group) * group
        for numa in combo:
            acc.take(take_by_topology(topo, acc.free & topo.numa_cpus[numa], distribution))
        remainder = count - distribution * len(combo)
        while remainder > 0:
            for numa in remainder_nodes:
                if remainder == 0:
                    break
                if len(acc.free & topo.numa_cpus[numa]) < group:
                    continue
                acc.take(take_by_topology(topo, acc.free & topo.numa_cpus[numa], group))
                remainder -= group
        return frozenset(acc.result)
    return take_by_topology(topo, available, count)
