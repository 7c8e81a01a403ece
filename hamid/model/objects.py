"""Reading Kubernetes objects in their wire-JSON dict form: one place for ``metadata`` access.

Objects reach hamid as decoded JSON, where any field may be missing or ``null``. These accessors
give the value Go's typed client would (empty string, empty mapping) so callers never spell out
``(obj.get("metadata") or {}).get(...)`` chains; the order of resourceVersions (which caches,
the reconcile, HA sync and refit compare) is defined here too. Pure: no I/O, usable by every layer.
"""

from collections.abc import Mapping
from typing import Any, TypeGuard

_EMPTY: Mapping[str, Any] = {}


def _is_mapping(value: object) -> TypeGuard[Mapping[str, Any]]:
    """``isinstance(value, Mapping)``, decoded JSON's ``dict`` first (the ABC check is slow, and
    these accessors run for every field of every watch event)."""
    return type(value) is dict or isinstance(value, Mapping)


def metadata(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """``obj.metadata`` (empty when missing, null or not an object)."""
    meta = obj.get("metadata") if obj else None
    return meta if _is_mapping(meta) else _EMPTY


def _text(obj: Mapping[str, Any] | None, field: str) -> str:
    value = metadata(obj).get(field)
    return value if isinstance(value, str) else ("" if value is None else str(value))


def name(obj: Mapping[str, Any] | None) -> str:
    """``metadata.name`` ("" when missing)."""
    return _text(obj, "name")


def namespace(obj: Mapping[str, Any] | None) -> str:
    """``metadata.namespace`` ("" when missing or cluster-scoped)."""
    return _text(obj, "namespace")


def uid(obj: Mapping[str, Any] | None) -> str:
    """``metadata.uid`` ("" when missing)."""
    return _text(obj, "uid")


def resource_version(obj: Mapping[str, Any] | None) -> str:
    """``metadata.resourceVersion`` ("" when missing)."""
    return _text(obj, "resourceVersion")


def annotations(obj: Mapping[str, Any] | None) -> Mapping[str, str]:
    """``metadata.annotations`` (empty when missing or null)."""
    value = metadata(obj).get("annotations")
    return value if _is_mapping(value) else _EMPTY


def labels(obj: Mapping[str, Any] | None) -> Mapping[str, str]:
    """``metadata.labels`` (empty when missing or null)."""
    value = metadata(obj).get("labels")
    return value if _is_mapping(value) else _EMPTY


def object_key(obj: Mapping[str, Any] | None) -> str:
    """``namespace/name`` for namespaced objects, ``name`` for cluster-scoped ones (client-go's key)."""
    ns = namespace(obj)
    return f"{ns}/{name(obj)}" if ns else name(obj)


def namespaced_key(obj: Mapping[str, Any] | None) -> str:
    """``namespace/name`` even when the namespace is empty (how pods are named in logs and locks)."""
    return f"{namespace(obj)}/{name(obj)}"


def section(obj: Mapping[str, Any] | None, field: str) -> Mapping[str, Any]:
    """A top-level object section such as ``spec`` or ``status`` (empty when missing or null)."""
    value = obj.get(field) if obj else None
    return value if _is_mapping(value) else _EMPTY


# resourceVersion order. Clients must treat resourceVersions as opaque, but the API server's are
# etcd revisions and compare as integers; equal strings are the same version whatever they hold.


def version_number(resource_version: str | None) -> int | None:
    """A resourceVersion as an integer, or None when it is empty or not one."""
    try:
        return int(resource_version or "")
    except ValueError:
        return None


def version_at_least(version: str | None, target: str | None) -> bool | None:
    """Whether ``version`` is ``target`` or later; None when the two cannot be ordered."""
    if version and version == target:
        return True
    have, want = version_number(version), version_number(target)
    if have is None or want is None:
        return None
    return have >= want


def newer_than(version: str, list_version: str) -> bool:
    """Whether an object at ``version`` may be newer than a list taken at ``list_version``.

    Versions that cannot be ordered count as possibly newer (leave the object alone); "" never does.
    """
    return bool(version) and version_at_least(list_version, version) is not True
