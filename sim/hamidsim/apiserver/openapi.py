"""``/openapi/v2`` and ``/openapi/v3`` for the served kinds, from the committed 1.35 definitions.

The paths follow the real server's shape (collection, item, ``/status`` and ``/binding`` paths per
resource, each operation tagged with ``x-kubernetes-action`` and ``x-kubernetes-group-version-kind``)
so kubectl finds what it looks for: the ``fieldValidation`` parameter on PATCH (then it leaves
validation to the server), a strategic-merge-patch request body (then ``apply`` computes its patch
from the schema's merge keys), and the kinds' schemas for ``explain``. Only the query parameters the
embedded server honours are listed (no ``dryRun``, no server-side apply).
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass, replace
from typing import Any

from hamidsim.apiserver.openapi_gen import DEFINITIONS_FILE
from hamidsim.apiserver.patch import PATCH_TYPES
from hamidsim.apiserver.resources import RESOURCES, Resource

_META = "io.k8s.apimachinery.pkg.apis.meta.v1."
_MEDIA = ["application/json", "application/yaml"]


@dataclass(frozen=True, slots=True)
class _Param:
    name: str
    where: str
    kind: str
    description: str


_NAME = _Param("name", "path", "string", "name of the object")
_NAMESPACE = _Param(
    "namespace", "path", "string", "object name and auth scope, such as for teams and projects"
)
_PRETTY = _Param("pretty", "query", "string", "If 'true', then the output is pretty printed.")
_FIELD_MANAGER = _Param(
    "fieldManager", "query", "string", "a name associated with the actor making these changes"
)
_FIELD_VALIDATION = _Param(
    "fieldValidation",
    "query",
    "string",
    "Ignore, Warn (the default) or Strict: how to treat fields the schema does not know.",
)
_LIST_PARAMS = tuple(
    _Param(name, "query", kind, text)
    for name, kind, text in (
        ("labelSelector", "string", "A selector to restrict the list of returned objects by their labels."),
        ("fieldSelector", "string", "A selector to restrict the list of returned objects by their fields."),
        ("limit", "integer", "Maximum number of responses to return for a list call."),
        ("continue", "string", "The continue option from a previous paginated list call."),
        ("resourceVersion", "string", "The resourceVersion to list or watch from."),
        ("watch", "boolean", "Watch for changes to the described resources."),
        ("timeoutSeconds", "integer", "Timeout for the list/watch call."),
        ("allowWatchBookmarks", "boolean", "Request watch events with type BOOKMARK."),
        (
            "sendInitialEvents",
            "boolean",
            "Begin the watch stream with synthetic events of the current state.",
        ),
    )
)
_WRITE_PARAMS = (_FIELD_MANAGER, _FIELD_VALIDATION)


@functools.cache
def definitions() -> dict[str, Any]:
    """The committed definitions (OpenAPI v2 form), keyed by their dotted Go type name."""
    document = json.loads(DEFINITIONS_FILE.read_text(encoding="utf-8"))
    found: dict[str, Any] = document["definitions"]
    return found


@functools.cache
def definition_name(group: str, version: str, kind: str) -> str | None:
    """The definition whose ``x-kubernetes-group-version-kind`` is this kind (meta/v1 types excluded)."""
    for name, schema in definitions().items():
        for gvk in schema.get("x-kubernetes-group-version-kind") or []:
            same = (gvk.get("group", ""), gvk.get("version"), gvk.get("kind")) == (group, version, kind)
            if same and not name.startswith(_META):
                return name
    return None


def resource_definition(resource: Resource) -> str | None:
    """The definition of a served resource's kind."""
    return definition_name(resource.group, resource.version, resource.kind)


def _gvk(resource: Resource, kind: str | None = None) -> dict[str, str]:
    return {"group": resource.group, "version": resource.version, "kind": kind or resource.kind}


def _camel(resource: Resource) -> str:
    group = "".join(part.capitalize() for part in resource.group.split(".")[0].split("-")) or "Core"
    return f"{group}{resource.version.capitalize()}"


@dataclass(frozen=True, slots=True)
class _Operation:
    """One operation before it is rendered in v2 or v3 form."""

    method: str
    action: str
    resource: Resource
    params: tuple[_Param, ...]
    response: str
    body: str | None = None
    body_types: tuple[str, ...] = ("application/json",)
    kind: str | None = None

    def operation_id(self, suffix: str) -> str:
        verb = {"post": "create", "put": "replace", "get": "read"}.get(self.action, self.action)
        namespaced = "Namespaced" if self.resource.namespaced and _NAMESPACE in self.params else ""
        return f"{verb}{_camel(self.resource)}{namespaced}{self.kind or self.resource.kind}{suffix}"


def _ref(name: str, version: int) -> dict[str, str]:
    prefix = "#/definitions/" if version == 2 else "#/components/schemas/"
    return {"$ref": prefix + name}


def _object_ops(
    resource: Resource, named: tuple[_Param, ...], kind_def: str, sub_kind: str | None
) -> dict[str, _Operation]:
    """get, put and patch of one object (or of its ``/status``: ``sub_kind`` names the operation)."""
    write = named + _WRITE_PARAMS
    patch = f"{_META}Patch"
    return {
        "get": _Operation("get", "get", resource, named, kind_def, kind=sub_kind),
        "put": _Operation("put", "put", resource, write, kind_def, kind_def, kind=sub_kind),
        "patch": _Operation("patch", "patch", resource, write, kind_def, patch, PATCH_TYPES, sub_kind),
    }


def _collection_ops(resource: Resource, scope: tuple[_Param, ...], kind_def: str) -> dict[str, _Operation]:
    """list, create and deletecollection on the collection path, as far as the resource allows them."""
    verbs = set(resource.verbs)
    list_def = definition_name(resource.group, resource.version, f"{resource.kind}List") or kind_def
    ops: dict[str, _Operation] = {}
    if "list" in verbs:
        ops["get"] = _Operation("get", "list", resource, scope + _LIST_PARAMS, list_def)
    if "create" in verbs:
        ops["post"] = _Operation("post", "post", resource, scope + _WRITE_PARAMS, kind_def, kind_def)
    if "deletecollection" in verbs:
        ops["delete"] = _Operation(
            "delete", "deletecollection", resource, scope + _LIST_PARAMS[:2], f"{_META}Status"
        )
    return ops


def _paths_of(resource: Resource, kind_def: str) -> dict[str, dict[str, _Operation]]:
    """Path -> HTTP method -> operation, for one resource."""
    prefix = "/api/v1" if not resource.group else f"/apis/{resource.group}/{resource.version}"
    scope = (_NAMESPACE,) if resource.namespaced else ()
    namespaced = f"{prefix}/namespaces/{{namespace}}/{resource.plural}"
    collection = namespaced if resource.namespaced else f"{prefix}/{resource.plural}"
    item, named = collection + "/{name}", (_NAME, *scope)
    paths = {collection: _collection_ops(resource, scope, kind_def)}
    if resource.namespaced and "list" in resource.verbs:
        list_all = _collection_ops(resource, (), kind_def)["get"]
        paths[f"{prefix}/{resource.plural}"] = {
            "get": replace(list_all, kind=f"{resource.kind}ForAllNamespaces")
        }
    if "get" in resource.verbs:
        delete = _Operation("delete", "delete", resource, named, f"{_META}Status", f"{_META}DeleteOptions")
        paths[item] = {**_object_ops(resource, named, kind_def, None), "delete": delete}
    if "status" in resource.subresources:
        paths[f"{item}/status"] = _object_ops(resource, named, kind_def, f"{resource.kind}Status")
    if "binding" in resource.subresources:
        binding = definition_name("", "v1", "Binding") or kind_def
        post = _Operation("post", "post", resource, named + _WRITE_PARAMS, binding, binding, kind="Binding")
        paths[f"{item}/binding"] = {"post": post}
    return {path: ops for path, ops in paths.items() if ops}


def _served() -> list[tuple[Resource, str]]:
    out = []
    for resource in RESOURCES:
        name = resource_definition(resource)
        if name is not None:
            out.append((resource, name))
    return out


def _gvk_of(op: _Operation) -> dict[str, str]:
    if op.kind == "Binding":
        return {"group": "", "version": "v1", "kind": "Binding"}
    return _gvk(op.resource)


def _v2_operation(op: _Operation) -> dict[str, Any]:
    params: list[dict[str, Any]] = [
        {"name": p.name, "in": p.where, "type": p.kind, "description": p.description, "uniqueItems": True}
        | ({"required": True} if p.where == "path" else {})
        for p in op.params
    ]
    if op.body is not None:
        params.append(
            {"name": "body", "in": "body", "required": op.method != "delete", "schema": _ref(op.body, 2)}
        )
    return {
        "operationId": op.operation_id(""),
        "consumes": list(op.body_types) if op.method == "patch" else ["*/*"],
        "produces": _MEDIA,
        "schemes": ["https"],
        "parameters": params,
        "responses": {
            "200": {"description": "OK", "schema": _ref(op.response, 2)},
            "401": {"description": "Unauthorized"},
        },
        "x-kubernetes-action": op.action,
        "x-kubernetes-group-version-kind": _gvk_of(op),
    }


def _v3_operation(op: _Operation) -> dict[str, Any]:
    params = [
        {
            "name": p.name,
            "in": p.where,
            "description": p.description,
            "schema": {"type": p.kind, "uniqueItems": True},
        }
        | ({"required": True} if p.where == "path" else {})
        for p in op.params
    ]
    out: dict[str, Any] = {
        "operationId": op.operation_id(""),
        "parameters": params,
        "responses": {
            "200": {"description": "OK", "content": {m: {"schema": _ref(op.response, 3)} for m in _MEDIA}},
            "401": {"description": "Unauthorized"},
        },
        "x-kubernetes-action": op.action,
        "x-kubernetes-group-version-kind": _gvk_of(op),
    }
    if op.body is not None:
        out["requestBody"] = {"content": {t: {"schema": _ref(op.body, 3)} for t in op.body_types}}
        if op.method != "delete":
            out["requestBody"]["required"] = True
    return out


@functools.cache
def v2_document() -> bytes:
    """``GET /openapi/v2`` (JSON)."""
    paths: dict[str, Any] = {}
    for resource, name in _served():
        for path, ops in _paths_of(resource, name).items():
            paths[path] = {method: _v2_operation(op) for method, op in ops.items()}
    doc = {
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": "v1.35.0"},
        "paths": paths,
        "definitions": definitions(),
    }
    return json.dumps(doc, separators=(",", ":")).encode()


def group_versions() -> list[str]:
    """``api/v1`` and ``apis/<group>/<version>`` for every served group version."""
    seen: list[str] = []
    for resource, _ in _served():
        key = "api/v1" if not resource.group else f"apis/{resource.group}/{resource.version}"
        if key not in seen:
            seen.append(key)
    return seen


def _v3_schema(node: Any) -> Any:
    """A v2 schema node in v3 form: ``#/components/schemas/`` refs, siblings of a ref under ``allOf``."""
    if isinstance(node, list):
        return [_v3_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _v3_schema(value) for key, value in node.items() if key != "$ref"}
    ref = node.get("$ref")
    if isinstance(ref, str):
        target = {"$ref": ref.replace("#/definitions/", "#/components/schemas/")}
        if not out:
            return target
        out["allOf"] = [target]
    return out


def _closure(names: set[str]) -> set[str]:
    pending, seen = list(names), set()
    defs = definitions()
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        text = json.dumps(defs[name])
        pending.extend(part.split('"', 1)[0] for part in text.split('"#/definitions/')[1:])
    return seen


@functools.cache
def v3_document(group_version: str) -> bytes | None:
    """``GET /openapi/v3/<group_version>`` (JSON), or ``None`` for a group version not served."""
    paths: dict[str, Any] = {}
    used: set[str] = set()
    for resource, name in _served():
        key = "api/v1" if not resource.group else f"apis/{resource.group}/{resource.version}"
        if key != group_version:
            continue
        for path, ops in _paths_of(resource, name).items():
            paths[path] = {method: _v3_operation(op) for method, op in ops.items()}
            for op in ops.values():
                used.update(n for n in (op.response, op.body) if n)
    if not paths:
        return None
    defs = definitions()
    schemas = {n: _v3_schema(defs[n]) for n in sorted(_closure(used))}
    doc = {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.35.0"},
        "paths": paths,
        "components": {"schemas": schemas},
    }
    return json.dumps(doc, separators=(",", ":")).encode()


def v3_index() -> dict[str, Any]:
    """``GET /openapi/v3``: each group version's document URL, with a content hash as real servers do."""
    paths = {}
    for key in group_versions():
        body = v3_document(key) or b""
        digest = hashlib.sha512(body).hexdigest().upper()
        paths[key] = {"serverRelativeURL": f"/openapi/v3/{key}?hash={digest}"}
    return {"paths": paths}
