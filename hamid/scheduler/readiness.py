"""Whether this scheduler replica may decide now: caches synced, leading, its term caught up, fenced.

Written only by the leadership module (:class:`hamid.scheduler.ha.Leadership`: ``lead`` when a
term starts, ``caught_up`` when the term's caches have caught up, ``follow`` when it ends, and
``fence`` with the elector whose lease bounds every decision); read by the extender verbs,
``/refit``, the reconcile, the handshake loop and the probes. A replica without leader election
leads from the start.

The fence is checked on every call, so a replica whose lease ran out on its own clock (a
frozen process that just woke) refuses at once, before its renew loop notices. A decision takes
its :meth:`Readiness.epoch` when it starts and :meth:`Readiness.check` before each write: a
write under a later term or lease term than the decision's is refused.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol


class Fence(Protocol):
    """What bounds leadership in time (:class:`hamid.kube.leader.LeaderElector` and the follower)."""

    @property
    def epoch(self) -> str:
        """The lease term this replica holds now ("" when none)."""
        ...

    def lease_invalid(self) -> str:
        """Why the replica's lease does not allow a decision now ("" while it does)."""
        ...


class Readiness:
    """The decision gate of one replica (see the module docs for who writes it)."""

    __slots__ = ("_fence", "_leading", "_stopping", "_synced", "_term", "_term_synced")

    def __init__(self, synced: Callable[[], bool]) -> None:
        self._synced = synced
        self._leading = True
        self._term_synced = True
        self._term = 0
        self._fence: Fence | None = None
        self._stopping = False

    @property
    def synced(self) -> bool:
        """Whether the caches have applied their first list (the webhook answers from then on)."""
        return self._synced()

    @property
    def leading(self) -> bool:
        """Whether this replica decides (holds the leadership, or runs without election)."""
        return self._leading

    @property
    def term_synced(self) -> bool:
        """False from the start of a leadership term until the caches have caught up in it."""
        return self._term_synced

    def fence(self, fence: Fence) -> None:
        """Bound every decision by ``fence``'s lease (leader election)."""
        self._fence = fence

    def lead(self) -> None:
        """A leadership term started: decide once its caches caught up (:meth:`caught_up`)."""
        self._leading, self._term_synced = True, False
        self._term += 1

    def caught_up(self) -> None:
        """The current term's caches caught up with the API server: decide (while leading)."""
        if self._leading:
            self._term_synced = True

    def follow(self) -> None:
        """Not (or no longer) the leader: refuse decisions."""
        self._leading, self._term_synced = False, False
        self._term += 1

    def stop(self) -> None:
        """The process is shutting down: refuse new decisions (those in flight may finish)."""
        self._stopping = True

    def reason(self) -> str:
        """Why the replica must not start a decision now ("" when it may)."""
        if self._stopping:
            return "shutting down"
        return self._decides()

    def _decides(self) -> str:
        if not self._synced():
            return "caches not synced"
        if not self._leading:
            return "not the leader"
        if not self._term_synced:
            return "cache of this term not synced yet"
        if self._fence is not None:
            return self._fence.lease_invalid()
        return ""

    def epoch(self) -> str:
        """The term and lease term a decision starting now runs under."""
        lease = self._fence.epoch if self._fence is not None else ""
        return f"{self._term}/{lease}"

    def check(self, epoch: str) -> str:
        """Why a decision that started under ``epoch`` must not write now ("" when it may)."""
        reason = self._decides()
        if reason:
            return reason
        now = self.epoch()
        if now != epoch:
            return f"leadership changed while deciding (started in epoch {epoch}, now {now})"
        return ""
