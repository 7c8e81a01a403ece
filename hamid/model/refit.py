"""The NUMA refit API body: ``POST /refit`` request and response, with upstream's JSON field names."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hamid.model._wire import go_quote, type_name, want_bool, want_int, want_list, want_str
from hamid.model.annotations import decode_container_devices, encode_container_devices
from hamid.model.devices import NVIDIA, ContainerDevice, ContainerDevices
from hamid.model.errors import InvalidInput

#: Upstream's ``maxAllowedDeviceUUIDs``.
MAX_ALLOWED_DEVICE_UUIDS = 512
#: Upstream's ``numaRefitTimeout``, the time one refit has on both sides of the wire: the plugin
#: gives up on ``/refit`` after it (kubelet puts no deadline on GetPreferredAllocation), and the
#: scheduler fits the whole refit into it from the request's arrival, refusing with nothing changed
#: once it has passed.
REFIT_TIMEOUT_S = 2.0

#: Upstream's stateless validation messages (``RefitNumaAllocation``), verbatim.
MSG_INCOMPLETE = "incomplete refit request: pod UID, namespace, name, and node are required"
MSG_EMPTY_ALLOWED = "refit request carries an empty allowed device set"
MSG_TOO_MANY_ALLOWED = "refit request carries {count} allowed devices, limit is {limit}"
MSG_UNKNOWN_TYPE = "unknown device type {type}"


def _fields(obj: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(obj, Mapping):
        raise InvalidInput(f"{what}: want a JSON object, got {type_name(obj)}")
    return obj


def _opt_str(data: Mapping[str, Any], key: str, what: str) -> str:
    value = data.get(key)
    return "" if value is None else want_str(value, f"{what} field {key}")


@dataclass(frozen=True, slots=True)
class RefitRequest:
    """Upstream's ``NumaRefitRequest``: which container of which pod may move to which GPUs.

    ``container_index`` counts init containers first; ``allowed_device_uuids`` are physical GPU UUIDs.
    """

    pod_uid: str
    pod_namespace: str
    pod_name: str
    node_name: str
    container_index: int
    device_type: str
    allowed_device_uuids: tuple[str, ...]
    container_name: str = ""

    def validate(self) -> None:
        """Upstream's stateless checks, in upstream's order and with its exact messages."""
        if not (self.pod_uid and self.pod_namespace and self.pod_name and self.node_name):
            raise InvalidInput(MSG_INCOMPLETE)
        if not self.allowed_device_uuids:
            raise InvalidInput(MSG_EMPTY_ALLOWED)
        if len(self.allowed_device_uuids) > MAX_ALLOWED_DEVICE_UUIDS:
            raise InvalidInput(
                MSG_TOO_MANY_ALLOWED.format(
                    count=len(self.allowed_device_uuids), limit=MAX_ALLOWED_DEVICE_UUIDS
                )
            )
        if self.device_type != NVIDIA:
            raise InvalidInput(MSG_UNKNOWN_TYPE.format(type=go_quote(self.device_type)))

    @classmethod
    def from_json(cls, obj: Any) -> RefitRequest:
        """Build from a decoded JSON body: type-check every field (absent → Go zero value), then
        :meth:`validate`. Unknown fields are ignored, as Go's decoder does."""
        what = "refit request"
        data = _fields(obj, what)
        raw_index = data.get("containerIndex")
        index = 0 if raw_index is None else want_int(raw_index, f"{what} field containerIndex")
        raw_allowed = data.get("allowedDeviceUUIDs")
        allowed = () if raw_allowed is None else want_list(raw_allowed, f"{what} field allowedDeviceUUIDs")
        request = cls(
            pod_uid=_opt_str(data, "podUID", what),
            pod_namespace=_opt_str(data, "podNamespace", what),
            pod_name=_opt_str(data, "podName", what),
            node_name=_opt_str(data, "nodeName", what),
            container_index=index,
            container_name=_opt_str(data, "containerName", what),
            device_type=_opt_str(data, "deviceType", what),
            allowed_device_uuids=tuple(
                want_str(u, f"{what} field allowedDeviceUUIDs[{i}]") for i, u in enumerate(allowed)
            ),
        )
        request.validate()
        return request

    def to_json(self) -> dict[str, Any]:
        """The JSON object upstream sends (``containerName`` omitted when empty)."""
        out: dict[str, Any] = {
            "podUID": self.pod_uid,
            "podNamespace": self.pod_namespace,
            "podName": self.pod_name,
            "nodeName": self.node_name,
            "containerIndex": self.container_index,
        }
        if self.container_name:
            out["containerName"] = self.container_name
        out["deviceType"] = self.device_type
        out["allowedDeviceUUIDs"] = list(self.allowed_device_uuids)
        return out


@dataclass(frozen=True, slots=True)
class RefitResponse:
    """Upstream's ``NumaRefitResponse``: refusals are in-band (``succeeded`` false + ``failure_reason``).

    ``container_devices`` is the reselected devices in the ``EncodeContainerDevices`` wire form
    (``GPU-b,NVIDIA,20000,30:``); use :meth:`devices` to decode it.
    """

    succeeded: bool
    container_devices: str = ""
    failure_reason: str = ""

    @classmethod
    def success(cls, devices: ContainerDevices) -> RefitResponse:
        """A successful response carrying ``devices`` (encoded)."""
        return cls(succeeded=True, container_devices=encode_container_devices(devices))

    @classmethod
    def failure(cls, reason: str) -> RefitResponse:
        """A refusal with a human-readable reason."""
        return cls(succeeded=False, failure_reason=reason)

    def devices(self) -> tuple[ContainerDevice, ...]:
        """The decoded ``containerDevices`` (``()`` when absent); InvalidInput when malformed."""
        return decode_container_devices(self.container_devices)

    @classmethod
    def from_json(cls, obj: Any) -> RefitResponse:
        """Build from a decoded JSON body (type-checked; absent fields take Go zero values)."""
        what = "refit response"
        data = _fields(obj, what)
        raw = data.get("succeeded")
        return cls(
            succeeded=False if raw is None else want_bool(raw, f"{what} field succeeded"),
            container_devices=_opt_str(data, "containerDevices", what),
            failure_reason=_opt_str(data, "failureReason", what),
        )

    def to_json(self) -> dict[str, Any]:
        """The JSON object upstream returns (``containerDevices``/``failureReason`` omitted when empty)."""
        out: dict[str, Any] = {"succeeded": self.succeeded}
        if self.container_devices:
            out["containerDevices"] = self.container_devices
        if self.failure_reason:
            out["failureReason"] = self.failure_reason
        return out
