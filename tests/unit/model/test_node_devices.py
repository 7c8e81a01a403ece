"""``hami.io/node-nvidia-register`` codec: docs/hami-wire.md §2.2 vectors, both forms, round-trips."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hamid.model.annotations import decode_node_devices, encode_node_devices
from hamid.model.devices import DeviceInfo, MigPlacement, MigProfile
from hamid.model.errors import InvalidInput

V100_A = "GPU-00552014-5c87-89ac-b1a6-7b53aa24b0ec"
V100_B = "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448"
P4 = "GPU-ebe7c3f7-303d-558d-435e-99a160631fe4"


def test_marshal_node_devices_vector() -> None:
    """TestMarshalNodeDevices: compared after JSON decode (Go omits numa 0 and health false)."""
    devices = [
        DeviceInfo(id="id-1", index=1, count=1, devmem=1024, devcore=10, type="type", numa=0, health=True),
        DeviceInfo(id="id-2", index=2, count=2, devmem=2048, devcore=20, type="type2", numa=1, health=False),
    ]
    expected = (
        '[{"index":1,"id":"id-1","count":1,"devmem":1024,"devcore":10,"type":"type","numa":0,"health":true},'
        '{"index":2,"id":"id-2","count":2,"devmem":2048,"devcore":20,"type":"type2","numa":1,"health":false}]'
    )
    assert decode_node_devices(expected) == tuple(devices)
    encoded = encode_node_devices(devices)
    assert encoded == (
        '[{"id":"id-1","index":1,"count":1,"devmem":1024,"devcore":10,"type":"type","health":true},'
        '{"id":"id-2","index":2,"count":2,"devmem":2048,"devcore":20,"type":"type2","numa":1}]'
    )
    # equal after decoding, as the Go test compares (missing numa/health are zero values)
    zeroed = [{"numa": 0, "health": False} | d for d in json.loads(encoded)]
    assert sorted(map(sorted, (d.items() for d in zeroed))) == sorted(
        map(sorted, (d.items() for d in json.loads(expected)))
    )


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (
            '[{"id":"GPU-0","count":5,"devmem":8192,"devcore":100,"type":"NVIDIA-Tesla P4","numa":0,'
            '"health":true,"index":0}]',
            DeviceInfo(id="GPU-0", count=5, devmem=8192, devcore=100, type="NVIDIA-Tesla P4", health=True),
        ),
        (
            '[{"id":"GPU-0","count":10,"devmem":8192,"devcore":100,"type":"NVIDIA-A100","numa":0,"health":true,'
            '"index":0,"mode":"hami-core"}]',
            DeviceInfo(
                id="GPU-0",
                count=10,
                devmem=8192,
                devcore=100,
                type="NVIDIA-A100",
                mode="hami-core",
                health=True,
            ),
        ),
    ],
)
def test_get_node_devices_vectors(value: str, expected: DeviceInfo) -> None:
    assert decode_node_devices(value) == (expected,)


TWO_V100 = (
    '[{"id":"GPU-00552014-5c87-89ac-b1a6-7b53aa24b0ec","count":10,"devmem":32768,"devcore":100,'
    '"type":"NVIDIA-Tesla V100-PCIE-32GB","mode":"hami-core","health":true},'
    '{"id":"GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448","index":1,"count":10,"devmem":32768,"devcore":100,'
    '"type":"NVIDIA-Tesla V100-PCIE-32GB","mode":"hami-core","health":true}]'
)


def test_two_v100_exact_go_bytes() -> None:
    devices = [
        DeviceInfo(V100_A, 0, 10, 32768, 100, "NVIDIA-Tesla V100-PCIE-32GB", 0, "hami-core", True),
        DeviceInfo(V100_B, 1, 10, 32768, 100, "NVIDIA-Tesla V100-PCIE-32GB", 0, "hami-core", True),
    ]
    assert encode_node_devices(devices) == TWO_V100
    assert decode_node_devices(TWO_V100) == tuple(devices)


def test_mig_profile_compact_wire_format() -> None:
    profile = MigProfile("1g.5gb", memory_mb=4864, core=15, slice_count=1, placements=(MigPlacement(6, 1),))
    encoded = encode_node_devices([DeviceInfo(id="GPU-m", mode="mig", mig_profiles=(profile,))])
    exact = '{"name":"1g.5gb","memoryMB":4864,"core":15,"sliceCount":1,"placements":[{"start":6,"size":1}]}'
    assert encoded == f'[{{"id":"GPU-m","mode":"mig","migProfiles":[{exact}]}}]'
    assert decode_node_devices(encoded)[0].mig_profiles == (profile,)


def test_go_string_escaping() -> None:
    encoded = encode_node_devices([DeviceInfo(id='a<b>&\u2028"\\\n\x01\x7f')])
    assert encoded == '[{"id":"a\\u003cb\\u003e\\u0026\\u2028\\"\\\\\\n\\u0001\x7f"}]'
    assert decode_node_devices(encoded)[0].id == 'a<b>&\u2028"\\\n\x01\x7f'


def test_empty_and_unknown_fields() -> None:
    assert encode_node_devices([]) == "[]"
    assert decode_node_devices("[]") == ()
    assert decode_node_devices('[{"id":"x","custominfo":{"a":1},"devicevendor":"NVIDIA","health":null}]') == (
        DeviceInfo(id="x"),
    )


# --- legacy colon form ------------------------------------------------------------------------


def test_decode_legacy_old_format() -> None:
    assert decode_node_devices(f"{P4},10,7680,100,NVIDIA-Tesla P4,0,true:") == (
        DeviceInfo(P4, 0, 10, 7680, 100, "NVIDIA-Tesla P4", 0, "hami-core", True),
    )


def test_decode_legacy_new_format() -> None:
    assert decode_node_devices(f"{P4},10,7680,100,NVIDIA-Tesla P4,0,true,1,hami-core:") == (
        DeviceInfo(P4, 1, 10, 7680, 100, "NVIDIA-Tesla P4", 0, "hami-core", True),
    )


def test_decode_legacy_old_format_defaults_index_and_mode() -> None:
    assert decode_node_devices(f"{P4},10,7680,100,NVIDIA-Tesla P4,0,true:") == (
        DeviceInfo(P4, 0, 10, 7680, 100, "NVIDIA-Tesla P4", 0, "hami-core", True),
    )


def test_legacy_protocol_doc_vector() -> None:
    value = (
        f"{V100_A},10,32768,100,NVIDIA-Tesla V100-PCIE-32GB,0,true:"
        f"{V100_B},10,32768,100,NVIDIA-Tesla V100-PCIE-32GB,0,true:"
    )
    devices = decode_node_devices(value)
    assert [d.id for d in devices] == [V100_A, V100_B]
    assert all(d.index == 0 and d.mode == "hami-core" and d.health and d.devmem == 32768 for d in devices)


@pytest.mark.parametrize("value", [":", "::"])
def test_legacy_empty_segments(value: str) -> None:
    assert decode_node_devices(value) == ()


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ("", "node annotation missing device separator"),
        ("GPU-1,10,100", "node annotation missing device separator"),
        ("GPU-1:", 'malformed node annotation segment: "GPU-1"'),
        ("a,1,2,3:", "unexpected field count 4 in node annotation"),
        ("a,1,2,3,t,0,true,1:", "unexpected field count 8 in node annotation"),
        ("a,1,2,3,t,0,true,-1,hami-core:", "index"),
        ("a,x,2,3,t,0,true:", "count"),
        ("a,1,2,3,t,0,yes:", "health"),
        ("a,2147483648,2,3,t,0,true:", "count"),
    ],
)
def test_legacy_errors(value: str, match: str) -> None:
    with pytest.raises(InvalidInput, match=match):
        decode_node_devices(value)


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ("[", "malformed JSON"),
        ("[1]", r"\[0\]: want an object"),
        ('[{"id":1}]', r"\[0\]\.id"),
        ('[{"index":-1}]', "index"),
        ('[{"count":1.5}]', "count"),
        ('[{"count":2147483648}]', "count"),
        ('[{"health":"true"}]', "health"),
        ('[{"numa":NaN}]', "malformed JSON"),
        ('[{"migProfiles":{}}]', "migProfiles"),
        ('[{"migProfiles":[{"placements":[{"start":"x"}]}]}]', "start"),
        ('{"id":"x"}', "legacy|separator|segment"),
    ],
)
def test_json_errors(value: str, match: str) -> None:
    with pytest.raises(InvalidInput, match=match):
        decode_node_devices(value)


def test_encode_rejects_out_of_range() -> None:
    with pytest.raises(InvalidInput, match="count"):
        encode_node_devices([DeviceInfo(id="a", count=2**31)])


# --- round trips --------------------------------------------------------------------------------

int32 = st.integers(-(2**31), 2**31 - 1)
placements = st.builds(MigPlacement, st.integers(0, 64), st.integers(0, 64))
profiles = st.builds(
    MigProfile,
    st.text(max_size=8),
    st.integers(0, 2**20),
    st.integers(0, 100),
    st.integers(0, 8),
    st.lists(placements, max_size=2).map(tuple),
)


def devices(text: st.SearchStrategy[str], mig: bool) -> st.SearchStrategy[DeviceInfo]:
    return st.builds(
        DeviceInfo,
        id=text,
        index=st.integers(0, 2**32),
        count=int32,
        devmem=int32,
        devcore=int32,
        type=text,
        numa=st.integers(-(2**40), 2**40),
        mode=text,
        health=st.booleans(),
        mig_profiles=st.lists(profiles, max_size=2).map(tuple) if mig else st.just(()),
    )


@settings(max_examples=100, deadline=None)
@given(st.lists(devices(st.text(max_size=12), mig=True), max_size=4))
def test_json_round_trip(devs: list[DeviceInfo]) -> None:
    encoded = encode_node_devices(devs)
    decoded = decode_node_devices(encoded)
    assert decoded == tuple(devs)
    assert encode_node_devices(decoded) == encoded
    json.loads(encoded)  # always valid JSON


legacy_text = st.text(st.characters(exclude_characters=",:", exclude_categories=["Cs"]), max_size=12)
#: The first device's UUID: empty, or not starting with whitespace or "[" (a leading "[" selects the
#: JSON form), so every drawn example reaches the round trip.
first_legacy_id = st.one_of(
    st.just(""),
    st.builds(
        str.__add__,
        st.characters(exclude_characters=",:[", exclude_categories=("Cs", "Cc", "Zs", "Zl", "Zp")),
        legacy_text,
    ),
)


@settings(max_examples=100, deadline=None)
@given(
    devices(first_legacy_id, mig=False).flatmap(
        lambda first: st.lists(devices(legacy_text, mig=False), max_size=3).map(lambda rest: [first, *rest])
    )
)
def test_legacy_round_trip(devs: list[DeviceInfo]) -> None:
    encoded = _legacy(devs)
    assert not encoded.lstrip().startswith("[")  # the strategy keeps the legacy form selected
    decoded = decode_node_devices(encoded)
    assert decoded == tuple(devs)
    assert _legacy(decoded) == encoded


def _legacy(devices: list[DeviceInfo] | tuple[DeviceInfo, ...]) -> str:
    """The pre-v2.8 colon form (``<id>,<count>,<devmem>,<devcore>,<type>,<numa>,<health>,<index>,<mode>:``),
    which HAMi's plugins no longer write and hamid only decodes."""
    return "".join(
        f"{d.id},{d.count},{d.devmem},{d.devcore},{d.type},{d.numa},{str(d.health).lower()},{d.index},{d.mode}:"
        for d in devices
    )
