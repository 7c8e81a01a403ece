"""Pure helpers of the refit handler, caller authentication and the plugin-side request."""

from __future__ import annotations

import pytest

from hamid.model.devices import ContainerDevice
from hamid.model.errors import InvalidInput
from hamid.plugin.numa_policy import Door, NumaMismatch, refit_request
from hamid.scheduler.refit import PATCH_TIMEOUT_S, splice_entry
from hamid.scheduler.refit.auth import bearer_token, node_of_common_name, parse_methods


def test_splice_entry_keeps_every_other_byte() -> None:
    assert splice_entry(";x:;y:;", 1, "z:", "pending allocation") == ";z:;y:;"
    assert splice_entry("a:", 0, "b:", "allocated") == "b:"
    with pytest.raises(InvalidInput, match="cannot rewrite allocated annotation"):
        splice_entry(";x:;", 0, "z:", "allocated")
    with pytest.raises(InvalidInput, match="cannot rewrite pending allocation annotation"):
        splice_entry("x:;", 5, "z:", "pending allocation")
    assert PATCH_TIMEOUT_S == 2.0  # upstream's refitPatchTimeout, no longer than the plugin's budget


def test_bearer_token_cn_and_methods() -> None:
    assert bearer_token("Bearer abc") == "abc"
    assert bearer_token("bearer abc") == ""
    assert bearer_token("Basic abc") == ""
    assert bearer_token("Bearer ") == ""
    assert bearer_token(None) == ""
    assert node_of_common_name("system:node:n1") == "n1"
    assert node_of_common_name("n1") == "n1"
    assert parse_methods(" mtls , token,mtls") == ("mtls", "token")
    assert parse_methods(["TOKEN"]) == ("token",)
    with pytest.raises(ValueError, match="unknown refit auth method"):
        parse_methods("mtls,basic")


def test_refit_request_from_mismatch() -> None:
    pod = {"metadata": {"uid": "u", "namespace": "ns", "name": "p"}}
    devices = (ContainerDevice("GPU-0", "NVIDIA", 1000, 10),)
    mismatch = NumaMismatch(
        door=Door.PREFERRED,
        pod=pod,
        node_name="n1",
        container_index=3,
        container_name="main",
        annotated=devices,
        missing=("GPU-0",),
        allowed_uuids=("GPU-2", "GPU-3"),
    )
    assert refit_request(mismatch).to_json() == {
        "podUID": "u",
        "podNamespace": "ns",
        "podName": "p",
        "nodeName": "n1",
        "containerIndex": 3,
        "containerName": "main",
        "deviceType": "NVIDIA",
        "allowedDeviceUUIDs": ["GPU-2", "GPU-3"],
    }
