"""Request bodies in Kubernetes' protobuf encoding, for the kinds kubectl sends that way.

kubectl's typed clients (``kubectl create namespace``, ``kubectl create quota``) post
``application/vnd.kubernetes.protobuf``: the magic ``k8s\\0``, then a ``runtime.Unknown`` whose
``raw`` is the object's message. This module reads the wire format and turns the messages of
Namespace and ResourceQuota (with ``ObjectMeta``) into their JSON form, using the field numbers of
the Kubernetes API's ``generated.proto``. Any other kind, or a field number not listed here, is
refused with 415 naming it, so nothing is silently dropped; JSON is always accepted.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from hamidsim.apiserver.errors import ApiError

MEDIA_TYPE = "application/vnd.kubernetes.protobuf"
MAGIC = b"k8s\x00"

#: Message name -> field number -> (JSON name, type). Types: ``string``, ``int``, ``bool``, ``time``,
#: ``quantity``, ``bytes``, a message name, ``[T]`` for a repeated field, ``{T}`` for map<string, T>.
Fields = dict[int, tuple[str, str]]
MESSAGES: dict[str, Fields] = {
    "Unknown": {
        1: ("typeMeta", "TypeMeta"),
        2: ("raw", "bytes"),
        3: ("contentEncoding", "string"),
        4: ("contentType", "string"),
    },
    "TypeMeta": {1: ("apiVersion", "string"), 2: ("kind", "string")},
    "ObjectMeta": {
        1: ("name", "string"),
        2: ("generateName", "string"),
        3: ("namespace", "string"),
        4: ("selfLink", "string"),
        5: ("uid", "string"),
        6: ("resourceVersion", "string"),
        7: ("generation", "int"),
        8: ("creationTimestamp", "time"),
        9: ("deletionTimestamp", "time"),
        10: ("deletionGracePeriodSeconds", "int"),
        11: ("labels", "{string}"),
        12: ("annotations", "{string}"),
        13: ("ownerReferences", "[OwnerReference]"),
        14: ("finalizers", "[string]"),
    },
    "OwnerReference": {
        1: ("kind", "string"),
        3: ("name", "string"),
        4: ("uid", "string"),
        5: ("apiVersion", "string"),
        6: ("controller", "bool"),
        7: ("blockOwnerDeletion", "bool"),
    },
    "Namespace": {
        1: ("metadata", "ObjectMeta"),
        2: ("spec", "NamespaceSpec"),
        3: ("status", "NamespaceStatus"),
    },
    "NamespaceSpec": {1: ("finalizers", "[string]")},
    "NamespaceStatus": {1: ("phase", "string")},
    "ResourceQuota": {
        1: ("metadata", "ObjectMeta"),
        2: ("spec", "ResourceQuotaSpec"),
        3: ("status", "ResourceQuotaStatus"),
    },
    "ResourceQuotaSpec": {
        1: ("hard", "{quantity}"),
        2: ("scopes", "[string]"),
        3: ("scopeSelector", "ScopeSelector"),
    },
    "ResourceQuotaStatus": {1: ("hard", "{quantity}"), 2: ("used", "{quantity}")},
    "ScopeSelector": {1: ("matchExpressions", "[ScopedResourceSelectorRequirement]")},
    "ScopedResourceSelectorRequirement": {
        1: ("scopeName", "string"),
        2: ("operator", "string"),
        3: ("values", "[string]"),
    },
    "Time": {1: ("seconds", "int"), 2: ("nanos", "int")},
    "Quantity": {1: ("string", "string")},
}
#: (apiVersion, kind) decoded from protobuf -> top-level message.
KINDS = {("v1", "Namespace"): "Namespace", ("v1", "ResourceQuota"): "ResourceQuota"}


def _unsupported(why: str) -> ApiError:
    return ApiError(
        415,
        f"the embedded API server cannot decode this protobuf body ({why}); "
        "send application/json (kinds accepted in protobuf: " + ", ".join(kind for _, kind in KINDS) + ")",
    )


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise _unsupported("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _fields(data: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of each field in a message."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
            yield number, wire, value
        elif wire == 2:
            size, pos = _varint(data, pos)
            if pos + size > len(data):
                raise _unsupported("truncated field")
            yield number, wire, data[pos : pos + size]
            pos += size
        else:
            raise _unsupported(f"wire type {wire} of field {number}")


def _scalar(kind: str, value: int | bytes, where: str) -> Any:
    if kind == "int":
        if not isinstance(value, int):
            raise _unsupported(f"{where} is not a varint")
        return value - (1 << 64) if value >= 1 << 63 else value
    if kind == "bool":
        return bool(value)
    if not isinstance(value, bytes):
        raise _unsupported(f"{where} is not length-delimited")
    if kind == "bytes":
        return value
    if kind == "string":
        return value.decode("utf-8")
    if kind == "quantity":
        return str(decode_message("Quantity", value).get("string", "0"))
    if kind == "time":
        stamp = decode_message("Time", value)
        return datetime.fromtimestamp(int(stamp.get("seconds", 0)), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return decode_message(kind, value)


def _map_entry(kind: str, data: bytes, where: str) -> tuple[str, Any]:
    key: str = ""
    value: Any = ""
    for number, _, raw in _fields(data):
        if number == 1:
            key = _scalar("string", raw, where)
        elif number == 2:
            value = _scalar(kind, raw, where)
    return key, value


def decode_message(message: str, data: bytes) -> dict[str, Any]:
    """One message as its JSON object."""
    table = MESSAGES[message]
    out: dict[str, Any] = {}
    for number, _, value in _fields(data):
        if number not in table:
            raise _unsupported(f"field {number} of {message}")
        name, kind = table[number]
        where = f"{message}.{name}"
        if kind.startswith("{"):
            if not isinstance(value, bytes):
                raise _unsupported(f"{where} is not a map entry")
            key, item = _map_entry(kind[1:-1], value, where)
            out.setdefault(name, {})[key] = item
        elif kind.startswith("["):
            out.setdefault(name, []).append(_scalar(kind[1:-1], value, where))
        else:
            out[name] = _scalar(kind, value, where)
    return out


def decode_object(body: bytes) -> dict[str, Any]:
    """A protobuf request body (``k8s\\0`` + ``runtime.Unknown``) as the JSON object it encodes."""
    if not body.startswith(MAGIC):
        raise _unsupported("no k8s protobuf magic prefix")
    envelope = decode_message("Unknown", body[len(MAGIC) :])
    type_meta = envelope.get("typeMeta") or {}
    api_version, kind = str(type_meta.get("apiVersion", "")), str(type_meta.get("kind", ""))
    message = KINDS.get((api_version, kind))
    if message is None:
        raise _unsupported(f"kind {api_version}/{kind}")
    if envelope.get("contentEncoding"):
        raise _unsupported(f"content encoding {envelope['contentEncoding']!r}")
    obj = decode_message(message, bytes(envelope.get("raw", b"")))
    return {"apiVersion": api_version, "kind": kind, **obj}
