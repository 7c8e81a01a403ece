"""Prometheus metrics of the scheduler (own registries; per-GPU gauges computed at scrape time).

Two registries: :attr:`SchedulerMetrics.registry` (``/metrics``: hamid's names, promtool-clean,
process metrics, no ``*_created`` series) and :attr:`SchedulerMetrics.hami_registry`
(``/metrics/hami``: HAMi's scheduler families, current and legacy, for HAMi's dashboards and
HAMi-WebUI, computed from the same ledger). HAMi's names are not all promtool-clean
(``hami_gpu_shared_count`` is a gauge ending in ``_count``, ``GPUDeviceMemoryLimit`` is camelCase,
``*_ratio`` hold percent), which is why they live on their own path.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from hamid.exposition import HAMI_ZONE, register_hami_build_info, register_process_metrics
from hamid.fit.usage import DeviceUsage
from hamid.model import objects
from hamid.model.annotations import MIG_ALLOCATIONS
from hamid.model.errors import InvalidInput
from hamid.model.mig import decode_mig_allocations
from hamid.model.numa import MISS_CAUSES
from hamid.scheduler.fgd_rank import FgdRanker
from hamid.scheduler.ledger import Ledger
from hamid.scheduler.numa_ledger import HIT, MISS, UNKNOWN
from hamid.scheduler.reconcile import DRIFT_KINDS

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_RECONCILE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_MIB = 1024 * 1024
_MIG_INFO_HELP = "Realized MIG instance identity and scheduler placement"


class _GpuCollector(Collector):
    """Per-GPU allocated memory/cores/containers from the live state (no bookkeeping on the hot path)."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    def collect(self) -> Iterator[GaugeMetricFamily]:
        labels = ["node", "device_uuid", "device_index", "device_type"]
        mem = GaugeMetricFamily(
            "hamid_gpu_memory_allocated_bytes", "GPU memory booked by pods.", labels=labels
        )
        mem_limit = GaugeMetricFamily("hamid_gpu_memory_limit_bytes", "GPU memory registered.", labels=labels)
        cores = GaugeMetricFamily(
            "hamid_gpu_core_allocated_ratio",
            "Share of the GPU's registered cores booked by pods (0-1).",
            labels=labels,
        )
        core_limit = GaugeMetricFamily(
            "hamid_gpu_core_limit_percent",
            "GPU cores registered, in percent of one GPU (devicecorescaling x 100).",
            labels=labels,
        )
        shared = GaugeMetricFamily(
            "hamid_gpu_shared_containers", "Containers (vGPU slots) booked on the GPU.", labels=labels
        )
        slots = GaugeMetricFamily(
            "hamid_gpu_slots", "vGPU slots the GPU offers (devicesplitcount).", labels=labels
        )
        healthy = GaugeMetricFamily(
            "hamid_node_schedulable", "1 when the node takes new pods.", labels=["node"]
        )
        now = self.ledger.clock()
        for name, entry in self.ledger.nodes.items():
            healthy.add_metric([name], 1.0 if entry.healthy(now) else 0.0)
            for d in entry.usage.devices:
                values = [name, d.id, str(d.index), d.type]
                mem.add_metric(values, d.usedmem * _MIB)
                mem_limit.add_metric(values, d.totalmem * _MIB)
                cores.add_metric(values, d.usedcores / d.totalcore if d.totalcore > 0 else 0.0)
                core_limit.add_metric(values, d.totalcore)
                shared.add_metric(values, d.used)
                slots.add_metric(values, d.count)
        yield from (mem, mem_limit, cores, core_limit, shared, slots, healthy)


#: ``add(name, help, labels, value)`` inside :meth:`HamiCompatCollector.collect`.
_Add = Callable[[str, str, dict[str, str], float], None]


def _core_values(device_type: str, total: int, used: int) -> tuple[float, float]:
    """HAMi's (limit, allocated) core values: as registered, but for AMD GPUs (compute units),
    which HAMi turns into percent of the registered cores, rounded up."""
    if not device_type.upper().startswith("AMD") or total <= 0:
        return float(total), float(used)
    return 100.0, float(math.ceil(used / total * 100))


def _device_families(add: _Add, node: str, d: DeviceUsage) -> None:
    """HAMi's per-GPU families (current and legacy names) of one device."""
    idx, mem, limit = str(d.index), float(d.usedmem * _MIB), float(d.totalmem * _MIB)
    new = {"node": node, "device_uuid": d.id, "device_index": idx}
    old = {"nodeid": node, "deviceuuid": d.id, "deviceidx": idx}
    typed, old_typed = {**new, "device_type": d.type}, {**old, "devicetype": d.type}
    cores = str(d.totalcore)
    core_limit, core_allocated = _core_values(d.type, d.totalcore, d.usedcores)
    add("hami_gpu_memory_limit_bytes", "Device memory limit for a certain GPU", typed, limit)
    add("hami_gpu_core_limit_ratio", "Device core limit for a certain GPU", typed, core_limit)
    add(
        "hami_gpu_memory_allocated_bytes",
        "Device memory allocated for a certain GPU",
        {**new, "device_cores": cores, "device_type": d.type},
        mem,
    )
    add("hami_gpu_shared_count", "Number of containers sharing this GPU", typed, d.used)
    add("hami_gpu_core_allocated_ratio", "Device core allocated for a certain GPU", typed, core_allocated)
    add(
        "hami_node_gpu_overview",
        "GPU overview on a certain node",
        {
            **new,
            "device_cores": cores,
            "device_memory_limit": str(d.totalmem),
            "device_type": d.type,
        },
        mem,
    )
    add("GPUDeviceMemoryLimit", "Device memory limit for a certain GPU", old_typed, limit)
    add("GPUDeviceCoreLimit", "Device memory core limit for a certain GPU", old_typed, d.totalcore)
    add(
        "GPUDeviceMemoryAllocated",
        "Device memory allocated for a certain GPU",
        {**old, "devicecores": cores, "devicetype": d.type},
        mem,
    )
    add("GPUDeviceSharedNum", "Number of containers sharing this GPU", old_typed, d.used)
    add(
        "GPUDeviceCoreAllocated",
        "Device core allocated for a certain GPU",
        old_typed,
        d.usedcores,
    )
    add(
        "nodeGPUOverview",
        "GPU overview on a certain node",
        {**old, "devicecores": cores, "devicememorylimit": str(d.totalmem), "devicetype": d.type},
        mem,
    )
    if d.totalmem > 0:
        share = d.usedmem / d.totalmem
        pct = "GPU Memory Allocated Percentage on a certain GPU"
        add("hami_node_gpu_memory_allocated_ratio", pct, typed, share)
        add("nodeGPUMemoryPercentage", pct, old, share)


class HamiCompatCollector(Collector):
    """HAMi's scheduler families (``cmd/scheduler/metrics.go``): current names and the legacy ones.

    Legacy (HAMi v2.x, read by HAMi's Grafana dashboards and HAMi-WebUI): ``GPUDeviceMemoryLimit``,
    ``GPUDeviceCoreLimit``, ``GPUDeviceMemoryAllocated``, ``GPUDeviceSharedNum``,
    ``GPUDeviceCoreAllocated``, ``nodeGPUOverview``, ``nodeGPUMemoryPercentage``,
    ``vGPUMemoryAllocated``, ``vGPUCoreAllocated``, ``QuotaUsed``; current: the ``hami_*`` names.
    Every family carries ``zone="vGPU"`` as HAMi's does.
    """

    def __init__(self, ledger: Ledger, pod_of: Callable[[str], Mapping[str, Any] | None]) -> None:
        """``pod_of``: the cached pod of a ``namespace/name`` (the MIG runtime ids the plugin wrote)."""
        self.ledger = ledger
        self.pod_of = pod_of

    def collect(self) -> Iterator[GaugeMetricFamily]:
        fams: dict[str, GaugeMetricFamily] = {}

        def add(name: str, help_text: str, labels: dict[str, str], value: float) -> None:
            family = fams.get(name)
            if family is None:
                family = fams[name] = GaugeMetricFamily(name, help_text, labels=[*labels, "zone"])
            family.add_metric([*labels.values(), HAMI_ZONE], value)

        self._devices(add)
        self._containers(add)
        self._quotas(add)
        self._mig_instances(add)
        yield from fams.values()

    def _devices(self, add: _Add) -> None:
        for node, entry in self.ledger.nodes.items():
            for d in entry.usage.devices:
                _device_families(add, node, d)

    def _containers(self, add: _Add) -> None:
        cores_of = {
            d.id: (d.type, d.totalcore) for entry in self.ledger.nodes.values() for d in entry.usage.devices
        }
        for res in self.ledger.reservations():
            for index, devices in enumerate(res.layout):
                for dev in devices:
                    new = {
                        "namespace": res.namespace,
                        "node": res.node,
                        "pod": res.name,
                        "container_index": str(index),
                        "device_uuid": dev.uuid,
                    }
                    old = {
                        "podnamespace": res.namespace,
                        "nodename": res.node,
                        "podname": res.name,
                        "containeridx": str(index),
                        "deviceuuid": dev.uuid,
                    }
                    mem_help, core_help = (
                        "vGPU memory allocated from a container",
                        "vGPU core allocated from a container",
                    )
                    add("hami_vgpu_memory_allocated_bytes", mem_help, new, dev.usedmem * _MIB)
                    device_type, total = cores_of.get(dev.uuid, ("", 0))  # unknown: the raw value
                    _, allocated = _core_values(device_type, total, dev.usedcores)
                    add("hami_vgpu_core_allocated_ratio", core_help, new, allocated)
                    add("vGPUMemoryAllocated", mem_help, old, dev.usedmem * _MIB)
                    add("vGPUCoreAllocated", core_help, old, dev.usedcores)

    def _mig_instances(self, add: _Add) -> None:
        """HAMi's ``hami_node_gpu_mig_instance_info``: each realized MIG instance of a booked
        reservation, with the runtime ids the plugin recorded beside that very reservation (a record
        whose GPU, profile or placement is not the booked one shows nothing)."""
        index_of = {d.id: d.index for entry in self.ledger.nodes.values() for d in entry.usage.devices}
        for res in self.ledger.reservations():
            pod = self.pod_of(res.key) if res.mig else None
            if pod is None:
                continue
            try:
                recorded = decode_mig_allocations(objects.annotations(pod).get(MIG_ALLOCATIONS) or "")
            except InvalidInput:
                continue
            realized = {a.reservation_key: a for a in recorded if a.realized}
            for booked in res.mig:
                a = realized.get(booked.reservation_key)
                if a is None:
                    continue
                labels = {
                    "node": res.node,
                    "device_uuid": a.gpu_uuid,
                    "device_index": str(index_of.get(a.gpu_uuid, "")),
                    "mig_uuid": a.mig_uuid,
                    "profile": a.profile,
                    "gpu_instance_id": str(a.gpu_instance_id),
                    "compute_instance_id": str(a.compute_instance_id),
                    "placement_start": str(a.placement.start),
                    "placement_size": str(a.placement.size),
                }
                add("hami_node_gpu_mig_instance_info", _MIG_INFO_HELP, labels, 1.0)

    def _quotas(self, add: _Add) -> None:
        """HAMi's quota families: every namespace with a GPU quota or GPU usage, each resource it
        limits or uses (``limit="0"`` when unset), and the limit itself where one is set."""
        config = self.ledger.config
        used_help = "resourcequota usage for a certain device"
        for namespace in self.ledger.quota_namespaces():
            (mem_limit, cores_limit), (used_mem, used_cores) = self.ledger.quota_usage(namespace)
            for resource, limit, used in (
                (config.resource_memory_name, mem_limit, used_mem),
                (config.resource_core_name, cores_limit, used_cores),
            ):
                if limit is None and not used:
                    continue
                shown = str(limit or 0)
                add(
                    "hami_resource_quota_used",
                    used_help,
                    {"namespace": namespace, "quota_name": resource, "limit": shown},
                    used,
                )
                add(
                    "QuotaUsed",
                    used_help,
                    {"quotanamespace": namespace, "quotaName": resource, "limit": shown},
                    used,
                )
                if limit is not None:
                    limit_help = "resourcequota limit for a certain device"
                    add(
                        "hami_resource_quota_limit",
                        limit_help,
                        {"namespace": namespace, "quota_name": resource},
                        limit,
                    )


class _FgdCollector(Collector):
    """The ``fgd`` policy's view of the cluster and its work, read at scrape time.

    The fragmentation gauges appear once the policy ranks with a typical workload (a ``fgd``
    filter ran, or one is pinned); reading them changes no decision.
    """

    def __init__(self, ranker: FgdRanker) -> None:
        self.ranker = ranker

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        ranker = self.ranker
        yield from self.cluster_families()
        yield GaugeMetricFamily(
            "hamid_fgd_typical_shapes",
            "Pod shapes in the typical workload fgd ranks by (0 until it has one).",
            value=len(ranker.workload.shapes),
        )
        yield CounterMetricFamily(
            "hamid_fgd_pods_learned",
            "Pods whose shape the learned workload counted.",
            value=ranker.histogram.observed,
        )
        yield CounterMetricFamily(
            "hamid_fgd_workload_changes",
            "Times the typical workload changed (each re-ranks every node for every pod shape).",
            value=ranker.epoch,
        )
        yield CounterMetricFamily(
            "hamid_fgd_reranks",
            "Gain indexes re-keyed in bulk (by a filter, or ahead of it for a pending pod): a pod "
            "shape's first ranking, its first after a workload change, or more than an eighth of "
            "the nodes changed since its last.",
            value=ranker.reranks,
        )
        yield CounterMetricFamily(
            "hamid_fgd_rerank_seconds", "Time spent in those bulk re-keys.", value=ranker.rerank_seconds
        )

    def cluster_families(self) -> Iterator[GaugeMetricFamily]:
        """The gauges describing the cluster (leader only, as every cluster family)."""
        if not (self.ranker.ranked and self.ranker.workload.groups):
            return
        for (name, help_text), value in zip(_FGD_CLUSTER, self.ranker.cluster(), strict=True):
            yield GaugeMetricFamily(name, help_text, value=value)


#: ``fgd``'s view of the cluster, the values of :meth:`FgdRanker.cluster` in its order.
_FGD_CLUSTER = (
    (
        "hamid_fgd_fragmentation_milli_gpu",
        "Idle GPU (milli-GPU) the typical pods cannot use where it is, summed over the nodes: "
        "FGD's cluster fragmentation under the workload fgd ranks by.",
    ),
    (
        "hamid_fgd_idle_milli_gpu",
        "Idle GPU (milli-GPU) as fgd counts it: each GPU's smaller free share of cores and memory.",
    ),
    ("hamid_fgd_node_states", "Distinct node states fgd judges (the size of a full re-rank)."),
)
#: Families describing the cluster (per GPU, per node, fgd's cluster view): exported by the leader
#: only (HAMi #1432).
CLUSTER_METRICS = frozenset(family.name for family in _GpuCollector(Ledger()).collect()) | {
    name for name, _ in _FGD_CLUSTER
}


class SchedulerMetrics:
    """Histograms and counters of the scheduler, registered in their own registry."""

    def __init__(
        self,
        ledger: Ledger,
        fgd: FgdRanker | None = None,
        pod_of: Callable[[str], Mapping[str, Any] | None] = lambda _key: None,
    ) -> None:
        """``pod_of``: the cached pod of a ``namespace/name`` (HAMi's MIG instance family reads
        the runtime ids the plugin wrote there; none without it)."""
        self.registry = CollectorRegistry()
        register_process_metrics(self.registry)
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
        self.bind_steer_wait_seconds = Histogram(
            "hamid_bind_steer_wait_seconds",
            "Time a bind to a node whose plugin hides replicas by steer waited for the plugin to "
            "confirm that kubelet was sent the pod's replicas, by outcome: confirmed, unconfirmed "
            "(the bind failed).",
            ["outcome"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        for outcome in ("confirmed", "unconfirmed"):
            self.bind_steer_wait_seconds.labels(outcome)
        self.filter_results = Counter(
            "hamid_filter_total", "Filter calls by result.", ["result"], registry=self.registry
        )
        self._reconcile_metrics()
        self._trust_and_numa_metrics()
        self.registry.register(_GpuCollector(ledger))
        if fgd is not None:
            self.registry.register(_FgdCollector(fgd))
        #: ``/metrics/hami``: HAMi's names from the same state (cluster families only: leader only).
        self.hami_registry = CollectorRegistry()
        self.hami_registry.register(HamiCompatCollector(ledger, pod_of))
        register_hami_build_info(self.hami_registry)

    def _reconcile_metrics(self) -> None:
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
        for outcome in ("clean", "repaired", "failed"):  # at 0: an alert's increase() sees the first
            self.reconcile_runs.labels(outcome)

    def _trust_and_numa_metrics(self) -> None:
        self.untrusted_annotations = Counter(
            "hamid_untrusted_annotations_total",
            "Scheduler-owned pod annotations not taken from a pod: removed at admission (webhook), "
            "a change denied at admission (webhook_denied), not booked (booking: no GPU requested, "
            "another node, capacity, foreign scheduler; foreign: unsigned or mis-signed; "
            "undecodable), or ignored because they disagree with the pod's booking (disagreement).",
            ["where"],
            registry=self.registry,
        )
        for where in ("webhook", "webhook_denied", "booking", "foreign", "undecodable", "disagreement"):
            self.untrusted_annotations.labels(where)
        self.numa_predictions = Counter(
            "hamid_numa_prediction",
            "NUMA predictions scored: hit or miss (kubelet's observed NUMA node, or a refit), unknown "
            "(no definite prediction for the chosen node).",
            ["result"],
            registry=self.registry,
        )
        for result in (HIT, MISS, UNKNOWN):
            self.numa_predictions.labels(result)
        self.numa_prediction_misses = Counter(
            "hamid_numa_prediction_misses",
            "NUMA prediction misses by cause: order (pods admitted in another order than predicted), "
            "foreign (a pod of another scheduler admitted in between), stale (profile changed), "
            "unmodelled (nothing else explains it).",
            ["cause"],
            registry=self.registry,
        )
        for cause in MISS_CAUSES:
            self.numa_prediction_misses.labels(cause)
