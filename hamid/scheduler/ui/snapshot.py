"""The cluster page's node rows, rebuilt in the background while someone looks.

Building the rows walks every node and pod (5,000 nodes x 50,000 pods: about a tenth of a
second), so no request does it: a request reads the last :class:`Snapshot` and, when it is older
than :data:`MAX_AGE_S`, starts a rebuild that yields to the event loop every
:data:`CHUNK_NODES` nodes (filters and binds are never held up). Nobody looking costs nothing.
Only the very first request of a process waits for a build.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field

from hamid.log import get_logger
from hamid.scheduler.ui.figures import ALIGNMENTS, AlignmentMemo, Gathered, NodeRow, node_row, typical_cpus
from hamid.scheduler.ui.source import UiSource

log = get_logger("scheduler.ui")

#: A snapshot older than this (seconds) is rebuilt when a page asks for it.
MAX_AGE_S = 5.0
#: Nodes per slice of a rebuild (then the event loop runs other work).
CHUNK_NODES = 250
#: Unaligned pods listed on the cluster page at most.
MAX_UNALIGNED = 100


@dataclass
class Snapshot:
    """Node rows and totals of one moment, with the rows' orders cached per sort key."""

    built_at: float
    rows: list[NodeRow]
    typical_cpus: int
    #: ``(pod key, node, why)`` of unaligned pods (at most :data:`MAX_UNALIGNED`).
    unaligned: list[tuple[str, str, str]]
    totals: dict[str, int] = field(default_factory=dict)
    #: Changes when (and only when) the figures change: the page's refresh stamp.
    stamp: str = ""
    _orders: dict[tuple[str, bool], list[NodeRow]] = field(default_factory=dict)

    def ordered(self, key: str, descending: bool) -> list[NodeRow]:
        """The rows sorted by column ``key`` (ties by name), cached."""
        order = self._orders.get((key, descending))
        if order is None:
            if key == "name":
                order = sorted(self.rows, key=lambda r: r.name, reverse=descending)
            else:
                by_name = sorted(self.rows, key=lambda r: r.name)
                order = sorted(by_name, key=lambda r: r.value(key), reverse=descending)
            self._orders[(key, descending)] = order
        return order


class Snapshots:
    """The current :class:`Snapshot` and its background rebuild (event-loop owned)."""

    def __init__(
        self, source: UiSource, max_age_s: float = MAX_AGE_S, clock: Callable[[], float] | None = None
    ):
        self.source = source
        self.max_age_s = max_age_s
        self._clock = clock or source.now
        self._current: Snapshot | None = None
        self._task: asyncio.Task[None] | None = None
        self._memo = AlignmentMemo()

    async def get(self) -> Snapshot:
        """The latest snapshot (built now only the first time); a stale one starts a rebuild."""
        current = self._current
        if current is None:
            await self.refresh()
            assert self._current is not None
            return self._current
        if self._clock() - current.built_at > self.max_age_s and self._task is None:
            self._task = asyncio.create_task(self._rebuild(), name="ui-snapshot")
        return current

    async def _rebuild(self) -> None:
        try:
            await self.refresh()
        except Exception:  # a view must never take the scheduler down; the next look retries
            log.exception("ui_snapshot_failed")
        finally:
            self._task = None

    async def refresh(self) -> None:
        """Build a snapshot now (in slices) and make it current."""
        source = self.source
        gathered = Gathered(AlignmentMemo(self._memo))
        rows: list[NodeRow] = []
        names = sorted(source.bookings.nodes)
        for start in range(0, len(names), CHUNK_NODES):
            for name in names[start : start + CHUNK_NODES]:
                entry = source.bookings.nodes.get(name)
                if entry is not None:
                    rows.append(node_row(source, name, entry, gathered))
            await asyncio.sleep(0)
        self._memo = gathered.memo
        self._current = _finish(self._clock(), rows, gathered)

    async def close(self) -> None:
        """Stop a rebuild in flight."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


#: The columns whose values make a snapshot's stamp.
_STAMPED = (
    "name",
    "gpus",
    "allocated",
    "idle",
    "stranded",
    "aligned",
    "unaligned",
    "unknown",
    "pods",
    "profile",
)


def _finish(now: float, rows: list[NodeRow], gathered: Gathered) -> Snapshot:
    typical = typical_cpus(gathered.samples)
    counted = ("gpus", "allocated", "idle", "stranded", "pods", *ALIGNMENTS)
    totals = dict.fromkeys(counted, 0)
    totals["nodes"] = len(rows)
    for row in rows:
        row.strand(typical)
        for key in counted:
            totals[key] += row.value(key)
    unaligned = sorted(gathered.unaligned)[:MAX_UNALIGNED]
    figures = (typical, unaligned, [tuple(r.value(k) for k in _STAMPED) for r in rows])
    stamp = hashlib.sha256(repr(figures).encode()).hexdigest()[:16]
    return Snapshot(now, rows, typical, unaligned, totals, stamp)
