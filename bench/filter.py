"""Filter benchmark: latency in-process and over HTTP, pods/s, scheduler RSS.

Default: 1,000 nodes x 8 GPUs with 10,000 running pods (``--nodes 100`` for the small case,
whose running pods are proportionally smaller, with more vGPU slots per GPU, so GPUs fill alike).
The running pods are realistic wire JSON (env vars, volumes, probes, managedFields, a
last-applied annotation, statuses). In-process: the scheduler's pod cache is built as its watch
cache does (decode, trim, keep, feed the state), then the heap is frozen as ``hamid scheduler``
does after its first sync, then the filter's compute (fit, reserve, encode) is timed; its peak
RSS is the scheduler's (``--pod-trim generic`` / ``--no-gc-freeze`` give the figures without
those). Over HTTP: the real extender ``/filter`` against the embedded API server (seeded with the
same kind of nodes and pods, caches synced through the API), including the annotation patch.
With ``--prediction on`` (the default) every node publishes a NUMA profile (2 NUMA nodes x 32
cores x 2 threads, static CPU manager, single-numa-node), every running pod its observed placement,
and the new pods are Guaranteed (4 exclusive CPUs + 1 GPU): each filter predicts kubelet's NUMA node
on the nodes it tries and books the prediction, as ``/filter`` does; ``off`` is the plain fit.
The no-fit case (``--nofit-filters``) times the filter of a pod that fits nowhere, retried while
other pods are placed between its filters. ``--nodes 5000 --pods 50000`` is the large size (the
memory target of 300 MiB); the default size runs in well under 5 minutes.
The last output line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import math
import random
import resource
import time
from datetime import datetime
from typing import Any

import aiohttp
from benchstats import peak_rss_mib, percentile, print_figures

from hamid.fit.fit import PodFitSpec
from hamid.fit.numa_predict import Outcome
from hamid.kube.cache import trim_pod
from hamid.kube.client import connect
from hamid.log import configure
from hamid.model import annotations as ann
from hamid.model.devices import MODE_HAMI_CORE, DeviceInfo
from hamid.model.kube import Pod
from hamid.model.numa import (
    NUMA_PLACEMENT,
    NUMA_PROFILE,
    ContainerPlacement,
    CpuInfo,
    KubeletPolicies,
    NumaProfile,
    PodPlacement,
    encode_placement,
    encode_prediction,
    encode_profile,
)
from hamid.scheduler.app import SchedulerApp
from hamid.scheduler.core import DEFAULT_SCHEDULER_NAME, Scheduler, SchedulerSettings, freeze_heap
from hamid.scheduler.filter_plan import NumaFit
from hamid.scheduler.options import SchedulerOptions
from hamid.scheduler.podtrim import trim_scheduler_pod
from hamidsim.apiserver import ApiServer

GPU_MEM = 40960


#: ``(node policy, GPU policy)``; HAMi's defaults unless ``--policy``.
Policy = tuple[str, str]
DEFAULT_POLICY: Policy = ("binpack", "spread")

#: Running pods per GPU of the default case (10,000 on 1,000 x 8); denser cases scale down.
BASE_DENSITY = 1.25


def _shrink(nodes: int, gpus: int, pods: int) -> float:
    """How much smaller each running pod is than in the default case, so GPUs fill alike."""
    return max(1.0, pods / (nodes * gpus) / BASE_DENSITY)


#: The bench nodes' CPUs: 2 sockets = 2 NUMA nodes x 32 cores x 2 threads (siblings i, i + 64).
CORES_PER_NUMA = 32
NUMA_NODES = 2


def numa_profile(now: float) -> NumaProfile:
    """The NUMA profile every bench node publishes (CPU 0 and its sibling reserved)."""
    threads = NUMA_NODES * CORES_PER_NUMA
    infos = tuple(
        CpuInfo(cpu, cpu % threads, (cpu % threads) // CORES_PER_NUMA, (cpu % threads) // CORES_PER_NUMA)
        for cpu in range(2 * threads)
    )
    policies = KubeletPolicies(
        cpu_manager_policy="static",
        topology_manager_policy="single-numa-node",
        cpu_manager_options={"full-pcpus-only": "true"},
    )
    return NumaProfile(1, int(now), tuple(range(NUMA_NODES)), infos, frozenset({0, threads}), None, policies)


def _node(i: int, gpus: int, shrink: float = 1.0, profile: str = "") -> dict[str, Any]:
    devices = [
        DeviceInfo(
            id=f"GPU-{i:05d}-{g}",
            index=g,
            count=math.ceil(10 * shrink),
            devmem=GPU_MEM,
            devcore=100,
            type="NVIDIA-A100",
            numa=g // 4,
            mode=MODE_HAMI_CORE,
            health=True,
        )
        for g in range(gpus)
    ]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": f"node-{i:05d}",
            "annotations": {ann.NODE_REGISTER: ann.encode_node_devices(devices)}
            | ({NUMA_PROFILE: profile} if profile else {}),
        },
        "status": {"allocatable": {"nvidia.com/gpu": str(gpus * 10), "cpu": "128", "memory": "1Ti"}},
    }


def _pod(name: str, uid: str, mem: int, cores: int, cpus: int = 0) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(mem), "nvidia.com/gpucores": str(cores)}
    if cpus:  # Guaranteed: exclusive CPUs
        limits |= {"cpu": str(cpus), "memory": "8Gi"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": uid, "annotations": {}},
        "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": limits}}]},
        "status": {"phase": "Pending"},
    }


def _running(
    i: int, nodes: int, gpus: int, rng: random.Random, shrink: float = 1.0, placement: bool = False
) -> dict[str, Any]:
    """A running pod as the API server serves it (what a real cluster's pods carry).

    With ``placement`` it carries the node agent's observed placement (its GPU replica's NUMA node).
    """
    n, g = rng.randrange(nodes), rng.randrange(gpus)
    mem = int(rng.choice((1000, 2000, 4000)) / shrink)
    cores = max(1, int(rng.choice((5, 10, 20)) / shrink))
    p = _pod(f"run-{i}", f"uid-run-{i}", mem, cores)
    app = f"app-{i % 50}"
    main = p["spec"]["containers"][0]
    main.update(
        name="main",
        image=f"registry.example.com/team/{app}:1.{i % 7}.3",
        command=["python", "-m", "server"],
        args=["--port=8080", "--workers=4", f"--model=/models/{app}"],
        env=[{"name": f"SETTING_{k}", "value": f"value-{k}-{i % 13}-{'x' * 24}"} for k in range(12)]
        + [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        ports=[{"containerPort": 8080, "name": "http", "protocol": "TCP"}],
        volumeMounts=[
            {"name": "models", "mountPath": "/models", "readOnly": True},
            {"name": "config", "mountPath": "/etc/app"},
            {"name": "kube-api-access", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"},
        ],
        readinessProbe={"httpGet": {"path": "/ready", "port": 8080}, "periodSeconds": 10},
        livenessProbe={"httpGet": {"path": "/live", "port": 8080}, "failureThreshold": 3},
        securityContext={"allowPrivilegeEscalation": False, "runAsNonRoot": True},
        terminationMessagePath="/dev/termination-log",
        imagePullPolicy="IfNotPresent",
    )
    sidecar = {
        "name": "log-shipper",
        "image": "registry.example.com/infra/shipper:2.1",
        "env": [{"name": f"SHIP_{k}", "value": f"{k}-{'y' * 20}"} for k in range(6)],
        "resources": {"limits": {"cpu": "100m", "memory": "64Mi"}},
        "volumeMounts": [{"name": "logs", "mountPath": "/var/log/app"}],
    }
    p["spec"]["containers"].append(sidecar)
    alloc = f"GPU-{n:05d}-{g},NVIDIA,{mem},{cores}:;;"
    meta = p["metadata"]
    meta.update(
        generateName=f"{app}-7d9f8c-",
        creationTimestamp="2024-05-01T10:00:00Z",
        labels={"app": app, "pod-template-hash": "7d9f8c", ann.VGPU_NODE: f"node-{n:05d}"},
        ownerReferences=[
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": f"{app}-7d9f8c", "uid": f"rs-{app}"}
        ],
        managedFields=[
            {
                "manager": "kube-controller-manager",
                "operation": "Update",
                "fieldsV1": {"f:spec": {"f:x": {}}},
            },
            {
                "manager": "kubelet",
                "operation": "Update",
                "subresource": "status",
                "fieldsV1": {"f:status": {}},
            },
        ],
    )
    meta["annotations"] = {
        ann.VGPU_NODE: f"node-{n:05d}",
        ann.VGPU_TIME: "1714557600",
        ann.DEVICES_ALLOCATED: alloc,
        ann.DEVICES_TO_ALLOCATE: ";;",
        ann.BIND_PHASE: ann.BIND_PHASE_SUCCESS,
        "kubectl.kubernetes.io/last-applied-configuration": json.dumps(p["spec"]),
        "prometheus.io/scrape": "true",
    }
    if placement:
        numa = g * NUMA_NODES // gpus
        held = {"nvidia.com/gpu": {numa: (f"GPU-{n:05d}-{g}::{i}",)}}
        record = PodPlacement(1, (ContainerPlacement("main", frozenset({numa}), frozenset(), held),))
        meta["annotations"][NUMA_PLACEMENT] = encode_placement(record)
    p["spec"].update(
        nodeName=f"node-{n:05d}",
        schedulerName=DEFAULT_SCHEDULER_NAME,
        serviceAccountName=app,
        volumes=[
            {"name": "models", "persistentVolumeClaim": {"claimName": f"{app}-models"}},
            {"name": "config", "configMap": {"name": f"{app}-config"}},
            {"name": "logs", "emptyDir": {}},
            {
                "name": "kube-api-access",
                "projected": {
                    "sources": [{"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}}]
                },
            },
        ],
        tolerations=[
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        ],
    )
    p["status"] = {
        "phase": "Running",
        "conditions": [
            {"type": t, "status": "True", "lastTransitionTime": "2024-05-01T10:00:05Z"}
            for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")
        ],
        "hostIP": f"10.0.{n // 256}.{n % 256}",
        "podIP": f"10.244.{i // 256 % 256}.{i % 256}",
        "startTime": "2024-05-01T10:00:00Z",
        "qosClass": "Burstable",
        "containerStatuses": [
            {
                "name": c["name"],
                "ready": True,
                "restartCount": 0,
                "image": c["image"],
                "imageID": f"registry.example.com/x@sha256:{'0' * 64}",
                "containerID": f"containerd://{i:064x}",
                "state": {"running": {"startedAt": "2024-05-01T10:00:03Z"}},
            }
            for c in p["spec"]["containers"]
        ],
    }
    return p


def _rss_now_mib() -> float:
    """Current RSS of this process (Linux ``/proc/self/statm``)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize() / 2**20


def _bench_no_fit(
    scheduler: Scheduler, candidates: tuple[str, ...], filters: int, prediction: bool, policy: Policy
) -> dict[str, float]:
    """Time the filter of a pod that fits nowhere (more MiB than any GPU has), under churn.

    kube-scheduler retries such a pod again and again; between two of its filters one other pod
    is placed (untimed), so one node's usage changes each time, as in a busy cluster.
    """
    latencies = []
    failed_nodes = 0
    for i in range(filters):
        pod = _pod(f"huge-{i % 4}", f"uid-huge-{i % 4}", GPU_MEM + 1, 10, cpus=4 if prediction else 0)
        t0 = time.perf_counter()
        spec = PodFitSpec.from_pod(pod, scheduler.config, policy[1], policy[0])
        numa = NumaFit.of(pod, f"uid-huge-{i % 4}") if prediction else None
        node, _fitted, failed = scheduler.planner.plan(pod, spec, candidates, numa)
        latencies.append(time.perf_counter() - t0)
        if node is not None:
            raise RuntimeError(f"the no-fit pod fitted on {node}")
        failed_nodes = len(failed)
        churn = _pod(f"churn-{i}", f"uid-churn-{i}", 1000, 5)
        spec = PodFitSpec.from_pod(churn, scheduler.config, policy[1], policy[0])
        node, fitted, _failed = scheduler.planner.plan(churn, spec, candidates)
        if node is not None and fitted is not None:
            scheduler.ledger.reserve(churn, node, fitted.devices, ann.encode_pod_devices(fitted.devices))
    if not latencies:
        return {}
    return {
        "nofit_filter_p50_ms": percentile(latencies, 0.5) * 1000,
        "nofit_filter_p99_ms": percentile(latencies, 0.99) * 1000,
        "nofit_filter_max_ms": max(latencies) * 1000,
        "nofit_failed_nodes": failed_nodes,
    }


def bench_in_process(
    nodes: int,
    gpus: int,
    pods: int,
    filters: int,
    *,
    pod_trim: str,
    gc_freeze: bool,
    prediction: bool,
    nofit_filters: int = 0,
    policy: Policy = DEFAULT_POLICY,
) -> dict[str, float]:
    """Build the pod cache and state as the scheduler does; time fit + reserve + encode per pod.

    With ``prediction`` each filter also predicts (on the nodes it tries), books the prediction in
    the NUMA ledger and encodes its annotation, as ``/filter`` does.
    """
    rng = random.Random(1)
    settings = SchedulerSettings(node_policy=policy[0], gpu_policy=policy[1])
    scheduler = Scheduler(None, settings=settings)  # type: ignore[arg-type]  # no API calls here
    state = scheduler.state
    trim = trim_scheduler_pod if pod_trim == "scheduler" else trim_pod
    shrink = _shrink(nodes, gpus, pods)
    profile = encode_profile(numa_profile(time.time())) if prediction else ""
    names = []
    for i in range(nodes):
        node = _node(i, gpus, shrink, profile)
        scheduler._node_seen(node)
        names.append(node["metadata"]["name"])
    cache: dict[str, Pod] = {}  # what the scheduler's PodCache keeps
    rss_before = _rss_now_mib()
    for i in range(pods):
        running = _running(i, nodes, gpus, rng, shrink, placement=prediction)
        running["metadata"]["resourceVersion"] = str(1000 + i)  # as served (the API server sets it)
        wire = json.dumps(running).encode()
        record = trim(json.loads(wire))
        cache[f"default/run-{i}"] = record
        scheduler._pod_seen(record)
    cache_mib = _rss_now_mib() - rss_before
    if gc_freeze:
        freeze_heap()
    else:
        gc.collect()
    t0 = time.perf_counter()
    gc.collect()  # what a full collection would stall a filter for, with this heap
    full_gc_s = time.perf_counter() - t0
    candidates = tuple(names)
    latencies = []
    cpu: list[float] = []  # CPU time per filter: what a loaded machine's wall clock hides
    predicted = predictions = 0
    started = time.perf_counter()
    for i in range(filters):
        uid = f"uid-new-{i}"
        pod = _pod(f"new-{i}", uid, 2000, 20, cpus=4 if prediction else 0)
        t0, c0 = time.perf_counter(), time.process_time()
        spec = PodFitSpec.from_pod(pod, scheduler.config, policy[1], policy[0])
        numa = NumaFit.of(pod, uid) if prediction else None
        target, fitted, _failed = scheduler.planner.plan(pod, spec, candidates, numa)
        if target is not None and fitted is not None:
            state.ledger.reserve(pod, target, fitted.devices, ann.encode_pod_devices(fitted.devices))
            chosen = numa.predictions.get(target) if numa is not None else None
            if numa is not None and chosen is not None and chosen.outcome is Outcome.PLACED:
                encode_prediction(chosen.record(1))
                scheduler.numa.book(uid, target, chosen, pod)
                predicted += 1
        latencies.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        predictions += len(numa.predictions) if numa is not None else 0
    elapsed = time.perf_counter() - started
    nofit = _bench_no_fit(scheduler, candidates, nofit_filters, prediction, policy)
    return {
        **nofit,
        "prediction": prediction,
        "filters_predicted_placed": predicted,
        "nodes_predicted_per_filter": predictions / max(filters, 1),
        "filter_p50_ms": percentile(latencies, 0.5) * 1000,
        "filter_p99_ms": percentile(latencies, 0.99) * 1000,
        "filter_max_ms": max(latencies) * 1000,
        "filter_cpu_p50_ms": percentile(cpu, 0.5) * 1000,
        "filter_cpu_p99_ms": percentile(cpu, 0.99) * 1000,
        "in_process_pods_per_s": filters / elapsed,
        "rss_mib": peak_rss_mib(),
        "pod_cache_and_state_mib": cache_mib,
        "full_gc_ms": full_gc_s * 1000,
    }


async def _heap_frozen(before: int, timeout_s: float = 60.0) -> None:
    """Wait until the scheduler froze its heap after its first sync (one full collection, hundreds
    of ms at this size): in a cluster it lands before kube-scheduler's filters, not inside one."""
    deadline = time.monotonic() + timeout_s
    while gc.get_freeze_count() == before:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the scheduler did not freeze its heap within {timeout_s:g}s of its sync")
        await asyncio.sleep(0.01)


async def bench_http(
    nodes: int, gpus: int, pods: int, filters: int, *, gc_freeze: bool, policy: Policy = DEFAULT_POLICY
) -> dict[str, Any]:
    """Real /filter over HTTP against the embedded API server (patch included).

    The nodes carry a handshake already (a running cluster's), so no burst of the scheduler's
    handshake writes lands inside the timed calls. Besides latency: the process CPU time per call
    (less sensitive to a loaded machine) and the API requests per filter.
    """
    rng = random.Random(2)
    shrink = _shrink(nodes, gpus, pods)
    async with ApiServer() as server:
        handshake = ann.format_handshake(datetime.now())  # handshaked: no burst of handshake writes
        for i in range(nodes):
            node = _node(i, gpus, shrink)
            node["metadata"]["annotations"][ann.NODE_HANDSHAKE] = handshake
            server.put(node)
        for i in range(pods):
            server.put(_running(i, nodes, gpus, rng, shrink))
        new_pods = [server.put(_pod(f"new-{i}", f"uid-http-{i}", 2000, 20)) for i in range(filters)]
        kube = await connect(api_server=server.url, request_timeout=30.0)
        options = SchedulerOptions(
            extender_listen="127.0.0.1:0",
            listen="127.0.0.1:0",
            metrics_listen="127.0.0.1:0",
            settings=SchedulerSettings(gc_freeze=gc_freeze, node_policy=policy[0], gpu_policy=policy[1]),
        )
        app = SchedulerApp(options, kube=kube)
        frozen = gc.get_freeze_count()
        port = (await app.start())["extender"]
        try:
            await app.wait_synced(120)
            if gc_freeze:
                await _heap_frozen(frozen)
            names = [f"node-{i:05d}" for i in range(nodes)]
            latencies = []
            cpu = []
            requests_before = server.requests.copy()
            async with aiohttp.ClientSession() as session:
                started = time.perf_counter()
                for pod in new_pods:
                    t0, c0 = time.perf_counter(), time.process_time()
                    async with session.post(
                        f"http://127.0.0.1:{port}/filter", json={"Pod": pod, "NodeNames": names}
                    ) as resp:
                        body = await resp.json()
                    latencies.append(time.perf_counter() - t0)
                    cpu.append(time.process_time() - c0)
                    if not body.get("NodeNames"):
                        raise RuntimeError(f"filter failed: {body}")
                elapsed = time.perf_counter() - started
            api_calls = server.requests - requests_before
        finally:
            await app.stop()
            await kube.close()
    return {
        "http_filter_p50_ms": percentile(latencies, 0.5) * 1000,
        "http_filter_p99_ms": percentile(latencies, 0.99) * 1000,
        "pods_per_s": filters / elapsed,
        "http_filter_cpu_p50_ms": percentile(cpu, 0.5) * 1000,
        "http_filter_cpu_p99_ms": percentile(cpu, 0.99) * 1000,
        "api_calls_per_filter": {k: round(v / filters, 2) for k, v in sorted(api_calls.items())},
    }


def main() -> None:
    """Run both phases and print the figures; the last line is JSON."""
    configure("json", "error")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000, help="number of nodes (default 1000)")
    parser.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (default 8)")
    parser.add_argument(
        "--pods", type=int, default=10_000, help="running pods already placed (default 10000)"
    )
    parser.add_argument("--filters", type=int, default=2000, help="in-process filter calls (default 2000)")
    parser.add_argument(
        "--nofit-filters",
        type=int,
        default=200,
        help="in-process filter calls of a pod that fits nowhere (default 200; 0 skips them)",
    )
    parser.add_argument(
        "--http-filters", type=int, default=300, help="HTTP filter calls (default 300; 0 skips the phase)"
    )
    parser.add_argument(
        "--prediction",
        choices=("on", "off"),
        default="on",
        help="NUMA profiles, placements and Guaranteed pods: the filter predicts (default on)",
    )
    parser.add_argument(
        "--pod-trim",
        choices=("scheduler", "generic"),
        default="scheduler",
        help="pod cache trim: the scheduler's (default) or the generic one (managedFields, most of status)",
    )
    parser.add_argument(
        "--policy",
        default="/".join(DEFAULT_POLICY),
        help="node/GPU scheduler policy, e.g. fgd/fgd (default: HAMi's binpack/spread)",
    )
    parser.add_argument(
        "--no-gc-freeze", action="store_true", help="leave the synced heap in the cyclic GC (for comparison)"
    )
    args = parser.parse_args()
    node_policy, _, gpu_policy = args.policy.partition("/")
    policy = (node_policy, gpu_policy or node_policy)
    logging.disable(logging.WARNING)
    result: dict[str, Any] = {"nodes": args.nodes, "gpus_per_node": args.gpus_per_node, "pods": args.pods}
    result["pod_trim"] = args.pod_trim
    result["policy"] = "/".join(policy)
    result["gc_freeze"] = not args.no_gc_freeze
    result.update(
        bench_in_process(
            args.nodes,
            args.gpus_per_node,
            args.pods,
            args.filters,
            pod_trim=args.pod_trim,
            gc_freeze=not args.no_gc_freeze,
            prediction=args.prediction == "on",
            nofit_filters=args.nofit_filters,
            policy=policy,
        )
    )
    print(
        f"in-process: p50 {result['filter_p50_ms']:.3f} ms, p99 {result['filter_p99_ms']:.3f} ms, "
        f"max {result['filter_max_ms']:.1f} ms (CPU time p50 {result['filter_cpu_p50_ms']:.3f} ms, "
        f"p99 {result['filter_cpu_p99_ms']:.3f} ms), {result['in_process_pods_per_s']:.0f} pods/s, "
        f"scheduler peak RSS {result['rss_mib']:.0f} MiB "
        f"(pod cache + state {result['pod_cache_and_state_mib']:.0f} MiB, trim {args.pod_trim}); "
        f"a full GC takes {result['full_gc_ms']:.1f} ms (gc freeze {'off' if args.no_gc_freeze else 'on'})"
    )
    if "nofit_filter_p50_ms" in result:
        print(
            f"no-fit: p50 {result['nofit_filter_p50_ms']:.3f} ms, "
            f"p99 {result['nofit_filter_p99_ms']:.3f} ms, "
            f"max {result['nofit_filter_max_ms']:.1f} ms ({result['nofit_failed_nodes']} failed-node reasons)"
        )
    print(
        f"prediction {args.prediction}: {result['filters_predicted_placed']} filters booked a prediction, "
        f"{result['nodes_predicted_per_filter']:.2f} nodes predicted per filter"
    )
    if args.http_filters > 0:
        result.update(
            asyncio.run(
                bench_http(
                    args.nodes,
                    args.gpus_per_node,
                    args.pods,
                    args.http_filters,
                    gc_freeze=not args.no_gc_freeze,
                    policy=policy,
                )
            )
        )
        print(
            f"http: p50 {result['http_filter_p50_ms']:.2f} ms, p99 {result['http_filter_p99_ms']:.2f} ms, "
            f"{result['pods_per_s']:.0f} pods/s (API server in the same process)"
        )
    result["process_peak_rss_mib"] = peak_rss_mib()
    print_figures(result)


if __name__ == "__main__":
    main()
