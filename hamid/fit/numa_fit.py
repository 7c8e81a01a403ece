"""Fitting a pod's GPUs within the NUMA node(s) the predictor says kubelet will choose.

The predictor (:mod:`hamid.fit.numa_predict`) answers where kubelet's Topology Manager puts each
container; this module turns that into the GPU candidates each container may use and fits the
pod with the normal fit (every policy of :func:`hamid.fit.fit.fit_pod` applies inside the
restriction: binpack/spread, topology-aware, numa-bind, use/nouse lists). It also gives the
predictor's memo key for a pod (its shape), so equal pods share one prediction per ledger state.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

from hamid.fit.numa_predict import Prediction
from hamid.fit.replica_room import hidden_by_gpu, omitted_by_gpu
from hamid.fit.usage import NodeUsage
from hamid.model.devices import PodDevices
from hamid.model.numa import NO_TOPOLOGY

#: Per container (init first), the NUMA nodes its GPUs must be on; None: no restriction.
NumaTargets = tuple[frozenset[int] | None, ...]

_SHAPE_RESOURCE_KEYS = ("requests", "limits")


def _resources_key(resources: object) -> Hashable:
    if not isinstance(resources, Mapping):
        return None
    out = []
    for kind in _SHAPE_RESOURCE_KEYS:
        values = resources.get(kind)
        if isinstance(values, Mapping):
            out.append((kind, tuple(sorted((str(k), str(v)) for k, v in values.items()))))
    return tuple(out)


def pod_shape(pod: Mapping[str, Any]) -> Hashable:
    """What the predictor reads of a pod: each (init) container's resources and restart policy.

    Two pods with the same shape get the same prediction on the same ledger state, up to the
    container names (see :func:`renamed`). Pod-level ``spec.resources`` is part of it (the
    predictor answers ``unknown`` for it).
    """
    spec = pod.get("spec") or {}
    if not isinstance(spec, Mapping):
        return None
    parts: list[Hashable] = [repr(spec.get("resources")) if spec.get("resources") else None]
    for key in ("initContainers", "containers"):
        containers = spec.get(key) or []
        if not isinstance(containers, list):
            return (key, repr(containers))
        for c in containers:
            if not isinstance(c, Mapping):
                return (key, repr(c))
            parts.append((key, str(c.get("restartPolicy") or ""), _resources_key(c.get("resources"))))
    return tuple(parts)


def numa_targets(prediction: Prediction, resource: str, count: int) -> NumaTargets:
    """Per container the NUMA node(s) its ``resource`` replicas are predicted on (None: anywhere).

    A container with no replicas predicted on a NUMA node (no request, or devices without
    topology) is not restricted.
    """
    targets: list[frozenset[int] | None] = []
    for i in range(count):
        c = prediction.containers[i] if i < len(prediction.containers) else None
        per_numa = c.devices.get(resource, {}) if c is not None else {}
        nodes = frozenset(n for n, k in per_numa.items() if k > 0 and n != NO_TOPOLOGY)
        targets.append(nodes or None)
    return tuple(targets)


def follows_booking(prediction: Prediction, resource: str, devices: PodDevices, usage: NodeUsage) -> bool:
    """Whether kubelet, as predicted, gives each container its replicas on the NUMA nodes of the
    GPUs booked for it (``devices``), and those within the container's NUMA affinity (where its
    exclusive CPUs are): the pod then runs aligned on the GPUs its annotations name."""
    numa = {d.id: d.numa for d in usage.devices}
    for i, booked in enumerate(devices):
        if not booked:
            continue
        c = prediction.containers[i] if i < len(prediction.containers) else None
        given = frozenset(n for n, k in (c.devices.get(resource, {}) if c else {}).items() if k > 0)
        wanted = frozenset(numa.get(d.uuid, NO_TOPOLOGY) for d in booked)
        if c is None or given != wanted or not given <= c.numa:
            return False
    return True


def offered_targets(prediction: Prediction, resource: str, count: int) -> NumaTargets:
    """For an ``unknown`` prediction: per container the NUMA node(s) kubelet offers ``resource``
    from where the plugin's choice is what is not known (None: no restriction). Fitting the GPUs
    there lets hamid's plugin prefer them, so the prediction with them chosen is definite."""
    offered = prediction.offered.get(resource, {})
    return tuple(offered.get(i) or None for i in range(count))


def gpu_replicas(
    usage: NodeUsage, hide: str | None = None, keep: Mapping[str, int] | None = None
) -> dict[str, tuple[int, int]]:
    """Each GPU's NUMA bucket and free replicas (kubelet's free device IDs of it), for
    :class:`~hamid.fit.numa_predict.PluginView`; an unhealthy GPU offers kubelet none, nor those
    the plugin hides by rule ``hide`` (:mod:`hamid.fit.replica_room`; ``keep``: replicas per GPU
    a pending booking needs, which stay offered)."""
    hidden = hidden_by_gpu(usage, hide, keep)
    omitted = omitted_by_gpu(usage, hide, keep)
    return {
        d.id: (
            d.numa if d.numa >= 0 else NO_TOPOLOGY,
            max(d.count - d.used - hidden.get(d.id, 0) - omitted.get(d.id, 0), 0) if d.health else 0,
        )
        for d in usage.devices
    }
