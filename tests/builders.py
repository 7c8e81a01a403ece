"""Kubernetes objects in wire-JSON form for tests: one builder per kind, minimal unless asked.

Tests state only what they are about (a label, a GPU limit, a node name); the rest is the smallest
object the API server accepts. Resource amounts are passed through as given (strings or numbers).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from hamid.model.kube import JSON


def container(
    name: str = "main",
    *,
    image: str = "busybox",
    limits: Mapping[str, Any] | None = None,
    requests: Mapping[str, Any] | None = None,
    **fields: Any,
) -> JSON:
    """A container; ``resources`` only when limits or requests are given; ``fields`` added as-is."""
    out: JSON = {"name": name, "image": image}
    resources: JSON = {}
    if limits is not None:
        resources["limits"] = dict(limits)
    if requests is not None:
        resources["requests"] = dict(requests)
    if resources:
        out["resources"] = resources
    return out | fields


def pod(
    name: str,
    namespace: str = "default",
    node: str | None = None,
    *,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    uid: str | None = None,
    containers: Iterable[Mapping[str, Any]] | None = None,
    init_containers: Iterable[Mapping[str, Any]] = (),
    scheduler: str | None = None,
    status: Mapping[str, Any] | None = None,
    spec: Mapping[str, Any] | None = None,
) -> JSON:
    """A pod (one ``main`` busybox container unless ``containers``); ``spec`` fields added as-is."""
    meta: JSON = {"name": name, "namespace": namespace, "labels": dict(labels or {})}
    if annotations is not None:
        meta["annotations"] = dict(annotations)
    if uid is not None:
        meta["uid"] = uid
    body: JSON = {"containers": [dict(c) for c in containers] if containers is not None else [container()]}
    if init_containers:
        body["initContainers"] = [dict(c) for c in init_containers]
    if node is not None:
        body["nodeName"] = node
    if scheduler is not None:
        body["schedulerName"] = scheduler
    out: JSON = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": body | dict(spec or {})}
    if status is not None:
        out["status"] = dict(status)
    return out


def node(
    name: str,
    *,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    allocatable: Mapping[str, Any] | None = None,
    capacity: Mapping[str, Any] | None = None,
) -> JSON:
    """A node; ``status`` only when allocatable or capacity is given."""
    meta: JSON = {"name": name, "labels": dict(labels or {})}
    if annotations is not None:
        meta["annotations"] = dict(annotations)
    out: JSON = {"apiVersion": "v1", "kind": "Node", "metadata": meta}
    status: JSON = {}
    if allocatable is not None:
        status["allocatable"] = dict(allocatable)
    if capacity is not None:
        status["capacity"] = dict(capacity)
    if status:
        out["status"] = status
    return out


def quota(name: str, namespace: str, hard: Mapping[str, Any]) -> JSON:
    """A ResourceQuota with ``spec.hard``."""
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"hard": dict(hard)},
    }
