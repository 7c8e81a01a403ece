"""Back-off of nodes whose binds fail, so the filter stops sending pods back to them.

Under ``binpack`` a node whose binds keep failing (its node lock held by a pod its kubelet never
admits, a Binding the API server refuses) would win the same pods again at once: the filter tries
such a node after every other one for BASE x 2^(failures in a row - 1) s, at most CAP s. A bind
that succeeds there ends its back-off.
"""

from __future__ import annotations

from collections.abc import Callable, Container

from hamid.log import get_logger

log = get_logger("scheduler.bind_backoff")

BASE_S = 5.0
CAP_S = 60.0


class BindBackoff:
    """Consecutive bind failures per node and until when (``clock`` time) it is tried last."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self._nodes: dict[str, tuple[int, float]] = {}

    def failures(self, node: str) -> int:
        """Binds failed in a row on ``node`` (0 after a success)."""
        return self._nodes.get(node, (0, 0.0))[0]

    def note(self, node: str, ok: bool) -> None:
        """Reset the node's back-off after a bind succeeded there, lengthen it after one failed."""
        if ok:
            self._nodes.pop(node, None)
            return
        count = self.failures(node) + 1
        delay = min(BASE_S * 2 ** (count - 1), CAP_S)
        self._nodes[node] = (count, self.clock() + delay)
        log.info("node_bind_backoff", node=node, failures=count, seconds=delay)

    def active(self, now: float, registered: Container[str]) -> dict[str, float]:
        """Registered nodes backing off at ``now``, with when their back-off ends."""
        return {
            name: until for name, (_count, until) in self._nodes.items() if until > now and name in registered
        }
