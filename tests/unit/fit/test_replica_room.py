"""The rule both sides share: a GPU with no room offers kubelet none of its free replicas."""

from __future__ import annotations

from hamid.fit.fgd import Gpu, NodeState, NumaRoom, Shape, Workload, after, fragmentation, kubelet_home
from hamid.fit.numa_fit import gpu_replicas
from hamid.fit.numa_predict import NumaLedger
from hamid.fit.replica_room import hidden_replicas, no_room
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
    assert hidden_replicas(usage) == {0: 8, 1: 7}
    assert gpu_replicas(usage, hides_full=True) == {"g0": (0, 0), "g1": (0, 9), "g2": (1, 0)}
    assert gpu_replicas(usage) == {"g0": (0, 8), "g1": (0, 9), "g2": (1, 7)}
    mig = _usage(0, mode=MODE_MIG)
    mig.add({"g0": DeviceAmount(1, 8000, 100)})
    assert hidden_replicas(mig) == {}  # MIG nodes never take part


def test_the_ledger_kubelet_sees_has_fewer_free_replicas_and_the_same_totals() -> None:
    ledger = NumaLedger(1, range(8), {GPU: {0: (20, 18), 1: (10, 10)}})
    visible = ledger.hiding(GPU, {0: 9, 1: 12})
    assert visible.device_counts(GPU) == {0: (20, 9), 1: (10, 0)}
    assert ledger.device_counts(GPU) == {0: (20, 18), 1: (10, 10)}  # a copy
    assert ledger.hiding(GPU, {}) is ledger


def test_fgd_filling_the_last_gpu_of_a_numa_node_moves_kubelets_choice() -> None:
    """Where the plugin hides, the aligned shape's home moves to NUMA 1 once GPU 0 is full, so
    GPU 1 is no fragment for it any more; without hiding GPU 0's free replicas keep it on NUMA 0."""
    aligned = Shape(4000, 1024, 1, 500, exclusive=4)
    rooms = (NumaRoom(20, 32, 16), NumaRoom(32, 32, 16))
    gpus = (Gpu(500, 0, "A100"), Gpu(1000, 1, "A100"))
    workload = Workload.of([(aligned, 1)])
    for hides, home in ((True, 1), (False, 0)):
        state = NodeState.of(64_000, 256_000, gpus, rooms, hides_full=hides)
        filled = after(state, aligned, (0,))
        assert kubelet_home(filled, aligned) == home
        assert fragmentation(filled, workload) == (0 if hides else 1000)
