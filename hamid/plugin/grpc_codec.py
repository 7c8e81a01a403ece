"""The device plugin server's protobuf codec: bounded, and a clean status for undecodable requests.

grpclib buffers a whole message before decoding it and answers ``UNKNOWN`` when decoding raises.
kubelet's largest request (GetPreferredAllocation on a big node) is tens of KiB, so anything over
:data:`MAX_REQUEST_BYTES` is refused before parsing, and bytes that are not the RPC's message type
answer ``INVALID_ARGUMENT`` — for every RPC, since the server decodes all of them here.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.message import DecodeError
from grpclib import GRPCError
from grpclib.const import Status
from grpclib.encoding.proto import ProtoCodec

#: Upper bound of one request message (kubelet sends far less; see the module docs).
MAX_REQUEST_BYTES = 1 << 20


class BoundedProtoCodec(ProtoCodec):
    """:class:`ProtoCodec` that refuses oversized and undecodable requests with a gRPC status."""

    def decode(self, data: bytes, message_type: Any) -> Any:
        """Decode one request, or raise :class:`GRPCError` (RESOURCE_EXHAUSTED / INVALID_ARGUMENT)."""
        name = getattr(message_type, "__name__", "message")
        if len(data) > MAX_REQUEST_BYTES:
            raise GRPCError(
                Status.RESOURCE_EXHAUSTED,
                f"request of {len(data)} bytes exceeds the device plugin's limit of {MAX_REQUEST_BYTES}",
            )
        try:
            return super().decode(data, message_type)
        except DecodeError as exc:
            message = f"request is not a valid {name} protobuf message"
            raise GRPCError(Status.INVALID_ARGUMENT, message) from exc
