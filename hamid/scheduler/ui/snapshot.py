"""The cluster page's node rows, rebuilt in the background while someone looks.

Building the rows walks every node and pod (5,000 nodes x 50,000 pods: about a tenth of a
second), so no request does it: a request reads the last :class:`Snapshot` and, when it is older
than :data:`MAX_AGE_S`, starts a rebuild that yields to the event loop every :data:`SLICE_S`
(filters and binds are never held up long) and recomputes only the nodes whose ledgers, pods or
GPU usage changed. Nobody looking costs nothing. The first request waits :data:`FIRST_WAIT_S` at
most for the first build; past it the page says the figures are being gathered (an empty snapshot
marked ``building``) and reloads itself when they are.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field, replace

from hamid.log import get_logger
from hamid.scheduler.ui.figures import (
    ALIGNMENTS,
    SORT_KEYS,
    NodeFigures,
    NodeRow,
    figures_key,
    node_figures,
    typical_cpus,
)
from hamid.scheduler.ui.source import UiSource

log = get_logger("scheduler.ui")

#: A snapshot older than this (seconds) is rebuilt when a page asks for it.
MAX_AGE_S = 5.0
#: How long the first request waits for the first build before it is answered "building".
FIRST_WAIT_S = 0.25
#: Longest slice of a rebuild (seconds) before the event loop runs other work.
SLICE_S = 0.005
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
    #: The empty stand-in served until the first build is done.
    building: bool = False
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
        #: Per node: the key its figures were computed for, and the figures (reused while equal).
        self._figures: dict[str, tuple[Hashable, NodeFigures]] = {}

    async def get(self) -> Snapshot:
        """The latest snapshot; a stale one (or none yet: an empty one, marked building) starts a rebuild."""
        current = self._current
        if (current is None or self._clock() - current.built_at > self.max_age_s) and self._task is None:
            self._task = asyncio.create_task(self._rebuild(), name="ui-snapshot")
        if current is None and self._task is not None:
            await asyncio.wait([self._task], timeout=FIRST_WAIT_S)  # a small cluster's first build
        return self._current if self._current is not None else _BUILDING

    async def built(self) -> Snapshot:
        """The snapshot once the build in flight (or a first one) is done."""
        if self._current is None and self._task is None:
            self._task = asyncio.create_task(self._rebuild(), name="ui-snapshot")
        if self._task is not None:
            await asyncio.wait([self._task])
        return self._current if self._current is not None else _BUILDING

    async def _rebuild(self) -> None:
        try:
            await self.refresh()
        except Exception:  # a view must never take the scheduler down; the next look retries
            log.exception("ui_snapshot_failed")
        finally:
            self._task = None

    async def refresh(self) -> None:
        """Build a snapshot now (in slices) and make it current; unchanged nodes are reused."""
        source = self.source
        known, figures = self._figures, {}
        names = sorted(source.bookings.nodes)
        sliced = time.perf_counter()
        for name in names:
            entry = source.bookings.nodes.get(name)
            if entry is None:
                continue
            key = figures_key(source, name, entry)
            seen = known.get(name)
            figures[name] = (
                seen if seen is not None and seen[0] == key else (key, node_figures(source, name, entry))
            )
            if time.perf_counter() - sliced > SLICE_S:
                await asyncio.sleep(0)
                sliced = time.perf_counter()
        self._figures = figures
        self._current = _finish(self._clock(), [f for _, f in figures.values()])

    async def close(self) -> None:
        """Stop a rebuild in flight."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


#: The totals of the cluster page.
_COUNTED = ("gpus", "allocated", "idle", "stranded", "pods", *ALIGNMENTS)


def _finish(now: float, nodes: list[NodeFigures]) -> Snapshot:
    typical = typical_cpus([s for f in nodes for s in f.samples])
    counted = _COUNTED
    totals = dict.fromkeys(counted, 0)
    totals["nodes"] = len(nodes)
    rows = []
    for f in nodes:
        row = replace(f.row)
        row.strand(typical)
        rows.append(row)
        for key in counted:
            totals[key] += row.value(key)
    unaligned = sorted(u for f in nodes for u in f.unaligned)[:MAX_UNALIGNED]
    figures = (typical, unaligned, [tuple(r.value(k) for k in SORT_KEYS) for r in rows])
    stamp = hashlib.sha256(repr(figures).encode()).hexdigest()[:16]
    return Snapshot(now, rows, typical, unaligned, totals, stamp)


_BUILDING = Snapshot(0.0, [], 0, [], dict.fromkeys(("nodes", *_COUNTED), 0), "building", building=True)
