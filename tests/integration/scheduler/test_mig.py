"""Dynamic MIG through the real /filter and /bind over HTTP against the embedded API server: the filter
writes ``hami.io/vgpu-mig-allocations`` with the allocation, the next pod is placed around it, a
restarted scheduler books the same placements again, and a rewritten reservation is not followed."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from hamid.model import annotations as ann
from hamid.model import reasons as R
from hamid.model.booked import booked_record
from hamid.model.devices import MODE_MIG, DeviceInfo, MigPlacement, MigProfile
from hamid.model.mig import decode_mig_allocations, encode_mig_allocations, reservation_text
from hamid.scheduler.signing import AllocationKeys
from hamidsim.apiserver import ApiServer
from tests.integration.scheduler.harness import Env, loopback_options, running_app, wait_for
from tests.unit.scheduler.helpers import container, pod

P1G = MigProfile("1g.5gb", 5120, 14, 1, tuple(MigPlacement(i, 1) for i in range(7)))
P2G = MigProfile("2g.10gb", 10240, 28, 2, (MigPlacement(0, 2), MigPlacement(2, 2), MigPlacement(4, 2)))
KEYS = AllocationKeys((b"integration-key-0123456789abcdef0123",))


def mig_node(name: str) -> dict[str, Any]:
    gpu = DeviceInfo("GPU-m", 0, 7, 40960, 100, "NVIDIA-A100-SXM4-40GB", 0, MODE_MIG, True, (P1G, P2G))
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "annotations": {ann.NODE_REGISTER: ann.encode_node_devices([gpu])}},
        "status": {"allocatable": {"nvidia.com/gpu": "7"}},
    }


def mig_pod(name: str, mem: int) -> dict[str, Any]:
    return pod(name, containers=[container("main", 1, mem)], annotations={ann.VGPU_MODE: "mig"})


@contextlib.asynccontextmanager
async def scheduler(server: ApiServer) -> AsyncIterator[Env]:
    """A signing scheduler (one key ring across restarts) on ``server``."""
    async with (
        running_app(loopback_options(server, allocation_keys=KEYS)) as app,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session,
    ):
        s = app.scheduler
        ports = app.ports
        yield Env(
            server,
            s.kube,
            s,
            session,
            f"http://127.0.0.1:{ports['extender']}",
            f"http://127.0.0.1:{ports['cluster']}",
            app,
        )


def occupied(env: Env) -> list[tuple[str, int]]:
    gpu = env.scheduler.ledger.nodes["n1"].usage.by_id["GPU-m"]
    return sorted((a.profile, a.placement.start) for a in gpu.mig_used)


def events(env: Env, reason: str) -> list[dict[str, Any]]:
    return [e for e in env.server.list("Event", "default") if e.get("reason") == reason]


def mig_instances(env: Env) -> list[dict[str, str]]:
    """The labels of ``hami_node_gpu_mig_instance_info`` on the scheduler's ``/metrics/hami`` registry."""
    return [
        dict(sample.labels)
        for family in env.scheduler.metrics.hami_registry.collect()
        if family.name == "hami_node_gpu_mig_instance_info"
        for sample in family.samples
    ]


def stored_mig(env: Env, name: str) -> str:
    return str(env.server.get("Pod", "default", name)["metadata"]["annotations"].get(ann.MIG_ALLOCATIONS))


async def test_filter_writes_the_reservation_books_it_and_a_restart_rebuilds_it() -> None:
    async with ApiServer() as server:
        server.put(mig_node("n1"))
        async with scheduler(server) as env:
            await wait_for(lambda: "n1" in env.scheduler.ledger.nodes)
            first = await env.create_pod(mig_pod("first", 10000))
            assert (await env.filter(first, ["n1"]))["NodeNames"] == ["n1"]
            annotations = env.server.get("Pod", "default", "first")["metadata"]["annotations"]
            assert annotations[ann.DEVICES_ALLOCATED] == "GPU-m,NVIDIA,10240,28:;"  # the 2g profile's share
            assert annotations[ann.MIG_ALLOCATIONS] == (
                '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-m","profile":"2g.10gb",'
                '"placement":{"start":0,"size":2}}]'
            )
            assert occupied(env) == [("2g.10gb", 0)]
            assert await env.bind(first, "n1") == ""
            record = booked_record(env.server.get("Pod", "default", "first"))
            assert record is not None and record.mig == annotations[ann.MIG_ALLOCATIONS]

            second = await env.create_pod(mig_pod("second", 4000))  # placed around the first
            assert (await env.filter(second, ["n1"]))["NodeNames"] == ["n1"]
            assert [a.placement for a in decode_mig_allocations(stored_mig(env, "second"))] == [
                MigPlacement(6, 1)
            ]
            assert occupied(env) == [("1g.5gb", 6), ("2g.10gb", 0)]

            hami_core = await env.create_pod(
                pod("core", containers=[container("main", 1, 1000)], annotations={ann.VGPU_MODE: "hami-core"})
            )
            assert (await env.filter(hami_core, ["n1"]))["FailedNodes"] == {"n1": "1/1 CardTypeMismatch"}
            too_big = await env.create_pod(mig_pod("big", 20000))
            assert (await env.filter(too_big, ["n1"]))["FailedNodes"] == {
                "n1": "1/1 CardMigTopologyInfeasible"
            }

            # the plugin realizes the first instance: its runtime ids change nothing booked
            realized = decode_mig_allocations(stored_mig(env, "first"))[0]
            with_ids = type(realized)(0, 0, "GPU-m", "2g.10gb", realized.placement, "MIG-1", 3, 0)
            await env.kube.patch_pod_metadata(
                "default", "first", annotations={ann.MIG_ALLOCATIONS: encode_mig_allocations([with_ids])}
            )
            await wait_for(
                lambda: "MIG-1" in str(env.scheduler.pods.get("default/first")["metadata"]["annotations"])
            )
            assert occupied(env) == [("1g.5gb", 6), ("2g.10gb", 0)]
            assert not events(env, R.EVENT_ALLOCATION_IGNORED)
            # HAMi's family of realized instances: the first one only (the second is not realized)
            assert mig_instances(env) == [
                {
                    "compute_instance_id": "0",
                    "device_index": "0",
                    "device_uuid": "GPU-m",
                    "gpu_instance_id": "3",
                    "mig_uuid": "MIG-1",
                    "node": "n1",
                    "placement_size": "2",
                    "placement_start": "0",
                    "profile": "2g.10gb",
                    "zone": "vGPU",
                }
            ]

            # a tenant past admission moves the second pod's instance onto the first's slices
            forged = encode_mig_allocations([type(realized)(0, 0, "GPU-m", "2g.10gb", MigPlacement(0, 2))])
            await env.kube.patch_pod_metadata("default", "second", annotations={ann.MIG_ALLOCATIONS: forged})
            await wait_for(lambda: bool(events(env, R.EVENT_ALLOCATION_IGNORED)))
            assert "stays booked" in events(env, R.EVENT_ALLOCATION_IGNORED)[0]["message"]
            assert occupied(env) == [("1g.5gb", 6), ("2g.10gb", 0)]  # the booking stays as it was
            # a realized record on the forged slices shows nothing: it is not the booked reservation
            forged_ids = type(realized)(0, 0, "GPU-m", "2g.10gb", MigPlacement(0, 2), "MIG-2", 4, 0)
            await env.kube.patch_pod_metadata(
                "default", "second", annotations={ann.MIG_ALLOCATIONS: encode_mig_allocations([forged_ids])}
            )
            await wait_for(
                lambda: "MIG-2" in str(env.scheduler.pods.get("default/second")["metadata"]["annotations"])
            )
            assert [s["mig_uuid"] for s in mig_instances(env)] == ["MIG-1"]

        async with scheduler(server) as env:  # a restart: the bound pod's record and annotations agree
            await wait_for(lambda: "n1" in env.scheduler.ledger.nodes)
            await wait_for(lambda: env.scheduler.ledger.reservation(first["metadata"]["uid"]) is not None)
            assert occupied(env) == [("2g.10gb", 0)]  # the forged second one does not verify
            await wait_for(lambda: bool(events(env, R.EVENT_ALLOCATION_FOREIGN)))
            foreign = events(env, R.EVENT_ALLOCATION_FOREIGN)
            assert [e["involvedObject"]["name"] for e in foreign] == ["second"]
            third = await env.create_pod(mig_pod("third", 10000))
            assert (await env.filter(third, ["n1"]))["NodeNames"] == ["n1"]
            placed = decode_mig_allocations(stored_mig(env, "third"))
            assert reservation_text(placed) and placed[0].placement == MigPlacement(2, 2)
