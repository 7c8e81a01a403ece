"""``Table`` responses (``Accept: application/json;as=Table;g=meta.k8s.io;v=v1``), as kubectl prints them.

The columns and cell rules follow the real server's printers: pods NAME READY STATUS RESTARTS AGE
(wide: IP NODE NOMINATED NODE READINESS GATES), nodes NAME STATUS ROLES AGE VERSION, events LAST SEEN
TYPE REASON OBJECT MESSAGE, namespaces, resource quotas, leases and webhook configurations; any other
kind gets NAME and AGE. Ages use Kubernetes' human duration (``5m12s``, ``3h``, ``2d4h``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from hamid.model import objects

TABLE_GROUP = "meta.k8s.io"
_ROLE_PREFIX = "node-role.kubernetes.io/"


@dataclass(frozen=True, slots=True)
class Column:
    """One column definition (``priority`` 1: only with ``-o wide``)."""

    name: str
    kind: str = "string"
    priority: int = 0
    description: str = ""
    format: str = ""

    def to_json(self) -> dict[str, Any]:
        """``TableColumnDefinition``."""
        return {
            "name": self.name,
            "type": self.kind,
            "format": self.format or ("name" if self.name == "Name" else ""),
            "description": self.description or self.name,
            "priority": self.priority,
        }


def wants_table(accept: str) -> bool:
    """Whether an Accept header asks for a meta.k8s.io Table (first choice among what it lists)."""
    for option in accept.split(","):
        params = dict(part.strip().split("=", 1) for part in option.split(";")[1:] if "=" in part)
        if params.get("as") == "Table" and params.get("g", TABLE_GROUP) == TABLE_GROUP:
            return True
        if option.strip().split(";")[0] in ("application/json", "*/*") and "as" not in params:
            return False
    return False


def human_duration(seconds: float) -> str:
    """Kubernetes' ``duration.HumanDuration``."""
    whole = int(seconds)
    if whole < -1:
        return "<invalid>"
    if whole < 0:
        return "0s"
    if whole < 120:
        return f"{whole}s"
    minutes = whole // 60
    if minutes < 10:
        rest = whole % 60
        return f"{minutes}m{rest}s" if rest else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = whole // 3600
    if hours < 8:
        rest = minutes % 60
        return f"{hours}h{rest}m" if rest else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        rest = hours % 24
        return f"{hours // 24}d{rest}h" if rest else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        rest = (hours // 24) % 365
        return f"{hours // 24 // 365}y{rest}d" if rest else f"{hours // 24 // 365}y"
    return f"{hours // 24 // 365}y"


def since(timestamp: Any, now: datetime) -> str:
    """Age of an RFC 3339 timestamp (``<unknown>`` when absent)."""
    if not isinstance(timestamp, str) or not timestamp:
        return "<unknown>"
    try:
        then = datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    except ValueError:
        return "<unknown>"
    return human_duration((now - then).total_seconds())


def _age(obj: dict[str, Any], now: datetime) -> str:
    return since(objects.metadata(obj).get("creationTimestamp"), now)


# --- pods ----------------------------------------------------------------------------------------


def _container_reason(status: dict[str, Any]) -> str:
    state = status.get("state") or {}
    waiting, terminated = state.get("waiting") or {}, state.get("terminated")
    if waiting.get("reason"):
        return str(waiting["reason"])
    if terminated is not None:
        if terminated.get("reason"):
            return str(terminated["reason"])
        if terminated.get("signal"):
            return f"Signal:{terminated['signal']}"
        return f"ExitCode:{terminated.get('exitCode', 0)}"
    return ""


def pod_status(pod: dict[str, Any]) -> str:
    """The STATUS column: the pod's reason, an init or container reason, Terminating, or the phase."""
    status = pod.get("status") or {}
    reason = str(status.get("reason") or status.get("phase") or "Pending")
    init_statuses = status.get("initContainerStatuses") or []
    init_total = len((pod.get("spec") or {}).get("initContainers") or [])
    initializing = False
    for index, init in enumerate(init_statuses):
        terminated = (init.get("state") or {}).get("terminated")
        if terminated is not None and terminated.get("exitCode") == 0:
            continue
        initializing = True
        detail = _container_reason(init)
        waiting = (init.get("state") or {}).get("waiting") or {}
        if detail and (terminated is not None or waiting.get("reason") not in (None, "PodInitializing")):
            reason = f"Init:{detail}"
        else:
            reason = f"Init:{index}/{init_total}"
        break
    if not initializing:
        running = False
        for container in reversed(status.get("containerStatuses") or []):
            detail = _container_reason(container)
            if detail:
                reason = detail
            elif (container.get("state") or {}).get("running") and container.get("ready"):
                running = True
        if reason == "Completed" and running:
            reason = "Running"
    if objects.metadata(pod).get("deletionTimestamp"):
        reason = "Unknown" if status.get("reason") == "NodeLost" else "Terminating"
    return reason


def _restarts(pod: dict[str, Any], now: datetime) -> str:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    count = sum(int(s.get("restartCount") or 0) for s in statuses)
    finished = [
        str(((s.get("lastState") or {}).get("terminated") or {}).get("finishedAt") or "") for s in statuses
    ]
    latest = max((f for f in finished if f), default="")
    return f"{count} ({since(latest, now)} ago)" if count and latest else str(count)


def _pod_row(pod: dict[str, Any], now: datetime) -> list[Any]:
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    statuses = status.get("containerStatuses") or []
    ready = sum(1 for s in statuses if s.get("ready"))
    gates = spec.get("readinessGates") or []
    conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    gate_text = (
        f"{sum(1 for g in gates if conditions.get(g.get('conditionType')) == 'True')}/{len(gates)}"
        if gates
        else "<none>"
    )
    return [
        objects.name(pod),
        f"{ready}/{len(spec.get('containers') or [])}",
        pod_status(pod),
        _restarts(pod, now),
        _age(pod, now),
        status.get("podIP") or "<none>",
        spec.get("nodeName") or "<none>",
        status.get("nominatedNodeName") or "<none>",
        gate_text,
    ]


# --- nodes, events and the rest ----------------------------------------------------------------------


def _node_row(node: dict[str, Any], now: datetime) -> list[Any]:
    status = node.get("status") or {}
    ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
    state = "Unknown" if ready is None else ("Ready" if ready.get("status") == "True" else "NotReady")
    if (node.get("spec") or {}).get("unschedulable"):
        state += ",SchedulingDisabled"
    labels = objects.labels(node)
    roles = sorted(
        {k[len(_ROLE_PREFIX) :] for k in labels if k.startswith(_ROLE_PREFIX) and k != _ROLE_PREFIX}
        | ({labels["kubernetes.io/role"]} if labels.get("kubernetes.io/role") else set())
    )
    info = status.get("nodeInfo") or {}
    addresses = {a.get("type"): a.get("address") for a in status.get("addresses") or []}
    return [
        objects.name(node),
        state,
        ",".join(roles) or "<none>",
        _age(node, now),
        info.get("kubeletVersion") or "",
        addresses.get("InternalIP") or "<none>",
        addresses.get("ExternalIP") or "<none>",
        info.get("osImage") or "<unknown>",
        info.get("kernelVersion") or "<unknown>",
        info.get("containerRuntimeVersion") or "<unknown>",
    ]


def _event_row(event: dict[str, Any], now: datetime) -> list[Any]:
    involved = event.get("involvedObject") or event.get("regarding") or {}
    first = event.get("firstTimestamp") or event.get("deprecatedFirstTimestamp") or event.get("eventTime")
    last = (
        event.get("lastTimestamp") or event.get("deprecatedLastTimestamp") or event.get("eventTime") or first
    )
    count = int(event.get("count") or event.get("deprecatedCount") or 1)
    last_seen = since(last, now)
    if count > 1:
        last_seen = f"{last_seen} (x{count} over {since(first, now)})"
    source = event.get("source") or event.get("deprecatedSource") or {}
    component = (
        event.get("reportingComponent") or event.get("reportingController") or source.get("component") or ""
    )
    if source.get("host"):
        component = f"{component}, {source['host']}"
    return [
        last_seen,
        event.get("type") or "",
        event.get("reason") or "",
        f"{str(involved.get('kind') or '').lower()}/{involved.get('name') or ''}",
        involved.get("fieldPath") or "",
        component,
        event.get("message") or event.get("note") or "",
        since(first, now),
        count,
        objects.name(event),
    ]


def _quota_row(quota: dict[str, Any], now: datetime) -> list[Any]:
    status = quota.get("status") or {}
    hard, used = status.get("hard") or (quota.get("spec") or {}).get("hard") or {}, status.get("used") or {}
    requests: list[str] = []
    limits: list[str] = []
    for name in sorted(hard):
        text = f"{name}: {used.get(name, '0')}/{hard[name]}"
        (limits if name.startswith("limits.") else requests).append(text)
    return [objects.name(quota), _age(quota, now), ", ".join(requests), ", ".join(limits)]


Printer = Callable[[dict[str, Any], datetime], list[Any]]
_NAME_AGE: tuple[tuple[Column, ...], Printer] = (
    (Column("Name"), Column("Age")),
    lambda obj, now: [objects.name(obj), _age(obj, now)],
)
_EVENT_COLUMNS = (
    Column("Last Seen"),
    Column("Type"),
    Column("Reason"),
    Column("Object"),
    Column("Subobject", priority=1),
    Column("Source", priority=1),
    Column("Message"),
    Column("First Seen", priority=1),
    Column("Count", "integer", priority=1),
    Column("Name", priority=1),
)
PRINTERS: dict[str, tuple[tuple[Column, ...], Printer]] = {
    "pods": (
        (
            Column("Name"),
            Column("Ready"),
            Column("Status"),
            Column("Restarts"),
            Column("Age"),
            Column("IP", priority=1),
            Column("Node", priority=1),
            Column("Nominated Node", priority=1),
            Column("Readiness Gates", priority=1),
        ),
        _pod_row,
    ),
    "nodes": (
        (
            Column("Name"),
            Column("Status"),
            Column("Roles"),
            Column("Age"),
            Column("Version"),
            Column("Internal-IP", priority=1),
            Column("External-IP", priority=1),
            Column("OS-Image", priority=1),
            Column("Kernel-Version", priority=1),
            Column("Container-Runtime", priority=1),
        ),
        _node_row,
    ),
    "events": (_EVENT_COLUMNS, _event_row),
    "namespaces": (
        (Column("Name"), Column("Status"), Column("Age")),
        lambda ns, now: [objects.name(ns), (ns.get("status") or {}).get("phase", ""), _age(ns, now)],
    ),
    "resourcequotas": ((Column("Name"), Column("Age"), Column("Request"), Column("Limit")), _quota_row),
    "leases": (
        (Column("Name"), Column("Holder"), Column("Age")),
        lambda lease, now: [
            objects.name(lease),
            (lease.get("spec") or {}).get("holderIdentity") or "",
            _age(lease, now),
        ],
    ),
    "mutatingwebhookconfigurations": (
        (Column("Name"), Column("Webhooks", "integer"), Column("Age")),
        lambda mwc, now: [objects.name(mwc), len(mwc.get("webhooks") or []), _age(mwc, now)],
    ),
}


def _row_object(obj: dict[str, Any], include: str) -> dict[str, Any] | None:
    if include == "None":
        return None
    if include == "Object":
        return obj
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"]}


def table(
    plural: str,
    objects: Sequence[dict[str, Any]],
    meta: dict[str, Any],
    include: str = "Metadata",
    now: datetime | None = None,
) -> dict[str, Any]:
    """A ``meta.k8s.io/v1`` Table of ``objects`` (wire form) of one resource."""
    columns, printer = PRINTERS.get(plural, _NAME_AGE)
    moment = now or datetime.now(UTC)
    rows = []
    for obj in objects:
        row: dict[str, Any] = {"cells": printer(obj, moment)}
        embedded = _row_object(obj, include)
        if embedded is not None:
            row["object"] = embedded
        rows.append(row)
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": meta,
        "columnDefinitions": [c.to_json() for c in columns],
        "rows": rows,
    }
