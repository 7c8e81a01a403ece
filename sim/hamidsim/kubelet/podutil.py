"""Pod helpers kubelet takes from ``pkg/api/v1/pod``, ``v1qos`` and ``component-helpers/resource``."""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from hamid.model.errors import InvalidInput
from hamidsim.kubelet.quantity import parse_quantity


def _resources(container: Mapping[str, Any], section: str) -> Mapping[str, Any]:
    resources = container.get("resources") or {}
    if not isinstance(resources, Mapping):
        raise InvalidInput(f"container {container.get('name')!r}: resources must be an object")
    values = resources.get(section) or {}
    if not isinstance(values, Mapping):
        raise InvalidInput(f"container {container.get('name')!r}: resources.{section} must be an object")
    return values


def container_limits(container: Mapping[str, Any]) -> dict[str, Any]:
    """``resources.limits`` of a container (empty when unset)."""
    return dict(_resources(container, "limits"))


def container_requests(container: Mapping[str, Any]) -> dict[str, Any]:
    """``resources.requests`` after API-server defaulting (a limit without a request becomes the request)."""
    requests = dict(_resources(container, "requests"))
    for name, limit in _resources(container, "limits").items():
        requests.setdefault(name, limit)
    return requests


def pod_containers(pod: Mapping[str, Any]) -> list[tuple[dict[str, Any], bool]]:
    """``(container, is_init)`` for init containers then app containers (kubelet's admission order)."""
    spec = pod.get("spec") or {}
    if not isinstance(spec, Mapping):
        raise InvalidInput("pod spec must be an object")
    result: list[tuple[dict[str, Any], bool]] = []
    for key, is_init in (("initContainers", True), ("containers", False)):
        items = spec.get(key) or []
        if not isinstance(items, list) or not all(isinstance(c, dict) for c in items):
            raise InvalidInput(f"pod spec.{key} must be a list of objects")
        result.extend((c, is_init) for c in items)
    return result


def is_restartable_init(container: Mapping[str, Any]) -> bool:
    """A sidecar: an init container with ``restartPolicy: Always``."""
    return container.get("restartPolicy") == "Always"


def pod_qos_class(pod: Mapping[str, Any]) -> str:
    """``v1qos.GetPodQOS``: ``status.qosClass`` if set, else computed from cpu/memory requests and limits."""
    status = pod.get("status") or {}
    if isinstance(status, Mapping) and status.get("qosClass"):
        return str(status["qosClass"])
    requests: dict[str, Fraction] = {}
    limits: dict[str, Fraction] = {}
    guaranteed = True
    for container, _ in pod_containers(pod):
        name = container.get("name")
        for resource, raw in container_requests(container).items():
            if resource in ("cpu", "memory"):
                q = parse_quantity(raw, f"container {name!r} requests.{resource}")
                if q > 0:
                    requests[resource] = requests.get(resource, Fraction(0)) + q
        found: set[str] = set()
        for resource, raw in container_limits(container).items():
            if resource in ("cpu", "memory"):
                q = parse_quantity(raw, f"container {name!r} limits.{resource}")
                if q > 0:
                    found.add(resource)
                    limits[resource] = limits.get(resource, Fraction(0)) + q
        if found != {"cpu", "memory"}:
            guaranteed = False
    if not requests and not limits:
        return "BestEffort"
    if guaranteed:
        for resource, req in requests.items():
            if limits.get(resource) != req:
                guaranteed = False
                break
    if guaranteed and len(requests) == len(limits):
        return "Guaranteed"
    return "Burstable"


def pod_aggregate(pod: Mapping[str, Any], section: str, names: set[str] | None = None) -> dict[str, Fraction]:
    """``resource.PodRequests`` / ``PodLimits`` (no overhead): the larger of the long-running sum
    (app containers + sidecars) and each init container's peak (plus the sidecars started before it).

    ``section`` is ``"requests"`` or ``"limits"``; ``names`` keeps only those resources.
    """
    read = container_requests if section == "requests" else container_limits

    def values(container: Mapping[str, Any]) -> dict[str, Fraction]:
        where = f"container {container.get('name')!r} {section}"
        return {
            r: parse_quantity(v, f"{where}.{r}")
            for r, v in read(container).items()
            if names is None or r in names
        }

    long_running: dict[str, Fraction] = {}
    init_peak: dict[str, Fraction] = {}
    sidecars: dict[str, Fraction] = {}
    for container, is_init in pod_containers(pod):
        current = values(container)
        if is_init and not is_restartable_init(container):
            for r, q in current.items():
                init_peak[r] = max(init_peak.get(r, Fraction(0)), sidecars.get(r, Fraction(0)) + q)
            continue
        if is_init:
            for r, q in current.items():
                sidecars[r] = sidecars.get(r, Fraction(0)) + q
        for r, q in current.items():
            long_running[r] = long_running.get(r, Fraction(0)) + q
    return {
        r: max(long_running.get(r, Fraction(0)), init_peak.get(r, Fraction(0)))
        for r in long_running | init_peak
    }
