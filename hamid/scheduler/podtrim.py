"""The scheduler's pod records: a pod trimmed to the fields the scheduler reads, strings shared.

The pod cache keeps one record per pod of the cluster, so its size is most of the scheduler's
memory. A record keeps only what accounting, bind, the node lock, refit and Events read, and
shares what pods repeat: short strings (namespaces, node and container names, resource names
and quantities, label and annotation keys) are interned, and equal parts (a container's name and
resources, the container list) are one object for every pod that has them — the replicas of a
workload hold one copy. Records are therefore read-only: nothing may change a
cached pod in place, and their type (:class:`hamid.model.kube.Pod`) makes a write a type error.
"""

from __future__ import annotations

import sys
from collections.abc import Hashable
from typing import Any

from hamid.model import annotations as ann
from hamid.model.booked import booked_conditions
from hamid.model.kube import JSON, Pod, view

#: The pod annotations the scheduler can read (every key hamid defines). Others
#: (``kubectl.kubernetes.io/last-applied-configuration`` — a copy of the whole spec —, tooling
#: notes) stay out of its pod cache.
_KEPT_ANNOTATIONS = frozenset(ann.HAMID_ANNOTATION_KEYS)
_POD_METADATA_KEYS = ("name", "namespace", "uid", "resourceVersion", "labels", "deletionTimestamp")
#: Metadata values shared across pods (the others are unique to a pod).
_SHARED_METADATA = frozenset({"namespace", "labels"})
_CONTAINER_KEYS = ("name", "resources", "restartPolicy")
#: Strings no longer than this are interned (names, quantities, phases); longer ones are unique.
_SHARED_LEN = 64
#: Distinct shared parts kept for reuse; past this the table starts afresh (records keep theirs).
_PARTS_MAX = 1 << 14
_parts: dict[Hashable, Any] = {}


def _shared(value: Any) -> Any:
    """``value`` with its strings interned (short ones) and its containers rebuilt alike."""
    if isinstance(value, str):
        return sys.intern(value) if len(value) <= _SHARED_LEN else value
    if isinstance(value, dict):
        return {_shared(k): _shared(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shared(v) for v in value]
    return value


def _frozen(value: Any) -> Hashable:
    """A hashable stand-in equal for equal JSON values of the same types (``1`` is not ``True``)."""
    if isinstance(value, dict):
        return (dict, tuple((k, _frozen(v)) for k, v in value.items()))
    if isinstance(value, list):
        return (list, tuple(_frozen(v) for v in value))
    return (type(value), value)


def _one_copy(value: Any) -> Any:
    """The shared object equal to JSON part ``value`` (``value`` itself when first seen)."""
    key = _frozen(value)
    found = _parts.get(key)
    if found is None:
        if len(_parts) >= _PARTS_MAX:
            _parts.clear()
        found = _parts[key] = value
    return found


def _trim_container(container: Any) -> Any:
    if not isinstance(container, dict):
        return container
    return _one_copy({k: _shared(container[k]) for k in _CONTAINER_KEYS if k in container})


def _trim_containers(containers: Any) -> Any:
    if not isinstance(containers, list):
        return containers  # malformed: kept as is, so the reader reports it
    return _one_copy([_trim_container(c) for c in containers])


def _trim_init_statuses(statuses: Any) -> Any:
    """Name and ``state.terminated.exitCode`` of each init container status (what init release reads)."""
    if not isinstance(statuses, list):
        return statuses
    out = []
    for status in statuses:
        if not isinstance(status, dict):
            out.append(status)
            continue
        kept: JSON = {"name": _shared(status.get("name"))}
        terminated = (status.get("state") or {}).get("terminated")
        if isinstance(terminated, dict):
            kept["state"] = {"terminated": {"exitCode": terminated.get("exitCode")}}
        out.append(kept)
    return out


def _trim_annotations(annotations: dict[str, Any]) -> JSON:
    """hamid's annotations, under the canonical key strings; equal values share one string."""
    out: JSON = {}
    seen: dict[Any, Any] = {}
    for key, value in annotations.items():
        if key in _KEPT_ANNOTATIONS:
            value = _shared(value)
            out[sys.intern(key)] = seen.setdefault(value, value) if isinstance(value, str) else value
    return out


def trim_scheduler_pod(pod: JSON) -> Pod:
    """The fields of a pod the scheduler reads, for its pod cache (a new dict; ``pod`` unchanged).

        metadata: name, namespace, uid, resourceVersion, labels, deletionTimestamp and hamid's own
        annotations; spec: nodeName, schedulerName, overhead and each (init) container's name, resources and
        restartPolicy; status: phase, each init container's name and exit code, and the scheduler's
    booked-allocation condition. Accounting,
        bind, the node lock, refit and Events read nothing else, and a rebuild from trimmed pods
        equals one from full pods. Env, volumes, probes, images, managedFields, conditions and the
        other conditions and the app containers' statuses — most of a pod's bytes — are dropped.
    """
    meta = pod.get("metadata") or {}
    out_meta: JSON = {
        k: (_shared(meta[k]) if k in _SHARED_METADATA else meta[k]) for k in _POD_METADATA_KEYS if k in meta
    }
    annotations = meta.get("annotations")
    if isinstance(annotations, dict):
        out_meta["annotations"] = _trim_annotations(annotations)
    out: JSON = {k: _shared(pod[k]) for k in ("apiVersion", "kind") if k in pod}
    out["metadata"] = out_meta
    spec = pod.get("spec")
    if isinstance(spec, dict):
        out_spec: JSON = {k: _shared(spec[k]) for k in ("nodeName", "schedulerName", "overhead") if k in spec}
        for key in ("initContainers", "containers"):
            if key in spec:
                out_spec[key] = _trim_containers(spec[key])
        out["spec"] = out_spec
    status = pod.get("status")
    if isinstance(status, dict):
        out_status: JSON = {k: _shared(status[k]) for k in ("phase",) if k in status}
        if "initContainerStatuses" in status:
            out_status["initContainerStatuses"] = _trim_init_statuses(status["initContainerStatuses"])
        booked = booked_conditions(status.get("conditions"))
        if booked:
            out_status["conditions"] = booked
        out["status"] = out_status
    return view(Pod, out)
