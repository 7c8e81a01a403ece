"""What a real API server fills in when an object is created (defaulting and default admission).

Pods get the values ``kubectl get pod -o yaml`` shows on a real cluster: ``schedulerName``,
``restartPolicy``, ``dnsPolicy``, ``terminationGracePeriodSeconds``, ``serviceAccountName`` (and the
deprecated ``serviceAccount``), ``securityContext``, ``enableServiceLinks``, ``preemptionPolicy``,
``priority``, the not-ready/unreachable tolerations of 300 s; per container the termination message
settings, ``imagePullPolicy``, port protocols and requests defaulted from limits. Quantities keep the
text they were sent in (a JSON number becomes its decimal string, as the real server renders it).
``status`` starts ``Pending`` with the pod's QoS class. Namespaces get their finalizer and the
``kubernetes.io/metadata.name`` label.

Not done: the ServiceAccount token volume (no token controller runs here) and LimitRange defaults.
"""

from __future__ import annotations

from typing import Any

from hamid.model.errors import InvalidInput
from hamidsim.apiserver.errors import invalid
from hamidsim.kubelet.podutil import pod_qos_class

NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
DEFAULT_TOLERATION_SECONDS = 300
_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")


def _quantity_text(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return value
    return str(value) if isinstance(value, int) or not value.is_integer() else str(int(value))


def _numeric(section: Any) -> bool:
    return isinstance(section, dict) and any(
        isinstance(v, int | float) and not isinstance(v, bool) for v in section.values()
    )


def quantities_as_text(obj: dict[str, Any]) -> None:
    """Render numeric container quantities of a pod as strings, as the real server stores them.

    Copy-on-write: only the containers that carry a number are rebuilt (stored versions share
    subtrees, so nothing reachable from an older version is mutated).
    """
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    new_spec = None
    for key in ("containers", "initContainers"):
        containers = spec.get(key)
        if not isinstance(containers, list):
            continue
        changed = False
        rebuilt = []
        for container in containers:
            resources = container.get("resources") if isinstance(container, dict) else None
            if isinstance(resources, dict) and any(
                _numeric(resources.get(s)) for s in ("limits", "requests")
            ):
                fixed = {
                    s: {k: _quantity_text(v) for k, v in section.items()}
                    if isinstance(section, dict)
                    else section
                    for s, section in resources.items()
                }
                container = {**container, "resources": fixed}
                changed = True
            rebuilt.append(container)
        if changed:
            new_spec = {**(new_spec or spec), key: rebuilt}
    if new_spec is not None:
        obj["spec"] = new_spec


def _container(container: dict[str, Any]) -> dict[str, Any]:
    out = dict(container)
    out.setdefault("terminationMessagePath", "/dev/termination-log")
    out.setdefault("terminationMessagePolicy", "File")
    image = str(out.get("image") or "")
    tag = image.rsplit("/", 1)[-1]
    latest = "@" not in tag and (":" not in tag or tag.endswith(":latest"))
    out.setdefault("imagePullPolicy", "Always" if latest else "IfNotPresent")
    if isinstance(out.get("ports"), list):
        out["ports"] = [{"protocol": "TCP", **p} if isinstance(p, dict) else p for p in out["ports"]]
    resources = out.get("resources")
    if isinstance(resources, dict):
        resources = dict(resources)
        for section in ("limits", "requests"):
            if isinstance(resources.get(section), dict):
                resources[section] = {k: _quantity_text(v) for k, v in resources[section].items()}
        limits = resources.get("limits")
        if isinstance(limits, dict) and limits:
            requests = resources.get("requests")
            resources["requests"] = {**limits, **(requests if isinstance(requests, dict) else {})}
        out["resources"] = resources
    else:
        out.setdefault("resources", {})
    return out


def _tolerations(spec: dict[str, Any]) -> list[Any]:
    tolerations = list(spec.get("tolerations") or [])
    for taint in _TAINTS:
        covered = any(
            isinstance(t, dict)
            and t.get("effect") in (None, "", "NoExecute")
            and (t.get("key") == taint or (not t.get("key") and t.get("operator") == "Exists"))
            for t in tolerations
        )
        if not covered:
            tolerations.append(
                {
                    "key": taint,
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": DEFAULT_TOLERATION_SECONDS,
                }
            )
    return tolerations


def default_pod(obj: dict[str, Any]) -> None:
    """Fill a new pod's defaults in place (``obj`` is a fresh copy); status becomes Pending + QoS."""
    spec = dict(obj.get("spec") or {})
    for key, value in (
        ("schedulerName", "default-scheduler"),
        ("restartPolicy", "Always"),
        ("dnsPolicy", "ClusterFirst"),
        ("terminationGracePeriodSeconds", 30),
        ("securityContext", {}),
        ("enableServiceLinks", True),
        ("preemptionPolicy", "PreemptLowerPriority"),
        ("priority", 0),
    ):
        spec.setdefault(key, value)
    account = spec.get("serviceAccountName") or spec.get("serviceAccount") or "default"
    spec["serviceAccountName"] = spec["serviceAccount"] = account
    for key in ("containers", "initContainers"):
        if isinstance(spec.get(key), list):
            spec[key] = [_container(c) if isinstance(c, dict) else c for c in spec[key]]
    spec["tolerations"] = _tolerations(spec)
    obj["spec"] = spec
    try:
        qos = pod_qos_class({"spec": spec})
    except InvalidInput as err:
        raise invalid("pods", str(obj["metadata"].get("name", "")), str(err)) from err
    obj["status"] = {"phase": "Pending", "qosClass": qos}


def apply_create_defaults(plural: str, obj: dict[str, Any]) -> None:
    """Defaults of a new object of resource ``plural`` (in place)."""
    if plural == "pods":
        default_pod(obj)
    elif plural == "namespaces":
        obj["spec"] = {"finalizers": ["kubernetes"], **(obj.get("spec") or {})}
        obj["status"] = {"phase": "Active"}
        meta = obj["metadata"]
        meta["labels"] = {**(meta.get("labels") or {}), NAMESPACE_NAME_LABEL: meta["name"]}
