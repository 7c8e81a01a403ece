"""PATCH bodies for the embedded API server: JSON merge patch, strategic merge patch, JSON patch.

Strategic merge patch follows the real server for maps (recursive merge, ``null`` deletes) and for
the lists hamid and kubelets touch that have a merge key in the Kubernetes schema (containers by
``name``, conditions by ``type``, ...). Any other list is replaced as a whole. ``$patch: delete`` on a
list item removes it; ``$patch: replace`` on a map replaces it; other ``$`` directives are dropped.
"""

from __future__ import annotations

import copy
from typing import Any

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
PATCH_TYPES = (MERGE_PATCH, STRATEGIC_MERGE_PATCH, JSON_PATCH)

#: Lists merged by key under strategic merge patch (field name -> merge key), from the API schema.
STRATEGIC_MERGE_KEYS: dict[str, str] = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "containerStatuses": "name",
    "initContainerStatuses": "name",
    "ephemeralContainerStatuses": "name",
    "conditions": "type",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "imagePullSecrets": "name",
    "addresses": "type",
    "ownerReferences": "uid",
    "ports": "containerPort",
    "hostAliases": "ip",
    "readinessGates": "conditionType",
}


class PatchError(ValueError):
    """The patch is malformed (400) or cannot be applied to this object (422)."""

    def __init__(self, message: str, *, unprocessable: bool) -> None:
        super().__init__(message)
        self.unprocessable = unprocessable


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch; returns a new value and never mutates ``target`` or ``patch``."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """Strategic merge patch as described in the module docstring; returns a new value."""
    return _strategic(target, patch, field="")


def _strategic(target: Any, patch: Any, field: str) -> Any:
    if isinstance(patch, dict):
        if patch.get("$patch") == "replace":
            return {k: copy.deepcopy(v) for k, v in patch.items() if not k.startswith("$")}
        if patch.get("$patch") == "delete":
            return None
        result = dict(target) if isinstance(target, dict) else {}
        for key, value in patch.items():
            if key.startswith("$"):
                continue
            if value is None:
                result.pop(key, None)
                continue
            merged = _strategic(result.get(key), value, field=key)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
        return result
    if isinstance(patch, list):
        merge_key = STRATEGIC_MERGE_KEYS.get(field)
        if merge_key is not None and isinstance(target, list) and _keyed(target, merge_key):
            return _merge_keyed_list(target, patch, merge_key)
        return [_strip_directives(item) for item in patch if not _is_delete(item)]
    return copy.deepcopy(patch)


def _keyed(items: list[Any], key: str) -> bool:
    return all(isinstance(item, dict) and key in item for item in items)


def _is_delete(item: Any) -> bool:
    return isinstance(item, dict) and item.get("$patch") == "delete"


def _strip_directives(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_directives(v) for k, v in value.items() if not k.startswith("$")}
    if isinstance(value, list):
        return [_strip_directives(v) for v in value]
    return value


def _merge_keyed_list(target: list[Any], patch: list[Any], key: str) -> list[Any]:
    if not _keyed(patch, key):
        raise PatchError(
            f"strategic merge patch: every item of a list merged by {key!r} needs {key!r}", unprocessable=True
        )
    result = [dict(item) for item in target]
    index = {item[key]: pos for pos, item in enumerate(result)}
    deleted: set[Any] = set()
    for item in patch:
        name = item[key]
        if _is_delete(item):
            deleted.add(name)
        elif name in index:
            result[index[name]] = _strategic(result[index[name]], item, field="")
        else:
            index[name] = len(result)
            result.append(_strip_directives(item))
    return [item for item in result if item[key] not in deleted]


# --- RFC 6902 JSON patch -------------------------------------------------------------------------


def json_patch(target: Any, operations: Any) -> Any:
    """Apply an RFC 6902 JSON patch (add, remove, replace, test, move, copy) to a copy of ``target``."""
    if not isinstance(operations, list):
        raise PatchError("a JSON patch must be a JSON array of operations", unprocessable=False)
    doc = copy.deepcopy(target)
    for op in operations:
        if (
            not isinstance(op, dict)
            or not isinstance(op.get("op"), str)
            or not isinstance(op.get("path"), str)
        ):
            raise PatchError(f"malformed JSON patch operation: {op!r}", unprocessable=False)
        doc = _apply_op(doc, op)
    return doc


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"JSON pointer {path!r} must start with '/'", unprocessable=False)
    return [part.replace("~1", "/").replace("~0", "~") for part in path[1:].split("/")]


def _value(op: dict[str, Any]) -> Any:
    if "value" not in op:
        raise PatchError(
            f"JSON patch operation {op['op']!r} at {op['path']!r} needs a value", unprocessable=False
        )
    return copy.deepcopy(op["value"])


def _list_index(container: list[Any], token: str, path: str, *, insert: bool) -> int:
    if insert and token == "-":
        return len(container)
    if not (token.isascii() and token.isdigit()) or (token.startswith("0") and token != "0"):
        raise PatchError(f"invalid array index {token!r} in {path!r}", unprocessable=True)
    index = int(token)
    limit = len(container) if insert else len(container) - 1
    if index > limit:
        raise PatchError(f"array index {index} out of range in {path!r}", unprocessable=True)
    return index


def _parent(doc: Any, parts: list[str], path: str) -> Any:
    node = doc
    for token in parts[:-1]:
        node = _child(node, token, path)
    return node


def _child(node: Any, token: str, path: str) -> Any:
    if isinstance(node, dict):
        if token not in node:
            raise PatchError(f"path {path!r} does not exist", unprocessable=True)
        return node[token]
    if isinstance(node, list):
        return node[_list_index(node, token, path, insert=False)]
    raise PatchError(f"path {path!r} does not exist", unprocessable=True)


def _get(doc: Any, path: str) -> Any:
    node = doc
    for token in _pointer(path):
        node = _child(node, token, path)
    return node


def _add(doc: Any, path: str, value: Any) -> Any:
    parts = _pointer(path)
    if not parts:
        return value
    parent = _parent(doc, parts, path)
    token = parts[-1]
    if isinstance(parent, dict):
        parent[token] = value
    elif isinstance(parent, list):
        parent.insert(_list_index(parent, token, path, insert=True), value)
    else:
        raise PatchError(f"path {path!r} does not exist", unprocessable=True)
    return doc


def _remove(doc: Any, path: str) -> tuple[Any, Any]:
    parts = _pointer(path)
    if not parts:
        raise PatchError("cannot remove the whole document", unprocessable=True)
    parent = _parent(doc, parts, path)
    token = parts[-1]
    if isinstance(parent, dict):
        if token not in parent:
            raise PatchError(f"path {path!r} does not exist", unprocessable=True)
        return doc, parent.pop(token)
    if isinstance(parent, list):
        return doc, parent.pop(_list_index(parent, token, path, insert=False))
    raise PatchError(f"path {path!r} does not exist", unprocessable=True)


def _replace(doc: Any, path: str, value: Any) -> Any:
    parts = _pointer(path)
    if not parts:
        return value
    parent = _parent(doc, parts, path)
    token = parts[-1]
    if isinstance(parent, dict) and token in parent:
        parent[token] = value
    elif isinstance(parent, list):
        parent[_list_index(parent, token, path, insert=False)] = value
    else:
        raise PatchError(f"path {path!r} does not exist", unprocessable=True)
    return doc


def _apply_op(doc: Any, op: dict[str, Any]) -> Any:
    kind, path = op["op"], op["path"]
    if kind == "add":
        return _add(doc, path, _value(op))
    if kind == "remove":
        return _remove(doc, path)[0]
    if kind == "replace":
        return _replace(doc, path, _value(op))
    if kind == "test":
        if _get(doc, path) != op.get("value"):
            raise PatchError(f"test operation failed at {path!r}", unprocessable=True)
        return doc
    if kind in ("move", "copy"):
        source = op.get("from")
        if not isinstance(source, str):
            raise PatchError(f"JSON patch {kind!r} needs a 'from' path", unprocessable=False)
        if kind == "move":
            if path.startswith(source + "/"):
                raise PatchError(f"cannot move {source!r} into its own child {path!r}", unprocessable=True)
            doc, value = _remove(doc, source)
        else:
            value = copy.deepcopy(_get(doc, source))
        return _add(doc, path, value)
    raise PatchError(f"unknown JSON patch operation {kind!r}", unprocessable=False)


def apply_patch(content_type: str, target: dict[str, Any], body: Any) -> Any:
    """Apply a PATCH body of one of :data:`PATCH_TYPES` to ``target`` (not mutated)."""
    if content_type == JSON_PATCH:
        return json_patch(target, body)
    if not isinstance(body, dict):
        raise PatchError("a merge patch must be a JSON object", unprocessable=False)
    if content_type == MERGE_PATCH:
        return merge_patch(target, body)
    return strategic_merge_patch(target, body)
