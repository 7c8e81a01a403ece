"""Scheduler metrics: promtool-clean ``/metrics``; HAMi's names on ``/metrics/hami`` from the same state."""

from __future__ import annotations

import dataclasses

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from hamid.fit.fgd import Shape, Workload
from hamid.model import annotations as ann
from hamid.model.resources import ResourceConfig
from hamid.scheduler.fgd_rank import FgdRanker
from hamid.scheduler.metrics import CLUSTER_METRICS, SchedulerMetrics
from hamid.scheduler.node_cpu_mem import NodeCpuMem
from hamid.scheduler.numa_ledger import NumaLedgers
from hamid.scheduler.state import SchedulerState
from tests.unit.metrics.promtool import needs_promtool, promtool_problems
from tests.unit.scheduler.helpers import gpu, node, placed, pod


def _state() -> SchedulerState:
    state = SchedulerState()
    state.on_node(node("n1"))
    state.on_quota(
        {
            "metadata": {"name": "q", "namespace": "default"},
            "spec": {"hard": {"limits.nvidia.com/gpumem": "3000", "limits.nvidia.com/gpucores": "50"}},
        }
    )
    state.ledger.on_pod(placed(pod("a"), "n1", "n1-gpu0,NVIDIA,1000,30:;"))
    return state


def _fgd(state: SchedulerState) -> FgdRanker:
    """A ``fgd`` ranker over the state's nodes with a pinned workload (so it ranks at once)."""
    config = ResourceConfig()
    numa = NumaLedgers("hami-scheduler", config.resource_count_name, lambda: 0.0, booked_on=lambda _uid: None)
    pinned = Workload.of([(Shape(1000, 1024, 1, 500), 0.5), (Shape(4000, 1024, 1, 1000), 0.5)])
    return FgdRanker(config, state.ledger.inventory, numa, NodeCpuMem(), pinned)


def _samples(payload: bytes) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(payload.decode()):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def _one(samples: list[tuple[dict[str, str], float]], **labels: str) -> float:
    found = [v for got, v in samples if all(got.get(k) == want for k, want in labels.items())]
    assert len(found) == 1, (labels, samples)
    return found[0]


@needs_promtool
def test_scheduler_metrics_pass_promtool() -> None:
    state = _state()
    metrics = SchedulerMetrics(state.ledger, _fgd(state))
    metrics.filter_results.labels("ok").inc()
    metrics.bind_seconds.labels("ok").observe(0.01)
    payload = generate_latest(metrics.registry)
    assert promtool_problems(payload) == ""
    text = payload.decode()
    assert "_created" not in text
    assert "process_resident_memory_bytes" in text and "python_info" in text
    assert "hamid_fgd_fragmentation_milli_gpu" in text and "hamid_fgd_reranks_total" in text


def test_fgds_cluster_view_is_a_cluster_family() -> None:
    """A follower exports no cluster family; fgd's fragmentation, idle GPU and states are among them."""
    state = _state()
    names = {family.name for family in SchedulerMetrics(state.ledger, _fgd(state)).registry.collect()}
    fgd_names = {name for name in names if name.startswith("hamid_fgd_")}
    assert {"hamid_fgd_fragmentation_milli_gpu", "hamid_fgd_idle_milli_gpu", "hamid_fgd_node_states"} <= (
        fgd_names & CLUSTER_METRICS
    )
    assert {"hamid_fgd_workload_changes", "hamid_fgd_reranks"} <= fgd_names - CLUSTER_METRICS
    s = _samples(generate_latest(SchedulerMetrics(state.ledger, _fgd(state)).registry))
    assert _one(s["hamid_fgd_idle_milli_gpu"]) == 1700  # n1: one GPU idle, one with 30 % of its cores booked


def test_core_ratio_is_a_ratio_and_shared_is_containers() -> None:
    s = _samples(generate_latest(SchedulerMetrics(_state().ledger).registry))
    assert _one(s["hamid_gpu_core_allocated_ratio"], device_uuid="n1-gpu0") == 0.3
    assert _one(s["hamid_gpu_core_limit_percent"], device_uuid="n1-gpu0") == 100
    assert _one(s["hamid_gpu_shared_containers"], device_uuid="n1-gpu0") == 1
    assert _one(s["hamid_gpu_memory_allocated_bytes"], device_uuid="n1-gpu0") == 1000 * 1024 * 1024
    assert "hamid_gpu_shared_count" not in s


def test_hami_names_carry_the_same_numbers() -> None:
    s = _samples(generate_latest(SchedulerMetrics(_state().ledger).hami_registry))
    mib = 1024 * 1024
    gpu0 = {"nodeid": "n1", "deviceuuid": "n1-gpu0", "deviceidx": "0", "zone": "vGPU"}
    assert _one(s["GPUDeviceMemoryAllocated"], **gpu0, devicecores="100") == 1000 * mib
    assert _one(s["GPUDeviceCoreAllocated"], **gpu0) == 30
    assert _one(s["GPUDeviceCoreLimit"], **gpu0) == 100
    assert _one(s["GPUDeviceSharedNum"], **gpu0) == 1
    assert _one(s["nodeGPUMemoryPercentage"], **gpu0) > 0
    new = {"node": "n1", "device_uuid": "n1-gpu0", "device_index": "0", "zone": "vGPU"}
    assert _one(s["hami_gpu_core_allocated_ratio"], **new) == 30
    assert _one(s["hami_gpu_shared_count"], **new) == 1
    ctr = {"podnamespace": "default", "podname": "a", "nodename": "n1", "containeridx": "0"}
    assert _one(s["vGPUMemoryAllocated"], **ctr, deviceuuid="n1-gpu0") == 1000 * mib
    assert _one(s["vGPUCoreAllocated"], **ctr, deviceuuid="n1-gpu0") == 30
    assert _one(s["hami_vgpu_memory_allocated_bytes"], pod="a", device_uuid="n1-gpu0") == 1000 * mib
    assert _one(s["QuotaUsed"], quotanamespace="default", quotaName="nvidia.com/gpumem", limit="3000") == 1000
    assert _one(s["hami_resource_quota_used"], namespace="default", quota_name="nvidia.com/gpucores") == 30


@needs_promtool
def test_promtool_catches_the_old_names() -> None:
    """The check bites: a gauge ending in ``_count`` (the scheduler's old name) is refused."""
    bad = b"# HELP hamid_gpu_shared_count x\n# TYPE hamid_gpu_shared_count gauge\nhamid_gpu_shared_count 1\n"
    assert "_count" in promtool_problems(bad)


def test_hami_core_values_are_upstreams_on_scaled_gpus() -> None:
    """A metrics audit: HAMi reports a GPU's cores as registered (200 with ``devicecorescaling``
    2), normalising to percent only AMD's compute units; hamid reported 100 and a percent. And
    ``hami_node_gpu_memory_allocated_ratio`` carries ``device_type`` as upstream's."""
    state = SchedulerState()
    scaled = [gpu("s-gpu0", core=200), gpu("s-gpu1", index=1, core=200)]
    amd = dataclasses.replace(gpu("a-gpu0", core=60), type="AMD-MI300X")
    for name, devices in (("s", scaled), ("a", [amd])):
        registered = {ann.NODE_REGISTER: ann.encode_node_devices(devices)}
        state.on_node({"metadata": {"name": name, "annotations": registered}, "status": {"allocatable": {}}})
    state.ledger.on_pod(placed(pod("p"), "s", "s-gpu0,NVIDIA,1000,50:;"))
    s = _samples(generate_latest(SchedulerMetrics(state.ledger).hami_registry))
    scaled0 = {"node": "s", "device_uuid": "s-gpu0", "zone": "vGPU"}
    assert _one(s["hami_gpu_core_limit_ratio"], **scaled0) == 200
    assert _one(s["hami_gpu_core_allocated_ratio"], **scaled0) == 50
    assert _one(s["hami_vgpu_core_allocated_ratio"], pod="p", device_uuid="s-gpu0") == 50
    amd0 = {"node": "a", "device_uuid": "a-gpu0", "zone": "vGPU"}
    assert _one(s["hami_gpu_core_limit_ratio"], **amd0) == 100  # 60 compute units as 100 %
    assert _one(s["hami_node_gpu_memory_allocated_ratio"], **scaled0, device_type="NVIDIA-A100") > 0


def test_hami_quota_families_cover_every_namespace_using_gpus() -> None:
    """A metrics audit: HAMi's quota manager keeps an entry for every namespace whose pods hold
    GPUs (``limit="0"`` without a ResourceQuota) and exports each set limit; hamid exported only
    namespaces with a GPU quota and had no ``hami_resource_quota_limit``."""
    state = _state()
    state.ledger.on_pod(placed(pod("b", namespace="team-b"), "n1", "n1-gpu1,NVIDIA,500,20:;"))
    s = _samples(generate_latest(SchedulerMetrics(state.ledger).hami_registry))
    mem, cores = "nvidia.com/gpumem", "nvidia.com/gpucores"
    assert _one(s["hami_resource_quota_used"], namespace="team-b", quota_name=mem, limit="0") == 500
    assert _one(s["QuotaUsed"], quotanamespace="team-b", quotaName=cores, limit="0") == 20
    assert _one(s["hami_resource_quota_limit"], namespace="default", quota_name=mem) == 3000
    assert _one(s["hami_resource_quota_limit"], namespace="default", quota_name=cores) == 50
    assert not [labels for labels, _ in s["hami_resource_quota_limit"] if labels["namespace"] == "team-b"]
