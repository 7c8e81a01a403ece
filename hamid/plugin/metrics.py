"""Prometheus metrics and health endpoints of ``hamid plugin`` (``--metrics-listen``).

``/metrics`` (hamid's names, promtool-clean): per-GPU health and replicas, Allocate and
GetPreferredAllocation calls and latency by gRPC status, refit client outcomes, XID events,
registration with kubelet and on the Node, NUMA predictions judged against kubelet's choice
(``hamid_numa_prediction_total``), per-container device memory and SM use read from
HAMi-core's cache files (:mod:`hamid.plugin.vgpu_monitor`), process metrics.
``/metrics/hami``: the same container usage under HAMi's vGPU monitor names (current and legacy,
read by HAMi's dashboards and HAMi-WebUI). ``/healthz``: the event loop answers. ``/readyz``:
registered with kubelet (503 with the reason otherwise).

Hooks are additive: :meth:`PluginMetrics.instrument` wraps the gRPC service's handler table,
:meth:`PluginMetrics.observe_refit` is the refit client's observer and :meth:`PluginMetrics.xid`
the XID watcher's callback; everything else is read at scrape time.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol

from aiohttp import web
from grpclib import GRPCError
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hamid.exposition import HAMI_ZONE, register_hami_build_info, register_process_metrics
from hamid.listen import serve
from hamid.log import get_logger
from hamid.model import objects
from hamid.model.kube import PodBody
from hamid.model.numa import MISS_CAUSES
from hamid.plugin.discovery import PhysicalGpu
from hamid.plugin.inventory import GpuInventory
from hamid.plugin.mig_manager import MigManager
from hamid.plugin.vgpu_monitor import UsageScan, scan

log = get_logger("plugin.metrics")

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
#: gRPC methods timed and counted (kubelet's calls that decide a container's GPUs).
TIMED_METHODS = {"Allocate": "allocate", "GetPreferredAllocation": "preferred_allocation"}
REFIT_OUTCOMES = ("committed", "refused", "failed")
#: Results of comparing a pod's hamid.io/numa-predicted with kubelet's choice (PodResources).
NUMA_PREDICTION_RESULTS = ("hit", "miss", "unknown")


class KubeletRegistration(Protocol):
    """What the metrics read of :class:`~hamid.plugin.kubelet_connector.KubeletConnector`."""

    registrations: int
    registered: bool


class NodeRegistration(Protocol):
    """What the metrics read of :class:`~hamid.plugin.register.NodeRegistrar`."""

    node_registered: bool
    patches: int


class PodLister(Protocol):
    """What the metrics read of :class:`~hamid.plugin.pods.NodePods`."""

    def pods(self) -> list[PodBody]: ...


#: pod UID -> (namespace, name) of the pods on this node (read on the event loop).
PodNames = Callable[[], Mapping[str, tuple[str, str]]]


def pod_names(pods: Iterable[Mapping[str, Any]]) -> dict[str, tuple[str, str]]:
    """pod UID -> (namespace, name): HAMi-core's cache directories are named by pod UID."""
    names: dict[str, tuple[str, str]] = {}
    for pod in pods:
        names[objects.uid(pod)] = (objects.namespace(pod), objects.name(pod))
    return names


#: The gRPC statuses the plugin answers kubelet with when it refuses, and those of a call that
#: failed otherwise (UNKNOWN: an exception, CANCELLED: kubelet gave up).
REFUSAL_CODES = (
    "FAILED_PRECONDITION",
    "INVALID_ARGUMENT",
    "RESOURCE_EXHAUSTED",
    "DEADLINE_EXCEEDED",
    "INTERNAL",
    "UNKNOWN",
    "CANCELLED",
)


class PluginMetrics:
    """Every metric of one plugin process; the HTTP app is :func:`metrics_app`."""

    def __init__(
        self, inventory: GpuInventory, *, hook_path: str, nvml: ModuleType | None = None, node_name: str = ""
    ) -> None:
        """Declare every plugin metric family in one place (one statement each, hence over 60 lines).

        ``nvml``: the NVML module the GPUs were discovered with (None: a devices file), read at
        scrape time for HAMi's host families on the node ``node_name``."""
        self.inventory = inventory
        self.hook_path = hook_path
        self.nvml = nvml
        self.node_name = node_name
        #: NVML's reading of each GPU at the last scrape (:func:`read_host_gpus`).
        self.host: tuple[HostGpu, ...] = ()
        self.kubelet: KubeletRegistration | None = None
        self.node: NodeRegistration | None = None
        self.pod_names: PodNames = dict
        #: The MIG instance manager of a ``mig`` mode node (None: none; no MIG families then).
        self.mig: MigManager | None = None
        self.usage = UsageScan((), 0)
        self._names: Mapping[str, tuple[str, str]] = {}
        self.registry = CollectorRegistry()
        register_process_metrics(self.registry)
        r = self.registry
        self.calls = Counter(
            "hamid_plugin_grpc_requests_total",
            "Allocate and GetPreferredAllocation calls from kubelet, by method and gRPC status.",
            ["method", "code"],
            registry=r,
        )
        self.seconds = Histogram(
            "hamid_plugin_grpc_duration_seconds",
            "Time to answer Allocate / GetPreferredAllocation, by method.",
            ["method"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        for method in TIMED_METHODS.values():
            # at 0 from the start, every answer the plugin gives: an alert's increase() sees the first
            for code in ("OK", *REFUSAL_CODES):
                self.calls.labels(method, code)
            self.seconds.labels(method)
        self.refits = Counter(
            "hamid_plugin_refit_requests_total",
            "NUMA refit calls to the scheduler by outcome: committed, refused (by the scheduler), "
            "failed (transport, TLS, token, timeout).",
            ["outcome"],
            registry=r,
        )
        for outcome in REFIT_OUTCOMES:
            self.refits.labels(outcome)
        self.refit_seconds = Histogram(
            "hamid_plugin_refit_duration_seconds",
            "Time of one refit call.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.xids = Counter(
            "hamid_plugin_xid_events_total",
            "NVML XID events by GPU, XID and whether it marked the GPU unhealthy.",
            ["device_uuid", "xid", "critical"],
            registry=r,
        )
        self.numa_predictions = Counter(
            "hamid_numa_prediction_total",
            "GPU pods whose NUMA node(s) kubelet chose, by comparison with the scheduler's "
            "hamid.io/numa-predicted: hit, miss, unknown (no prediction).",
            ["result"],
            registry=r,
        )
        for result in NUMA_PREDICTION_RESULTS:
            self.numa_predictions.labels(result)
        self.numa_prediction_misses = Counter(
            "hamid_numa_prediction_misses_total",
            "Missed NUMA predictions by cause, as the node agent sees them: order (other predicted "
            "pods admitted since the prediction), foreign (a pod without a prediction admitted since), "
            "stale (the profile changed), unmodelled (nothing else explains it).",
            ["cause"],
            registry=r,
        )
        for cause in MISS_CAUSES:
            self.numa_prediction_misses.labels(cause)
        r.register(_StateCollector(self))
        self.hami_registry = CollectorRegistry()
        self.hami_registry.register(_HamiMonitorCollector(self))
        self.hami_registry.register(_HostGpuCollector(self))
        register_hami_build_info(self.hami_registry)

    def attach(self, kubelet: KubeletRegistration, node: NodeRegistration, pods: PodLister) -> None:
        """The parts read at scrape time: kubelet registration, node registration, the node's pods."""
        self.kubelet, self.node = kubelet, node
        self.pod_names = lambda: pod_names(pods.pods())

    # -- hooks -----------------------------------------------------------------------------------

    def instrument(self, service: Any) -> _InstrumentedService:
        """``service`` for grpclib's ``Server`` with Allocate / GetPreferredAllocation measured."""
        return _InstrumentedService(service, self)

    def observe_refit(self, outcome: str, seconds: float) -> None:
        """The refit client's observer: one call's outcome and duration."""
        self.refits.labels(outcome).inc()
        self.refit_seconds.observe(seconds)

    def numa_prediction(self, result: str, cause: str = "") -> None:
        """The NUMA publisher's observer: one pod's prediction judged against kubelet's choice
        (``cause``: why it missed, "" unless a miss)."""
        self.numa_predictions.labels(result).inc()
        if cause:
            self.numa_prediction_misses.labels(cause).inc()

    def xid(self, uuid: str, xid: int, critical: bool) -> None:
        """One XID event (thread-safe: called from the NVML event thread)."""
        self.xids.labels(uuid or "unknown", str(xid), "true" if critical else "false").inc()

    # -- scrape ------------------------------------------------------------------------------------

    async def refresh(self) -> None:
        """Read HAMi-core's cache files (in a thread) and the pod names (here) before a scrape."""
        self._names = dict(self.pod_names())
        self.usage = await asyncio.to_thread(scan, self.hook_path)
        if self.nvml is not None:  # NVML may block on a lost GPU: never on the event loop
            self.host = await asyncio.to_thread(read_host_gpus, self.nvml, self.inventory.gpus)

    def containers(self) -> Iterator[tuple[str, str, str, Any]]:
        """(namespace, pod, container, devices) of every cache file whose pod is on this node."""
        for usage in self.usage.containers:
            names = self._names.get(usage.pod_uid)
            if names is not None:
                yield names[0], names[1], usage.container, usage.devices

    def not_ready_reason(self) -> str | None:
        """Why the plugin is not ready (None when registered with kubelet)."""
        if not self.inventory.gpus:
            return "no GPUs to advertise on this node"
        if self.kubelet is None or not self.kubelet.registered:
            return "not registered with kubelet"
        return None


class _InstrumentedService:
    """A grpclib handler table whose timed methods count and time every call."""

    def __init__(self, service: Any, metrics: PluginMetrics) -> None:
        self.service = service
        self.metrics = metrics

    def __mapping__(self) -> dict[str, Any]:
        mapping = dict(self.service.__mapping__())
        for path, handler in mapping.items():
            method = path.rsplit("/", 1)[-1]
            if method in TIMED_METHODS:
                mapping[path] = handler._replace(func=self._timed(TIMED_METHODS[method], handler.func))
        return mapping

    def _timed(self, method: str, func: Callable[[Any], Awaitable[None]]) -> Callable[[Any], Awaitable[None]]:
        metrics = self.metrics

        async def timed(stream: Any) -> None:
            started, code = time.perf_counter(), "OK"
            try:
                await func(stream)
            except GRPCError as exc:
                code = exc.status.name
                raise
            except asyncio.CancelledError:
                code = "CANCELLED"
                raise
            except Exception:
                code = "UNKNOWN"
                raise
            finally:
                metrics.calls.labels(method, code).inc()
                metrics.seconds.labels(method).observe(time.perf_counter() - started)

        return timed


class _StateCollector(Collector):
    """Gauges read at scrape time: GPUs, registration, per-container usage."""

    def __init__(self, metrics: PluginMetrics) -> None:
        self.m = metrics

    def collect(self) -> Iterator[Metric]:
        m = self.m
        # no node label: the scrape target carries it (the chart's ServiceMonitor relabels it in)
        gpu_labels = ["device_uuid", "device_index", "numa"]
        healthy = GaugeMetricFamily(
            "hamid_plugin_gpu_healthy",
            "1 while the GPU is healthy (no critical XID; with a CDI strategy, a CDI spec names it).",
            labels=gpu_labels,
        )
        replicas = GaugeMetricFamily(
            "hamid_plugin_gpu_replicas", "Replicas (vGPU slots) advertised to kubelet.", labels=gpu_labels
        )
        hidden = GaugeMetricFamily(
            "hamid_plugin_gpu_replicas_hidden",
            "Free replicas reported Unhealthy to kubelet by the --hide-replicas rule.",
            labels=gpu_labels,
        )
        for gpu in m.inventory.gpus:
            values = [gpu.uuid, str(gpu.index), str(gpu.numa if gpu.numa is not None else -1)]
            healthy.add_metric(values, 1.0 if m.inventory.is_healthy(gpu.uuid) else 0.0)
            replicas.add_metric(values, len(m.inventory.replica_ids(gpu.uuid)))
            hidden.add_metric(values, len(m.inventory.hidden(gpu.uuid)))
        yield from (healthy, replicas, hidden)
        kubelet = m.kubelet
        yield _gauge(
            "hamid_plugin_kubelet_registered",
            "1 while registered with kubelet.",
            kubelet is not None and kubelet.registered,
        )
        yield _counter(
            "hamid_plugin_kubelet_registrations",
            "Successful Register calls to kubelet.",
            kubelet.registrations if kubelet is not None else 0,
        )
        node = m.node
        yield _gauge(
            "hamid_plugin_node_registered",
            "1 once hami.io/node-nvidia-register was written for this node.",
            node is not None and node.node_registered,
        )
        yield _counter(
            "hamid_plugin_node_register_patches",
            "Register annotation patches sent.",
            node.patches if node else 0,
        )
        if m.mig is not None:
            yield from self._mig(m.mig)
        yield from self._usage()

    @staticmethod
    def _mig(mig: MigManager) -> Iterator[Metric]:
        instances = GaugeMetricFamily(
            "hamid_plugin_mig_instances",
            "MIG instances this plugin owns (created or adopted, not yet reclaimed), by GPU.",
            labels=["device_uuid"],
        )
        for uuid in mig.gpus:
            instances.add_metric([uuid], sum(1 for m in mig.instances() if m.key[0] == uuid))
        yield instances
        events = CounterMetricFamily(
            "hamid_plugin_mig_events",
            "MIG instance lifecycle events: created, reused (taken over), adopted, unowned (found at "
            "start, no record naming it), destroyed, destroy_deferred (a process runs on it), reset, "
            "and the failures create_failed, destroy_failed, adopt_failed, reset_failed, "
            "reconcile_skipped, reservation_unreadable.",
            labels=["event"],
        )
        for event, count in sorted(mig.events.items()):
            events.add_metric([event], count)
        yield events

    def _usage(self) -> Iterator[Metric]:
        labels = ["namespace", "pod", "container", "device_index", "device_uuid"]
        used = GaugeMetricFamily(
            "hamid_container_gpu_memory_used_bytes",
            "Device memory a container's processes use (HAMi-core shared region).",
            labels=labels,
        )
        limit = GaugeMetricFamily(
            "hamid_container_gpu_memory_limit_bytes", "Device memory limit HAMi-core enforces.", labels=labels
        )
        sm = GaugeMetricFamily(
            "hamid_container_gpu_sm_utilization_percent",
            "SM utilisation of a container's processes.",
            labels=labels,
        )
        for namespace, pod, container, devices in self.m.containers():
            for d in devices:
                values = [namespace, pod, container, str(d.index), d.uuid]
                used.add_metric(values, d.memory_used_bytes)
                limit.add_metric(values, d.memory_limit_bytes)
                sm.add_metric(values, d.sm_utilization_percent)
        yield from (used, limit, sm)
        yield _gauge(
            "hamid_container_cache_files_skipped",
            "HAMi-core cache files not read in the last scrape (not a 1.x shared region yet).",
            self.m.usage.skipped,
        )


class _HamiMonitorCollector(Collector):
    """HAMi vGPU monitor's container families (``cmd/vGPUmonitor/metrics.go``), current and legacy,
    each series with the ``zone="vGPU"`` label upstream's registry adds."""

    def __init__(self, metrics: PluginMetrics, clock: Callable[[], float] = time.time) -> None:
        self.m = metrics
        self.clock = clock

    def collect(self) -> Iterator[Metric]:
        new = ["namespace", "pod", "container", "vdevice_index", "device_uuid", "zone"]
        old = ["podnamespace", "podname", "ctrname", "vdeviceid", "deviceuuid", "zone"]
        described = [*old[:-1], "context", "module", "data", "offset", "zone"]
        fams = {
            "hami_vgpu_memory_used_bytes": ("vGPU device memory usage in bytes", new),
            "hami_vgpu_memory_limit_bytes": ("vGPU device memory limit in bytes", new),
            "hami_container_device_memory_bytes": ("Container device memory usage in bytes", new),
            "hami_container_device_utilization_ratio": ("Container device SM utilization ratio", new),
            "hami_vgpu_memory_context_bytes": ("Container device memory context size in bytes", new),
            "hami_vgpu_memory_module_bytes": ("Container device memory module size in bytes", new),
            "hami_vgpu_memory_buffer_bytes": ("Container device memory buffer size in bytes", new),
            "vGPU_device_memory_usage_in_bytes": ("vGPU device usage", old),
            "vGPU_device_memory_limit_in_bytes": ("vGPU device limit", old),
            "Device_memory_desc_of_container": ("Container device memory description", described),
            "Device_utilization_desc_of_container": ("Container device utilization description", old),
            "hami_container_last_kernel_elapsed_seconds": (
                "Seconds since last kernel execution in container",
                new,
            ),
            "Device_last_kernel_of_container": ("Container device last kernel description", old),
        }
        out = {name: GaugeMetricFamily(name, text, labels=labels) for name, (text, labels) in fams.items()}
        now = int(self.clock())
        for namespace, pod, container, devices in self.m.containers():
            for d in devices:
                values = [namespace, pod, container, str(d.index), d.uuid, HAMI_ZONE]
                if d.last_kernel_time > 0:  # upstream: only once a kernel ran
                    elapsed = max(now - d.last_kernel_time, 0)
                    out["hami_container_last_kernel_elapsed_seconds"].add_metric(values, elapsed)
                    out["Device_last_kernel_of_container"].add_metric(values, elapsed)
                for name, value in (
                    ("hami_vgpu_memory_used_bytes", d.memory_used_bytes),
                    ("hami_vgpu_memory_limit_bytes", d.memory_limit_bytes),
                    ("hami_container_device_memory_bytes", d.memory_used_bytes),
                    ("hami_container_device_utilization_ratio", d.sm_utilization_percent),
                    ("hami_vgpu_memory_context_bytes", d.context_bytes),
                    ("hami_vgpu_memory_module_bytes", d.module_bytes),
                    ("hami_vgpu_memory_buffer_bytes", d.data_bytes),
                    ("vGPU_device_memory_usage_in_bytes", d.memory_used_bytes),
                    ("vGPU_device_memory_limit_in_bytes", d.memory_limit_bytes),
                    ("Device_utilization_desc_of_container", d.sm_utilization_percent),
                ):
                    out[name].add_metric(values, value)
                parts = [str(d.context_bytes), str(d.module_bytes), str(d.data_bytes), str(d.offset_bytes)]
                described_values = [*values[:-1], *parts, HAMI_ZONE]
                out["Device_memory_desc_of_container"].add_metric(described_values, d.memory_used_bytes)
        yield from out.values()


@dataclass(frozen=True, slots=True)
class HostGpu:
    """NVML's reading of one GPU: memory used (bytes), GPU and memory-controller utilisation (%)."""

    gpu: PhysicalGpu
    memory_used_bytes: int
    utilization_percent: int
    memory_utilization_percent: int


def read_host_gpus(nvml: ModuleType, gpus: Iterable[PhysicalGpu]) -> tuple[HostGpu, ...]:
    """Each GPU's NVML reading (blocking); a GPU NVML cannot read is left out, as upstream does."""
    out: list[HostGpu] = []
    for gpu in gpus:
        try:
            handle = nvml.nvmlDeviceGetHandleByUUID(gpu.uuid)
            used = nvml.nvmlDeviceGetMemoryInfo(handle).used
            rates = nvml.nvmlDeviceGetUtilizationRates(handle)
        except nvml.NVMLError as exc:
            log.debug("host_gpu_unreadable", uuid=gpu.uuid, error=str(exc))
            continue
        out.append(HostGpu(gpu, int(used), int(rates.gpu), int(rates.memory)))
    return tuple(out)


class _HostGpuCollector(Collector):
    """HAMi vGPU monitor's host families from the last scrape's NVML readings (none without NVML)."""

    def __init__(self, metrics: PluginMetrics) -> None:
        self.m = metrics

    def collect(self) -> Iterator[Metric]:
        new = ["node", "device_index", "device_uuid", "device_type", "zone"]
        old = ["nodeid", "deviceidx", "deviceuuid", "devicetype", "zone"]
        fams = {
            "hami_host_gpu_memory_used_bytes": ("GPU device memory usage in bytes", new),
            "hami_host_gpu_utilization_ratio": ("GPU core utilization ratio (0-100)", new),
            "hami_host_gpu_memory_controller_utilization_ratio": (
                "GPU memory controller utilization ratio (0-100)",
                new[1:],
            ),
            "HostGPUMemoryUsage": ("GPU device memory usage", old),
            "HostCoreUtilization": ("GPU core utilization", old),
        }
        out = {name: GaugeMetricFamily(name, text, labels=labels) for name, (text, labels) in fams.items()}
        for host in self.m.host:
            gpu = host.gpu
            values = [self.m.node_name, str(gpu.index), gpu.uuid, f"NVIDIA-{gpu.name}", HAMI_ZONE]
            out["hami_host_gpu_memory_used_bytes"].add_metric(values, host.memory_used_bytes)
            out["HostGPUMemoryUsage"].add_metric(values, host.memory_used_bytes)
            out["hami_host_gpu_utilization_ratio"].add_metric(values, host.utilization_percent)
            out["HostCoreUtilization"].add_metric(values, host.utilization_percent)
            controller = host.memory_utilization_percent
            out["hami_host_gpu_memory_controller_utilization_ratio"].add_metric(values[1:], controller)
        yield from out.values()


def _gauge(name: str, text: str, value: float | bool | None) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, text, value=float(value or 0))


def _counter(name: str, text: str, value: float | None) -> CounterMetricFamily:
    return CounterMetricFamily(name, text, value=float(value or 0))


METRICS_KEY = web.AppKey("metrics", PluginMetrics)


async def _metrics(request: web.Request) -> web.Response:
    metrics = request.app[METRICS_KEY]
    await metrics.refresh()
    return web.Response(body=generate_latest(metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _hami_metrics(request: web.Request) -> web.Response:
    metrics = request.app[METRICS_KEY]
    await metrics.refresh()
    payload = generate_latest(metrics.hami_registry)
    return web.Response(body=payload, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _healthz(_request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def _readyz(request: web.Request) -> web.Response:
    reason = request.app[METRICS_KEY].not_ready_reason()
    if reason:
        return web.Response(status=503, text=f"not ready: {reason}")
    return web.Response(text="ok")


@contextlib.asynccontextmanager
async def serve_metrics(metrics: PluginMetrics, listen: str) -> AsyncIterator[int | None]:
    """Serve :func:`metrics_app` on ``listen`` ("" = not at all) while the block runs; yields the port.

    A bind failure raises :class:`~hamid.listen.ListenError` (one line, no traceback).
    """
    if not listen:
        yield None
        return
    runner, port = await serve(metrics_app(metrics), listen, what="metrics listener")
    log.info("metrics_endpoints_serving", port=port)
    try:
        yield port
    finally:
        await runner.cleanup()


def metrics_app(metrics: PluginMetrics) -> web.Application:
    """``/metrics``, ``/metrics/hami``, ``/healthz``, ``/readyz``."""
    app = web.Application(client_max_size=1 << 16)
    app[METRICS_KEY] = metrics
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/metrics/hami", _hami_metrics)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/readyz", _readyz)
    return app
