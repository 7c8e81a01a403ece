"""Whether this scheduler replica may decide now: caches synced, leading, its term caught up.

Written only by the leadership module (:class:`hamid.scheduler.ha.Leadership`: ``lead`` when a
term starts, ``caught_up`` when the term's caches have caught up, ``follow`` when it ends); read
by the extender verbs, ``/refit``, the reconcile, the handshake loop and the probes. A replica
without leader election leads from the start.
"""

from __future__ import annotations

from collections.abc import Callable


class Readiness:
    """The decision gate of one replica (see the module docs for who writes it)."""

    __slots__ = ("_leading", "_synced", "_term_synced")

    def __init__(self, synced: Callable[[], bool]) -> None:
        self._synced = synced
        self._leading = True
        self._term_synced = True

    @property
    def leading(self) -> bool:
        """Whether this replica decides (holds the leadership, or runs without election)."""
        return self._leading

    @property
    def term_synced(self) -> bool:
        """False from the start of a leadership term until the caches have caught up in it."""
        return self._term_synced

    def lead(self) -> None:
        """A leadership term started: decide once its caches caught up (:meth:`caught_up`)."""
        self._leading, self._term_synced = True, False

    def caught_up(self) -> None:
        """The current term's caches caught up with the API server: decide (while leading)."""
        if self._leading:
            self._term_synced = True

    def follow(self) -> None:
        """Not (or no longer) the leader: refuse decisions."""
        self._leading, self._term_synced = False, False

    def reason(self) -> str:
        """Why the replica must not decide now ("" when it may)."""
        if not self._synced():
            return "caches not synced"
        if not self._leading:
            return "not the leader"
        if not self._term_synced:
            return "cache of this term not synced yet"
        return ""
