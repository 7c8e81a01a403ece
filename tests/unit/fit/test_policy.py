"""Device scores, sort orders and chains, node policy, pod policy annotations."""

from __future__ import annotations

import pytest

from hamid.fit import GpuPolicy, PodPolicy, best_first, device_score, request_memory, try_order
from hamid.model import annotations as ann
from hamid.model.annotations import ScoringWeights
from hamid.model.errors import InvalidInput

from .helpers import req


def test_compute_score_vectors():
    # HAMi gpu_policy_test.go: Count 10, Totalcore 4, Totalmem 8192, Used 2, Usedcores 1, Usedmem 2048.
    assert device_score(10, 4, 8192, 2, 1, 2048, req(1, mem=1024, cores=1)) == pytest.approx(11.75)
    assert device_score(10, 4, 8192, 2, 1, 2048, None) == pytest.approx(7.0)
    # a zero-count request adds nothing either
    assert device_score(10, 4, 8192, 2, 1, 2048, req(0, mem=1024, cores=1)) == pytest.approx(7.0)


def test_device_scores_are_go_float32():
    """Equal in exact arithmetic, unequal in upstream's float32 (so its sort has an order where a
    float64 score ties): Go's values, one rounding per operation."""
    assert device_score(10, 100, 24576, 1, 0, 20480, None) == 9.333333015441895
    assert device_score(10, 100, 24576, 1, 50, 8192, None) == 9.333333969116211


@pytest.mark.parametrize(("weights", "want"), [(ScoringWeights(), 16), ((1, 1, 3), 26), ((1, 3, 1), 34)])
def test_compute_score_with_weights(weights, want):
    # TestComputeScoreWithResourceWeights: gpu-a used 1, cores 90, mem 10 of 10/100/100, pct 40.
    w = weights if isinstance(weights, ScoringWeights) else ScoringWeights(*weights)
    assert device_score(10, 100, 100, 1, 90, 10, req(1, pct=40), w) == pytest.approx(want)


def test_score_zero_totals():
    assert device_score(0, 100, 100, 0, 0, 0, req()) == 0.0
    assert device_score(10, 0, 100, 0, 0, 0, req()) == 0.0
    assert device_score(10, 100, 0, 0, 0, 0, req()) == 0.0


def test_request_memory():
    assert request_memory(req(mem=3000), 11264) == 3000
    assert request_memory(req(pct=50), 11264) == 5632
    assert request_memory(req(pct=0), 11264) == 11264  # TestZeroMemoryPercentageIsAccountedAsWholeCard
    assert request_memory(req(), 11264) == 0


def test_parse_policies():
    assert GpuPolicy.parse("spread") == GpuPolicy("spread", None, False, False)
    assert GpuPolicy.parse("numa").chain == ("numa",)
    p = GpuPolicy.parse("binpack, mutex,numa,binpack,topology-aware")
    assert p.chain == ("binpack", "numa") and p.mutex and p.topology_aware
    assert GpuPolicy.parse("mutex,topology-aware").chain == ("spread",)
    assert GpuPolicy.parse("binpack,numa").sort_chain(numa_bind=True) == ("numa", "binpack")
    assert GpuPolicy.parse("numa,spread").sort_chain(numa_bind=True) == ("numa", "spread")
    assert GpuPolicy.parse("binpack,spread").sort_chain(numa_bind=False) == ("binpack", "spread")
    assert GpuPolicy.parse("binpack").sort_chain(numa_bind=True) is None


def _order(numas, scores, policy, numa_bind=False, useds=None):
    n = len(numas)
    return try_order(numas, scores, useds or [0] * n, list(range(n)), GpuPolicy.parse(policy), numa_bind)


def test_single_value_orders():
    numas, scores = [0, 1, 0, 1], [5.0, 1.0, 3.0, 3.0]
    assert _order(numas, scores, "binpack") == [0, 3, 2, 1]  # highest score first, ties: higher NUMA first
    assert _order(numas, scores, "spread") == [1, 3, 2, 0]  # lowest score first
    assert _order(numas, scores, "topology-aware") == _order(numas, scores, "spread")
    assert _order(numas, scores, "unknown") == _order(numas, scores, "spread")


def test_numa_bind_orders():
    numas, scores = [0, 1, 0, 1], [5.0, 1.0, 3.0, 3.0]
    # binpack + numa-bind: lowest NUMA group first, highest score first inside it
    assert _order(numas, scores, "binpack", numa_bind=True) == [0, 2, 3, 1]
    # spread + numa-bind: highest NUMA group first, lowest score first inside it
    assert _order(numas, scores, "spread", numa_bind=True) == [1, 3, 2, 0]


def test_mutex_order_least_used_first():
    assert _order([0, 0, 1], [0.0, 0.0, 0.0], "mutex", useds=[3, 0, 1]) == [1, 2, 0]
    # numa-bind does not change the mutex order
    assert _order([0, 0, 1], [0.0, 0.0, 0.0], "mutex", numa_bind=True, useds=[3, 0, 1]) == [1, 2, 0]


def test_chain_orders():
    numas, scores = [0, 1, 0, 1], [5.0, 1.0, 3.0, 3.0]
    # binpack,numa: score ascending then NUMA ascending then index; tried from the end
    assert _order(numas, scores, "binpack,numa") == [0, 3, 2, 1]
    # numa,binpack: NUMA ascending primary: NUMA 1 group tried first, highest score first
    assert _order(numas, scores, "numa,binpack") == [3, 1, 0, 2]
    assert _order(numas, scores, "numa") == [3, 1, 2, 0]  # numa then index (no score key)
    # spread,numa with numa-bind: numa moved first, spread inside
    assert _order(numas, scores, "spread,numa", numa_bind=True) == [1, 3, 2, 0]
    # mutex inside a chain is only a filter; an unknown-only chain means spread
    assert _order(numas, scores, "mutex,foo") == [1, 3, 2, 0]


def test_numa_bind_sort_preserves_affinity():
    # TestNumaBindSortPreservesAffinity: A_n0 5, B_n0 1, C_n1 3; spread.
    # With numa-bind the groups stay together: C (alone in NUMA 1) is tried first, then B, A.
    assert _order([0, 0, 1], [5.0, 1.0, 3.0], "spread", numa_bind=True) == [2, 1, 0]
    # Without grouping the order interleaves the NUMA nodes: B, C, A.
    assert _order([0, 0, 1], [5.0, 1.0, 3.0], "spread") == [1, 2, 0]


def test_score_primary_selects_across_numa():
    # TestScorePrimarySelectsAcrossNuma: P_n0 1, Q_n1 8, R_n1 5, spread => P first.
    assert _order([0, 1, 1], [1.0, 8.0, 5.0], "spread")[0] == 0


def _node_order(scored, node_policy, own=None, extra=()):
    """Flattened best_first order of candidates ``scored`` (request order) on a score index."""
    ranked = sorted([(score, name) for name, score in scored] + list(extra))
    position = {name: i for i, (name, _) in enumerate(scored)}
    return [name for group in best_first(ranked, node_policy, position, own) for name in group]


def test_node_policy():
    # binpack takes the highest node score, spread the lowest; ties go to the earliest candidate
    scored = [("d", 7.0), ("a", 3.0), ("b", 7.0), ("c", 1.0)]
    assert _node_order(scored, "binpack") == ["d", "b", "a", "c"]
    assert _node_order(scored, "spread") == ["c", "a", "d", "b"]
    # names of the index that are not candidates are left out
    assert _node_order(scored, "binpack", extra=[(9.0, "x")]) == ["d", "b", "a", "c"]
    assert _node_order([], "binpack") == []


def test_node_policy_places_own_node_by_its_own_score():
    scored = [("a", 3.0), ("b", 7.0), ("c", 1.0)]
    # "c" is indexed at 1.0, but the re-filtered pod sees its own booking there as free (5.0)
    assert _node_order(scored, "binpack", own=(5.0, "c")) == ["b", "c", "a"]
    assert _node_order(scored, "spread", own=(5.0, "c")) == ["a", "c", "b"]
    assert _node_order(scored, "binpack", own=(7.0, "c")) == ["b", "c", "a"]
    assert _node_order(scored, "binpack", own=(0.5, "c")) == ["b", "a", "c"]


def test_pod_policy_from_annotations():
    p = PodPolicy.from_annotations(
        {
            ann.GPU_SCHEDULER_POLICY: "binpack,numa",
            ann.NODE_SCHEDULER_POLICY: "spread",
            ann.DEVICE_SCORING_WEIGHTS: "slot=1,core=2,memory=3",
            ann.NUMA_BIND: "true",
            ann.USE_GPU_UUID: "GPU-a, GPU-b",
            ann.NOUSE_GPU_UUID: "GPU-c",
            ann.USE_GPU_TYPE: "a100,h100",
            ann.NOUSE_GPU_TYPE: "mig",
            ann.VGPU_MODE: "hami-core",
        },
        default_gpu_policy="spread",
        default_node_policy="binpack",
    )
    assert p.gpu_policy.chain == ("binpack", "numa") and p.node_policy == "spread"
    assert p.weights == ScoringWeights(1, 2, 3) and p.numa_bind
    assert p.uuid_allowed("GPU-a") and not p.uuid_allowed("GPU-c") and not p.uuid_allowed("GPU-z")
    assert p.type_allowed("NVIDIA-A100-SXM4") and not p.type_allowed("NVIDIA-V100")
    assert not p.type_allowed("NVIDIA-A100-MIG")
    assert p.vgpu_mode == "hami-core"


def test_pod_policy_defaults_and_blank_values():
    p = PodPolicy.from_annotations(
        {ann.USE_GPU_UUID: " ", ann.NUMA_BIND: "", ann.GPU_SCHEDULER_POLICY: ""}, "binpack", "spread"
    )
    assert p == PodPolicy.default("binpack", "spread")
    assert p.uuid_allowed("anything") and p.type_allowed("anything") and not p.numa_bind
    assert PodPolicy.from_annotations(None) == PodPolicy.default()


@pytest.mark.parametrize(
    "annotations",
    [
        {ann.DEVICE_SCORING_WEIGHTS: "slot=1,core=1"},
        {ann.DEVICE_SCORING_WEIGHTS: "slot=0,core=0,memory=0"},
        {ann.DEVICE_SCORING_WEIGHTS: "slot=-1,core=1,memory=1"},
        {ann.NUMA_BIND: "yes please"},
    ],
)
def test_pod_policy_invalid(annotations):
    with pytest.raises(InvalidInput):
        PodPolicy.from_annotations(annotations)
