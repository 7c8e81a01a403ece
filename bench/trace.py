"""Trace replay: Alibaba's openb GPU-sharing trace through hamid's real scheduler, plugin and kubelet.

The FGD paper's experiment (USENIX ATC '23, Fig. 9): the trace's pods shuffled with a seed, clones
appended until the arrived GPU request is 130 % of the cluster's GPUs, submitted one at a time and
scheduled once (a pod that fails is dropped, nothing is deleted). Each pod goes the product's way,
in process (``bench/replay/cluster.py`` says which code runs at each step): the webhook, kube-
scheduler's NodeResourcesFit (CPU-only pods scored by the default profile), hamid's ``/filter`` and
``/bind``, the plugin's Allocate (with NUMA refit) and the simulated kubelet's admission on a NUMA
model of the node. Unallocated GPU % = 100 - allocated / capacity, read at 90/100/110/130 % arrived.
``--numa off`` is the paper's setting; ``on``: 2 NUMA nodes per node, static CPU manager, Topology
Manager ``restricted``; ``strict``: ``single-numa-node``. ``docs/packing.md`` explains the method.
The last output line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import random
import resource
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchstats import peak_rss_mib, percentile, print_figures

from hamid.log import configure

configure("json", "error")  # before the modules below bind their loggers

from replay.cluster import Cluster, ShapeCheck, SimNode  # noqa: E402
from replay.pods import (  # noqa: E402
    INFLATION,
    MILLI,
    NODES_CSV,
    PODS_CSV,
    PUBLISHED_CSV,
    TraceError,
    TraceNode,
    TracePod,
    aligned_shape,
    arrivals,
    manifest,
    parse_seeds,
    read_nodes,
    read_pods,
)

from hamid.fit.policy import FGD, GPU_POLICIES, NODE_POLICIES  # noqa: E402
from hamid.model.annotations import DEVICES_ALLOCATED, decode_pod_devices  # noqa: E402
from hamid.model.numa import HIDE_STEER, SPANNING_RULES  # noqa: E402
from hamid.plugin.options import AUTO_HIDE_RULE, HIDE_CHOICES  # noqa: E402
from hamid.scheduler.core import SchedulerSettings, freeze_heap  # noqa: E402
from hamidsim.apiserver.patch import json_patch  # noqa: E402
from hamidsim.kube_scheduler import default_scores, pod_requests, select_host  # noqa: E402

#: Arrived GPU % at which the unallocated GPU % is reported (the paper reads 100 and 130).
READ_AT = (90, 100, 110, 130)
#: Figures that are curves (a value per arrived %, 0..130): plotted, not printed.
CURVES = ("curve", "admissible_curve")
#: Failure causes (a kubelet rejection is ``kubelet:<reason>``).
NO_GPU_ROOM = "no_gpu_room"
CPU_MEMORY_SHORT = "gpu_room_only_where_cpu_or_memory_short"
CPU_ONLY_NO_ROOM = "cpu_only_pod_no_cpu_or_memory_room"
#: Who places CPU-only pods unless ``--cpu-pods`` says otherwise: hamid, as the README recommends
#: running ``fgd`` (under HAMi's policies hamid keeps every candidate, so kube-scheduler decides).
CPU_PODS_DEFAULT = "hamid"
#: GPU room only on nodes with the CPUs and memory that kube-scheduler's search did not send hamid
#: (``--nodes-to-score`` below 100).
NOT_SENT = "gpu_room_only_on_nodes_not_sent"
#: kube-scheduler's ``percentageOfNodesToScore`` unless ``--nodes-to-score`` says otherwise: every
#: node, as the paper's simulator weighs every node (0: kube-scheduler's adaptive default, which
#: the chart leaves; docs/packing.md measures both).
NODES_TO_SCORE_DEFAULT = 100
#: GPU room on nodes with the CPUs and memory, refused by the filter's NUMA prediction.
NUMA_REFUSED = "gpu_room_refused_by_numa_prediction"
#: An aligned pod no node could ever admit under ``restricted`` / ``single-numa-node``: its exclusive
#: CPUs are more than any NUMA node of its GPU model holds, so the CPU manager's hint is preferred
#: only across NUMA nodes, while its GPU replicas fit one NUMA node, whose hint alone the device
#: manager prefers; kubelet admits only a merged hint both prefer (docs/packing.md).
NEVER_ADMISSIBLE = "never_admissible_by_kubelet"
#: The plugin's HAMi-core host directories go to memory when it can (one per container).
_SCRATCH = "/dev/shm" if Path("/dev/shm").is_dir() else None
PUBLISHED_POLICIES = {"06-FGD": "published FGD", "05-BestFit": "published Best-fit"}


def known_policies() -> list[str]:
    """Every ``node/GPU`` pair the scheduler knows that packs shares: each node policy with the GPU
    policy of the same name, and HAMi's default pair (``topology-aware``, ``mutex`` and ``numa`` are
    GPU filters or orders the trace gives nothing to act on: no GPU links, no exclusive GPUs)."""
    defaults = SchedulerSettings()
    pairs = [f"{p}/{p}" for p in NODE_POLICIES if p in GPU_POLICIES]
    hami = f"{defaults.node_policy}/{defaults.gpu_policy}"
    if hami not in pairs:
        pairs.insert(1, hami)
    return pairs


def parse_policies(text: str) -> list[tuple[str, str]]:
    """``binpack/spread,spread/spread`` → pairs (node policy, GPU policy); unknown ones refused."""
    pairs = []
    for item in text.split(","):
        node, sep, gpu = item.strip().partition("/")
        if not sep or node not in NODE_POLICIES or gpu.split(",")[0] not in GPU_POLICIES:
            raise SystemExit(
                f"--policies: {item.strip()!r} is not node/GPU with a node policy of {NODE_POLICIES} "
                f"and a GPU policy of {GPU_POLICIES}"
            )
        pairs.append((node, gpu))
    return pairs


@dataclass
class Replay:
    """What one replay (one policy, one seed) measured."""

    capacity: int
    arrived: int = 0
    allocated: int = 0
    #: (arrived %, unallocated %, never-admissible GPU failed %) after each GPU pod.
    curve: list[tuple[float, float, float]] = field(default_factory=list)
    #: Milli-GPU of the failed pods that no node could ever admit (:data:`NEVER_ADMISSIBLE`).
    never_failed: int = 0
    failures: Counter[str] = field(default_factory=Counter)
    filter_s: list[float] = field(default_factory=list)
    #: NUMA-aligned LS GPU pods: [placed, aligned] in all, and among those that fit one NUMA node.
    ls: list[int] = field(default_factory=lambda: [0, 0])
    ls_one_numa: list[int] = field(default_factory=lambda: [0, 0])
    #: Unaligned LS GPU pods that fit one NUMA node but had no aligned place when they came.
    ls_unalignable: int = 0
    never_single_numa: int = 0
    never_admissible: int = 0
    gpu_used: Counter[str] = field(default_factory=Counter)
    shapes: ShapeCheck | None = None

    def note(self, pod: TracePod, placed: bool, never_admissible: bool = False) -> None:
        """Count one scheduled (or failed) pod."""
        self.arrived += pod.gpu_request
        if placed:
            self.allocated += pod.gpu_request
        elif never_admissible:
            self.never_failed += pod.gpu_request
        if pod.gpu_request:
            self.curve.append(
                (
                    100 * self.arrived / self.capacity,
                    100 - 100 * self.allocated / self.capacity,
                    100 * self.never_failed / self.capacity,
                )
            )

    def unallocated_at(self, arrived_pct: float, column: int = 1) -> float | None:
        """Unallocated % after the first pod with which the arrived GPU reached ``arrived_pct``
        (``column`` 2: the GPU that the failed pods no node could ever admit asked for, % of the GPUs)."""
        for point in self.curve:
            if point[0] >= arrived_pct:
                return point[column]
        return None


async def _hamid_path(
    cluster: Cluster,
    trace: TracePod,
    pod: dict[str, Any],
    feasible: tuple[str, ...],
    sent: tuple[str, ...],
    replay: Replay,
    rng: random.Random,
) -> str:
    """kube-scheduler with hamid as extender: the node bound, or the failure cause.

    kube-scheduler sends hamid the ``sent`` nodes of those NodeResourcesFit passed (``feasible``),
    and scores the nodes hamid keeps (several only for a CPU-only pod) as it does any.
    """
    if sent:
        started = time.perf_counter()
        kept, error = await cluster.filter(pod, sent)
        replay.filter_s.append(time.perf_counter() - started)
        if error:
            return f"filter_error: {error}"
        request = pod_requests(pod)
        node = kept[0] if len(kept) == 1 else select_host(default_scores(request, cluster.kube, kept), rng)
        if node is not None:
            await cluster.api.settle()
            error = await cluster.bind(pod, node)
            return f"bind_error: {error}" if error else node
    if not trace.num_gpu:
        return CPU_ONLY_NO_ROOM
    if sent and cluster.numa != "off" and cluster.gpu_room(pod, sent):
        never = replay.shapes is not None and replay.shapes.never_admissible(trace, cluster.numa)
        return NEVER_ADMISSIBLE if never else NUMA_REFUSED
    if len(sent) < len(feasible) and cluster.gpu_room(pod, feasible):
        return NOT_SENT
    return CPU_MEMORY_SHORT if cluster.gpu_room(pod, cluster.names) else NO_GPU_ROOM


async def _default_path(
    cluster: Cluster, pod: dict[str, Any], feasible: tuple[str, ...], rng: random.Random
) -> str:
    """kube-scheduler alone (a pod without GPUs): the best-scored feasible node, bound."""
    request = pod_requests(pod)
    node = select_host(default_scores(request, cluster.kube, feasible), rng)
    if node is None:
        return CPU_ONLY_NO_ROOM
    meta = pod["metadata"]
    await cluster.api.bind_pod(meta["namespace"], meta["name"], meta["uid"], node)
    return node


async def place(cluster: Cluster, trace: TracePod, uid: str, replay: Replay, rng: random.Random) -> bool:
    """One pod, the product's way; whether it runs (a failure is counted by cause in ``replay``)."""
    api = cluster.api
    pod = manifest(trace, uid, cluster.numa != "off")
    verdict = cluster.scheduler.admission.judge(pod, "default")
    if not verdict.allowed:
        replay.failures[f"webhook_denied: {verdict.message}"] += 1
        return False
    stored = api.create_pod(json_patch(pod, list(verdict.patch)) if verdict.patch else pod)
    await api.settle()
    await cluster.scheduler.fgd_warmup.idle()  # the scheduler's idle time before kube-scheduler asks
    request = pod_requests(stored)
    feasible = cluster.room.feasible(request)
    if stored["spec"].get("schedulerName") == cluster.scheduler.settings.scheduler_name:
        sent = cluster.extender_search.sample(feasible)
        outcome = await _hamid_path(cluster, trace, stored, feasible, sent, replay, rng)
    else:
        outcome = await _default_path(cluster, stored, cluster.default_search.sample(feasible), rng)
    node = cluster.nodes.get(outcome)
    if node is None:
        replay.failures[outcome] += 1
        return False
    cluster.room.add(node.name, request)
    await api.settle()
    bound = await api.get_pod("default", trace_key(stored))
    record = await node.admit(bound)
    await cluster.publish(node, bound, record)
    if not record.admitted:
        cluster.room.remove(node.name, request)
        replay.failures[f"kubelet:{record.reason}"] += 1
        return False
    _count_placed(cluster, node, trace, record, replay)
    return True


def trace_key(pod: dict[str, Any]) -> str:
    """The pod's name (every trace pod lives in ``default``)."""
    return str(pod["metadata"]["name"])


def _count_placed(cluster: Cluster, node: SimNode, trace: TracePod, record: Any, replay: Replay) -> None:
    """GPU usage and NUMA alignment of a pod kubelet admitted (the GPUs it runs on are its annotation's)."""
    if not trace.num_gpu:
        return
    pod = cluster.api.pods[f"default/{trace.name}"]
    devices = [
        d for c in decode_pod_devices(pod["metadata"]["annotations"].get(DEVICES_ALLOCATED, "")) for d in c
    ]
    for device in devices:
        replay.gpu_used[device.uuid] += device.usedcores
    if not aligned_shape(trace, cluster.numa != "off"):
        return
    numas = {node.gpu_numa[d.uuid] for d in devices} | {
        n for c in record.containers for n in c.cpu_numa_nodes
    }
    aligned = int(len(numas) == 1)
    replay.ls[0] += 1
    replay.ls[1] += aligned
    if replay.shapes is not None and replay.shapes.fits_one_numa(trace):
        replay.ls_one_numa[0] += 1
        replay.ls_one_numa[1] += aligned
        if not aligned:
            replay.ls_unalignable += not _could_align(cluster, node, trace, devices, record, replay)


def _could_align(
    cluster: Cluster, chosen: SimNode, trace: TracePod, devices: list[Any], record: Any, replay: Replay
) -> bool:
    """Whether the aligned pod, run unaligned on ``chosen``, could have run aligned anywhere when it
    came: a node NodeResourcesFit passes, of its GPU model, where the simulated kubelet would give its
    CPUs one NUMA node whose GPUs have room for it (by the bookings of the pods kubelet admitted). It
    is the simulator's and the bench's judgement, not hamid's: the other nodes are as they were when
    the pod came; on ``chosen`` kubelet gave the pod's CPUs the NUMA node it would have given them,
    and the pod's own GPUs are taken out of the bookings. Under ``--hide-replicas steer`` the plugin
    leads kubelet to any NUMA node with the free exclusive CPUs, so each such one counts."""
    used = Counter(replay.gpu_used)
    for device in devices:
        used[device.uuid] -= device.usedcores
    models = trace.gpu_models
    pod = cluster.api.pods[f"default/{trace.name}"]
    given = {n for c in record.containers for n in c.cpu_numa_nodes}
    given_numa = min(given) if len(given) == 1 else None
    for name in (*cluster.room.feasible(pod_requests(pod)), chosen.name):
        node = cluster.nodes[name]
        if models is not None and node.trace.model not in models:
            continue
        if cluster.hide_rule == HIDE_STEER:
            need = -(-trace.cpu_milli // MILLI)
            numas = {n for n in node.layout.numa_cpus if node.free_cpus_on(n) >= need}
            numas |= {given_numa} if node is chosen and given_numa is not None else set()
        else:
            numa = given_numa if node is chosen else node.kubelet_numa(pod)
            numas = {numa} if numa is not None else set()
        if any(_room_on(node, n, trace, used) for n in numas):
            return True
    return False


def _room_on(node: SimNode, numa: int, trace: TracePod, used: Counter[str]) -> bool:
    """Whether NUMA node ``numa`` of ``node`` has GPUs with room for the pod (a share: one GPU with
    that much free; whole GPUs: that many idle ones), by ``used`` (booked cores per GPU)."""
    gpus = [uuid for uuid, n in node.gpu_numa.items() if n == numa]
    if trace.num_gpu == 1 and trace.gpu_milli < MILLI:
        return any(100 - used[uuid] >= trace.gpu_percent for uuid in gpus)
    return sum(used[uuid] == 0 for uuid in gpus) >= trace.num_gpu


def stranded_gpus(cluster: Cluster, replay: Replay) -> tuple[int, int]:
    """(idle GPUs, idle GPUs on a NUMA node without a free CPU): no exclusive CPU left there (NUMA
    on) or less than one CPU of the node's allocatable unrequested."""
    idle = stranded = 0
    for node in cluster.nodes.values():
        kube = cluster.kube[node.name]
        unrequested = kube.allocatable.milli_cpu - kube.requested.milli_cpu
        for uuid, numa in node.gpu_numa.items():
            if replay.gpu_used[uuid]:
                continue
            idle += 1
            free = unrequested if cluster.numa == "off" else min(unrequested, node.free_cpus_on(numa) * MILLI)
            stranded += free < MILLI
    return idle, stranded


async def replay_one(
    nodes: list[TraceNode],
    pods: list[TracePod],
    numa: str,
    policy: tuple[str, str],
    seed: int,
    limit: int | None = None,
    cpu_pods: str = CPU_PODS_DEFAULT,
    hide_replicas: str = "auto",
    nodes_to_score: int = NODES_TO_SCORE_DEFAULT,
) -> dict[str, Any]:
    """Replay the trace once (one policy, one seed; the first ``limit`` arrivals only); its figures.

    ``cpu_pods``: ``hamid`` runs the scheduler with ``--schedule-cpu-pods`` (CPU-only pods go
    through hamid's filter too), ``kube-scheduler`` leaves them to the default profile.
    ``hide_replicas``: the plugin's ``--hide-replicas``; ``nodes_to_score``: kube-scheduler's
    ``percentageOfNodesToScore``."""
    capacity = sum(n.gpus for n in nodes) * MILLI
    sequence = arrivals(pods, capacity, seed)[:limit]
    with tempfile.TemporaryDirectory(prefix="hamid-trace-", dir=_SCRATCH) as hook:
        cluster = Cluster(
            nodes, numa, policy[0], policy[1], hook, cpu_pods == "hamid", hide_replicas, nodes_to_score
        )
        await cluster.start()
        freeze_heap()  # as ``hamid scheduler`` does after its first sync: full GCs skip the cluster
        spans = numa == "on" and cluster.hide_rule in SPANNING_RULES
        shapes = ShapeCheck(((n.trace.model, n.layout) for n in cluster.nodes.values()), spans)
        replay = Replay(capacity, shapes=shapes)
        rng = random.Random(seed)
        started, cpu_started = time.perf_counter(), time.process_time()
        for i, trace in enumerate(sequence):
            aligned = aligned_shape(trace, numa != "off")
            replay.never_single_numa += int(aligned and not shapes.fits_one_numa(trace))
            never = shapes.never_admissible(trace, numa)
            replay.never_admissible += int(never)
            replay.note(trace, await place(cluster, trace, f"uid-{i}", replay, rng), never)
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
        idle, stranded = stranded_gpus(cluster, replay)
        refits = dict(cluster.refit.outcomes) if cluster.refit is not None else {}
        await cluster.stop()
    gc.unfreeze()  # the next replay in this process collects this one's cluster
    figures = _figures(replay, len(sequence), elapsed, idle, stranded, refits)
    figures["cpu_ms_per_pod"] = 1000 * cpu / max(len(sequence), 1)
    return figures


def _figures(
    replay: Replay, pods: int, elapsed: float, idle: int, stranded: int, refits: dict[str, int]
) -> dict[str, Any]:
    figures: dict[str, Any] = {f"unallocated_pct_at_{x}": replay.unallocated_at(x) for x in READ_AT}
    figures.update(
        {f"never_admissible_failed_pct_at_{x}": replay.unallocated_at(x, column=2) for x in READ_AT}
    )
    failures = replay.failures
    figures.update(
        pods=pods,
        failed_no_gpu_room=failures[NO_GPU_ROOM],
        failed_cpu_memory_short=failures[CPU_MEMORY_SHORT],
        failed_numa_refused=failures[NUMA_REFUSED],
        failed_not_sent=failures[NOT_SENT],
        failed_never_admissible=failures[NEVER_ADMISSIBLE],
        failed_cpu_only=failures[CPU_ONLY_NO_ROOM],
        failed_kubelet=sum(v for k, v in failures.items() if k.startswith("kubelet:")),
        topology_affinity_errors=failures["kubelet:TopologyAffinityError"],
        failed_other=sum(
            v for k, v in failures.items() if k.startswith(("filter_error", "bind_error", "webhook"))
        ),
        ls_gpu_pods_placed=replay.ls[0],
        ls_aligned_pct=100 * replay.ls[1] / replay.ls[0] if replay.ls[0] else None,
        ls_one_numa_aligned_pct=100 * replay.ls_one_numa[1] / replay.ls_one_numa[0]
        if replay.ls_one_numa[0]
        else None,
        ls_unalignable_pods=replay.ls_unalignable,
        ls_alignable_aligned_pct=100 * replay.ls_one_numa[1] / (replay.ls_one_numa[0] - replay.ls_unalignable)
        if replay.ls_one_numa[0] > replay.ls_unalignable
        else None,
        never_single_numa_pods=replay.never_single_numa,
        never_admissible_pods=replay.never_admissible,
        refits_moved=refits.get("moved", 0),
        refits_refused=refits.get("refused", 0),
        idle_gpus=idle,
        idle_gpus_stranded_without_cpu=stranded,
        filter_p50_ms=percentile(replay.filter_s, 0.5) * 1000 if replay.filter_s else None,
        filter_p99_ms=percentile(replay.filter_s, 0.99) * 1000 if replay.filter_s else None,
        pods_per_s=pods / elapsed,
    )
    figures["failure_causes"] = dict(failures.most_common())
    figures["curve"] = [replay.unallocated_at(x) for x in range(0, 131)]
    # unallocated % less the GPU of the failed pods no node could ever admit, point by point
    figures["admissible_curve"] = [
        _less(replay.unallocated_at(x), replay.unallocated_at(x, 2)) for x in range(131)
    ]
    return figures


#: Figures also given seed by seed beside their median (a median of 100 % may hide a seed below it).
PER_SEED = (
    *(f"unallocated_pct_at_{x}" for x in READ_AT),
    "ls_one_numa_aligned_pct",
    "ls_alignable_aligned_pct",
)


def median_figures(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The median of every numeric figure over the seeds (curves point by point), and the
    :data:`PER_SEED` figures of every seed (``per_seed``, in the seeds' order)."""
    out: dict[str, Any] = {"per_seed": {key: [r[key] for r in runs] for key in PER_SEED}}
    for key, value in runs[0].items():
        if key == "failure_causes":
            out[key] = dict(sum((Counter(r[key]) for r in runs), Counter()))
        elif key in CURVES:
            out[key] = [_median([r[key][i] for r in runs]) for i in range(len(value))]
        else:
            out[key] = _median([r[key] for r in runs])
    return out


def _less(value: float | None, part: float | None) -> float | None:
    return None if value is None or part is None else value - part


def _median(values: Sequence[Any]) -> Any:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _fmt(value: Any, unit: str = "") -> str:
    if value is None:
        return "-"
    return f"{value:.2f}{unit}" if isinstance(value, float) else f"{value}{unit}"


def _lowest(figures: dict[str, Any], key: str) -> str:
    """`` (lowest seed X%)`` when several seeds ran (the median may hide one below it)."""
    values = [v for v in figures["per_seed"][key] if v is not None]
    return f" (lowest seed {min(values):.2f}%)" if len(values) > 1 else ""


def report(policy: str, figures: dict[str, Any]) -> None:
    """One readable block per policy."""
    unallocated = ", ".join(f"{x}%: {_fmt(figures[f'unallocated_pct_at_{x}'], '%')}" for x in READ_AT)
    print(f"{policy}: unallocated GPU at arrived {unallocated}")
    if figures["never_admissible_pods"]:
        never = ", ".join(
            f"{x}%: {_fmt(figures[f'never_admissible_failed_pct_at_{x}'], '%')}" for x in READ_AT
        )
        print(
            f"  pods no node could ever admit (exclusive CPUs wider than any NUMA node, beside replicas "
            f"that fit one): {figures['never_admissible_pods']} arrived; their failed GPU, % of the GPUs, "
            f"by arrived {never}"
        )
    print(
        f"  failed: no GPU room {figures['failed_no_gpu_room']}, GPU room only where CPU/memory short "
        f"{figures['failed_cpu_memory_short']}, only on nodes not sent {figures['failed_not_sent']}, "
        f"refused by NUMA prediction {figures['failed_numa_refused']}, "
        f"never admissible {figures['failed_never_admissible']}, "
        f"kubelet {figures['failed_kubelet']} "
        f"(TopologyAffinityError {figures['topology_affinity_errors']}), "
        f"CPU-only {figures['failed_cpu_only']}, "
        f"other {figures['failed_other']}"
    )
    print(
        f"  LS GPU pods aligned {_fmt(figures['ls_aligned_pct'], '%')} "
        f"(of those fitting one NUMA node {_fmt(figures['ls_one_numa_aligned_pct'], '%')}, "
        f"of those that could run aligned when they came {_fmt(figures['ls_alignable_aligned_pct'], '%')}"
        f"{_lowest(figures, 'ls_alignable_aligned_pct')}: {_fmt(figures['ls_unalignable_pods'])} could not; "
        f"{figures['never_single_numa_pods']} never single-NUMA), refits {figures['refits_moved']} moved / "
        f"{figures['refits_refused']} refused, "
        f"idle GPUs {figures['idle_gpus']} ({figures['idle_gpus_stranded_without_cpu']} stranded without CPU)"
    )
    print(
        f"  filter p50 {_fmt(figures['filter_p50_ms'], ' ms')}, p99 {_fmt(figures['filter_p99_ms'], ' ms')}, "
        f"{_fmt(figures['pods_per_s'])} pods/s, {_fmt(figures['cpu_ms_per_pod'])} ms of CPU per pod",
        flush=True,
    )


def plot(path: Path, results: dict[str, dict[str, Any]], published: Path, title: str) -> None:
    """Unallocated GPU % against arrived % per policy, beside the published FGD and Best-fit curves."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(figsize=(8, 5))
    for policy, figures in results.items():
        curve = [(x, y) for x, y in enumerate(figures["curve"]) if y is not None]
        (line,) = axes.plot([p[0] for p in curve], [p[1] for p in curve], label=f"hamid {policy}")
        if figures["never_admissible_pods"]:
            less = [(x, y) for x, y in enumerate(figures["admissible_curve"]) if y is not None]
            axes.plot(
                [p[0] for p in less],
                [p[1] for p in less],
                linestyle=":",
                color=line.get_color(),
                label=f"hamid {policy}, less the pods kubelet can never admit",
            )
    for name, label in PUBLISHED_POLICIES.items():
        points = _published(published, name)
        axes.plot([p[0] for p in points], [p[1] for p in points], linestyle="--", label=label)
    axes.set(xlabel="arrived GPU (% of capacity)", ylabel="unallocated GPU (%)", title=title, xlim=(50, 130))
    axes.set_ylim(0, 50)
    axes.legend()
    axes.grid(alpha=0.3)
    fig.savefig(path, dpi=120, bbox_inches="tight")


def _published(path: Path, policy: str) -> list[tuple[float, float]]:
    import csv

    with path.open(newline="") as handle:
        rows = [r for r in csv.DictReader(handle) if r["policy"] == policy]
    return [(float(r["arrived_pct"]), float(r["unalloc_pct_median"])) for r in rows]


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes-csv", type=Path, default=NODES_CSV, help=f"node list (default {NODES_CSV})")
    parser.add_argument("--pods-csv", type=Path, default=PODS_CSV, help=f"pod list (default {PODS_CSV})")
    parser.add_argument(
        "--policies",
        default=",".join(known_policies()),
        help=f"node/GPU policy pairs, comma-separated (default: {','.join(known_policies())})",
    )
    parser.add_argument(
        "--numa", choices=("off", "on", "strict"), default="on", help="NUMA model (default on)"
    )
    parser.add_argument("--seeds", default="42", help="seed, list or range, e.g. 42-51 (medians reported)")
    parser.add_argument(
        "--jobs",
        type=int,
        default=os.cpu_count() or 1,
        help="replays run at once, one process each (default: CPUs)",
    )
    parser.add_argument("--limit", type=int, help="replay only the first N arrivals (a quick look)")
    parser.add_argument(
        "--cpu-pods",
        choices=("kube-scheduler", "hamid"),
        default=CPU_PODS_DEFAULT,
        help="who places CPU-only pods: kube-scheduler's default profile alone, or hamid's filter with "
        "--schedule-cpu-pods first, as recommended for fgd (HAMi's policies keep every candidate, "
        f"so kube-scheduler still decides) (default {CPU_PODS_DEFAULT})",
    )
    parser.add_argument(
        "--hide-replicas",
        choices=HIDE_CHOICES,
        default="auto",
        help="the plugin's --hide-replicas: which free GPU replicas it reports Unhealthy to kubelet "
        f"(default auto: {AUTO_HIDE_RULE} with NUMA)",
    )
    parser.add_argument(
        "--nodes-to-score",
        type=int,
        choices=range(101),
        metavar="0..100",
        default=NODES_TO_SCORE_DEFAULT,
        help="kube-scheduler's percentageOfNodesToScore: the share of the nodes whose feasible ones it "
        "sends the extender, searched from where its last search stopped (0: its adaptive default, "
        f"41 %% of the trace's 1,213 nodes, as the chart leaves it; default {NODES_TO_SCORE_DEFAULT}: "
        "every node, as the paper's simulator)",
    )
    parser.add_argument("--plot", type=Path, help="draw the curves (and the published ones) into this PNG")
    parser.add_argument(
        "--published-csv",
        type=Path,
        default=PUBLISHED_CSV,
        help=f"published results (default {PUBLISHED_CSV})",
    )
    return parser.parse_args()


def main() -> None:
    """Replay every policy for every seed; print the figures, the last line JSON."""
    args = _arguments()
    logging.disable(logging.WARNING)
    policies, seeds = parse_policies(args.policies), parse_seeds(args.seeds)
    try:
        nodes, pods = read_nodes(args.nodes_csv), read_pods(args.pods_csv)
        if args.plot is not None:
            _check_plotting(args.published_csv)
    except TraceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    print(
        f"{len(nodes)} nodes, {sum(n.gpus for n in nodes)} GPUs, {len(pods)} trace pods; arrivals to "
        f"{INFLATION:.0%} of the GPUs; NUMA {args.numa}; seeds {args.seeds}; "
        f"CPU-only pods by {args.cpu_pods}; --hide-replicas {args.hide_replicas}; "
        f"nodes to score {args.nodes_to_score or 'adaptive'} %",
        flush=True,
    )
    options = (args.limit, args.cpu_pods, args.hide_replicas, args.nodes_to_score)
    jobs = [(nodes, pods, args.numa, policy, seed, *options) for policy in policies for seed in seeds]
    results: dict[str, dict[str, Any]] = {}
    runs: list[dict[str, Any]] = []
    for job, figures in zip(jobs, _run_all(jobs, args.jobs), strict=True):
        runs.append(figures)
        if len(runs) == len(seeds):
            name = "/".join(job[3])
            results[name] = median_figures(runs)
            report(name, results[name])
            runs = []
    if args.plot is not None:
        plot(args.plot, results, args.published_csv, f"openb, NUMA {args.numa}, seeds {args.seeds}")
        print(f"plot written to {args.plot}")
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    summary = {
        "numa": args.numa,
        "seeds": seeds,
        "cpu_pods": args.cpu_pods,
        "hide_replicas": args.hide_replicas,
        "nodes_to_score": args.nodes_to_score,
        "peak_rss_mib": max(peak_rss_mib(), children),
    }
    summary["policies"] = {p: {k: v for k, v in f.items() if k not in CURVES} for p, f in results.items()}
    print_figures(summary)


def _replay_job(job: tuple[Any, ...]) -> dict[str, Any]:
    figures = asyncio.run(replay_one(*job))
    gc.collect()
    return figures


def _run_all(jobs: list[tuple[Any, ...]], workers: int) -> Iterator[dict[str, Any]]:
    """Each replay's figures, in order; ``workers`` > 1: that many processes at a time."""
    workers = workers or min(len(jobs), 2 * (os.cpu_count() or 1))
    if workers <= 1 or len(jobs) == 1:
        yield from map(_replay_job, jobs)
        return
    with ProcessPoolExecutor(max_workers=min(workers, len(jobs))) as pool:
        futures = {i: pool.submit(_replay_job, jobs[i]) for i in _longest_first(jobs)}
        for i in range(len(jobs)):
            yield futures[i].result()


def _longest_first(jobs: list[tuple[Any, ...]]) -> list[int]:
    """The jobs' indexes, ``fgd`` replays (the costliest) first: the last job to start is a short
    one, so the run's wall clock is close to its CPU time over the workers, not a long job's tail."""
    return sorted(range(len(jobs)), key=lambda i: (FGD not in jobs[i][3], i))


def _check_plotting(published: Path) -> None:
    """Fail before the replay when the plot cannot be drawn."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise TraceError("--plot needs matplotlib: pip install -e '.[bench]'") from None
    if not published.is_file():
        raise TraceError(
            f"published results {published} not found (fgd_published_results.csv of the shared trace)"
        )


if __name__ == "__main__":
    main()
