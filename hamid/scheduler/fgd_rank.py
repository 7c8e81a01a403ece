"""The ``fgd`` policy's state: the learned typical workload and each node's fragmentation, memoised.

:class:`FgdRanker` learns the typical workload online from every pod the scheduler's cache sees
(CPU-only pods included; rebuilt by the cache's first list after a restart) unless an operator
pinned one, and ranks candidate nodes by how much fragmentation a pod removes there
(:mod:`hamid.fit.fgd`). Work is shared by node *state*: a node's :class:`~hamid.fit.fgd.NodeState`
is rebuilt only when its GPUs, CPU/memory or NUMA ledger change, and fragmentation and
placements are memoised on states, so equal nodes (every empty node of a kind) cost one
computation, and a filter recomputes only the nodes changed since the last pod of its shape.
"""

from __future__ import annotations

import bisect
import hashlib
import math
import time
from collections.abc import Iterable, Mapping
from typing import Any

from hamid.fit.fgd import (
    DEFAULT_HALF_LIFE,
    EMPTY,
    REPLICAS_SEEN,
    WHOLE,
    Gpu,
    NodeState,
    NumaRoom,
    Placement,
    Shape,
    ShapeHistogram,
    Use,
    Workload,
    backing_cpu,
    best_placement,
    fragmentation,
    gain_steps,
    pod_shape,
)
from hamid.fit.fit import PodFitSpec
from hamid.fit.node_room import CpuMem, is_guaranteed, pod_cpu_mem
from hamid.fit.numa_predict import NumaLedger, topology_of
from hamid.fit.usage import DeviceUsage, NodeUsage, PodUsage
from hamid.log import get_logger
from hamid.model import annotations as ann
from hamid.model import objects
from hamid.model import reasons as R
from hamid.model.devices import MODE_MIG
from hamid.model.errors import InvalidInput
from hamid.model.numa import NumaProfile
from hamid.model.resources import ResourceConfig, pod_requests
from hamid.scheduler.inventory import NodeEntry, NodeInventory
from hamid.scheduler.node_cpu_mem import NodeCpuMem
from hamid.scheduler.numa_ledger import NumaLedgers

log = get_logger("scheduler.fgd")

#: A memo's answer for a key it does not hold (None is an answer: no room).
_UNKNOWN = object()
#: Room of a node that publishes no allocatable cpu/memory: never short.
_UNBOUNDED = 1 << 62
#: Memoised fragmentations and placements kept before the memo starts afresh.
_MEMO_SIZE = 200_000
#: GPU sides of node states (:meth:`~hamid.fit.fgd.NodeState.gpu_side`) whose usable GPU room per
#: typical GPU part is kept across workload changes: the openb replay meets ~40,000 in all, bounded
#: (the memo keeps each alive: ~0.7 KiB).
_USES_SIZE = 50_000
#: The learned workload is refreshed after this share of the pods it was learned from (at least
#: :data:`_REFRESH_MIN` pods); a refresh that changes it invalidates every memo.
_REFRESH_SHARE = 0.1
_REFRESH_MIN = 1
#: Where a node stands among equal gain steps lies within this share of one step.
_TIE_SPAN = 0.5
#: A gain index re-sorts at once when more than 1/_BULK of its nodes changed.
_BULK = 8
#: Pod shapes whose placement a node keeps before it starts afresh.
_SHAPES_PER_NODE = 64
#: Gain indexes are kept for the most recently filtered shapes up to about this many node entries
#: in all (tens of MiB whatever the cluster's size; at 1,213 nodes 164 shapes, more than the openb
#: trace's 126 GPU shapes): a shape whose index was dropped is ranked afresh, every node at once.
_INDEX_ENTRIES = 200_000
#: Gain indexes kept on any cluster, however large.
_INDEXES_MIN = 16
#: A refreshed workload replaces the current one only when the two are more than this apart in
#: total variation distance (half the summed differences of the shapes' probabilities, a shape
#: in only one of them with its whole probability): about twice the sampling noise of a steady
#: workload learned over the default half-life, so noise alone does not re-rank every node every
#: few hundred pods.
_DRIFT = 0.05
#: The most frequent typical shapes a workload change's log line names.
_LOGGED_SHAPES = 5


def device_free(d: DeviceUsage, cordoned: frozenset[str]) -> int:
    """A GPU's free milli-GPU: the smaller of its free cores and memory shares; 0 when unusable."""
    if not d.health or d.mode == MODE_MIG or d.id in cordoned or d.used >= d.count:
        return 0
    if d.totalcore <= 0 or d.totalmem <= 0:
        return 0
    share = min((d.totalcore - d.usedcores) / d.totalcore, (d.totalmem - d.usedmem) / d.totalmem)
    return max(0, math.floor(WHOLE * share))


def numa_room(
    profile: NumaProfile | None,
    ledger: NumaLedger | None,
    resource: str,
    hidden: Mapping[int, int] | None = None,
    omitted: Mapping[int, int] | None = None,
) -> tuple[NumaRoom, ...] | None:
    """Free and assignable exclusive CPUs and free ``resource`` replicas kubelet sees (at most
    :data:`~hamid.fit.fgd.REPLICAS_SEEN`; less the ``hidden`` ones and those the plugin leaves out
    of its list, ``omitted``) by NUMA id from a node's profile and ledger (None: not aligning)."""
    if ledger is None or profile is None:
        return None
    if profile.policies.cpu_manager_policy != "static" or profile.policies.topology_manager_policy == "none":
        return None
    topo = topology_of(profile)
    free = ledger.free_cpus
    replicas = ledger.device_counts(resource)
    out = [NumaRoom(0, 0, 0)] * (max(profile.numa_nodes, default=-1) + 1)
    for numa, cpus in topo.cpus_of_numa.items():
        if 0 <= numa < len(out):
            assignable = cpus - profile.reserved_cpus
            seen = replicas.get(numa, (0, 0))[1] - (hidden or {}).get(numa, 0) - (omitted or {}).get(numa, 0)
            spare = min(max(seen, 0), REPLICAS_SEEN)
            out[numa] = NumaRoom(len(assignable & free), len(assignable), spare)
    return tuple(out)


class FgdRanker:
    """The typical workload and memoised fragmentation of every node (event-loop owned).

    A node's state and its placements are kept until the node changes: its GPU usage or
    registration (the inventory's change log), its CPU/memory room or its NUMA ledger (their
    ``on_change`` hooks mark it).
    """

    def __init__(
        self,
        config: ResourceConfig,
        inventory: NodeInventory,
        numa: NumaLedgers,
        cpu_mem: NodeCpuMem,
        pinned: Workload | None = None,
        half_life: float = DEFAULT_HALF_LIFE,
    ) -> None:
        self.config = config
        self.inventory = inventory
        self.numa = numa
        self.cpu_mem = cpu_mem
        self.pinned = pinned
        self.histogram = ShapeHistogram(half_life)
        self._half_life = half_life
        self._seen: set[str] = set()
        self._workload = pinned or EMPTY
        self._learned_at = 0
        #: Grows whenever the workload (and so every memo) changes.
        self.epoch = 0
        self._inventory_seq = inventory.seq
        self._dirty: set[str] = set()
        self._states: dict[str, NodeState] = {}
        #: Each distinct current node state, as the one object every node in it holds, with those
        #: nodes (dropped with its last node): a full re-rank judges each state once and hands the
        #: answer to its nodes.
        self._members: dict[NodeState, tuple[NodeState, set[str]]] = {}
        self._placed: dict[str, dict[Shape, Placement | None]] = {}
        #: Fragmentation under the current workload by GPU side and CPU/memory levels
        #: (:meth:`~hamid.fit.fgd.Workload.levels`), or, below the CPU that backs every typical
        #: share's pods in full (:func:`~hamid.fit.fgd.backing_cpu`, per GPU side in ``_backing``),
        #: by GPU side, free CPU and memory level: all it depends on, so states no typical shape
        #: tells apart share it.
        self._frag: dict[tuple[object, ...], float] = {}
        self._backing: dict[tuple[object, ...], int] = {}
        #: What each typical GPU part can use on a state's GPU side: independent of the workload's
        #: weights and of the node's CPU and memory, so kept when the workload moves (its
        #: fragmentation is then one weighted sum) and shared by states differing only in those.
        self._uses: dict[tuple[object, ...], dict[int, Use]] = {}
        self._placements: dict[tuple[NodeState, Shape], Placement | None] = {}
        #: Per pod shape, the candidates ranked by gain (re-keyed only for nodes changed since),
        #: the least recently used first.
        self._indexes: dict[Shape, GainIndex] = {}
        self._ties: dict[str, float] = {}
        #: Gain indexes re-keyed in bulk (a new shape, a new workload, many nodes changed) and the
        #: time they took: the filter's costly step (``hamid_fgd_reranks_total``).
        self.reranks = 0
        self.rerank_seconds = 0.0
        #: Whether the policy is in use: it ranked a pod, or the operator pinned its workload (the
        #: fragmentation gauges appear only then).
        self.ranked = pinned is not None
        numa.on_change = cpu_mem.on_change = self.forget_node

    # -- the workload ----------------------------------------------------------------------------

    def shape_of(self, pod: Mapping[str, Any], spec: PodFitSpec | None = None) -> Shape:
        """A pod's FGD shape (InvalidInput for requests the scheduler cannot read)."""
        requests = spec.requests if spec is not None else pod_requests(pod, self.config)
        if spec is not None:
            use_types = spec.policy.use_types
        else:
            raw = ann.parse_type_list(objects.annotations(pod).get(ann.USE_GPU_TYPE), ann.USE_GPU_TYPE)
            use_types = None if raw is None else tuple(t.upper() for t in raw)
        return pod_shape(requests, use_types, pod_cpu_mem(pod), is_guaranteed(pod))

    def observe(self, pod: Mapping[str, Any]) -> None:
        """Learn a pod the cache shows (once per pod; a pod with unreadable requests is skipped)."""
        uid = objects.uid(pod)
        if not uid or uid in self._seen:
            return
        try:
            shape = self.shape_of(pod)
        except InvalidInput:
            return
        self._seen.add(uid)
        self.learn(shape)

    def learn(self, shape: Shape) -> None:
        """Count one pod's shape, and refresh the learned workload when its turn has come (once
        the policy is in use: a cluster that never ranks with ``fgd`` only counts)."""
        self.histogram.observe(shape)
        if self.ranked:
            self._refresh()

    def _use(self) -> None:
        """The policy ranks: from now on the workload is refreshed as pods come, the first time now."""
        if not self.ranked:
            self.ranked = True
            self._refresh()

    def forget(self, pod: Mapping[str, Any]) -> None:
        """A pod is gone (its weight stays in the histogram, decaying)."""
        self._seen.discard(objects.uid(pod))

    @property
    def workload(self) -> Workload:
        """The typical workload the ranking uses (pinned, or the learned one as last refreshed)."""
        return self._workload

    def _refresh(self) -> None:
        """Refresh the learned workload after every :data:`_REFRESH_SHARE` of the pods it was learned
        from (a point in the stream of pods, whenever filters come); a refreshed workload far
        enough from the one in use replaces it, and every memo and gain index starts afresh (a
        pinned workload is never replaced)."""
        observed = self.histogram.observed
        due = max(_REFRESH_MIN, _REFRESH_SHARE * min(observed, self._half_life))
        if self.pinned is not None or observed - self._learned_at < due:
            return
        self._learned_at = observed
        fresh = self.histogram.typical()
        distance = _distance(fresh, self._workload)
        if distance > _DRIFT:
            self._learned(fresh, distance)
            self._workload = fresh
            self.epoch += 1
            self._placed.clear()
            self._frag.clear()
            self._backing.clear()
            self._placements.clear()
            self._indexes.clear()

    def _learned(self, fresh: Workload, distance: float) -> None:
        """Log a change of the typical workload: every memo and gain index starts afresh."""
        top = sorted(fresh.shapes, key=lambda entry: -entry[1])[:_LOGGED_SHAPES]
        log.info(
            "fgd_workload_changed",
            epoch=self.epoch + 1,
            pods_learned=self.histogram.observed,
            distance=round(distance, 3),
            shapes=len(fresh.shapes),
            top=[f"{shape_text(shape)}: {p:.1%}" for shape, p in top],
        )

    def cluster(self) -> tuple[float, int, int]:
        """The registered nodes' summed fragmentation under the workload in use (milli-GPU), their
        idle milli-GPU, and how many distinct node states they are in."""
        self.sync()
        frag, idle, states = 0.0, 0, 0
        for state, names in self.groups(self.inventory.nodes):
            frag += self.fragmentation(state) * len(names)
            idle += sum(state.frees) * len(names)
            states += 1
        return frag, idle, states

    # -- nodes -----------------------------------------------------------------------------------

    def sync(self) -> None:
        """Forget the kept state of every node changed since the last call."""
        inventory = self.inventory
        if inventory.seq != self._inventory_seq:
            changed = inventory.changed_since(self._inventory_seq, len(self._states) + 1)
            if changed is None:
                self._states.clear()
                self._members.clear()
                self._placed.clear()
                self._indexes.clear()
            else:
                self._dirty.update(changed)
            self._inventory_seq = inventory.seq
        for name in self._dirty:
            self._leave(name)
            self._placed.pop(name, None)
        for index in self._indexes.values():
            index.dirty |= self._dirty
        self._dirty.clear()

    def _leave(self, name: str) -> None:
        """Forget a node's state (it changed or went)."""
        state = self._states.pop(name, None)
        if state is not None:
            members = self._members[state][1]
            members.discard(name)
            if not members:
                del self._members[state]

    def groups(self, nodes: Mapping[str, NodeEntry]) -> Iterable[tuple[NodeState, set[str]]]:
        """Each current state of the registered ``nodes`` with the nodes in it (the states of
        changed nodes rebuilt; call :meth:`sync` first). A live view: do not change a node meanwhile."""
        states = self._states
        for name in states.keys() - nodes.keys():
            self._leave(name)
        for name in nodes.keys() - states.keys():
            self.node_state(name, nodes[name])
        return self._members.values()

    def ties(self, nodes: Mapping[str, NodeEntry]) -> Mapping[str, float]:
        """:meth:`tie` of every registered node (the memo then holds all of them)."""
        ties = self._ties
        missing = nodes.keys() - ties.keys()
        if len(ties) + len(missing) > _MEMO_SIZE:
            ties.clear()
            missing = set(nodes)
        for name in missing:
            ties[name] = tie_order(name)
        return ties

    def index_capacity(self) -> int:
        """How many gain indexes are kept at the cluster's size (the least recently used goes)."""
        return max(_INDEXES_MIN, _INDEX_ENTRIES // max(len(self.inventory.nodes), 1))

    def index(self, shape: Shape) -> GainIndex:
        """The gain index of ``shape`` over every registered node (made on first use; the least
        recently used index goes first when there are too many)."""
        indexes = self._indexes
        index = indexes.pop(shape, None)
        if index is None:
            while len(indexes) >= self.index_capacity():
                del indexes[next(iter(indexes))]
            index = GainIndex(self.inventory.nodes)
        indexes[shape] = index  # the most recently used last
        return index

    def ranking(self, shape: Shape, nodes: Mapping[str, NodeEntry]) -> GainIndex:
        """The gain index of ``shape`` brought up to date: the nodes changed since its last use
        re-keyed (every node for a new shape or after a workload change: the costly step)."""
        self._use()
        self.sync()
        index = self.index(shape)
        index.refresh(self, shape, nodes)
        return index

    def rank(self, name: str, gain: float) -> float:
        """A node's rank for a pod whose best placement there gains ``gain``: its whole gain steps
        (:func:`~hamid.fit.fgd.gain_steps`), then its fixed place among equal steps."""
        return gain_steps(gain) + self.tie(name)

    def tie(self, name: str) -> float:
        """The node's fixed place among equal gain steps (:func:`tie_order`, memoised)."""
        tie = self._ties.get(name)
        if tie is None:
            if len(self._ties) >= _MEMO_SIZE:
                self._ties.clear()
            tie = self._ties[name] = tie_order(name)
        return tie

    def node_state(self, name: str, entry: NodeEntry) -> NodeState:
        """The node's state, rebuilt only when it changed (call :meth:`sync` first)."""
        state = self._states.get(name)
        if state is None:
            numa = self.numa.nodes.get(name)
            ledger = numa.ledger if numa is not None else None
            state = self._state_of(name, entry.usage, self.cpu_mem.room(name), ledger)
            group = self._members.get(state)
            if group is None:
                self._members[state] = (state, {name})
            else:
                state = group[0]
                group[1].add(name)
            self._states[name] = state
        return state

    def own_state(self, name: str, entry: NodeEntry, uid: str, release: PodUsage) -> NodeState:
        """The node's state as a pod filtered again sees it: its own booking there (GPUs
        ``release``, CPU and memory, NUMA) free, as HAMi's policies score its own node (not kept)."""
        usage = entry.usage.copy()
        usage.remove(release)
        numa = self.numa.nodes.get(name)
        ledger = NumaLedgers.ledger_without(numa, uid) if numa is not None else None
        return self._state_of(name, usage, self.cpu_mem.room(name, without=uid), ledger)

    def _state_of(
        self, name: str, usage: NodeUsage, room: CpuMem | None, ledger: NumaLedger | None
    ) -> NodeState:
        """A state of node ``name`` from its GPUs, CPU/memory room and NUMA ledger."""
        gpus = (Gpu(device_free(d, usage.cordoned), d.numa, d.type.upper()) for d in usage.candidates)
        room = room or CpuMem(_UNBOUNDED, _UNBOUNDED << 20)
        numa = self.numa
        entry = numa.nodes.get(name)
        profile = entry.profile if entry is not None else None
        rooms = numa_room(profile, ledger, numa.resource, numa.hidden(name, usage), numa.omitted(name, usage))
        return NodeState.of(
            room.cpu,
            room.memory_mib,
            gpus,
            rooms,
            hide=numa.hide_rule(name),
            rejects_unpreferred=rooms is not None
            and profile is not None
            and profile.policies.rejects_unpreferred,
        )

    def forget_node(self, name: str) -> None:
        """A node went, or its CPU/memory room or NUMA ledger changed: forget what is kept of it
        (nothing is kept before the policy first ranks: then no name piles up)."""
        if self.ranked:
            self._dirty.add(name)

    def fragmentation(self, state: NodeState) -> float:
        """The state's fragmentation under the current workload (memoised)."""
        side = state.gpu_side()
        uses = self._uses.get(side)
        if uses is None:
            if len(self._uses) >= _USES_SIZE:
                self._uses.clear()
                self._backing.clear()
            uses = self._uses[side] = {}
        backing = self._backing.get(side)
        if backing is None:
            backing = self._backing[side] = backing_cpu(state, self._workload, uses)
        levels = self._workload.levels(state.cpu, state.memory)
        key = (side, levels) if state.cpu >= backing else (side, state.cpu, levels[1])
        value = self._frag.get(key)
        if value is None:
            if len(self._frag) >= _MEMO_SIZE:
                self._frag.clear()
            value = self._frag[key] = fragmentation(state, self._workload, uses)
        return value

    def placement(self, name: str, state: NodeState, shape: Shape) -> Placement | None:
        """Where ``shape`` removes the most fragmentation on node ``name`` in ``state`` (memoised per
        node until it changes, and per state: equal nodes share it)."""
        per_node = self._placed.get(name)
        if per_node is None:
            per_node = self._placed[name] = {}
        elif shape in per_node:
            return per_node[shape]
        placed = self.state_placement(state, shape)
        if len(per_node) >= _SHAPES_PER_NODE:
            per_node.clear()
        per_node[shape] = placed
        return placed

    def state_placement(self, state: NodeState, shape: Shape) -> Placement | None:
        """Where ``shape`` removes the most fragmentation in ``state`` (memoised per state)."""
        key = (state, shape)
        placed = self._placements.get(key, _UNKNOWN)
        if placed is not _UNKNOWN:
            return placed  # type: ignore[return-value]
        if len(self._placements) >= _MEMO_SIZE:
            self._placements.clear()
        placed = self._placements[key] = best_placement(state, shape, self.fragmentation)
        return placed

    def best_on(self, entry: NodeEntry, shape: Shape) -> Placement | None:
        """The pod's best placement on one node (the ``fgd`` GPU choice under another node policy)."""
        self._use()
        self.sync()
        return self.placement(entry.name, self.node_state(entry.name, entry), shape)

    def preferred(self, entry: NodeEntry, placement: Placement | None) -> tuple[str, ...]:
        """The device ids of a placement, in the order the fit should try them."""
        if placement is None:
            return ()
        candidates = entry.usage.candidates
        return tuple(candidates[i].id for i in placement.gpus if i < len(candidates))


def tie_order(name: str) -> float:
    """A node's fixed place among equal gain steps, in ``[0, _TIE_SPAN)``: a hash of its name.

    The order is pseudo-random, so equal nodes fill one after another (first fit in one order,
    the paper simulator's tie rule, which keeps whole nodes free for large pods) without
    favouring a kind of node by its name, and it is the same on every replica and after a restart.
    """
    digest = hashlib.blake2b(name.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 * _TIE_SPAN


def _distance(a: Workload, b: Workload) -> float:
    """The total variation distance between two workloads (half the summed differences of the
    shapes' probabilities; a shape in only one of them counts with its whole probability)."""
    pa, pb = dict(a.shapes), dict(b.shapes)
    return sum(abs(pa.get(s, 0.0) - pb.get(s, 0.0)) for s in pa.keys() | pb.keys()) / 2


def shape_text(shape: Shape) -> str:
    """A shape as an operator reads it in a log: CPUs, memory, GPUs and share, model rule, pinning."""
    text = f"{shape.cpu / 1000:g} CPU, {shape.memory} MiB"
    if shape.gpus:
        share = "" if shape.share >= WHOLE else f" x {shape.share / WHOLE:.0%}"
        text += f", {shape.gpus} GPU{share}"
    if shape.models:
        text += f" ({'|'.join(shape.models)})"
    if shape.exclusive:
        text += f", {shape.exclusive} exclusive CPUs"
    return text


class GainIndex:
    """One pod shape's registered nodes ranked by fragmentation gain, ascending, kept between filters.

    The rank is the gain in whole steps plus the node's fixed place among equal steps
    (:meth:`FgdRanker.rank`), so near-equal gains go to one node at a time in one fixed order (a
    plan walks no group of equal nodes) and the ranking does not depend on which candidates
    kube-scheduler sends (a sample of the nodes, in a rotating order). Only the nodes changed
    since (``dirty``) are re-keyed; many at once (a new index, a new workload) are sorted in one
    go. Nodes short of CPU or memory for the shape are kept apart with kube-scheduler's reason.
    """

    __slots__ = ("dirty", "gain", "keys", "rank", "short")

    def __init__(self, nodes: Iterable[str]) -> None:
        self.keys: list[tuple[float, str]] = []
        self.rank: dict[str, float] = {}
        self.gain: dict[str, float] = {}
        self.short: dict[str, str] = {}
        self.dirty: set[str] = set(nodes)

    def refresh(self, ranker: FgdRanker, shape: Shape, nodes: Mapping[str, NodeEntry]) -> None:
        """Re-key the changed nodes (the ranker synced first)."""
        if len(self.dirty) * _BULK > len(self.rank):
            self._rebuild(ranker, shape, nodes)
            return
        keys, rank = self.keys, self.rank
        for name in self.dirty:
            old = rank.pop(name, None)
            self.gain.pop(name, None)
            if old is not None:
                del keys[bisect.bisect_left(keys, (old, name))]
            self.short.pop(name, None)
            entry = nodes.get(name)
            if entry is None:
                continue
            state = ranker.node_state(name, entry)
            reason = _short(shape, state)
            if reason is not None:
                self.short[name] = reason
                continue
            placed = ranker.placement(name, state, shape)
            self.gain[name] = gain = -math.inf if placed is None else placed.gain
            rank[name] = new = ranker.rank(name, gain)
            bisect.insort(keys, (new, name))
        self.dirty.clear()

    def _rebuild(self, ranker: FgdRanker, shape: Shape, nodes: Mapping[str, NodeEntry]) -> None:
        """Re-key many nodes and sort once (a new index, a new workload): each distinct state is
        judged once and its answer handed to its nodes (every empty node of a kind shares one
        placement and one gain step; only their fixed places among equal steps differ: the same
        ranks as one node at a time)."""
        started = time.perf_counter()
        rank, gains, short, dirty = self.rank, self.gain, self.short, self.dirty
        every = dirty >= nodes.keys()
        if every:
            rank.clear()
            gains.clear()
            short.clear()
        else:
            for name in dirty:
                rank.pop(name, None)
                gains.pop(name, None)
                short.pop(name, None)
        groups = ranker.groups(nodes)
        ties = ranker.ties(nodes)
        for state, members in groups:
            names = members if every else members & dirty
            if not names:
                continue
            reason = _short(shape, state)
            if reason is not None:
                short.update(dict.fromkeys(names, reason))
                continue
            placed = ranker.state_placement(state, shape)
            gain = -math.inf if placed is None else placed.gain
            steps = gain_steps(gain)
            gains.update(dict.fromkeys(names, gain))
            rank.update({name: steps + ties[name] for name in names})
        self.keys = sorted(zip(rank.values(), rank.keys(), strict=True))
        dirty.clear()
        ranker.reranks += 1
        ranker.rerank_seconds += time.perf_counter() - started


def _short(shape: Shape, state: NodeState) -> str | None:
    """kube-scheduler's reason when the node lacks the shape's CPU or memory; None: enough."""
    if shape.cpu > state.cpu:
        return R.INSUFFICIENT_CPU
    if shape.memory > state.memory:
        return R.INSUFFICIENT_MEMORY
    return None


def fgd_ranked(
    ranker: FgdRanker,
    shape: Shape,
    position: Mapping[str, int],
    nodes: Mapping[str, NodeEntry],
    own: str | None,
    failed: dict[str, str],
    uid: str,
    release: PodUsage,
) -> tuple[list[tuple[float, str]], dict[str, Placement]]:
    """``(rank, name)`` ascending for the registered nodes (the index's live list: do not mutate;
    the plan skips non-candidates), and the placement on ``own`` (the pod's booked node, if any),
    judged with the pod's own booking there free (:meth:`FgdRanker.own_state`; ``release``: its
    GPU usage), so a retry after a failed bind keeps the node the first filter chose.

    A candidate short of CPU or memory for the pod gets kube-scheduler's reason in ``failed`` (not
    ``own``, whose own request counts there); one where FGD finds no GPU room ranks last, so the
    fit still gives its reason. Only the nodes changed since this shape's last filter are
    recomputed (:class:`GainIndex`).
    """
    index = ranker.ranking(shape, nodes)
    for name, reason in index.short.items():
        if name != own and name in position:
            failed[name] = reason
    placements: dict[str, Placement] = {}
    entry = nodes.get(own) if own is not None else None
    if own is not None and entry is not None:
        state = ranker.own_state(own, entry, uid, release)
        placed = ranker.state_placement(state, shape)
        if placed is not None:
            placements[own] = placed
    return index.keys, placements


def fgd_cpu_only(
    ranker: FgdRanker,
    shape: Shape,
    position: Mapping[str, int],
    unregistered: tuple[str, ...],
    nodes: Mapping[str, NodeEntry],
) -> list[str]:
    """Where a CPU-only pod adds the least fragmentation: the candidates without hamid's GPUs
    (``unregistered``: nothing to strand, kube-scheduler's scoring chooses among them), else the
    one registered candidate with the best gain (ties in the nodes' fixed order, as for a GPU
    pod: equal nodes are filled one at a time, not spread, which would eat the CPUs every node
    keeps for the typical GPU pods).

    kube-scheduler's NodeResourcesFit has already passed every candidate; one hamid sees short of
    CPU or memory (a pod it just placed there, not yet in kube-scheduler's cache) is dropped
    unless no candidate is left. Read from the shape's :class:`GainIndex`: only the nodes changed
    since are recomputed.
    """
    if unregistered:
        return sorted(unregistered, key=position.__getitem__)
    index = ranker.ranking(shape, nodes)
    for _, name in reversed(index.keys):
        if name in position:
            return [name]
    return sorted(position, key=position.__getitem__)
