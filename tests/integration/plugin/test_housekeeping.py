"""The node agent's side tasks: a failing XID watcher, cache-directory cleanup, license mounts."""

from __future__ import annotations

import asyncio
import os
import sys
import traceback
import uuid
from pathlib import Path

import pytest
import structlog.testing

from hamid._proto.deviceplugin.v1beta1 import api_pb2 as pb
from hamid.plugin.cachedirs import pod_uid_of, sweep
from tests.integration.plugin.helpers import (
    GPUS,
    FakeKubelet,
    dev,
    eventually,
    running_plugin,
    scheduled_pod,
)
from tests.integration.plugin.test_allocate import allocate, seeded, stub_for
from tests.unit.plugin.fake_nvml import FakeGpu, FakeNvml, NVMLError


@pytest.mark.parametrize("fault", ["event-set-create", "event-wait"])
async def test_a_failing_xid_watcher_keeps_the_plugin_serving(fault: str) -> None:
    """NVML events fail (nvmlEventSetCreate, or any exception in the thread): logged at error, the
    plugin keeps serving kubelet and registering, without health checks (NVIDIA's plugin does so)."""
    nvml = FakeNvml([FakeGpu(g.uuid) for g in GPUS])
    if fault == "event-set-create":
        nvml.event_set_error = NVMLError(999)
    else:
        nvml.events.put(RuntimeError("driver went away"))
    with structlog.testing.capture_logs() as logs:
        async with running_plugin(nvml=nvml, with_kubelet=True) as (env, kubelet):
            await eventually(lambda: any(e["event"] == "xid_watcher_failed_no_health_checks" for e in logs))
            assert isinstance(kubelet, FakeKubelet)
            await eventually(lambda: bool(kubelet.requests) and bool(kubelet.lists))
            (entry,) = [e for e in logs if e["event"] == "xid_watcher_failed_no_health_checks"]
            assert entry["log_level"] == "error"
            # still serving: a pod is allocated after the watcher died
            async with stub_for(env) as stub:
                await seeded(env, scheduled_pod("p", ((dev("GPU-0", 1000, 10),),)))
                r = await allocate(stub, "GPU-0-0")
                assert r.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-0"
            assert len(kubelet.lists[-1].devices) == 16


def _dirs(env_hook: Path) -> set[str]:
    base = env_hook / "vgpu" / "containers"
    return {p.name for p in base.iterdir()} if base.is_dir() else set()


async def test_cache_directories_of_pods_gone_from_the_node_are_removed() -> None:
    pod = scheduled_pod("p", ((dev("GPU-0", 1000, 10),),))
    async with running_plugin(cleanup_interval=0.05, cleanup_min_age=0) as (env, _), stub_for(env) as stub:
        await seeded(env, pod)
        uid = env.server.get("Pod", "default", "p")["metadata"]["uid"]
        await allocate(stub, "GPU-0-0")
        base = env.hook / "vgpu" / "containers"
        gone = f"{uuid.uuid4()}_main"
        other_node = f"{uuid.uuid4()}_train"

        def seed() -> None:
            (base / gone).mkdir()
            (base / other_node).mkdir()
            (base / "not-a-pod-dir").mkdir()
            (base / f"{uuid.uuid4()}_file").write_text("x")

        await asyncio.to_thread(seed)
        await eventually(lambda: gone not in _dirs(env.hook) and other_node not in _dirs(env.hook))
        names = await asyncio.to_thread(_dirs, env.hook)
        assert f"{uid}_main" in names  # the cache still holds the pod
        assert "not-a-pod-dir" in names and any(n.endswith("_file") for n in names)  # untouched
        env.server.delete("Pod", "default", "p")
        await eventually(lambda: f"{uid}_main" not in _dirs(env.hook))


def test_sweep_spares_young_directories_and_names_it_does_not_own(tmp_path: Path) -> None:
    young = f"{uuid.uuid4()}_main"
    (tmp_path / young).mkdir()
    (tmp_path / "x_main").mkdir()
    assert sweep(str(tmp_path), set(), 3600.0) == []
    assert sweep(str(tmp_path), set(), 0.0) == [young]
    assert os.path.isdir(tmp_path / "x_main")
    assert sweep(str(tmp_path / "absent"), set(), 0.0) == []
    uid = str(uuid.uuid4())
    assert pod_uid_of(f"{uid}_c-1") == uid
    assert pod_uid_of(f"{uid}_") is None and pod_uid_of(f"{uid}_UPPER") is None


async def test_license_mounts_when_the_license_exists() -> None:
    async with running_plugin() as (env, _), stub_for(env) as stub:
        await seeded(env, scheduled_pod("a", ((dev("GPU-0", 1000, 10),),)))
        r = await allocate(stub, "GPU-0-0")
        assert not {"/tmp/license", "/usr/bin/vgpuvalidator"} & {m.container_path for m in r.mounts}

        def license() -> None:
            (env.hook / "vgpu").mkdir(parents=True, exist_ok=True)
            (env.hook / "vgpu" / "license").write_text("lic")

        await asyncio.to_thread(license)
        await seeded(env, scheduled_pod("b", ((dev("GPU-1", 1000, 10),),)))
        r = await allocate(stub, "GPU-1-0")
        mounts: dict[str, pb.Mount] = {m.container_path: m for m in r.mounts}
        assert mounts["/tmp/license"].host_path == f"{env.hook}/vgpu/license"
        assert mounts["/usr/bin/vgpuvalidator"].host_path == f"{env.hook}/vgpu/vgpuvalidator"
        assert mounts["/tmp/license"].read_only and mounts["/usr/bin/vgpuvalidator"].read_only


def test_a_tree_too_deep_to_remove_does_not_stop_the_sweep(tmp_path: Path) -> None:
    """A red team: a container made its cache directory thousands of levels deep; the recursion
    error escaped the sweep, which meets that directory first every time, so no departed pod's
    directory was removed again. (The depth is played by a lower recursion limit.)"""
    deep, other = (f"{n}{str(uuid.uuid4())[1:]}_main" for n in "01")
    path = tmp_path / deep
    for _ in range(60):
        path = path / "d"
    path.mkdir(parents=True)
    (tmp_path / other).mkdir()
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(len(traceback.extract_stack()) + 40)
    try:
        removed = sweep(str(tmp_path), set(), 0.0)
    finally:
        sys.setrecursionlimit(limit)
    assert removed == [other]
