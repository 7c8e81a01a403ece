"""Randomised soak of the whole stack that checks every invariant all the time, hostile tenants included.

Runs a :class:`~hamidsim.cluster.SimCluster` of several demo nodes (2 NUMA nodes x 16 CPUs,
8 GPUs each; refit enabled over mTLS) and pushes pods through webhook → kube-scheduler driver →
``/filter`` ``/bind`` → simulated kubelet (single-numa-node, static CPUs) → plugin (with refit),
completing and deleting pods along the way. The invariants are checked from what the API server
holds (allocation annotations, the nodes' ``hami.io/node-nvidia-register``) and what the kubelets
handed the containers (their Allocate environment) — never from the scheduler's own view, except
where that view is itself under test (accounting):

* each pod as it starts running: runtime GPUs and memory limits == ``vgpu-devices-allocated`` ==
  the scheduler's reservation, ``vgpu-devices-to-allocate`` consumed; a ``strict`` pod never runs
  with a GPU off its CPUs' NUMA node; a ``best-effort`` pod is aligned unless its refit fell back;
* after every batch and every delete, over the whole cluster: per GPU, the slots, MiB and cores the
  live pods' annotations book and the memory limits of the running containers stay within the
  registered capacity (I1); the scheduler's accounting equals the usage the annotations imply;
* at the end: no pod got stuck; mismatches happened and refits fixed some (a run that needed
  refits and made none fails).

A hostile tenant joins: every few batches it creates, bypassing the webhook (``hami.io/webhook:
ignore``), a CPU-only pod and a GPU pod with ``spec.nodeName`` preset, both carrying forged
allocation annotations (a GPU's whole memory; 2,000,000,000 MiB), and through the webhook a GPU pod
carrying forged ones. None may be booked, served its forged allocation, or keep the forged values.

A tampering tenant (issue 22, docs/trust.md) strikes as often: it patches the allocation of two
RUNNING pods (a 1 MiB entry on another GPU of the node; ``:::``) and gives a parked pod of this
scheduler (pinned to a GPU no node has) ``hami.io/vgpu-node`` and ``:::``. Each patch is first
sent to the scheduler's webhook as an UPDATE by the tenant (it must be denied), then made past it
(the soak's API server has no UPDATE webhook: the webhook bypassed). The scheduler must keep every
booking as it was and report the change (an ``AllocationAnnotationIgnored`` Event), book nothing
for the parked pod, and the capacity checks count the tampered pods at the allocation they run
with. Counted in ``tamper`` (patches, webhook denials, reports); a failure is a violation.

The workload (every pod's request and the hostile pods) is drawn from ``--seed`` before the run
starts: a seed reproduces its workload (``workload_sha256``); placements depend on timing.

Predictive placement (``--prediction on``, the default): the nodes' agents publish their NUMA
profiles and placements and the scheduler predicts kubelet's NUMA node; ``off`` runs the same
workload with nothing published (the scheduler as before prediction). The default run has 10 nodes
of the 2-socket SMT machine (2 NUMA nodes x 32 cores x 2 threads, 8 GPUs) and one mixed-GPU node,
1,000 pods in batches of 40, every fifth batch a burst to one node (all its pods but the
heterogeneous ones, which need the mixed-GPU node: plain and pinned pods by node selector, foreign
pods bound to it), and ~5 % foreign Guaranteed CPU pods bound by the default
scheduler (``spec.nodeName`` preset).

Leader pause (``--leader-pause``, see :class:`LeaderPause`): after the first batch a second
scheduler replica (a real ``hamid scheduler`` process, with its own kube-scheduler driver) takes
the Lease over, leads a while, and is paused (SIGSTOP) past its Lease while pods flow; the
cluster's scheduler takes over and the woken replica must not decide beside it. The invariants
are checked as always; the result gains ``leader_pause`` (hand-over, pause and takeover seconds).

Usage: ``python bench/soak.py`` (no arguments needed; ``--pods``, ``--nodes``, ``--seed``,
``--prediction``, ``--leader-pause`` exist). Last output line: one JSON object with ``pods``,
``refits``, ``refusals``,
``violations`` (must be 0), ``violation_kinds``, ``checks`` (invariant checks run), ``fallbacks``,
``prediction``, ``opted_in``, ``opted_in_refitted``, ``refit_rate``, ``topology_affinity_errors``,
``strict_failures``, ``prediction_hits``, ``prediction_misses``, ``miss_causes`` (the scheduler's),
``plugin_prediction`` (the node agents' hits, misses and causes), ``tamper``, ``pods_per_s`` and
``peak_rss_mib``. Exit status 1 when there is any violation.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import random
import re
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp
from benchstats import peak_rss_mib, print_figures

from hamid.log import configure
from hamid.model.kube import JSON

configure("json", "error")  # before the modules below bind their loggers

from hamid.kube.client import connect  # noqa: E402
from hamid.model import annotations as ann  # noqa: E402
from hamid.model import reasons as R  # noqa: E402
from hamid.model.alignment import AlignmentMode, parse_alignment  # noqa: E402
from hamid.model.errors import InvalidInput  # noqa: E402
from hamid.model.numa import MISS_CAUSES  # noqa: E402
from hamid.model.resources import ResourceConfig  # noqa: E402
from hamid.scheduler.core import DEFAULT_SCHEDULER_NAME  # noqa: E402
from hamidsim.cluster import (  # noqa: E402
    SIM_LEASE_NAME,
    ClusterOptions,
    NodeSpec,
    SimCluster,
    data_file,
    wait_until,
)
from hamidsim.demo import HETERO_MACHINE  # noqa: E402
from hamidsim.kube_scheduler import KubeSchedulerDriver  # noqa: E402
from hamidsim.kubelet.config import SIM_DEFAULTS, KubeletConfig  # noqa: E402
from hamidsim.kubelet.memorymanager import MemoryReservation  # noqa: E402
from hamidsim.machine import load_machine_file  # noqa: E402
from hamidsim.replicas import SchedulerProcess, write_key_file  # noqa: E402
from hamidsim.replicas import wait_for as replica_wait  # noqa: E402

MODES = ("", "best-effort", "best-effort", "strict")
CPUS = (1, 2, 2, 4, 8, 16)
MEMORY = (4000, 8000, 16000, 20000)
NAMES = ResourceConfig()
#: The soak's share of pods pinned with ``nvidia.com/use-gpuuuid`` and of heterogeneous pods.
PINNED_SHARE = 0.1
HETERO_SHARE = 0.1
#: A hostile tenant strikes once every this many batches.
HOSTILE_EVERY = 5
HOSTILE_LABELS = {"hami.io/webhook": "ignore", "soak/hostile": "true"}
HOSTILE_MIB = 2_000_000_000
#: The tampering tenant's identity (the soak's own client is anonymous, as a tenant's kubectl).
TENANT = "system:anonymous"
#: How long the scheduler may take to report a tampered allocation.
TAMPER_REPORT_S = 10.0
HOSTNAME_LABEL = "kubernetes.io/hostname"
#: The soak's nodes: the 2-socket SMT machine (128 CPUs, 8 GPUs, 2 NUMA nodes).
SOAK_MACHINE = "machine-smt-2socket-8gpu.yaml"
#: Share of foreign pods (Guaranteed, CPU only, bound by the default scheduler) and their CPUs.
FOREIGN_SHARE = 0.05
FOREIGN_CPUS = (4, 8, 16, 24)
#: Every this many batches, the whole batch goes to one node (a burst).
BURST_EVERY = 5
TOPOLOGY_AFFINITY_ERROR = "TopologyAffinityError"
#: How long a pod may take to settle: a burst of 40 pods to one node passes its node lock one pod
#: at a time (HAMi's protocol), so the last one waits for the 39 before it. On a machine whose CPUs
#: are shared with other work every step of that chain is slower: ``--settle-s`` raises it there.
SETTLE_S = 60.0
#: ``--memory-manager static``: each pod asks this many GiB per CPU, so a NUMA node's memory (512 GiB
#: on the soak machine) runs out at ~42 CPUs, before its 62 assignable CPUs: memory binds first.
STATIC_GIB_PER_CPU = 12
#: ``--memory-manager static``: kubelet's Memory Manager Static, 1 GiB ``reservedMemory`` per NUMA
#: node, matched by ``systemReserved`` + kubelet's default 100Mi hard eviction threshold.
STATIC_MEMORY_CONFIG = replace(
    SIM_DEFAULTS,
    memory_manager_policy="Static",
    reserved_memory=tuple(MemoryReservation(n, (("memory", 1 << 30),)) for n in (0, 1)),
    reserved_memory_types={"memory": (2 << 30) - (100 << 20)},
)
ACCOUNTING_S = 5.0
#: kube-scheduler's FitError (``0/N nodes are available: ...``): the pod is unschedulable now. Any
#: other failed attempt (a bind that timed out, an extender error) is retried by kube-scheduler and
#: may still bind the pod, so the pod has not settled: deleting it then would race its admission.
FIT_ERROR = re.compile(r"^0/\d+ nodes are available:")


def foreign_pod(rng: random.Random, name: str, nodes: list[str]) -> JSON:
    """A Guaranteed CPU-only pod bound by the default scheduler (``spec.nodeName`` preset)."""
    cpu = rng.choice(FOREIGN_CPUS)
    limits = {"cpu": str(cpu), "memory": f"{cpu}Gi"}
    spec: JSON = {
        "nodeName": rng.choice(nodes),
        "containers": [{"name": "batch", "image": "batch", "resources": {"limits": limits}}],
    }
    return {"metadata": {"name": name, "namespace": "default", "annotations": {}}, "spec": spec}


def random_pod(
    rng: random.Random,
    name: str,
    pin_uuids: list[str],
    hetero_nodes: list[str],
    foreign_nodes: list[str] | None = None,
) -> tuple[str, JSON]:
    """A Guaranteed GPU pod and its kind: ``plain`` (1-2 GPUs, random memory and alignment, sometimes
    numa-bind), ``pinned`` (``use-gpuuuid`` on one GPU: a refit may only be refused) or ``hetero``
    (2 GPUs with numa-bind and a memory percentage on a mixed-GPU node: differing MiB per GPU, which
    the refit refuses); with ``foreign_nodes``, sometimes a ``foreign`` CPU pod bound to one of them."""
    draw = rng.random()
    kind = "plain"
    if rng.random() < FOREIGN_SHARE and foreign_nodes:
        return "foreign", foreign_pod(rng, name, foreign_nodes)
    if draw < PINNED_SHARE and pin_uuids:
        kind = "pinned"
    elif draw < PINNED_SHARE + HETERO_SHARE and hetero_nodes:
        kind = "hetero"
    gpus = 2 if kind == "hetero" else 1 if kind == "pinned" else rng.choice((1, 1, 1, 2))
    notes: dict[str, str] = {}
    mode = rng.choice(MODES[1:]) if kind != "plain" else rng.choice(MODES)
    if mode:
        notes[ann.NUMA_ALIGNMENT] = mode
    if kind == "hetero" or (gpus == 2 and rng.random() < 0.5):
        notes[ann.NUMA_BIND] = "true"
    if kind == "pinned":
        notes[ann.USE_GPU_UUID] = rng.choice(pin_uuids)
    cpu = rng.choice(CPUS)
    limits: dict[str, Any] = {"cpu": str(cpu), "memory": f"{cpu * 2}Gi", NAMES.resource_count_name: gpus}
    if kind == "hetero":
        limits[NAMES.resource_memory_percentage_name] = 25
    else:
        limits[NAMES.resource_memory_name] = rng.choice(MEMORY)
    spec: JSON = {"containers": [{"name": "main", "image": "soak", "resources": {"limits": limits}}]}
    if kind == "hetero":
        spec["nodeSelector"] = {HOSTNAME_LABEL: rng.choice(hetero_nodes)}
    return kind, {"metadata": {"name": name, "namespace": "default", "annotations": notes}, "spec": spec}


def hostile_pods(
    rng: random.Random, strike: int, nodes: list[str], gpus: dict[str, list[tuple[str, int]]]
) -> list[JSON]:
    """A hostile tenant's pods: forged allocation annotations on a CPU-only pod and on a GPU pod with
    ``spec.nodeName`` preset (both past the webhook, as its objectSelector lets ``ignore`` pods),
    and on a GPU pod sent through the webhook (which must remove them)."""
    node = rng.choice(nodes)
    uuid, memory = rng.choice(gpus[node])
    forged = {
        ann.VGPU_NODE: node,
        ann.DEVICES_TO_ALLOCATE: f"{uuid},NVIDIA,{memory},100:;",
        ann.DEVICES_ALLOCATED: f"{uuid},NVIDIA,{memory},100:;",
        ann.BIND_PHASE: ann.BIND_PHASE_SUCCESS,
    }
    huge = {**forged, ann.DEVICES_ALLOCATED: f"{uuid},NVIDIA,{HOSTILE_MIB},100:;"}
    gpu_limits = {"cpu": "1", "memory": "2Gi", NAMES.resource_count_name: 1, NAMES.resource_memory_name: 1000}

    def pod(name: str, notes: dict[str, str], limits: dict[str, Any], preset: bool, bypass: bool) -> JSON:
        spec: JSON = {"containers": [{"name": "main", "image": "evil", "resources": {"limits": limits}}]}
        if preset:
            spec["nodeName"] = node
            spec["schedulerName"] = DEFAULT_SCHEDULER_NAME
        meta: JSON = {"name": name, "namespace": "default", "annotations": dict(notes)}
        meta["labels"] = dict(HOSTILE_LABELS) if bypass else {"soak/hostile": "true"}
        return {"metadata": meta, "spec": spec}

    return [
        pod(f"hostile-{strike}-cpu", huge, {"cpu": "1", "memory": "1Gi"}, preset=True, bypass=True),
        pod(f"hostile-{strike}-preset", forged, gpu_limits, preset=True, bypass=True),
        pod(f"hostile-{strike}-webhook", forged, gpu_limits, preset=False, bypass=False),
    ]


@dataclass
class Workload:
    """Everything the run will create, drawn from the seed before it starts."""

    pods: list[tuple[str, JSON]]
    hostile: dict[int, list[JSON]]
    churn_seed: int

    def digest(self) -> str:
        """sha256 of the workload: equal for equal seeds."""
        body = json.dumps([self.pods, sorted(self.hostile.items()), self.churn_seed], sort_keys=True)
        return hashlib.sha256(body.encode()).hexdigest()


def draw_workload(
    seed: int,
    pods: int,
    concurrency: int,
    pin_uuids: list[str],
    hetero_nodes: list[str],
    gpus: dict[str, list[tuple[str, int]]],
) -> Workload:
    """The run's pods and hostile strikes, all from ``seed``."""
    rng = random.Random(seed)
    normal = sorted(n for n in gpus if n not in hetero_nodes) or sorted(gpus)
    drawn = [random_pod(rng, f"soak-{i}", pin_uuids, hetero_nodes, normal) for i in range(pods)]
    batches = (pods + concurrency - 1) // max(concurrency, 1)
    for b in range(BURST_EVERY - 1, batches, BURST_EVERY):  # the whole batch to one node
        target = rng.choice(normal)
        for kind, pod in drawn[b * concurrency : (b + 1) * concurrency]:
            if kind in ("plain", "pinned"):  # every node of the machine file has the pinned UUID
                pod["spec"]["nodeSelector"] = {HOSTNAME_LABEL: target}
            elif kind == "foreign":
                pod["spec"]["nodeName"] = target
    hostile = {b: hostile_pods(rng, b, normal, gpus) for b in range(0, batches, HOSTILE_EVERY)}
    return Workload(drawn, hostile, rng.randrange(2**32))


@dataclass
class Ledger:
    """Violations by kind (with the first few texts) and how many checks ran."""

    kinds: Counter[str] = field(default_factory=Counter)
    texts: list[str] = field(default_factory=list)
    checks: int = 0

    def add(self, kind: str, text: str) -> None:
        self.kinds[kind] += 1
        if len(self.texts) < 40:
            self.texts.append(f"{kind}: {text}")


def _live(pod: JSON) -> bool:
    meta = pod.get("metadata") or {}
    return (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed") and not meta.get(
        "deletionTimestamp"
    )


def _hostile(pod: JSON) -> bool:
    """A hostile pod created past the webhook (the one sent through it is a pod like any other)."""
    return ((pod.get("metadata") or {}).get("labels") or {}).get("hami.io/webhook") == "ignore"


def _runtime(container: Any) -> tuple[list[str], list[int]]:
    env = container.env
    runtime = [u for u in env.get("NVIDIA_VISIBLE_DEVICES", "").split(",") if u]
    limits = [int(env.get(f"CUDA_DEVICE_MEMORY_LIMIT_{i}", "0m").rstrip("m")) for i in range(len(runtime))]
    return runtime, limits


class Checker:
    """The invariants, read from the API server and the kubelets (see the module doc)."""

    def __init__(self, cluster: SimCluster, ledger: Ledger) -> None:
        self.cluster = cluster
        self.ledger = ledger
        self.aligned = 0
        #: Pod UID -> (node, allocation) it ran with before a tenant rewrote its annotations.
        self.tampered: dict[str, tuple[str, str]] = {}

    def register(self) -> dict[str, dict[str, tuple[int, int, int]]]:
        """node -> GPU -> (slots, MiB, cores) as each node's plugin registered them."""
        out: dict[str, dict[str, tuple[int, int, int]]] = {}
        for node in self.cluster.server.list("Node", None):
            raw = ((node.get("metadata") or {}).get("annotations") or {}).get(ann.NODE_REGISTER)
            if raw is None:
                continue
            devices = ann.decode_node_devices(raw)
            out[node["metadata"]["name"]] = {d.id: (d.count, d.devmem, d.devcore) for d in devices}
        return out

    def annotated(self) -> dict[str, dict[str, tuple[int, int, int]]]:
        """node -> GPU -> (slots, MiB, cores) the live non-hostile pods' allocation annotations book
        (a tampered pod's: the allocation it runs with, from before the tenant's patch)."""
        usage: dict[str, dict[str, tuple[int, int, int]]] = {}
        for pod in self.cluster.server.list("Pod", None):
            notes = (pod.get("metadata") or {}).get("annotations") or {}
            raw, node = notes.get(ann.DEVICES_ALLOCATED), notes.get(ann.VGPU_NODE)
            node, raw = self.tampered.get(str(pod["metadata"].get("uid")), (node, raw))
            if not _live(pod) or _hostile(pod) or raw is None or node is None:
                continue
            gpus = usage.setdefault(node, {})
            for entry in ann.decode_pod_devices(raw):
                for d in entry:
                    slots, mem, cores = gpus.get(d.uuid, (0, 0, 0))
                    gpus[d.uuid] = (slots + 1, mem + d.usedmem, cores + d.usedcores)
        return usage

    def capacity(self, when: str) -> None:
        """I1 from the annotations and the register, and from the running containers' memory limits."""
        self.ledger.checks += 1
        register = self.register()
        for node, gpus in self.annotated().items():
            for uuid, (slots, mem, cores) in gpus.items():
                cap = register.get(node, {}).get(uuid)
                if cap is None:
                    self.ledger.add("unknown-gpu", f"{when}: {node}/{uuid} booked but not registered")
                    continue
                for kind, used, total in (
                    ("slots", slots, cap[0]),
                    ("memory", mem, cap[1]),
                    ("cores", cores, cap[2]),
                ):
                    if used > total:
                        self.ledger.add(f"over-commit-{kind}", f"{when}: {node}/{uuid} {used} > {total}")
        runtime: dict[tuple[str, str], int] = defaultdict(int)
        for pod in self.cluster.server.list("Pod", None):
            if (pod.get("status") or {}).get("phase") != "Running":
                continue
            admission = self.cluster.assignment(pod["metadata"]["name"])
            for container in admission.containers if admission else ():
                for uuid, mem in zip(*_runtime(container), strict=True):
                    runtime[(pod["spec"]["nodeName"], uuid)] += mem
        for (node, uuid), mem in runtime.items():
            total = register.get(node, {}).get(uuid, (0, 0, 0))[1]
            if mem > total:
                self.ledger.add(
                    "over-commit-runtime", f"{when}: {node}/{uuid} limits {mem} MiB > {total} MiB"
                )

    async def accounting(self, when: str) -> None:
        """The scheduler's accounting settles to the usage the annotations imply."""
        self.ledger.checks += 1

        def equal() -> bool:
            return self.cluster.booked_usage() == self.annotated()

        try:
            await wait_until(equal, ACCOUNTING_S, "accounting settles")
        except TimeoutError:
            self.ledger.add(
                "accounting",
                f"{when}: scheduler {self.cluster.booked_usage()} != annotations {self.annotated()}",
            )

    def running_pod(self, name: str, fallback: bool) -> None:
        """A pod that runs: runtime == both annotations == accounting; its alignment."""
        self.ledger.checks += 1
        cluster = self.cluster
        pod = cluster.pod(name)
        admission, allocated, reservation = (
            cluster.assignment(name),
            cluster.allocated(name),
            cluster.reservation(name),
        )
        if admission is None or allocated is None or reservation is None:
            self.ledger.add("identity", f"{name}: running without assignment/annotation/reservation")
            return
        pending = cluster.to_allocate(name) or ()
        if any(entry for entry in pending):
            self.ledger.add("identity", f"{name}: running with unconsumed to-allocate {pending}")
        table = cluster.gpu_numa(pod["spec"]["nodeName"])
        mode = parse_alignment((pod.get("metadata") or {}).get("annotations") or {})
        for container in admission.containers:
            devices = allocated[container.index] if container.index < len(allocated) else ()
            runtime, limits = _runtime(container)
            annotated = [d.uuid for d in devices]
            booked = (
                [d.uuid for d in reservation.layout[container.index]]
                if container.index < len(reservation.layout)
                else []
            )
            if not (runtime == annotated == booked) or limits != [d.usedmem for d in devices]:
                self.ledger.add(
                    "identity",
                    f"{name}: runtime {runtime} {limits} annotation {annotated} accounting {booked}",
                )
            if mode is AlignmentMode.NONE or container.numa_node is None or not runtime:
                continue
            aligned = {table.get(u) for u in runtime} == {container.numa_node}
            self.aligned += aligned
            if mode is AlignmentMode.STRICT and not aligned:
                self.ledger.add(
                    "strict-unaligned", f"{name}: GPUs {runtime} not on CPU NUMA {container.numa_node}"
                )
            elif not aligned and not fallback:
                self.ledger.add(
                    "unaligned", f"{name}: GPUs {runtime} not on CPU NUMA {container.numa_node}, no fallback"
                )

    def hostile(self, pods: list[JSON]) -> Counter[str]:
        """No forged allocation is served, kept or booked (an unsigned allocation is foreign: it
        books nothing, docs/trust.md). Returns the hostile pods' phases."""
        self.ledger.checks += 1
        phases: Counter[str] = Counter()
        for sent in pods:
            name = sent["metadata"]["name"]
            try:
                pod = self.cluster.pod(name)
            except KeyError:
                continue  # refused at admission: nothing to check
            phases[str((pod.get("status") or {}).get("phase") or "Pending")] += 1
            forged = sent["metadata"]["annotations"].get(ann.DEVICES_ALLOCATED)
            held = ((pod.get("metadata") or {}).get("annotations") or {}).get(ann.DEVICES_ALLOCATED)
            if "webhook" in name and held == forged:
                self.ledger.add("hostile", f"{name}: the webhook kept the forged {ann.DEVICES_ALLOCATED}")
            uid = str(pod["metadata"].get("uid") or "")
            reservation = self.cluster.scheduler.ledger.reservation(uid)
            if "webhook" not in name and reservation is not None:
                self.ledger.add("hostile", f"{name}: a forged allocation was booked: {reservation.raw}")
            admission = self.cluster.assignment(name)
            if (
                (pod.get("status") or {}).get("phase") == "Running"
                and admission is not None
                and "webhook" not in name
            ):
                served = [_runtime(c) for c in admission.containers if _runtime(c)[0]]
                if served:
                    self.ledger.add("hostile", f"{name}: served a forged allocation {served}")
        return phases


class Soak:
    """One soak run and its counters."""

    def __init__(
        self, cluster: SimCluster, workload: Workload, checker: Checker, settle_s: float = SETTLE_S
    ) -> None:
        self.cluster = cluster
        self.settle_s = settle_s
        self.workload = workload
        self.checker = checker
        self.churn_rng = random.Random(workload.churn_seed)
        self.live: list[str] = []
        self.counts: Counter[str] = Counter()
        self.reasons: Counter[str] = Counter()

    async def one(self, index: int) -> None:
        """Create one pod, wait until it runs, is rejected or found unschedulable (a fit error); check it."""
        kind, pod = self.workload.pods[index]
        name = pod["metadata"]["name"]
        cluster = self.cluster
        await cluster.create_pod(json.loads(json.dumps(pod)))
        self.counts["pods"] += 1
        self.counts[kind] += 1

        def settled() -> bool:
            stored = cluster.server.get("Pod", "default", name) or {}
            phase = (stored.get("status") or {}).get("phase")
            failures = cluster.scheduling_failures(name)
            return phase in ("Running", "Failed") or any(FIT_ERROR.match(e) for e in failures)

        try:
            await wait_until(settled, self.settle_s, f"pod {name} settled")
        except TimeoutError:
            self.checker.ledger.add(
                "stuck", f"{name} neither ran, failed nor was found unschedulable in {self.settle_s:g}s"
            )
            await self.delete(name)
            return
        status = cluster.pod(name).get("status") or {}
        opted = bool(pod["metadata"]["annotations"].get(ann.NUMA_ALIGNMENT))
        if kind != "foreign" and opted and status.get("phase") in ("Running", "Failed"):
            self.counts["opted_in"] += 1
            refitted = any(c.outcome == "refitted" for c in cluster.refit_calls(name))
            self.counts["opted_in_refitted"] += refitted
        if kind != "foreign" and status.get("reason") == TOPOLOGY_AFFINITY_ERROR:
            self.counts["topology_affinity_errors"] += 1
        if kind == "foreign":
            self.counts["foreign_running" if status.get("phase") == "Running" else "foreign_rejected"] += 1
            if status.get("phase") == "Running":
                self.live.append(name)
            else:
                await self.delete(name)
            return
        if status.get("phase") == "Running":
            self.counts["running"] += 1
            fallback = any(c.outcome != "refitted" for c in cluster.refit_calls(name))
            self.counts["fallbacks"] += fallback
            self.checker.running_pod(name, fallback)
            self.live.append(name)
        elif status.get("phase") == "Failed":
            self.counts["rejected"] += 1
            self.reasons[str(status.get("message") or "")[:160]] += 1
            await self.delete(name)
        else:
            self.counts["unschedulable"] += 1
            await self.delete(name)

    async def delete(self, name: str) -> None:
        await self.cluster.delete_pod(name)
        self.counts["deleted"] += 1

    async def churn(self, cap: int) -> None:
        """Bring the live pods under ``cap`` (complete some first), checking after every delete."""
        while len(self.live) > cap:
            name = self.live.pop(self.churn_rng.randrange(len(self.live)))
            if self.churn_rng.random() < 0.5:
                await self.cluster.complete_pod(name)
                self.counts["completed"] += 1
            await self.delete(name)
            self.checker.capacity(f"after deleting {name}")

    async def strike(self, batch: int) -> None:
        """The hostile tenant's pods of this batch: create (past the webhook or through it), check, delete."""
        pods = self.workload.hostile.get(batch)
        if not pods:
            return
        for pod in pods:
            body = {"apiVersion": "v1", "kind": "Pod", **json.loads(json.dumps(pod))}
            try:
                if pod["metadata"]["labels"].get("hami.io/webhook") == "ignore":
                    await self.cluster.kube.create_pod(body)
                else:
                    await self.cluster.create_pod(body)
            except InvalidInput:
                self.counts["hostile_denied"] += 1
                continue
            self.counts["hostile"] += 1
        await asyncio.sleep(1.0)  # let kubelets and the scheduler see them
        phases = self.checker.hostile(pods)
        for phase, count in phases.items():
            self.counts[f"hostile_{phase.lower()}"] += count
        self.checker.capacity(f"hostile strike {batch}")
        for pod in pods:
            try:
                await self.cluster.delete_pod(pod["metadata"]["name"])
            except Exception:  # refused at admission: never created
                continue


class Tamperer:
    """The tampering tenant (issue 22): rewrites running pods' allocations and a parked pod's.

    Kept apart from :class:`Soak` (its own counters and random stream) so the soak's other
    strikes stay as they are. Every patch is judged by the webhook first (it must be denied),
    then made past it; the scheduler must keep its bookings and report (see the module doc).
    """

    def __init__(self, cluster: SimCluster, checker: Checker, seed: int) -> None:
        self.cluster = cluster
        self.checker = checker
        self.rng = random.Random(seed)
        self.counts: Counter[str] = Counter()
        #: Pods tampered with (each at most once).
        self.done: set[str] = set()

    async def strike(self, batch: int, live: list[str], kinds: dict[str, str]) -> None:
        """Tamper with two running pods (both shapes of attack 1) and one parked pod (attack 2)."""
        running = sorted(n for n in live if kinds.get(n) != "foreign" and n not in self.done)
        victims = self.rng.sample(running, min(2, len(running)))
        for name, shape in zip(victims, ("another-gpu", ":::"), strict=False):
            self.done.add(name)
            await self.running_pod(name, shape)
        await self.parked_pod(f"parked-{batch}")
        self.checker.capacity(f"tamper strike {batch}")

    async def running_pod(self, name: str, shape: str) -> None:
        """Attack 1 on ``name``: its booking stays, the change is reported."""
        cluster, ledger = self.cluster, self.checker.ledger
        ledger.checks += 1
        pod = cluster.pod(name)
        notes = pod["metadata"]["annotations"]
        node, raw, uid = notes[ann.VGPU_NODE], notes[ann.DEVICES_ALLOCATED], pod["metadata"]["uid"]
        before = cluster.reservation(name)
        used = {d.uuid for entry in ann.decode_pod_devices(raw) for d in entry}
        other = next((g for g in cluster.gpu_numa(node) if g not in used), None)
        forged = f"{other},NVIDIA,1,0:;" if shape == "another-gpu" and other else ":::"
        if not await self.denied(pod, {ann.DEVICES_ALLOCATED: forged}):
            ledger.add("tamper-admitted", f"{name}: the webhook let {TENANT} rewrite its allocation")
        self.checker.tampered[uid] = (node, raw)
        await cluster.kube.patch_pod_metadata("default", name, annotations={ann.DEVICES_ALLOCATED: forged})
        self.counts["patches"] += 1
        try:
            await wait_until(
                lambda: bool(cluster.events(name, reason=R.EVENT_ALLOCATION_IGNORED)),
                TAMPER_REPORT_S,
                f"{name}'s tampered allocation reported",
            )
            self.counts["reported"] += 1
        except TimeoutError:
            ledger.add("tamper-unreported", f"{name}: {forged} not reported")
        after = cluster.reservation(name)
        if before is None or after is None or (after.node, after.raw) != (before.node, before.raw):
            ledger.add(
                "tamper-rebooked", f"{name}: booking {before and before.raw} became {after and after.raw}"
            )

    async def parked_pod(self, name: str) -> None:
        """Attack 2: a parked pod given a node and ``:::`` books nothing."""
        cluster, ledger = self.cluster, self.checker.ledger
        ledger.checks += 1
        body = {
            "metadata": {
                "name": name,
                "namespace": "default",
                "annotations": {ann.USE_GPU_UUID: "GPU-parked"},
            },
            "spec": {
                "containers": [
                    {"name": "main", "image": "evil", "resources": {"limits": {NAMES.resource_count_name: 1}}}
                ]
            },
        }
        pod = await cluster.create_pod(body)
        node = sorted(cluster.nodes)[self.rng.randrange(len(cluster.nodes))]
        forged = {ann.VGPU_NODE: node, ann.DEVICES_ALLOCATED: ":::"}
        if not await self.denied(pod, forged):
            ledger.add("tamper-admitted", f"{name}: the webhook let {TENANT} give a parked pod an allocation")
        booked = cluster.booked_usage().get(node)
        await cluster.kube.patch_pod_metadata("default", name, annotations=forged)
        self.counts["patches"] += 1
        self.counts["parked"] += 1
        await asyncio.sleep(0.5)  # let the scheduler see it
        if cluster.reservation(name) is not None or cluster.booked_usage().get(node) != booked:
            ledger.add("parked-booked", f"{name}: an unreadable allocation booked {node}'s GPUs")
        await cluster.delete_pod(name)

    async def denied(self, pod: JSON, notes: dict[str, str]) -> bool:
        """Whether the scheduler's webhook denies the tenant this annotation change."""
        new = json.loads(json.dumps(pod))
        new["metadata"].setdefault("annotations", {}).update(notes)
        response = await self.cluster.review_update(pod, new, TENANT)
        denied = not response.get("allowed")
        self.counts["webhook_denied"] += denied
        return denied


class LeaderPause:
    """``--leader-pause``: a second scheduler replica (a real ``hamid scheduler`` process) with its
    own kube-scheduler, the leader paused past its Lease mid-run.

    The cluster's scheduler hands its Lease over (a restart: it releases it) to the process, which
    leads for a while; the process is then stopped (SIGSTOP, a VM freeze) for the Lease duration
    plus :data:`PAUSE_PAST_LEASE_S`, the cluster's scheduler takes over, and the process is woken
    with its kube-scheduler's requests queued: its fence must refuse them. It stays up, a
    follower, until the end; the invariants are checked as in every run.
    """

    LEASE = (15.0, 10.0, 0.5)  # the cluster scheduler's: its defaults with the sim's retry period

    def __init__(self, cluster: SimCluster) -> None:
        s = cluster.scheduler_options().settings
        args = (
            f"--scheduler-name={s.scheduler_name}",
            f"--node-scheduler-policy={s.node_policy}",
            f"--gpu-scheduler-policy={s.gpu_policy}",
            f"--bind-wait={s.bind_wait_s:g}s",
        )
        self.cluster = cluster
        # the cluster scheduler's key ring: each replica verifies the other's signed allocations
        self._keys_dir = Path(tempfile.mkdtemp(prefix="hamid-soak-keys-"))
        key_file = write_key_file(cluster.allocation_keys, self._keys_dir / "keys")
        self.replica = SchedulerProcess(
            "soak-b", cluster.server.url, self.LEASE, args, lease_name=SIM_LEASE_NAME, key_file=key_file
        )
        self.figures: dict[str, Any] = {}
        self._driver_task: asyncio.Task[None] | None = None
        self._kube: Any = None
        self._session = aiohttp.ClientSession()

    async def hand_over(self) -> None:
        """Start the process and its kube-scheduler; the cluster's scheduler hands it the Lease.

        Between batches: the cluster's scheduler restarts, and the checks read its state.
        """
        loop = asyncio.get_running_loop()
        await self.replica.start()
        await replica_wait(lambda: self.replica.synced(self._session), 60, "second replica synced")
        self._kube = await connect(api_server=self.cluster.server.url)
        driver = KubeSchedulerDriver(
            self._kube,
            scheduler_name=self.cluster.options.scheduler_name,
            extender_url=self.replica.url("extender", ""),
            initial_backoff=0.2,
            max_backoff=1.0,
        )
        self._driver_task = asyncio.create_task(driver.run(), name="kube-scheduler-b")
        started = loop.time()
        await self.cluster.hand_over_scheduler(lambda: self.replica.ready(self._session))
        self.figures["handover_s"] = round(loop.time() - started, 2)

    async def pause(self) -> None:
        """While pods flow: the process decides a while, is paused past its Lease, and woken."""
        await asyncio.sleep(5.0)
        paused = self.LEASE[0] + PAUSE_PAST_LEASE_S
        self.replica.signal(signal.SIGSTOP)
        try:
            takeover = await replica_wait(self.cluster_leads, paused + 30, "the cluster scheduler leads")
            await asyncio.sleep(max(0.0, paused - takeover))
        finally:
            self.replica.signal(signal.SIGCONT)
        self.figures.update(paused_s=round(max(paused, takeover), 2), takeover_s=round(takeover, 2))

        async def stepped_down() -> bool:
            return not await self.replica.ready(self._session)

        await replica_wait(stepped_down, 30, "the woken replica steps down")

    async def cluster_leads(self) -> bool:
        """Whether the cluster's own scheduler decides now."""
        try:
            return not self.cluster.scheduler.not_ready_reason()
        except RuntimeError:  # between the hand-over's stop and start
            return False

    async def close(self) -> None:
        """Stop the second kube-scheduler and the process (SIGTERM, then kill if it lingers)."""
        if self._driver_task is not None:
            self._driver_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._driver_task
        if self._kube is not None:
            await self._kube.close()
        await self._session.close()
        with contextlib.suppress(ProcessLookupError, RuntimeError):
            self.replica.signal(signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                await self.replica.wait_exit(10)
        await self.replica.close()
        shutil.rmtree(self._keys_dir, ignore_errors=True)


#: How far past its Lease the soak's leader pause lasts (seconds).
PAUSE_PAST_LEASE_S = 2.0


def node_specs(
    nodes: int, hetero: int, machine: str = SOAK_MACHINE, kubelet_config: KubeletConfig | None = None
) -> tuple[NodeSpec, ...]:
    """``nodes`` nodes of ``machine``, the last ``hetero`` of them with mixed GPU models (48/96 GB)."""
    hetero = max(0, min(hetero, nodes))
    return tuple(
        NodeSpec(
            f"node-{i}",
            machine_file=data_file(HETERO_MACHINE if i > nodes - hetero else machine),
            kubelet_config=kubelet_config,
        )
        for i in range(1, nodes + 1)
    )


def memory_bound(workload: Workload, gib_per_cpu: int) -> None:
    """Every pod asks ``gib_per_cpu`` GiB of memory per CPU (limits = requests: still Guaranteed)."""
    for _kind, pod in workload.pods:
        for container in pod["spec"]["containers"]:
            limits = container["resources"]["limits"]
            limits["memory"] = f"{int(limits['cpu']) * gib_per_cpu}Gi"


def _reason_kind(message: str) -> str:
    """A short class of a NumaRefitFailed message (pinned, heterogeneous, no fit, other)."""
    for marker, kind in (
        ("use-gpuuuid", "pinned"),
        ("heterogeneous", "heterogeneous"),
        ("no allowed device fits", "no-fit"),
    ):
        if marker in message:
            return kind
    return "other"


def workload_of(
    specs: tuple[NodeSpec, ...], hetero_nodes: list[str], seed: int, pods: int, concurrency: int
) -> Workload:
    """The run's workload from the nodes' machine files (the GPUs the simulated plugins will register)."""
    gpus = {s.name: [(g.uuid, g.memory_mib) for g in load_machine_file(s.machine_file).gpus] for s in specs}
    pin_uuids = sorted(u for n, gs in gpus.items() if n not in hetero_nodes for u, _ in gs)
    return draw_workload(seed, pods, concurrency, pin_uuids, hetero_nodes, gpus)


def _refit_figures(
    cluster: SimCluster, ledger: Ledger, kinds: dict[str, str], prediction: bool
) -> dict[str, Any]:
    """Mismatches, refits, refusals (by kind), strict failures; needed refits that never came fail.

    Without prediction, a run whose plain pods (neither pinned nor heterogeneous: refittable) had
    mismatches and got no refit at all fails; with prediction mismatches are rare by design (its
    target is a refit rate under 1 %), so a handful of refused ones is no sign of a broken refit.
    """
    calls = cluster.refit_calls()
    refits = sum(1 for c in calls if c.outcome == "refitted")
    plain = [c for c in calls if kinds.get(c.pod.split("/")[-1]) == "plain"]
    if plain and not refits and not prediction:
        ledger.add("no-refit", f"{len(plain)} NUMA mismatches of plain pods and not one refit")
    reasons = Counter[str]()
    for e in cluster.server.list("Event", "default"):
        if e.get("reason") == R.EVENT_NUMA_REFIT_FAILED:
            reasons[_reason_kind(str(e.get("message") or ""))] += int(e.get("count") or 1)
    return {
        "mismatches": len(calls),
        "refits": refits,
        "refusals": sum(reasons.values()),
        "strict_failures": sum(1 for c in calls if c.outcome == "failed"),
        "refusal_reasons": dict(reasons.most_common()),
    }


def _prediction_counts(registries: list[Any]) -> dict[str, Any]:
    """hit / miss / unknown and misses by cause, summed over ``registries``."""

    def value(name: str, labels: dict[str, str]) -> int:
        return sum(int(r.get_sample_value(name, labels) or 0) for r in registries)

    causes = {c: value("hamid_numa_prediction_misses_total", {"cause": c}) for c in MISS_CAUSES}
    return {
        "hits": value("hamid_numa_prediction_total", {"result": "hit"}),
        "misses": value("hamid_numa_prediction_total", {"result": "miss"}),
        "unknown": value("hamid_numa_prediction_total", {"result": "unknown"}),
        "miss_causes": {c: n for c, n in causes.items() if n},
    }


def _prediction_figures(cluster: SimCluster) -> dict[str, Any]:
    """The scheduler's prediction counters (hit, miss, unknown; misses by cause), and the node
    agents' own judgement of the same predictions (``plugin_prediction``, summed over the nodes)."""
    counts = _prediction_counts([cluster.scheduler.metrics.registry])
    plugins = [n.plugin.metrics.registry for n in cluster.nodes.values() if n.plugin is not None]
    return {
        "prediction_hits": counts["hits"],
        "prediction_misses": counts["misses"],
        "prediction_unknown": counts["unknown"],
        "miss_causes": counts["miss_causes"],
        "plugin_prediction": _prediction_counts(plugins),
    }


async def _checked(checker: Checker, soak: Soak, batch: int, pause: LeaderPause | None) -> None:
    """The checks after a batch (with a leader pause: on the cluster scheduler's accounting only
    while it leads; the other replica's view is not the cluster's), then the hostile tenant."""
    checker.capacity(f"after batch {batch}")
    if pause is None or await pause.cluster_leads():
        await checker.accounting(f"after batch {batch}")
    await soak.strike(batch)


async def run(
    pods: int,
    nodes: int,
    seed: int,
    concurrency: int,
    live_cap: int,
    *,
    node_policy: str = "binpack",
    hetero: int = 1,
    prediction: bool = True,
    settle_s: float = SETTLE_S,
    leader_pause: bool = False,
    memory_manager: str = "none",
) -> dict[str, Any]:
    """Run the soak and return its result object."""
    static = memory_manager == "static"
    specs = node_specs(nodes, hetero, kubelet_config=STATIC_MEMORY_CONFIG if static else None)
    hetero_nodes = [spec.name for spec in specs if spec.machine_file == data_file(HETERO_MACHINE)]
    workload = workload_of(specs, hetero_nodes, seed, pods, concurrency)
    if static:
        memory_bound(workload, STATIC_GIB_PER_CPU)
    options = ClusterOptions(nodes=specs, node_policy=node_policy, numa_publish=prediction)
    ledger = Ledger()
    started = time.monotonic()
    async with SimCluster(options) as cluster:
        checker = Checker(cluster, ledger)
        soak = Soak(cluster, workload, checker, settle_s)
        tamperer = Tamperer(cluster, checker, workload.churn_seed + 1)
        kinds = {pod["metadata"]["name"]: kind for kind, pod in workload.pods}
        pause = LeaderPause(cluster) if leader_pause else None
        pausing: asyncio.Task[None] | None = None
        try:
            for batch, index in enumerate(range(0, pods, concurrency)):
                await soak.churn(live_cap)
                if pause is not None and pausing is None and batch >= 1:
                    await pause.hand_over()
                    pausing = asyncio.create_task(pause.pause(), name="leader-pause")
                await asyncio.gather(*(soak.one(i) for i in range(index, min(pods, index + concurrency))))
                await _checked(checker, soak, batch, pause)
                if batch % HOSTILE_EVERY == 0:
                    await tamperer.strike(batch, soak.live, kinds)
                    if pause is None or await pause.cluster_leads():
                        await checker.accounting(f"after tamper strike {batch}")
            if pausing is not None:
                await pausing
        finally:
            if pausing is not None and not pausing.done():
                pausing.cancel()
            if pause is not None:
                await pause.close()
        elapsed = time.monotonic() - started
        refit_figures = _refit_figures(cluster, ledger, kinds, prediction)
        prediction_figures = _prediction_figures(cluster)
    if prediction_figures["prediction_misses"] != sum(prediction_figures["miss_causes"].values()):
        ledger.add("unclassified-miss", f"misses by cause {prediction_figures['miss_causes']} do not add up")
    for line in ledger.texts[:20]:
        print("violation:", line, file=sys.stderr)
    return {
        "pods": soak.counts["pods"],
        "nodes": nodes,
        "seed": seed,
        "settle_s": settle_s,
        "workload_sha256": workload.digest(),
        "running": soak.counts["running"],
        "aligned_checked": checker.aligned,
        "fallbacks": soak.counts["fallbacks"],
        "node_policy": node_policy,
        "hetero_nodes": len(hetero_nodes),
        "pinned_pods": soak.counts["pinned"],
        "hetero_pods": soak.counts["hetero"],
        **refit_figures,
        "prediction": "on" if prediction else "off",
        "memory_manager": memory_manager,
        "opted_in": soak.counts["opted_in"],
        "opted_in_refitted": soak.counts["opted_in_refitted"],
        "refit_rate": round(soak.counts["opted_in_refitted"] / soak.counts["opted_in"], 4)
        if soak.counts["opted_in"]
        else 0.0,
        "topology_affinity_errors": soak.counts["topology_affinity_errors"],
        **prediction_figures,
        "foreign_pods": soak.counts["foreign"],
        "foreign_rejected": soak.counts["foreign_rejected"],
        "rejected": soak.counts["rejected"],
        "unschedulable": soak.counts["unschedulable"],
        "rejection_reasons": dict(soak.reasons.most_common(5)),
        "completed": soak.counts["completed"],
        "deleted": soak.counts["deleted"],
        "hostile_pods": soak.counts["hostile"],
        "hostile_denied": soak.counts["hostile_denied"],
        "tamper": dict(sorted(tamperer.counts.items())),
        "hostile_phases": {
            k[8:]: v
            for k, v in sorted(soak.counts.items())
            if k.startswith("hostile_") and k != "hostile_denied"
        },
        "checks": ledger.checks,
        "violations": sum(ledger.kinds.values()),
        "violation_kinds": dict(ledger.kinds.most_common()),
        "seconds": round(elapsed, 2),
        "pods_per_s": round(soak.counts["pods"] / elapsed, 1) if elapsed else 0.0,
        "peak_rss_mib": round(peak_rss_mib(), 1),
        **({"leader_pause": pause.figures} if pause is not None else {}),
    }


def main() -> None:
    """Parse the (optional) arguments, run, print the result object last."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=1000, help="pods to create (default 1000)")
    parser.add_argument(
        "--nodes", type=int, default=11, help="simulated nodes, the last --hetero-nodes mixed (default 11)"
    )
    parser.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    parser.add_argument("--concurrency", type=int, default=40, help="pods created at once (default 40)")
    parser.add_argument("--live", type=int, default=160, help="running pods kept before churn (default 160)")
    parser.add_argument(
        "--prediction",
        choices=("on", "off"),
        default="on",
        help="nodes publish NUMA profiles and the scheduler predicts kubelet (default on)",
    )
    parser.add_argument(
        "--node-policy",
        choices=("binpack", "spread"),
        default="binpack",
        help="the scheduler's node policy (default binpack, as hamid scheduler)",
    )
    parser.add_argument(
        "--hetero-nodes", type=int, default=1, help="nodes with mixed GPU models, taken last (default 1)"
    )
    parser.add_argument(
        "--settle-s",
        type=float,
        default=SETTLE_S,
        help=f"seconds a pod may take to run or fail before it counts as stuck (default {SETTLE_S:g})",
    )
    parser.add_argument(
        "--leader-pause",
        action="store_true",
        help="run a second scheduler replica and pause the leader past its Lease mid-run",
    )
    parser.add_argument(
        "--memory-manager",
        choices=("none", "static"),
        default="none",
        help=f"kubelet's Memory Manager policy; static: {STATIC_GIB_PER_CPU} GiB per CPU (default none)",
    )
    parser.add_argument(
        "--draw-only", action="store_true", help="print the seed's workload digest and exit (nothing runs)"
    )
    args = parser.parse_args()
    if args.draw_only:
        specs = node_specs(args.nodes, args.hetero_nodes)
        hetero = [s.name for s in specs if s.machine_file == data_file(HETERO_MACHINE)]
        workload = workload_of(specs, hetero, args.seed, args.pods, args.concurrency)
        if args.memory_manager == "static":
            memory_bound(workload, STATIC_GIB_PER_CPU)
        print_figures({"pods": args.pods, "seed": args.seed, "workload_sha256": workload.digest()})
        return
    result = asyncio.run(
        run(
            args.pods,
            args.nodes,
            args.seed,
            args.concurrency,
            args.live,
            node_policy=args.node_policy,
            hetero=args.hetero_nodes,
            prediction=args.prediction == "on",
            settle_s=args.settle_s,
            leader_pause=args.leader_pause,
            memory_manager=args.memory_manager,
        )
    )
    print_figures(result)
    sys.exit(1 if result["violations"] else 0)


if __name__ == "__main__":
    main()
