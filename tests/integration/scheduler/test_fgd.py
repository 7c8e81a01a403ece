"""The ``fgd`` policy through the real ``/filter``: node and GPU chosen by fragmentation gain."""

from __future__ import annotations

import base64
import dataclasses
import json
import math
import time

from hamid.fit.fgd import Shape, parse_workload
from hamid.model import annotations as ann
from hamid.model import reasons as R
from hamid.model.numa import NUMA_PREDICTED, NUMA_PROFILE, decode_prediction, encode_profile
from hamid.scheduler.core import SchedulerSettings
from hamid.scheduler.fgd_rank import tie_order
from tests.integration.scheduler.harness import (
    Env,
    loopback_options,
    running_app,
    running_scheduler,
    wait_for,
)
from tests.unit.scheduler.helpers import container, pod
from tests.unit.scheduler.helpers import node as node_dict
from tests.unit.scheduler.test_numa_ledger import PROFILE
from tests.unit.scheduler.test_numa_ledger import _node as numa_node
from tests.unit.scheduler.test_numa_ledger import _pod as numa_pod

HALVES = parse_workload([{"cpu": "1", "gpus": 1, "gpuShare": 50}])
SHARE = Shape(1000, 1024, 1, 500)
HALVES_2CPU = parse_workload([{"cpu": "2", "gpus": 1, "gpuShare": 50}])


async def _seed(env: Env) -> None:
    """n1: one GPU half used; n2: one GPU 70 % used (2 x 8000 MiB GPUs each)."""
    env.add_node("n1")
    env.add_node("n2")
    await wait_for(lambda: {"n1", "n2"} <= env.scheduler.ledger.nodes.keys())
    for name, node, cores, mem in (("a", "n1", 50, 4000), ("b", "n2", 70, 5600)):
        p = await env.create_pod(pod(name, containers=[container("c", 1, mem, cores)]))
        assert (await env.filter(p, [node]))["NodeNames"] == [node]


def _allocated(env: Env, name: str) -> str:
    return env.server.get("Pod", "default", name)["metadata"]["annotations"][ann.DEVICES_ALLOCATED]


async def test_fgd_annotation_picks_the_node_and_gpu_it_defragments() -> None:
    async with running_scheduler(SchedulerSettings(node_policy="spread", fgd_workload=HALVES)) as env:
        await _seed(env)
        fgd = {ann.NODE_SCHEDULER_POLICY: "fgd", ann.GPU_SCHEDULER_POLICY: "fgd"}
        # 20 %: on n2's 70 % GPU it leaves 10 % (was 30 %: 200 less stranded); anywhere on n1 it
        # strands nothing new, so spread (n1, less used) and fgd (n2) disagree
        small = await env.create_pod(pod("c", containers=[container("c", 1, 1600, 20)], annotations=fgd))
        assert (await env.filter(small, ["n1", "n2"]))["NodeNames"] == ["n2"]
        assert _allocated(env, "c").split(",")[0] == _allocated(env, "b").split(",")[0]
        plain = await env.create_pod(pod("d", containers=[container("c", 1, 1600, 20)]))
        assert (await env.filter(plain, ["n1", "n2"]))["NodeNames"] == ["n1"]  # spread, as before


async def test_equal_gains_go_to_one_fixed_order_of_nodes() -> None:
    """Empty equal nodes tie; the pod goes to the node first in the order hashed from the names,
    whichever order the nodes registered in and kube-scheduler sends them: equal nodes fill one
    at a time, and replicas (or a restarted scheduler) agree on which."""
    names = ["n1", "n2", "n3", "n4"]
    first = max(names, key=tie_order)
    settings = SchedulerSettings(node_policy="fgd", gpu_policy="fgd", fgd_workload=HALVES)
    for order in (names, names[::-1]):
        async with running_scheduler(settings) as env:
            for name in order:
                env.add_node(name)
            await wait_for(lambda: set(names) <= env.scheduler.ledger.nodes.keys())
            for i, candidates in enumerate((order, order[::-1])):
                p = await env.create_pod(pod(f"p{i}", containers=[container("c", 1, 1600, 20)]))
                assert (await env.filter(p, candidates))["NodeNames"] == [first]
            # the empty nodes' equal states are one object, so a re-rank judges them once
            kept = env.scheduler.fgd._states
            empty = [kept[n] for n in names if n != first]
            assert all(state is empty[0] for state in empty) and kept[first] != empty[0]


async def test_fgd_default_flag_learns_the_workload_online() -> None:
    async with running_scheduler(SchedulerSettings(node_policy="fgd", gpu_policy="fgd")) as env:
        for i in range(5):  # pending half-GPU pods teach the typical workload
            await env.create_pod(pod(f"h{i}", containers=[container("c", 1, 4000, 50)]))
        await _seed(env)
        shapes = env.scheduler.fgd.workload.shapes
        assert {s.share for s, _ in shapes} == {500, 700}
        small = await env.create_pod(pod("c", containers=[container("c", 1, 1600, 20)]))
        assert (await env.filter(small, ["n1", "n2"]))["NodeNames"] == ["n2"]


async def test_fgd_gives_kube_schedulers_reason_for_a_node_short_of_cpu() -> None:
    async with running_scheduler(SchedulerSettings(node_policy="fgd", fgd_workload=HALVES)) as env:
        body = node_dict("n1", 2)
        body["status"]["allocatable"] |= {"cpu": "2", "memory": "4Gi"}
        env.server.put({"apiVersion": "v1", "kind": "Node", **body})
        await wait_for(lambda: env.scheduler.cpu_mem.room("n1") is not None)
        big = container("c", 1, 1000, 10)
        big["resources"]["requests"] = {"cpu": "3"}
        p = await env.create_pod(pod("big", containers=[big]))
        assert (await env.filter(p, ["n1"]))["FailedNodes"] == {"n1": R.INSUFFICIENT_CPU}
        fits = container("c", 1, 1000, 10)
        fits["resources"]["requests"] = {"cpu": "1"}
        p = await env.create_pod(pod("fits", containers=[fits]))
        assert (await env.filter(p, ["n1"]))["NodeNames"] == ["n1"]
        assert env.scheduler.cpu_mem.room("n1").cpu == 1000  # assumed until bound


async def test_a_restarted_scheduler_rebuilds_the_workload_from_its_cache() -> None:
    async with running_scheduler(SchedulerSettings(node_policy="fgd")) as env:
        for i in range(3):
            await env.create_pod(pod(f"h{i}", containers=[container("c", 1, 4000, 50)]))
        cpu_only = container("c", resources={"requests": {"cpu": "2", "memory": "1Gi"}})
        await env.create_pod(pod("cpu", containers=[cpu_only]))
        env.scheduler.fgd.ranking(SHARE, env.scheduler.ledger.nodes)  # fgd in use: learned now
        learned = dict(env.scheduler.fgd.workload.shapes)
        assert {(s.gpus, s.share) for s in learned} == {(1, 500), (0, 0)}
        options = loopback_options(env.server, settings=SchedulerSettings(node_policy="fgd"))
        async with running_app(options) as restarted:
            fgd = restarted.scheduler.fgd
            assert fgd.histogram.observed == 4
            fgd.ranking(SHARE, restarted.scheduler.ledger.nodes)
            assert {s: round(p, 3) for s, p in fgd.workload.shapes} == {
                s: round(p, 3) for s, p in learned.items()
            }


async def test_a_restart_relearns_the_workload_in_creation_order_whatever_the_names() -> None:
    """The API server lists pods by namespace/name; the cache tells a list oldest first, so a
    restarted scheduler weighs pods by age as the live one did, not by name (older 20 % shares
    named z-*, newer 70 % ones a-*: in list order the two flipped, 89 % / 11 %)."""
    settings = SchedulerSettings(node_policy="fgd", fgd_half_life=20)
    async with running_scheduler(settings) as env:
        for name, cores in [(f"z-{i:02}", 20) for i in range(40)] + [(f"a-{i:02}", 70) for i in range(40)]:
            env.server.put(
                {"apiVersion": "v1", "kind": "Pod", **pod(name, containers=[container("c", 1, 1000, cores)])}
            )
        await wait_for(lambda: env.scheduler.fgd.histogram.observed == 80)
        live = env.scheduler.fgd.histogram.weights()
        assert max(live, key=live.__getitem__).share == 700
        async with running_app(loopback_options(env.server, settings=settings)) as restarted:
            again = restarted.scheduler.fgd.histogram.weights()
        assert again.keys() == live.keys()
        assert all(math.isclose(again[s], live[s], rel_tol=0.01) for s in live)  # "a hair"


async def test_a_pod_filtered_again_keeps_the_node_its_first_filter_chose() -> None:
    """kube-scheduler filters a pod again after a failed bind, its first booking still standing:
    its own node is judged with that booking free, as HAMi's policies do (it hopped n1 -> n2 ->
    n1: n1's one GPU full of the pod itself ranked last)."""
    whole = parse_workload([{"cpu": "1", "gpus": 1, "gpuShare": 100}])
    settings = SchedulerSettings(node_policy="fgd", gpu_policy="fgd", fgd_workload=whole)
    async with running_scheduler(settings) as env:
        env.add_node("n1", gpus=1)  # a whole-GPU pod fills it exactly
        env.add_node("n2", gpus=2)
        await wait_for(lambda: {"n1", "n2"} <= env.scheduler.ledger.nodes.keys())
        p = await env.create_pod(pod("p", containers=[container("c", 1, 8000, 100)]))
        answers = [(await env.filter(p, ["n1", "n2"]))["NodeNames"] for _ in range(3)]
        assert answers == [["n1"]] * 3


async def test_a_pods_own_node_is_judged_without_its_gpu_cpu_and_numa_booking() -> None:
    aligned = parse_workload([{"cpu": "2", "gpus": 1, "gpuShare": 100, "aligned": True}])
    settings = SchedulerSettings(node_policy="fgd", gpu_policy="fgd", fgd_workload=aligned)
    async with running_scheduler(settings) as env:
        body = numa_node("n1")
        body["metadata"]["annotations"][NUMA_PROFILE] = encode_profile(
            dataclasses.replace(PROFILE, observed_at=int(time.time()))
        )
        body["status"]["allocatable"] |= {"cpu": "8", "memory": "16Gi"}
        env.server.put({"apiVersion": "v1", "kind": "Node", **body})
        await wait_for(lambda: env.scheduler.numa.free_cpus("n1") is not None)
        await wait_for(lambda: env.scheduler.cpu_mem.room("n1") is not None)
        fgd, entry = env.scheduler.fgd, env.scheduler.ledger.nodes["n1"]
        fgd.sync()
        idle = fgd.node_state("n1", entry)
        p = await env.create_pod(numa_pod("x", mem=8000))
        assert (await env.filter(p, ["n1"]))["NodeNames"] == ["n1"]
        fgd.sync()
        booked = fgd.node_state("n1", entry)
        assert booked.cpu < idle.cpu and booked.frees != idle.frees and booked.numa != idle.numa
        reservation = env.scheduler.ledger.reservation(p["metadata"]["uid"])
        assert reservation is not None
        assert fgd.own_state("n1", entry, p["metadata"]["uid"], reservation.applied) == idle


async def test_schedule_cpu_pods_routes_pods_without_gpus_to_hamid() -> None:
    """Opt-in: the webhook hands a CPU-only pod to hamid's scheduler name (never by default, never
    a pod of another scheduler or one already on a node)."""
    cpu_only = pod("cpu", containers=[container("c", resources={"requests": {"cpu": "1"}})])

    async def patch_of(env: Env, obj: dict) -> list[dict]:
        review = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {"uid": "r", "object": obj},
        }
        status, body = await env.post(env.cluster, "/webhook", review)
        assert status == 200 and body["response"]["allowed"] is True, body
        raw = body["response"].get("patch")
        return json.loads(base64.b64decode(raw)) if raw else []

    route = {"op": "add", "path": "/spec/schedulerName", "value": "hami-scheduler"}
    async with running_scheduler(SchedulerSettings(schedule_cpu_pods=True)) as env:
        assert route in await patch_of(env, cpu_only)
        foreign = {**cpu_only, "spec": {**cpu_only["spec"], "schedulerName": "volcano"}}
        placed = {**cpu_only, "spec": {**cpu_only["spec"], "nodeName": "n1"}}
        assert await patch_of(env, foreign) == [] and await patch_of(env, placed) == []
    async with running_scheduler() as env:
        assert route not in await patch_of(env, cpu_only)


async def test_fgd_places_a_cpu_only_pod_where_it_strands_the_least_gpu() -> None:
    """n2 (4 CPUs) left with 1 CPU could no longer take the typical 2-CPU half-GPU pod: its two
    idle GPUs would be stranded; n1 (64 CPUs) strands nothing, so hamid answers n1 alone (equal
    nodes are filled one at a time, not spread); a node without hamid's GPUs strands nothing at
    all, so such nodes are kept, for kube-scheduler's scoring."""
    async with running_scheduler(SchedulerSettings(node_policy="fgd", fgd_workload=HALVES_2CPU)) as env:
        for name, cpus in (("n1", "64"), ("n2", "4")):
            body = node_dict(name, 2)
            body["status"]["allocatable"] |= {"cpu": cpus, "memory": "64Gi"}
            env.server.put({"apiVersion": "v1", "kind": "Node", **body})
        await wait_for(lambda: all(env.scheduler.cpu_mem.room(n) is not None for n in ("n1", "n2")))
        requests = {"requests": {"cpu": "3", "memory": "1Gi"}}
        p = await env.create_pod(pod("cpu", containers=[container("c", resources=requests)]))
        body = await env.filter(p, ["n2", "n1"])
        assert body["NodeNames"] == ["n1"]
        assert body["FailedNodes"] == {"n2": R.FGD_MORE_FRAGMENTATION}
        body = await env.filter(p, ["n2", "plain", "n1", "cpu-node"])
        assert body["NodeNames"] == ["plain", "cpu-node"]
        assert ann.VGPU_NODE not in env.server.get("Pod", "default", "cpu")["metadata"].get("annotations", {})
        assert await env.bind(p, "n1") == ""  # the bind verb binds it like any pod
        assert env.server.get("Pod", "default", "cpu")["spec"]["nodeName"] == "n1"
        spread = await env.create_pod(
            pod(
                "other",
                containers=[container("c", resources=requests)],
                annotations={ann.NODE_SCHEDULER_POLICY: "binpack"},
            )
        )
        assert (await env.filter(spread, ["n2", "n1"]))["NodeNames"] == ["n2", "n1"]  # other policies: all


async def test_fgd_sends_an_aligned_pod_where_kubelets_numa_node_has_its_gpu() -> None:
    """Six nodes whose NUMA-0 GPU is used up (by a Burstable pod: NUMA 0 keeps its CPUs and the
    GPU its free replicas) and an empty one. kubelet gives an aligned pod NUMA 0's CPUs on all
    seven (the lowest NUMA node with its CPUs and replicas), so on the six its GPU can only be
    NUMA 1's: unaligned. ``fgd`` ranks those below the empty node's aligned placement, whatever
    their fragmentation gains and the order of equal ones (a fallback looks only a few nodes
    further)."""
    aligned = parse_workload([{"cpu": "2", "gpus": 1, "gpuShare": 100, "aligned": True}])
    settings = SchedulerSettings(node_policy="fgd", gpu_policy="fgd", fgd_workload=aligned)
    names = [f"n{i}" for i in range(1, 8)]
    async with running_scheduler(settings) as env:
        profile = dataclasses.replace(PROFILE, observed_at=int(time.time()))
        for name in names:
            body = numa_node(name)
            body["metadata"]["annotations"][NUMA_PROFILE] = encode_profile(profile)
            env.server.put({"apiVersion": "v1", "kind": "Node", **body})
        await wait_for(lambda: all(env.scheduler.numa.free_cpus(n) is not None for n in names))
        for name in names[:-1]:
            filler = numa_pod(f"fill-{name}", mem=8000, annotations={ann.USE_GPU_UUID: f"{name}-g0"})
            filler["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "500m"  # Burstable
            filler["spec"]["containers"][0]["resources"]["limits"].pop("cpu")
            p = await env.create_pod(filler)
            assert (await env.filter(p, [name]))["NodeNames"] == [name]
            assert _allocated(env, f"fill-{name}").startswith(f"{name}-g0,")
        p = await env.create_pod(numa_pod("x", mem=8000, annotations={ann.NUMA_ALIGNMENT: "best-effort"}))
        assert (await env.filter(p, names))["NodeNames"] == ["n7"]
        assert _allocated(env, "x").startswith("n7-g0,")
        predicted = decode_prediction(
            env.server.get("Pod", "default", "x")["metadata"]["annotations"][NUMA_PREDICTED]
        )
        assert predicted.containers[0].numa == frozenset({0})


async def test_fgd_counts_gpus_kubelet_would_refuse_a_wide_aligned_shape_as_fragment() -> None:
    """The typical pod is aligned and asks 6 exclusive CPUs, more than a NUMA node of these nodes
    holds (3 and 4 assignable). Under ``best-effort`` kubelet still runs it (unaligned), so the
    ``lenient`` node's GPUs serve it; under ``single-numa-node`` (as under ``restricted``) its CPU
    hint is preferred only across both NUMA nodes and its replicas' on one, so kubelet never admits
    it and the ``strict`` node's GPUs are fragment for it. A Burstable share then goes to
    ``strict``, where it removes fragment, although ``lenient`` comes first among equal nodes."""
    assert tie_order("lenient") > tie_order("strict")  # without the rule they tie: lenient wins
    wide = parse_workload([{"cpu": "6", "gpus": 1, "gpuShare": 100, "aligned": True}])
    settings = SchedulerSettings(node_policy="fgd", gpu_policy="fgd", fgd_workload=wide)
    async with running_scheduler(settings) as env:
        now = int(time.time())
        for name, policy in (("strict", "single-numa-node"), ("lenient", "best-effort")):
            profile = dataclasses.replace(
                PROFILE,
                observed_at=now,
                policies=dataclasses.replace(PROFILE.policies, topology_manager_policy=policy),
            )
            body = numa_node(name)
            body["metadata"]["annotations"][NUMA_PROFILE] = encode_profile(profile)
            env.server.put({"apiVersion": "v1", "kind": "Node", **body})
        names = ["strict", "lenient"]
        await wait_for(lambda: all(env.scheduler.numa.free_cpus(n) is not None for n in names))
        share = numa_pod("x", mem=4000)
        share["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "500m"  # Burstable
        share["spec"]["containers"][0]["resources"]["limits"].pop("cpu")
        p = await env.create_pod(share)
        assert (await env.filter(p, names))["NodeNames"] == ["strict"]
