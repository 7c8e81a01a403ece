"""fit_pod: HAMi's per-device checks, reasons, policies, numa-bind, quota, topology, phases."""

from __future__ import annotations

import pytest

from hamid.fit import (
    Fitted,
    GpuPolicy,
    PodFitSpec,
    PodPolicy,
    Quota,
    Unfit,
    effective_pod_usage,
    fit_pod,
    gen_reason,
    quota_limits,
)
from hamid.model import annotations as ann
from hamid.model import reasons as R
from hamid.model.devices import MODE_MIG, MODE_MPS
from hamid.model.errors import InvalidInput
from hamid.model.resources import ContainerDeviceRequest, ResourceConfig

from .helpers import A, I, S, cd, dev, fitted, node, req, spec


def uuids(result: Fitted | Unfit, container: int = 0) -> list[str]:
    assert isinstance(result, Fitted), result
    return [d.uuid for d in result.devices[container]]


def reason(result) -> str:
    assert isinstance(result, Unfit), result
    return result.reason


def test_gen_reason():
    # entries sort as whole strings, like Go sort.Strings in HAMi GenReason
    assert gen_reason({"B": 1, "A": 2}, 3) == "1/3 B, 2/3 A"
    assert gen_reason({}, 0) == ""


def test_basic_fit_and_booked_amounts():
    n = node(dev("a", 0, mem=32768))
    r = fit_pod(n, spec(req(1, mem=3000, cores=30)))
    assert isinstance(r, Fitted)
    assert r.devices == ((cd("a", 3000, 30),),)
    assert r.score == 0.0
    assert n.by_id["a"].usedmem == 0  # fit never mutates the node


def test_device_cordon():
    # TestFit_DeviceCordon
    n = node(dev("a", 0), dev("b", 1), cordoned={"a", "b"})
    assert reason(fit_pod(n, spec(req()))) == "2/2 CardCordoned"


@pytest.mark.parametrize(
    ("device", "request_", "want"),
    [
        (dev("a", health=False), req(), R.CARD_NOT_HEALTH),
        (dev("a", used=10), req(), R.CARD_TIME_SLICING_EXHAUSTED),
        (dev("a", usedmem=39000), req(mem=2000), R.CARD_INSUFFICIENT_MEMORY),
        (dev("a", usedcores=80, used=1), req(cores=30), R.CARD_INSUFFICIENT_CORE),
        (dev("a", used=1, usedcores=10), req(cores=100), R.CARD_INSUFFICIENT_CORE),
        (dev("a", used=1), req(cores=100), R.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT),
        (dev("a", used=1, usedcores=100), req(cores=0), R.CARD_COMPUTE_UNITS_EXHAUSTED),
        (dev("a", mode=MODE_MIG), req(), R.CARD_MIG_TOPOLOGY_INFEASIBLE),  # no profile registered
    ],
)
def test_single_reasons(device, request_, want):
    assert reason(fit_pod(node(device), spec(request_))) == f"1/1 {want}"


def test_cores_over_100_are_clamped():
    r = fitted(fit_pod(node(dev("a")), spec(req(cores=150))))
    assert r.devices[0][0].usedcores == 100


def test_zero_memory_percentage_is_whole_card():
    r = fitted(fit_pod(node(dev("a", mem=11264)), spec(req(pct=0))))
    assert r.devices[0][0].usedmem == 11264
    r = fitted(fit_pod(node(dev("a", mem=11264)), spec(req(pct=50))))
    assert r.devices[0][0].usedmem == 5632


def test_reasons_aggregate_sorted():
    n = node(
        dev("a", 0, health=False),
        dev("b", 1, used=10),
        dev("c", 2, usedmem=39000),
        dev("d", 3, usedmem=39000),
    )
    assert reason(fit_pod(n, spec(req(mem=2000)))) == (
        "1/4 CardNotHealth, 1/4 CardTimeSlicingExhausted, 2/4 CardInsufficientMemory"
    )


def test_node_insufficient_device_and_partial():
    n = node(dev("a", 0), dev("b", 1, used=10))
    assert reason(fit_pod(n, spec(req(3)))) == R.NODE_INSUFFICIENT_DEVICE
    want = "1/2 AllocatedCardsInsufficientRequest, 1/2 CardTimeSlicingExhausted"
    assert reason(fit_pod(n, spec(req(2)))) == want


def test_non_nvidia_devices_are_not_candidates():
    n = node(dev("a", 0), dev("x", 1, type="Ascend-910"))
    assert reason(fit_pod(n, spec(req(2)))) == R.NODE_INSUFFICIENT_DEVICE


def _policy(**a) -> PodPolicy:
    return PodPolicy.from_annotations({getattr(ann, k): v for k, v in a.items()})


def test_type_uuid_and_mode_filters():
    n = node(dev("a", 0, type="NVIDIA-A100"), dev("b", 1, type="NVIDIA-V100"), dev("c", 2, mode=MODE_MPS))
    assert uuids(fit_pod(n, spec(req(), policy=_policy(USE_GPU_TYPE="v100")))) == ["b"]
    r = fit_pod(n, spec(req(), policy=_policy(NOUSE_GPU_TYPE="nvidia")))
    assert reason(r) == "3/3 CardTypeMismatch"
    assert uuids(fit_pod(n, spec(req(), policy=_policy(USE_GPU_UUID="c")))) == ["c"]
    r = fit_pod(n, spec(req(2), policy=_policy(NOUSE_GPU_UUID="a,b")))
    assert reason(r) == "1/3 AllocatedCardsInsufficientRequest, 2/3 CardUuidMismatch"
    assert uuids(fit_pod(n, spec(req(), policy=_policy(VGPU_MODE="mps")))) == ["c"]
    r = fit_pod(n, spec(req(), policy=_policy(VGPU_MODE="mig")))
    assert reason(r) == "3/3 CardTypeMismatch"
    bad_type = ContainerDeviceRequest(nums=1, type="OTHER")
    assert reason(fit_pod(n, spec(bad_type))) == "3/3 CardTypeMismatch"


def test_spread_and_binpack_choose_by_score():
    n = node(dev("a", 0, used=3, usedmem=3000), dev("b", 1, used=1, usedmem=1000), dev("c", 2))
    assert uuids(fit_pod(n, spec(req(mem=100)))) == ["c"]  # spread: least used
    assert uuids(fit_pod(n, spec(req(mem=100), gpu_policy="binpack"))) == ["a"]
    assert uuids(fit_pod(n, spec(req(2, mem=100), gpu_policy="binpack"))) == ["a", "b"]


def test_fit_numa_switching():
    # TestFit_NumaSwitching: dev-0 NUMA1, dev-1 NUMA1, dev-2 NUMA0 tried from dev-2; the switch at
    # dev-1 discards dev-2; result [dev-1, dev-0]. binpack + numa-bind tries NUMA 0 first.
    n = node(dev("dev-0", 0, numa=1), dev("dev-1", 1, numa=1), dev("dev-2", 2, numa=0))
    policy = _policy(NUMA_BIND="true", GPU_SCHEDULER_POLICY="binpack")
    assert uuids(fit_pod(n, spec(req(2), policy=policy))) == ["dev-1", "dev-0"]


def test_numa_bind_keeps_container_on_one_numa():
    # TestNumaBindSortPreservesAffinity end to end: scores A 5 > C 3 > B 1 (from slot usage).
    n = node(dev("A", 0, numa=0, used=5), dev("B", 1, numa=0, used=1), dev("C", 2, numa=1, used=3))
    assert sorted(uuids(fit_pod(n, spec(req(2), policy=_policy(NUMA_BIND="true"))))) == ["A", "B"]
    assert uuids(fit_pod(n, spec(req(2)))) == ["B", "C"]  # no numa-bind: lowest scores across NUMA


def test_numa_bind_failure_counts_numa_not_fit():
    n = node(dev("a", 0, numa=0), dev("b", 1, numa=1))
    r = fit_pod(n, spec(req(2), policy=_policy(NUMA_BIND="true")))
    assert reason(r) == "1/2 AllocatedCardsInsufficientRequest, 1/2 NumaNotFit"


def test_numa_bind_with_chain():
    n = node(dev("a", 0, numa=0), dev("b", 1, numa=1, used=2), dev("c", 2, numa=1, used=1))
    r = fit_pod(n, spec(req(2), policy=_policy(NUMA_BIND="true", GPU_SCHEDULER_POLICY="binpack,numa")))
    assert uuids(r) == ["b", "c"]


def test_mutex_policy():
    # TestFit_MutexPolicy: used/idle => idle; Nums 2 fails.
    n = node(dev("used", 0, used=1, usedmem=10), dev("idle", 1))
    policy = _policy(GPU_SCHEDULER_POLICY="mutex")
    assert uuids(fit_pod(n, spec(req(), policy=policy))) == ["idle"]
    assert reason(fit_pod(n, spec(req(2), policy=policy))) == (
        "1/2 AllocatedCardsInsufficientRequest, 1/2 ExclusiveDeviceAllocateConflict"
    )
    # inside a chain mutex is a filter too
    chain = _policy(GPU_SCHEDULER_POLICY="binpack,mutex")
    assert uuids(fit_pod(n, spec(req(), policy=chain))) == ["idle"]


def test_mutex_sees_own_earlier_containers():
    n = node(dev("a", 0), dev("b", 1))
    r = fit_pod(n, spec(req(), req(), policy=_policy(GPU_SCHEDULER_POLICY="mutex")))
    assert {uuids(r, 0)[0], uuids(r, 1)[0]} == {"a", "b"}
    r = fit_pod(n, spec(req(), req(), req(), policy=_policy(GPU_SCHEDULER_POLICY="mutex")))
    assert reason(r) == "2/2 ExclusiveDeviceAllocateConflict"


def test_exclusive_request_needs_idle_card():
    n = node(dev("a", 0, used=1, usedmem=100, usedcores=0), dev("b", 1))
    assert uuids(fit_pod(n, spec(req(cores=100), gpu_policy="binpack"))) == ["b"]


def test_topology_aware_pairs():
    scores = {
        "g0": {"g1": 100, "g2": 10, "g3": 10},
        "g1": {"g0": 100, "g2": 10, "g3": 10},
        "g2": {"g0": 10, "g1": 10, "g3": 60},
        "g3": {"g0": 10, "g1": 10, "g2": 60},
    }
    n = node(*(dev(f"g{i}", i) for i in range(4)), pair_scores=scores)
    topo = _policy(GPU_SCHEDULER_POLICY="topology-aware")
    assert sorted(uuids(fit_pod(n, spec(req(2), policy=topo)))) == ["g0", "g1"]
    # one GPU: the worst-connected card (lowest pair-score sum), g2 and g3 tie -> first in try order
    assert uuids(fit_pod(n, spec(req(1), policy=topo)))[0] in {"g2", "g3"}
    # exactly as many accepted as needed
    assert sorted(uuids(fit_pod(n, spec(req(4), policy=topo)))) == ["g0", "g1", "g2", "g3"]
    n.by_id["g0"].used = 10
    assert sorted(uuids(fit_pod(n, spec(req(2), policy=topo)))) == ["g2", "g3"]
    assert reason(fit_pod(n, spec(req(4), policy=topo))) == (
        "1/4 CardTimeSlicingExhausted, 3/4 AllocatedCardsInsufficientRequest"
    )


def test_quota():
    n = node(dev("a", 0), dev("b", 1))
    q = Quota(mem_limit=10000, cores_limit=100, used_mem=4000, used_cores=0)
    assert isinstance(fit_pod(n, spec(req(mem=6000)), quota=q), Fitted)
    assert reason(fit_pod(n, spec(req(mem=6001)), quota=q)) == "2/2 ResourceQuotaNotFit"
    # two devices of 3000 fit, the second container's third 3000 does not
    assert isinstance(fit_pod(n, spec(req(2, mem=3000)), quota=q), Fitted)
    r = fit_pod(n, spec(req(2, mem=3000), req(1, mem=1000)), quota=q)
    assert reason(r) == "2/2 ResourceQuotaNotFit"
    assert reason(fit_pod(n, spec(req(cores=60), req(cores=50)), quota=q)) == "2/2 ResourceQuotaNotFit"
    # an explicit limit of 0 blocks; no limit passes
    assert reason(fit_pod(n, spec(req(mem=1)), quota=Quota(mem_limit=0))) == "2/2 ResourceQuotaNotFit"
    assert isinstance(fit_pod(n, spec(req(mem=10**6 - 1)), quota=Quota()), Unfit)  # memory, not quota
    assert isinstance(fit_pod(n, spec(req(mem=100)), quota=Quota()), Fitted)


def test_quota_is_phase_aware():
    # init 6000 and app 6000 on the same GPU book 6000 against the quota, not 12000
    n = node(dev("a", 0))
    q = Quota(mem_limit=8000)
    assert isinstance(fit_pod(n, spec(req(mem=6000), req(mem=6000), kinds=[I, A]), quota=q), Fitted)
    assert reason(fit_pod(n, spec(req(mem=6000), req(mem=6000), kinds=[S, A]), quota=q)) == (
        "1/1 ResourceQuotaNotFit"
    )


def test_quota_limits_from_resource_quota():
    cfg = ResourceConfig(memory_factor=2)
    hard = {"limits.nvidia.com/gpumem": "1000", "limits.nvidia.com/gpucores": 200, "pods": "3"}
    assert quota_limits(hard, cfg) == (2000, 200)
    assert quota_limits({}, cfg) == (None, None)
    assert quota_limits({"limits.nvidia.com/gpumem": "1k"}, ResourceConfig()) == (1000, None)
    with pytest.raises(InvalidInput):
        quota_limits({"limits.nvidia.com/gpumem": "500m"}, cfg)
    with pytest.raises(InvalidInput):
        quota_limits({"limits.nvidia.com/gpucores": "lots"}, cfg)


def test_every_container_gets_an_entry_init_first():
    n = node(dev("a", 0))
    r = fitted(fit_pod(n, spec(None, req(mem=100), None, req(mem=200), kinds=[I, I, A, A])))
    assert [len(e) for e in r.devices] == [0, 1, 0, 1]


def test_no_gpu_request_fits_with_empty_entries():
    r = fitted(fit_pod(node(dev("a")), spec(None, req(0))))
    assert r.devices == ((), ())


def test_init_containers_fit_independently_apps_cumulatively():
    n = node(dev("a", 0, mem=10000))
    # two init containers of 8000 each fit one after the other; app 8000 fits after them
    r = fit_pod(n, spec(req(mem=8000), req(mem=8000), req(mem=8000), kinds=[I, I, A]))
    assert isinstance(r, Fitted)
    assert effective_pod_usage(r.devices, [I, I, A])["a"].mem == 8000
    # two app containers of 6000 do not fit one 10000 card
    assert reason(fit_pod(n, spec(req(mem=6000), req(mem=6000)))) == "1/1 CardInsufficientMemory"


def test_sidecars_add_to_apps():
    n = node(dev("a", 0, mem=10000))
    full = "1/1 CardInsufficientMemory"
    assert reason(fit_pod(n, spec(req(mem=6000), req(mem=6000), kinds=[S, A]))) == full
    # a regular init container after a sidecar runs with it
    assert reason(fit_pod(n, spec(req(mem=6000), req(mem=6000), kinds=[S, I]))) == full
    # a regular init container before the sidecar does not
    assert isinstance(fit_pod(n, spec(req(mem=6000), req(mem=6000), kinds=[I, S])), Fitted)


def test_slots_are_phase_aware():
    n = node(dev("a", 0, count=2, used=1))
    assert isinstance(fit_pod(n, spec(req(), req(), kinds=[I, A])), Fitted)
    assert reason(fit_pod(n, spec(req(), req(), kinds=[A, A]))) == "1/1 CardTimeSlicingExhausted"


def test_release_treats_own_booking_as_free():
    n = node(dev("a", 0, mem=10000))
    first = fitted(fit_pod(n, spec(req(mem=8000))))
    booked = effective_pod_usage(first.devices, [A])
    n.add(booked)
    assert isinstance(fit_pod(n, spec(req(mem=8000))), Unfit)
    again = fit_pod(n, spec(req(mem=8000)), release=booked)
    assert isinstance(again, Fitted) and again.score == first.score == 0.0


def test_node_score_is_before_placement():
    n = node(dev("g", count=10, core=100, mem=8000, used=5, usedcores=50, usedmem=4000))
    assert fitted(fit_pod(n, spec(req(mem=100, cores=10)))).score == pytest.approx(15.0)


def test_pod_fit_spec_from_pod():
    pod = {
        "metadata": {"annotations": {ann.GPU_SCHEDULER_POLICY: "binpack", ann.NUMA_BIND: "true"}},
        "spec": {
            "initContainers": [
                {"name": "i", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "100"}}},
                {"name": "s", "restartPolicy": "Always"},
            ],
            "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "2"}}}],
        },
    }
    s = PodFitSpec.from_pod(pod, ResourceConfig(), "spread", "binpack")
    assert s.kinds == (I, S, A)
    assert s.wants_gpu and s.requests[1] is None and s.requests[2].nums == 2
    assert s.takes_node_lock  # a regular container asks GPUs: HAMi's bind takes the node lock
    init_only = {"spec": {"initContainers": pod["spec"]["initContainers"], "containers": [{"name": "c"}]}}  # type: ignore[index]
    only = PodFitSpec.from_pod(init_only, ResourceConfig(), "spread", "binpack")
    assert only.wants_gpu and not only.takes_node_lock
    assert s.policy.gpu_policy == GpuPolicy.parse("binpack") and s.policy.numa_bind
    bad = {"metadata": {"annotations": {ann.DEVICE_SCORING_WEIGHTS: "slot=x"}}, "spec": pod["spec"]}
    with pytest.raises(InvalidInput):
        PodFitSpec.from_pod(bad, ResourceConfig(), "spread", "binpack")
    plain = {"spec": {"containers": [{"name": "c"}]}}
    assert not PodFitSpec.from_pod(plain, ResourceConfig(), "spread", "binpack").wants_gpu
