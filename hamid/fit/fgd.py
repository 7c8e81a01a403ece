"""Fragmentation gradient descent (FGD, USENIX ATC '23), NUMA-aware: the maths, pure.

A node's fragmentation under a typical workload is the GPU capacity (milli-GPU) that the typical
pods cannot use there, weighted by how often each shape comes: for shape ``m`` it is all the
node's idle GPU when ``m`` cannot run there at all (it needs no GPU, the node is short of CPU or
memory, no GPU of an allowed model has room for it, or too few do), else the idle GPU on the
GPUs that cannot take it. Beyond the paper, a share (one GPU, part of it) uses its room as many
pods, each with its own CPU, so it counts only as far as the node's free CPU backs them; and an
*aligned* shape (exclusive CPUs on its GPUs' NUMA
node) can use a GPU only when that NUMA node still has the exclusive CPUs it needs, so GPUs
stranded beside exhausted CPUs count as fragment too, as do all of a node's GPUs for a shape that
kubelet's Topology Manager would not admit there. A pod goes where it removes the most
fragmentation (``F_before - F_after``): the node, and for a share, the GPU.

The typical workload is learned online (:class:`ShapeHistogram`) or pinned by an operator
(:func:`parse_workload`). No I/O here; the scheduler memoises on :class:`NodeState` (nodes in
equal states share their work) and recomputes a node only when it changes.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import NamedTuple

from hamid.fit.node_room import CpuMem
from hamid.fit.replica_room import hides
from hamid.model._wire import want_number
from hamid.model.errors import InvalidInput
from hamid.model.numa import SPANNING_RULES, STEERING_RULES
from hamid.model.quantity import parse_quantity
from hamid.model.resources import ContainerDeviceRequest

#: milli-GPU of one whole GPU.
WHOLE = 1000
#: The fraction of observed pods the typical shapes cover (the paper's 95 %).
COVERAGE = 0.95
#: Pods after which an observation weighs half as much as a new one.
DEFAULT_HALF_LIFE = 5000.0
#: The half-lives a histogram takes, in pods: under one pod the newest outweighs all before it
#: together (under 0.025 it falls below the rescale's floor at once and nothing is learned); over
#: 10^12 the decay steps near float precision (beyond ~10^15 none is left).
HALF_LIFE_RANGE = (1.0, 1e12)
#: Shapes a histogram keeps: past this the lightest tenth are folded into one remainder (their
#: weight still counts in the total, so the typical workload is the same while they weigh under
#: 1 - COVERAGE, but for a folded shape seen again: it starts afresh, its old weight left in the
#: remainder). Pods of ever-new requests (per-job sizing, VPA) otherwise grow it for good, and
#: each refresh sorts all of it (~1 s at 150,000 shapes).
SHAPES_KEPT = 4096
#: The most shapes a learned typical workload keeps: a long tail of rare shapes (one tenant's
#: per-job sizes) would otherwise pull thousands into the 95 %, and every fragmentation is a pass
#: over them. The openb replay's learned workload peaks at 52 shapes (seed 42, NUMA off; 50 with
#: NUMA on), of at most 137 it sees: well under the cap, so its decisions stay those of the
#: uncapped rule.
TYPICAL_SHAPES = 128
#: Memory buckets per doubling (a shape's memory is its bucket's top).
_MEMORY_STEPS = 4
#: Free GPU replicas on a NUMA node beyond what two pods of 8 GPUs take are as good as many (a
#: node state keeps at most this many, so equal nodes stay equal).
REPLICAS_SEEN = 16
#: Subtracted from the gain of a placement whose GPUs are not on the NUMA node kubelet gives the
#: pod's exclusive CPUs: far beyond any fragmentation (milli-GPU), so it ranks below every aligned one.
UNALIGNED = 1e7
#: Gains (milli-GPU) are compared in whole steps of this size: placements within a step are
#: equal, and equal ones go to the nodes in a fixed order (first fit), which packs nodes one
#: after another and keeps whole nodes free for the large pods (docs/packing.md).
GAIN_STEP = 50


class Shape(NamedTuple):
    """A pod's resource shape as FGD sees it."""

    cpu: int  #: milli-CPUs
    memory: int  #: MiB
    gpus: int  #: GPUs (0: CPU only)
    share: int  #: milli-GPU on each of them (1000: whole GPUs)
    models: tuple[str, ...] | None = None  #: upper-case ``use-gputype`` substrings (None: any model)
    exclusive: int = 0  #: exclusive CPUs it takes on its GPUs' NUMA node (0: not aligned)


class NumaRoom(NamedTuple):
    """One NUMA node of a node as kubelet's Topology Manager sees it for an aligned pod."""

    free: int  #: free exclusive CPUs
    assignable: int  #: exclusive CPUs it has at all
    replicas: int = REPLICAS_SEEN  #: free GPU replicas kubelet can hand out there (at most REPLICAS_SEEN)


class Gpu(NamedTuple):
    """One GPU of a node: free milli-GPU (0 when no slot is left), NUMA node, upper-case model."""

    free: int
    numa: int
    model: str


class NodeState(NamedTuple):
    """What a node's fragmentation depends on (hashable: equal nodes share their work).

    The GPUs are kept as parallel tuples (free milli-GPU, NUMA node, model), the form the loops
    below read fastest.
    """

    cpu: int  #: free milli-CPUs
    memory: int  #: free MiB
    frees: tuple[int, ...]
    numas: tuple[int, ...]
    models: tuple[str, ...]
    #: Exclusive CPUs and GPU replicas per NUMA node, by NUMA id; None: no NUMA knowledge.
    numa: tuple[NumaRoom, ...] | None = None
    #: The rule by which the node's plugin hides free replicas from kubelet (None: it does not;
    #: :mod:`hamid.fit.replica_room`; ``numa`` then counts only the replicas kubelet sees).
    hide: str | None = None
    #: kubelet's Topology Manager admits only a preferred hint (``restricted``, ``single-numa-node``):
    #: an aligned shape with no NUMA node holding both its exclusive CPUs and its replicas cannot run
    #: there at all (:func:`gpu_use`).
    rejects_unpreferred: bool = False

    def gpu_side(self) -> tuple[object, ...]:
        """Every field but the CPU and memory: all that :func:`gpu_use` reads, so states differing
        only in CPU or memory (the same GPUs after pods of one GPU part but other CPU asks) share
        its results."""
        return self[2:]

    @classmethod
    def of(
        cls,
        cpu: int,
        memory: int,
        gpus: Iterable[Gpu],
        numa: tuple[NumaRoom, ...] | None = None,
        hide: str | None = None,
        rejects_unpreferred: bool = False,
    ) -> NodeState:
        """A state from its GPUs."""
        listed = tuple(gpus)
        return cls(
            cpu,
            memory,
            tuple(g.free for g in listed),
            tuple(g.numa for g in listed),
            tuple(g.model for g in listed),
            numa,
            hide,
            rejects_unpreferred,
        )


class Placement(NamedTuple):
    """The best placement of a pod on a node: its gain and the GPUs (positions in the node's GPUs).

    The gain of a placement off the NUMA node kubelet gives the pod's exclusive CPUs is its
    fragmentation gain less :data:`UNALIGNED`.
    """

    gain: float
    gpus: tuple[int, ...]


class Group(NamedTuple):
    """Typical shapes sharing a GPU part: one GPU judgement for all of them."""

    part: Shape  #: the GPU part (cpu and memory 0)
    entries: tuple[tuple[int, int, float], ...]  #: ``(cpu, memory, p)`` of each shape
    p: float  #: their probabilities' sum


@dataclass(frozen=True, slots=True)
class Workload:
    """Typical shapes with their probabilities (summing to 1), grouped by their GPU part.

    ``by_cpu`` and ``by_memory`` list every shape as ``(cpu, memory, group, p)``, largest first,
    so a node's shortage is found by reading only the shapes it is short for. ``keys`` are the
    groups' GPU parts as :func:`part_key` numbers them, ``total`` their probabilities' sum.
    A node's shortage depends only on how many shapes of ``by_cpu`` ask more CPU than it has and
    how many of ``by_memory`` more memory (its *levels*): ``runnable`` keeps, per levels, the
    groups that can run there with what is left of their probability.
    """

    shapes: tuple[tuple[Shape, float], ...]
    groups: tuple[Group, ...]
    by_cpu: tuple[tuple[int, int, int, float], ...] = ()
    by_memory: tuple[tuple[int, int, int, float], ...] = ()
    keys: tuple[int, ...] = ()
    total: float = 0.0
    cpu_keys: tuple[int, ...] = ()  #: ``-cpu`` of ``by_cpu``'s shapes (ascending: for bisection)
    memory_keys: tuple[int, ...] = ()  #: ``-memory`` of ``by_memory``'s shapes
    runnable: dict[tuple[int, int], tuple[tuple[int, float, Group], ...]] = field(
        default_factory=dict, compare=False, repr=False
    )

    def levels(self, cpu: int, memory: int) -> tuple[int, int]:
        """How many shapes ask more CPU than ``cpu``, and how many more memory than ``memory``."""
        return bisect.bisect_left(self.cpu_keys, -cpu), bisect.bisect_left(self.memory_keys, -memory)

    def runnable_at(self, cpu: int, memory: int) -> tuple[tuple[int, float, Group], ...]:
        """``(key, probability, group)`` of each group with a GPU that a node with ``cpu`` and
        ``memory`` free can run, its probability less its shapes short there (memoised by levels)."""
        levels = self.levels(cpu, memory)
        known = self.runnable.get(levels)
        if known is None:
            short = [0.0] * len(self.groups)
            for shape_cpu, _, group, p in self.by_cpu:
                if shape_cpu <= cpu:
                    break
                short[group] += p
            for shape_cpu, shape_memory, group, p in self.by_memory:
                if shape_memory <= memory:
                    break
                if shape_cpu <= cpu:  # not counted above
                    short[group] += p
            known = tuple(
                (key, group.p - shortage, group)
                for group, key, shortage in zip(self.groups, self.keys, short, strict=True)
                if group.part.gpus and group.p - shortage > 0
            )
            if len(self.runnable) >= _STATIC_MEMO:
                self.runnable.clear()
            self.runnable[levels] = known
        return known

    @classmethod
    def of(cls, weighted: Iterable[tuple[Shape, float]]) -> Workload:
        """Normalise weights to probabilities; InvalidInput when they do not add up to anything."""
        items = [(s, w) for s, w in weighted if w > 0]
        total = sum(w for _, w in items)
        if total <= 0:
            raise InvalidInput("the workload has no shape with a positive weight")
        if total == math.inf:  # each weight finite, their sum not: every probability would be 0
            raise InvalidInput("the workload's weights add up past the largest number (scale them down)")
        shapes = tuple((s, w / total) for s, w in items)
        grouped: dict[Shape, list[tuple[int, int, float]]] = {}
        for s, p in shapes:
            grouped.setdefault(s._replace(cpu=0, memory=0), []).append((s.cpu, s.memory, p))
        groups = tuple(Group(g, tuple(v), sum(p for _, _, p in v)) for g, v in grouped.items())
        flat = [(c, m, k, p) for k, group in enumerate(groups) for c, m, p in group.entries]
        by_cpu = tuple(sorted(flat, key=lambda e: -e[0]))
        by_memory = tuple(sorted(flat, key=lambda e: -e[1]))
        keys = tuple(part_key(g.part) for g in groups)
        total = sum(g.p for g in groups)
        cpu_keys, memory_keys = tuple(-e[0] for e in by_cpu), tuple(-e[1] for e in by_memory)
        return cls(shapes, groups, by_cpu, by_memory, keys, total, cpu_keys, memory_keys)


EMPTY = Workload((), ())

_PART_KEYS: dict[Shape, int] = {}
_PART_KEYS_MAX = 10_000


def part_key(part: Shape) -> int:
    """A number for a GPU part, never reused: the key of :func:`gpu_use`'s memo, cheaper to look up
    than the part itself. Past :data:`_PART_KEYS_MAX` parts the table starts afresh with new
    numbers (a memo keyed by an old one then misses, never answers wrongly)."""
    key = _PART_KEYS.get(part)
    if key is None:
        if len(_PART_KEYS) >= _PART_KEYS_MAX:
            _PART_KEYS.clear()
        key = _PART_KEYS[part] = next(_PART_NUMBERS)
    return key


_PART_NUMBERS = itertools.count()

_MASKS: dict[tuple[tuple[str, ...], tuple[str, ...]], tuple[bool, ...]] = {}
_ALIGNABLE: dict[tuple[Shape, tuple[int, ...], tuple[str, ...], tuple[int, ...]], bool] = {}
_STATIC_MEMO = 10_000


def _mask(models: tuple[str, ...] | None, node_models: tuple[str, ...]) -> tuple[bool, ...] | None:
    """Which GPUs a model rule allows (None: all of them), memoised per rule and node kind."""
    if models is None:
        return None
    key = (models, node_models)
    mask = _MASKS.get(key)
    if mask is None:
        if len(_MASKS) >= _STATIC_MEMO:
            _MASKS.clear()
        mask = _MASKS[key] = tuple(any(m in model for m in models) for model in node_models)
    return mask


def _alignable(node: NodeState, shape: Shape) -> bool:
    """Whether some NUMA node could ever hold the aligned shape (else it is judged unaligned)."""
    numa = node.numa
    if numa is None or not shape.exclusive:
        return False
    assignable = tuple(room.assignable for room in numa)
    key = (shape._replace(cpu=0, memory=0), node.numas, node.models, assignable)
    known = _ALIGNABLE.get(key)
    if known is None:
        mask = _mask(shape.models, node.models)
        known = any(
            cpus >= shape.exclusive
            and sum(1 for i, n in enumerate(node.numas) if n == home and (mask is None or mask[i]))
            >= shape.gpus
            for home, cpus in enumerate(assignable)
        )
        if len(_ALIGNABLE) >= _STATIC_MEMO:
            _ALIGNABLE.clear()
        _ALIGNABLE[key] = known
    return known


def fitting_gpus(node: NodeState, shape: Shape) -> list[int]:
    """Positions of the GPUs of an allowed model with room for one of the shape's GPUs."""
    share = shape.share
    mask = _mask(shape.models, node.models)
    if mask is None:
        return [i for i, free in enumerate(node.frees) if free >= share]
    return [i for i, free in enumerate(node.frees) if free >= share and mask[i]]


def usable_frees(node: NodeState, shape: Shape) -> tuple[int, ...]:
    """The free milli-GPU of each GPU ``shape`` can use on the node (its GPU part only)."""
    share, count, frees = shape.share, shape.gpus, node.frees
    if shape.models is None and not (shape.exclusive and node.numa is not None):
        room = tuple(free for free in frees if free >= share)
        return room if len(room) >= count else ()
    fitting = fitting_gpus(node, shape)
    if len(fitting) < count:
        return ()
    if not _alignable(node, shape):
        # More GPUs or CPUs than one NUMA node holds: the paper's rule, but where kubelet admits only
        # a preferred hint it needs a NUMA node with the CPUs and the replicas: the device manager's
        # hint for replicas that fit one NUMA node is preferred there alone, and the CPU manager's
        # for CPUs that do not is preferred only across NUMA nodes, so they never agree otherwise.
        if (
            node.rejects_unpreferred
            and shape.exclusive
            and kubelet_home(node, shape) is None
            and not spans_idle_node(node, shape)
        ):
            return ()
        return tuple(frees[i] for i in fitting)
    aligned: list[int] = []
    for home in aligned_homes(node, shape):
        on_home = [frees[i] for i in fitting if node.numas[i] == home]
        if len(on_home) >= count:
            aligned += on_home
    return tuple(aligned)


def spans_idle_node(node: NodeState, shape: Shape) -> bool:
    """Whether kubelet admits an aligned shape no NUMA node holds, across NUMA nodes, on this node.

    Under the ``span`` rule (in effect under ``restricted`` only) the plugin of a node with nothing
    booked lists one replica per GPU, so where no NUMA node has as many GPUs as the shape asks, the
    device manager's only preferred hint spans NUMA nodes; the Topology Manager admits it when the
    CPU manager's does too, i.e. when no NUMA node can assign the shape's exclusive CPUs.
    """
    if node.hide not in SPANNING_RULES or node.numa is None or any(free < WHOLE for free in node.frees):
        return False
    widest = max(Counter(node.numas).values(), default=0)
    cpus_span = all(r.assignable < shape.exclusive for r in node.numa)
    return widest < shape.gpus and cpus_span and sum(r.free for r in node.numa) >= shape.exclusive


def aligned_homes(node: NodeState, shape: Shape) -> tuple[int, ...]:
    """The NUMA nodes an aligned shape's exclusive CPUs may go to with its GPUs on the same one.

    Under ``steer`` the plugin offers kubelet only the booked GPUs' replicas while the pod is
    admitted, so kubelet follows the scheduler to any NUMA node with the free exclusive CPUs;
    elsewhere kubelet chooses (:func:`kubelet_home`), whatever the scheduler books.
    """
    if node.numa is None:
        return ()
    if node.hide in STEERING_RULES:
        return tuple(n for n, room in enumerate(node.numa) if room.free >= shape.exclusive)
    home = kubelet_home(node, shape)
    return () if home is None else (home,)


def kubelet_home(node: NodeState, shape: Shape) -> int | None:
    """The NUMA node kubelet gives an aligned shape's exclusive CPUs and GPU replicas; None: none.

    Every single NUMA node with the free exclusive CPUs and free replicas is a preferred hint of
    both the CPU and the device manager, and the Topology Manager takes the lowest of them. kubelet
    counts replicas, not the GPU room behind them: a GPU whose cores or memory are used up still
    offers its free replicas, so the pod's CPUs go there and only that NUMA node's GPUs serve it
    aligned. (A model of the typical shape; the pod itself is fitted within the scheduler's
    prediction, :mod:`hamid.fit.numa_predict`.)
    """
    if node.numa is None:
        return None
    for home, room in enumerate(node.numa):
        if room.free >= shape.exclusive and room.replicas >= shape.gpus:
            return home
    return None


#: What a typical GPU part can use on a node's GPUs: (milli-GPU, pods of a share they hold side
#: by side; 0 for whole GPUs).
Use = tuple[int, int]


def _is_share(part: Shape) -> bool:
    """One GPU, part of it: its room is many pods side by side, each with its own CPU."""
    return part.gpus == 1 and 0 < part.share < WHOLE


def gpu_use(node: NodeState, part: Shape) -> Use:
    """What GPU part ``part`` can use of the node's GPUs (:data:`Use`; its CPU and memory aside)."""
    share = part.share
    if part.models is None and not (part.exclusive and node.numa is not None):  # the common case, one pass
        n = total = pods = 0
        for free in node.frees:
            if free >= share:
                n += 1
                total += free
                pods += free // share if share else 0
        if n < part.gpus:
            return 0, 0
        return total, pods if _is_share(part) else 0
    frees = usable_frees(node, part)
    return sum(frees), sum(free // share for free in frees) if _is_share(part) else 0


def backing_cpu(node: NodeState, workload: Workload, uses: dict[int, Use]) -> int:
    """The free CPU from which the node's GPUs back every typical share's pods in full: at or above
    it the node's fragmentation depends on its CPU only through its levels, as the paper's does
    (a memo key; ``uses`` as :func:`fragmentation` keeps it)."""
    top = 0
    for group, key in zip(workload.groups, workload.keys, strict=True):
        if not _is_share(group.part):
            continue
        use = uses.get(key)
        if use is None:
            use = uses[key] = gpu_use(node, group.part)
        if use[1]:
            top = max(top, use[1] * max(cpu for cpu, _, _ in group.entries))
    return top


def cpu_backed(group: Group, cpu: int, memory: int, pods: int) -> float:
    """The probability of the group's shapes that run on a node with ``cpu`` and ``memory`` free,
    each counted for the part of its ``pods`` (the share's pods the node's GPUs hold) that the
    free CPU can back: a share's room is many pods, each with its own CPU, and GPU room beside too
    little CPU for them is fragment in proportion (docs/packing.md)."""
    backed = 0.0
    for shape_cpu, shape_memory, p in group.entries:
        if shape_cpu > cpu or shape_memory > memory:
            continue
        wanted = shape_cpu * pods
        backed += p if wanted <= cpu else p * cpu / wanted
    return backed


def fragmentation(node: NodeState, workload: Workload, uses: dict[int, Use] | None = None) -> float:
    """The node's expected fragmentation (milli-GPU) under ``workload``: ``sum p_m * F_n(m)``.

    Every shape counts the whole idle GPU but for what it can use there: ``F = idle * sum p -
    sum over runnable shapes of p * usable``; a shape short of CPU or memory uses nothing, and a
    share uses its room only as far as the free CPU backs the pods it holds (:func:`cpu_backed`).
    ``uses`` memoises :func:`gpu_use` by GPU part (:func:`part_key`) for this node: it does not
    depend on the workload's weights nor on the node's CPU and memory, so a caller keeping it per
    GPU side recomputes only the weighted sum when the learned workload moves.
    """
    idle = sum(node.frees)
    if idle == 0 or not workload.groups:
        return 0.0
    if uses is None:
        uses = {}
    used = 0.0
    for key, runnable, group in workload.runnable_at(node.cpu, node.memory):
        use = uses.get(key)
        if use is None:
            use = uses[key] = gpu_use(node, group.part)
        milli, pods = use
        if not milli:
            continue
        if pods:
            runnable = cpu_backed(group, node.cpu, node.memory, pods)
        used += runnable * milli
    return max(idle * workload.total - used, 0.0)


def _options(node: NodeState, pod: Shape) -> tuple[list[tuple[int, ...]], bool]:
    """The GPU sets worth judging for ``pod``, and whether they are aligned: for an aligned shape
    on a node with NUMA knowledge, those on the NUMA node kubelet gives its CPUs
    (:func:`kubelet_home`) when any exists, else every set (unaligned); any set for other pods."""
    fitting = fitting_gpus(node, pod)
    if len(fitting) < pod.gpus:
        return [], True
    if pod.gpus == 1:
        distinct: dict[tuple[int, int, str], int] = {}
        for i in fitting:  # equal GPUs leave equal nodes: judge the first of them
            distinct.setdefault((node.frees[i], node.numas[i], node.models[i]), i)
        options: list[tuple[int, ...]] = [(i,) for i in distinct.values()]
    else:
        by_numa: dict[int, list[int]] = {}
        for i in fitting:
            by_numa.setdefault(node.numas[i], []).append(i)
        options = [_tightest(node, ids, pod.gpus) for ids in by_numa.values() if len(ids) >= pod.gpus]
        options = options or [_tightest(node, fitting, pod.gpus)]
    if pod.exclusive and node.numa is not None:
        homes = aligned_homes(node, pod)
        aligned = [o for o in options if len({node.numas[i] for i in o}) == 1 and node.numas[o[0]] in homes]
        return (aligned, True) if aligned else (options, False)
    return options, True


def _tightest(node: NodeState, ids: Sequence[int], count: int) -> tuple[int, ...]:
    return tuple(sorted(sorted(ids, key=lambda i: (node.frees[i], i))[:count]))


def after(node: NodeState, pod: Shape, gpus: tuple[int, ...]) -> NodeState:
    """The node once ``pod`` runs there on ``gpus``: exclusive CPUs and replicas from the NUMA node
    kubelet gives them (:func:`kubelet_home`; without one, the first GPU's)."""
    taking = list(node.frees)
    for i in gpus:
        taking[i] -= pod.share
    frees = tuple(taking)
    numa = node.numa
    if numa is not None and pod.exclusive and gpus:
        home = node.numas[gpus[0]] if node.hide in STEERING_RULES else kubelet_home(node, pod)
        home = node.numas[gpus[0]] if home is None else home
        if 0 <= home < len(numa):
            room = numa[home]
            taken = NumaRoom(
                max(room.free - pod.exclusive, 0), room.assignable, max(room.replicas - pod.gpus, 0)
            )
            numa = (*numa[:home], taken, *numa[home + 1 :])
    if numa is not None and node.hide is not None:
        numa = _rehide(node, numa, frees)
    return NodeState(
        node.cpu - pod.cpu,
        node.memory - pod.memory,
        frees,
        node.numas,
        node.models,
        numa,
        node.hide,
        node.rejects_unpreferred,
    )


def _rehide(node: NodeState, numa: tuple[NumaRoom, ...], frees: tuple[int, ...]) -> tuple[NumaRoom, ...]:
    """The replicas kubelet sees per NUMA node once the GPUs' free milli-GPU went from
    ``node.frees`` to ``frees``, where the plugin hides them by ``node.hide``: a NUMA node whose
    last offering GPU got hidden (no room left; under ``busy`` also made busy while an idle GPU
    remains) offers none; one whose GPUs are offered again (the last idle GPU went away) offers at
    least one replica per such GPU. (A model: the replicas of a GPU are not in the state, so a
    NUMA node that keeps an offering GPU keeps its count.)"""
    before = _offering(node.frees, node.numas, node.hide, len(numa))
    now = _offering(frees, node.numas, node.hide, len(numa))
    out = list(numa)
    for n, (was, offers) in enumerate(zip(before, now, strict=True)):
        if was and not offers:
            out[n] = out[n]._replace(replicas=0)
        elif offers and not was:
            out[n] = out[n]._replace(replicas=max(out[n].replicas, min(offers, REPLICAS_SEEN)))
    return tuple(out)


def _offering(
    frees: tuple[int, ...], numas: tuple[int, ...], hide: str | None, count: int
) -> tuple[int, ...]:
    """Per NUMA node, the GPUs whose free replicas kubelet sees (:func:`hides` on milli-GPU:
    room is free > 0, idle is a whole GPU free); memoised, the same GPUs recur on many nodes."""
    key = (frees, numas, hide, count)
    known = _OFFERING.get(key)
    if known is None:
        idle_on_node = any(f >= WHOLE for f in frees)
        out = [0] * count
        for free, n in zip(frees, numas, strict=True):
            seen = not hides(hide, room=free > 0, idle=free >= WHOLE, idle_on_node=idle_on_node)
            if seen and 0 <= n < count:
                out[n] += 1
        if len(_OFFERING) >= _STATIC_MEMO:
            _OFFERING.clear()
        known = _OFFERING[key] = tuple(out)
    return known


_OFFERING: dict[tuple[tuple[int, ...], tuple[int, ...], str | None, int], tuple[int, ...]] = {}


def gain_steps(gain: float, step: int = GAIN_STEP) -> float:
    """A gain in whole steps (milli-GPU), rounded down (``-inf``, no room, stays)."""
    return gain if gain == -math.inf else float(math.floor(gain / step))


def best_placement(node: NodeState, pod: Shape, frag: Callable[[NodeState], float]) -> Placement | None:
    """Where on ``node`` the pod removes the most fragmentation (``frag``: memoised F); None: no room.

    A CPU-only pod has one placement (no GPU); its gain is never positive (it only takes CPU and
    memory the typical shapes could need). Ties go to the GPU set with the least free GPU left
    (best fit), then the lowest positions. A placement that cannot be aligned (an aligned shape
    whose GPUs cannot be on the NUMA node kubelet gives its CPUs) loses :data:`UNALIGNED`.
    """
    if pod.cpu > node.cpu or pod.memory > node.memory:
        return None
    options, aligned = _options(node, pod) if pod.gpus else ([()], True)
    if not options:
        return None
    before = frag(node)
    best: tuple[float, int, tuple[int, ...]] | None = None
    for option in options:
        key = (frag(after(node, pod, option)) - before, sum(node.frees[i] for i in option), option)
        if best is None or key < best:
            best = key
    assert best is not None
    return Placement(-best[0] - (0 if aligned else UNALIGNED), best[2])


# -- the typical workload -------------------------------------------------------------------------


def memory_bucket(mib: int) -> int:
    """The top of ``mib``'s bucket (quarter doublings: at most 19 % above the request)."""
    if mib <= 1:
        return max(mib, 0)
    return math.ceil(2 ** (math.ceil(math.log2(mib) * _MEMORY_STEPS) / _MEMORY_STEPS))


def check_half_life(half_life: float) -> float:
    """``half_life`` if within :data:`HALF_LIFE_RANGE`, else InvalidInput naming the range."""
    low, high = HALF_LIFE_RANGE
    if not low <= half_life <= high:
        raise InvalidInput(f"the fgd half-life must be {low:g} to {high:,.0f} pods, not {half_life:g}")
    return half_life


class ShapeHistogram:
    """A decayed histogram of the shapes of observed pods (newest weigh most)."""

    def __init__(self, half_life: float = DEFAULT_HALF_LIFE) -> None:
        check_half_life(half_life)
        self._growth = 2 ** (1 / half_life)
        self._scale = 1.0
        self._weights: dict[Shape, float] = {}
        #: The weight of the shapes folded away (:data:`SHAPES_KEPT`), in the same scale.
        self._folded = 0.0
        #: Observations so far.
        self.observed = 0

    def observe(self, shape: Shape) -> None:
        """Count one pod of ``shape`` (its memory bucketed)."""
        key = shape._replace(memory=memory_bucket(shape.memory))
        self._weights[key] = self._weights.get(key, 0.0) + self._scale
        self._scale *= self._growth
        self.observed += 1
        if self._scale > 1e100:
            self._rescale()
        if len(self._weights) > SHAPES_KEPT:
            self._fold()

    def _rescale(self) -> None:
        floor = 1e-12
        self._weights = {s: w / self._scale for s, w in self._weights.items() if w / self._scale > floor}
        self._folded /= self._scale
        self._scale = 1.0

    def _fold(self) -> None:
        """Fold the lightest tenth of the shapes into the remainder."""
        ranked = sorted(self._weights.items(), key=lambda kv: (kv[1], kv[0]))
        cut = len(ranked) - SHAPES_KEPT * 9 // 10
        self._folded += sum(w for _, w in ranked[:cut])
        self._weights = dict(ranked[cut:])

    def weights(self) -> dict[Shape, float]:
        """Each shape's decayed weight relative to a pod seen now."""
        return {s: w / self._scale for s, w in self._weights.items()}

    def typical(self, coverage: float = COVERAGE) -> Workload:
        """The most frequent shapes covering ``coverage`` of the weight, at most
        :data:`TYPICAL_SHAPES` of them (EMPTY before any pod)."""
        ranked = sorted(self._weights.items(), key=lambda kv: (-kv[1], kv[0]))
        total = sum(w for _, w in ranked) + self._folded
        if total <= 0:
            return EMPTY
        kept: list[tuple[Shape, float]] = []
        covered = 0.0
        for shape, weight in ranked[:TYPICAL_SHAPES]:
            kept.append((shape, weight))
            covered += weight
            if covered >= coverage * total:
                break
        return Workload.of(kept)


# -- a pinned workload ----------------------------------------------------------------------------

_ENTRY_KEYS = frozenset({"cpu", "memory", "gpus", "gpuShare", "gpuModels", "aligned", "weight"})


def _positive_number(value: object, where: str) -> float:
    number = want_number(value, where)  # an integer too large for a float is out of range there
    if not 0 < number < math.inf:
        raise InvalidInput(f"{where}: want a positive number, got {value!r:.40}")
    return number


def _quantity(value: object, where: str, scale: int) -> int:
    if isinstance(value, bool) or value is None:
        raise InvalidInput(f"{where}: want a quantity such as '4', '500m' or '16Gi', got {value!r:.40}")
    amount: Fraction = parse_quantity(value, where)
    if amount < 0:
        raise InvalidInput(f"{where}: must not be negative")
    return math.ceil(amount * scale)


def _entry(raw: object, i: int) -> tuple[Shape, float]:
    where = f"fgd workload entry {i}"
    if not isinstance(raw, Mapping):
        raise InvalidInput(f"{where}: want a mapping with cpu, memory, gpus, gpuShare, weight")
    unknown = sorted(set(map(str, raw)) - _ENTRY_KEYS)
    if unknown:
        raise InvalidInput(f"{where}: unknown key {unknown[0]!r}; use {', '.join(sorted(_ENTRY_KEYS))}")
    cpu = _quantity(raw.get("cpu", 0), f"{where}.cpu", 1000)
    memory = _quantity(raw.get("memory", 0), f"{where}.memory", 1) >> 20
    gpus = raw.get("gpus", 0)
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0:
        raise InvalidInput(f"{where}.gpus: want a whole number >= 0, got {gpus!r:.40}")
    share = raw.get("gpuShare", 100)
    if isinstance(share, bool) or not isinstance(share, int) or not 1 <= share <= 100:
        raise InvalidInput(f"{where}.gpuShare: want a percentage of one GPU, 1..100, got {share!r:.40}")
    models = raw.get("gpuModels")
    if models is not None and (
        not isinstance(models, list) or not all(isinstance(m, str) and m for m in models)
    ):
        raise InvalidInput(f"{where}.gpuModels: want a list of model names")
    aligned = raw.get("aligned", False)
    if not isinstance(aligned, bool):
        raise InvalidInput(f"{where}.aligned: want true or false")
    if aligned and (cpu == 0 or cpu % 1000 or gpus == 0):
        raise InvalidInput(f"{where}.aligned: an aligned shape needs whole CPUs and at least one GPU")
    shape = Shape(
        cpu,
        memory,
        gpus,
        share * 10 if gpus else 0,
        tuple(m.upper() for m in models) if models else None,
        cpu // 1000 if aligned else 0,
    )
    return shape, _positive_number(raw.get("weight", 1), f"{where}.weight")


def parse_workload(data: object) -> Workload:
    """An operator's pinned workload: a list of shapes with weights (InvalidInput naming the entry)."""
    if not isinstance(data, list) or not data:
        raise InvalidInput("fgd workload: want a non-empty list of shapes")
    return Workload.of(_entry(raw, i) for i, raw in enumerate(data))


def pod_shape(
    requests: Iterable[ContainerDeviceRequest | None],
    use_types: tuple[str, ...] | None,
    cpu_mem: CpuMem,
    guaranteed: bool,
) -> Shape:
    """A pod's shape: its cpu/memory requests, its GPU ask, model rule and exclusive CPUs.

    A container's share is the larger of its cores and memory percentages (HAMi gives a GPU
    without either in full); the pod's GPU part is its largest container's. A Guaranteed pod
    with whole CPUs and a GPU gets exclusive CPUs from the static CPU manager, on its GPUs' NUMA
    node when kubelet aligns it: it is an aligned shape.
    """
    gpus = share = 0
    for request in requests:
        if request is None or request.nums <= 0:
            continue
        pct = request.mem_percentage_req if 0 < request.mem_percentage_req <= 100 else 0
        asked = max(min(request.coresreq, 100), pct) * 10 or WHOLE
        if request.memreq > 0 and request.coresreq <= 0 and not pct:
            asked = WHOLE  # an absolute memory request: its share depends on the card, count it whole
        if (request.nums, asked) > (gpus, share):
            gpus, share = request.nums, asked
    exclusive = cpu_mem.cpu // 1000 if guaranteed and gpus and cpu_mem.cpu % 1000 == 0 else 0
    return Shape(cpu_mem.cpu, cpu_mem.memory_mib_up, gpus, share, use_types if gpus else None, exclusive)
