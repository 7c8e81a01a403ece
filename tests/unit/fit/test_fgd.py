"""FGD maths on hand-computable nodes: fragmentation, the NUMA-aware fragment, placements, the histogram."""

from __future__ import annotations

import math
import random

import pytest

from hamid.fit import fgd
from hamid.fit.fgd import (
    EMPTY,
    GAIN_STEP,
    HALF_LIFE_RANGE,
    TYPICAL_SHAPES,
    UNALIGNED,
    Gpu,
    NodeState,
    NumaRoom,
    Shape,
    ShapeHistogram,
    Workload,
    best_placement,
    fragmentation,
    gain_steps,
    kubelet_home,
    memory_bucket,
    parse_workload,
    pod_shape,
)
from hamid.fit.node_room import CpuMem
from hamid.model.errors import InvalidInput
from hamid.model.resources import MEM_PERCENTAGE_UNSET, ContainerDeviceRequest

HALF = Shape(1000, 1024, 1, 500)
WHOLE_1 = Shape(2000, 1024, 1, 1000)
CPU_ONLY = Shape(4000, 1024, 0, 0)


def node(
    *frees: int, cpu: int = 64_000, memory: int = 256_000, numa: tuple[tuple[int, ...], ...] | None = None
) -> NodeState:
    """GPUs with the given free milli-GPU, the first half on NUMA 0, the rest on NUMA 1; ``numa``:
    per NUMA node (free, assignable[, free replicas]) exclusive CPUs."""
    half = max(len(frees) // 2, 1)
    rooms = None if numa is None else tuple(NumaRoom(*room) for room in numa)
    return NodeState.of(cpu, memory, (Gpu(f, i // half, "A100") for i, f in enumerate(frees)), rooms)


def frag(state: NodeState, *weighted: tuple[Shape, float]) -> float:
    return fragmentation(state, Workload.of(weighted))


def test_paper_cases_by_hand() -> None:
    state = node(1000, 300)  # 1300 idle
    assert frag(state, (HALF, 1)) == 300  # the 300 GPU is too small for a half
    assert frag(state, (WHOLE_1, 1)) == 300  # the partly used GPU cannot take a whole one
    assert frag(state, (CPU_ONLY, 1)) == 1300  # needs no GPU: all idle GPU is fragment
    assert frag(state, (HALF, 1), (CPU_ONLY, 1)) == pytest.approx(800)  # 0.5*300 + 0.5*1300
    assert frag(state, (Shape(1000, 1024, 2, 1000), 1)) == 1300  # two whole GPUs: too few have room
    assert frag(node(1000, 300, cpu=500), (HALF, 1)) == 1300  # short of CPU: cannot run at all
    assert frag(node(1000, 300, memory=100), (HALF, 1)) == 1300  # short of memory
    assert frag(node(0, 0), (HALF, 1)) == 0  # nothing idle, nothing fragmented
    assert fragmentation(state, EMPTY) == 0


def test_shortage_read_by_levels_equals_the_shortage_of_each_node() -> None:
    """A workload memoises which shapes a node is short of by how many shapes ask more CPU and
    more memory than it has: nodes on either side of every ask, read through one warm workload,
    get exactly what a fresh workload gives each of them."""
    weighted = (
        (Shape(2000, 4096, 1, 500), 3),
        (Shape(4000, 1024, 1, 500), 2),
        (Shape(4000, 8192, 1, 1000), 2),
        (Shape(8000, 2048, 2, 1000), 1),
        (CPU_ONLY, 1),
    )
    warm = Workload.of(weighted)
    asks = sorted({s.cpu for s, _ in weighted} | {0, 64_000})
    memories = sorted({s.memory for s, _ in weighted} | {0, 256_000})
    seen = set()
    for cpu in (c + d for c in asks for d in (-1, 0, 1)):
        for memory in (m + d for m in memories for d in (-1, 0, 1)):
            state = node(1000, 600, 1000, cpu=cpu, memory=memory)
            assert fragmentation(state, warm) == fragmentation(state, Workload.of(weighted))
            seen.add(warm.levels(cpu, memory))
    assert len(warm.runnable) == len(seen) > 10  # one entry per levels, however many nodes
    assert warm.levels(4000, 4096) == (1, 1)  # only the 8-CPU shape asks more CPU, only 8 GiB more memory


def test_wrong_model_is_fragment() -> None:
    v100 = Shape(1000, 1024, 1, 500, models=("V100",))
    assert frag(node(1000, 300), (v100, 1)) == 1300
    a100 = Shape(1000, 1024, 1, 500, models=("V100", "A100"))
    assert frag(node(1000, 300), (a100, 1)) == 300


def test_gpus_beside_exhausted_numa_cpus_are_fragment() -> None:
    aligned = Shape(4000, 1024, 1, 1000, exclusive=4)
    # NUMA 0 has 2 free exclusive CPUs of 30, NUMA 1 has 20: GPU 0 (NUMA 0) cannot be used aligned
    state = node(1000, 1000, numa=((2, 30), (20, 30)))
    assert frag(state, (aligned, 1)) == 1000
    assert frag(state, (aligned._replace(exclusive=0), 1)) == 0  # the paper's view: no fragment
    assert frag(node(1000, 1000), (aligned, 1)) == 0  # no NUMA knowledge: the paper's view
    # both NUMA nodes out of CPUs: the aligned shape cannot run aligned anywhere
    assert frag(node(1000, 1000, numa=((2, 30), (3, 30))), (aligned, 1)) == 2000


def test_shape_that_never_fits_one_numa_node_is_judged_unaligned() -> None:
    wide = Shape(40_000, 1024, 1, 1000, exclusive=40)  # more CPUs than a NUMA node has
    assert frag(node(1000, 1000, numa=((30, 30), (30, 30))), (wide, 1)) == 0
    four = Shape(4000, 1024, 4, 1000, exclusive=4)  # four GPUs: two per NUMA node
    assert frag(node(1000, 1000, 1000, 1000, numa=((30, 30), (30, 30))), (four, 1)) == 0


def test_a_shape_kubelet_would_reject_cannot_use_the_node() -> None:
    """Under ``restricted`` / ``single-numa-node`` a shape wider than a NUMA node runs only where one
    NUMA node has its exclusive CPUs and replicas (kubelet then gives its CPUs there, its GPUs
    anywhere); elsewhere the merged hint is never preferred and kubelet rejects it."""

    def rejecting(*frees: int, numa: tuple[tuple[int, ...], ...]) -> NodeState:
        return node(*frees, numa=numa)._replace(rejects_unpreferred=True)

    wide = Shape(12_000, 1024, 1, 1000, exclusive=12)  # 12 CPUs on a node of 8 per NUMA node
    small_node = ((8, 8), (8, 8))
    assert frag(node(1000, 1000, numa=small_node), (wide, 1)) == 0  # best-effort: runs unaligned
    assert frag(rejecting(1000, 1000, numa=small_node), (wide, 1)) == 2000  # restricted: never
    four = Shape(40_000, 1024, 4, 1000, exclusive=40)  # four GPUs, CPUs of one NUMA node
    assert frag(rejecting(1000, 1000, 1000, 1000, numa=((40, 48), (48, 48))), (four, 1)) == 0
    assert frag(rejecting(1000, 1000, 1000, 1000, numa=((30, 48), (30, 48))), (four, 1)) == 4000
    narrow = Shape(4000, 1024, 1, 1000, exclusive=4)  # fits one NUMA node: judged aligned as before
    assert frag(rejecting(1000, 1000, numa=((2, 8), (8, 8))), (narrow, 1)) == 1000
    assert frag(rejecting(1000, 1000, numa=small_node), (narrow._replace(exclusive=0), 1)) == 0


def test_placement_takes_the_gpu_that_removes_most_fragmentation() -> None:
    workload = Workload.of([(HALF, 1)])
    state = node(1000, 700)  # F = 0: both can take a half

    def f(s: NodeState) -> float:
        return fragmentation(s, workload)

    small = Shape(1000, 1024, 1, 200)
    placed = best_placement(state, small, f)
    # on GPU 1 (700 -> 500) nothing is lost; on GPU 0 (1000 -> 800) neither: tie to the tightest
    assert placed is not None and placed.gpus == (1,) and placed.gain == 0
    placed = best_placement(state, Shape(1000, 1024, 1, 300), f)
    # GPU 1 700 -> 400 strands 400; GPU 0 1000 -> 700 strands nothing
    assert placed is not None and placed.gpus == (0,) and placed.gain == 0
    assert best_placement(state, Shape(1000, 1024, 1, 1000), f) is not None
    assert best_placement(state, Shape(1000, 1024, 2, 1000), f) is None
    assert best_placement(node(1000, cpu=10), small, f) is None


def test_cpu_only_pod_is_placed_without_gpus_and_never_gains() -> None:
    workload = Workload.of([(Shape(2000, 1024, 1, 500), 1)])

    def f(s: NodeState) -> float:
        return fragmentation(s, workload)

    pod = Shape(3000, 1024, 0, 0)
    roomy = best_placement(node(1000, 1000), pod, f)
    assert roomy is not None and roomy.gpus == () and roomy.gain == 0  # still room for the typical pod
    tight = best_placement(node(1000, 1000, cpu=4000), pod, f)
    # 4 CPUs backed 2 of the 4 typical pods the GPUs hold (half their room); 1 CPU left: none
    assert tight is not None and tight.gain == -1000
    assert best_placement(node(0, 0, cpu=4000), pod, f) == (0.0, ())  # nothing idle to strand
    assert best_placement(node(1000, cpu=2000), pod, f) is None  # no room for it


def test_a_shares_room_counts_only_as_far_as_the_free_cpu_backs_its_pods() -> None:
    """Four 250 milli-GPU pods of 4 CPUs fit an idle GPU: 16 CPUs use all of it, 8 CPUs half (the
    other half is fragment), fewer than 4 none; whole GPUs are used by one pod each, as before."""
    share = Shape(4000, 1024, 1, 250)
    for cpu, fragment in ((16_000, 0.0), (32_000, 0.0), (8_000, 500.0), (6_000, 625.0), (3_999, 1000.0)):
        assert frag(node(1000, cpu=cpu), (share, 1)) == fragment
    whole = Shape(4000, 1024, 1, 1000)
    assert frag(node(1000, 1000, cpu=4_000), (whole, 1)) == 0.0  # whole GPUs: the paper's rule
    halves = Shape(4000, 1024, 2, 500)  # two GPUs at a time: the paper's rule too
    assert frag(node(1000, 1000, cpu=4_000), (halves, 1)) == 0.0
    assert frag(node(1000, cpu=0), (Shape(0, 1024, 1, 0), 1)) == 0.0  # a share of nothing: no pods to back
    # the share's pods on what its GPUs hold: 700 and 300 free hold two 250s and one
    assert frag(node(700, 300, cpu=8_000), (share, 1)) == pytest.approx(1000 * (1 - 8 / 12))


def test_aligned_placement_prefers_the_numa_node_with_cpus() -> None:
    aligned = Shape(4000, 1024, 1, 1000, exclusive=4)
    workload = Workload.of([(aligned, 1)])
    state = node(1000, 1000, numa=((2, 30), (20, 30)))
    placed = best_placement(state, aligned, lambda s: fragmentation(s, workload))
    assert placed is not None and placed.gpus == (1,)


def test_kubelet_puts_an_aligned_pods_cpus_on_the_lowest_numa_node_with_cpus_and_replicas() -> None:
    aligned = Shape(4000, 1024, 1, 1000, exclusive=4)
    # both NUMA nodes have the CPUs and replicas: the Topology Manager takes the lower one
    assert kubelet_home(node(0, 1000, numa=((20, 32, 16), (32, 32, 16))), aligned) == 0
    assert kubelet_home(node(0, 1000, numa=((3, 32, 16), (32, 32, 16))), aligned) == 1  # NUMA 0: 3 CPUs
    assert kubelet_home(node(0, 1000, numa=((20, 32, 0), (32, 32, 16))), aligned) == 1  # no replica left
    assert kubelet_home(node(0, 1000, numa=((3, 32, 16), (2, 32, 16))), aligned) is None
    assert kubelet_home(node(0, 1000), aligned) is None  # no NUMA knowledge


def test_a_gpu_off_kubelets_numa_node_is_fragment_for_aligned_shapes() -> None:
    aligned = Shape(4000, 1024, 1, 1000, exclusive=4)
    # GPU 0 (NUMA 0) is used up but still shows free replicas, so kubelet gives NUMA 0's CPUs:
    # GPU 1 (NUMA 1) cannot serve the aligned shape aligned, though NUMA 1 has its CPUs
    assert frag(node(0, 1000, numa=((20, 32, 16), (32, 32, 16))), (aligned, 1)) == 1000
    # NUMA 0 short of CPUs (or of replicas): kubelet gives NUMA 1's, where GPU 1 serves it
    assert frag(node(0, 1000, numa=((3, 32, 16), (32, 32, 16))), (aligned, 1)) == 0
    assert frag(node(0, 1000, numa=((20, 32, 0), (32, 32, 16))), (aligned, 1)) == 0
    # a Burstable shape of the same GPU part uses GPU 1 anyway
    assert frag(node(0, 1000, numa=((20, 32, 16), (32, 32, 16))), (aligned._replace(exclusive=0), 1)) == 0


def test_an_unaligned_placement_ranks_below_every_aligned_one() -> None:
    aligned = Shape(4000, 1024, 1, 1000, exclusive=4)
    workload = Workload.of([(aligned, 1)])

    def f(s: NodeState) -> float:
        return fragmentation(s, workload)

    # GPU 0 used up: the pod can only go to GPU 1, off the NUMA node kubelet gives its CPUs; it
    # removes GPU 1's fragment (F 1000 -> 0) but runs unaligned
    off = best_placement(node(0, 1000, numa=((20, 32, 16), (32, 32, 16))), aligned, f)
    assert off is not None and off.gpus == (1,) and off.gain == 1000 - UNALIGNED
    on = best_placement(node(1000, 1000, numa=((20, 32, 16), (32, 32, 16))), aligned, f)
    # GPU 0 on NUMA 0 (16 CPUs left there); GPU 1 is fragment before and after (F 1000 -> 1000)
    assert on is not None and on.gpus == (0,) and on.gain == 0
    assert on.gain > off.gain
    # on a node none of whose NUMA nodes holds two GPUs, a 2-GPU aligned pod is unaligned too
    pair = Shape(4000, 1024, 2, 1000, exclusive=4)
    spread = best_placement(node(1000, 1000, numa=((20, 32, 16), (32, 32, 16))), pair, f)
    assert spread is not None and spread.gpus == (0, 1) and spread.gain < -UNALIGNED / 2
    # without NUMA knowledge nothing is unaligned
    plain = best_placement(node(0, 1000), aligned, f)
    assert plain is not None and plain.gain == 0


def test_histogram_decays_and_covers_95_percent() -> None:
    histogram = ShapeHistogram(half_life=1)
    histogram.observe(HALF)
    histogram.observe(WHOLE_1)
    weights = histogram.weights()
    bucketed = {s._replace(memory=1024): w for s, w in weights.items()}
    assert bucketed[HALF] == pytest.approx(0.25) and bucketed[WHOLE_1] == pytest.approx(0.5)
    shapes = dict(histogram.typical(coverage=0.5).shapes)
    assert list(shapes) == [WHOLE_1] and shapes[WHOLE_1] == 1.0
    assert len(histogram.typical(coverage=0.95).shapes) == 2
    assert ShapeHistogram().typical() is EMPTY


def test_histogram_covers_the_most_frequent_shapes() -> None:
    histogram = ShapeHistogram(half_life=1e9)
    for _ in range(96):
        histogram.observe(HALF)
    for _ in range(3):
        histogram.observe(WHOLE_1)
    histogram.observe(CPU_ONLY)
    assert [s.share for s, _ in histogram.typical().shapes] == [500]
    with pytest.raises(InvalidInput, match="half-life"):
        ShapeHistogram(half_life=0)


@pytest.mark.parametrize("half_life", [1e-300, 0.01, 0.5, 1e13, math.inf, math.nan])
def test_a_half_life_outside_its_range_is_refused_naming_the_range(half_life: float) -> None:
    """1e-300 overflowed the decay factor; 0.01 dropped every pod at the first rescale (an empty
    workload for good); past 10^12 the decay nears float precision."""
    with pytest.raises(InvalidInput, match=r"must be 1 to 1,000,000,000,000 pods"):
        ShapeHistogram(half_life=half_life)


def test_the_shortest_half_life_still_learns_the_newest_pods() -> None:
    histogram = ShapeHistogram(half_life=HALF_LIFE_RANGE[0])
    for _ in range(500):  # many rescales
        histogram.observe(WHOLE_1)
    histogram.observe(HALF)
    assert {s.share for s, _ in histogram.typical().shapes} == {500, 1000}


def test_the_typical_workload_keeps_at_most_typical_shapes() -> None:
    """A long tail of unique shapes (one tenant's per-job sizes) would pull thousands into the
    95 %, each fragmentation a pass over them: the most frequent TYPICAL_SHAPES are kept."""
    histogram = ShapeHistogram(half_life=1e9)
    for _ in range(800):
        histogram.observe(HALF)
    for i in range(1000):
        histogram.observe(Shape(1000, 1024, 1, 500, (f"X{i}",)))
    typical = histogram.typical()
    assert len(typical.shapes) == TYPICAL_SHAPES
    assert max(typical.shapes, key=lambda entry: entry[1])[0] == HALF
    assert math.isclose(sum(p for _, p in typical.shapes), 1.0)


def test_a_histogram_of_ever_new_shapes_stays_bounded_and_learns_the_same_workload(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Pods of ever-new requests (per-job sizing) fold the lightest shapes into one remainder past
    SHAPES_KEPT; the typical workload is the one every shape kept would give, since the folded
    weight stays under 1 - COVERAGE (the remainder still counts in the total)."""
    monkeypatch.setattr(fgd, "SHAPES_KEPT", 200)
    rng = random.Random(5)
    folded, whole = ShapeHistogram(half_life=500), ShapeHistogram(half_life=500)
    monkeypatch.setattr(whole, "_fold", lambda: None)  # the reference keeps every shape
    for i in range(5000):
        shape = (
            (HALF, WHOLE_1, CPU_ONLY)[rng.randrange(3)]
            if rng.random() < 0.93
            else Shape(1000 + i, 1024, 0, 0)
        )
        folded.observe(shape)
        whole.observe(shape)
    assert len(folded.weights()) <= 200 < len(whole.weights())
    learned, reference = dict(folded.typical().shapes), dict(whole.typical().shapes)
    assert learned.keys() == reference.keys() and len(learned) > 3  # the few heavy shapes and new ones
    assert all(learned[s] == pytest.approx(reference[s]) for s in reference)
    unique = ShapeHistogram(half_life=500)
    for i in range(5000):
        unique.observe(Shape(1000 + i, 1024, 0, 0))
    assert len(unique.weights()) <= 200 and len(unique.typical().shapes) <= 200


def test_memory_buckets() -> None:
    assert memory_bucket(1024) == 1024
    assert memory_bucket(1025) == 1218  # next quarter doubling
    assert memory_bucket(0) == 0


def _request(nums: int, cores: int, pct: int = MEM_PERCENTAGE_UNSET, mem: int = 0) -> ContainerDeviceRequest:
    return ContainerDeviceRequest(
        nums=nums, type="NVIDIA", memreq=mem, mem_percentage_req=pct, coresreq=cores
    )


def test_pod_shape() -> None:
    shape = pod_shape([_request(1, 30, 40)], ("A100",), CpuMem(4000, 8 << 30), guaranteed=True)
    assert shape == Shape(4000, 8192, 1, 400, ("A100",), 4)
    assert pod_shape([_request(1, 30, 40)], None, CpuMem(4500, 0), guaranteed=True).exclusive == 0
    assert pod_shape([_request(1, 30, 40)], None, CpuMem(4000, 0), guaranteed=False).exclusive == 0
    assert pod_shape([_request(2, 0)], None, CpuMem(), False)[2:4] == (2, 1000)  # no share: whole GPUs
    assert pod_shape([None], ("A100",), CpuMem(8000, 0), True) == Shape(8000, 0, 0, 0, None, 0)


def test_pinned_workload() -> None:
    workload = parse_workload(
        [
            {"cpu": "4", "memory": "16Gi", "gpus": 1, "gpuShare": 50, "weight": 3},
            {"cpu": "8", "gpus": 1, "aligned": True, "gpuModels": ["a100"]},
            {"cpu": "500m"},
        ]
    )
    shapes = dict(workload.shapes)
    assert shapes[Shape(4000, 16384, 1, 500)] == pytest.approx(0.6)
    assert shapes[Shape(8000, 0, 1, 1000, ("A100",), 8)] == pytest.approx(0.2)
    assert shapes[Shape(500, 0, 0, 0)] == pytest.approx(0.2)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"cpu": 1}, "non-empty list"),
        ([], "non-empty list"),
        (["x"], "entry 0: want a mapping"),
        ([{"cpus": 1}], "entry 0: unknown key 'cpus'"),
        ([{"cpu": "lots"}], "entry 0.cpu"),
        ([{"cpu": "-1"}], "must not be negative"),
        ([{"gpus": -1}], "entry 0.gpus"),
        ([{"gpus": 1, "gpuShare": 0}], "gpuShare"),
        ([{"gpus": 1, "gpuShare": 101}], "gpuShare"),
        ([{"gpus": 1, "gpuModels": "A100"}], "gpuModels"),
        ([{"cpu": "1500m", "gpus": 1, "aligned": True}], "whole CPUs"),
        ([{"cpu": 1, "aligned": "yes"}], "aligned"),
        ([{"cpu": 1, "weight": 0}], "weight"),
        ([{"cpu": 1}, {"cpu": 2, "weight": True}], "entry 1.weight"),
        ([{"cpu": 1, "weight": 10**400}], "entry 0.weight: 1000.* is out of range"),  # no OverflowError
        ([{"cpu": 1, "weight": 1e308}, {"cpu": 2, "weight": 1e308}], "add up past the largest number"),
    ],
)
def test_bad_pinned_workload(data: object, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        parse_workload(data)


def test_gains_compare_in_whole_steps() -> None:
    """Gains within one step are equal (the ties then go to the nodes' fixed order)."""
    assert gain_steps(0) == gain_steps(GAIN_STEP - 1) == 0
    assert gain_steps(GAIN_STEP) == gain_steps(2 * GAIN_STEP - 0.5) == 1
    assert gain_steps(-1) == gain_steps(-GAIN_STEP) == -1
    assert gain_steps(-math.inf) == -math.inf
    assert gain_steps(99, step=100) == 0 and gain_steps(100, step=100) == 1  # the model's variants
