"""HAMi's GPU pair scores (``calculate_score.go``) and their wire form, from upstream's vectors."""

from __future__ import annotations

import pytest

from hamid.model.annotations import decode_pair_scores, encode_pair_scores
from hamid.model.gpulinks import GpuLink, pair_scores


def nvlink_only(n: int) -> GpuLink:
    """Upstream's test devices hold NVLink entries without a P2P entry."""
    return GpuLink(level=None, nvlinks=n)


def test_upstream_four_gpu_nvlink_table() -> None:
    # Test_calculateGPUScore: NV1/NV2 matrix between gpu0..gpu3
    counts = {(0, 1): 1, (0, 2): 1, (0, 3): 2, (1, 2): 2, (1, 3): 1, (2, 3): 2}
    links: dict[str, dict[str, GpuLink]] = {}
    for (a, b), n in counts.items():
        links.setdefault(f"gpu{a}", {})[f"gpu{b}"] = nvlink_only(n)
        links.setdefault(f"gpu{b}", {})[f"gpu{a}"] = nvlink_only(n)
    result = pair_scores(links, [f"gpu{i}" for i in range(4)])
    assert result.scores == {
        "gpu0": {"gpu1": 100, "gpu2": 100, "gpu3": 200},
        "gpu1": {"gpu0": 100, "gpu2": 200, "gpu3": 100},
        "gpu2": {"gpu0": 100, "gpu1": 200, "gpu3": 200},
        "gpu3": {"gpu0": 200, "gpu1": 100, "gpu2": 200},
    }
    assert result.asymmetric == ()


def test_upstream_asymmetric_pair_scores_zero_both_ways() -> None:
    # Test_calculateGPUPairScore_asymmetric: SameCPU + 4 NVLinks one way, SameCPU only the other
    links = {"gpu0": {"gpu1": GpuLink("NODE", 4)}, "gpu1": {"gpu0": GpuLink("NODE", 0)}}
    result = pair_scores(links, ["gpu0", "gpu1"])
    assert result.scores == {"gpu0": {"gpu1": 0}, "gpu1": {"gpu0": 0}}
    assert result.asymmetric == (("gpu0", "gpu1"),)


@pytest.mark.parametrize(
    ("link", "score"),
    [
        (GpuLink("SYSTEM"), 10),  # P2PLinkCrossCPU
        (GpuLink("NODE"), 20),  # P2PLinkSameCPU
        (GpuLink("HOSTBRIDGE"), 30),
        (GpuLink("MULTIPLE"), 40),
        (GpuLink("SINGLE"), 50),
        (GpuLink("INTERNAL"), 60),  # P2PLinkSameBoard
        (GpuLink("NODE", 1), 120),
        (GpuLink("SYSTEM", 12), 1210),
        (GpuLink("SINGLE", 18), 1850),  # EighteenNVLINKLinks is the largest type
        (GpuLink("SINGLE", 19), 50),  # nvlinkCountToType(19) is unknown: no NVLink entry
    ],
)
def test_link_scores(link: GpuLink, score: int) -> None:
    assert pair_scores({"a": {"b": link}, "b": {"a": link}}, ["a", "b"]).scores["a"]["b"] == score


def test_same_link_count_different_nvlinks_is_not_asymmetric() -> None:
    # upstream compares the number of link entries only, and scores from the first GPU's side
    links = {"a": {"b": GpuLink("NODE", 4)}, "b": {"a": GpuLink("NODE", 2)}}
    result = pair_scores(links, ["a", "b"])
    assert result.scores == {"a": {"b": 420}, "b": {"a": 220}} and result.asymmetric == ()


def test_only_the_registered_gpus_are_scored_in_register_order() -> None:
    link = GpuLink("NODE")
    links = {a: {b: link for b in "xyz" if b != a} for a in "xyz"}
    result = pair_scores(links, ["z", "x"])
    assert list(result.scores) == ["z", "x"] and result.scores == {"z": {"x": 20}, "x": {"z": 20}}


def test_wire_form_is_go_json_of_list_device_score() -> None:
    # DeviceScore{UUID `json:"uuid"`, Score map `json:"score"`}: fields in order, map keys sorted
    scores = pair_scores(
        {"GPU-1": {"GPU-0": GpuLink("NODE", 2)}, "GPU-0": {"GPU-1": GpuLink("NODE", 2)}}, ["GPU-1", "GPU-0"]
    ).scores
    value = encode_pair_scores(scores)
    assert value == '[{"uuid":"GPU-1","score":{"GPU-0":220}},{"uuid":"GPU-0","score":{"GPU-1":220}}]'
    assert decode_pair_scores(value) == scores
    # a single GPU still publishes its (empty) score map, as json.Marshal does
    assert encode_pair_scores(pair_scores({}, ["GPU-0"]).scores) == '[{"uuid":"GPU-0","score":{}}]'
