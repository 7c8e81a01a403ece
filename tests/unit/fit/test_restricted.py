"""fit_container_restricted: the NUMA refit's fit (docs/refit.md §3 step 11, §4, §6)."""

from __future__ import annotations

import pytest

from hamid.fit import (
    NodeUsage,
    PodPolicy,
    Quota,
    Refitted,
    Unfit,
    effective_pod_usage,
    fit_container_restricted,
    fit_pod,
    is_heterogeneous,
    pod_quota_usage,
    replace_entry,
    reservation_request,
)
from hamid.model import annotations as ann
from hamid.model import reasons as R
from hamid.model.errors import InvalidInput

from .helpers import A, I, S, cd, dev, fitted, node, req, spec

GB = 1000


def booked_node(devices, *pods):
    """A node with each (layout, kinds) pod booked as the scheduler books it."""
    n = node(*devices)
    for layout, kinds in pods:
        n.add(effective_pod_usage(layout, kinds))
    return n


def refit(n, layout, kinds, index, allowed, policy=None, **kw):
    return fit_container_restricted(n, layout, kinds, index, allowed, policy or PodPolicy.default(), **kw)


def move(n: NodeUsage, layout, kinds, result: Refitted, init_released=False):
    """Book the move on the node like the scheduler does after a successful refit."""
    n.remove(effective_pod_usage(layout, kinds, init_released))
    n.add(effective_pod_usage(result.layout, kinds, init_released))


# --- docs/refit.md §4 TestRefitNumaAllocationUsesPhaseAwareCapacity ---------------------------------------


def test_regular_init_and_app_use_the_phase_peak():
    layout = ((cd("b", 30 * GB),), (cd("a", 20 * GB),))
    n = booked_node([dev("a", 0, mem=40 * GB), dev("b", 1, mem=40 * GB)], (layout, [I, A]))
    r = refit(n, layout, [I, A], 1, {"b"})
    assert isinstance(r, Refitted) and r.devices == (cd("b", 20 * GB),)
    assert r.layout == ((cd("b", 30 * GB),), (cd("b", 20 * GB),))
    move(n, layout, [I, A], r)
    b = n.by_id["b"]
    assert (b.usedmem, b.used) == (30 * GB, 1)
    assert (n.by_id["a"].usedmem, n.by_id["a"].used) == (0, 0)


def test_other_pod_usage_is_not_released():
    layout = ((cd("b", 30 * GB),), (cd("a", 20 * GB),))
    other = ((cd("b", 15 * GB),),)
    n = booked_node([dev("a", 0, mem=40 * GB), dev("b", 1, mem=40 * GB)], (layout, [I, A]), (other, [A]))
    r = refit(n, layout, [I, A], 1, {"b"})
    assert isinstance(r, Unfit) and r.reason == "1/1 CardInsufficientMemory"


def test_sidecar_starting_after_a_larger_init_does_not_inflate_the_peak():
    layout = ((cd("b", 30 * GB),), (cd("a", 10 * GB),), (cd("b", 20 * GB),))
    kinds = [I, S, A]
    n = booked_node([dev("a", 0, mem=40 * GB), dev("b", 1, mem=30 * GB)], (layout, kinds))
    r = refit(n, layout, kinds, 1, {"b"})
    assert isinstance(r, Refitted)
    move(n, layout, kinds, r)
    assert (n.by_id["b"].usedmem, n.by_id["b"].used) == (30 * GB, 2)


def test_sidecar_and_two_apps_preserve_three_concurrent_slots():
    layout = ((cd("b", 30 * GB),), (cd("a", 10 * GB),), (cd("b", 15 * GB),), (cd("b", 10 * GB),))
    kinds = [I, S, A, A]
    n = booked_node([dev("a", 0, mem=40 * GB), dev("b", 1, mem=40 * GB)], (layout, kinds))
    r = refit(n, layout, kinds, 1, {"b"})
    assert isinstance(r, Refitted)
    move(n, layout, kinds, r)
    assert (n.by_id["b"].usedmem, n.by_id["b"].used) == (35 * GB, 3)


def test_sidecar_and_app_remain_concurrent():
    layout = ((cd("a", 30 * GB),), (cd("b", 20 * GB),))
    kinds = [S, A]
    n = booked_node([dev("a", 0, mem=40 * GB), dev("b", 1, mem=40 * GB)], (layout, kinds))
    r = refit(n, layout, kinds, 0, {"b"})
    assert isinstance(r, Unfit) and r.reason == "1/1 CardInsufficientMemory"


def test_init_released_pod_refits_app_without_init_usage():
    layout = ((cd("b", 30 * GB),), (cd("a", 20 * GB),))
    n = node(dev("a", 0, mem=40 * GB), dev("b", 1, mem=40 * GB))
    n.add(effective_pod_usage(layout, [I, A], init_released=True))
    n.add({"b": effective_pod_usage(((cd("b", 15 * GB),),), [A])["b"]})
    r = refit(n, layout, [I, A], 1, {"b"}, init_released=True)
    assert isinstance(r, Refitted)  # 15 + 20 <= 40 once the init container's 30 is released


# --- docs/refit.md §6 #2729 restricted-fit tests ------------------------------------------------------------


def four_gpus():
    return [
        dev("GPU-a", 0, numa=0, used=3, usedmem=3000),
        dev("GPU-b", 1, numa=0, used=2, usedmem=2000),
        dev("GPU-c", 2, numa=1),
        dev("GPU-d", 3, numa=1, used=1, usedmem=1000),
    ]


@pytest.mark.parametrize("policy", ["binpack", "spread", "binpack,numa", "spread,numa"])
def test_matches_fit_on_smaller_node(policy):
    layout = ((cd("GPU-a", 1000),),)
    allowed = {"GPU-b", "GPU-c", "GPU-d"}
    pol = PodPolicy.from_annotations({ann.GPU_SCHEDULER_POLICY: policy})
    n = booked_node(four_gpus(), (layout, [A]))
    r = refit(n, layout, [A], 0, allowed, pol)
    smaller = node(*(d for d in four_gpus() if d.id in allowed))
    want = fitted(fit_pod(smaller, spec(req(1, mem=1000), policy=pol)))
    assert isinstance(r, Refitted) and r.devices == want.devices[0]


def test_honors_policy_ordering():
    layout = ((cd("GPU-a", 1000),),)
    n = booked_node(four_gpus(), (layout, [A]))
    binpack = PodPolicy.from_annotations({ann.GPU_SCHEDULER_POLICY: "binpack"})
    assert refit(n, layout, [A], 0, {"GPU-b", "GPU-c", "GPU-d"}, binpack).devices[0].uuid == "GPU-b"
    assert refit(n, layout, [A], 0, {"GPU-b", "GPU-c", "GPU-d"}).devices[0].uuid == "GPU-c"


def test_no_op_when_pick_allowed():
    layout = ((cd("GPU-a", 1000),),)
    n = booked_node(four_gpus(), (layout, [A]))
    binpack = PodPolicy.from_annotations({ann.GPU_SCHEDULER_POLICY: "binpack"})
    r = refit(n, layout, [A], 0, {"GPU-a", "GPU-b", "GPU-c", "GPU-d"}, binpack)
    assert r.devices == layout[0] and r.layout == layout


def test_multi_gpu_without_numa_bind():
    layout = ((cd("GPU-a", 500), cd("GPU-b", 500)),)
    n = booked_node(four_gpus(), (layout, [A]))
    r = refit(n, layout, [A], 0, {"GPU-b", "GPU-c", "GPU-d"})
    assert isinstance(r, Refitted) and len(r.devices) == 2
    assert {d.usedmem for d in r.devices} == {500}


def test_enforces_capacity():
    layout = ((cd("GPU-a", 30000),),)
    n = booked_node([dev("GPU-a", 0), dev("GPU-b", 1, usedmem=20000, used=1)], (layout, [A]))
    r = refit(n, layout, [A], 0, {"GPU-b"})
    assert isinstance(r, Unfit) and r.reason == "1/1 CardInsufficientMemory"


@pytest.mark.parametrize("allowed", [set(), {"GPU-a-0", "GPU-a-1"}, {"GPU-x"}])
def test_empty_or_unmatched_allowed_set(allowed):
    layout = ((cd("GPU-a", 1000),),)
    n = booked_node(four_gpus(), (layout, [A]))
    r = refit(n, layout, [A], 0, allowed)
    assert isinstance(r, Unfit) and r.reason == R.ALLOWED_DEVICE_SET_UNMATCHED


def test_other_device_types_are_not_candidates():
    layout = ((cd("GPU-a", 1000),),)
    n = booked_node([dev("GPU-a", 0), dev("NPU-x", 1, type="Ascend-910")], (layout, [A]))
    assert refit(n, layout, [A], 0, {"NPU-x"}).reason == R.ALLOWED_DEVICE_SET_UNMATCHED


def test_uses_pod_policy_annotation():
    gpus = [dev("GPU-a", 0), dev("GPU-b", 1, used=2, usedmem=4000), dev("GPU-c", 2)]
    layout = ((cd("GPU-a", 1000),),)
    n = booked_node(gpus, (layout, [A]))
    binpack = PodPolicy.from_annotations({ann.GPU_SCHEDULER_POLICY: "binpack"}, default_gpu_policy="spread")
    spread = PodPolicy.from_annotations({ann.GPU_SCHEDULER_POLICY: "spread"}, default_gpu_policy="binpack")
    assert refit(n, layout, [A], 0, {"GPU-b", "GPU-c"}, binpack).devices[0].uuid == "GPU-b"
    assert refit(n, layout, [A], 0, {"GPU-b", "GPU-c"}, spread).devices[0].uuid == "GPU-c"


def test_mutex_policy():
    mutex = PodPolicy.from_annotations({ann.GPU_SCHEDULER_POLICY: "mutex"})
    layout = ((cd("GPU-a", 1000),),)
    n = booked_node([dev("GPU-a", 0), dev("GPU-b", 1, used=1), dev("GPU-c", 2)], (layout, [A]))
    assert refit(n, layout, [A], 0, {"GPU-b", "GPU-c"}, mutex).devices[0].uuid == "GPU-c"
    n.by_id["GPU-c"].used = 1
    r = refit(n, layout, [A], 0, {"GPU-b", "GPU-c"}, mutex)
    assert isinstance(r, Unfit) and r.reason == "2/2 ExclusiveDeviceAllocateConflict"


def test_keeps_numa_bind():
    bind = PodPolicy.from_annotations({ann.NUMA_BIND: "true"})
    layout = ((cd("GPU-a", 100), cd("GPU-b", 100)),)
    n = booked_node(four_gpus(), (layout, [A]))
    r = refit(n, layout, [A], 0, {"GPU-c", "GPU-d"}, bind)
    assert sorted(d.uuid for d in r.devices) == ["GPU-c", "GPU-d"]
    r = refit(n, layout, [A], 0, {"GPU-b", "GPU-c"}, bind)
    assert isinstance(r, Unfit) and "NumaNotFit" in r.reason


def test_topology_aware_kept():
    scores = {"g1": {"g2": 10, "g3": 100}, "g2": {"g1": 10, "g3": 10}, "g3": {"g1": 100, "g2": 10}}
    topo = PodPolicy.from_annotations({ann.GPU_SCHEDULER_POLICY: "topology-aware"})
    layout = ((cd("g0", 100), cd("g1", 100)),)
    n = node(*(dev(f"g{i}", i) for i in range(4)), pair_scores=scores)
    n.add(effective_pod_usage(layout, [A]))
    r = refit(n, layout, [A], 0, {"g1", "g2", "g3"}, topo)
    assert sorted(d.uuid for d in r.devices) == ["g1", "g3"]


def test_pinned_uuid_outside_allowed_set_is_refused():
    pinned = PodPolicy.from_annotations({ann.USE_GPU_UUID: "GPU-a"})
    layout = ((cd("GPU-a", 1000),),)
    n = booked_node(four_gpus(), (layout, [A]))
    r = refit(n, layout, [A], 0, {"GPU-c", "GPU-d"}, pinned)
    assert isinstance(r, Unfit) and r.reason == "2/2 CardUuidMismatch"


def test_seeds_other_containers_for_mutex():
    # container 0 holds GPU-a; moving container 1 under mutex must not land on GPU-a
    mutex = PodPolicy.from_annotations({ann.GPU_SCHEDULER_POLICY: "mutex"})
    layout = ((cd("GPU-a", 5000),), (cd("GPU-c", 5000),))
    n = booked_node([dev("GPU-a", 0), dev("GPU-b", 1), dev("GPU-c", 2)], (layout, [A, A]))
    assert refit(n, layout, [A, A], 1, {"GPU-a", "GPU-b"}, mutex).devices[0].uuid == "GPU-b"
    r = refit(n, layout, [A, A], 1, {"GPU-a"}, mutex)
    assert isinstance(r, Unfit) and r.reason == "1/1 ExclusiveDeviceAllocateConflict"


def test_competing_refits():
    # GPU-b has room for one 20 GB move; the second refit is refused and keeps GPU-a.
    p1 = ((cd("GPU-a", 20 * GB),),)
    p2 = ((cd("GPU-a", 20 * GB),),)
    n = booked_node([dev("GPU-a", 0, mem=40 * GB), dev("GPU-b", 1, mem=30 * GB)], (p1, [A]), (p2, [A]))
    first = refit(n, p1, [A], 0, {"GPU-b"})
    assert isinstance(first, Refitted)
    move(n, p1, [A], first)
    second = refit(n, p2, [A], 0, {"GPU-b"})
    assert isinstance(second, Unfit) and second.reason == "1/1 CardInsufficientMemory"
    assert n.by_id["GPU-a"].usedmem == 20 * GB and n.by_id["GPU-b"].usedmem == 20 * GB


def test_quota_on_positional_layout():
    # #2828/#2836: init@A 5000, app@A 5000, app@A 5000 counts 10000; moving init to B counts 15000.
    kinds = [I, A, A]
    layout = ((cd("A", 5000),), (cd("A", 5000),), (cd("A", 5000),))
    assert pod_quota_usage(layout, kinds) == (10000, 0)
    moved = replace_entry(layout, 0, (cd("B", 5000),))
    assert pod_quota_usage(moved, kinds) == (15000, 0)
    assert pod_quota_usage(moved, kinds, init_released=True) == (10000, 0)
    n = booked_node([dev("A", 0), dev("B", 1)], (layout, kinds))
    r = refit(n, layout, kinds, 0, {"B"}, quota=Quota(mem_limit=12000))
    assert isinstance(r, Unfit) and r.reason == "1/1 ResourceQuotaNotFit"
    r = refit(n, layout, kinds, 0, {"B"}, quota=Quota(mem_limit=20000))
    assert isinstance(r, Refitted) and pod_quota_usage(r.layout, kinds) == (15000, 0)


def test_heterogeneous_reservation():
    het = (cd("a", 1000), cd("b", 2000))
    assert is_heterogeneous(het) and not is_heterogeneous((cd("a", 1000), cd("b", 1000)))
    with pytest.raises(InvalidInput):
        reservation_request(het)
    with pytest.raises(InvalidInput):
        reservation_request(())
    n = booked_node([dev("a", 0), dev("b", 1)])
    with pytest.raises(InvalidInput):
        refit(n, (het,), [A], 0, {"a", "b"})
    r = reservation_request((cd("a", 1000, 30), cd("b", 1000, 30)))
    assert (r.nums, r.memreq, r.coresreq) == (2, 1000, 30)


def test_replace_entry_pads():
    assert replace_entry((), 2, (cd("a", 1),)) == ((), (), (cd("a", 1),))
