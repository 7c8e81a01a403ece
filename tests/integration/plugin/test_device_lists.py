"""``--device-list-strategy``, the CDI spec check and the feature switches, over the plugin's unix
socket: what Allocate answers for the GPUs the scheduler booked (never those kubelet's replicas sit
on), with HAMi-core's env and mounts in every case. CDI specs are files in a temporary directory.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import re
import threading
from pathlib import Path
from typing import Any

import pytest
import structlog.testing
from grpclib import GRPCError
from grpclib.const import Status
from prometheus_client import generate_latest

from hamid._proto.deviceplugin.v1beta1 import api_pb2 as pb
from hamid.model.annotations import (
    BIND_PHASE,
    DEVICES_TO_ALLOCATE,
    NODE_LOCK,
    NODE_REGISTER,
    decode_node_devices,
)
from hamid.plugin.cdi_specs import GENERATE_SPEC, CdiScan, CdiSpecs
from tests.integration.plugin.helpers import (
    GPUS,
    NODE,
    dev,
    eventually,
    running_plugin,
    scheduled_pod,
    stored_annotations,
)
from tests.integration.plugin.test_allocate import allocate, seeded, stub_for

KEY = re.compile(r"cdi\.k8s\.io/nvidia-device-plugin_[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}\Z")
ROOT = "/var/run/nvidia-container-devices"
ALL = tuple(g.uuid for g in GPUS)
#: The env names HAMi-core's part of the answer always has (one GPU).
CORE_ENVS = {"CUDA_DEVICE_MEMORY_LIMIT_0", "CUDA_DEVICE_SM_LIMIT", "CUDA_DEVICE_MEMORY_SHARED_CACHE"}


def write_spec(directory: Path, name: str, kind: str, *devices: str) -> Path:
    """A spec file as ``nvidia-ctk cdi generate`` writes it (edits trimmed), replaced at once: a
    periodic scan never reads it half written."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    spec = {
        "cdiVersion": "0.5.0",
        "kind": kind,
        "devices": [
            {"name": d, "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}} for d in devices
        ],
        "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=void"]},
    }
    partial = directory / f".{name}.tmp"
    partial.write_text(json.dumps(spec))
    partial.replace(path)
    return path


def gpu_spec(directory: Path, *uuids: str) -> Path:
    """The node's GPU spec, naming ``uuids`` by index and by UUID, as nvidia-ctk's default does."""
    names = [*(str(i) for i in range(len(uuids))), *uuids, "all"]
    return write_spec(directory, "nvidia.json", "nvidia.com/gpu", *names)


def runtime_part(r: pb.ContainerAllocateResponse) -> dict[str, Any]:
    """What the device list strategy put in one answer (HAMi-core's part left out)."""
    return {
        "env": r.envs.get("NVIDIA_VISIBLE_DEVICES"),
        "mounts": [
            (m.container_path, m.host_path, m.read_only)
            for m in r.mounts
            if m.container_path.startswith(ROOT)
        ],
        "annotations": sorted(r.annotations.values()),
        "cdi": [d.name for d in r.cdi_devices],
    }


def has_hami_core(r: pb.ContainerAllocateResponse, hook: Path) -> bool:
    paths = {m.container_path for m in r.mounts}
    return set(r.envs) >= CORE_ENVS and {f"{hook}/vgpu/libvgpu.so", "/etc/ld.so.preload"} <= paths


#: strategies → (one GPU (GPU-1), two GPUs (GPU-2 then GPU-1)) as runtime_part renders them.
EXPECTED: dict[tuple[str, ...], tuple[dict[str, Any], dict[str, Any]]] = {
    ("envvar",): (
        {"env": "GPU-1", "mounts": [], "annotations": [], "cdi": []},
        {"env": "GPU-2,GPU-1", "mounts": [], "annotations": [], "cdi": []},
    ),
    ("volume-mounts",): (
        {"env": ROOT, "mounts": [(f"{ROOT}/GPU-1", "/dev/null", False)], "annotations": [], "cdi": []},
        {
            "env": ROOT,
            "mounts": [(f"{ROOT}/GPU-2", "/dev/null", False), (f"{ROOT}/GPU-1", "/dev/null", False)],
            "annotations": [],
            "cdi": [],
        },
    ),
    ("cdi-annotations",): (
        {"env": None, "mounts": [], "annotations": ["nvidia.com/gpu=GPU-1"], "cdi": []},
        {"env": None, "mounts": [], "annotations": ["nvidia.com/gpu=GPU-2,nvidia.com/gpu=GPU-1"], "cdi": []},
    ),
    ("cdi-cri",): (
        {"env": None, "mounts": [], "annotations": [], "cdi": ["nvidia.com/gpu=GPU-1"]},
        {
            "env": None,
            "mounts": [],
            "annotations": [],
            "cdi": ["nvidia.com/gpu=GPU-2", "nvidia.com/gpu=GPU-1"],
        },
    ),
    ("envvar", "cdi-cri"): (
        {"env": "GPU-1", "mounts": [], "annotations": [], "cdi": ["nvidia.com/gpu=GPU-1"]},
        {
            "env": "GPU-2,GPU-1",
            "mounts": [],
            "annotations": [],
            "cdi": ["nvidia.com/gpu=GPU-2", "nvidia.com/gpu=GPU-1"],
        },
    ),
}


@pytest.mark.parametrize("strategies", list(EXPECTED), ids=[",".join(s) for s in EXPECTED])
async def test_each_strategy_names_the_booked_gpus(tmp_path: Path, strategies: tuple[str, ...]) -> None:
    gpu_spec(tmp_path / "cdi", "GPU-0", "GPU-1", "GPU-2", "GPU-3")
    one, several = EXPECTED[strategies]
    specs = (str(tmp_path / "cdi"),)
    async with (
        running_plugin(device_list_strategy=strategies, cdi_spec_dirs=specs) as (env, _),
        stub_for(env) as stub,
    ):
        await seeded(env, scheduled_pod("p1", ((dev("GPU-1", 1000, 10),),)))
        r = await allocate(stub, "GPU-1-0")
        assert runtime_part(r) == one
        assert all(KEY.match(k) for k in r.annotations)
        assert has_hami_core(r, env.hook) and list(r.devices) == []
        # kubelet's replicas sit on GPU-3 and GPU-0: the booking (GPU-2, GPU-1) is what is named
        await seeded(env, scheduled_pod("p2", ((dev("GPU-2", 1000, 10), dev("GPU-1", 1000, 10)),)))
        r = await allocate(stub, "GPU-3-0", "GPU-0-1")
        assert runtime_part(r) == several
        assert r.envs["CUDA_DEVICE_MEMORY_LIMIT_1"] == "1000m" and has_hami_core(r, env.hook)
        assert stored_annotations(env.server, "Pod", "p2")[BIND_PHASE] == "success"


async def test_each_container_of_a_pod_gets_its_own_cdi_devices(tmp_path: Path) -> None:
    gpu_spec(tmp_path, "GPU-0", "GPU-1", "GPU-2", "GPU-3")
    pod = scheduled_pod(
        "multi",
        (
            (dev("GPU-0", 500, 10),),
            (),
            (dev("GPU-1", 500, 10),),
            (dev("GPU-3", 500, 10), dev("GPU-2", 500, 10)),
        ),
        init=("i0",),
        containers=("c0", "c1", "c2"),
    )
    strategies = ("cdi-annotations", "cdi-cri")
    async with (
        running_plugin(device_list_strategy=strategies, cdi_spec_dirs=(str(tmp_path),)) as (env, _),
        stub_for(env) as stub,
    ):
        await seeded(env, pod)
        r0 = await allocate(stub, "GPU-0-0")
        assert runtime_part(r0)["cdi"] == ["nvidia.com/gpu=GPU-0"]
        both = await stub.Allocate(
            pb.AllocateRequest(
                container_requests=[
                    pb.ContainerAllocateRequest(devices_ids=["GPU-1-0"]),
                    pb.ContainerAllocateRequest(devices_ids=["GPU-2-0", "GPU-3-0"]),
                ]
            ),
            timeout=10,
        )
        c1, c2 = both.container_responses
        assert runtime_part(c1) == {
            "env": None,
            "mounts": [],
            "annotations": ["nvidia.com/gpu=GPU-1"],
            "cdi": ["nvidia.com/gpu=GPU-1"],
        }
        assert runtime_part(c2)["annotations"] == ["nvidia.com/gpu=GPU-3,nvidia.com/gpu=GPU-2"]
        assert runtime_part(c2)["cdi"] == ["nvidia.com/gpu=GPU-3", "nvidia.com/gpu=GPU-2"]
        # kubelet merges annotations across a pod's answers, first wins: every key is unique
        keys = [*r0.annotations, *c1.annotations, *c2.annotations]
        assert len(set(keys)) == 3 and all(KEY.match(k) for k in keys)
        assert stored_annotations(env.server, "Pod", "multi")[BIND_PHASE] == "success"


async def test_only_cdi_keeps_hami_core_and_leaves_env_and_device_nodes_to_the_spec(tmp_path: Path) -> None:
    """HAMi-core's env and mounts (its limits) stay; NVIDIA_VISIBLE_DEVICES, the DeviceSpecs of
    --pass-device-specs and the feature env vars go, as upstream: the features are CDI devices."""
    specs = tmp_path / "cdi"
    gpu_spec(specs, "GPU-0", "GPU-1", "GPU-2", "GPU-3")
    write_spec(specs, "nvidia-gds.yaml", "nvidia.com/gds", "all")
    write_spec(specs, "nvidia-mofed.yaml", "nvidia.com/mofed", "all")
    with structlog.testing.capture_logs() as logs:
        async with (
            running_plugin(
                device_list_strategy=("cdi-cri",),
                cdi_spec_dirs=(str(specs),),
                gds_enabled=True,
                mofed_enabled=True,
                pass_device_specs=True,
                dev_root=str(tmp_path / "no-dev-needed"),
            ) as (env, _),
            stub_for(env) as stub,
        ):
            assert env.plugin.allocator.device_nodes is None
            await seeded(env, scheduled_pod("p", ((dev("GPU-1", 1000, 10),),)))
            r = await allocate(stub, "GPU-1-0")
    assert set(r.envs) == CORE_ENVS
    assert [d.name for d in r.cdi_devices] == [
        "nvidia.com/gpu=GPU-1",
        "nvidia.com/gds=all",
        "nvidia.com/mofed=all",
    ]
    assert list(r.devices) == [] and dict(r.annotations) == {}
    assert {m.container_path for m in r.mounts} == {
        f"{env.hook}/vgpu/libvgpu.so",
        f"{env.hook}/vgpu",
        "/tmp/vgpulock",
        "/etc/ld.so.preload",
    }
    assert any(e["event"] == "pass_device_specs_ignored" for e in logs)


async def test_feature_switches_with_the_env_strategy(tmp_path: Path) -> None:
    async with (
        running_plugin(gdrcopy_enabled=True, gds_enabled=True, mofed_enabled=True) as (env, _),
        stub_for(env) as stub,
    ):
        assert env.plugin.allocator.cdi_specs is None  # no CDI strategy: no spec read
        await seeded(env, scheduled_pod("p", ((dev("GPU-1", 1000, 10),),)))
        r = await allocate(stub, "GPU-1-0")
        assert {k: v for k, v in r.envs.items() if k.startswith("NVIDIA_")} == {
            "NVIDIA_VISIBLE_DEVICES": "GPU-1",
            "NVIDIA_GDRCOPY": "enabled",
            "NVIDIA_GDS": "enabled",
            "NVIDIA_MOFED": "enabled",
        }
        assert list(r.cdi_devices) == [] and dict(r.annotations) == {}


async def refused(env: Any, stub: Any, name: str, replica: str) -> str:
    """Allocate ``replica`` for the seeded pod ``name``: its refusal, after checking that nothing was
    consumed, the pod is marked failed and the node lock released."""
    pod = env.server.get("Pod", "default", name)
    with pytest.raises(GRPCError) as err:
        await allocate(stub, replica)
    assert err.value.status is Status.FAILED_PRECONDITION
    ann = stored_annotations(env.server, "Pod", name)
    assert ann[BIND_PHASE] == "failed"
    assert ann[DEVICES_TO_ALLOCATE] == pod["metadata"]["annotations"][DEVICES_TO_ALLOCATE]
    assert NODE_LOCK not in stored_annotations(env.server, "Node", NODE, None)
    return str(err.value.message)


async def test_a_gpu_or_feature_no_spec_names_is_refused(tmp_path: Path) -> None:
    gpu_spec(tmp_path, "GPU-0", "GPU-1")  # GPU-2 and GPU-3 are missing, so is a gds spec
    with structlog.testing.capture_logs() as logs:
        async with (
            running_plugin(
                device_list_strategy=("envvar", "cdi-annotations"),
                cdi_spec_dirs=(str(tmp_path),),
                gds_enabled=True,
            ) as (env, _),
            stub_for(env) as stub,
        ):
            await seeded(env, scheduled_pod("p", ((dev("GPU-2", 1000, 10),),)))
            message = await refused(env, stub, "p", "GPU-2-0")
            assert message.startswith(
                f"no CDI spec in {tmp_path} defines nvidia.com/gpu=GPU-2, nvidia.com/gds=all: generate one"
            )
            assert env.plugin.allocator.refusals["cdi-device-missing"] == 1
            write_spec(tmp_path, "nvidia-gds.json", "nvidia.com/gds", "all")
            await seeded(env, scheduled_pod("q", ((dev("GPU-1", 1000, 10),),)))
            r = await allocate(stub, "GPU-1-0")  # the spec written after the start counts
            assert sorted(r.annotations.values()) == ["nvidia.com/gpu=GPU-1,nvidia.com/gds=all"]
    missing = [e for e in logs if e["event"] == "cdi_devices_missing_allocate_refuses"]
    assert [e["devices"] for e in missing] == [
        ["nvidia.com/gpu=GPU-2", "nvidia.com/gpu=GPU-3", "nvidia.com/gds=all"]
    ]


async def test_missing_and_malformed_specs_never_stop_the_plugin(tmp_path: Path) -> None:
    """No spec directory, then a malformed file: the plugin starts, refuses with the file named,
    and serves once a valid spec is written."""
    specs = tmp_path / "cdi"
    with structlog.testing.capture_logs() as logs:
        async with (
            running_plugin(device_list_strategy=("cdi-cri",), cdi_spec_dirs=(str(specs),)) as (env, _),
            stub_for(env) as stub,
        ):
            await seeded(env, scheduled_pod("p", ((dev("GPU-1", 1000, 10),),)))
            assert "no CDI spec in" in await refused(env, stub, "p", "GPU-1-0")
            bad = write_spec(specs, "nvidia.yaml", "nvidia.com/gpu", "GPU-1")
            bad.write_text("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: [{name: GPU-1}\n")
            await seeded(env, scheduled_pod("q", ((dev("GPU-1", 1000, 10),),)))
            message = await refused(env, stub, "q", "GPU-1-0")
            assert f"spec problems: ['{bad}: not valid YAML" in message
            gpu_spec(specs, "GPU-1")
            await seeded(env, scheduled_pod("r", ((dev("GPU-1", 1000, 10),),)))
            r = await allocate(stub, "GPU-1-0")
            assert [d.name for d in r.cdi_devices] == ["nvidia.com/gpu=GPU-1"]
    events = [e["event"] for e in logs]
    assert "cdi_devices_missing_allocate_refuses" in events  # at start
    assert any(e["event"] == "cdi_spec_ignored" and e["path"] == str(bad) for e in logs)


async def test_a_failure_preparing_the_node_is_a_refusal_like_any(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever breaks while the node is prepared for the containers (an injected fault in the
    spec scan here) is refused as every other failure is: FAILED_PRECONDITION, the pod marked
    failed, the node lock released (it escaped as INTERNAL, the pod left locked at allocating)."""
    gpu_spec(tmp_path, "GPU-0", "GPU-1", "GPU-2", "GPU-3")
    async with (
        running_plugin(device_list_strategy=("cdi-cri",), cdi_spec_dirs=(str(tmp_path),)) as (env, _),
        stub_for(env) as stub,
    ):

        def broken(self: CdiSpecs) -> None:
            raise RuntimeError("injected")

        monkeypatch.setattr(CdiSpecs, "scan", broken)
        await seeded(env, scheduled_pod("p", ((dev("GPU-1", 1000, 10),),)))
        with pytest.raises(GRPCError) as err:
            await allocate(stub, "GPU-1-0")
        assert err.value.status == Status.FAILED_PRECONDITION
        assert "injected" in str(err.value.message)
        assert stored_annotations(env.server, "Pod", "p").get(BIND_PHASE) == "failed"
        assert NODE_LOCK not in stored_annotations(env.server, "Node", NODE, None)


def cdi_scanning_plugin(specs: Path) -> Any:
    """A plugin serving CDI devices from ``specs``, rescanning every 50 ms, to a fake kubelet."""
    return running_plugin(
        device_list_strategy=("cdi-cri",),
        cdi_spec_dirs=(str(specs),),
        with_kubelet=True,
        hide_replicas="off",
        cdi_interval=0.05,
    )


def gpu_health(listed: pb.ListAndWatchResponse) -> dict[str, str]:
    """Each GPU's health in one ListAndWatch message (all its replicas agree)."""
    health: dict[str, set[str]] = {}
    for d in listed.devices:
        health.setdefault(d.ID.rpartition("-")[0], set()).add(d.health)
    assert all(len(h) == 1 for h in health.values())
    return {gpu: h.pop() for gpu, h in health.items()}


def registered_health(env: Any) -> dict[str, bool]:
    """Each GPU's health in the node's register annotation, as the scheduler reads it."""
    value = stored_annotations(env.server, "Node", NODE, None).get(NODE_REGISTER)
    return {d.id: d.health for d in decode_node_devices(value)} if value else {}


def healthy_gauge(env: Any) -> dict[str, float]:
    """``hamid_plugin_gpu_healthy`` by GPU, as scraped."""
    text = generate_latest(env.plugin.metrics.registry).decode()
    found = re.findall(
        r'^hamid_plugin_gpu_healthy\{[^}]*device_uuid="([^"]+)"[^}]*\} (\S+)$', text, re.MULTILINE
    )
    return {uuid: float(value) for uuid, value in found}


async def test_a_gpu_no_spec_names_is_unhealthy_until_a_scan_finds_its_spec(tmp_path: Path) -> None:
    """Over the real ListAndWatch stream, the register annotation and the gauge: a GPU whose CDI
    device no spec defines is Unhealthy from the first list (Allocate would refuse its pods), and
    Healthy again at the periodic scan after its spec is written; it turns Unhealthy again when the
    spec stops naming it. An XID stays sticky whatever the specs say, and a malformed spec file
    only defines nothing."""
    specs = tmp_path / "cdi"
    gpu_spec(specs, "GPU-0", "GPU-1")
    (specs / "broken.yaml").write_text("cdiVersion: [\n")
    unhealthy = {"GPU-0": "Healthy", "GPU-1": "Healthy", "GPU-2": "Unhealthy", "GPU-3": "Unhealthy"}
    with structlog.testing.capture_logs() as logs:
        async with cdi_scanning_plugin(specs) as (env, kubelet):
            assert kubelet is not None
            await eventually(lambda: bool(kubelet.lists))
            assert gpu_health(kubelet.lists[0]) == unhealthy  # never advertised Healthy first
            await eventually(lambda: bool(registered_health(env)))
            assert registered_health(env) == {"GPU-0": True, "GPU-1": True, "GPU-2": False, "GPU-3": False}
            assert healthy_gauge(env) == {"GPU-0": 1, "GPU-1": 1, "GPU-2": 0, "GPU-3": 0}

            env.plugin.inventory.mark_unhealthy("GPU-3", "XID 79")
            gpu_spec(specs, "GPU-0", "GPU-1", "GPU-2", "GPU-3")
            healed = {**unhealthy, "GPU-2": "Healthy"}  # GPU-3 stays out: its XID is sticky
            await eventually(lambda: gpu_health(kubelet.lists[-1]) == healed)
            await eventually(lambda: registered_health(env)["GPU-2"])
            assert not registered_health(env)["GPU-3"]
            assert healthy_gauge(env) == {"GPU-0": 1, "GPU-1": 1, "GPU-2": 1, "GPU-3": 0}

            gpu_spec(specs, "GPU-0", "GPU-2", "GPU-3")  # a regenerated spec without GPU-1
            await eventually(lambda: gpu_health(kubelet.lists[-1])["GPU-1"] == "Unhealthy")
            await eventually(lambda: not registered_health(env)["GPU-1"])
    gone = [(e["uuid"], e["dirs"]) for e in logs if e["event"] == "gpu_unhealthy_cdi_spec_missing"]
    assert gone == [("GPU-2", [str(specs)]), ("GPU-3", [str(specs)]), ("GPU-1", [str(specs)])]
    assert [e["uuid"] for e in logs if e["event"] == "gpu_healthy_cdi_spec_found"] == ["GPU-2"]
    assert [e["uuid"] for e in logs if e["event"] == "gpu_cdi_spec_found_still_unhealthy"] == ["GPU-3"]
    assert any(e["event"] == "cdi_spec_ignored" and e["path"] == str(specs / "broken.yaml") for e in logs)


async def test_each_allocate_scan_updates_the_gpus_cdi_health(tmp_path: Path) -> None:
    """Allocate's own scan of the specs updates the GPUs' health at once (no periodic scan runs
    here): a spec written since the start heals the GPUs it names."""
    gpu_spec(tmp_path, "GPU-0", "GPU-1")
    async with (
        running_plugin(
            device_list_strategy=("cdi-annotations",), cdi_spec_dirs=(str(tmp_path),), hide_replicas="off"
        ) as (env, _),
        stub_for(env) as stub,
    ):
        inventory = env.plugin.inventory
        assert [inventory.is_healthy(f"GPU-{i}") for i in range(4)] == [True, True, False, False]
        gpu_spec(tmp_path, "GPU-0", "GPU-1", "GPU-2", "GPU-3")
        await seeded(env, scheduled_pod("p", ((dev("GPU-1", 1000, 10),),)))
        await allocate(stub, "GPU-1-0")
        assert [inventory.is_healthy(f"GPU-{i}") for i in range(4)] == [True] * 4


async def test_a_failing_scan_stops_nothing_and_changes_no_health(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever breaks in a scan (an injected fault here) is logged and tried again at the next
    one: the plugin registers and lists its GPUs, their health as it was, until a scan succeeds."""
    gpu_spec(tmp_path, "GPU-0", "GPU-1")

    def broken(self: CdiSpecs) -> None:
        raise RuntimeError("injected")

    monkeypatch.setattr(CdiSpecs, "scan", broken)
    with structlog.testing.capture_logs() as logs:
        async with cdi_scanning_plugin(tmp_path) as (_env, kubelet):
            assert kubelet is not None
            await eventually(lambda: bool(kubelet.lists))
            await eventually(lambda: sum(e["event"] == "cdi_spec_scan_failed" for e in logs) >= 2)
            assert set(gpu_health(kubelet.lists[-1]).values()) == {"Healthy"}
            monkeypatch.undo()
            expected = {"GPU-0": "Healthy", "GPU-1": "Healthy", "GPU-2": "Unhealthy", "GPU-3": "Unhealthy"}
            await eventually(lambda: gpu_health(kubelet.lists[-1]) == expected)
    assert any(e["event"] == "cdi_spec_scan_failed" and "injected" in e["error"] for e in logs)


async def test_a_passing_error_listing_the_spec_dir_changes_no_health(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The spec names every GPU and never changes; one periodic scan meets a passing EMFILE listing
    its directory (this process ran out of descriptors; the runtime reads the spec fine). No GPU's
    health changes: every GPU was sent Unhealthy, to kubelet and the scheduler, until the next scan."""
    specs = tmp_path / "cdi"
    gpu_spec(specs, *ALL)
    real_listdir = os.listdir
    armed = threading.Event()
    listings: list[str] = []

    def flaky_listdir(path: str) -> list[str]:
        if armed.is_set() and path == str(specs):
            listings.append(path)
            if len(listings) == 1:
                raise OSError(errno.EMFILE, "Too many open files")
        return real_listdir(path)

    monkeypatch.setattr(os, "listdir", flaky_listdir)
    with structlog.testing.capture_logs() as logs:
        async with cdi_scanning_plugin(specs) as (env, kubelet):
            assert kubelet is not None
            await eventually(lambda: bool(kubelet.lists) and bool(registered_health(env)))
            generation, sent = env.plugin.inventory.generation, len(kubelet.lists)
            armed.set()
            await eventually(lambda: len(listings) >= 3)  # the failed scan was applied, and one more
            assert (env.plugin.inventory.generation, len(kubelet.lists)) == (generation, sent)
            assert set(gpu_health(kubelet.lists[-1]).values()) == {"Healthy"}
            assert all(registered_health(env).values())
    assert any(e["event"] == "cdi_spec_dir_unlisted_last_listing_kept" for e in logs)


async def test_a_stale_periodic_scan_never_overrides_a_newer_allocate_scan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scans run in threads and their results are applied in whatever order they come back. Forced
    here: the periodic scan reads the spec without GPU-3 and is slow to hand it back; the spec is
    regenerated with GPU-3 and an Allocate's scan heals GPU-3. The older periodic result must not
    turn GPU-3 unhealthy again (it did, for a whole interval)."""
    specs = tmp_path / "cdi"
    gpu_spec(specs, "GPU-0", "GPU-1", "GPU-2")
    real_scan = CdiSpecs.scan
    armed, held, release, returned = (threading.Event() for _ in range(4))

    def slow_to_return(self: CdiSpecs) -> CdiScan:
        scan = real_scan(self)
        if armed.is_set() and not held.is_set():  # the periodic scan: no Allocate runs yet
            held.set()
            release.wait(10)
            returned.set()
        return scan

    monkeypatch.setattr(CdiSpecs, "scan", slow_to_return)
    async with (
        running_plugin(
            device_list_strategy=("cdi-cri",),
            cdi_spec_dirs=(str(specs),),
            hide_replicas="off",
            cdi_interval=0.5,
        ) as (env, _),
        stub_for(env) as stub,
    ):
        inventory = env.plugin.inventory
        assert not inventory.is_healthy("GPU-3")
        armed.set()
        await eventually(held.is_set)  # the periodic scan read the spec without GPU-3
        gpu_spec(specs, *ALL)
        await seeded(env, scheduled_pod("p", ((dev("GPU-1", 1000, 10),),)))
        await allocate(stub, "GPU-1-0")
        assert inventory.is_healthy("GPU-3")  # Allocate's scan defines it
        release.set()
        await eventually(returned.is_set)
        await asyncio.sleep(0.05)  # the periodic result is applied (the next scan is 0.5 s away)
        assert inventory.is_healthy("GPU-3")


async def test_the_hint_for_a_spec_naming_gpus_by_index_says_to_name_them_by_uuid(tmp_path: Path) -> None:
    """A spec as ``nvidia-ctk`` before 1.15 writes it by default (``0``..``3``, ``all``) names no GPU
    by UUID: every GPU is unhealthy, and the log and the refusal say how to write one that does
    (they gave the very command that wrote this spec)."""
    write_spec(tmp_path, "nvidia.yaml", "nvidia.com/gpu", "0", "1", "2", "3", "all")
    with structlog.testing.capture_logs() as logs:
        async with (
            running_plugin(
                device_list_strategy=("cdi-cri",), cdi_spec_dirs=(str(tmp_path),), hide_replicas="off"
            ) as (env, _),
            stub_for(env) as stub,
        ):
            assert not any(env.plugin.inventory.is_healthy(u) for u in ALL)
            await seeded(env, scheduled_pod("p", ((dev("GPU-1", 1000, 10),),)))
            message = await refused(env, stub, "p", "GPU-1-0")
    hints = [e["hint"] for e in logs if e["event"] == "gpu_unhealthy_cdi_spec_missing"]
    assert hints == [f"generate a spec naming GPUs by UUID: {GENERATE_SPEC}"] * 4
    assert GENERATE_SPEC in message and "--device-name-strategy=uuid" in GENERATE_SPEC
