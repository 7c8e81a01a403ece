"""Random garbage into every decoder: the only exception ever raised is InvalidInput."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hamid.model import annotations as an
from hamid.model.alignment import parse_alignment
from hamid.model.errors import InvalidInput
from hamid.model.nodeconfig import NodeConfig, resolve_node_config
from hamid.model.quantity import quantity_as_int
from hamid.model.refit import RefitRequest, RefitResponse
from hamid.model.resources import ResourceConfig, load_device_config, pod_requests

KEYS = [
    "id", "index", "count", "devmem", "devcore", "type", "numa", "mode", "health", "migProfiles",
    "placements",
    "uuid", "score", "nodeconfig", "name", "operatingmode", "devicesplitcount", "filterdevices",
    "devicememoryscaling", "libcudaloglevel", "enablenumatopology", "migstrategy",
    "podUID", "podNamespace", "podName", "nodeName", "containerIndex", "containerName", "deviceType",
    "allowedDeviceUUIDs", "succeeded", "containerDevices", "failureReason",
    "spec", "containers", "initContainers", "resources", "limits", "requests", "restartPolicy",
    "nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpumem-percentage", "nvidia.com/gpucores",
]  # fmt: skip
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
    | st.sampled_from(["1", "2k", "1Gi", "0.5", "-1", "NVIDIA", "hami-core", "Always", "x,y:z;"])
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=5), inner, max_size=5)
    ),
    max_leaves=20,
)
# text biased towards the codecs' separators and keywords
wire_text = (
    st.lists(
        st.sampled_from([*'[]{}:,;"_ -.0123456789TZtrue', "GPU-a", "NVIDIA", "Requesting", "slot=", "Gi"]),
        max_size=30,
    ).map("".join)
    | st.text(max_size=40)
    | json_values.map(json.dumps)
)

STRING_DECODERS: list[Callable[[Any], object]] = [
    an.decode_node_devices,
    an.decode_pod_devices,
    an.decode_container_devices,
    an.parse_node_lock,
    an.parse_handshake,
    an.parse_uuid_list,
    an.parse_type_list,
    an.parse_numa_bind,
    an.parse_scoring_weights,
    an.decode_pair_scores,
    lambda v: parse_alignment({an.NUMA_ALIGNMENT: v}),
    lambda v: resolve_node_config(v, "n", NodeConfig()),
    load_device_config,
    lambda v: quantity_as_int(v, "q"),
]
OBJECT_DECODERS: list[Callable[[Any], object]] = [
    RefitRequest.from_json,
    RefitResponse.from_json,
    lambda v: pod_requests(v, ResourceConfig()),
    lambda v: pod_requests({"spec": {"containers": [v]}}, ResourceConfig()),
    lambda v: pod_requests({"spec": {"containers": [{"resources": {"limits": v}}]}}, ResourceConfig()),
]


def _only_invalid_input(decoders: list[Callable[[Any], object]], value: Any) -> None:
    for decoder in decoders:
        try:
            decoder(value)
        except InvalidInput as exc:
            assert str(exc)  # always a message


@settings(max_examples=120, deadline=None)
@given(value=wire_text)
def test_string_garbage(value: str) -> None:
    _only_invalid_input(STRING_DECODERS, value)


@settings(max_examples=120, deadline=None)
@given(value=json_values)
def test_json_value_garbage(value: Any) -> None:
    _only_invalid_input(STRING_DECODERS + OBJECT_DECODERS, value)


@pytest.mark.parametrize("decoder", [an.decode_node_devices, an.decode_pair_scores])
def test_deep_nesting_is_invalid_input(decoder: Callable[[str], object]) -> None:
    with pytest.raises(InvalidInput):
        decoder("[" * 100_000 + "]" * 100_000)


HUGE = "9" * 5000


@pytest.mark.parametrize(
    "value",
    [
        HUGE,
        f"a,NVIDIA,{HUGE},1:;",
        f"a,1,2,3,t,{HUGE},true:",
        f"slot={HUGE},core=1,memory=1",
        f'[{{"index":{HUGE}}}]',
    ],
)
def test_huge_numbers_are_invalid_input(value: str) -> None:
    _only_invalid_input(STRING_DECODERS, value)
    assert quantity_as_int(HUGE, "q") is None
    assert quantity_as_int("0." + "0" * 5000 + "1", "q") is None
    assert quantity_as_int("1." + "0" * 5000, "q") == 1
