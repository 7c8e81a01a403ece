"""The settings object of the scheduler's parts: what ``hamid scheduler``'s flags decide.

:class:`SchedulerSettings` is built once (by :mod:`hamid.scheduler.options` from the flags, or by an
embedding caller) and handed as one object to every part that reads a setting: the filter and bind
verbs, the node locker, the handshake loop, leadership, the refit handler.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from hamid.fit.fgd import DEFAULT_HALF_LIFE, Workload
from hamid.model.labels import EVERY_NODE, NodeLabelSelector
from hamid.scheduler.nodelock import DEFAULT_MAX_HOLD, DEFAULT_STALL

__all__ = [
    "BIND_AFTER_LOCK_S",
    "BIND_BUDGET_S",
    "DEFAULT_BIND_WAIT_S",
    "DEFAULT_SCHEDULER_NAME",
    "DEFAULT_STEER_WAIT_S",
    "SchedulerSettings",
]

#: HAMi's scheduler name: the schedulerName the webhook sets, the name of kube-scheduler's Lease,
#: and the component hamid's Events report (as HAMi's scheduler does).
DEFAULT_SCHEDULER_NAME = "hami-scheduler"
#: The whole budget of one /bind (lock wait and every API call): kube-scheduler's extender
#: httpTimeout is 30 s; the rest is margin for the HTTP exchange itself.
BIND_BUDGET_S = 27.0
#: Part of the budget the lock wait leaves for the annotation patch, the Binding and an undo.
BIND_AFTER_LOCK_S = 8.0
#: How long a bind waits for a contended node lock, at most and by default: all the budget leaves.
DEFAULT_BIND_WAIT_S = BIND_BUDGET_S - BIND_AFTER_LOCK_S
#: How long a bind to a node whose plugin hides replicas by ``steer`` waits, by default, for the
#: plugin to confirm that kubelet was sent the pod's replicas (``--steer-wait``).
DEFAULT_STEER_WAIT_S = 5.0


@dataclass(frozen=True)
class SchedulerSettings:
    """Options of ``hamid scheduler`` that shape decisions."""

    scheduler_name: str = DEFAULT_SCHEDULER_NAME
    node_policy: str = "binpack"
    gpu_policy: str = "spread"
    node_lock_timeout: timedelta = timedelta(minutes=5)
    #: Hard cap of a node lock held by a Pending, unallocated pod (``--node-lock-max-hold``).
    node_lock_max_hold: timedelta = DEFAULT_MAX_HOLD
    #: A Pending holder that made no progress this long loses the node lock (None: never).
    node_lock_stall: timedelta | None = DEFAULT_STALL
    bind_wait_s: float = DEFAULT_BIND_WAIT_S
    #: How long a bind to a ``steer`` node waits for its plugin's acknowledgement (0: not at all).
    steer_wait_s: float = DEFAULT_STEER_WAIT_S
    api_timeout_s: float = 5.0
    handshake_interval_s: float = 15.0
    #: Seconds between reconciles of the accounting against a fresh pod list (0: never).
    reconcile_interval_s: float = 300.0
    #: After the first cache sync, take the live heap out of the cyclic GC (``core.freeze_heap``).
    #: For the ``hamid scheduler`` process; off where the scheduler is embedded (tests, simulator).
    gc_freeze: bool = False
    #: The ``fgd`` policy's typical workload, pinned by the operator (None: learned online).
    fgd_workload: Workload | None = None
    #: Pods after which a learned shape weighs half as much as a new one (``fgd``).
    fgd_half_life: float = DEFAULT_HALF_LIFE
    #: The webhook also sets ``scheduler_name`` on pods without GPUs (``--schedule-cpu-pods``).
    schedule_cpu_pods: bool = False
    #: The webhook hands pods of ``default-scheduler`` to ``scheduler_name`` too (HAMi's default).
    force_overwrite_default_scheduler: bool = True
    #: Only nodes carrying these labels are registered: GPU candidates (``--node-label-selector``).
    node_label_selector: NodeLabelSelector = EVERY_NODE
