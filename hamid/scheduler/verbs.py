"""What the extender verbs share, handed to each as one object (:class:`VerbContext`).

The filter and bind verbs decide over the same ledger, read the same pod cache, talk to the same API
server, are gated by the same readiness and record Events through the same outbox; each verb's own
collaborators (the planner and reserve step, the node locker) are passed beside it.
"""

from __future__ import annotations

from dataclasses import dataclass

from hamid.kube.cache import PodCache
from hamid.kube.client import KubeClient
from hamid.model.resources import ResourceConfig
from hamid.scheduler.bind_backoff import BindBackoff
from hamid.scheduler.ledger import Ledger
from hamid.scheduler.metrics import SchedulerMetrics
from hamid.scheduler.outbox import Record
from hamid.scheduler.readiness import Readiness
from hamid.scheduler.settings import SchedulerSettings


@dataclass(frozen=True, slots=True)
class VerbContext:
    """The parts and settings both extender verbs use."""

    ledger: Ledger
    kube: KubeClient
    config: ResourceConfig
    settings: SchedulerSettings
    pods: PodCache
    #: Nodes whose binds failed lately (the bind notes them, the plan tries them last).
    backoff: BindBackoff
    metrics: SchedulerMetrics
    readiness: Readiness
    record: Record
