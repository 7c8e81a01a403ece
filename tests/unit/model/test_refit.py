"""Refit request/response bodies: upstream field names, validation messages, round-trips."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hamid.model.devices import ContainerDevice
from hamid.model.errors import InvalidInput
from hamid.model.refit import MAX_ALLOWED_DEVICE_UUIDS, RefitRequest, RefitResponse

BODY: dict[str, Any] = {
    "podUID": "uid-1",
    "podNamespace": "default",
    "podName": "p",
    "nodeName": "node-a",
    "containerIndex": 1,
    "containerName": "main",
    "deviceType": "NVIDIA",
    "allowedDeviceUUIDs": ["GPU-a", "GPU-b"],
}


def test_request_json_field_names() -> None:
    """TestNumaRefitRequestJSONFieldNames: the wire names are pinned."""
    request = RefitRequest.from_json(BODY)
    assert request == RefitRequest("uid-1", "default", "p", "node-a", 1, "NVIDIA", ("GPU-a", "GPU-b"), "main")
    assert request.to_json() == BODY
    assert list(request.to_json()) == list(BODY)


def test_request_round_trip_through_json_text() -> None:
    request = RefitRequest.from_json(BODY)
    assert RefitRequest.from_json(json.loads(json.dumps(request.to_json()))) == request


def test_container_name_is_omitempty() -> None:
    body = {k: v for k, v in BODY.items() if k != "containerName"}
    request = RefitRequest.from_json(body)
    assert request.container_name == ""
    assert "containerName" not in request.to_json()


def test_missing_index_is_zero_and_unknown_fields_ignored() -> None:
    body = {k: v for k, v in BODY.items() if k != "containerIndex"} | {"extra": 1}
    assert RefitRequest.from_json(body).container_index == 0


@pytest.mark.parametrize("missing", ["podUID", "podNamespace", "podName", "nodeName"])
def test_incomplete_request(missing: str) -> None:
    for body in ({k: v for k, v in BODY.items() if k != missing}, BODY | {missing: ""}):
        with pytest.raises(InvalidInput) as info:
            RefitRequest.from_json(body)
        assert str(info.value) == "incomplete refit request: pod UID, namespace, name, and node are required"


@pytest.mark.parametrize("allowed", [[], None])
def test_empty_allowed_set(allowed: list[str] | None) -> None:
    with pytest.raises(InvalidInput) as info:
        RefitRequest.from_json(BODY | {"allowedDeviceUUIDs": allowed})
    assert str(info.value) == "refit request carries an empty allowed device set"


def test_allowed_set_limit() -> None:
    at_limit = [f"GPU-{i}" for i in range(MAX_ALLOWED_DEVICE_UUIDS)]
    assert len(RefitRequest.from_json(BODY | {"allowedDeviceUUIDs": at_limit}).allowed_device_uuids) == 512
    with pytest.raises(InvalidInput) as info:
        RefitRequest.from_json(BODY | {"allowedDeviceUUIDs": [*at_limit, "GPU-x"]})
    assert str(info.value) == "refit request carries 513 allowed devices, limit is 512"


@pytest.mark.parametrize(("device_type", "quoted"), [("AMD", '"AMD"'), ("", '""'), ("nvidia", '"nvidia"')])
def test_device_type_must_be_nvidia(device_type: str, quoted: str) -> None:
    with pytest.raises(InvalidInput) as info:
        RefitRequest.from_json(BODY | {"deviceType": device_type})
    assert str(info.value) == f"unknown device type {quoted}"


@pytest.mark.parametrize(
    ("patch", "match"),
    [
        ({"podUID": 5}, "podUID"),
        ({"containerIndex": "1"}, "containerIndex"),
        ({"containerIndex": 1.0}, "containerIndex"),
        ({"containerIndex": True}, "containerIndex"),
        ({"allowedDeviceUUIDs": "GPU-a"}, "allowedDeviceUUIDs"),
        ({"allowedDeviceUUIDs": ["GPU-a", 2]}, r"allowedDeviceUUIDs\[1\]"),
        ({"containerName": []}, "containerName"),
    ],
)
def test_request_type_errors(patch: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidInput, match=match):
        RefitRequest.from_json(BODY | patch)


@pytest.mark.parametrize("obj", [None, [], "x", 1])
def test_request_not_an_object(obj: Any) -> None:
    with pytest.raises(InvalidInput, match="refit request"):
        RefitRequest.from_json(obj)


def test_response_carries_encoded_container_devices() -> None:
    """TestNumaRefitResponseCarriesEncodedContainerDevices."""
    devices = (ContainerDevice("GPU-b", "NVIDIA", 20000, 30),)
    response = RefitResponse.success(devices)
    assert response.to_json() == {"succeeded": True, "containerDevices": "GPU-b,NVIDIA,20000,30:"}
    parsed = RefitResponse.from_json(response.to_json())
    assert parsed == response
    assert parsed.devices() == devices


def test_response_failure_omits_devices() -> None:
    """TestNumaRefitResponseFailureOmitsDevices."""
    response = RefitResponse.failure("no allowed device fits: 1/1 CardInsufficientMemory")
    assert response.to_json() == {
        "succeeded": False,
        "failureReason": "no allowed device fits: 1/1 CardInsufficientMemory",
    }
    assert RefitResponse.from_json(response.to_json()) == response
    assert response.devices() == ()


def test_response_from_json_defaults_and_errors() -> None:
    assert RefitResponse.from_json({}) == RefitResponse(succeeded=False)
    bads: tuple[object, ...] = ({"succeeded": "true"}, {"containerDevices": 1}, {"failureReason": []}, [])
    for bad in bads:
        with pytest.raises(InvalidInput, match="refit response"):
            RefitResponse.from_json(bad)
    with pytest.raises(InvalidInput, match="missing fields"):
        RefitResponse(succeeded=True, container_devices="GPU-b,NVIDIA:").devices()
