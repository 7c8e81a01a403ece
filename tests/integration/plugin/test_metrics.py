"""``hamid plugin``'s metrics and health endpoints over real HTTP, real gRPC and real cache files."""

from __future__ import annotations

import contextlib
import os
import struct
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from grpclib import GRPCError
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

import hamid
from hamid.listen import serve
from hamid.model.nodeconfig import NodeConfig
from hamid.model.refit import RefitRequest
from hamid.plugin.discovery import HealthCheckPolicy, discover_nvml, watch_xid_events
from hamid.plugin.inventory import GpuInventory
from hamid.plugin.metrics import PluginMetrics, metrics_app
from hamid.plugin.refit_client import RefitClient, RefitClientConfig, RefitError
from tests.integration.plugin.helpers import Env, dev, eventually, lock_node, running_plugin, scheduled_pod
from tests.integration.plugin.test_allocate import allocate, stub_for
from tests.integration.refit.fake_scheduler import fake_scheduler
from tests.unit.metrics.promtool import needs_promtool, promtool_problems
from tests.unit.plugin.fake_nvml import FakeGpu, FakeNvml

# HAMi-core's shared_region_t (multiprocess_memory_limit.h, 1.x) on x86_64/arm64, offsets worked
# out by hand from the header, independently of hamid's ctypes mirror.
MAGIC, REGION_SIZE, UUIDS_AT, LIMIT_AT, SM_LIMIT_AT, PROCS_AT, SLOT_SIZE, PROC_NUM_AT = (
    19920718,
    2008952,
    64,
    1600,
    1728,
    1856,
    1960,
    2008896,
)
SLOT_USED_AT, MEMORY_T_SIZE, SLOT_MONITOR_AT, SLOT_UTIL_AT, UTIL_T_SIZE = 8, 64, 1032, 1160, 48
SLOT_STATUS_AT = SLOT_UTIL_AT + 16 * UTIL_T_SIZE  # after device_util[16]
LAST_KERNEL_AT = PROC_NUM_AT + 16  # after proc_num, utilization_switch, recent_kernel, priority


def write_region(
    path: Path,
    uuids: list[str],
    limits: list[int],
    procs: list[tuple[int, list[int], list[int]]],
    last_kernel: int = 0,
    exited: int = 0,
) -> None:
    """A cache file as HAMi-core writes it: procs are (pid, per-device total bytes, per-device SM %),
    each with its status set but the last ``exited`` (HAMi's monitor counts only set ones)."""
    buf = bytearray(REGION_SIZE)
    struct.pack_into("<iII", buf, 0, MAGIC, 1, 2)
    struct.pack_into("<Q", buf, 56, len(uuids))
    for i, (uuid, limit) in enumerate(zip(uuids, limits, strict=True)):
        buf[UUIDS_AT + 96 * i : UUIDS_AT + 96 * i + len(uuid)] = uuid.encode()
        struct.pack_into("<Q", buf, LIMIT_AT + 8 * i, limit)
        struct.pack_into("<Q", buf, SM_LIMIT_AT + 8 * i, 30)
    for n, (pid, totals, sm) in enumerate(procs):
        slot = PROCS_AT + n * SLOT_SIZE
        struct.pack_into("<ii", buf, slot, pid, pid + 1000)
        struct.pack_into("<i", buf, slot + SLOT_STATUS_AT, 0 if n >= len(procs) - exited else 1)
        for i, (total, util) in enumerate(zip(totals, sm, strict=True)):
            mem = slot + SLOT_USED_AT + MEMORY_T_SIZE * i
            struct.pack_into("<QQQQQ", buf, mem, 1, 2, total - 3, 0, total)
            struct.pack_into("<Q", buf, slot + SLOT_UTIL_AT + UTIL_T_SIZE * i + 16, util)
    struct.pack_into("<i", buf, PROC_NUM_AT, len(procs))
    struct.pack_into("<Q", buf, LAST_KERNEL_AT, last_kernel)
    path.write_bytes(bytes(buf))


@contextlib.asynccontextmanager
async def endpoint(metrics: PluginMetrics) -> AsyncIterator[str]:
    runner, port = await serve(metrics_app(metrics), "127.0.0.1:0")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def get(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        return resp.status, await resp.text()


def samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def one(found: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    values = [v for got, v in found.get(name, []) if all(got.get(k) == w for k, w in labels.items())]
    assert len(values) == 1, (name, labels, found.get(name))
    return values[0]


async def _allocate_one(env: Env) -> str:
    pod = scheduled_pod("p1", ((dev("GPU-0", 2000, 30),),))
    created = env.server.put(pod)
    lock_node(env.server, "p1")
    await eventually(lambda: env.plugin.pods.pod("default/p1") is not None)
    async with stub_for(env) as stub:
        await allocate(stub, "GPU-0-0")
        with pytest.raises(GRPCError):
            await allocate(stub, "not-a-replica")
    return str(created["metadata"]["uid"])


async def test_health_readiness_and_allocate_metrics() -> None:
    async with running_plugin(with_kubelet=True) as (env, _kubelet):
        metrics = env.plugin.metrics
        async with endpoint(metrics) as url:
            assert await get(url + "/healthz") == (200, "ok")
            await eventually(lambda: env.plugin.connector.registered)
            assert await get(url + "/readyz") == (200, "ok")
            uid = await _allocate_one(env)
            cache = env.hook / "vgpu" / "containers" / f"{uid}_main"
            cache.mkdir(parents=True, exist_ok=True)
            mib = 1024 * 1024
            procs = [(7, [300 * mib], [12]), (8, [200 * mib], [5]), (9, [900 * mib], [40])]
            ran = int(time.time()) - 30
            write_region(cache / "abc.cache", ["GPU-0"], [2000 * mib], procs, last_kernel=ran, exited=1)
            (cache / "partial.cache").write_bytes(b"\0" * 100)  # being created: skipped, not misread
            status, text = await get(url + "/metrics")
            assert status == 200
            found = samples(text)
            assert one(found, "hamid_plugin_grpc_requests_total", method="allocate", code="OK") == 1
            assert (
                one(found, "hamid_plugin_grpc_requests_total", method="allocate", code="FAILED_PRECONDITION")
                == 1
            )
            assert one(found, "hamid_plugin_grpc_duration_seconds_count", method="allocate") == 2
            assert one(found, "hamid_plugin_gpu_healthy", device_uuid="GPU-0", numa="0") == 1
            assert one(found, "hamid_plugin_gpu_replicas", device_uuid="GPU-3", numa="1") == 4
            assert one(found, "hamid_plugin_kubelet_registered") == 1
            assert one(found, "hamid_plugin_kubelet_registrations_total") >= 1
            assert env.plugin.registrar.node_registered
            assert one(found, "hamid_plugin_node_registered") == 1
            ctr = {"namespace": "default", "pod": "p1", "container": "main", "device_index": "0"}
            assert (
                one(found, "hamid_container_gpu_memory_used_bytes", **ctr, device_uuid="GPU-0") == 500 * mib
            )
            assert one(found, "hamid_container_gpu_memory_limit_bytes", **ctr) == 2000 * mib
            assert one(found, "hamid_container_gpu_sm_utilization_percent", **ctr) == 17
            assert one(found, "hamid_container_cache_files_skipped") == 1
            assert "_created" not in text
            status, hami = await get(url + "/metrics/hami")
            old = {"podnamespace": "default", "podname": "p1", "ctrname": "main", "vdeviceid": "0"}
            found = samples(hami)
            assert one(found, "vGPU_device_memory_usage_in_bytes", **old, deviceuuid="GPU-0") == 500 * mib
            assert one(found, "vGPU_device_memory_limit_in_bytes", **old) == 2000 * mib
            assert one(found, "Device_utilization_desc_of_container", **old) == 17
            new = {"namespace": "default", "pod": "p1", "container": "main", "vdevice_index": "0"}
            assert one(found, "hami_vgpu_memory_used_bytes", **new) == 500 * mib
            assert one(found, "hami_container_device_utilization_ratio", **new) == 17
            # as HAMi's monitor (a metrics audit): zone="vGPU" on every series, the offset label the
            # used memory less context, module and data, the last kernel's age, the build
            assert {
                labels.get("zone")
                for name, series in found.items()
                for labels, _ in series
                if name != "hami_build_info"
            } == {"vGPU"}
            [(described, _)] = found["Device_memory_desc_of_container"]
            assert (described["context"], described["module"], described["offset"]) == ("2", "4", "0")
            assert 30 <= one(found, "hami_container_last_kernel_elapsed_seconds", **new) < 90
            assert 30 <= one(found, "Device_last_kernel_of_container", **old) < 90
            assert one(found, "hami_build_info", version=hamid.__version__) == 1


async def test_a_container_with_two_cache_files_is_exported_once_from_its_newest_region() -> None:
    """A container allocated again (each ``Allocate`` names a fresh cache file) keeps its previous
    region beside the live one: every usage series was exported twice under one label set, and
    Prometheus kept whichever came first. One series per container and device, from the newest
    region (HAMi's monitor takes the first by name: here the stale one)."""
    async with running_plugin(with_kubelet=True) as (env, _kubelet), endpoint(env.plugin.metrics) as url:
        await eventually(lambda: env.plugin.connector.registered)
        uid = await _allocate_one(env)
        cache = env.hook / "vgpu" / "containers" / f"{uid}_main"
        cache.mkdir(parents=True, exist_ok=True)
        mib = 1024 * 1024
        stale, live = cache / "0f0e.cache", cache / "a1b2.cache"
        write_region(stale, ["GPU-0"], [2000 * mib], [(7, [300 * mib], [12])])
        write_region(live, ["GPU-0"], [2000 * mib], [(9, [900 * mib], [40])])
        earlier = time.time_ns() - 600 * 10**9
        os.utime(stale, ns=(earlier, earlier))
        ctr = {"namespace": "default", "pod": "p1", "container": "main", "device_index": "0"}
        old = {"podnamespace": "default", "podname": "p1", "ctrname": "main", "vdeviceid": "0"}
        for path, used, sm in ((live, 900, 40), (stale, 300, 12)):
            os.utime(path)  # now the newest
            _status, text = await get(url + "/metrics")
            _status, hami = await get(url + "/metrics/hami")
            for exposition in (text, hami):
                series = [
                    (s.name, tuple(sorted(s.labels.items())))
                    for family in text_string_to_metric_families(exposition)
                    for s in family.samples
                ]
                assert len(series) == len(set(series)), exposition
            found, found_hami = samples(text), samples(hami)
            assert one(found, "hamid_container_gpu_memory_used_bytes", **ctr) == used * mib
            assert one(found, "hamid_container_gpu_sm_utilization_percent", **ctr) == sm
            assert one(found, "hamid_container_cache_files_skipped") == 0
            assert one(found_hami, "vGPU_device_memory_usage_in_bytes", **old) == used * mib


@needs_promtool
async def test_plugin_metrics_pass_promtool() -> None:
    async with running_plugin(with_kubelet=True) as (env, _kubelet), endpoint(env.plugin.metrics) as url:
        await eventually(lambda: env.plugin.connector.registered)
        await _allocate_one(env)
        env.plugin.metrics.observe_refit("committed", 0.01)
        env.plugin.metrics.xid("GPU-1", 79, True)
        _status, text = await get(url + "/metrics")
        assert promtool_problems(text.encode()) == ""
        assert "process_resident_memory_bytes" in text


async def test_not_ready_until_registered_with_kubelet() -> None:
    async with running_plugin() as (env, _none), endpoint(env.plugin.metrics) as url:
        assert await get(url + "/readyz") == (503, "not ready: not registered with kubelet")
        assert await get(url + "/healthz") == (200, "ok")


async def test_refit_client_outcomes_are_observed() -> None:
    outcomes: list[str] = []
    request = RefitRequest("uid", "default", "p", "n1", 0, "NVIDIA", ("GPU-1",), container_name="main")
    for body, want in (
        ({"succeeded": True, "containerDevices": "GPU-1,NVIDIA,1000,10:"}, "committed"),
        ({"succeeded": False, "failureReason": "no allowed device fits"}, "refused"),
    ):
        async with fake_scheduler(None, body=body) as fake:
            client = RefitClient(RefitClientConfig(endpoint=fake.url, token_file=None))
            client.observer = lambda outcome, _s: outcomes.append(outcome)
            with contextlib.suppress(RefitError):
                await client.refit(request)
        assert outcomes[-1] == want
    client = RefitClient(RefitClientConfig(endpoint="http://127.0.0.1:1", token_file=None))
    client.observer = lambda outcome, _s: outcomes.append(outcome)
    with pytest.raises(RefitError):
        await client.refit(request)
    assert outcomes == ["committed", "refused", "failed"]


def test_xid_events_are_counted() -> None:
    a, b = FakeGpu("GPU-a"), FakeGpu("GPU-b")
    nvml = FakeNvml([a, b])
    seen: list[tuple[str, int, bool]] = []
    stop = threading.Event()
    thread = threading.Thread(
        target=watch_xid_events,
        args=(["GPU-a", "GPU-b"], lambda _u, _r: None, stop, HealthCheckPolicy(), nvml),
        kwargs={"wait_ms": 20, "on_xid": lambda u, x, c: seen.append((u, x, c))},
    )
    thread.start()
    try:
        nvml.xid(a, 13)
        nvml.xid(b, 79)
        for _ in range(500):
            if len(seen) == 2:
                break
            stop.wait(0.01)
        assert seen == [("", 13, False), ("GPU-b", 79, True)]
    finally:
        stop.set()
        thread.join(5)


async def test_host_gpu_families_as_hamis_monitor() -> None:
    """A metrics audit: HAMi's monitor serves NVML's memory used and utilisation of each GPU, and
    its dashboard's host panels read them; hamid served none. A GPU NVML cannot read is left out."""
    busy = FakeGpu("GPU-busy", name="NVIDIA H200", memory_used_bytes=7 * 1024**3, utilization=(63, 21))
    lost = FakeGpu("GPU-lost", bus_id="00000000:5E:00.0", fail={"utilization"})
    nvml = FakeNvml([busy, lost])
    gpus = discover_nvml("/nonexistent", nvml)
    metrics = PluginMetrics(
        GpuInventory(gpus, NodeConfig()), hook_path="/nonexistent", nvml=nvml, node_name="n1"
    )
    await metrics.refresh()  # NVML is read in a thread before a scrape, never on the event loop
    found = samples(generate_latest(metrics.hami_registry).decode())
    labels = {
        "node": "n1",
        "device_index": "0",
        "device_uuid": "GPU-busy",
        "device_type": "NVIDIA-NVIDIA H200",
    }
    assert one(found, "hami_host_gpu_memory_used_bytes", **labels, zone="vGPU") == 7 * 1024**3
    assert one(found, "hami_host_gpu_utilization_ratio", **labels) == 63
    assert one(found, "hami_host_gpu_memory_controller_utilization_ratio", device_uuid="GPU-busy") == 21
    assert "node" not in found["hami_host_gpu_memory_controller_utilization_ratio"][0][0]
    assert one(found, "HostGPUMemoryUsage", nodeid="n1", deviceuuid="GPU-busy") == 7 * 1024**3
    assert one(found, "HostCoreUtilization", deviceidx="0", devicetype="NVIDIA-NVIDIA H200") == 63
    assert all(labels["device_uuid"] != "GPU-lost" for labels, _ in found["hami_host_gpu_memory_used_bytes"])
    without = PluginMetrics(GpuInventory(gpus, NodeConfig()), hook_path="/nonexistent")  # a devices file
    assert "hami_host_gpu_memory_used_bytes" not in samples(generate_latest(without.hami_registry).decode())
