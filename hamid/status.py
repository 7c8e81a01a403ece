"""``hamid status``: per node and NUMA node, each GPU's allocated memory, cores and pods, and the
recent NUMA refits — the view operators otherwise assemble from annotations and events.

Read-only and stateless: one LIST of nodes, pods and refit events through the same kubeconfig
rules as kubectl (``--kubeconfig``, ``$KUBECONFIG``, ``~/.kube/config``, then in-cluster). Usage
is the scheduler's own phase-aware rule (:func:`hamid.fit.usage.effective_pod_usage`) applied to
``hami.io/vgpu-devices-allocated`` (with ``hami.io/vgpu-mig-allocations``) of every pod that is
neither Succeeded nor Failed.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import click

from hamid import log
from hamid.fit.usage import container_kinds, effective_pod_usage, init_containers_succeeded
from hamid.kube.client import EVENTS, KubeClient, connect
from hamid.kube.errors import KubeError
from hamid.model import objects
from hamid.model._wire import printable
from hamid.model.annotations import (
    DEVICES_ALLOCATED,
    MIG_ALLOCATIONS,
    NODE_REGISTER,
    decode_node_devices,
    decode_pod_devices,
)
from hamid.model.errors import InvalidInput
from hamid.model.mig import decode_mig_allocations
from hamid.model.reasons import EVENT_NUMA_REFIT_FAILED, EVENT_NUMA_REFIT_SUCCEED
from hamid.options import option

TERMINAL_PHASES = ("Succeeded", "Failed")
DEFAULT_KUBECONFIG = os.path.join("~", ".kube", "config")


@dataclass
class GpuStatus:
    """One registered GPU with what the pods on its node book on it."""

    uuid: str
    index: int
    type: str
    numa: int
    healthy: bool
    memory_mib: int
    cores: int
    slots: int
    used_memory_mib: int = 0
    used_cores: int = 0
    used_slots: int = 0
    pods: list[str] = field(default_factory=list)


@dataclass
class NodeStatus:
    """One node's GPUs (index order) and the problems met reading its objects."""

    name: str
    gpus: list[GpuStatus]
    problems: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class RefitRecord:
    """One NumaRefitSucceed/NumaRefitFailed Event."""

    time: str
    type: str
    reason: str
    pod: str
    message: str
    count: int


@dataclass
class ClusterStatus:
    nodes: list[NodeStatus]
    refits: list[RefitRecord]


def build_status(nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]]) -> list[NodeStatus]:
    """GPU usage per node from wire-form Nodes and Pods (pure)."""
    out: dict[str, NodeStatus] = {}
    by_uuid: dict[str, tuple[NodeStatus, GpuStatus]] = {}
    for node in nodes:
        raw = objects.annotations(node).get(NODE_REGISTER)
        if not raw:
            continue
        status = out[objects.name(node)] = NodeStatus(objects.name(node), [])
        try:
            infos = decode_node_devices(raw)
        except InvalidInput as exc:
            status.problems.append(f"{NODE_REGISTER}: {exc}")
            continue
        for d in sorted(infos, key=lambda d: d.index):
            gpu = GpuStatus(d.id, d.index, d.type, d.numa, d.health, d.devmem, d.devcore, d.count)
            status.gpus.append(gpu)
            by_uuid[d.id] = (status, gpu)
    for pod in pods:
        _book(pod, out, by_uuid)
    return sorted(out.values(), key=lambda n: n.name)


def _book(
    pod: Mapping[str, Any],
    nodes: Mapping[str, NodeStatus],
    by_uuid: Mapping[str, tuple[NodeStatus, GpuStatus]],
) -> None:
    spec = objects.section(pod, "spec")
    raw = objects.annotations(pod).get(DEVICES_ALLOCATED)
    if not raw or objects.section(pod, "status").get("phase") in TERMINAL_PHASES:
        return
    key = objects.namespaced_key(pod)
    node = nodes.get(str(spec.get("nodeName") or ""))
    try:
        usage = effective_pod_usage(
            decode_pod_devices(raw),
            container_kinds(pod),
            init_containers_succeeded(pod),
            decode_mig_allocations(objects.annotations(pod).get(MIG_ALLOCATIONS, "")),
        )
    except InvalidInput as exc:
        if node is not None:
            node.problems.append(f"pod {key}: {exc}")
        return
    for uuid, amount in usage.items():
        found = by_uuid.get(uuid)
        if found is None:
            continue
        gpu = found[1]
        gpu.used_memory_mib += amount.mem
        gpu.used_cores += amount.cores
        gpu.used_slots += amount.slots
        gpu.pods.append(key)


def refit_records(events: Iterable[Mapping[str, Any]], limit: int) -> list[RefitRecord]:
    """The newest ``limit`` refit Events, newest first."""
    records = []
    for e in events:
        obj = e.get("involvedObject") or {}
        when = str(e.get("lastTimestamp") or e.get("eventTime") or e.get("firstTimestamp") or "")
        records.append(
            RefitRecord(
                when,
                str(e.get("type") or ""),
                str(e.get("reason") or ""),
                f"{obj.get('namespace')}/{obj.get('name')}",
                str(e.get("message") or ""),
                int(e.get("count") or 1),
            )
        )
    return sorted(records, key=lambda r: r.time, reverse=True)[:limit]


async def collect(kube: KubeClient, node: str | None, limit: int) -> ClusterStatus:
    """LIST nodes, pods and refit events (all namespaces)."""
    node_selector = f"metadata.name={node}" if node else None
    pod_selector = f"spec.nodeName={node}" if node else None
    (nodes, _), (pods, _) = await asyncio.gather(
        kube.list_nodes(field_selector=node_selector), kube.list_pods(field_selector=pod_selector)
    )
    events: list[Any] = []
    for reason in (EVENT_NUMA_REFIT_SUCCEED, EVENT_NUMA_REFIT_FAILED):
        items, _ = await kube.list_objects(EVENTS, field_selector=f"reason={reason}")
        events += items
    statuses = build_status(nodes, pods)
    if node:
        names = {objects.namespaced_key(p) for p in pods}
        events = [e for e in events if _event_pod(e) in names]
    return ClusterStatus(statuses, refit_records(events, limit))


def _event_pod(event: Mapping[str, Any]) -> str:
    obj = event.get("involvedObject") or {}
    return f"{obj.get('namespace')}/{obj.get('name')}"


def render_text(status: ClusterStatus) -> str:
    """The human view: node, NUMA node, GPU rows, then recent refits."""
    lines: list[str] = []
    if not status.nodes:
        lines.append("no node registers GPUs (hami.io/node-nvidia-register): is hamid plugin running?")
    for node in status.nodes:
        lines.append(f"node {node.name}")
        for numa in sorted({g.numa for g in node.gpus}):
            lines.append(f"  NUMA {numa}")
            for g in (g for g in node.gpus if g.numa == numa):
                health = "" if g.healthy else "  UNHEALTHY"
                lines.append(
                    f"    GPU {g.index} {printable(g.uuid)} {printable(g.type)}: memory "
                    f"{g.used_memory_mib}/{g.memory_mib} MiB, cores {g.used_cores}/{g.cores}%, "
                    f"slots {g.used_slots}/{g.slots}{health}"
                )
                lines.extend(f"      pod {p}" for p in sorted(g.pods))
        lines.extend(f"  problem: {printable(p)}" for p in node.problems)
    lines.append("recent NUMA refits:" if status.refits else "recent NUMA refits: none")
    for r in status.refits:
        times = f" (x{r.count})" if r.count > 1 else ""
        what = printable(f"{r.time} {r.type} {r.reason} {r.pod}")
        lines.append(f"  {what}{times}: {printable(r.message)}")
    return "\n".join(lines)


def resolve_kubeconfig(kubeconfig: str | None, api_server: str | None) -> str | None:
    """kubectl's order: --kubeconfig, $KUBECONFIG, ~/.kube/config when it exists, else None (in-cluster)."""
    if kubeconfig or os.environ.get("KUBECONFIG") or api_server:
        return kubeconfig or os.environ.get("KUBECONFIG") or None
    default = os.path.expanduser(DEFAULT_KUBECONFIG)
    return default if os.path.isfile(default) else None


async def _status(
    kubeconfig: str | None, context: str | None, api_server: str | None, node: str | None, limit: int
) -> ClusterStatus:
    kube = await connect(api_server, resolve_kubeconfig(kubeconfig, api_server), context=context)
    try:
        return await collect(kube, node, limit)
    finally:
        await kube.close()


@click.command("status")
@option(
    "--kubeconfig", default=None, help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, in-cluster)."
)
@option("--context", default=None, help="The kubeconfig context to use (default: its current context).")
@option("--api-server", default=None, help="API server URL (overrides the kubeconfig's; alone: no auth).")
@option("--node", "node_name", default=None, help="Only this node.")
@option(
    "--refits", "refit_limit", type=click.IntRange(min=0), default=10, help="How many recent refits to list."
)
@option("--output", "-o", type=click.Choice(["text", "json"]), default="text", help="Output format.")
def status_command(
    kubeconfig: str | None,
    context: str | None,
    api_server: str | None,
    node_name: str | None,
    refit_limit: int,
    output: str,
) -> None:
    """Show each GPU's allocated memory, cores and pods per node and NUMA node, and recent refits."""
    root = click.get_current_context().find_root()
    if root.get_parameter_source("log_level") in (None, click.core.ParameterSource.DEFAULT):
        # a report on stdout: the client's info lines would only be noise on the terminal
        log.configure(root.params.get("log_format", "auto"), "warning")
    try:
        status = asyncio.run(_status(kubeconfig, context, api_server, node_name, refit_limit))
    except KubeError as exc:
        raise click.ClickException(str(exc)) from None
    if output == "json":
        click.echo(json.dumps(asdict(status), indent=2))
    else:
        click.echo(render_text(status))
