"""The scheduler's node inventory: registered nodes, their GPUs with live usage, health, ranking.

Fed by node events (:meth:`NodeInventory.on_node`); the usage of each node's GPUs is written only by
the ledger (:mod:`hamid.scheduler.ledger`), which books its reservations again on a node whose
GPUs were (re)registered. Nodes are kept ordered by node score (:class:`ScoreIndex`), so a
filter walks them best-first.

Only a node whose labels match ``--node-label-selector`` is registered (HAMi lists nodes with it):
one that stops matching is dropped like a node whose register went, so every reader of the
inventory (filter, ``fgd``, metrics, ``/ui``, reconcile, handshakes) stops seeing it at once while
its pods' reservations stay in the ledger, booked again if it matches again. HAMi never drops such a
node from its cache, so it keeps taking GPU pods on stale usage.
"""

from __future__ import annotations

import bisect
import enum
import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from hamid.fit.usage import NodeUsage
from hamid.log import get_logger
from hamid.model import annotations as ann
from hamid.model import objects
from hamid.model.devices import DeviceInfo
from hamid.model.errors import InvalidInput
from hamid.model.kube import NodeBody
from hamid.model.labels import EVERY_NODE, NodeLabelSelector
from hamid.model.quantity import quantity_as_int
from hamid.model.resources import ResourceConfig

log = get_logger("scheduler.inventory")

#: A handshake ``Requesting_<t>`` younger than this keeps the node healthy (HAMi: 60 s).
HANDSHAKE_GRACE_S = 60.0
#: Request shapes whose failure reason a node remembers at most (see :attr:`NodeEntry.unfit`):
#: more than a workload's GPU request shapes (the openb trace has 24), so a no-fit pod of one
#: shape does not wipe the reasons of the others (at 8 the replay's filters that kept no node had
#: a p99 of 27 ms, at 64 11 ms: docs/packing-log.md).
_UNFIT_MEMO = 64
#: Entries beyond the live nodes the change log keeps before dropping its oldest.
_CHANGE_LOG_SLACK = 1024


@dataclass(slots=True)
class NodeEntry:
    """One registered node: its devices with live usage and the health signals.

    ``unfit`` memoises why a request shape (an id the filter assigns) does not fit the node's
    current usage; it is emptied on every change of that usage.
    """

    name: str
    usage: NodeUsage
    infos: tuple[DeviceInfo, ...]
    register_raw: str
    score_raw: str
    cordon_raw: str
    handshake_at: float | None
    allocatable_gpu: int
    unfit: dict[int, str] = field(default_factory=dict)

    def healthy(self, now: float) -> bool:
        """HAMi's handshake rule (docs/hami-wire.md §2.5) without its dead ends.

        Healthy while ``Requesting_<t>`` is younger than 60 s (or absent / not yet written, or in
        the future: clock skew), afterwards iff the node advertises ``nvidia.com/gpu``. A plugin
        that (re)advertises its GPUs makes the node schedulable again on its own.
        """
        if self.handshake_at is None or now - self.handshake_at < HANDSHAKE_GRACE_S:
            return True
        return self.allocatable_gpu > 0

    def health_flips_at(self, now: float) -> float:
        """When the clock alone makes this node unhealthy (inf: not by the clock).

        A node that advertises no GPU stays healthy only while its handshake is young.
        """
        at = self.handshake_at
        if self.allocatable_gpu > 0 or at is None or now - at >= HANDSHAKE_GRACE_S:
            return math.inf
        return at + HANDSHAKE_GRACE_S

    def remember_unfit(self, shape: int, reason: str) -> None:
        """Memoise ``reason`` for request shape ``shape`` (all are dropped past :data:`_UNFIT_MEMO`)."""
        if len(self.unfit) >= _UNFIT_MEMO:
            self.unfit.clear()
        self.unfit[shape] = reason


class ScoreIndex:
    """Registered nodes ordered by node score, kept incrementally.

    A node whose usage changes is only marked (:meth:`touch`, the ``NodeUsage.on_change`` hook);
    :meth:`ranked` re-keys the marked nodes (a bisect and a list move each) and returns the
    ``(score, name)`` pairs ascending, so a filter walks nodes best-first without scoring or
    sorting every candidate.
    """

    __slots__ = ("_dirty", "_keys", "_score")

    def __init__(self) -> None:
        self._keys: list[tuple[float, str]] = []
        self._score: dict[str, float] = {}
        self._dirty: set[str] = set()

    def touch(self, name: str) -> None:
        """Mark ``name`` for re-keying (its usage changed, or it was added or dropped)."""
        self._dirty.add(name)

    def ranked(self, nodes: Mapping[str, NodeEntry]) -> list[tuple[float, str]]:
        """``(score, name)`` of every node in ``nodes``, ascending (the live list: do not mutate)."""
        keys = self._keys
        for name in self._dirty:
            old = self._score.pop(name, None)
            if old is not None:
                del keys[bisect.bisect_left(keys, (old, name))]
            entry = nodes.get(name)
            if entry is not None:
                score = entry.usage.score()
                self._score[name] = score
                bisect.insort(keys, (score, name))
        self._dirty.clear()
        return keys


class Registration(enum.Enum):
    """What a node event did to the inventory."""

    UNCHANGED = "unchanged"  #: same GPUs (health signals may have changed)
    FRESH = "fresh"  #: the node's GPUs were (re)built with zero usage: book its pods again
    DROPPED = "dropped"  #: the node is no longer registered


def _handshake(value: str | None) -> tuple[float | None, bool]:
    """(time of a valid ``Requesting_<t>`` stamp or None, whether to write a fresh one).

    Missing, legacy (``Reported``/``Deleted_``), malformed or unparsable values are replaced by
    ``Requesting_<now>`` (never a state that needs a hand edit to leave).
    """
    if value is None:
        return None, True
    try:
        handshake = ann.parse_handshake(value)
    except InvalidInput:
        return None, True
    if handshake.state is not ann.HandshakeState.REQUESTING or handshake.time is None:
        return None, True
    return handshake.time.timestamp(), False


class NodeInventory:
    """Registered nodes of one scheduler process with their GPUs (event-loop owned)."""

    def __init__(
        self,
        config: ResourceConfig,
        clock: Callable[[], float] = time.time,
        selector: NodeLabelSelector = EVERY_NODE,
    ) -> None:
        self.config = config
        self.clock = clock
        #: The labels a node must carry to be registered (``--node-label-selector``).
        self.selector = selector
        self.nodes: dict[str, NodeEntry] = {}
        #: Nodes with a register whose labels do not match :attr:`selector` (the filter says so).
        self.unselected: set[str] = set()
        #: Bumped whenever a node name joins or leaves :attr:`nodes` (caches keyed on the set).
        self.membership = 0
        #: Nodes whose handshake annotation is missing or stale-format (the leader writes one).
        self.handshake_wanted: set[str] = set()
        self._index = ScoreIndex()
        #: Bumped by every change of a node (usage, registration, health signals).
        self.seq = 0
        #: node -> the seq of its last change, oldest first (see :meth:`changed_since`).
        self._changed: dict[str, int] = {}
        #: The newest seq dropped from that log (nodes long gone): an older reader re-reads all.
        self._forgotten = 0

    def on_node(self, node: NodeBody) -> Registration:
        """Apply a node add/update: inventory, cordon, pair scores, handshake and allocatable."""
        name = objects.name(node)
        self._mark(name)
        annotations = objects.annotations(node)
        register_raw = annotations.get(ann.NODE_REGISTER)
        if register_raw is not None and not self.selector.matches(objects.labels(node)):
            return self._not_selected(name)
        if name in self.unselected:
            self.unselected.discard(name)
            self.membership += 1
            if register_raw is not None:
                log.info("node_selected", node=name, selector=str(self.selector))
        entry = self.nodes.get(name)
        if register_raw is None:
            if entry is None:
                return Registration.UNCHANGED
            log.info("node_unregistered", node=name)
            self.drop(name)
            return Registration.DROPPED
        score_raw = annotations.get(ann.NODE_SCORE, "")
        cordon_raw = annotations.get(ann.DEVICE_CORDON, "")
        allocatable = self._allocatable(node)
        handshake_at, wants_handshake = _handshake(annotations.get(ann.NODE_HANDSHAKE))
        if wants_handshake:
            self.handshake_wanted.add(name)
        else:
            self.handshake_wanted.discard(name)
        if entry is not None and (entry.register_raw, entry.score_raw, entry.cordon_raw) == (
            register_raw,
            score_raw,
            cordon_raw,
        ):
            entry.handshake_at, entry.allocatable_gpu = handshake_at, allocatable
            return Registration.UNCHANGED
        try:
            infos = tuple(ann.decode_node_devices(register_raw))
            pair_scores = ann.decode_pair_scores(score_raw) if score_raw else {}
            cordoned = ann.parse_uuid_list(cordon_raw, ann.DEVICE_CORDON) if cordon_raw else ()
        except InvalidInput as exc:
            log.warning("node_register_invalid", node=name, error=str(exc))
            if entry is not None:
                entry.handshake_at, entry.allocatable_gpu = handshake_at, allocatable
            return Registration.UNCHANGED
        usage = self.fresh_usage(name, infos, pair_scores, cordoned or ())
        if name not in self.nodes:
            self.membership += 1
        self.nodes[name] = NodeEntry(
            name, usage, infos, register_raw, score_raw, cordon_raw, handshake_at, allocatable
        )
        return Registration.FRESH

    def _not_selected(self, name: str) -> Registration:
        """A node with a register whose labels do not match the selector: not (or no longer) registered."""
        self.handshake_wanted.discard(name)
        registered = name in self.nodes
        if name not in self.unselected:
            self.unselected.add(name)
            self.membership += 1
            log.info("node_not_selected", node=name, selector=str(self.selector), was_registered=registered)
        if registered:
            self.drop(name)
            return Registration.DROPPED
        return Registration.UNCHANGED

    def on_node_deleted(self, name: str) -> None:
        """Forget a deleted node: its registration, its handshake wish and its selector verdict."""
        self.drop(name)
        self.handshake_wanted.discard(name)
        if name in self.unselected:
            self.unselected.discard(name)
            self.membership += 1

    def fresh_usage(
        self,
        name: str,
        infos: tuple[DeviceInfo, ...],
        pair_scores: Mapping[str, Mapping[str, int]],
        cordoned: Iterable[str],
    ) -> NodeUsage:
        """A zero-usage NodeUsage of a node, hooked to (and marked in) the score index."""
        usage = NodeUsage.from_infos(name, infos, pair_scores, cordoned)
        usage.on_change = self._usage_changed
        self._index.touch(name)
        self._mark(name)
        return usage

    def _mark(self, name: str) -> None:
        self.seq += 1
        self._changed.pop(name, None)
        self._changed[name] = self.seq
        if len(self._changed) > 2 * len(self.nodes) + _CHANGE_LOG_SLACK:
            # names of nodes that went (replaced under new names): keep the log to about the live set
            for old in list(self._changed)[: len(self._changed) - len(self.nodes) - _CHANGE_LOG_SLACK]:
                self._forgotten = self._changed.pop(old)

    def changed_since(self, seq: int, at_most: int) -> list[str] | None:
        """The nodes changed after :attr:`seq` was ``seq``; None when more than ``at_most`` did
        (or the log no longer reaches back to ``seq``)."""
        if seq < self._forgotten:
            return None
        changed: list[str] = []
        for name, when in reversed(self._changed.items()):
            if when <= seq:
                break
            if len(changed) >= at_most:
                return None
            changed.append(name)
        return changed

    def health_flips_at(self, now: float) -> float:
        """The earliest time a registered node's health changes by the clock alone (inf: never)."""
        return min((entry.health_flips_at(now) for entry in self.nodes.values()), default=math.inf)

    def _usage_changed(self, name: str) -> None:
        self._index.touch(name)
        self._mark(name)
        entry = self.nodes.get(name)
        if entry is not None and entry.unfit:
            entry.unfit.clear()

    def reset_usage(self, name: str) -> NodeEntry | None:
        """Give a node zero usage on its registered GPUs (to book its pods again); None: unknown."""
        entry = self.nodes.get(name)
        if entry is None:
            return None
        old = entry.usage
        entry.usage = self.fresh_usage(name, entry.infos, old.pair_scores, old.cordoned)
        entry.unfit.clear()
        return entry

    def blank_copy(self) -> NodeInventory:
        """The same registered nodes with zero usage (for the reconcile's shadow)."""
        copy = NodeInventory(self.config, self.clock, self.selector)
        for name, entry in self.nodes.items():
            usage = copy.fresh_usage(name, entry.infos, entry.usage.pair_scores, entry.usage.cordoned)
            copy.nodes[name] = NodeEntry(
                name,
                usage,
                entry.infos,
                entry.register_raw,
                entry.score_raw,
                entry.cordon_raw,
                entry.handshake_at,
                entry.allocatable_gpu,
            )
        return copy

    def _allocatable(self, node: NodeBody) -> int:
        value = (objects.section(node, "status").get("allocatable") or {}).get(
            self.config.resource_count_name, 0
        )
        try:
            return quantity_as_int(value, self.config.resource_count_name) or 0
        except InvalidInput:
            return 0

    def drop(self, name: str) -> bool:
        """Forget a node's registration; whether it was registered."""
        self._index.touch(name)
        self._mark(name)
        if self.nodes.pop(name, None) is None:
            return False
        self.membership += 1
        return True

    def ranked(self) -> list[tuple[float, str]]:
        """``(node score, name)`` of every registered node, ascending (do not mutate)."""
        return self._index.ranked(self.nodes)

    def schedulable(self, name: str) -> NodeEntry | None:
        """The node's entry if it is registered and healthy now, else None."""
        entry = self.nodes.get(name)
        if entry is None or not entry.healthy(self.clock()):
            return None
        return entry
