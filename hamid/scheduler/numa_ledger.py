"""The scheduler's per-node, per-NUMA ledger: free exclusive CPUs and free replicas, kept from events.

Each node that publishes ``hamid.io/numa-profile`` gets a :class:`~hamid.fit.numa_predict.NumaLedger`
fed incrementally by watch events, one record per pod on the node, best source first:

- ``placement``: the pod's observed ``hamid.io/numa-placement`` (written by the node agent from
  kubelet's PodResources API) — the truth, for what it shows. PodResources does not list regular
  init containers, yet kubelet keeps what they took (less what later containers reused) until the
  pod ends: that part is kept from what was booked before (the prediction or a replay; where none
  was, the pod's own prediction or a replay on the node), beside the placement and yielding to it;
- ``predicted``: the scheduler's own prediction for a pod filtered or bound but not yet observed,
  booked by the filter at once (so a burst to one node sees its predecessors) and recorded in the
  filter's patch as ``hamid.io/numa-predicted`` (so a restarted scheduler rebuilds it exactly);
- ``replay``: for a pod bound by another scheduler (or without a prediction) and not yet observed,
  the predictor's replay of its admission on the ledger as it stands.

Nothing here runs inside a filter but :meth:`NumaLedgers.predict`, which reads the ledger and a
memo keyed by the node's ledger version and the pod's shape. When an observed placement arrives
for a predicted pod, the prediction is scored (hit, or miss by cause); a refit scores it at once
and moves the pod's booking to the NUMA node kubelet chose.
"""

from __future__ import annotations

import enum
import itertools
import math
import sys
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar, cast

from hamid.fit.numa_fit import gpu_replicas
from hamid.fit.numa_memory import MemoryLedger
from hamid.fit.numa_predict import (
    DEFAULT_PROFILE_MAX_AGE_S,
    UNKNOWN_PROFILE_MISSING,
    UNKNOWN_PROFILE_STALE,
    NumaLedger,
    NumaUsage,
    Outcome,
    Packing,
    PluginView,
    Prediction,
    kept_usage,
    predict,
    take_cpus,
    topology_of,
    usage_of_placement,
    usage_of_prediction,
)
from hamid.fit.replica_room import effective_rule, hidden_replicas, omitted_replicas
from hamid.fit.usage import DeviceUsage, NodeUsage
from hamid.log import get_logger
from hamid.model import objects
from hamid.model.devices import DeviceInfo, PodDevices, replica_gpu
from hamid.model.errors import InvalidInput
from hamid.model.kube import JSON, PodBody
from hamid.model.numa import (
    NO_TOPOLOGY,
    NUMA_PLACEMENT,
    NUMA_PREDICTED,
    NUMA_PROFILE,
    STEERING_RULES,
    ContainerPlacement,
    ContainerPrediction,
    MemoryBlock,
    NewerFormat,
    NumaProfile,
    PodPlacement,
    PodPrediction,
    decode_placement,
    decode_prediction,
    decode_profile,
    encode_profile,
    miss_cause,
)
from hamid.model.quantity import parse_quantity
from hamid.model.resources import all_containers, resource_value, unlisted_containers

log = get_logger("scheduler.numa")

_TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
#: Predictions kept (per distinct ledger state and pod shape); the memo is dropped when it is full.
_MEMO_SIZE = 50_000
#: Marks a memo key of :meth:`NumaLedgers.never_admits` (the node idle, not in its current state).
_IDLE = "idle"
HIT, MISS, UNKNOWN = "hit", "miss", "unknown"
#: Distinct usages and CPU sets shared (:class:`_Shared`); dropped when full.
_SHARED_SIZE = 100_000
_T = TypeVar("_T")
_NO_USAGE = NumaUsage()
#: Why a replay got no answer from the ledger (none yet, a stale profile): tried again at a rebuild.
_UNANSWERED = frozenset({UNKNOWN_PROFILE_STALE, UNKNOWN_PROFILE_MISSING})


class Source(enum.StrEnum):
    """Where a pod's ledger usage comes from (best first)."""

    PLACEMENT = "placement"
    PREDICTED = "predicted"
    REPLAY = "replay"


@dataclass(slots=True)
class PodRecord:
    """One pod's booking in its node's ledger."""

    uid: str
    node: str
    source: Source
    #: What the source says the pod holds; booked again on every rebuild (GPUs back from
    #: unhealthy take a prediction again).
    usage: NumaUsage
    own: bool
    seq: int
    #: The pod a replay reads: the pod cache's own (trimmed) object, shared rather than copied, or
    #: :func:`replay_view` of a pod the filter received whole; on a placement, the pod whose
    #: ``kept`` is still to be found by a replay (its node had no ledger, or the replay on this
    #: profile generation was not placed: then ``kept`` is unknown, see ``replayed``).
    pod: PodBody | None = None
    #: The scheduler's prediction, until it is scored (once, when the placement or a refit arrives).
    predicted: PodPrediction | None = None
    #: Other own pods predicted on the node and not yet observed when this one was booked.
    inflight_before: int = 0
    scored: bool = False
    #: What the ledger holds for the pod: ``usage``, or a replay where that does not fit (its GPUs
    #: unhealthy), a placement's with the part of ``kept`` that was free; None: not booked.
    held: NumaUsage | None = None
    #: The booked prediction's or replay's containers PodResources does not list (regular init
    #: containers): what they hold beyond the listed ones becomes ``kept`` when the placement comes.
    #: A placement keeps them, with the booked total in ``basis``, so ``kept`` is measured again
    #: whenever the placement changes (one read while kubelet was still admitting the pod,
    #: container by container, shows less than the pod holds).
    unlisted: tuple[ContainerPrediction, ...] = ()
    #: A placement's: the booked total (prediction or replay) ``kept`` is measured from.
    basis: NumaUsage = _NO_USAGE
    #: A placement's: what the pod's unlisted containers keep, which no placement shows and kubelet
    #: holds until the pod ends; booked beside ``usage`` as far as it is free.
    kept: NumaUsage = _NO_USAGE
    #: A placement's: the admission rank (container index) of each memory block of ``usage``, then
    #: of ``kept``. Both are booked merged in that order, kubelet's (init containers first), as a
    #: NUMA node's memory group is the mask of the last block pinned on it.
    ranks: tuple[int, ...] = ()
    #: The profile generation whose ledger answered the pod's replay (a replay record's usage, a
    #: placement's ``kept``); -1: none did yet (no ledger, a stale profile). kubelet admits a pod
    #: once, so a rebuild does not replay it again (:func:`_replay_due`): re-replaying a pod that
    #: never gets a placement at every rebuild (every profile re-stamp) moved its CPUs in the
    #: ledger but not in kubelet, and a replay that never placed cost a prediction each time.
    replayed: int = -1
    #: A placement's replicas (ID, bucket listed) observed before the node's GPUs were known:
    #: ``usage`` counts them as listed until they are bucketed by their GPU.
    replicas: tuple[tuple[str, int], ...] = ()

    @property
    def booked(self) -> bool:
        """Whether the ledger holds something for the pod."""
        return self.held is not None


@dataclass(slots=True)
class NodeNuma:
    """One node's profile, ledger and pod records."""

    name: str
    profile: NumaProfile | None = None
    profile_raw: str = ""
    totals: dict[str, dict[int, tuple[int, int]]] = field(default_factory=dict)
    #: The bucket each registered GPU (by UUID) is counted in: a placement's replicas are booked
    #: there, as a prediction books them (kubelet lists a GPU it sees without topology under -1,
    #: where the register may have it on a NUMA node).
    gpus: dict[str, int] = field(default_factory=dict)
    #: Replicas per NUMA bucket the plugin leaves out of its list while nothing is booked (``span``).
    idle_omitted: dict[int, int] = field(default_factory=dict)
    ledger: NumaLedger | None = None
    records: dict[str, PodRecord] = field(default_factory=dict)
    #: Grows on every change of the ledger: the memo key of predictions.
    version: int = 0
    #: Records that could not be booked (the ledger disagrees with them): predictions are unknown.
    unbooked: int = 0
    #: Sequence number of the last foreign pod booked (a miss after it is caused by it).
    foreign_seq: int = -1
    #: The profile without its confirmation time (equal on nodes of one kind): part of the memo key.
    profile_key: str = ""
    state_key: Hashable = None
    state_version: int = -1

    @property
    def kept_unknown(self) -> int:
        """Placements whose ``kept`` no replay on this profile found (logged ``numa_kept_unknown``):
        booked without what their init containers keep."""
        generation = self.profile.generation if self.profile is not None else None
        return sum(
            1
            for r in self.records.values()
            if r.source is Source.PLACEMENT and r.pod is not None and r.replayed == generation
        )

    def memo_key(self) -> Hashable:
        """What a prediction depends on besides the pod: profile and ledger content (cached per version)."""
        if self.state_version != self.version:
            ledger = self.ledger
            devices = (
                tuple((r, tuple(sorted(ledger.device_counts(r).items()))) for r in sorted(ledger.resources))
                if ledger is not None
                else ()
            )
            memory = ledger.memory.state_key() if ledger is not None and ledger.memory is not None else None
            self.state_key = (
                self.profile_key,
                ledger.free_cpus if ledger is not None else None,
                devices,
                memory,
            )
            self.state_version = self.version
        return self.state_key


class _Shared:
    """Equal immutable values shared by whoever holds them: most pods of a cluster take one of a few
    usages, and the empty nodes of one kind have one free CPU set."""

    def __init__(self) -> None:
        self._known: dict[Hashable, Any] = {}

    def intern(self, key: Hashable, value: _T) -> _T:
        """The shared value for ``key`` (``value`` the first time); values are never changed once made."""
        known = self._known.get(key)
        if known is not None:
            return cast(_T, known)
        if len(self._known) >= _SHARED_SIZE:
            self._known.clear()  # only the sharing is lost
        self._known[key] = value
        return value

    def usage(self, usage: NumaUsage) -> NumaUsage:
        """The shared usage equal to ``usage``."""
        devices = tuple((r, tuple(sorted(per.items()))) for r, per in sorted(usage.devices.items()))
        return self.intern((usage.cpus, devices, usage.memory), usage)


def replay_view(pod: Mapping[str, Any]) -> JSON:
    """What the predictor reads of a pod (spec resources, containers' names, resources and restart
    policies, the QoS class), so a record that may be replayed keeps no whole pod."""
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return {"spec": spec}
    view: JSON = {k: spec[k] for k in ("resources",) if k in spec}
    for section in ("initContainers", "containers"):
        if section in spec:
            listed = spec[section]
            view[section] = [_container_view(c) for c in listed] if isinstance(listed, list) else listed
    status = pod.get("status")
    if isinstance(status, Mapping) and "qosClass" in status:
        return {"spec": view, "status": {"qosClass": status["qosClass"]}}
    return {"spec": view}


def _container_view(container: object) -> object:
    if not isinstance(container, Mapping):
        return container
    return {k: container[k] for k in ("name", "resources", "restartPolicy") if k in container}


def _unlisted(
    containers: Iterable[ContainerPrediction], pod: Mapping[str, Any]
) -> tuple[ContainerPrediction, ...]:
    """The predicted containers PodResources will not list (the pod's regular init containers)."""
    try:
        names = unlisted_containers(pod)
    except InvalidInput:
        return ()
    return tuple(c for c in containers if c.name in names) if names else ()


def _ranks(
    pod: Mapping[str, Any], containers: Iterable[ContainerPlacement | ContainerPrediction]
) -> tuple[int, ...]:
    """The admission rank (index among the init then app containers) of each memory block of
    ``containers``, in order: kubelet pins a pod's blocks container by container."""
    try:
        index = {str(c.get("name") or ""): i for i, c in enumerate(all_containers(pod))}
    except InvalidInput:
        index = {}
    return tuple(index.get(c.name, len(index)) for c in containers for _block in c.memory)


def _admission_order(rec: PodRecord, part: Iterable[MemoryBlock]) -> tuple[MemoryBlock, ...]:
    """A placement's memory blocks and ``part`` (what fits of its ``kept``'s, in order, less any
    on a NUMA node the ledger does not have) merged in kubelet's admission order (``ranks``)."""
    listed, kept = rec.usage.memory, rec.kept.memory
    if not kept:
        return listed
    ranks = rec.ranks if len(rec.ranks) == len(listed) + len(kept) else (1,) * len(listed) + (0,) * len(kept)
    ranked = [(ranks[i], i, b) for i, b in enumerate(listed)]
    fitted = iter(part)
    nxt = next(fitted, None)
    for i, b in enumerate(kept):
        if nxt is not None and (nxt.numa, nxt.resource) == (b.numa, b.resource):
            ranked.append((ranks[len(listed) + i], len(listed) + i, nxt))
            nxt = next(fitted, None)
    return tuple(b for _rank, _i, b in sorted(ranked, key=lambda t: (t[0], t[1])))


def _replay_due(rec: PodRecord, generation: int) -> bool:
    """Whether a rebuild replays a replay record again: when no ledger answered its replay yet, or
    one of an earlier profile generation answered without placing it. A placed replay stands, as
    kubelet admitted the pod once (where it no longer fits the ledger, :meth:`NumaLedgers._book`
    replays it all the same)."""
    return rec.replayed < 0 or (rec.replayed != generation and rec.usage == _NO_USAGE)


def _bucket(d: DeviceInfo) -> int:
    """The ledger bucket of a registered GPU: its NUMA node, -1 for none."""
    return d.numa if d.numa >= 0 else NO_TOPOLOGY


def device_totals(infos: Iterable[DeviceInfo]) -> dict[int, tuple[int, int]]:
    """``{numa: (total, healthy)}`` replicas of the registered GPUs (``count`` replicas each)."""
    out: dict[int, list[int]] = {}
    for d in infos:
        per = out.setdefault(_bucket(d), [0, 0])
        per[0] += d.count
        if d.health:
            per[1] += d.count
    return {n: (t, h) for n, (t, h) in out.items()}


def _replicas_asked(pod: Mapping[str, Any], resource: str) -> int:
    """The replicas of ``resource`` the pod's containers ask together (init containers included;
    what cannot be read counts as nothing: the predictor judges the pod anyway)."""
    total = 0
    try:
        containers = all_containers(pod)
    except InvalidInput:
        return 0
    for c in containers:
        try:
            present, raw = resource_value(c, resource)
        except InvalidInput:
            continue
        if present and isinstance(raw, (int, str)) and str(raw).isdigit():
            total += int(raw)
    return total


def _bound_node(pod: Mapping[str, Any]) -> str:
    return str((pod.get("spec") or {}).get("nodeName") or "")


def _finished(pod: Mapping[str, Any]) -> bool:
    """Whether kubelet no longer holds the pod's CPUs and devices: a terminal phase. A terminating
    pod (``deletionTimestamp``) still holds them until its containers stopped; kubelet then confirms
    the deletion, and the delete event frees its booking."""
    return (pod.get("status") or {}).get("phase") in _TERMINAL_PHASES


def _placement_beyond(pod: Mapping[str, Any], placement: PodPlacement) -> str | None:
    """Why ``placement`` cannot be what kubelet gave ``pod`` (None: it can): a container the pod does
    not have, or more exclusive CPUs, device replicas or pinned memory than its limits. The plugin
    publishes only what kubelet assigned, so such a placement was written by someone else (a
    tenant, on a pod that admission does not guard: another scheduler's, or one that skipped the
    webhook at create)."""
    try:
        containers = {str(c.get("name")): c for c in all_containers(pod)}
    except InvalidInput as exc:
        return str(exc)
    for placed in placement.containers:
        spec = containers.get(placed.name)
        if spec is None:
            return f"the pod has no container {placed.name!r}"
        limits = (spec.get("resources") or {}).get("limits") or {}
        # a device whose topology names several NUMA nodes is listed under each: count it once
        held: dict[str, int] = {name: len(set().union(*per.values())) for name, per in placed.devices.items()}
        held["cpu"] = len(placed.cpus)
        for block in placed.memory:
            held[block.resource] = held.get(block.resource, 0) + block.size
        for name, amount in held.items():
            if not amount:
                continue
            try:
                limit = parse_quantity(limits.get(name), f"container {placed.name!r} limits.{name}")
            except InvalidInput:
                return f"container {placed.name!r} holds {amount} {name} but sets no limit on it"
            if amount > math.ceil(limit):
                return (
                    f"container {placed.name!r} holds {amount} {name}, more than its limit {limits.get(name)}"
                )
    return None


def _may_hold(pod: Mapping[str, Any], resource: str) -> bool:
    """Whether a pod can hold exclusive CPUs or replicas of ``resource`` (only those are replayed:
    on its node's ledger as it stands, or once its node arrives)."""
    spec = pod.get("spec") or {}
    guaranteed = True
    for c in itertools.chain(spec.get("initContainers") or (), spec.get("containers") or ()):
        res = c.get("resources") if isinstance(c, Mapping) else None
        limits = (res or {}).get("limits") or {} if isinstance(res, Mapping) else {}
        if resource in limits:
            return True
        if "cpu" not in limits or "memory" not in limits:
            guaranteed = False
    return guaranteed


class NumaLedgers:
    """Every profiled node's ledger, kept from node and pod events (event-loop owned)."""

    def __init__(
        self,
        scheduler_name: str,
        resource: str,
        clock: Callable[[], float],
        report: Callable[[str, str], None] | None = None,
        *,
        booked_on: Callable[[str], str | None],
    ) -> None:
        self.scheduler_name = scheduler_name
        #: The node this scheduler's (GPU) ledger booked a pod on, by UID; None: not booked. Only
        #: such a pod's ``numa-predicted`` is the scheduler's own (a pod that skipped the webhook
        #: carries whatever its creator wrote, with a ``vgpu-node`` of its choice).
        self.booked_on = booked_on
        self.resource = resource
        #: The device resources a ledger keeps (a placement's other devices are not booked).
        self._tracked = frozenset({resource})
        self.clock = clock
        #: ``report(result, cause)`` for every scored prediction (cause "" unless a miss).
        self.report = report or (lambda _result, _cause: None)
        self.nodes: dict[str, NodeNuma] = {}
        self._where: dict[str, str] = {}
        self._seq = itertools.count()
        #: (node state key, pod shape) -> prediction: nodes in the same state share it.
        self._memo: dict[Hashable, Prediction] = {}
        self._shared = _Shared()
        #: Called with a node's name whenever its ledger changes (the ``fgd`` ranker's hook).
        self.on_change: Callable[[str], None] | None = None

    def _changed(self, entry: NodeNuma) -> None:
        entry.version += 1
        if self.on_change is not None:
            self.on_change(entry.name)

    # -- nodes ---------------------------------------------------------------------------------

    def on_node(self, node: Mapping[str, Any], infos: Iterable[DeviceInfo] | None) -> None:
        """A node add/update: (re)build its ledger when its profile or GPU inventory changed."""
        name = objects.name(node)
        raw = str(objects.annotations(node).get(NUMA_PROFILE) or "")
        entry = self.nodes.setdefault(name, NodeNuma(name))
        totals = {self.resource: device_totals(infos)} if infos is not None else {}
        if raw == entry.profile_raw and totals == entry.totals:
            return
        if raw != entry.profile_raw:
            entry.profile_raw = raw
            try:
                entry.profile = decode_profile(raw) if raw else None
            except NewerFormat as exc:
                log.warning("numa_profile_newer_format", node=name, error=str(exc), modelled=False)
                entry.profile = None
            except InvalidInput as exc:
                log.warning("numa_profile_invalid", node=name, error=str(exc))
                entry.profile = None
            profile = entry.profile
            entry.profile_key = (
                sys.intern(encode_profile(replace(profile, observed_at=0))) if profile is not None else ""
            )
        entry.totals = totals
        entry.gpus = {d.id: _bucket(d) for d in infos or ()}
        idle = NodeUsage(name, [DeviceUsage.from_info(i) for i in infos or ()])
        entry.idle_omitted = omitted_replicas(idle, self.hide_rule(name))
        self._rebuild(entry)

    def on_node_deleted(self, name: str) -> None:
        """Forget a node's profile (its pods' records stay until they go)."""
        entry = self.nodes.get(name)
        if entry is not None:
            entry.profile, entry.profile_raw, entry.totals = None, "", {}
            self._rebuild(entry)
            self._forget_if_empty(entry)

    def _forget_if_empty(self, entry: NodeNuma) -> None:
        """Drop a node's entry that holds nothing (its node went and its last record with it), so
        nodes replaced under new names do not pile up; a later event of the node makes it anew."""
        if not entry.records and entry.profile is None and not entry.profile_raw and not entry.totals:
            self.nodes.pop(entry.name, None)

    def _rebuild(self, entry: NodeNuma) -> None:
        """The node's ledger from its profile and records: placements, then predictions, then replays."""
        self._changed(entry)
        entry.unbooked = 0
        profile = entry.profile
        for rec in entry.records.values():
            rec.held = None
        if profile is None:
            entry.ledger = None
            return
        try:
            ledger = self._idle_ledger(profile, entry.totals)
        except InvalidInput as exc:
            log.warning("numa_ledger_invalid", node=entry.name, error=str(exc))
            entry.ledger = None
            return
        entry.ledger = ledger
        order = {Source.PLACEMENT: 0, Source.PREDICTED: 1, Source.REPLAY: 2}
        records = sorted(entry.records.values(), key=lambda r: (order[r.source], r.seq))
        placed = [r for r in records if r.source is Source.PLACEMENT]
        for rec in placed:
            if rec.replicas and self.resource in entry.totals:
                rec.usage = self._shared.usage(self._bucketed(entry, rec.usage, rec.replicas))
                rec.replicas = ()
            self._book(entry, rec, rebuild=False)
        for rec in placed:  # what unlisted containers keep yields to every placement
            self._keep(entry, rec, regroup=False)
        self._regroup(entry, placed)
        for rec in records[len(placed) :]:
            if rec.source is Source.REPLAY and rec.pod is not None and _replay_due(rec, profile.generation):
                rec.usage, rec.unlisted, rec.replayed = self._replay_usage(entry, rec.pod)
            self._book(entry, rec, rebuild=False)

    def _regroup(self, entry: NodeNuma, placed: Iterable[PodRecord]) -> None:
        """Pin the placements' memory blocks again, pod by pod and each pod's in kubelet's order: the
        kept parts were booked after every placement (a guess yields to the truth), and a NUMA
        node's group is the mask of the last block pinned on it. Only placements hold memory yet."""
        ledger = entry.ledger
        held = [r.held.memory for r in placed if r.held is not None and r.held.memory]
        if ledger is None or ledger.memory is None or entry.profile is None or not held:
            return
        memory = MemoryLedger.for_profile(entry.profile)
        assert memory is not None
        try:
            for blocks in held:
                memory.apply(blocks)
        except InvalidInput as exc:  # the same bytes in another order: kept as booked
            log.info("numa_memory_regroup_failed", node=entry.name, error=str(exc))
            return
        ledger.memory = memory

    def _idle_ledger(
        self, profile: NumaProfile, totals: Mapping[str, Mapping[int, tuple[int, int]]]
    ) -> NumaLedger:
        """The ledger of the node with nothing on it: every assignable CPU, replica and memory free."""
        assignable = profile.all_cpus - profile.reserved_cpus
        return NumaLedger(
            profile.generation,
            self._shared.intern(assignable, assignable),
            {r: dict(per) for r, per in totals.items()},
            MemoryLedger.for_profile(profile),
        )

    def _book(self, entry: NodeNuma, rec: PodRecord, rebuild: bool = True) -> None:
        """Apply a record to the ledger; on a conflict re-predict it, or rebuild, or leave it unbooked.
        A placement's ``kept`` follows it (in a rebuild, once every placement is booked)."""
        ledger = entry.ledger
        self._changed(entry)
        if ledger is None:
            return
        try:
            ledger.apply(rec.usage)
            rec.held = rec.usage
            if rebuild and rec.source is Source.PLACEMENT:
                self._keep(entry, rec)
            return
        except InvalidInput:
            pass
        if rec.source is not Source.PLACEMENT and rec.pod is not None:
            replayed = self._replay_usage(entry, rec.pod)[0]
            try:
                ledger.apply(replayed)
                rec.held = replayed
                return
            except InvalidInput:
                pass
        if rebuild and rec.source is Source.PLACEMENT:  # the truth displaces stale predictions
            self._rebuild(entry)  # books every record again, this one too, or counts it unbooked once
            return
        entry.unbooked += 1
        log.info("numa_record_unbooked", node=entry.name, pod=rec.uid, source=str(rec.source))

    def _unbook(self, entry: NodeNuma, rec: PodRecord) -> None:
        self._changed(entry)
        if rec.held is not None and entry.ledger is not None:
            try:
                entry.ledger.release(rec.held)
            except InvalidInput:  # cannot happen for a booked record; rebuild to be exact
                self._rebuild(entry)
            rec.held = None
        elif rec.held is None and entry.unbooked > 0:
            entry.unbooked -= 1

    def _keep(self, entry: NodeNuma, rec: PodRecord, regroup: bool = True) -> None:
        """Book beside a booked placement the part of its ``kept`` that is free (an observed
        placement, the truth, wins over this guess), replaying the pod first where ``kept`` is
        still to be found. With ``regroup`` the pod's memory blocks are pinned again, merged in
        kubelet's order (a rebuild does it for every placement at once, :meth:`_regroup`)."""
        ledger = entry.ledger
        if ledger is None or rec.held is None:
            return
        if rec.pod is not None:
            self._replay_kept(entry, rec)
        if rec.kept == _NO_USAGE:
            return
        part = ledger.fitting(rec.kept)
        held = replace(rec.usage.plus(part), memory=_admission_order(rec, part.memory))
        memory = ledger.memory.copy() if regroup and part.memory and ledger.memory is not None else None
        if memory is not None:
            # the placement's blocks were pinned last: pin them again with the kept ones, in order
            try:
                memory.release(rec.usage.memory)
                memory.apply(held.memory)
            except InvalidInput as exc:  # cannot happen (the same bytes); booked unordered then
                log.info("numa_memory_regroup_failed", node=entry.name, error=str(exc))
                memory = None
        if memory is not None:
            ledger.apply(replace(part, memory=()))
            ledger.memory = memory
        else:
            ledger.apply(part)
        rec.held = self._shared.usage(held)
        if part != rec.kept:
            log.info("numa_kept_trimmed", node=entry.name, pod=rec.uid)

    def _replay_kept(self, entry: NodeNuma, rec: PodRecord) -> None:
        """A placement's ``kept`` from a replay of its pod on the node with the placement free, as
        its prediction would have been made: once per profile generation (a replay not placed, or
        a placement that cannot be taken out of the ledger, leaves ``kept`` unknown: counted in
        ``kept_unknown`` and logged, never raised out of an event)."""
        assert entry.ledger is not None and entry.profile is not None
        assert rec.held is not None and rec.pod is not None
        generation = entry.profile.generation
        if rec.replayed == generation:
            return
        before = entry.ledger.copy()
        try:
            before.release(rec.held)
            p = predict(entry.profile, before, rec.pod, now=self.clock())
        except InvalidInput as exc:
            self._kept_unknown(entry, rec, generation, str(exc))
            return
        if p.outcome is not Outcome.PLACED:
            if p.reason not in _UNANSWERED:
                self._kept_unknown(entry, rec, generation, p.message or p.reason)
            return
        rec.basis, rec.unlisted = self._shared.usage(p.usage), _unlisted(p.containers, rec.pod)
        rec.kept = self._kept_of(rec)
        rec.ranks = rec.ranks[: len(rec.usage.memory)] + _ranks(rec.pod, rec.unlisted)
        rec.pod, rec.replayed = None, generation

    def _kept_unknown(self, entry: NodeNuma, rec: PodRecord, generation: int, why: str) -> None:
        rec.replayed = generation
        log.info("numa_kept_unknown", node=entry.name, pod=rec.uid, reason=why)

    def _kept_of(self, rec: PodRecord) -> NumaUsage:
        """A placement's ``kept``: its unlisted containers' share of ``basis`` beyond the placement."""
        if not rec.unlisted:
            return _NO_USAGE
        return self._shared.usage(kept_usage(rec.basis, usage_of_prediction(rec.unlisted), rec.usage))

    def _replay_usage(
        self, entry: NodeNuma, pod: PodBody
    ) -> tuple[NumaUsage, tuple[ContainerPrediction, ...], int]:
        """The replay of ``pod`` on the ledger as it stands: its usage and unlisted containers
        (nothing when it is not placed), and the profile generation that answered it (-1: none,
        as the node has no ledger or a stale profile: it is replayed again at the next rebuild)."""
        answered = entry.profile.generation if entry.profile is not None and entry.ledger is not None else -1
        try:
            p = predict(entry.profile, entry.ledger, pod, now=self.clock())
        except InvalidInput:
            return _NO_USAGE, (), answered
        if p.outcome is not Outcome.PLACED:
            return _NO_USAGE, (), -1 if p.reason in _UNANSWERED else answered
        return self._shared.usage(p.usage), _unlisted(p.containers, pod), answered

    # -- pods ----------------------------------------------------------------------------------

    def on_pod(self, pod: PodBody) -> None:
        """A pod add/update: book its placement, prediction or replay on its node (or drop it)."""
        uid = objects.uid(pod)
        if not uid:
            return
        if _finished(pod):
            self.on_pod_deleted(pod)
            return
        annotations = objects.annotations(pod)
        own = (pod.get("spec") or {}).get("schedulerName") == self.scheduler_name
        bound = _bound_node(pod)
        current = self._record(uid)
        placement = _decoded(annotations.get(NUMA_PLACEMENT), decode_placement) if bound else None
        if placement is not None:
            beyond = _placement_beyond(pod, placement)
            if beyond is None:
                self._observe(pod, bound, own, placement, current)
                return
            log.info("numa_placement_ignored", pod=objects.namespaced_key(pod), node=bound, reason=beyond)
        own_prediction = self._own_prediction(pod, own, bound)
        if own_prediction is not None:
            predicted, node = own_prediction
            if current is not None and current.source is Source.PREDICTED and current.predicted == predicted:
                return
            usage = usage_of_prediction(predicted.containers)
            rec = PodRecord(uid, node, Source.PREDICTED, usage, own, 0, pod, predicted)
            rec.unlisted = _unlisted(predicted.containers, pod)
            self._put(rec)
            return
        if current is not None and current.source is Source.PREDICTED and not bound:
            return  # the filter's own booking, its patch not seen yet
        if bound and _may_hold(pod, self.resource):
            if current is not None and current.source is Source.REPLAY and current.node == bound:
                return
            entry = self.nodes.setdefault(bound, NodeNuma(bound))
            usage, unlisted, replayed = self._replay_usage(entry, pod)
            rec = PodRecord(
                uid, bound, Source.REPLAY, usage, own, 0, pod, unlisted=unlisted, replayed=replayed
            )
            self._put(rec)
            if not own:
                entry.foreign_seq = rec.seq
            return
        self._drop(uid)

    def _own_prediction(self, pod: PodBody, own: bool, bound: str) -> tuple[PodPrediction, str] | None:
        """The pod's ``numa-predicted`` and its node, where the record is this scheduler's: on a pod
        of this scheduler its GPU ledger booked on that node (and bound there, if bound)."""
        if not own:
            return None
        predicted = _decoded(objects.annotations(pod).get(NUMA_PREDICTED), decode_prediction)
        booked = self.booked_on(objects.uid(pod)) if predicted is not None else None
        return (predicted, booked) if predicted is not None and booked and bound in ("", booked) else None

    def on_pod_deleted(self, pod: Mapping[str, Any]) -> None:
        """A pod went: its usage returns to its node's ledger."""
        self._drop(objects.uid(pod))

    def _record(self, uid: str) -> PodRecord | None:
        node = self._where.get(uid)
        return self.nodes[node].records.get(uid) if node is not None and node in self.nodes else None

    def _drop(self, uid: str) -> PodRecord | None:
        node = self._where.pop(uid, None)
        if node is None or node not in self.nodes:
            return None
        entry = self.nodes[node]
        rec = entry.records.pop(uid, None)
        if rec is not None:
            booked = rec.booked
            self._unbook(entry, rec)
            if booked and entry.unbooked:  # what it held may be what a record left unbooked needs
                self._rebuild(entry)
            self._forget_if_empty(entry)
        return rec

    def _put(self, rec: PodRecord) -> None:
        self._drop(rec.uid)
        entry = self.nodes.setdefault(rec.node, NodeNuma(rec.node))
        rec.seq = next(self._seq)
        rec.usage = self._shared.usage(rec.usage)
        entry.records[rec.uid] = rec
        self._where[rec.uid] = rec.node
        self._book(entry, rec)

    def _observe(
        self, pod: PodBody, node: str, own: bool, placement: PodPlacement, current: PodRecord | None
    ) -> None:
        """An observed placement replaces whatever the pod had booked, but for what its unlisted
        containers keep (:meth:`_kept`); a pending prediction is scored."""
        uid = objects.uid(pod)
        observed, replicas = self._observed(node, placement)
        here = current if current is not None and current.node == node else None
        if here is not None and here.source is Source.PLACEMENT and observed == here.usage:
            return
        predicted = here.predicted if here is not None else None
        rec = PodRecord(uid, node, Source.PLACEMENT, observed, own, 0, None, replicas=replicas)
        if here is not None and here.source is Source.PLACEMENT:
            rec.basis, rec.unlisted, rec.pod, rec.replayed = (
                here.basis,
                here.unlisted,
                here.pod,
                here.replayed,
            )
        else:
            rec.basis, rec.unlisted, rec.pod = self._kept(pod, node, own, here)
        rec.kept = self._kept_of(rec)
        rec.ranks = _ranks(pod, placement.containers) + _ranks(pod, rec.unlisted)
        rec.predicted = predicted
        rec.scored = current.scored if current is not None else False
        rec.inflight_before = current.inflight_before if current is not None else 0
        before = current.seq if current is not None else -1
        if predicted is not None and not rec.scored:
            self._score(node, predicted, placement, before, rec.inflight_before)
            rec.scored = True
        if rec.scored:
            rec.predicted = None  # read only to score it
        self._put(rec)
        if not own and (current is None or current.source is not Source.PLACEMENT):
            self.nodes[node].foreign_seq = rec.seq

    def _observed(self, node: str, placement: PodPlacement) -> tuple[NumaUsage, tuple[tuple[str, int], ...]]:
        """A placement's usage as the ledger books it: the scheduler's resource only (the ledger
        keeps no other), each replica in its GPU's bucket; while the node's GPUs are not known, as
        listed, with the replicas to bucket once they are."""
        usage = usage_of_placement(placement.containers).only(self._tracked)
        listed = tuple(
            sorted(
                {
                    (device, n)
                    for c in placement.containers
                    for n, ids in c.devices.get(self.resource, {}).items()
                    for device in ids
                }
            )
        )
        entry = self.nodes.get(node)
        if not listed or entry is None or self.resource not in entry.totals:
            return usage, listed
        return self._bucketed(entry, usage, listed), ()

    def _bucketed(self, entry: NodeNuma, usage: NumaUsage, listed: Iterable[tuple[str, int]]) -> NumaUsage:
        """``usage`` with the replicas ``listed`` counted in their GPU's bucket (a replica of a GPU
        the node does not register: where it was listed), each once."""
        held: dict[int, set[str]] = {}
        for device, n in listed:
            held.setdefault(entry.gpus.get(replica_gpu(device), n), set()).add(device)
        devices = {self.resource: {n: len(ids) for n, ids in sorted(held.items())}}
        return NumaUsage(usage.cpus, devices, usage.memory)

    def _kept(
        self, pod: PodBody, node: str, own: bool, before: PodRecord | None
    ) -> tuple[NumaUsage, tuple[ContainerPrediction, ...], PodBody | None]:
        """What a placement's ``kept`` is measured from (``basis`` and ``unlisted``): what was
        booked for the pod before (its prediction, or a replay that placed it), else its own
        prediction; otherwise (a restart, another scheduler's pod) still to be replayed, the pod's
        view kept."""
        try:
            names = unlisted_containers(pod)
        except InvalidInput:
            return _NO_USAGE, (), None
        if not names:
            return _NO_USAGE, (), None
        if before is not None and before.unlisted:
            return before.usage, before.unlisted, None
        own_prediction = self._own_prediction(pod, own, node)
        if own_prediction is not None:
            containers = own_prediction[0].containers
            return self._shared.usage(usage_of_prediction(containers)), _unlisted(containers, pod), None
        return _NO_USAGE, (), replay_view(pod)

    def _score(
        self, node: str, predicted: PodPrediction, placement: PodPlacement, seq: int, inflight: int
    ) -> None:
        placed = {c.name: c.numa for c in placement.containers}
        if all(placed.get(c.name, c.numa) == c.numa for c in predicted.containers):
            self.report(HIT, "")
            return
        self.report(MISS, self._cause(node, predicted.generation, placement.generation, seq, inflight))

    def _cause(self, node: str, predicted_gen: int, observed_gen: int, seq: int, inflight: int) -> str:
        entry = self.nodes.get(node)
        if entry is None or entry.profile is None:
            return miss_cause(stale=True, foreign_since=False, own_since=False)
        later_own = any(
            r.own and r.seq > seq and r.source is not Source.REPLAY for r in entry.records.values()
        )
        return miss_cause(
            stale=predicted_gen != observed_gen or predicted_gen != entry.profile.generation,
            foreign_since=entry.foreign_seq > seq,
            own_since=inflight > 0 or later_own,
        )

    # -- the filter's side ---------------------------------------------------------------------

    def hide_rule(self, node: str) -> str | None:
        """The rule by which the node's plugin hides free replicas of the scheduler's resource
        from kubelet (its profile says so; None: it hides none; :mod:`hamid.fit.replica_room`)."""
        entry = self.nodes.get(node)
        if entry is None or entry.profile is None:
            return None
        hiding = entry.profile.hide_replicas
        if hiding is None or hiding.resource != self.resource:
            return None
        return effective_rule(hiding.rule, entry.profile.policies.topology_manager_policy)

    def hidden(
        self, node: str, usage: NodeUsage | None, keep: Mapping[str, int] | None = None
    ) -> dict[int, int]:
        """Free replicas per NUMA bucket that kubelet does not see on ``node`` (empty: none hidden;
        ``keep``: replicas per GPU a pending booking needs, which the plugin keeps offered)."""
        return hidden_replicas(usage, self.hide_rule(node), keep) if usage is not None else {}

    def omitted(
        self, node: str, usage: NodeUsage | None, keep: Mapping[str, int] | None = None
    ) -> dict[int, int]:
        """Free replicas per NUMA bucket the node's plugin leaves out of its list (rule ``span``)."""
        return omitted_replicas(usage, self.hide_rule(node), keep) if usage is not None else {}

    def predict(
        self, node: str, pod: JSON, shape: Hashable, uid: str, usage: NodeUsage | None = None
    ) -> Prediction | None:
        """The prediction for ``pod`` on ``node`` (None: the node has no NUMA ledger at all).

        Memoized per (profile and ledger content, replicas hidden, pod shape), so nodes in the same
        state and filters of equal pods share one computation; a node's key is recomputed only when
        its ledger version changed. ``usage``: the node's GPUs, for the replicas its plugin hides
        (GPUs with no room). A pod with its own booking on the node is predicted on a copy without
        it. A node with records the ledger could not book answers ``unknown``.
        """
        entry = self.nodes.get(node)
        if entry is None or entry.profile is None:
            return None
        if entry.unbooked:
            return Prediction(Outcome.UNKNOWN, UNKNOWN_PROFILE_STALE, "the NUMA ledger disagrees with a pod")
        now = self.clock()
        hidden = self.hidden(node, usage)
        omitted = self._omitted_for(pod, self.omitted(node, usage), usage)
        own = entry.records.get(uid)
        if own is not None and own.booked and entry.ledger is not None:
            ledger = self.ledger_without(entry, uid)
            visible = ledger.hiding(self.resource, hidden, omitted) if ledger is not None else None
            return _named(predict(entry.profile, visible, pod, now=now), pod)
        key = (entry.memo_key(), tuple(sorted(hidden.items())), tuple(sorted(omitted.items())), shape)
        cached = self._memo.get(key)
        if cached is None or _aged(entry.profile, now):
            visible = (
                entry.ledger.hiding(self.resource, hidden, omitted) if entry.ledger is not None else None
            )
            cached = self._remember(key, predict(entry.profile, visible, pod, now=now))
        return _named(cached, pod)

    def never_admits(self, node: str, pod: JSON, shape: Hashable) -> bool:
        """Whether kubelet would reject ``pod`` on ``node`` even with nothing else there (every
        CPU, replica and memory block of its profile free): then no scheduling choice helps, e.g. a
        Guaranteed GPU pod whose exclusive CPUs exceed every NUMA node under ``restricted``. Under
        ``span`` the idle node lists one replica per GPU, and once anything is booked every replica:
        never only when kubelet rejects the pod on both lists.

        Memoized per (profile, registered replicas, listing, pod shape): nodes of one kind share it.
        """
        entry = self.nodes.get(node)
        if entry is None or entry.profile is None:
            return False
        listings = [{}, entry.idle_omitted] if entry.idle_omitted else [{}]
        return all(self._rejects_idle(entry, pod, shape, omitted) for omitted in listings)

    def _rejects_idle(self, entry: NodeNuma, pod: JSON, shape: Hashable, omitted: Mapping[int, int]) -> bool:
        """Whether kubelet rejects ``pod`` on the node idle, ``omitted`` replicas left out of the list."""
        assert entry.profile is not None
        key = (
            _IDLE,
            entry.profile_key,
            tuple(sorted((r, tuple(sorted(t.items()))) for r, t in entry.totals.items())),
            tuple(sorted(omitted.items())),
            shape,
        )
        cached = self._memo.get(key)
        if cached is None or _aged(entry.profile, self.clock()):
            try:
                ledger = self._idle_ledger(entry.profile, entry.totals).hiding(self.resource, {}, omitted)
            except InvalidInput:
                return False
            cached = self._remember(key, predict(entry.profile, ledger, pod, now=self.clock()))
        return cached.outcome is Outcome.REJECT

    def _omitted_for(self, pod: JSON, omitted: dict[int, int], usage: NodeUsage | None) -> dict[int, int]:
        """The replicas left out of the list as kubelet will see them for ``pod``: none when the pod
        asks more replicas than the node lists (its own booking makes the plugin list what it needs;
        the full list stands for that here, as before its GPUs are chosen nothing more is known)."""
        if not omitted or usage is None:
            return omitted
        listed = sum(d.count for d in usage.devices if d.health) - sum(omitted.values())
        return {} if _replicas_asked(pod, self.resource) > listed else omitted

    def _remember(self, key: Hashable, prediction: Prediction) -> Prediction:
        """Keep a prediction in the memo (dropped whole when full); returns it."""
        if len(self._memo) >= _MEMO_SIZE:
            self._memo.clear()
        self._memo[key] = prediction
        return prediction

    def predict_chosen(
        self, node: str, pod: JSON, uid: str, devices: PodDevices, usage: NodeUsage
    ) -> Prediction | None:
        """The prediction once the pod's GPUs are chosen (``devices``, init first; ``usage``: the
        node's GPUs), where the node's profile says hamid's plugin offers kubelet
        ``GetPreferredAllocation`` for them or steers kubelet to them (``steer``: the replicas
        kubelet picks among are then only on the booked GPUs' NUMA nodes); None elsewhere (nothing
        more is known)."""
        entry = self.nodes.get(node)
        if entry is None or entry.profile is None or entry.ledger is None or entry.unbooked:
            return None
        rule = self.hide_rule(node)
        preferred = entry.profile.preferred_allocation == self.resource
        if not preferred and rule not in STEERING_RULES:
            return None
        # once bound, the pod's booking is pending: the plugin keeps the replicas it needs offered
        keep = Counter(d.uuid for container in devices for d in container)
        view = PluginView(self.resource, gpu_replicas(usage, rule, keep), devices) if preferred else None
        ledger = self.ledger_without(entry, uid)
        visible = (
            ledger.hiding(self.resource, self.hidden(node, usage, keep), self.omitted(node, usage, keep))
            if ledger is not None
            else None
        )
        return _named(predict(entry.profile, visible, pod, now=self.clock(), plugin=view), pod)

    @staticmethod
    def ledger_without(entry: NodeNuma, uid: str) -> NumaLedger | None:
        """The node's ledger without the pod's own booking (a copy when it has one)."""
        own = entry.records.get(uid)
        if own is None or own.held is None or entry.ledger is None:
            return entry.ledger
        ledger = entry.ledger.copy()
        try:
            ledger.release(own.held)
        except InvalidInput as exc:  # a booked record is releasable; else answer nothing definite
            log.info("numa_release_failed", node=entry.name, pod=uid, error=str(exc))
            return None
        return ledger

    def book(self, uid: str, node: str, prediction: Prediction, pod: PodBody) -> Callable[[], None]:
        """Book a placed prediction for a pod the filter just placed; returns its undo."""
        entry = self.nodes.get(node)
        if entry is None or entry.profile is None or prediction.outcome is not Outcome.PLACED:
            return lambda: None
        previous = self._record(uid)
        inflight = sum(1 for r in entry.records.values() if r.source is Source.PREDICTED and r.uid != uid)
        record = prediction.record(entry.profile.generation)
        rec = PodRecord(
            uid, node, Source.PREDICTED, prediction.usage, True, 0, replay_view(pod), record, inflight
        )
        rec.unlisted = _unlisted(prediction.containers, pod)
        self._put(rec)

        def undo() -> None:
            if self._record(uid) is rec:
                self._drop(uid)
                if previous is not None:
                    self._put(previous)

        return undo

    def on_refit(self, uid: str, node: str, container: int, numa: int) -> None:
        """A refit moved container ``container`` to GPUs of NUMA node ``numa``: kubelet chose it.

        The pending prediction is scored (a miss) and the pod's booking follows kubelet's choice:
        its replicas counted on ``numa``, its exclusive CPUs retaken there if they were elsewhere.
        """
        rec = self._record(uid)
        entry = self.nodes.get(node)
        if rec is None or entry is None or rec.node != node or rec.source is Source.PLACEMENT:
            return
        if rec.predicted is not None and not rec.scored:
            gen = entry.profile.generation if entry.profile is not None else -1
            self.report(MISS, self._cause(node, rec.predicted.generation, gen, rec.seq, rec.inflight_before))
            rec.scored = True
        if rec.predicted is None or entry.profile is None or container >= len(rec.predicted.containers):
            return
        moved = _moved(entry, rec, container, numa, self.resource)
        self._drop(uid)
        # the recorded prediction stays (the annotation still holds it); only the booking follows
        rec.usage, rec.pod = usage_of_prediction(moved.containers), None
        names = {c.name for c in rec.unlisted}
        rec.unlisted = tuple(c for c in moved.containers if c.name in names)
        self._put(rec)

    # -- reading -------------------------------------------------------------------------------

    def free_cpus(self, node: str) -> frozenset[int] | None:
        """A node's free exclusive CPUs in the ledger (None without a ledger)."""
        entry = self.nodes.get(node)
        return entry.ledger.free_cpus if entry is not None and entry.ledger is not None else None


def _moved(entry: NodeNuma, rec: PodRecord, container: int, numa: int, resource: str) -> PodPrediction:
    """The pod's prediction with one container's replicas (and CPUs) on NUMA node ``numa``."""
    assert rec.predicted is not None and entry.profile is not None
    c = rec.predicted.containers[container]
    count = sum(c.devices.get(resource, {}).values())
    devices = {r: dict(per) for r, per in c.devices.items()}
    if count:
        devices[resource] = {numa: count}
    cpus = c.cpus
    numa_cpus = entry.profile.cpus_of_numa(numa)
    if cpus and not cpus <= numa_cpus and entry.ledger is not None:
        free = (
            entry.ledger.free_cpus | (cpus & rec.held.cpus if rec.held is not None else frozenset())
        ) & numa_cpus
        topo = topology_of(entry.profile)
        taken = take_cpus(topo, free, len(cpus), Packing.of(entry.profile.policies, topo.cpus_per_core))
        cpus = taken if taken is not None else cpus
    # kubelet pinned single-node memory with the container's hint: on the NUMA node it chose too
    memory = tuple(
        MemoryBlock(frozenset({numa}), b.resource, b.size) if len(b.numa) == 1 else b for b in c.memory
    )
    changed = ContainerPrediction(c.name, frozenset({numa}), cpus, devices, memory)
    containers = list(rec.predicted.containers)
    containers[container] = changed
    return PodPrediction(rec.predicted.generation, tuple(containers))


def _decoded(raw: object, decode: Callable[[object], Any]) -> Any:
    if raw is None:
        return None
    try:
        return decode(raw)
    except InvalidInput as exc:
        log.info("numa_record_invalid", error=str(exc))
        return None


def _aged(profile: NumaProfile, now: float) -> bool:
    """Whether the memo must not be trusted: the profile's age decides the answer again."""
    return now - profile.observed_at > DEFAULT_PROFILE_MAX_AGE_S


def _named(prediction: Prediction, pod: Mapping[str, Any]) -> Prediction:
    """A (memoized) prediction with the pod's own container names."""
    if prediction.outcome is not Outcome.PLACED:
        return prediction
    spec = pod.get("spec") or {}
    containers = (*(spec.get("initContainers") or ()), *(spec.get("containers") or ()))
    names = [str(c.get("name") or "") for c in containers]
    if len(names) != len(prediction.containers) or all(
        n == c.name for n, c in zip(names, prediction.containers, strict=True)
    ):
        return prediction
    renamed = tuple(
        ContainerPrediction(n, c.numa, c.cpus, c.devices, c.memory)
        for n, c in zip(names, prediction.containers, strict=True)
    )
    return Prediction(prediction.outcome, prediction.reason, prediction.message, renamed, prediction.usage)
