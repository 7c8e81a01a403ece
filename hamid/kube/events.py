"""core/v1 Event recorder that aggregates repeats into ``count``/``lastTimestamp`` like client-go.

Recording never raises into the caller and is bounded in time: an event must never fail a request.
Routine success Events (one per filter and per bind: :data:`ROUTINE_REASONS`) draw on a token
bucket: a quiet scheduler records every one, a burst records the first ``routine_burst`` and then
``routine_per_s``; the rest are counted in :attr:`EventRecorder.shed` and logged once a minute,
never sent. Each Event is one API call, the largest share of a filter's CPU at hundreds of pods
per second (docs/reliability.md §12). Warnings and every other reason are always recorded.
"""

from __future__ import annotations

import asyncio
import math
import socket
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from hamid.kube.client import KubeClient
from hamid.kube.errors import KubeError, NotFound
from hamid.log import get_logger
from hamid.model import objects
from hamid.model._wire import printable
from hamid.model.kube import Body
from hamid.model.reasons import EVENT_BINDING_SUCCEED, EVENT_FILTERING_SUCCEED

log = get_logger("kube.events")

EventType = Literal["Normal", "Warning"]
EVENT_TYPES: tuple[str, ...] = ("Normal", "Warning")
MAX_MESSAGE_LEN = 1024
#: Normal Events sent for every pod scheduled: the ones a budget applies to.
ROUTINE_REASONS: frozenset[str] = frozenset({EVENT_FILTERING_SUCCEED, EVENT_BINDING_SUCCEED})
#: Routine Events recorded at once before the budget's rate applies, and that rate (per second).
ROUTINE_BURST = 100
ROUTINE_PER_S = 5.0
#: How often shed routine Events are reported in the log.
SHED_LOG_INTERVAL_S = 60.0


def _now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class _Series:
    """What is known about one aggregated event (one object + type + reason + message)."""

    namespace: str
    name: str = ""
    count: int = 0
    last_seen: float = 0.0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class _Budget:
    """A token bucket: ``burst`` tokens, refilled at ``per_s``."""

    def __init__(self, burst: int, per_s: float, clock: Callable[[], float]) -> None:
        if burst < 0 or per_s < 0:
            raise ValueError(f"an event budget needs burst >= 0 and per_s >= 0, got {burst}, {per_s}")
        self.burst = burst
        self.per_s = per_s
        self._clock = clock
        self._tokens = float(burst)
        self._at = clock()

    def now(self) -> float:
        """The budget's clock."""
        return self._clock()

    def take(self) -> bool:
        """Spend one token if there is one."""
        if self.per_s == math.inf:
            return True
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.per_s)
        self._at = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True


class EventRecorder:
    """Records core/v1 Events on objects (pods, nodes) for ``component`` running as ``instance``.

    A repeat of the same object + type + reason + message within ``aggregate_window_s`` bumps
    ``count`` and ``lastTimestamp`` of the existing Event with a PATCH instead of creating one.
    Normal Events of :data:`ROUTINE_REASONS` beyond ``routine_burst`` at ``routine_per_s``
    (``routine_per_s=math.inf``: all) are shed.
    """

    def __init__(
        self,
        client: KubeClient,
        component: str,
        instance: str | None = None,
        *,
        aggregate_window_s: float = 600.0,
        timeout: float = 5.0,
        max_series: int = 4096,
        routine_burst: int = ROUTINE_BURST,
        routine_per_s: float = ROUTINE_PER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not component:
            raise ValueError("an EventRecorder needs a component name")
        self.client = client
        self.component = component
        self.instance = instance or socket.gethostname()
        self.aggregate_window_s = aggregate_window_s
        self.timeout = timeout
        self.max_series = max_series
        self._series: OrderedDict[tuple[str, ...], _Series] = OrderedDict()
        self._routine = _Budget(routine_burst, routine_per_s, clock)
        #: Routine Events not sent because the budget was spent, by reason.
        self.shed: Counter[str] = Counter()
        self._shed_logged = 0
        self._shed_log_at = -math.inf

    async def record(self, obj: Body, event_type: EventType, reason: str, message: str) -> None:
        """Record an Event on ``obj`` (a wire-form dict); failures are logged, never raised.

        ``kind``/``apiVersion`` come from the object, defaulting to a v1 ``Pod`` when it has a
        namespace and a v1 ``Node`` when it has none.
        """
        name = objects.name(obj)
        object_namespace = objects.namespace(obj)
        kind = str(obj.get("kind") or ("Pod" if object_namespace else "Node"))
        bound = log.bind(kind=kind, object=f"{object_namespace}/{name}".lstrip("/"), reason=reason)
        if event_type not in EVENT_TYPES or not name or not reason:
            bound.error("event_not_recorded", cause="bad arguments", event_type=event_type, name=name)
            return
        if event_type == "Normal" and reason in ROUTINE_REASONS and not self._routine.take():
            self._note_shed(reason)
            return
        message = printable(message)[:MAX_MESSAGE_LEN]
        involved = {
            "apiVersion": str(obj.get("apiVersion") or "v1"),
            "kind": kind,
            "name": name,
            "uid": objects.uid(obj),
            "resourceVersion": objects.resource_version(obj),
        }
        if object_namespace:
            involved["namespace"] = object_namespace
        key = (kind, object_namespace, name, involved["uid"], event_type, reason, message)
        try:
            async with asyncio.timeout(self.timeout):
                await self._record(key, involved, object_namespace or "default", event_type, reason, message)
        except (KubeError, TimeoutError) as exc:
            bound.warning("event_not_recorded", error=str(exc), error_type=type(exc).__name__)
        except Exception:
            bound.exception("event_not_recorded")

    def _note_shed(self, reason: str) -> None:
        self.shed[reason] += 1
        now = self._routine.now()
        if now - self._shed_log_at < SHED_LOG_INTERVAL_S:
            return
        total = sum(self.shed.values())
        log.info(
            "routine_events_shed",
            cause="budget spent",
            shed=total - self._shed_logged,
            shed_total=total,
            burst=self._routine.burst,
            per_s=self._routine.per_s,
        )
        self._shed_logged, self._shed_log_at = total, now

    def _series_for(self, key: tuple[str, ...], namespace: str) -> _Series:
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = _Series(namespace=namespace)
            while len(self._series) > self.max_series:
                self._series.popitem(last=False)
        else:
            self._series.move_to_end(key)
        return series

    async def _record(
        self,
        key: tuple[str, ...],
        involved: dict[str, str],
        namespace: str,
        event_type: str,
        reason: str,
        message: str,
    ) -> None:
        series = self._series_for(key, namespace)
        async with series.lock:
            now = time.monotonic()
            timestamp = _now_rfc3339()
            if series.name and now - series.last_seen <= self.aggregate_window_s:
                patch = {"count": series.count + 1, "lastTimestamp": timestamp}
                try:
                    await self.client.patch_event(namespace, series.name, patch)
                except NotFound:
                    # The Event expired (event TTL) or was deleted: start a new series below.
                    series.name = ""
                else:
                    series.count += 1
                    series.last_seen = now
                    return
            event: dict[str, Any] = {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": f"{involved['name']}.{time.time_ns():x}", "namespace": namespace},
                "involvedObject": involved,
                "type": event_type,
                "reason": reason,
                "message": message,
                "source": {"component": self.component, "host": self.instance},
                "reportingComponent": self.component,
                "reportingInstance": self.instance,
                "firstTimestamp": timestamp,
                "lastTimestamp": timestamp,
                "count": 1,
            }
            created = await self.client.create_event(namespace, event)
            series.name = objects.name(created) or event["metadata"]["name"]
            series.count = 1
            series.last_seen = now
