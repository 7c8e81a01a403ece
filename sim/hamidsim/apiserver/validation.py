"""Field validation as the real API server does it (``fieldValidation=Strict|Warn|Ignore``).

An object's fields are checked against the served 1.35 schema: a field the schema does not know is
an error under ``Strict`` (400, nothing stored), a ``Warning`` header under ``Warn`` and nothing under
``Ignore``. Unlike the real server, a request without the parameter is not checked (the real server
warns), and unknown fields are never pruned from what is stored.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from hamidsim.apiserver.errors import bad_request
from hamidsim.apiserver.openapi import definitions, resource_definition
from hamidsim.apiserver.resources import Resource

DIRECTIVES = ("Ignore", "Warn", "Strict")
_PRESERVE = "x-kubernetes-preserve-unknown-fields"


def directive(value: str | None) -> str:
    """The ``fieldValidation`` query parameter, checked (empty: not requested)."""
    if value in (None, ""):
        return ""
    if value not in DIRECTIVES:
        raise bad_request(f'fieldValidation must be one of {", ".join(DIRECTIVES)}, got "{value}"')
    return value


def _resolve(schema: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    while isinstance(ref, str):
        schema = definitions()[ref.rsplit("/", 1)[-1]]
        ref = schema.get("$ref")
    return schema


def _unknown(schema: dict[str, Any], value: Any, path: str) -> Iterator[str]:
    schema = _resolve(schema)
    if schema.get(_PRESERVE):
        return
    if isinstance(value, dict):
        properties = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            if isinstance(properties, dict):
                if key not in properties:
                    yield where
                else:
                    yield from _unknown(properties[key], item, where)
            elif isinstance(extra, dict):
                yield from _unknown(extra, item, where)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            yield from _unknown(schema["items"], item, f"{path}[{index}]")


def unknown_fields(resource: Resource, obj: Any) -> list[str]:
    """Paths (``spec.containers[0].imagee``) of the fields the kind's schema does not know."""
    name = resource_definition(resource)
    if name is None or not isinstance(obj, dict):
        return []
    return list(_unknown(definitions()[name], obj, ""))


def check_fields(resource: Resource, obj: Any, mode: str) -> list[str]:
    """Apply ``mode`` to ``obj``: raise 400 under Strict, return the warnings under Warn."""
    if mode in ("", "Ignore"):
        return []
    found = unknown_fields(resource, obj)
    if not found:
        return []
    if mode == "Strict":
        kind = f'{resource.kind} in version "{resource.version}"'
        listed = ", ".join(f'unknown field "{f}"' for f in found)
        raise bad_request(f"{kind} cannot be handled as a {resource.kind}: strict decoding error: {listed}")
    return [f'unknown field "{f}"' for f in found]
