"""`hamid demo`: the NUMA-alignment flow end to end in one process, on the embedded defaults.

Each scenario starts a :class:`~hamidsim.cluster.SimCluster` (embedded API server, scheduler with
TLS and ``/refit``, plugin, simulated kubelet with ``single-numa-node`` and the static CPU manager,
kube-scheduler driver), prepares the node so that kubelet *must* place the pod's CPUs on the NUMA
node the scheduler did not pick, creates the seed's pod and checks the expected outcome.

The stage is the same in every scenario: the demo node (an SMT machine, 2 x 8 cores x 2 threads)
reserves one whole core of NUMA 0 (CPUs 0 and 16) and one thread of NUMA 1 (CPU 8), so NUMA 0 has
14 free CPUs and NUMA 1 has 15; a Guaranteed ``cpu-batch`` pod asking for 15 CPUs can
only go to NUMA 1, which leaves the seed pod's 8 CPUs no choice but NUMA 0, while the scheduler's
GPU policy (spread, NUMA-blind) picks a GPU on NUMA 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import click

from hamid import log as hamid_log
from hamid.model import annotations as ann
from hamid.model import objects
from hamid.model import reasons as R
from hamid.model.devices import PodDevices
from hamid.model.errors import InvalidInput
from hamid.model.mig import decode_mig_allocations
from hamid.model.numa import NUMA_PREDICTED, SINGLE_NUMA_NODE, decode_prediction
from hamid.options import option
from hamid.plugin.discovery import PhysicalGpu
from hamidsim.cluster import (
    DEMO_MACHINE,
    DEMO_MIG_MACHINE,
    RESOURCE_NAME,
    ClusterOptions,
    NodeSpec,
    RefitCall,
    SimCluster,
    data_file,
    wait_until,
)
from hamidsim.keep import DEFAULT_KUBECONFIG, keep_serving
from hamidsim.kubelet import PodAdmission
from hamidsim.kubelet.config import SIM_DEFAULTS, KubeletConfig
from hamidsim.kubelet.memorymanager import MemoryReservation
from hamidsim.kubelet.node import build_managers
from hamidsim.machine import Machine, load_machine_file

NODE = "node-1"
SEED_NAME = "numa-aligned"
FILLER_NAME = "cpu-batch"
HETERO_MACHINE = "demo-hetero-node.yaml"
MANY_NUMA_MACHINE = "demo-16numa-8gpu.yaml"
#: The seed's prerequisites for servers with more than 8 NUMA nodes.
MANY_NUMA_CONFIG = KubeletConfig(
    cpu_manager_policy="static",
    topology_manager_policy=SINGLE_NUMA_NODE,
    topology_manager_policy_options={"max-allowable-numa-nodes": "16"},
)
SCENARIOS = (
    "refit",
    "strict-failure",
    "refit-disabled",
    "pinned-uuid",
    "heterogeneous",
    "heterogeneous-strict",
    "mig-node",
    "numa-bind",
    "many-numa",
    "exact-fit",
    "prediction",
    "prediction-miss",
    "memory-prediction",
)
#: The seed's pod with the node agent publishing its NUMA profile: the scheduler predicts kubelet.
DEFAULT_SCENARIO = "prediction"
_SETTLE_S = 15.0


@dataclass
class Check:
    """One verified expectation."""

    name: str
    ok: bool
    detail: str = ""


@dataclass
class ScenarioResult:
    """What one scenario did and whether the expected outcome happened."""

    scenario: str
    expected: str
    timeline: list[tuple[str, str]] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when every check held (and there was at least one)."""
        return bool(self.checks) and all(c.ok for c in self.checks)

    def step(self, title: str, text: str) -> None:
        """Add a timeline entry."""
        self.timeline.append((title, text))

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        """Record an expectation; returns ``ok``."""
        self.checks.append(Check(name, bool(ok), detail))
        return bool(ok)

    def to_json(self) -> dict[str, Any]:
        """The machine-readable result."""
        return {
            "scenario": self.scenario,
            "ok": self.ok,
            "expected": self.expected,
            "timeline": [{"step": t, "text": x} for t, x in self.timeline],
            "checks": [{"name": c.name, "ok": c.ok, "detail": c.detail} for c in self.checks],
            **self.facts,
        }


# -- pods ----------------------------------------------------------------------------------------


def seed_pod(
    name: str = SEED_NAME,
    alignment: str = "best-effort",
    *,
    gpus: int = 1,
    gpumem: int | None = 20000,
    gpumem_percentage: int | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The seed document's pod (cpu 8, memory 8Gi, one GPU with 20000 MiB) with variations."""
    limits: dict[str, Any] = {"cpu": "8", "memory": "8Gi", "nvidia.com/gpu": gpus}
    if gpumem is not None:
        limits["nvidia.com/gpumem"] = gpumem
    if gpumem_percentage is not None:
        limits["nvidia.com/gpumem-percentage"] = gpumem_percentage
    notes = {ann.NUMA_ALIGNMENT: alignment} if alignment else {}
    notes.update(annotations or {})
    return {
        "metadata": {"name": name, "namespace": "default", "annotations": notes},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "ubuntu:22.04",
                    "command": ["sleep", "infinity"],
                    "resources": {"limits": limits},
                }
            ]
        },
    }


def filler_pod(node: str = NODE, cpus: int = 15, name: str = FILLER_NAME) -> dict[str, Any]:
    """A Guaranteed CPU-only pod bound to ``node`` (its exclusive CPUs fill one NUMA node)."""
    return {
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "name": "batch",
                    "image": "busybox",
                    "resources": {"limits": {"cpu": str(cpus), "memory": "16Gi"}},
                }
            ],
        },
    }


# -- helpers -------------------------------------------------------------------------------------


def _uuids(devices: PodDevices | None, container: int = 0) -> list[str]:
    if not devices or container >= len(devices):
        return []
    return [d.uuid for d in devices[container]]


def _fmt(uuids: list[str] | tuple[str, ...]) -> str:
    return ", ".join(uuids) if uuids else "-"


def _numas(cluster: SimCluster, uuids: list[str] | tuple[str, ...], node: str = NODE) -> list[int | None]:
    table = cluster.gpu_numa(node)
    return sorted({table.get(u) for u in uuids}, key=lambda n: -1 if n is None else n)


async def _stage(cluster: SimCluster, result: ScenarioResult, node: str = NODE, cpus: int = 15) -> int:
    """Fill one NUMA node's CPUs with ``cpu-batch``; returns that NUMA node."""
    result.step("node", f"{node}: {_describe(cluster.machine(node))}")
    await cluster.create_pod(filler_pod(node, cpus))
    await cluster.wait_settled(FILLER_NAME)
    admission = cluster.assignment(FILLER_NAME)
    filler = admission.containers[0] if admission and admission.containers else None
    numa = filler.numa_node if filler is not None else None
    pinned = _cpu_text(filler.cpus) if filler else "-"
    result.step(
        "cpu-batch", f"Guaranteed pod with {cpus} CPUs (no GPU): kubelet pins CPUs {pinned} on NUMA {numa}"
    )
    return -1 if numa is None else numa


def _describe(machine: Machine) -> str:
    """One line per NUMA node: CPUs (reserved ones named) and GPU indexes."""
    parts = []
    for numa in machine.numa_nodes:
        reserved = numa.cpus & machine.reserved_cpus
        gpus = ",".join(str(g.index) for g in machine.gpus if g.numa == numa.id) or "-"
        parts.append(
            f"NUMA {numa.id}: CPUs {_cpu_text(numa.cpus)} (reserved {_cpu_text(reserved)}), GPUs {gpus}"
        )
    return " | ".join(parts)


def _kubelet_step(result: ScenarioResult, admission: PodAdmission | None) -> PodAdmission | None:
    if admission is None:
        result.step("kubelet", "no admission recorded")
        return None
    if not admission.admitted:
        result.step("kubelet", f"rejected the pod: {admission.reason}: {admission.message}")
        return admission
    c = admission.containers[0]
    available = c.preferred_calls[0].available if c.preferred_calls else ()
    result.step(
        "kubelet",
        f"Topology Manager ({admission.topology_policy}) chose NUMA {c.numa_node}; static CPU manager gave "
        f"CPUs {_cpu_text(c.cpus)}; GetPreferredAllocation offered {len(available)} replicas, all on "
        f"NUMA {c.numa_node}",
    )
    return admission


def _cpu_text(cpus: frozenset[int]) -> str:
    ordered = sorted(cpus)
    if not ordered:
        return "-"
    runs: list[str] = []
    start = prev = ordered[0]
    for cpu in [*ordered[1:], None]:
        if cpu is not None and cpu == prev + 1:
            prev = cpu
            continue
        runs.append(str(start) if start == prev else f"{start}-{prev}")
        if cpu is not None:
            start = prev = cpu
    return ",".join(runs)


def _events_step(cluster: SimCluster, result: ScenarioResult, name: str = SEED_NAME) -> list[dict[str, Any]]:
    events = [
        e
        for e in cluster.events(name)
        if e.get("reason") in (R.EVENT_NUMA_REFIT_SUCCEED, R.EVENT_NUMA_REFIT_FAILED)
    ]
    for e in events:
        result.step("event", f"{e.get('type')}  {e.get('reason')}  {e.get('message')}")
    if not events:
        result.step("event", "no NumaRefit event")
    return events


def _refit_step(
    cluster: SimCluster, result: ScenarioResult, name: str = SEED_NAME, *, enabled: bool = True
) -> list[RefitCall]:
    calls = cluster.refit_calls(name)
    for call in calls:
        request = (
            f"POST /refit container {call.container_index} allowed [{_fmt(call.allowed)}]"
            if enabled
            else "refit disabled, no request"
        )
        text = (
            f"plugin: annotated [{_fmt(call.annotated)}] has no replica in kubelet's set; "
            f"{request} -> {call.outcome}"
        )
        if call.devices:
            text += f" [{_fmt(call.devices)}]"
        if call.error:
            text += f" ({call.error})"
        result.step("refit", text)
    if not calls:
        result.step("refit", "plugin sent no refit request")
    return calls


def _final_state(cluster: SimCluster, result: ScenarioResult, name: str = SEED_NAME) -> dict[str, Any]:
    """Record runtime GPU, annotations and accounting of the pod's first container."""
    admission = cluster.assignment(name)
    env = admission.containers[0].env if admission and admission.containers else {}
    runtime = [u for u in env.get("NVIDIA_VISIBLE_DEVICES", "").split(",") if u]
    allocated = _uuids(cluster.allocated(name))
    pending = [v for v in cluster.annotation_history(name, ann.DEVICES_TO_ALLOCATE) if v.strip(";")]
    to_allocate = _uuids(ann.decode_pod_devices(pending[-1])) if pending else []
    reservation = cluster.reservation(name)
    accounting = _uuids(reservation.layout) if reservation is not None else []
    cpu_numa = admission.containers[0].numa_node if admission and admission.containers else None
    state = {
        "phase": (cluster.pod(name).get("status") or {}).get("phase"),
        "bindPhase": cluster.annotations(name).get(ann.BIND_PHASE),
        "cpuNuma": cpu_numa,
        "cpus": _cpu_text(admission.containers[0].cpus) if admission and admission.containers else "",
        "runtimeGpus": runtime,
        "allocatedAnnotation": allocated,
        "toAllocateAnnotation": to_allocate,
        "accounting": accounting,
        "env": {k: v for k, v in env.items() if not k.endswith("SHARED_CACHE")},
    }
    result.facts["final"] = state
    return state


async def _released(cluster: SimCluster, name: str = SEED_NAME) -> bool:
    """Wait (bounded) until the scheduler has dropped the pod's reservation."""
    try:
        await wait_until(lambda: cluster.reservation(name) is None, 5.0, "reservation released")
    except TimeoutError:
        return False
    return True


def _lock_free(cluster: SimCluster, node: str = NODE) -> bool:
    node_obj = cluster.server.get("Node", None, node) or {}
    return ann.NODE_LOCK not in objects.annotations(node_obj)


def _node_idle(cluster: SimCluster, node: str) -> bool:
    """No GPU of ``node`` carries usage in the scheduler's accounting."""
    return all(used == (0, 0, 0) for used in cluster.scheduler.ledger.snapshot().get(node, {}).values())


# -- scenarios -----------------------------------------------------------------------------------


async def _aligned_run(
    result: ScenarioResult, options: ClusterOptions, pod: dict[str, Any], filler_cpus: int = 15
) -> None:
    """Shared body of the scenarios whose refit must succeed (refit, numa-bind, many-numa)."""
    async with _cluster(options, result) as cluster:
        blocked = await _stage(cluster, result, cpus=filler_cpus)
        await cluster.create_pod(pod)
        result.step("pod", _pod_text(pod))
        await cluster.wait_settled(SEED_NAME, timeout=_SETTLE_S)
        choice = _uuids(cluster.scheduler_choice(SEED_NAME))
        choice_numa = _numas(cluster, choice)
        result.step(
            "scheduler", f"filter + bind: {NODE}, GPU [{_fmt(choice)}] on NUMA {_fmt_numa(choice_numa)}"
        )
        admission = _kubelet_step(result, cluster.assignment(SEED_NAME))
        calls = _refit_step(cluster, result)
        events = _events_step(cluster, result)
        state = _final_state(cluster, result)
        result.step("allocate", "env " + json.dumps(state["env"], sort_keys=True))
        cpu_numa = state["cpuNuma"]
        result.check(
            "kubelet had to use the other NUMA node",
            admission is not None
            and cpu_numa is not None
            and choice_numa == [blocked]
            and cpu_numa != blocked,
            f"scheduler NUMA {choice_numa}, CPUs NUMA {cpu_numa}, CPU-full NUMA {blocked}",
        )
        new = _one_refit_checks(result, calls, choice, events)
        _agreement_checks(cluster, result, state, new, cpu_numa)


def refit_event_message(index: int, old: list[str], new: list[str]) -> str:
    """The exact ``NumaRefitSucceed`` message (UUID lists rendered like Go's ``%v`` of a []string)."""
    return f"NUMA refit moved container {index} from [{' '.join(old)}] to [{' '.join(new)}]"


def _agreement_checks(
    cluster: SimCluster, result: ScenarioResult, state: dict[str, Any], new: list[str], cpu_numa: int | None
) -> None:
    result.check("pod Running", state["phase"] == "Running", str(state["phase"]))
    agree = (
        bool(new)
        and sorted(state["runtimeGpus"]) == sorted(new)
        and state["allocatedAnnotation"] == new
        and state["toAllocateAnnotation"] == new
        and state["accounting"] == new
    )
    result.check(
        "runtime GPU == both annotations == scheduler accounting",
        agree,
        f"runtime {state['runtimeGpus']}, allocated {state['allocatedAnnotation']}, "
        f"to-allocate {state['toAllocateAnnotation']}, accounting {state['accounting']}",
    )
    numas = _numas(cluster, new)
    result.check("GPU on the CPUs' NUMA node", numas == [cpu_numa], f"GPU NUMA {numas}, CPU NUMA {cpu_numa}")
    result.step(
        "check",
        f"runtime {_fmt(state['runtimeGpus'])} == allocated == to-allocate == accounting; "
        f"GPU NUMA {_fmt_numa(numas)} == CPU NUMA {cpu_numa}: {'OK' if result.ok else 'FAILED'}",
    )


def _fmt_numa(numas: list[int | None]) -> str:
    return ",".join("?" if n is None else str(n) for n in numas) or "-"


def _pod_text(pod: dict[str, Any]) -> str:
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    notes = ", ".join(f"{k}: {v}" for k, v in objects.annotations(pod).items())
    return f"created {objects.name(pod)} ({notes}; limits {json.dumps(limits, sort_keys=True)})"


def _one_refit_checks(
    result: ScenarioResult, calls: list[RefitCall], choice: list[str], events: list[dict[str, Any]]
) -> list[str]:
    """Exactly one refit committed, announced by HAMi's event text; the GPUs it moved the pod to."""
    refitted = [c for c in calls if c.outcome == "refitted"]
    result.check("one refit committed", len(calls) == 1 and len(refitted) == 1, f"{len(calls)} refit call(s)")
    new = list(refitted[0].devices) if refitted else []
    message = refit_event_message(0, choice, new)
    result.facts["event"] = message
    result.check(
        "NumaRefitSucceed event with the exact message",
        any(e.get("reason") == R.EVENT_NUMA_REFIT_SUCCEED and e.get("message") == message for e in events),
        message,
    )
    return new


async def scenario_refit() -> ScenarioResult:
    """best-effort: the refit moves the allocation onto the CPUs' NUMA node."""
    result = ScenarioResult(
        "refit", "refit succeeds; runtime GPU == annotations == accounting on the CPUs' NUMA"
    )
    await _aligned_run(result, ClusterOptions(nodes=(NodeSpec(NODE),), numa_publish=False), seed_pod())
    return result


async def scenario_numa_bind() -> ScenarioResult:
    """numa-bind + best-effort: two GPUs refitted together onto the CPUs' NUMA node."""
    result = ScenarioResult("numa-bind", "2 GPUs with numa-bind refitted together onto the CPUs' NUMA node")
    pod = seed_pod(gpus=2, annotations={ann.NUMA_BIND: "true"})
    await _aligned_run(result, ClusterOptions(nodes=(NodeSpec(NODE),), numa_publish=False), pod)
    return result


async def _refused_run(
    result: ScenarioResult,
    options: ClusterOptions,
    pod: dict[str, Any],
    *,
    strict: bool,
    refit_enabled: bool = True,
    reason_text: str = "",
    node: str = NODE,
) -> None:
    """Shared body of the scenarios where the allocation cannot be aligned."""
    async with _cluster(options, result) as cluster:
        blocked = await _stage(cluster, result, node)
        await cluster.create_pod(pod)
        result.step("pod", _pod_text(pod))
        await cluster.wait_settled(SEED_NAME, timeout=_SETTLE_S)
        choice = _uuids(cluster.scheduler_choice(SEED_NAME))
        choice_numa = _numas(cluster, choice, node)
        result.step(
            "scheduler", f"filter + bind: {node}, GPU [{_fmt(choice)}] on NUMA {_fmt_numa(choice_numa)}"
        )
        admission = _kubelet_step(result, cluster.assignment(SEED_NAME))
        calls = _refit_step(cluster, result, enabled=refit_enabled)
        events = _events_step(cluster, result)
        state = _final_state(cluster, result)
        cpu_numa = state["cpuNuma"]
        result.check(
            "kubelet had to use the other NUMA node",
            choice_numa == [blocked] and (cpu_numa is None or cpu_numa != blocked),
            f"scheduler NUMA {choice_numa}, CPUs NUMA {cpu_numa}, CPU-full NUMA {blocked}",
        )
        _refusal_checks(result, calls, events, refit_enabled=refit_enabled, reason_text=reason_text)
        result.check(
            "annotations unchanged", state["allocatedAnnotation"] == choice, str(state["allocatedAnnotation"])
        )
        if strict:
            await _strict_failure_checks(cluster, result, state, admission, node)
        else:
            _unaligned_checks(cluster, result, state, admission, choice, node)


def _refusal_checks(
    result: ScenarioResult,
    calls: list[Any],
    events: list[dict[str, Any]],
    *,
    refit_enabled: bool,
    reason_text: str,
) -> None:
    """The refit was asked for and refused (NumaRefitFailed), or never asked for when disabled."""
    if refit_enabled:
        failed = [e for e in events if e.get("reason") == R.EVENT_NUMA_REFIT_FAILED]
        result.check(
            "refit refused (NumaRefitFailed)",
            len(calls) == 1 and bool(failed) and reason_text in str(failed[0].get("message")),
            str(failed[0].get("message")) if failed else "no NumaRefitFailed event",
        )
    else:
        result.check(
            "no refit request sent (refit disabled)",
            len(calls) == 1 and calls[0].outcome == "unaligned" and not events,
            f"{len(calls)} mismatch(es), events {len(events)}",
        )


async def _strict_failure_checks(
    cluster: SimCluster,
    result: ScenarioResult,
    state: dict[str, Any],
    admission: PodAdmission | None,
    node: str,
) -> None:
    """strict: the pod failed, its bind-phase says so, and neither the node lock nor a GPU is held."""
    released = await _released(cluster)
    result.check(
        "allocation failed: pod Failed, bind-phase failed, node lock released",
        state["phase"] == "Failed"
        and state["bindPhase"] == ann.BIND_PHASE_FAILED
        and _lock_free(cluster, node)
        and admission is not None
        and not admission.admitted,
        f"phase {state['phase']}, bind-phase {state['bindPhase']}, lock free {_lock_free(cluster, node)}",
    )
    result.check(
        "no GPU held after the failure",
        released and _node_idle(cluster, node),
        f"reservation released: {released}",
    )
    result.step("check", f"pod {state['phase']}, bind-phase {state['bindPhase']}, node lock released")


def _unaligned_checks(
    cluster: SimCluster,
    result: ScenarioResult,
    state: dict[str, Any],
    admission: PodAdmission | None,
    choice: list[str],
    node: str,
) -> None:
    """No refit applied: the pod runs on the scheduler's GPUs (runtime == annotations == accounting)."""
    runtime = state["runtimeGpus"]
    runtime_numas = _numas(cluster, runtime, node)
    cpu_numa = state["cpuNuma"]
    picked = (
        admission.containers[0].devices.get(RESOURCE_NAME, ()) if admission and admission.containers else ()
    )
    result.step(
        "allocate",
        f"kubelet allocated replicas [{_fmt(list(picked))}] on NUMA {cpu_numa}; the plugin serves the "
        f"annotated GPU(s) [{_fmt(runtime)}] on NUMA {_fmt_numa(runtime_numas)} (warning logged: "
        "runtime follows the scheduler's accounting)",
    )
    result.check("pod Running", state["phase"] == "Running", str(state["phase"]))
    result.check(
        "runtime GPU == both annotations == scheduler accounting == the scheduler's GPU",
        bool(choice)
        and sorted(runtime) == sorted(choice)
        and state["allocatedAnnotation"] == choice
        and state["toAllocateAnnotation"] == choice
        and state["accounting"] == choice,
        f"runtime {runtime}, allocated {state['allocatedAnnotation']}, "
        f"to-allocate {state['toAllocateAnnotation']}, accounting {state['accounting']}, scheduler {choice}",
    )
    result.check(
        "NUMA alignment not achieved (GPU NUMA != CPU NUMA)",
        cpu_numa is not None and bool(runtime_numas) and cpu_numa not in runtime_numas,
        f"GPU NUMA {runtime_numas}, CPU NUMA {cpu_numa}",
    )
    result.step(
        "check",
        f"runtime {_fmt(runtime)} == allocated == to-allocate == accounting == scheduler's choice; "
        f"GPU NUMA {_fmt_numa(runtime_numas)} != CPU NUMA {cpu_numa}: NUMA alignment not achieved, "
        f"the container runs where the scheduler accounts for it: {'OK' if result.ok else 'FAILED'}",
    )


async def scenario_strict_failure() -> ScenarioResult:
    """strict: the refit is refused (the pod's own policy excludes every allowed GPU) → allocation fails."""
    result = ScenarioResult("strict-failure", "refit refused; strict fails the allocation (pod Failed)")
    banned = ",".join(g.uuid for g in data_machine_gpus() if g.numa == 0)  # all GPUs kubelet may use
    pod = seed_pod(alignment="strict", annotations={ann.NOUSE_GPU_UUID: banned})
    await _refused_run(result, ClusterOptions(nodes=(NodeSpec(NODE),), numa_publish=False), pod, strict=True)
    return result


async def scenario_refit_disabled() -> ScenarioResult:
    """Refit not deployed: strict only logs at error level; the pod runs unaligned on the scheduler's GPU."""
    result = ScenarioResult(
        "refit-disabled",
        "no refit request; strict only logs at error; pod runs on the scheduler's GPU, NUMA not aligned",
    )
    options = ClusterOptions(nodes=(NodeSpec(NODE),), refit=False, numa_publish=False)
    await _refused_run(result, options, seed_pod(alignment="strict"), strict=False, refit_enabled=False)
    return result


async def scenario_pinned_uuid() -> ScenarioResult:
    """Pinned (use-gpuuuid) to a GPU outside kubelet's set: refused; best-effort runs on the pinned GPU."""
    result = ScenarioResult(
        "pinned-uuid",
        "refit refused (pinned GPU not allowed); best-effort runs on the pinned GPU, NUMA not aligned",
    )
    pinned = next(g.uuid for g in data_machine_gpus() if g.numa == 1)
    pod = seed_pod(annotations={ann.USE_GPU_UUID: pinned})
    await _refused_run(
        result,
        ClusterOptions(nodes=(NodeSpec(NODE),), numa_publish=False),
        pod,
        strict=False,
        reason_text="pin",
    )
    return result


def heterogeneous_pod(alignment: str) -> dict[str, Any]:
    """Two GPUs with numa-bind and a memory percentage: on mixed cards the MiB booked per GPU differ."""
    return seed_pod(
        alignment=alignment, gpus=2, gpumem=None, gpumem_percentage=25, annotations={ann.NUMA_BIND: "true"}
    )


async def scenario_heterogeneous() -> ScenarioResult:
    """Percentage request on mixed GPUs books differing MiB per GPU: refused; best-effort runs unaligned."""
    result = ScenarioResult(
        "heterogeneous",
        "refit refused (differing per-device amounts); best-effort runs on the scheduler's two GPUs, "
        "NUMA not aligned",
    )
    # numa-bind makes the scheduler take both GPUs of one NUMA node: one 48 GB and one 96 GB card.
    options = ClusterOptions(
        nodes=(NodeSpec(NODE, machine_file=data_file(HETERO_MACHINE)),), numa_publish=False
    )
    pod = heterogeneous_pod("best-effort")
    await _refused_run(result, options, pod, strict=False, reason_text="heterogeneous")
    return result


async def scenario_heterogeneous_strict() -> ScenarioResult:
    """The heterogeneous reservation with strict alignment: the refused refit fails the allocation."""
    result = ScenarioResult(
        "heterogeneous-strict", "refit refused (differing per-device amounts); strict fails the allocation"
    )
    options = ClusterOptions(
        nodes=(NodeSpec(NODE, machine_file=data_file(HETERO_MACHINE)),), numa_publish=False
    )
    await _refused_run(result, options, heterogeneous_pod("strict"), strict=True, reason_text="heterogeneous")
    return result


async def scenario_mig_node() -> ScenarioResult:
    """Dynamic MIG: the scheduler reserves a profile and placement on a MIG GPU; the demo's plugin
    reads a devices file, so it has no NVML to create the instance with and refuses; never refitted."""
    result = ScenarioResult(
        "mig-node",
        "dynamic MIG: a profile and placement reserved; without NVML the instance is refused, never refitted",
    )
    options = ClusterOptions(
        nodes=(NodeSpec(NODE, machine_file=data_file(DEMO_MIG_MACHINE), mig=True),), numa_publish=False
    )
    async with _cluster(options, result) as cluster:
        blocked = await _stage(cluster, result)
        await cluster.create_pod(seed_pod())
        result.step(
            "pod", f"created {SEED_NAME}: one GPU with 20000 MiB (NUMA {blocked} holds the CPU batch)"
        )
        await cluster.wait_settled(SEED_NAME, timeout=_SETTLE_S)
        raw = cluster.annotations(SEED_NAME).get(ann.MIG_ALLOCATIONS, "")
        reserved = decode_mig_allocations(raw) if raw else ()
        for r in reserved:
            result.step(
                "scheduler",
                f"reserved MIG profile {r.profile} at slices {r.placement.start}-"
                f"{r.placement.start + r.placement.size - 1} of {r.gpu_uuid} ({ann.MIG_ALLOCATIONS})",
            )
        result.check(
            "scheduler reserves the smallest profile with the memory (3g.40gb: 2g.20gb has 19968 MiB)",
            [r.profile for r in reserved] == ["3g.40gb"],
            raw or "no reservation",
        )
        _kubelet_step(result, cluster.assignment(SEED_NAME))
        calls = _refit_step(cluster, result)
        events = _events_step(cluster, result)
        state = _final_state(cluster, result)
        message = str((cluster.pod(SEED_NAME).get("status") or {}).get("message") or "")
        result.check("no refit request", not calls, f"{len(calls)} refit call(s)")
        result.check("no NumaRefit event", not events)
        result.check(
            "no instance without NVML: Allocate refused, the pod failed",
            state["phase"] == "Failed" and "no NVML" in message,
            f"{state['phase']}: {message}",
        )
    return result


async def scenario_many_numa() -> ScenarioResult:
    """16 NUMA nodes: kubelet starts only with max-allowable-numa-nodes "16", then the refit aligns."""
    result = ScenarioResult(
        "many-numa", 'on 16 NUMA nodes (max-allowable-numa-nodes "16") the refit aligns GPU and CPUs'
    )
    machine = load_machine_file(data_file(MANY_NUMA_MACHINE))
    try:
        build_managers(machine, replace(MANY_NUMA_CONFIG, topology_manager_policy_options={}))
        refusal = ""
    except InvalidInput as exc:
        refusal = str(exc)
    result.step("kubelet", f"without max-allowable-numa-nodes: {refusal or 'started'}")
    result.check(
        "kubelet refuses 16 NUMA nodes without the option",
        refusal == "unsupported on machines with more than 8 NUMA Nodes",
        refusal,
    )
    node = NodeSpec(NODE, machine_file=data_file(MANY_NUMA_MACHINE), kubelet_config=MANY_NUMA_CONFIG)
    await _aligned_run(result, ClusterOptions(nodes=(node,), numa_publish=False), seed_pod(), filler_cpus=16)
    return result


# -- exact fit: kubelet skips GetPreferredAllocation -------------------------------------------

#: Replicas per GPU on the exact-fit node: NUMA 0's four GPUs offer 16 replicas.
EXACT_FIT_SPLIT = 4
#: GPU pods that fill 15 of NUMA 0's 16 replicas, leaving one on its last GPU.
EXACT_FIT_FILLERS = 15
#: MiB each filler books; ``crowded`` fillers leave the last GPU too little memory for the seed pod.
EXACT_FIT_FILLER_MIB = 1000
EXACT_FIT_CROWDED_MIB = 30000


def gpu_filler_pod(name: str, uuid: str, mem: int = EXACT_FIT_FILLER_MIB) -> dict[str, Any]:
    """A one-GPU pod pinned (``nvidia.com/use-gpuuuid``) to ``uuid``, no CPU request (shared pool)."""
    limits = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": mem}
    return {
        "metadata": {"name": name, "namespace": "default", "annotations": {ann.USE_GPU_UUID: uuid}},
        "spec": {"containers": [{"name": "work", "image": "cuda", "resources": {"limits": limits}}]},
    }


def exact_fit_pod(alignment: str) -> dict[str, Any]:
    """The seed pod made small (2 CPUs), so NUMA 0 has room for its CPUs but one replica only."""
    pod = seed_pod(alignment=alignment)
    pod["spec"]["containers"][0]["resources"]["limits"].update({"cpu": "2", "memory": "2Gi"})
    return pod


def exact_fit_options(*, refit: bool = True) -> ClusterOptions:
    """The demo node with :data:`EXACT_FIT_SPLIT` replicas per GPU, its plugin on
    ``--hide-replicas full``: under ``busy`` NUMA 0's partly used GPUs would hide their last free
    replica while NUMA 1's GPUs are idle, so kubelet would not choose NUMA 0 and the exact fit
    this stage shows (a kubelet corner the refit still covers) would not happen."""
    return ClusterOptions(
        nodes=(NodeSpec(NODE, split=EXACT_FIT_SPLIT),), refit=refit, numa_publish=False, hide_replicas="full"
    )


async def stage_exact_fit(cluster: SimCluster, *, crowded: bool = False) -> str:
    """Fill 15 of NUMA 0's 16 replicas with pinned GPU pods; returns the GPU keeping the last one.

    NUMA 0's CPUs stay free, so kubelet's Topology Manager prefers NUMA 0 (its lowest NUMA node)
    and finds there exactly the one replica the seed pod needs: it allocates it without calling
    GetPreferredAllocation, while the scheduler's spread policy picks an idle GPU on NUMA 1.
    """
    numa0 = [g.uuid for g in cluster.machine(NODE).gpus if g.numa == 0]
    last = numa0[-1]
    for i in range(EXACT_FIT_FILLERS):
        uuid = numa0[i // EXACT_FIT_SPLIT]
        mem = EXACT_FIT_CROWDED_MIB if crowded and uuid == last else EXACT_FIT_FILLER_MIB
        await cluster.create_pod(gpu_filler_pod(f"gpu-fill-{i}", uuid, mem))
        await cluster.wait_settled(f"gpu-fill-{i}")
    return last


async def scenario_exact_fit() -> ScenarioResult:
    """strict, exact fit on NUMA 0: kubelet skips GetPreferredAllocation; Allocate refits the pod."""
    result = ScenarioResult(
        "exact-fit",
        "kubelet skips GetPreferredAllocation (one free replica on the CPUs' NUMA node); Allocate refits "
        "the strict pod onto it; runtime GPU == annotations == accounting on the CPUs' NUMA",
    )
    async with _cluster(exact_fit_options(), result) as cluster:
        result.step("node", f"{NODE}: {_describe(cluster.machine(NODE))}; {EXACT_FIT_SPLIT} replicas per GPU")
        free = await stage_exact_fit(cluster)
        result.step(
            "gpu-fill",
            f"{EXACT_FIT_FILLERS} pinned GPU pods hold 15 of NUMA 0's 16 replicas; one is left on [{free}]",
        )
        pod = exact_fit_pod("strict")
        await cluster.create_pod(pod)
        result.step("pod", _pod_text(pod))
        await cluster.wait_settled(SEED_NAME, timeout=_SETTLE_S)
        choice = _uuids(cluster.scheduler_choice(SEED_NAME))
        result.step(
            "scheduler",
            f"filter + bind: {NODE}, GPU [{_fmt(choice)}] on NUMA {_fmt_numa(_numas(cluster, choice))}",
        )
        admission = cluster.assignment(SEED_NAME)
        container = admission.containers[0] if admission and admission.containers else None
        picked = list(container.devices.get(RESOURCE_NAME, ())) if container else []
        result.step(
            "kubelet",
            f"Topology Manager chose NUMA {container.numa_node if container else '-'}; exactly the needed "
            f"replicas are free there, so no GetPreferredAllocation; Allocate with [{_fmt(picked)}]",
        )
        calls = _refit_step(cluster, result)
        events = _events_step(cluster, result)
        state = _final_state(cluster, result)
        result.step("allocate", "env " + json.dumps(state["env"], sort_keys=True))
        result.check(
            "kubelet skipped GetPreferredAllocation",
            container is not None and not container.preferred_calls,
            f"{len(container.preferred_calls) if container else '-'} call(s)",
        )
        refitted = [c for c in calls if c.outcome == "refitted" and c.door == "Allocate"]
        result.check(
            "one refit committed at the Allocate door",
            len(calls) == 1 and len(refitted) == 1 and list(refitted[0].devices) == [free],
            f"{[(c.door, c.outcome, c.devices) for c in calls]}",
        )
        new = list(refitted[0].devices) if refitted else []
        message = refit_event_message(0, choice, new)
        result.facts["event"] = message
        result.check(
            "NumaRefitSucceed event with the exact message",
            any(
                e.get("reason") == R.EVENT_NUMA_REFIT_SUCCEED and e.get("message") == message for e in events
            ),
            message,
        )
        _agreement_checks(cluster, result, state, new, state["cpuNuma"])
    return result


# -- predictive placement ------------------------------------------------------------------------

#: The foreign pod of ``prediction-miss``: Guaranteed, 10 CPUs, bound by the default scheduler.
FOREIGN_NAME = "foreign-batch"
#: How long ``prediction-miss`` holds the seed pod's Binding (injected API latency).
_BINDING_DELAY_S = 2.0


def _predicted_numa(cluster: SimCluster, name: str = SEED_NAME) -> list[int]:
    """The NUMA node(s) the scheduler recorded in ``hamid.io/numa-predicted`` for container 0."""
    raw = cluster.annotations(name).get(NUMA_PREDICTED)
    if raw is None:
        return []
    try:
        containers = decode_prediction(raw).containers
    except InvalidInput:
        return []
    return sorted(containers[0].numa) if containers else []


async def _scored(cluster: SimCluster, result: str, cause: str = "") -> bool:
    """Wait (bounded) until the scheduler scored a prediction ``result`` (a miss: of ``cause``)."""
    registry = cluster.scheduler.metrics.registry

    def counted() -> bool:
        if cause:
            value = registry.get_sample_value("hamid_numa_prediction_misses_total", {"cause": cause})
        else:
            value = registry.get_sample_value("hamid_numa_prediction_total", {"result": result})
        return bool(value)

    try:
        await wait_until(counted, 5.0, f"prediction scored {result}")
    except TimeoutError:
        return False
    return True


async def _predicted_pod(
    cluster: SimCluster, result: ScenarioResult, pod: dict[str, Any], how: str
) -> tuple[list[int], list[str], list[int | None]]:
    """Create the seed pod, wait until it settled; the predicted NUMA node(s), GPUs and their NUMA nodes."""
    await cluster.create_pod(pod)
    result.step("pod", _pod_text(pod))
    await cluster.wait_settled(SEED_NAME, timeout=_SETTLE_S)
    predicted = _predicted_numa(cluster)
    choice = _uuids(cluster.scheduler_choice(SEED_NAME))
    choice_numa = _numas(cluster, choice)
    result.step(
        "scheduler",
        f"predicted kubelet's NUMA {_fmt_numa(list(predicted))} {how}; filter + bind: "
        f"{NODE}, GPU [{_fmt(choice)}] on NUMA {_fmt_numa(choice_numa)}",
    )
    return predicted, choice, choice_numa


async def scenario_prediction() -> ScenarioResult:
    """The seed's pod with NUMA profiles published: the scheduler predicts kubelet, no refit."""
    result = ScenarioResult(
        "prediction",
        "the scheduler predicts kubelet's NUMA node: GPU on the CPUs' NUMA, no refit",
    )
    async with _cluster(ClusterOptions(nodes=(NodeSpec(NODE),)), result) as cluster:
        blocked = await _stage(cluster, result)
        predicted, choice, choice_numa = await _predicted_pod(
            cluster, result, seed_pod(), f"({NUMA_PREDICTED})"
        )
        _kubelet_step(result, cluster.assignment(SEED_NAME))
        calls = _refit_step(cluster, result)
        _events_step(cluster, result)
        state = _final_state(cluster, result)
        result.step("allocate", "env " + json.dumps(state["env"], sort_keys=True))
        hit = await _scored(cluster, "hit")
        result.step(
            "ledger", f"node agent published the placement; prediction scored: {'hit' if hit else '-'}"
        )
        cpu_numa = state["cpuNuma"]
        result.check(
            "scheduler predicted kubelet's NUMA node",
            cpu_numa is not None and predicted == [cpu_numa] == choice_numa and cpu_numa != blocked,
            f"predicted {predicted}, GPU NUMA {choice_numa}, CPUs NUMA {cpu_numa}, CPU-full NUMA {blocked}",
        )
        result.check("no refit needed", not calls, f"{len(calls)} refit call(s)")
        result.check("hamid_numa_prediction_total{result=hit}", hit)
        _agreement_checks(cluster, result, state, choice, cpu_numa)
    return result


async def scenario_prediction_miss() -> ScenarioResult:
    """A foreign pod admitted between the filter and kubelet's admission: a miss, corrected by refit."""
    result = ScenarioResult(
        "prediction-miss",
        "a foreign pod admitted in between makes the prediction miss; the refit corrects it",
    )
    async with _cluster(ClusterOptions(nodes=(NodeSpec(NODE),)), result) as cluster:
        result.step("node", f"{NODE}: {_describe(cluster.machine(NODE))}")
        delay = cluster.server.faults.add_latency(
            _BINDING_DELAY_S, verb="create", path_pattern=rf"/pods/{SEED_NAME}/binding$"
        )
        pod = seed_pod()
        await cluster.create_pod(pod)
        result.step("pod", _pod_text(pod))
        await wait_until(lambda: bool(_predicted_numa(cluster)), _SETTLE_S, "prediction recorded")
        predicted = _predicted_numa(cluster)
        choice = _uuids(ann.decode_pod_devices(cluster.annotations(SEED_NAME)[ann.DEVICES_ALLOCATED]))
        result.step(
            "scheduler",
            f"predicted NUMA {_fmt_numa(list(predicted))}; GPU [{_fmt(choice)}] on NUMA "
            f"{_fmt_numa(_numas(cluster, choice))}; its Binding takes {_BINDING_DELAY_S:g} s (injected)",
        )
        await cluster.create_pod(filler_pod(NODE, cpus=10, name=FOREIGN_NAME))
        await cluster.wait_settled(FOREIGN_NAME)
        foreign = cluster.assignment(FOREIGN_NAME)
        taken = foreign.containers[0] if foreign and foreign.containers else None
        result.step(
            "foreign",
            f"meanwhile a Guaranteed pod with 10 CPUs bound by the default scheduler: kubelet pins CPUs "
            f"{_cpu_text(taken.cpus) if taken else '-'} on NUMA {taken.numa_node if taken else '-'}",
        )
        cluster.server.faults.remove(delay.id)
        await cluster.wait_settled(SEED_NAME, timeout=_SETTLE_S)
        _kubelet_step(result, cluster.assignment(SEED_NAME))
        calls = _refit_step(cluster, result)
        events = _events_step(cluster, result)
        state = _final_state(cluster, result)
        result.step("allocate", "env " + json.dumps(state["env"], sort_keys=True))
        missed = await _scored(cluster, "miss", "foreign")
        result.step(
            "ledger", f"prediction scored: miss, cause {'foreign' if missed else '-'}; refit fed the ledger"
        )
        cpu_numa = state["cpuNuma"]
        result.check(
            "the foreign pod moved kubelet off the predicted NUMA node",
            cpu_numa is not None and bool(predicted) and predicted != [cpu_numa],
            f"predicted {predicted}, CPUs NUMA {cpu_numa}",
        )
        new = _one_refit_checks(result, calls, choice, events)
        result.check("hamid_numa_prediction_misses_total{cause=foreign}", missed)
        _agreement_checks(cluster, result, state, new, cpu_numa)
    return result


#: kubelet's Memory Manager Static on the demo node: 1 GiB ``reservedMemory`` per NUMA node, matched
#: by ``systemReserved`` + the default 100Mi hard eviction threshold.
MEMORY_STATIC_CONFIG = replace(
    SIM_DEFAULTS,
    memory_manager_policy="Static",
    reserved_memory=tuple(MemoryReservation(n, (("memory", 1 << 30),)) for n in (0, 1)),
    reserved_memory_types={"memory": (2 << 30) - (100 << 20)},
)
#: The memory-heavy pod of ``memory-prediction``: 2 CPUs and 100 GiB, bound by the default scheduler.
MEMORY_HOG_NAME = "memory-hog"
#: The seed pod's memory in ``memory-prediction``: more than NUMA 0 has left after the hog.
_SEED_MEMORY = "64Gi"


def _memory_hog() -> dict[str, Any]:
    pod = filler_pod(NODE, cpus=2, name=MEMORY_HOG_NAME)
    pod["spec"]["containers"][0]["resources"]["limits"]["memory"] = "100Gi"
    return pod


def _memory_numa(admission: PodAdmission | None) -> list[int]:
    """The NUMA node(s) the memory manager pinned the first container's memory to."""
    if admission is None or not admission.containers:
        return []
    return sorted({n for numa, _size in admission.containers[0].memory.values() for n in numa})


async def scenario_memory_prediction() -> ScenarioResult:
    """Memory Manager Static: memory, not CPU, decides kubelet's NUMA node, and the scheduler predicts it."""
    result = ScenarioResult(
        "memory-prediction",
        "Memory Manager Static: memory, not CPU, decides the NUMA node; the GPU is fitted there, no refit",
    )
    node = NodeSpec(NODE, kubelet_config=MEMORY_STATIC_CONFIG)
    async with _cluster(ClusterOptions(nodes=(node,)), result) as cluster:
        result.step(
            "node",
            f"{NODE}: {_describe(cluster.machine(NODE))}; 128 GiB per NUMA node, Memory Manager Static",
        )
        await cluster.create_pod(_memory_hog())
        await cluster.wait_settled(MEMORY_HOG_NAME)
        hog = cluster.assignment(MEMORY_HOG_NAME)
        hog_numa = _memory_numa(hog)
        numa0 = next(n.cpus for n in cluster.machine(NODE).numa_nodes if n.id == 0)
        free0 = len(cluster.nodes[NODE].kubelet.free_cpus() & numa0)
        result.step(
            "memory-hog",
            f"Guaranteed pod with 2 CPUs and 100 GiB (default scheduler): memory pinned to NUMA "
            f"{_fmt_numa(list(hog_numa))}; NUMA 0 keeps {free0} free CPUs but ~27 GiB of memory",
        )
        pod = seed_pod()
        pod["spec"]["containers"][0]["resources"]["limits"]["memory"] = _SEED_MEMORY
        predicted, choice, choice_numa = await _predicted_pod(
            cluster, result, pod, "(memory hints merged with CPU hints)"
        )
        admission = _kubelet_step(result, cluster.assignment(SEED_NAME))
        seed_memory = _memory_numa(admission)
        result.step(
            "memory", f"kubelet's memory manager pinned {_SEED_MEMORY} to NUMA {_fmt_numa(list(seed_memory))}"
        )
        calls = _refit_step(cluster, result)
        state = _final_state(cluster, result)
        hit = await _scored(cluster, "hit")
        result.step("ledger", f"prediction scored: {'hit' if hit else '-'}")
        cpu_numa = state["cpuNuma"]
        result.check(
            "the hog's memory is on NUMA 0, which has CPUs for the pod (CPU alone would pick it: lowest id)",
            hog_numa == [0] and free0 >= 8,
            f"memory NUMA {hog_numa}, {free0} free CPUs on NUMA 0",
        )
        result.check(
            "memory decided: predicted, GPU, CPUs and memory all on NUMA 1",
            predicted == choice_numa == seed_memory == [1] and cpu_numa == 1,
            f"predicted {predicted}, GPU NUMA {choice_numa}, CPUs NUMA {cpu_numa}, memory NUMA {seed_memory}",
        )
        result.check("no refit needed", not calls, f"{len(calls)} refit call(s)")
        result.check("hamid_numa_prediction_total{result=hit}", hit)
        _agreement_checks(cluster, result, state, choice, cpu_numa)
    return result


def data_machine_gpus() -> list[PhysicalGpu]:
    """The GPUs of the demo node's machine file."""
    return list(load_machine_file(data_file(DEMO_MACHINE)).gpus)


RUNNERS: dict[str, Callable[[], Awaitable[ScenarioResult]]] = {
    "refit": scenario_refit,
    "strict-failure": scenario_strict_failure,
    "refit-disabled": scenario_refit_disabled,
    "pinned-uuid": scenario_pinned_uuid,
    "heterogeneous": scenario_heterogeneous,
    "heterogeneous-strict": scenario_heterogeneous_strict,
    "mig-node": scenario_mig_node,
    "numa-bind": scenario_numa_bind,
    "many-numa": scenario_many_numa,
    "exact-fit": scenario_exact_fit,
    "prediction": scenario_prediction,
    "prediction-miss": scenario_prediction_miss,
    "memory-prediction": scenario_memory_prediction,
}


#: ``hamid demo --keep``: called with the scenario's cluster and result before the cluster stops.
AFTER_SCENARIO: ContextVar[Callable[[SimCluster, ScenarioResult], Awaitable[None]] | None] = ContextVar(
    "AFTER_SCENARIO", default=None
)


@contextlib.asynccontextmanager
async def _cluster(options: ClusterOptions, result: ScenarioResult) -> AsyncIterator[SimCluster]:
    """The scenario's cluster; with ``--keep`` it is handed to :data:`AFTER_SCENARIO` before it stops."""
    async with SimCluster(options) as cluster:
        yield cluster
        keep = AFTER_SCENARIO.get()
        if keep is not None:
            await keep(cluster, result)


async def run_scenario(name: str) -> ScenarioResult:
    """Run one scenario; an unexpected error becomes a failed check (never a traceback on stdout)."""
    try:
        async with asyncio.timeout(None if AFTER_SCENARIO.get() else 60):
            return await RUNNERS[name]()
    except Exception as exc:
        result = ScenarioResult(name, "scenario ran to completion")
        result.check("scenario ran to completion", False, f"{type(exc).__name__}: {exc}")
        return result


# -- output --------------------------------------------------------------------------------------


def render(result: ScenarioResult) -> str:
    """The readable timeline of one scenario."""
    lines = [f"== scenario {result.scenario}: expect {result.expected}"]
    width = max((len(t) for t, _ in result.timeline), default=0)
    for i, (title, text) in enumerate(result.timeline, 1):
        lines.append(f"{i:2d}. {title.ljust(width)}  {text}")
    for c in result.checks:
        lines.append(
            f"    [{'ok' if c.ok else 'FAIL'}] {c.name}" + (f": {c.detail}" if c.detail and not c.ok else "")
        )
    lines.append(f"== {result.scenario}: {'PASS' if result.ok else 'FAIL'}")
    return "\n".join(lines)


@click.command("demo")
@option(
    "--scenario",
    type=click.Choice([*SCENARIOS, "all"]),
    default=DEFAULT_SCENARIO,
    help="Which row of the NUMA-alignment behaviour to run (all: every scenario in turn).",
)
@option("--json", "as_json", is_flag=True, help="Print one JSON result object instead of the timeline.")
@option(
    "--keep",
    is_flag=True,
    help="Keep the scenario's cluster running afterwards for kubectl (as `hamid sim up`); Ctrl-C stops it.",
)
@option(
    "--write-kubeconfig",
    "kubeconfig",
    type=click.Path(dir_okay=False, path_type=Path),
    default=DEFAULT_KUBECONFIG,
    help="With --keep: where to write the kubeconfig.",
)
@click.pass_context
def demo_command(ctx: click.Context, scenario: str, as_json: bool, keep: bool, kubeconfig: Path) -> None:
    """Run the NUMA-alignment flow locally: no cluster, no GPU, a few seconds.

    Embedded API server, scheduler (TLS, authenticated /refit), plugin (8 GPUs on 2 NUMA nodes),
    simulated kubelet (single-numa-node, static CPU manager) and a kube-scheduler driver, in one
    process. Exits 0 only when the scenario's expected outcome happened. Component logs go to
    stderr (warning level unless --log-level is given to hamid).
    """
    quiet_logs(ctx)
    names = list(SCENARIOS) if scenario == "all" else [scenario]
    if keep and scenario == "all":
        raise click.UsageError("--keep keeps one scenario's cluster; choose a --scenario")
    if keep:
        AFTER_SCENARIO.set(lambda cluster, result: _keep(cluster, result, kubeconfig, as_json))
    results = asyncio.run(_run_all(names))
    ok = all(r.ok for r in results)
    if keep:  # printed before the cluster was kept
        ctx.exit(0 if ok else 1)
    if as_json:
        if scenario == "all":
            click.echo(json.dumps({"ok": ok, "scenarios": [r.to_json() for r in results]}))
        else:
            click.echo(json.dumps(results[0].to_json()))
    else:
        click.echo("\n\n".join(render(r) for r in results))
    sys.stdout.flush()
    ctx.exit(0 if ok else 1)


async def _run_all(names: list[str]) -> list[ScenarioResult]:
    return [await run_scenario(n) for n in names]


async def _keep(cluster: SimCluster, result: ScenarioResult, kubeconfig: Path, as_json: bool) -> None:
    """``--keep``: print the scenario's outcome, then serve its cluster for kubectl until a signal."""
    click.echo(json.dumps(result.to_json()) if as_json else render(result))
    pod = seed_pod(name=f"{SEED_NAME}-2")  # 4 CPUs: what the scenario's pods leave on one NUMA node
    pod["spec"]["containers"][0]["resources"]["limits"]["cpu"] = "4"
    await keep_serving(cluster, kubeconfig, pod)


def quiet_logs(ctx: click.Context) -> None:
    """Warning-level component logs unless the user chose a level (flag or HAMID_LOG_LEVEL)."""
    parent = ctx.parent
    if parent is None:
        hamid_log.configure("auto", "warning")
        return
    source = parent.get_parameter_source("log_level")
    if source in (None, click.core.ParameterSource.DEFAULT):
        hamid_log.configure(parent.params.get("log_format") or "auto", "warning")
