"""The rule both sides share: which free replicas kubelet sees (``full``, ``busy``, ``span``, ``steer``)."""

from __future__ import annotations

from hamid.fit.fgd import (
    Gpu,
    NodeState,
    NumaRoom,
    Shape,
    Workload,
    after,
    aligned_homes,
    fragmentation,
    gpu_use,
    kubelet_home,
    spans_idle_node,
)
from hamid.fit.numa_fit import gpu_replicas
from hamid.fit.numa_predict import NumaLedger
from hamid.fit.replica_room import (
    effective_rule,
    hidden_replicas,
    hides,
    idle_on_node,
    lists_one_per_gpu,
    no_room,
    omitted_by_gpu,
    omitted_replicas,
    steered_numa,
)
from hamid.fit.usage import DeviceAmount, NodeUsage
from hamid.model.devices import MODE_HAMI_CORE, MODE_MIG, DeviceInfo

GPU = "nvidia.com/gpu"


def _usage(*numas: int, mode: str = MODE_HAMI_CORE) -> NodeUsage:
    infos = [DeviceInfo(f"g{i}", i, 10, 8000, 100, "NVIDIA-A100", n, mode, True) for i, n in enumerate(numas)]
    return NodeUsage.from_infos("n1", infos)


def test_no_room_is_memory_or_cores_at_capacity() -> None:
    assert no_room(8000, 8000, 10, 100) and no_room(10, 8000, 100, 100)
    assert not no_room(7999, 8000, 99, 100)
    assert not no_room(0, 0, 0, 0)  # a capacity of 0 registers nothing on that axis


def test_hidden_replicas_count_the_free_ones_of_full_gpus_per_numa_node() -> None:
    usage = _usage(0, 0, 1)
    usage.add(
        {"g0": DeviceAmount(2, 8000, 20), "g1": DeviceAmount(1, 4000, 50), "g2": DeviceAmount(3, 10, 100)}
    )
    assert hidden_replicas(usage, "full") == {0: 8, 1: 7}
    assert gpu_replicas(usage, "full") == {"g0": (0, 0), "g1": (0, 9), "g2": (1, 0)}
    assert gpu_replicas(usage) == {"g0": (0, 8), "g1": (0, 9), "g2": (1, 7)}
    assert hidden_replicas(usage, "busy") == {0: 8, 1: 7}  # no GPU idle: busy hides as full
    assert hidden_replicas(usage, None) == {}
    mig = _usage(0, mode=MODE_MIG)
    mig.add({"g0": DeviceAmount(1, 8000, 100)})
    assert hidden_replicas(mig, "full") == {}  # MIG nodes never take part


def test_the_rule_by_room_idleness_and_an_idle_gpu_on_the_node() -> None:
    for rule in ("full", "busy"):
        assert hides(rule, room=False, idle=False, idle_on_node=True)
        assert not hides(rule, room=True, idle=True, idle_on_node=True)  # an idle GPU is never hidden
        assert not hides(rule, room=True, idle=False, idle_on_node=False)  # no idle GPU: offered again
    assert hides("busy", room=True, idle=False, idle_on_node=True)
    assert not hides("full", room=True, idle=False, idle_on_node=True)
    assert not hides(None, room=False, idle=False, idle_on_node=True)


def test_busy_hides_partly_booked_gpus_while_an_idle_healthy_one_exists_and_keeps_pending_ones() -> None:
    usage = _usage(0, 0, 1)
    usage.add({"g0": DeviceAmount(1, 2000, 30)})  # a share on g0 (NUMA 0), g1 and g2 idle
    assert idle_on_node(usage)
    assert hidden_replicas(usage, "busy") == {0: 9}
    assert hidden_replicas(usage, "full") == {}
    assert gpu_replicas(usage, "busy") == {"g0": (0, 0), "g1": (0, 10), "g2": (1, 10)}
    # the replica a pending booking on g0 needs stays offered (the plugin keeps it Healthy)
    assert gpu_replicas(usage, "busy", {"g0": 1}) == {"g0": (0, 1), "g1": (0, 10), "g2": (1, 10)}
    assert hidden_replicas(usage, "busy", {"g0": 1}) == {0: 8}
    usage.add({"g1": DeviceAmount(1, 1000, 10), "g2": DeviceAmount(1, 1000, 10)})
    assert not idle_on_node(usage) and hidden_replicas(usage, "busy") == {}  # offered again
    sick = _usage(0, 1)
    sick.add({"g0": DeviceAmount(1, 2000, 30)})
    sick.devices[1].health = False  # an unhealthy GPU is no idle one
    assert hidden_replicas(sick, "busy") == {}


def test_the_ledger_kubelet_sees_has_fewer_free_replicas_and_the_same_totals() -> None:
    ledger = NumaLedger(1, range(8), {GPU: {0: (20, 18), 1: (10, 10)}})
    visible = ledger.hiding(GPU, {0: 9, 1: 12})
    assert visible.device_counts(GPU) == {0: (20, 9), 1: (10, 0)}
    assert ledger.device_counts(GPU) == {0: (20, 18), 1: (10, 10)}  # a copy
    assert ledger.hiding(GPU, {}) is ledger
    # replicas left out of the list are not counted at all: fewer totals too
    assert ledger.hiding(GPU, {}, {0: 18, 1: 9}).device_counts(GPU) == {0: (2, 0), 1: (1, 1)}
    assert ledger.hiding(GPU, {}, {}) is ledger


def test_span_acts_only_under_restricted() -> None:
    """Under ``single-numa-node`` a spanning hint could only reject pods, under ``best-effort`` and
    ``none`` it changes nothing: there ``span`` is ``busy``."""
    assert effective_rule("span", "restricted") == "span"
    for policy in ("single-numa-node", "best-effort", "none", None):
        assert effective_rule("span", policy) == "busy"
    assert effective_rule("busy", None) == "busy" and effective_rule(None, "restricted") is None


def test_span_lists_one_replica_per_gpu_while_nothing_is_booked() -> None:
    usage = _usage(0, 0, 1, 1)
    assert lists_one_per_gpu("span", usage) and not lists_one_per_gpu("busy", usage)
    assert omitted_by_gpu(usage, "span") == {"g0": 9, "g1": 9, "g2": 9, "g3": 9}
    assert omitted_replicas(usage, "span") == {0: 18, 1: 18}
    # a pending booking keeps the replicas it needs listed
    assert omitted_by_gpu(usage, "span", {"g0": 3}) == {"g0": 7, "g1": 9, "g2": 9, "g3": 9}
    assert gpu_replicas(usage, "span") == {"g0": (0, 1), "g1": (0, 1), "g2": (1, 1), "g3": (1, 1)}
    assert omitted_by_gpu(usage, "busy") == {} and hidden_replicas(usage, "span") == {}
    # once anything is booked, every replica is listed and span hides as busy does
    usage.add({"g0": DeviceAmount(1, 2000, 30)})
    assert omitted_by_gpu(usage, "span") == {}
    assert hidden_replicas(usage, "span") == hidden_replicas(usage, "busy") == {0: 9}
    mig = _usage(0, mode=MODE_MIG)
    assert omitted_by_gpu(mig, "span") == {}  # MIG nodes never take part


def test_fgd_a_shape_wider_than_any_numa_node_uses_an_idle_span_node_under_restricted() -> None:
    """Eight whole GPUs and 65 exclusive CPUs on a node of 4 + 4 GPUs and 64 + 64 CPUs: kubelet
    never admits it where every replica is listed (``busy``), but does on an idle ``span`` node;
    a node with a share booked lists every replica again."""
    wide = Shape(65_000, 1024, 8, 1000, exclusive=65)
    share = Shape(1000, 1024, 1, 300)
    rooms = (NumaRoom(64, 64, 80), NumaRoom(64, 64, 80))
    gpus = tuple(Gpu(1000, i // 4, "A100") for i in range(8))
    for rule, runs in (("span", True), ("busy", False)):
        state = NodeState.of(128_000, 256_000, gpus, rooms, hide=rule, rejects_unpreferred=True)
        assert spans_idle_node(state, wide) is runs
        assert gpu_use(state, wide)[0] == (8000 if runs else 0)
        assert not spans_idle_node(after(state, share, (0,)), wide)
    few_cpus = NodeState.of(128_000, 256_000, gpus, (NumaRoom(30, 64, 80),) * 2, hide="span")
    assert not spans_idle_node(few_cpus, wide)  # 60 free exclusive CPUs: not enough
    # CPUs one NUMA node can assign: the CPU manager prefers that node, the device manager only the
    # span (one replica listed per GPU), so kubelet rejects it on the idle span node
    narrow = Shape(64_000, 1024, 8, 1000, exclusive=64)
    assert not spans_idle_node(NodeState.of(128_000, 256_000, gpus, rooms, hide="span"), narrow)
    four = Shape(65_000, 1024, 4, 1000, exclusive=65)  # 4 GPUs fit one NUMA node's listed GPUs
    assert not spans_idle_node(NodeState.of(128_000, 256_000, gpus, rooms, hide="span"), four)


def test_fgd_filling_the_last_gpu_of_a_numa_node_moves_kubelets_choice() -> None:
    """Where the plugin hides, the aligned shape's home moves to NUMA 1 once GPU 0 is full, so
    GPU 1 is no fragment for it any more; without hiding GPU 0's free replicas keep it on NUMA 0."""
    aligned = Shape(4000, 1024, 1, 500, exclusive=4)
    rooms = (NumaRoom(20, 32, 16), NumaRoom(32, 32, 16))
    gpus = (Gpu(500, 0, "A100"), Gpu(1000, 1, "A100"))
    workload = Workload.of([(aligned, 1)])
    for rule, home in (("full", 1), (None, 0)):
        state = NodeState.of(64_000, 256_000, gpus, rooms, hide=rule)
        filled = after(state, aligned, (0,))
        assert kubelet_home(filled, aligned) == home
        assert fragmentation(filled, workload) == (0 if rule else 1000)


def test_fgd_busy_moves_kubelets_choice_to_the_idle_gpu_and_back_once_none_is_idle() -> None:
    """``busy``: a share on NUMA 0's idle GPU while NUMA 1's is idle hides NUMA 0's replicas (the
    aligned shape's home is NUMA 1); a share on NUMA 1's GPU too leaves no idle GPU, so both are
    offered again and the home is NUMA 0 once more. ``full`` keeps NUMA 0 throughout."""
    share = Shape(1000, 1024, 1, 300)
    aligned = Shape(4000, 1024, 1, 500, exclusive=4)
    rooms = (NumaRoom(20, 32, 16), NumaRoom(32, 32, 16))
    gpus = (Gpu(1000, 0, "A100"), Gpu(1000, 1, "A100"))
    state = NodeState.of(64_000, 256_000, gpus, rooms, hide="busy")
    one = after(state, share, (0,))
    assert one.numa is not None and one.numa[0].replicas == 0 and kubelet_home(one, aligned) == 1
    both = after(one, share, (1,))
    assert both.numa is not None and both.numa[0].replicas >= 1 and kubelet_home(both, aligned) == 0
    full = after(NodeState.of(64_000, 256_000, gpus, rooms, hide="full"), share, (0,))
    assert kubelet_home(full, aligned) == 0


def test_steer_offers_only_the_booked_gpus_numa_node_while_a_booking_is_pending() -> None:
    """A pending booking on g2 (NUMA 1): every free replica on NUMA 0 is hidden, so kubelet's
    device hint is NUMA 1; without one ``steer`` hides as ``span`` (and so as ``busy``)."""
    assert effective_rule("steer", "restricted") == "steer"
    usage = _usage(0, 0, 1, 1)
    usage.add({"g0": DeviceAmount(1, 2000, 30)})  # a share on g0: every replica listed again
    assert steered_numa(usage, "steer", {}) is None and steered_numa(usage, "busy", {"g2": 1}) is None
    assert hidden_replicas(usage, "steer") == hidden_replicas(usage, "busy") == {0: 9}
    assert steered_numa(usage, "steer", {"g2": 1}) == frozenset({1})
    assert hidden_replicas(usage, "steer", {"g2": 1}) == {0: 19}  # g0's 9 free and g1's 10
    assert gpu_replicas(usage, "steer", {"g2": 1}) == {
        "g0": (0, 0),
        "g1": (0, 0),
        "g2": (1, 10),
        "g3": (1, 10),
    }
    # a booking on both NUMA nodes hides nothing more than busy does
    both = {"g1": 1, "g2": 1}
    assert hidden_replicas(usage, "steer", both) == hidden_replicas(usage, "busy", both) == {0: 9}
    # the idle node lists one replica per GPU (span's listing): those off NUMA 1 are hidden
    idle = _usage(0, 0, 1, 1)
    assert omitted_by_gpu(idle, "steer", {"g3": 1}) == {"g0": 9, "g1": 9, "g2": 9, "g3": 9}
    assert gpu_replicas(idle, "steer", {"g3": 1}) == {"g0": (0, 0), "g1": (0, 0), "g2": (1, 1), "g3": (1, 1)}


def test_steer_steers_without_spans_listing_under_single_numa_node_and_best_effort() -> None:
    """Their merged hint follows the device hint too, so ``steer`` steers there (``busy+steer``);
    a spanning hint would not help (``single-numa-node`` rejects it, ``best-effort`` admits any),
    so an idle node lists every replica. Under ``none`` kubelet computes no hints: ``busy``."""
    for policy in ("single-numa-node", "best-effort"):
        assert effective_rule("steer", policy) == "busy+steer"
    assert effective_rule("steer", "none") == effective_rule("steer", None) == "busy"
    idle = _usage(0, 0, 1, 1)
    assert not lists_one_per_gpu("busy+steer", idle) and omitted_by_gpu(idle, "busy+steer", {"g3": 1}) == {}
    assert steered_numa(idle, "busy+steer", {"g3": 1}) == frozenset({1})
    assert gpu_replicas(idle, "busy+steer", {"g3": 1}) == {
        "g0": (0, 0),
        "g1": (0, 0),
        "g2": (1, 10),
        "g3": (1, 10),
    }
    usage = _usage(0, 0, 1, 1)
    usage.add({"g0": DeviceAmount(1, 2000, 30)})
    assert hidden_replicas(usage, "busy+steer") == hidden_replicas(usage, "busy") == {0: 9}
    assert hidden_replicas(usage, "busy+steer", {"g2": 1}) == {0: 19}


def test_fgd_under_steer_an_aligned_shape_uses_the_gpus_of_every_numa_node_with_its_cpus() -> None:
    """kubelet gives an aligned shape NUMA 0 (the lowest with CPUs and replicas) whatever its GPU
    there has left; under ``steer`` it follows the booking to any NUMA node with the CPUs."""
    aligned = Shape(4000, 1024, 1, 500, exclusive=4)
    gpus = (Gpu(300, 0, "A100"), Gpu(1000, 1, "A100"))
    rooms = (NumaRoom(20, 32, 16), NumaRoom(32, 32, 16))
    busy = NodeState.of(64_000, 256_000, gpus, rooms, hide="busy", rejects_unpreferred=True)
    steer = NodeState.of(64_000, 256_000, gpus, rooms, hide="steer", rejects_unpreferred=True)
    assert kubelet_home(busy, aligned) == 0 and aligned_homes(busy, aligned) == (0,)
    assert gpu_use(busy, aligned)[0] == 0  # NUMA 0's GPU has 300 left: nothing usable aligned
    assert aligned_homes(steer, aligned) == (0, 1)
    assert gpu_use(steer, aligned)[0] == 1000
    # the pod runs on GPU 1 with its exclusive CPUs from NUMA 1
    placed = after(steer, aligned, (1,))
    assert placed.numa is not None and (placed.numa[0].free, placed.numa[1].free) == (20, 28)
    short = NodeState.of(64_000, 256_000, gpus, (NumaRoom(20, 32, 16), NumaRoom(2, 32, 16)), hide="steer")
    assert aligned_homes(short, aligned) == (0,) and gpu_use(short, aligned)[0] == 0
