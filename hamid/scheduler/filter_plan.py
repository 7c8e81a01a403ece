"""The ``/filter`` plan, pure over the state: which node (and GPUs) a pod gets, and why not elsewhere.

:class:`Planner` walks the state's score index (best-first, work proportional to the nodes ahead of
the winner), predicts kubelet's NUMA choice on the nodes it fits (:class:`NumaFit`) and returns a
:class:`Plan`; nothing changes (the reserve step, :mod:`hamid.scheduler.filter_reserve`, books it).
A node whose free room cannot hold the pod at all only gives its failure reason, memoised per
request shape until the node's usage changes, so a pod that fits nowhere costs a lookup per node
instead of a fit.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import NamedTuple

from hamid.fit.fgd import Placement, Shape
from hamid.fit.fit import Fitted, PodFitSpec, Quota, Unfit, fit_pod, room_needed
from hamid.fit.numa_fit import follows_booking, numa_targets, offered_targets, pod_shape
from hamid.fit.numa_predict import Outcome, Prediction
from hamid.fit.policy import BINPACK, FGD, best_first
from hamid.fit.usage import PodUsage
from hamid.log import get_logger
from hamid.model import objects
from hamid.model import reasons as R
from hamid.model.alignment import AlignmentMode, parse_alignment
from hamid.model.errors import InvalidInput
from hamid.model.kube import JSON
from hamid.model.numa import STEERING_RULES
from hamid.model.resources import ResourceConfig
from hamid.scheduler.bind_backoff import BindBackoff
from hamid.scheduler.fgd_rank import FgdRanker, fgd_cpu_only, fgd_ranked
from hamid.scheduler.inventory import NodeEntry
from hamid.scheduler.ledger import Ledger, Reservation
from hamid.scheduler.numa_ledger import NumaLedgers

log = get_logger("scheduler")

#: After a best-effort fit off the predicted NUMA node, how many more nodes the filter tries for
#: an aligned fit before taking it (a fallback scores below any aligned fit, within this window).
_FALLBACK_LOOKAHEAD = 4
#: Request shapes given an id for the failure-reason memo before the ids start afresh.
_SHAPE_IDS = 1024
#: No-fit answers kept (one per request shape) before they are dropped.
_NO_FITS = 64
#: Nodes changed since a no-fit answer that are re-judged on their own; more: a full walk.
_NO_FIT_PATCH = 256

#: ``prefer(node)``: the device ids a fit tries first there (the ``fgd`` GPU choice).
Prefer = Callable[[NodeEntry], tuple[str, ...]]


class Plan(NamedTuple):
    """What :meth:`Planner.plan` chose: the node and its fit (None: nothing fits), and why the
    other candidates failed (node name -> HAMi's reason)."""

    node: str | None
    fitted: Fitted | None
    failed: dict[str, str]


@dataclass(slots=True)
class NumaFit:
    """One filter's NUMA context: the pod, its memo shape and mode, and each node's prediction."""

    pod: JSON
    uid: str
    shape: Hashable
    mode: AlignmentMode
    predictions: dict[str, Prediction | None] = dataclass_field(default_factory=dict)

    @classmethod
    def of(cls, pod: JSON, uid: str) -> NumaFit:
        """The context of ``pod`` (its alignment mode was validated at admission; invalid: none)."""
        try:
            mode = parse_alignment(objects.annotations(pod))
        except InvalidInput:
            mode = AlignmentMode.NONE
        return cls(pod, uid, pod_shape(pod), mode)

    def predict(self, ledgers: NumaLedgers, entry: NodeEntry) -> Prediction | None:
        """The prediction on ``entry``'s node (None: no ledger), kept for the patch and the log."""
        node = entry.name
        try:
            prediction = ledgers.predict(node, self.pod, self.shape, self.uid, entry.usage)
        except InvalidInput as exc:  # a pod the predictor cannot read keeps today's behaviour
            log.info("numa_predict_refused", node=node, error=str(exc))
            prediction = None
        self.predictions[node] = prediction
        return prediction

    def resolve(self, ledgers: NumaLedgers, entry: NodeEntry, fitted: Fitted) -> None:
        """An unknown prediction once the GPUs are fitted: on a node where hamid's plugin offers
        kubelet ``GetPreferredAllocation``, the fitted GPUs are its choice, so kubelet's replicas
        follow them; a definite placement then replaces the unknown (recorded and booked)."""
        resolved = ledgers.predict_chosen(entry.name, self.pod, self.uid, fitted.devices, entry.usage)
        if resolved is not None and resolved.outcome is Outcome.PLACED:
            self.predictions[entry.name] = resolved


@dataclass(frozen=True, slots=True)
class _Candidates:
    """A candidate list with its positions and unregistered names, for one node membership."""

    names: tuple[str, ...]
    membership: int
    position: Mapping[str, int]
    unregistered: tuple[str, ...]


@dataclass(slots=True)
class _Walk:
    """One plan's progress: failed-node reasons and a best-effort fit awaiting aligned ones."""

    failed: dict[str, str]
    fallback: tuple[str, Fitted] | None = None
    after_fallback: int = 0
    #: Nodes fitted for real (not merely passed over for their room).
    fits: int = 0

    def tried(self, name: str, result: Fitted | Unfit, aligned: bool) -> tuple[str, Fitted] | None:
        """Note one node's fit; the winner once known (an aligned fit, or the fallback's window ended)."""
        self.fits += 1
        if not isinstance(result, Fitted):
            self.failed[name] = result.reason
        elif aligned:
            return name, result
        elif self.fallback is None:
            self.fallback = (name, result)
        return self._counted()

    def passed(self, name: str, reason: str) -> tuple[str, Fitted] | None:
        """Note a node passed over for its room (``reason``); the fallback once its window ended."""
        self.failed[name] = reason
        return self._counted()

    def _counted(self) -> tuple[str, Fitted] | None:
        if self.fallback is not None:
            self.after_fallback += 1
            if self.after_fallback > _FALLBACK_LOOKAHEAD:
                return self.fallback
        return None


@dataclass(slots=True)
class _NoFit:
    """The answer for a request shape that fits no candidate by room alone, kept while valid.

    Valid for the same candidates (and node membership) until a node's health may flip by the
    clock (``flips_at``); nodes changed since ``seq`` (inventory changes) are re-judged on their
    own, and any of them with room for the pod makes a full walk.
    """

    candidates: _Candidates
    seq: int
    flips_at: float
    failed: dict[str, str]


class ColdReasons(Exception):
    """A plan met more nodes without a memoised capacity reason than it may fit in one step."""

    def __init__(self, entries: list[NodeEntry], shape: int, quota: Quota | None) -> None:
        super().__init__(f"{len(entries)} capacity reasons to compute")
        self.entries = entries
        self.shape = shape
        self.quota = quota


class Planner:
    """Plans ``/filter`` over one scheduler's ledger, NUMA ledgers and ``fgd`` ranker (changes nothing
    but its own memos: candidate positions, request-shape ids, no-fit answers)."""

    def __init__(
        self,
        ledger: Ledger,
        ledgers: NumaLedgers,
        fgd: FgdRanker,
        backoff: BindBackoff,
        config: ResourceConfig,
    ) -> None:
        self.ledger = ledger
        self.ledgers = ledgers
        self.fgd = fgd
        self.backoff = backoff
        self.config = config
        self._candidates: _Candidates | None = None
        self._shape_ids: dict[tuple[PodFitSpec, Quota | None], int] = {}
        self._next_shape = itertools.count()
        self._no_fit: dict[int, _NoFit] = {}

    def plan(
        self,
        pod: JSON,
        spec: PodFitSpec,
        names: tuple[str, ...],
        numa: NumaFit | None = None,
        cold_fits: int | None = None,
    ) -> Plan:
        """Choose a node for ``pod`` among ``names`` (pure over the state; nothing changes).

        The node fitting every candidate and picking the best would choose (best node score for
        the policy, ties to the earliest candidate), found best-first from the score index; a
        node whose room is below the pod's need only gives its (memoised) capacity reason. When
        nothing fits every candidate gets HAMi's reason; else the unregistered ones and those
        fitted before the winner. With ``numa`` each node fitted is first predicted (:meth:`_fit`):
        a fit off the predicted NUMA node wins only if no aligned fit follows within
        :data:`_FALLBACK_LOOKAHEAD` nodes. Past ``cold_fits`` reasons to compute: :class:`ColdReasons`.
        """
        uid = objects.uid(pod)
        ledger = self.ledger
        previous = ledger.reservation(uid)
        quota = ledger.fit_quota(objects.namespace(pod), exclude_uid=uid)
        nodes = ledger.nodes
        now = ledger.clock()
        position, unregistered = self._positions(names)
        need = room_needed(spec)
        shape = self._shape_id(spec, quota)
        if previous is None:
            known = self._no_fit_answer(shape, spec, quota, need, position, now)
            if known is not None:
                return Plan(None, None, known)
        walk = _Walk(self._unregistered_reasons(unregistered))
        # A re-filtered pod sees its own booking on its node as free: that node's score differs
        # from the index's, so it is ranked on its own.
        own: tuple[float, str] | None = None
        if previous is not None and previous.node in position and previous.node in nodes:
            own = (nodes[previous.node].usage.score(previous.applied), previous.node)
        passed: list[NodeEntry] = []  # best-first; only their reasons are needed when nothing fits
        backing_off = self.backoff.active(now, nodes)
        judged = len(walk.failed)
        release = previous.applied if own is not None and previous is not None else {}
        ranked, node_policy, own, prefer = self._ordering(pod, spec, position, own, release, walk.failed)
        # nodes short of CPU/memory for this pod say nothing about its GPU shape: not memoised
        memo = len(walk.failed) == judged
        for group in best_first(ranked, node_policy, position, own):
            tries = _triage(group, nodes, now, backing_off, own, need, walk.failed, passed)
            for entry in tries:
                won = walk.tried(entry.name, *self._fit(entry, spec, quota, previous, numa, prefer))
                if won is not None:
                    return Plan(won[0], won[1], walk.failed)
        if cold_fits is not None:
            cold = [entry for entry in passed if shape not in entry.unfit]
            if len(cold) > cold_fits:
                raise ColdReasons(cold, shape, quota)
        won = self._passed(passed, walk, shape, spec, quota, previous, numa, prefer)
        if won is not None:
            return Plan(won[0], won[1], walk.failed)
        won = self._backing_off(backing_off, position, walk, spec, quota, previous, numa, prefer)
        if won is not None:
            return Plan(won[0], won[1], walk.failed)
        if walk.fallback is not None:
            return Plan(walk.fallback[0], walk.fallback[1], walk.failed)
        if walk.fits == 0 and previous is None and memo and self._candidates is not None:
            self._remember_no_fit(shape, walk.failed, now)
        return Plan(None, None, walk.failed)

    def _ordering(
        self,
        pod: JSON,
        spec: PodFitSpec,
        position: Mapping[str, int],
        own: tuple[float, str] | None,
        release: PodUsage,
        failed: dict[str, str],
    ) -> tuple[list[tuple[float, str]], str, tuple[float, str] | None, Prefer | None]:
        """The ranking a plan walks, its direction, the own node's rank and the GPU order, per policy.

        HAMi's policies walk the score index; ``fgd`` walks the candidates by fragmentation gain
        (highest first; nodes short of CPU or memory get kube-scheduler's reason in ``failed``;
        the own node judged with the pod's booking there, ``release``, free) and, as GPU policy,
        tries first the GPUs where the pod removes the most fragmentation.
        """
        policy = spec.policy
        fgd_node, fgd_gpu = policy.node_policy == FGD, policy.gpu_policy.value == FGD
        if not (fgd_node or fgd_gpu):
            return self.ledger.ranked(), policy.node_policy, own, None
        try:
            shape = self.fgd.shape_of(pod, spec)
        except InvalidInput:  # unreadable cpu/memory (kube-scheduler refuses such pods): pack
            return self.ledger.ranked(), BINPACK if fgd_node else policy.node_policy, own, None
        ranked, node_policy = self.ledger.ranked(), policy.node_policy
        placements: dict[str, Placement] = {}
        if fgd_node:
            own_name = own[1] if own is not None else None
            ranked, placements = fgd_ranked(
                self.fgd, shape, position, self.ledger.nodes, own_name, failed, objects.uid(pod), release
            )
            node_policy = BINPACK  # highest gain first
            if own is not None:
                gain = placements[own[1]].gain if own[1] in placements else -math.inf
                own = (self.fgd.rank(own[1], gain), own[1])
        return ranked, node_policy, own, self._gpu_order(shape, placements) if fgd_gpu else None

    def cpu_only(self, pod: JSON, spec: PodFitSpec, names: tuple[str, ...]) -> list[str] | None:
        """Under the ``fgd`` node policy, where a pod without GPUs strands the least GPU
        (:func:`~hamid.scheduler.fgd_rank.fgd_cpu_only`); None: every candidate (another node
        policy, or cpu/memory requests kube-scheduler would refuse anyway)."""
        if spec.policy.node_policy != FGD or not names:
            return None
        try:
            shape = self.fgd.shape_of(pod, spec)
        except InvalidInput:
            return None
        position, unregistered = self._positions(names)
        return fgd_cpu_only(self.fgd, shape, position, unregistered, self.ledger.nodes)

    def _gpu_order(self, shape: Shape, placements: Mapping[str, Placement]) -> Prefer:
        """The ``fgd`` GPU order on a node: the GPUs of its best placement first."""
        fgd = self.fgd

        def prefer(entry: NodeEntry) -> tuple[str, ...]:
            placed = placements.get(entry.name)
            return fgd.preferred(entry, placed if placed is not None else fgd.best_on(entry, shape))

        return prefer

    def _remember_no_fit(self, shape: int, failed: dict[str, str], now: float) -> None:
        """Keep a no-fit answer reached by room alone (no node fitted) for the next retry."""
        if len(self._no_fit) >= _NO_FITS:
            self._no_fit.clear()
        inventory = self.ledger.inventory
        assert self._candidates is not None
        self._no_fit[shape] = _NoFit(self._candidates, inventory.seq, inventory.health_flips_at(now), failed)

    def _no_fit_answer(
        self,
        shape: int,
        spec: PodFitSpec,
        quota: Quota | None,
        need: tuple[int, int, int],
        position: Mapping[str, int],
        now: float,
    ) -> dict[str, str] | None:
        """The kept no-fit answer of ``shape``, brought up to date; None when a walk is needed.

        Only the nodes changed since the answer are judged again; one that may now have room
        (or more than :data:`_NO_FIT_PATCH` changes, or a health flip due by the clock) drops it.
        """
        known = self._no_fit.get(shape)
        if known is None or known.candidates is not self._candidates or now >= known.flips_at:
            return None
        inventory = self.ledger.inventory
        changed = inventory.changed_since(known.seq, _NO_FIT_PATCH)
        if changed is None:
            return None
        updates: dict[str, str] = {}
        for name in changed:
            entry = inventory.nodes.get(name)
            if name not in position or entry is None:
                continue  # not a candidate, or gone (the membership changed: not kept then)
            reason = self._room_reason(entry, shape, spec, quota, need, now)
            if reason is None:
                del self._no_fit[shape]
                return None
            if known.failed.get(name) != reason:
                updates[name] = reason
            known.flips_at = min(known.flips_at, entry.health_flips_at(now))
        if updates:  # a new answer; an unchanged one stays the same object (its Events too)
            known.failed = {**known.failed, **updates}
        known.seq = inventory.seq
        return known.failed

    def _room_reason(
        self,
        entry: NodeEntry,
        shape: int,
        spec: PodFitSpec,
        quota: Quota | None,
        need: tuple[int, int, int],
        now: float,
    ) -> str | None:
        """Why a node takes no pod of this shape without a fit (unhealthy, no room); None: fit it."""
        if not entry.healthy(now):
            return R.NODE_UNREGISTERED
        gpus, mem, cores = entry.usage.room()
        if gpus >= need[0] and mem >= need[1] and cores >= need[2]:
            return None
        return self.capacity_reason(entry, shape, spec, quota)

    def capacity_reason(
        self, entry: NodeEntry, shape: int, spec: PodFitSpec, quota: Quota | None
    ) -> str | None:
        """The plain fit's reason on a node without room (memoised on it); None if it fits after all."""
        reason = entry.unfit.get(shape)
        if reason is None:
            result = fit_pod(entry.usage, spec, quota)
            if isinstance(result, Fitted):
                return None
            reason = result.reason
            entry.remember_unfit(shape, reason)
        return reason

    def _backing_off(
        self,
        backing_off: Mapping[str, float],
        position: Mapping[str, int],
        walk: _Walk,
        spec: PodFitSpec,
        quota: Quota | None,
        previous: Reservation | None,
        numa: NumaFit | None,
        prefer: Prefer | None = None,
    ) -> tuple[str, Fitted] | None:
        """The candidates in bind back-off, tried last (soonest-expiring first)."""
        nodes = self.ledger.nodes
        for name in sorted(backing_off, key=backing_off.__getitem__):
            if name in walk.failed or name not in position:
                continue
            won = walk.tried(name, *self._fit(nodes[name], spec, quota, previous, numa, prefer))
            if won is not None:
                return won
        return None

    def _passed(
        self,
        passed: Iterable[NodeEntry],
        walk: _Walk,
        shape: int,
        spec: PodFitSpec,
        quota: Quota | None,
        previous: Reservation | None,
        numa: NumaFit | None,
        prefer: Prefer | None = None,
    ) -> tuple[str, Fitted] | None:
        """The nodes passed over for their room: each gives its (memoised) capacity reason.

        Their room is below the pod's need, so no fit (NUMA-restricted or not) can succeed there;
        the reason is the plain fit's, kept on the node until its usage changes. Should a fit
        succeed after all, the node is tried as any other.
        """
        for entry in passed:
            reason = self.capacity_reason(entry, shape, spec, quota)
            if reason is None:
                won = walk.tried(entry.name, *self._fit(entry, spec, quota, previous, numa, prefer))
            else:
                won = walk.passed(entry.name, reason)
            if won is not None:
                return won
        return None

    def _shape_id(self, spec: PodFitSpec, quota: Quota | None) -> int:
        """A small id for the request shape (spec and quota headroom) the reason memo is keyed on."""
        key = (spec, quota)
        shape = self._shape_ids.get(key)
        if shape is None:
            if len(self._shape_ids) >= _SHAPE_IDS:
                self._shape_ids.clear()  # ids are never reused: old memo entries just go unread
            shape = self._shape_ids[key] = next(self._next_shape)
        return shape

    def _positions(self, names: tuple[str, ...]) -> tuple[Mapping[str, int], tuple[str, ...]]:
        """Each candidate's request position (first occurrence) and the unregistered candidates.

        kube-scheduler sends the same node list filter after filter: the answer is kept until the
        list or the set of registered nodes changes, so a filter does not rebuild it.
        """
        membership = self.ledger.membership
        cached = self._candidates
        if (
            cached is not None
            and cached.membership == membership
            and (cached.names is names or cached.names == names)
        ):
            return cached.position, cached.unregistered
        position = dict(zip(reversed(names), range(len(names) - 1, -1, -1), strict=True))
        unregistered = tuple(position.keys() - self.ledger.nodes.keys())
        self._candidates = _Candidates(names, membership, position, unregistered)
        return position, unregistered

    def _unregistered_reasons(self, unregistered: tuple[str, ...]) -> dict[str, str]:
        """Why each unregistered candidate is not one: its labels miss ``--node-label-selector``,
        or it has no (valid) register."""
        unselected = self.ledger.inventory.unselected
        if not unselected:
            return dict.fromkeys(unregistered, R.NODE_UNREGISTERED)
        return {n: R.NODE_NOT_SELECTED if n in unselected else R.NODE_UNREGISTERED for n in unregistered}

    def _fit(
        self,
        entry: NodeEntry,
        spec: PodFitSpec,
        quota: Quota | None,
        previous: Reservation | None,
        numa: NumaFit | None = None,
        prefer: Prefer | None = None,
    ) -> tuple[Fitted | Unfit, bool]:
        """Fit the pod on one node, within the NUMA node kubelet is predicted to choose.

        Returns the fit and whether it is aligned with the prediction (True also when there is no
        definite prediction). ``reject`` and a ``strict`` pod that cannot be aligned are
        ``NumaPredictedNotFit`` (``NumaNeverAdmissible`` where kubelet would reject the pod even on
        the idle node); a best-effort (or not opted-in) pod falls back to any GPU.
        """
        release = previous.applied if previous is not None and previous.node == entry.name else None
        order = prefer(entry) if prefer is not None else ()
        if numa is None:
            return fit_pod(entry.usage, spec, quota, release, prefer=order), True
        if self.ledgers.hide_rule(entry.name) in STEERING_RULES:
            steered = self._fit_steered(entry, spec, quota, release, order, numa)
            if steered is not None:
                return steered
        prediction = numa.predict(self.ledgers, entry)
        if prediction is None or prediction.outcome is Outcome.UNKNOWN:
            fitted = self._fit_offered(entry, spec, quota, release, order, prediction)
            if prediction is not None and isinstance(fitted, Fitted):
                numa.resolve(self.ledgers, entry, fitted)
            return fitted, True
        if prediction.outcome is Outcome.REJECT:
            return self._refused(entry, numa), True
        targets = numa_targets(prediction, self.config.resource_count_name, len(spec.requests))
        if all(t is None for t in targets):
            return fit_pod(entry.usage, spec, quota, release, prefer=order), True
        within = fit_pod(entry.usage, spec, quota, release, targets, order)
        if isinstance(within, Fitted):
            return within, True
        if numa.mode is AlignmentMode.STRICT:
            return Unfit(R.NUMA_PREDICTED_NOT_FIT), True
        return fit_pod(entry.usage, spec, quota, release, prefer=order), False

    def _fit_steered(
        self,
        entry: NodeEntry,
        spec: PodFitSpec,
        quota: Quota | None,
        release: PodUsage | None,
        order: tuple[str, ...],
        numa: NumaFit,
    ) -> tuple[Fitted | Unfit, bool] | None:
        """Fit the pod on a node whose plugin steers kubelet (``--hide-replicas steer``): while the
        pod is admitted only its booked GPUs' NUMA nodes offer free replicas, so kubelet follows the
        GPUs the scheduler chooses. The policy's choice first, then within each NUMA node in turn;
        the first kubelet is predicted to admit with the booked GPUs' replicas, within the NUMA
        node(s) of its CPUs, wins; else (not ``strict``) the first it admits at all, unaligned.
        None: nothing is known of the node's prediction (the plain path decides)."""
        if not spec.takes_node_lock:
            return None  # no lock, no handshake: the plugin may steer too late for kubelet
        first = fit_pod(entry.usage, spec, quota, release, prefer=order)
        if not isinstance(first, Fitted):
            return first, True
        within = (
            fit_pod(entry.usage, spec, quota, release, (frozenset({n}),) * len(spec.requests), order)
            for n in sorted({d.numa for d in entry.usage.devices if d.numa >= 0})
        )
        fallback: tuple[Fitted, Prediction] | None = None
        for fitted in itertools.chain((first,), within):
            if not isinstance(fitted, Fitted):
                continue
            resolved = self.ledgers.predict_chosen(
                entry.name, numa.pod, numa.uid, fitted.devices, entry.usage
            )
            if resolved is None:
                return None
            if resolved.outcome is not Outcome.PLACED:
                continue
            if follows_booking(resolved, self.config.resource_count_name, fitted.devices, entry.usage):
                numa.predictions[entry.name] = resolved
                return fitted, True
            fallback = fallback or (fitted, resolved)
        if fallback is not None and numa.mode is not AlignmentMode.STRICT:
            numa.predictions[entry.name] = fallback[1]
            return fallback[0], False
        return self._refused(entry, numa), True

    def _refused(self, entry: NodeEntry, numa: NumaFit) -> Unfit:
        """kubelet would reject the pod here: ``NumaNeverAdmissible`` where it would even on the
        idle node, else ``NumaPredictedNotFit``."""
        never = self.ledgers.never_admits(entry.name, numa.pod, numa.shape)
        return Unfit(R.NUMA_NEVER_ADMISSIBLE if never else R.NUMA_PREDICTED_NOT_FIT)

    def _fit_offered(
        self,
        entry: NodeEntry,
        spec: PodFitSpec,
        quota: Quota | None,
        release: PodUsage | None,
        order: tuple[str, ...],
        prediction: Prediction | None,
    ) -> Fitted | Unfit:
        """Today's fit for an unknown prediction, first within the NUMA node(s) kubelet will offer
        the plugin where its choice is what is unknown (then the plugin prefers those GPUs)."""
        if prediction is not None:
            targets = offered_targets(prediction, self.config.resource_count_name, len(spec.requests))
            if any(t is not None for t in targets):
                within = fit_pod(entry.usage, spec, quota, release, targets, order)
                if isinstance(within, Fitted):
                    return within
        return fit_pod(entry.usage, spec, quota, release, prefer=order)


def _triage(
    group: Iterable[str],
    nodes: Mapping[str, NodeEntry],
    now: float,
    backing_off: Mapping[str, float],
    own: tuple[float, str] | None,
    need: tuple[int, int, int],
    failed: dict[str, str],
    passed: list[NodeEntry],
) -> list[NodeEntry]:
    """The nodes of one score group worth a fit now, in order.

    An unhealthy node gets its reason in ``failed``; a node whose room is below ``need`` (GPUs,
    MiB, cores) goes to ``passed`` (it cannot fit: only its reason is needed, when no other node
    fits); a node backing off is left for last (by the caller). The pod's own node is always
    tried: its booking is free to it.
    """
    own_node = own[1] if own is not None else None
    need_gpus, need_mem, need_cores = need
    tries: list[NodeEntry] = []
    for name in group:
        entry = nodes[name]
        if not entry.healthy(now):
            failed[name] = R.NODE_UNREGISTERED
            continue
        if name != own_node:
            gpus, mem, cores = entry.usage.room()
            if gpus < need_gpus or mem < need_mem or cores < need_cores:
                passed.append(entry)
                continue
        if name in backing_off:
            continue
        tries.append(entry)
    return tries
