"""Pod device annotation codec: docs/hami-wire.md §2.3 vectors and round-trips."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hamid.model.annotations import (
    DEVICES_TO_ALLOCATE,
    decode_container_devices,
    decode_pod_devices,
    encode_container_devices,
    encode_pod_devices,
)
from hamid.model.devices import ContainerDevice
from hamid.model.errors import InvalidInput

D1 = "GPU-8dcd427f-483b-b48f-d7e5-75fb19a52b76"
D2 = "GPU-ebe7c3f7-303d-558d-435e-99a160631fe4"
LEGACY = "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448"


def dev(uuid: str, mem: int, cores: int, type_: str = "NVIDIA") -> ContainerDevice:
    return ContainerDevice(uuid=uuid, type=type_, usedmem=mem, usedcores=cores)


VECTORS = [
    # Test_PatchAnnotations
    ("nvidia-device-0,NVIDIA,2000,1:;", ((dev("nvidia-device-0", 2000, 1),),)),
    # Test_DecodePodDevices: Go returns 3 entries, the last one the phantom after the final ';'
    (f"{D1},NVIDIA,500,3:;{D2},NVIDIA,500,3:;", ((dev(D1, 500, 3),), (dev(D2, 500, 3),))),
    # TestPodDevicesCoding comments
    (
        "UUID1,Type1,1000,30:UUID2,Type1,1000,30:;",
        ((dev("UUID1", 1000, 30, "Type1"), dev("UUID2", 1000, 30, "Type1")),),
    ),
    (
        "UUID1,Type1,1000,30:;UUID1,Type1,1000,30:;",
        ((dev("UUID1", 1000, 30, "Type1"),), (dev("UUID1", 1000, 30, "Type1"),)),
    ),
    # plugin util_test.go
    ("GPU-init1,NVIDIA,500,10:;;", ((dev("GPU-init1", 500, 10),), ())),
    (";;GPU-main1,NVIDIA,2000,50:;", ((), (), (dev("GPU-main1", 2000, 50),))),
    (";;", ((), ())),
    # legacy protocol doc
    (f"{LEGACY},NVIDIA,3000,0:;{LEGACY},NVIDIA,5000,0:;", ((dev(LEGACY, 3000, 0),), (dev(LEGACY, 5000, 0),))),
    ("", ()),
    (";", ((),)),
]


@pytest.mark.parametrize(("value", "expected"), VECTORS)
def test_pod_device_vectors(value: str, expected: tuple[tuple[ContainerDevice, ...], ...]) -> None:
    assert decode_pod_devices(value) == expected
    assert encode_pod_devices(expected) == value


def test_missing_final_separator_is_accepted() -> None:
    assert decode_pod_devices(f"{D1},NVIDIA,500,3:;{D2},NVIDIA,500,3:") == (
        (dev(D1, 500, 3),),
        (dev(D2, 500, 3),),
    )
    assert decode_pod_devices(f"{D1},NVIDIA,500,3") == ((dev(D1, 500, 3),),)


def test_extra_fields_are_ignored() -> None:
    assert decode_pod_devices("a,NVIDIA,1,2,extra:;") == ((dev("a", 1, 2),),)


@pytest.mark.parametrize(
    ("value", "match"),
    [
        # TestDecodePodDevices_BadAnnotation
        ("uuid,type,100:;", "pod annotation format error, missing fields, do not use nodeName in task spec"),
        ("GPU-1:;", "missing fields"),
        ("a,NVIDIA,x,1:;", "usedmem"),
        ("a,NVIDIA,1,1.5:;", "usedcores"),
        ("a,NVIDIA,-1,0:;", "usedmem"),
        ("a,NVIDIA,2147483648,0:;", "usedmem"),
        (";a,NVIDIA, 1,0:;", r"container 1 device 'a' usedmem"),
    ],
)
def test_bad_pod_annotation(value: str, match: str) -> None:
    with pytest.raises(InvalidInput, match=match):
        decode_pod_devices(value, DEVICES_TO_ALLOCATE)


def test_error_names_key() -> None:
    with pytest.raises(InvalidInput, match=DEVICES_TO_ALLOCATE):
        decode_pod_devices("x,y,z:;", DEVICES_TO_ALLOCATE)


def test_container_devices() -> None:
    assert encode_container_devices([dev("GPU-b", 20000, 30)]) == "GPU-b,NVIDIA,20000,30:"
    assert decode_container_devices("GPU-b,NVIDIA,20000,30:") == (dev("GPU-b", 20000, 30),)
    assert decode_container_devices("GPU-a,NVIDIA,1,2:GPU-b,NVIDIA,3,4:") == (
        dev("GPU-a", 1, 2),
        dev("GPU-b", 3, 4),
    )
    assert decode_container_devices("") == ()
    assert encode_container_devices([]) == ""
    with pytest.raises(InvalidInput, match="';'"):
        decode_container_devices("GPU-b,NVIDIA,20000,30:;")


@pytest.mark.parametrize(
    "device", [dev("a,b", 1, 1), dev("a", 1, 1, "N:V"), dev("a;", 1, 1), dev("a", -1, 0), dev("a", 0, 2**31)]
)
def test_encode_rejects_unrepresentable(device: ContainerDevice) -> None:
    with pytest.raises(InvalidInput):
        encode_pod_devices([[device]])


field_text = st.text(st.characters(exclude_characters=",:;", exclude_categories=["Cs"]), max_size=10)
devices = st.builds(
    ContainerDevice, field_text, field_text, st.integers(0, 2**31 - 1), st.integers(0, 2**31 - 1)
)
pods = st.lists(st.lists(devices, max_size=3).map(tuple), max_size=5).map(tuple)


@settings(max_examples=150, deadline=None)
@given(pods)
def test_pod_devices_round_trip(pod: tuple[tuple[ContainerDevice, ...], ...]) -> None:
    encoded = encode_pod_devices(pod)
    decoded = decode_pod_devices(encoded)
    assert decoded == pod
    assert encode_pod_devices(decoded) == encoded
    assert encoded.count(";") == len(pod)


@settings(max_examples=100, deadline=None)
@given(st.lists(devices, max_size=4).map(tuple))
def test_container_devices_round_trip(container: tuple[ContainerDevice, ...]) -> None:
    encoded = encode_container_devices(container)
    assert decode_container_devices(encoded) == container
    assert encode_pod_devices([container]) == encoded + ";"
