"""Prometheus metrics of the scheduler (own registry; per-GPU gauges computed at scrape time)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from hamid.scheduler.reconcile import DRIFT_KINDS
from hamid.scheduler.state import SchedulerState

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_RECONCILE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class _GpuCollector(Collector):
    """Per-GPU allocated memory/cores/slots from the live state (no bookkeeping on the hot path)."""

    def __init__(self, state: SchedulerState) -> None:
        self.state = state

    def collect(self) -> Iterator[GaugeMetricFamily]:
        labels = ["node", "device_uuid", "device_index", "device_type"]
        mem = GaugeMetricFamily(
            "hamid_gpu_memory_allocated_bytes", "GPU memory booked by pods.", labels=labels
        )
        mem_limit = GaugeMetricFamily("hamid_gpu_memory_limit_bytes", "GPU memory registered.", labels=labels)
        cores = GaugeMetricFamily(
            "hamid_gpu_core_allocated_ratio", "GPU cores booked (percent).", labels=labels
        )
        slots = GaugeMetricFamily("hamid_gpu_shared_count", "vGPU slots booked on the GPU.", labels=labels)
        healthy = GaugeMetricFamily(
            "hamid_node_schedulable", "1 when the node takes new pods.", labels=["node"]
        )
        now = self.state.clock()
        for name, entry in self.state.nodes.items():
            healthy.add_metric([name], 1.0 if entry.healthy(now) else 0.0)
            for d in entry.usage.devices:
                values = [name, d.id, str(d.index), d.type]
                mem.add_metric(values, d.usedmem * 1024 * 1024)
                mem_limit.add_metric(values, d.totalmem * 1024 * 1024)
                cores.add_metric(values, d.usedcores)
                slots.add_metric(values, d.used)
        yield from (mem, mem_limit, cores, slots, healthy)


#: Families describing the cluster (per GPU, per node): exported by the leader only (HAMi #1432).
CLUSTER_METRICS = frozenset(family.name for family in _GpuCollector(SchedulerState()).collect())


class SchedulerMetrics:
    """Histograms and counters of the scheduler, registered in their own registry."""

    def __init__(self, state: SchedulerState) -> None:
        self.registry = CollectorRegistry()
        self.filter_seconds = Histogram(
            "hamid_filter_duration_seconds",
            "Time to answer /filter.",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.bind_seconds = Histogram(
            "hamid_bind_duration_seconds",
            "Time to answer /bind, by outcome.",
            ["outcome"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.node_lock_wait_seconds = Histogram(
            "hamid_node_lock_wait_seconds",
            "Time a bind waited for the node lock.",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.filter_results = Counter(
            "hamid_filter_total", "Filter calls by result.", ["result"], registry=self.registry
        )
        self.reconcile_seconds = Histogram(
            "hamid_reconcile_duration_seconds",
            "Time of one accounting reconcile (fresh pod list, compare, repair).",
            buckets=_RECONCILE_BUCKETS,
            registry=self.registry,
        )
        self.reconcile_drift = Counter(
            "hamid_reconcile_drift_total",
            "Differences the reconcile found (and repaired) between the accounting and a fresh pod "
            "list, by kind: missing, changed, leaked (pod reservations), gpu (a GPU's usage).",
            ["kind"],
            registry=self.registry,
        )
        for kind in DRIFT_KINDS:
            self.reconcile_drift.labels(kind)
        self.reconcile_runs = Counter(
            "hamid_reconcile_runs_total",
            "Reconcile runs by outcome: clean, repaired, failed.",
            ["outcome"],
            registry=self.registry,
        )
        self.untrusted_annotations = Counter(
            "hamid_untrusted_annotations_total",
            "Scheduler-owned pod annotations not taken from a pod: removed at admission (webhook) "
            "or not booked (booking: no GPU requested, another node, capacity, foreign scheduler).",
            ["where"],
            registry=self.registry,
        )
        for where in ("webhook", "booking"):
            self.untrusted_annotations.labels(where)
        self.registry.register(_GpuCollector(state))
