"""topology-aware choice and ties between equal devices, written from upstream HAMi's behaviour.

Expected picks follow upstream ``pkg/device/nvidia/device.go`` (v2.10): devices are sorted
ascending by ``DeviceUsageList.Less`` (for up to 12 devices Go's ``sort.Sort`` is an insertion
sort, so equal devices keep the node's order) and ``Fit`` visits them from the end, accepting
every passing one under topology-aware. Then ``computeWorstSingleCard`` (one GPU: the first
lowest sum of the device's scores to the others) or ``computeBestCombination`` (lexicographic
``nums``-combinations of the accepted list, each pair scored once as ``Scores[earlier][later]``,
first highest total, starting from no best). Empty devices under the default policy compare
equal, so the accepted list is the node's devices in reverse: ``d3, d2, d1, d0``. The first six
rows restate upstream's own ``TestFit_Topology*`` vectors.
"""

from __future__ import annotations

import pytest

from hamid.fit import Fitted, PodPolicy, fit_pod
from hamid.model import annotations as ann

from .helpers import dev, node, req, spec

TOPOLOGY = PodPolicy.from_annotations({ann.GPU_SCHEDULER_POLICY: "topology-aware"})

#: upstream's three-device table (TestFit_TopologyWorstSingleCard / ...BestCombination)
UPSTREAM = {"d0": {"d1": 100, "d2": 200}, "d1": {"d0": 100, "d2": 150}, "d2": {"d0": 200, "d1": 150}}
UPSTREAM_ZERO = {"d0": {"d1": 0, "d2": 0}, "d1": {"d0": 0, "d2": 0}, "d2": {"d0": 0, "d1": 0}}
UPSTREAM_NEGATIVE = {"d0": {"d1": -5, "d2": -3}, "d1": {"d0": -5, "d2": -1}, "d2": {"d0": -3, "d1": -1}}


def symmetric(pairs: dict[tuple[int, int], int]) -> dict[str, dict[str, int]]:
    """Scores as the plugin publishes them: the same value in both directions."""
    out: dict[str, dict[str, int]] = {}
    for (a, b), score in pairs.items():
        out.setdefault(f"d{a}", {})[f"d{b}"] = score
        out.setdefault(f"d{b}", {})[f"d{a}"] = score
    return out


#: four GPUs, mixed signs: 0-1 -10, 0-2 0, 0-3 5, 1-2 20, 1-3 -5, 2-3 0
MIXED = symmetric({(0, 1): -10, (0, 2): 0, (0, 3): 5, (1, 2): 20, (1, 3): -5, (2, 3): 0})
#: four GPUs, all negative: 0-1 -1, 0-2 -2, 0-3 -3, 1-2 -4, 1-3 -5, 2-3 -6
EQUAL3 = symmetric({(0, 1): -1, (0, 2): -1, (1, 2): -1})
NEGATIVE4 = symmetric({(0, 1): -1, (0, 2): -2, (0, 3): -3, (1, 2): -4, (1, 3): -5, (2, 3): -6})

CASES = [
    # (gpus on the node, GPUs requested, pair scores, expected devices)
    pytest.param(3, 1, UPSTREAM, {"d1"}, id="upstream-worst-single"),
    pytest.param(3, 2, UPSTREAM, {"d0", "d2"}, id="upstream-best-combination"),
    pytest.param(2, 2, {}, {"d0", "d1"}, id="upstream-exact-match"),
    # all combinations score 0: the first, (d2, d1), wins (upstream only asserts two devices)
    pytest.param(3, 2, UPSTREAM_ZERO, {"d1", "d2"}, id="upstream-zero-scores"),
    pytest.param(3, 1, UPSTREAM_NEGATIVE, {"d0"}, id="upstream-negative-single"),
    pytest.param(3, 2, UPSTREAM_NEGATIVE, {"d1", "d2"}, id="upstream-negative-pair"),
    # two GPUs
    pytest.param(2, 1, symmetric({(0, 1): -5}), {"d1"}, id="2gpu-negative-tie-first-tried"),
    pytest.param(2, 1, {"d1": {"d0": 3}}, {"d0"}, id="2gpu-missing-reverse-score"),
    pytest.param(2, 1, {}, {"d1"}, id="2gpu-no-scores"),
    pytest.param(2, 2, symmetric({(0, 1): -7}), {"d0", "d1"}, id="2gpu-negative-exact"),
    # three GPUs
    pytest.param(3, 2, EQUAL3, {"d1", "d2"}, id="3gpu-equal-negative"),
    pytest.param(3, 1, EQUAL3, {"d2"}, id="3gpu-equal-negative-single"),
    # only d0 publishes a score: the pair (d1, d0) reads d1's missing entry, so it scores 0 too
    pytest.param(3, 2, {"d0": {"d1": 50}}, {"d1", "d2"}, id="3gpu-one-direction-missing"),
    pytest.param(3, 2, {"d2": {"d0": 50}}, {"d0", "d2"}, id="3gpu-one-direction-present"),
    # four GPUs
    pytest.param(4, 2, MIXED, {"d1", "d2"}, id="4gpu-mixed-pair"),
    pytest.param(4, 3, MIXED, {"d1", "d2", "d3"}, id="4gpu-mixed-triple"),
    pytest.param(4, 1, MIXED, {"d0"}, id="4gpu-mixed-single"),
    pytest.param(4, 2, NEGATIVE4, {"d0", "d1"}, id="4gpu-all-negative-pair"),
    pytest.param(4, 3, NEGATIVE4, {"d0", "d1", "d2"}, id="4gpu-all-negative-triple"),
    pytest.param(4, 2, {}, {"d2", "d3"}, id="4gpu-missing-scores-pair"),
    pytest.param(4, 3, {}, {"d1", "d2", "d3"}, id="4gpu-missing-scores-triple"),
    pytest.param(4, 1, {}, {"d3"}, id="4gpu-missing-scores-single"),
]


@pytest.mark.parametrize(("gpus", "nums", "scores", "expected"), CASES)
def test_topology_aware_pick(gpus: int, nums: int, scores: dict, expected: set[str]) -> None:
    n = node(*(dev(f"d{i}", i) for i in range(gpus)), pair_scores=scores)
    result = fit_pod(n, spec(req(nums, mem=100, cores=10), policy=TOPOLOGY))
    assert isinstance(result, Fitted), result
    picked = [d.uuid for d in result.devices[0]]
    assert len(picked) == nums  # never an empty or short pick, whatever the scores
    assert set(picked) == expected


def test_topology_negative_scores_never_empty_for_every_size() -> None:
    # hamid used to start from a best of -1 with an empty pick: all-negative scores chose nothing
    for gpus in (3, 4):
        scores = symmetric({(a, b): -100 for a in range(gpus) for b in range(a + 1, gpus)})
        n = node(*(dev(f"d{i}", i) for i in range(gpus)), pair_scores=scores)
        for nums in range(1, gpus + 1):
            result = fit_pod(n, spec(req(nums), policy=TOPOLOGY))
            assert isinstance(result, Fitted) and len(result.devices[0]) == nums


@pytest.mark.parametrize("policy", ["spread", "binpack", "mutex", "topology-aware"])
def test_equal_devices_last_is_tried_first(policy: str) -> None:
    # devices that compare equal (same usage, same index 0 as in upstream's Fit tables): Go's
    # insertion sort keeps the node order and Fit takes the last one
    n = node(dev("first"), dev("middle"), dev("last"))
    pod_policy = PodPolicy.from_annotations({ann.GPU_SCHEDULER_POLICY: policy})
    result = fit_pod(n, spec(req(1), policy=pod_policy))
    assert isinstance(result, Fitted)
    assert [d.uuid for d in result.devices[0]] == ["last"]


def test_equal_devices_two_gpus_take_the_last_two_in_reverse() -> None:
    n = node(dev("a"), dev("b"), dev("c"))
    result = fit_pod(n, spec(req(2)))
    assert isinstance(result, Fitted)
    assert [d.uuid for d in result.devices[0]] == ["c", "b"]
