"""Regenerate ``data/definitions.json``: the Kubernetes 1.35 schemas of the kinds the server holds.

The source is the 1.35 JSON Schema set shipped by ``kubernetes-validate`` (a test dependency, so the
result is committed): ``python -m hamidsim.apiserver.openapi_gen``. The schemas are turned back into
the OpenAPI form the real API server serves (``#/definitions/`` references, one ``type`` per schema,
``int-or-string`` and quantity strings), keeping every ``x-kubernetes-*`` extension, and cut down to
the definitions reachable from the served kinds, their lists and the ``meta/v1`` request types.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from hamidsim.apiserver.resources import RESOURCES

SCHEMA_VERSION = "v1.35.0"
DEFINITIONS_FILE = Path(__file__).with_name("data") / "definitions.json"
_META = "io.k8s.apimachinery.pkg.apis.meta.v1."
#: Request and response types every path refers to besides the kinds themselves.
EXTRA_ROOTS = (f"{_META}Status", f"{_META}DeleteOptions", f"{_META}WatchEvent", f"{_META}Patch")
_INT_OR_STRING = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"
_QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"


def _json_schema_definitions() -> dict[str, Any]:
    """The ``$defs`` of kubernetes-validate's 1.35 schema set."""
    root = resources.files("kubernetes_validate") / "kubernetes-json-schema" / f"{SCHEMA_VERSION}-local"
    return dict(json.loads((root / "_definitions.json").read_text(encoding="utf-8"))["$defs"])


def _to_openapi(node: Any, *, top: bool = False) -> Any:
    """One JSON Schema node in the API server's OpenAPI v2 form."""
    if isinstance(node, list):
        return [_to_openapi(item) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "$ref":
            out[key] = "#/definitions/" + str(value).rsplit("/", 1)[-1]
        elif key == "type" and isinstance(value, list):
            out[key] = next(t for t in value if t != "null")
        elif key == "properties":
            out[key] = {name: _property(name, prop, top) for name, prop in value.items()}
        else:
            out[key] = _to_openapi(value)
    return out


def _property(name: str, prop: Any, top: bool) -> Any:
    converted = _to_openapi(prop)
    if top and name in ("apiVersion", "kind") and isinstance(converted, dict):
        converted.pop("enum", None)  # added by the JSON Schema conversion, not in the API's schema
    return converted


def _convert(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    description = schema.get("description")
    if name == _INT_OR_STRING:
        return {"description": description or "", "type": "string", "format": "int-or-string"}
    if name == _QUANTITY:
        return {"description": description or "", "type": "string"}
    converted: dict[str, Any] = _to_openapi(schema, top=True)
    return converted


def _references(node: Any, found: set[str]) -> None:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str):
            found.add(ref.rsplit("/", 1)[-1])
        for value in node.values():
            _references(value, found)
    elif isinstance(node, list):
        for item in node:
            _references(item, found)


def root_names(definitions: dict[str, Any]) -> list[str]:
    """Definitions of the served kinds (and their lists) plus :data:`EXTRA_ROOTS`."""
    wanted = {(r.group, r.version, kind) for r in RESOURCES for kind in (r.kind, f"{r.kind}List")}
    names = [
        name
        for name, schema in definitions.items()
        if any(
            (gvk.get("group", ""), gvk.get("version"), gvk.get("kind")) in wanted
            for gvk in schema.get("x-kubernetes-group-version-kind") or []
        )
        and not name.startswith(_META)
    ]
    return sorted(set(names) | set(EXTRA_ROOTS))


def build_definitions(source: dict[str, Any]) -> dict[str, Any]:
    """The closure of :func:`root_names` in OpenAPI form, sorted by name."""
    pending = root_names(source)
    kept: dict[str, Any] = {}
    while pending:
        name = pending.pop()
        if name in kept:
            continue
        kept[name] = _convert(name, source[name])
        refs: set[str] = set()
        _references(source[name], refs)
        pending.extend(sorted(refs - kept.keys()))
    return {"version": SCHEMA_VERSION, "definitions": dict(sorted(kept.items()))}


def main() -> None:
    """Write :data:`DEFINITIONS_FILE`."""
    document = build_definitions(_json_schema_definitions())
    DEFINITIONS_FILE.write_text(json.dumps(document, separators=(",", ":"), sort_keys=True), encoding="utf-8")
    print(f"wrote {len(document['definitions'])} definitions to {DEFINITIONS_FILE}")


if __name__ == "__main__":
    main()
