"""A bounded memory of the Events the scheduler itself records, for the web view.

The scheduler records refit Events (``NumaRefitSucceed``/``NumaRefitFailed``) and filter
failures (``FilteringFailed``) through one door (:meth:`hamid.scheduler.outbox.EventOutbox.record`);
the view shows a pod's refit history with the exact Event text and a pending pod's last fit
reasons without listing Events from the API server. Everything here is bounded: at most
:data:`MAX_PODS` pods with refit history (:data:`MAX_PER_POD` Events each, oldest dropped), at
most :data:`MAX_PODS` remembered fit failures, and the hour's refit timestamps.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hamid.model import objects
from hamid.model import reasons as R

#: Pods whose refit Events (or last fit failure) are kept; the least recently noted are forgotten.
MAX_PODS = 10_000
#: Refit Events kept per pod (newest).
MAX_PER_POD = 20
#: Refit Events counted "in the last hour" at most (a bound, not a window).
MAX_RECENT = 100_000
#: The window of :meth:`EventHistory.refits_since`'s default.
HOUR_S = 3600.0
REFIT_REASONS = (R.EVENT_NUMA_REFIT_SUCCEED, R.EVENT_NUMA_REFIT_FAILED)
#: Events after which a pod's remembered fit failure no longer applies.
_FIT_CLEARED = (R.EVENT_FILTERING_SUCCEED, R.EVENT_BINDING_SUCCEED)


@dataclass(frozen=True, slots=True)
class NotedEvent:
    """One Event as the scheduler recorded it (``at``: unix seconds of the scheduler's clock)."""

    at: float
    uid: str
    type: str
    reason: str
    message: str


class EventHistory:
    """Refit Events per pod and each pod's last fit failure, bounded (event-loop owned)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self._refits: OrderedDict[str, deque[NotedEvent]] = OrderedDict()
        self._unfit: OrderedDict[str, NotedEvent] = OrderedDict()
        self._recent: deque[tuple[float, str]] = deque(maxlen=MAX_RECENT)
        #: Grows on every noted Event (the view's refresh stamp reads it).
        self.version = 0

    def note(self, obj: Mapping[str, Any], event_type: str, reason: str, message: str) -> None:
        """Remember one Event the scheduler records about ``obj`` (a pod); others are ignored."""
        if reason not in REFIT_REASONS and reason != R.EVENT_FILTERING_FAILED and reason not in _FIT_CLEARED:
            return
        key = objects.namespaced_key(obj)
        event = NotedEvent(self.clock(), objects.uid(obj), event_type, reason, message)
        self.version += 1
        if reason in REFIT_REASONS:
            kept = self._refits.get(key)
            if kept is None:
                kept = self._refits[key] = deque(maxlen=MAX_PER_POD)
            kept.append(event)
            _touch(self._refits, key)
            self._recent.append((event.at, reason))
        elif reason == R.EVENT_FILTERING_FAILED:
            self._unfit[key] = event
            _touch(self._unfit, key)
        else:
            self._unfit.pop(key, None)

    def refits(self, key: str, uid: str = "") -> tuple[NotedEvent, ...]:
        """The pod's refit Events, oldest first (only those of pod ``uid`` when given)."""
        kept = self._refits.get(key, ())
        return tuple(e for e in kept if not uid or e.uid == uid)

    def unfit(self, key: str, uid: str = "") -> NotedEvent | None:
        """The pod's last ``FilteringFailed`` Event, unless a later filter or bind succeeded."""
        event = self._unfit.get(key)
        return event if event is not None and (not uid or event.uid == uid) else None

    def refits_since(self, window_s: float = HOUR_S) -> dict[str, int]:
        """Refit Events by reason in the last ``window_s`` seconds (every reason present, maybe 0)."""
        since = self.clock() - window_s
        counts = dict.fromkeys(REFIT_REASONS, 0)
        for at, reason in reversed(self._recent):
            if at < since:
                break
            counts[reason] += 1
        return counts


def _touch(kept: OrderedDict[str, Any], key: str) -> None:
    """Mark ``key`` most recent; forget the oldest past :data:`MAX_PODS`."""
    kept.move_to_end(key)
    while len(kept) > MAX_PODS:
        kept.popitem(last=False)
