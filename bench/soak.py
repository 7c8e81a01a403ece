"""Randomised soak of the whole stack: N pods with random requests, alignment modes and churn.

Runs a :class:`~hamid.sim.cluster.SimCluster` of several demo nodes (2 NUMA nodes x 16 CPUs,
8 GPUs each; refit enabled over mTLS) and pushes pods through webhook → kube-scheduler driver →
``/filter`` ``/bind`` → simulated kubelet (single-numa-node, static CPUs) → plugin (with refit),
deleting and completing pods along the way. Afterwards it checks, with the survivors still running:

* I1 no over-commit: per GPU, the scheduler's slots/MiB/cores ≤ capacity, and the memory limits
  the plugin handed to all running containers ≤ the GPU's memory;
* the scheduler's accounting equals the usage recomputed from the pods' allocation annotations;
* I2 for every running container, fallbacks included (the plugin serves the allocation annotation,
  never kubelet's own pick): runtime GPUs and memory limits == ``hami.io/vgpu-devices-allocated``
  == the scheduler's entry;
* every running pod with ``hami.io/numa-alignment`` set and no fallback (no refit applied) has its
  GPUs on its CPUs' NUMA node; a ``strict`` pod never runs after a fallback.

Usage: ``python bench/soak.py`` (no arguments needed; ``--pods``, ``--nodes``, ``--seed`` exist).
Last output line: one JSON object with ``pods``, ``refits``, ``refusals``, ``violations`` (must be 0),
``fallbacks`` (running pods whose GPUs stayed where the scheduler put them, unaligned),
``pods_per_s`` and ``peak_rss_mib``. Exit status 1 when there is any violation.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from collections import Counter, defaultdict
from typing import Any

from benchstats import peak_rss_mib, print_figures

from hamid.log import configure

configure("json", "error")  # before the modules below bind their loggers

from hamid.model import annotations as ann  # noqa: E402
from hamid.model import reasons as R  # noqa: E402
from hamid.model.alignment import AlignmentMode, parse_alignment  # noqa: E402
from hamid.model.resources import ResourceConfig  # noqa: E402
from hamid.sim.cluster import ClusterOptions, NodeSpec, SimCluster, data_file, wait_until  # noqa: E402
from hamid.sim.demo import HETERO_MACHINE  # noqa: E402

MODES = ("", "best-effort", "best-effort", "strict")
CPUS = (1, 2, 2, 4)
MEMORY = (4000, 8000, 16000, 20000)
NAMES = ResourceConfig()
#: The soak's share of pods pinned with ``nvidia.com/use-gpuuuid`` and of heterogeneous pods.
PINNED_SHARE = 0.1
HETERO_SHARE = 0.1
HOSTNAME_LABEL = "kubernetes.io/hostname"


def random_pod(
    rng: random.Random, name: str, pin_uuids: list[str], hetero_nodes: list[str]
) -> tuple[str, dict[str, Any]]:
    """A Guaranteed GPU pod and its kind: ``plain`` (1-2 GPUs, random memory and alignment, sometimes
    numa-bind), ``pinned`` (``use-gpuuuid`` on one GPU: a refit may only be refused) or ``hetero``
    (2 GPUs with numa-bind and a memory percentage on a mixed-GPU node: differing MiB per GPU, which
    the refit refuses)."""
    draw = rng.random()
    kind = "plain"
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
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "image": "soak", "resources": {"limits": limits}}]
    }
    if kind == "hetero":
        spec["nodeSelector"] = {HOSTNAME_LABEL: rng.choice(hetero_nodes)}
    return kind, {"metadata": {"name": name, "namespace": "default", "annotations": notes}, "spec": spec}


class Soak:
    """One soak run and its counters."""

    def __init__(self, cluster: SimCluster, rng: random.Random, hetero_nodes: list[str]) -> None:
        self.cluster = cluster
        self.rng = rng
        self.hetero_nodes = hetero_nodes
        self.pin_uuids = sorted(
            {g.uuid for node in cluster.nodes if node not in hetero_nodes for g in cluster.machine(node).gpus}
        )
        self.live: list[str] = []
        self.counts: Counter[str] = Counter()
        self.reasons: Counter[str] = Counter()

    async def one(self, index: int) -> None:
        """Create one pod and wait until it runs, is rejected or is found unschedulable."""
        name = f"soak-{index}"
        cluster = self.cluster
        kind, pod = random_pod(self.rng, name, self.pin_uuids, self.hetero_nodes)
        await cluster.create_pod(pod)
        self.counts["pods"] += 1
        self.counts[kind] += 1

        def settled() -> bool:
            pod = cluster.server.get("Pod", "default", name) or {}
            phase = (pod.get("status") or {}).get("phase")
            return phase in ("Running", "Failed") or bool(cluster.scheduling_failures(name))

        try:
            await wait_until(settled, 20.0, f"pod {name} settled")
        except TimeoutError:
            self.counts["stuck"] += 1
            await cluster.delete_pod(name)
            return
        phase = (cluster.pod(name).get("status") or {}).get("phase")
        if phase == "Running":
            self.counts["running"] += 1
            self.live.append(name)
        elif phase == "Failed":
            self.counts["rejected"] += 1
            message = str((cluster.pod(name).get("status") or {}).get("message") or "")
            self.reasons[message[:160]] += 1
            await cluster.delete_pod(name)
        else:
            self.counts["unschedulable"] += 1
            await cluster.delete_pod(name)

    async def churn(self, cap: int) -> None:
        """Bring the live pods under ``cap``: complete some (then delete them), delete others."""
        while len(self.live) > cap:
            name = self.live.pop(self.rng.randrange(len(self.live)))
            if self.rng.random() < 0.5:
                await self.cluster.complete_pod(name)
                self.counts["completed"] += 1
            await self.cluster.delete_pod(name)
            self.counts["deleted"] += 1


def check(cluster: SimCluster) -> tuple[list[str], dict[str, int]]:
    """Every invariant violation (as text) and a few counters over the running pods."""
    violations: list[str] = []
    stats: Counter[str] = Counter()
    state = cluster.scheduler.state
    for node, entry in state.nodes.items():
        for d in entry.usage.devices:
            if d.used > d.count or d.usedmem > d.totalmem or d.usedcores > d.totalcore:
                violations.append(
                    f"I1 scheduler over-commit on {node}/{d.id}: {d.used}/{d.usedmem}/{d.usedcores}"
                )
    runtime_mem: dict[str, int] = defaultdict(int)
    fallback_pods = {c.pod for c in cluster.refit_calls() if c.outcome != "refitted"}
    for pod in cluster.server.list("Pod", "default"):
        meta = pod["metadata"]
        name = meta["name"]
        if (pod.get("status") or {}).get("phase") != "Running" or name.startswith("cpu-batch"):
            continue
        stats["running"] += 1
        node = pod["spec"]["nodeName"]
        admission = cluster.assignment(name)
        allocated = cluster.allocated(name)
        reservation = cluster.reservation(name)
        if admission is None or allocated is None or reservation is None:
            violations.append(f"{name}: running without assignment/annotation/reservation")
            continue
        table = cluster.gpu_numa(node)
        fallback = f"default/{name}" in fallback_pods
        stats["fallbacks"] += fallback
        mode = parse_alignment(meta.get("annotations") or {})
        for container, devices in zip(admission.containers, allocated, strict=False):
            env = container.env
            runtime = [u for u in env.get("NVIDIA_VISIBLE_DEVICES", "").split(",") if u]
            limits = [
                int(env.get(f"CUDA_DEVICE_MEMORY_LIMIT_{i}", "0m").rstrip("m")) for i in range(len(runtime))
            ]
            for uuid, mem in zip(runtime, limits, strict=True):
                runtime_mem[f"{node}/{uuid}"] += mem
            annotated = [d.uuid for d in devices]
            booked = [d.uuid for d in reservation.layout[container.index]]
            if not (runtime == annotated == booked) or limits != [d.usedmem for d in devices]:
                violations.append(
                    f"I2 {name}: runtime {runtime} {limits} annotation {annotated} accounting {booked}"
                )
            if fallback:
                if mode is AlignmentMode.STRICT:
                    violations.append(f"{name}: strict pod running after a fallback")
                continue
            if mode is not AlignmentMode.NONE and container.numa_node is not None:
                stats["aligned"] += 1
                if {table.get(u) for u in runtime} != {container.numa_node}:
                    violations.append(f"NUMA {name}: GPUs {runtime} not on CPU NUMA {container.numa_node}")
    capacity = {
        f"{node}/{g.uuid}": g.memory_mib for node in cluster.nodes for g in cluster.machine(node).gpus
    }
    for key, mem in runtime_mem.items():
        if mem > capacity[key]:
            violations.append(f"I1 runtime over-commit on {key}: {mem} MiB > {capacity[key]} MiB")
    return violations, dict(stats)


def accounting_matches(cluster: SimCluster) -> bool:
    """The scheduler's usage equals the usage recomputed from live pods' allocation annotations."""
    return cluster.booked_usage() == cluster.annotated_usage()


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


def node_specs(nodes: int, hetero: int) -> tuple[NodeSpec, ...]:
    """``nodes`` demo nodes, the last ``hetero`` of them with mixed GPU models (48 GB and 96 GB)."""
    hetero = max(0, min(hetero, nodes))
    return tuple(
        NodeSpec(f"node-{i}", machine_file=data_file(HETERO_MACHINE))
        if i > nodes - hetero
        else NodeSpec(f"node-{i}")
        for i in range(1, nodes + 1)
    )


async def run(
    pods: int,
    nodes: int,
    seed: int,
    concurrency: int,
    live_cap: int,
    *,
    node_policy: str = "binpack",
    hetero: int = 1,
) -> dict[str, Any]:
    """Run the soak and return its result object."""
    rng = random.Random(seed)
    specs = node_specs(nodes, hetero)
    hetero_nodes = [spec.name for spec in specs if spec.machine_file == data_file(HETERO_MACHINE)]
    options = ClusterOptions(nodes=specs, node_policy=node_policy)
    started = time.monotonic()
    async with SimCluster(options) as cluster:
        soak = Soak(cluster, rng, hetero_nodes)
        index = 0
        while index < pods:
            await soak.churn(live_cap)
            batch = range(index, min(pods, index + concurrency))
            await asyncio.gather(*(soak.one(i) for i in batch))
            index += len(batch)
        elapsed = time.monotonic() - started
        violations: list[str] = []
        try:
            await wait_until(lambda: accounting_matches(cluster), 10.0, "accounting settles")
        except TimeoutError:
            violations.append("scheduler accounting != usage recomputed from the allocation annotations")
        found, stats = check(cluster)
        violations += found
        refits = sum(1 for c in cluster.refit_calls() if c.outcome == "refitted")
        # one NumaRefitFailed event per refused refit, also for pods deleted since
        refusals = sum(
            int(e.get("count") or 1)
            for e in cluster.server.list("Event", "default")
            if e.get("reason") == R.EVENT_NUMA_REFIT_FAILED
        )
        strict_failures = sum(1 for c in cluster.refit_calls() if c.outcome == "failed")
        refusal_reasons: Counter[str] = Counter()
        for e in cluster.server.list("Event", "default"):
            if e.get("reason") == R.EVENT_NUMA_REFIT_FAILED:
                refusal_reasons[_reason_kind(str(e.get("message") or ""))] += int(e.get("count") or 1)
    for line in violations[:20]:
        print("violation:", line, file=sys.stderr)
    return {
        "pods": soak.counts["pods"],
        "nodes": nodes,
        "seed": seed,
        "running_at_end": stats.get("running", 0),
        "aligned_checked": stats.get("aligned", 0),
        "fallbacks": stats.get("fallbacks", 0),
        "node_policy": node_policy,
        "hetero_nodes": len(hetero_nodes),
        "pinned_pods": soak.counts["pinned"],
        "hetero_pods": soak.counts["hetero"],
        "refits": refits,
        "refusals": refusals,
        "strict_failures": strict_failures,
        "refusal_reasons": dict(refusal_reasons.most_common()),
        "rejected": soak.counts["rejected"],
        "unschedulable": soak.counts["unschedulable"],
        "stuck": soak.counts["stuck"],
        "rejection_reasons": dict(soak.reasons.most_common(5)),
        "completed": soak.counts["completed"],
        "deleted": soak.counts["deleted"],
        "violations": len(violations),
        "seconds": round(elapsed, 2),
        "pods_per_s": round(soak.counts["pods"] / elapsed, 1) if elapsed else 0.0,
        "peak_rss_mib": round(peak_rss_mib(), 1),
    }


def main() -> None:
    """Parse the (optional) arguments, run, print the result object last."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=200, help="pods to create (default 200)")
    parser.add_argument("--nodes", type=int, default=4, help="simulated nodes (default 4)")
    parser.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    parser.add_argument("--concurrency", type=int, default=8, help="pods created at once (default 8)")
    parser.add_argument("--live", type=int, default=32, help="running pods kept before churn (default 32)")
    parser.add_argument(
        "--node-policy",
        choices=("binpack", "spread"),
        default="binpack",
        help="the scheduler's node policy (default binpack, as hamid scheduler)",
    )
    parser.add_argument(
        "--hetero-nodes", type=int, default=1, help="nodes with mixed GPU models, taken last (default 1)"
    )
    args = parser.parse_args()
    result = asyncio.run(
        run(
            args.pods,
            args.nodes,
            args.seed,
            args.concurrency,
            args.live,
            node_policy=args.node_policy,
            hetero=args.hetero_nodes,
        )
    )
    print_figures(result)
    sys.exit(1 if result["violations"] else 0)


if __name__ == "__main__":
    main()
