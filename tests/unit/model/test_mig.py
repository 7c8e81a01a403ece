"""The dynamic MIG reservation annotation and the profile allowlist, against HAMi's vectors and checks."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hamid.model.devices import MigPlacement
from hamid.model.errors import InvalidInput
from hamid.model.mig import (
    AllowedMigProfiles,
    MigAllocation,
    allowed_profiles_for,
    decode_mig_allocations,
    decode_mig_profile_allowlist,
    encode_mig_allocations,
    placements_overlap,
    profile_slice_key,
)

# HAMi pkg/device-plugin/.../plugin/mig_startup_test.go (docs/hami-wire.md §2.6)
HAMI_VECTOR = (
    '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-live",'
    '"profile":"1g.5gb","placement":{"start":6,"size":1}}]'
)


def test_hami_vector_round_trips_byte_for_byte() -> None:
    (a,) = decode_mig_allocations(HAMI_VECTOR)
    assert a == MigAllocation(0, 0, "GPU-live", "1g.5gb", MigPlacement(6, 1))
    assert not a.realized
    assert encode_mig_allocations([a]) == HAMI_VECTOR


def test_runtime_identity_is_encoded_after_the_reservation_in_go_order() -> None:
    a = MigAllocation(1, 2, "GPU-x", "2g.10gb", MigPlacement(2, 2), "MIG-y", 4, 0)
    text = encode_mig_allocations([a])
    assert text == (
        '[{"containerIndex":1,"deviceIndex":2,"gpuUUID":"GPU-x","profile":"2g.10gb",'
        '"placement":{"start":2,"size":2},"migUUID":"MIG-y","gpuInstanceID":4,"computeInstanceID":0}]'
    )
    assert decode_mig_allocations(text) == (a,)
    assert a.realized and a.reservation_key == ("GPU-x", "2g.10gb", 2, 2)


def test_no_reservations_encode_to_nothing_and_decode_from_empty_or_null() -> None:
    assert encode_mig_allocations([]) == ""
    assert decode_mig_allocations("") == ()
    assert decode_mig_allocations("null") == ()
    assert decode_mig_allocations("[]") == ()


def test_unknown_fields_are_ignored_and_nulls_take_zero_values() -> None:
    (a,) = decode_mig_allocations(
        '[{"containerIndex":null,"deviceIndex":0,"gpuUUID":"G","profile":"1g.5gb",'
        '"placement":{"start":null,"size":1},"extra":[1,{"x":2}],"migUUID":null}]'
    )
    assert a == MigAllocation(0, 0, "G", "1g.5gb", MigPlacement(0, 1))


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            '[{"containerIndex":-1,"deviceIndex":0,"gpuUUID":"G","profile":"p","placement":{"start":0,"size":1}}]',
            "allocation 0 is incomplete",
        ),
        (
            '[{"containerIndex":0,"deviceIndex":0,"profile":"p","placement":{"start":0,"size":1}}]',
            "allocation 0 is incomplete",
        ),
        (
            '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"G","placement":{"start":0,"size":1}}]',
            "allocation 0 is incomplete",
        ),
        ('[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"G","profile":"p"}]', "allocation 0 is incomplete"),
        (
            '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"G","profile":"p","placement":{"start":0,"size":1},"migUUID":"M"}]',
            "partial runtime identity",
        ),
        (
            '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"G","profile":"p","placement":{"start":0,"size":1},'
            '"gpuInstanceID":1,"computeInstanceID":0}]',
            "partial runtime identity",
        ),
        (
            '[{"containerIndex":0,"deviceIndex":1,"gpuUUID":"G","profile":"p","placement":{"start":0,"size":1}},'
            '{"containerIndex":0,"deviceIndex":1,"gpuUUID":"H","profile":"p","placement":{"start":1,"size":1}}]',
            "duplicate MIG allocation for container 0 device 1",
        ),
        (
            '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"G","profile":"p","placement":{"start":-1,"size":1}}]',
            "start",
        ),
        (
            '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"G","profile":"p","placement":{"start":0,"size":4294967296}}]',
            "size",
        ),
        (
            '[{"containerIndex":"0","deviceIndex":0,"gpuUUID":"G","profile":"p","placement":{"start":0,"size":1}}]',
            "containerIndex",
        ),
        (
            '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":7,"profile":"p","placement":{"start":0,"size":1}}]',
            "gpuUUID",
        ),
        ('[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"G","profile":"p","placement":[0,1]}]', "placement"),
        ('{"containerIndex":0}', "want"),
        ("[1]", "[0]"),
        ("[", "malformed JSON"),
        ("[NaN]", "malformed JSON"),
    ],
)
def test_bad_reservations_are_refused_with_the_record_named(value: str, message: str) -> None:
    with pytest.raises(InvalidInput, match=message.replace("[", r"\[")):
        decode_mig_allocations(value)


def test_a_non_string_is_refused() -> None:
    with pytest.raises(InvalidInput, match="want a string"):
        decode_mig_allocations(None)


def test_encode_refuses_what_hami_would_refuse() -> None:
    with pytest.raises(InvalidInput, match="incomplete"):
        encode_mig_allocations([MigAllocation(0, 0, "G", "1g.5gb", MigPlacement(0, 0))])
    with pytest.raises(InvalidInput, match="partial runtime identity"):
        encode_mig_allocations([MigAllocation(0, 0, "G", "1g.5gb", MigPlacement(0, 1), "MIG-1")])


@given(st.text(max_size=200))
def test_any_text_decodes_or_is_refused_cleanly(text: str) -> None:
    with contextlib.suppress(InvalidInput):
        decode_mig_allocations(text)


_ALLOCATIONS = st.builds(
    MigAllocation,
    container_index=st.integers(0, 5),
    device_index=st.integers(0, 5),
    gpu_uuid=st.text(min_size=1, max_size=20),
    profile=st.text(min_size=1, max_size=20),
    placement=st.builds(MigPlacement, st.integers(0, 7), st.integers(1, 8)),
)


@given(st.lists(_ALLOCATIONS, max_size=6, unique_by=lambda a: (a.container_index, a.device_index)))
def test_encode_decode_round_trip(allocations: list[MigAllocation]) -> None:
    assert decode_mig_allocations(encode_mig_allocations(allocations) or "") == tuple(allocations)


def test_placements_overlap_on_shared_slices_only() -> None:
    assert placements_overlap(MigPlacement(0, 2), MigPlacement(1, 1))
    assert placements_overlap(MigPlacement(0, 8), MigPlacement(6, 1))
    assert not placements_overlap(MigPlacement(0, 2), MigPlacement(2, 2))
    assert not placements_overlap(MigPlacement(4, 4), MigPlacement(0, 4))


def test_allowlist_decodes_and_matches_the_first_entry_by_case_sensitive_substring() -> None:
    allowlist = decode_mig_profile_allowlist(
        [
            {"models": ["A100-SXM4-40GB"], "profiles": ["1g.5gb", "3g.20gb"]},
            {"models": ["A100"], "profiles": ["7g.40gb"]},
        ],
        "nvidia.migProfileAllowlist",
    )
    assert allowlist[0] == AllowedMigProfiles(("A100-SXM4-40GB",), ("1g.5gb", "3g.20gb"))
    assert allowed_profiles_for("NVIDIA-A100-SXM4-40GB", allowlist) == ("1g.5gb", "3g.20gb")
    assert allowed_profiles_for("NVIDIA-A100-PCIE-80GB", allowlist) == ("7g.40gb",)
    assert allowed_profiles_for("NVIDIA-a100-pcie-80gb", allowlist) == ()
    assert decode_mig_profile_allowlist(None, "x") == ()
    assert profile_slice_key("2g.10gb") == "2g" and profile_slice_key("7g") == "7g"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            [{"models": [], "profiles": ["1g.5gb"]}],
            r"\[0\]: MIG profile allowlist must define models and profiles",
        ),
        ([{"models": ["A30"]}], "must define models and profiles"),
        ([{"models": ["A30"], "profiles": ["1g"]}], "invalid MIG profile '1g'"),
        ([{"models": ["A30"], "profiles": ["g.5gb"]}], "invalid MIG profile"),
        ([{"models": ["A30"], "profiles": ["1x.5gb"]}], "invalid MIG profile"),
        ([{"models": "A30", "profiles": ["1g.5gb"]}], "models"),
        ([{"models": ["A30"], "profiles": [5]}], "profiles"),
        ({"models": ["A30"]}, "want"),
    ],
)
def test_bad_allowlists_are_refused(value: object, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        decode_mig_profile_allowlist(value, "nvidia.migProfileAllowlist")
