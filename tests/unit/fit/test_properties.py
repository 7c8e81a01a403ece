"""Property: neither a fit nor a refit ever over-commits a device (slots, memory, cores)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hamid.fit import (
    ContainerKind,
    Fitted,
    NodeUsage,
    PodPolicy,
    Refitted,
    effective_pod_usage,
    fit_container_restricted,
    fit_pod,
    is_heterogeneous,
)
from hamid.model import annotations as ann

from .helpers import dev, req, spec


@st.composite
def devices(draw):
    n = draw(st.integers(1, 5))
    out = []
    for i in range(n):
        count = draw(st.integers(1, 4))
        mem = draw(st.sampled_from([1000, 4000, 8000]))
        core = draw(st.sampled_from([50, 100, 200]))
        out.append(
            dev(
                f"g{i}",
                i,
                count=count,
                mem=mem,
                core=core,
                numa=draw(st.integers(0, 1)),
                used=draw(st.integers(0, count)),
                usedmem=draw(st.integers(0, mem)),
                usedcores=draw(st.integers(0, core)),
                health=draw(st.booleans()) or draw(st.booleans()),
            )
        )
    return out


requests = st.one_of(
    st.none(),
    st.builds(
        lambda nums, mem, cores, pct: req(nums, mem=mem, cores=cores, pct=pct),
        st.integers(1, 3),
        st.sampled_from([0, 100, 1500, 3000]),
        st.sampled_from([0, 10, 50, 100, 120]),
        st.sampled_from([101, 0, 30, 100]),
    ),
)
kinds = st.sampled_from(list(ContainerKind))


@st.composite
def roomy_devices(draw):
    """Healthy devices with room left on each (a pod placed there can usually be moved)."""
    n = draw(st.integers(2, 5))
    out = []
    for i in range(n):
        count = draw(st.integers(2, 4))
        mem = draw(st.sampled_from([4000, 8000]))
        core = draw(st.sampled_from([100, 200]))
        out.append(
            dev(
                f"g{i}",
                i,
                count=count,
                mem=mem,
                core=core,
                numa=draw(st.integers(0, 1)),
                used=draw(st.integers(0, count - 2)),
                usedmem=draw(st.integers(0, mem // 2)),
                usedcores=draw(st.integers(0, core // 2)),
            )
        )
    return out


#: A request that asks for GPUs with the same amounts on every device (a refit can move it).
gpu_requests = st.builds(
    lambda nums, mem, cores: req(nums, mem=mem, cores=cores, pct=101),
    st.integers(1, 2),
    st.sampled_from([100, 1500]),
    st.sampled_from([0, 10, 50]),
)
#: Containers of which the first asks for GPUs (the refit's target), the others anything.
gpu_containers = st.tuples(
    st.tuples(gpu_requests, kinds), st.lists(st.tuples(requests, kinds), max_size=3)
).map(lambda first_rest: [first_rest[0], *first_rest[1]])
policies = st.builds(
    lambda gpu, bind: PodPolicy.from_annotations({ann.GPU_SCHEDULER_POLICY: gpu, ann.NUMA_BIND: bind}),
    st.sampled_from(["spread", "binpack", "mutex", "topology-aware", "binpack,numa", "numa", "spread,mutex"]),
    st.sampled_from(["true", "false"]),
)


def assert_not_overcommitted(n: NodeUsage, before: dict[str, tuple[int, int, int]]) -> None:
    for d in n.devices:
        bu, bm, bc = before[d.id]
        # a device already over a limit (impossible from a fit) may not get worse
        assert d.used <= max(d.count, bu)
        assert d.usedmem <= max(d.totalmem, bm)
        assert d.usedcores <= max(d.totalcore, bc)


def snapshot(n: NodeUsage) -> dict[str, tuple[int, int, int]]:
    return {d.id: (d.used, d.usedmem, d.usedcores) for d in n.devices}


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(devices(), st.lists(st.tuples(requests, kinds), min_size=1, max_size=4), policies)
def test_fit_pod_never_overcommits(devs, containers, policy):
    n = NodeUsage("n", devs)
    before = snapshot(n)
    s = spec(*(r for r, _ in containers), kinds=[k for _, k in containers], policy=policy)
    result = fit_pod(n, s)
    if isinstance(result, Fitted):
        assert len(result.devices) == len(containers)
        for (r, _), entry in zip(containers, result.devices, strict=True):
            assert len(entry) == (r.nums if r is not None else 0)
            assert len({d.uuid for d in entry}) == len(entry)
        n.add(effective_pod_usage(result.devices, s.kinds))
        assert_not_overcommitted(n, before)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(roomy_devices(), devices()),
    st.one_of(gpu_containers, st.lists(st.tuples(requests, kinds), min_size=1, max_size=4)),
    policies,
    st.data(),
)
def test_refit_never_overcommits(devs, containers, policy, data):
    n = NodeUsage("n", devs)
    s = spec(*(r for r, _ in containers), kinds=[k for _, k in containers], policy=policy)
    placed = fit_pod(n, s)
    if not isinstance(placed, Fitted):
        return
    booked = effective_pod_usage(placed.devices, s.kinds)
    n.add(booked)
    before = snapshot(n)
    targets = [i for i, e in enumerate(placed.devices) if e and not is_heterogeneous(e)]
    if not targets:
        return
    target = data.draw(st.sampled_from(targets))
    allowed = data.draw(st.sets(st.sampled_from([d.id for d in devs]), min_size=1))
    result = fit_container_restricted(n, placed.devices, s.kinds, target, allowed, policy)
    if isinstance(result, Refitted):
        assert {d.uuid for d in result.devices} <= allowed
        assert len(result.devices) == len(placed.devices[target])
        n.remove(booked)
        n.add(effective_pod_usage(result.layout, s.kinds))
        assert_not_overcommitted(n, before)


@st.composite
def scored_devices(draw):
    n = draw(st.integers(2, 6))
    out = []
    for i in range(n):
        count = draw(st.integers(2, 10))
        mem = draw(st.sampled_from([8000, 16000, 80000]))
        core = draw(st.sampled_from([100, 200]))
        out.append(
            dev(
                f"g{i}",
                i,
                count=count,
                mem=mem,
                core=core,
                numa=draw(st.integers(0, 1)),
                used=draw(st.integers(0, count - 1)),
                usedmem=draw(st.integers(0, mem - mem // 50)),  # room for 1 % and for 50 MiB
                usedcores=draw(st.integers(0, core - 1)),
            )
        )
    return out


@settings(max_examples=100, deadline=None)
@given(
    scored_devices(),
    st.sampled_from(["spread", "binpack", "mutex", "numa", "binpack,numa", "numa,spread"]),
    st.booleans(),
    st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 3)).filter(any),
    st.sampled_from([(50, 101), (0, 1), (0, 101)]),
)
def test_fit_tries_devices_in_policy_order(devs, gpu_policy, numa_bind, weights, mem_pct):
    """With room on every device, the fit picks the first device of device_score + try_order."""
    from hamid.fit import device_score, try_order

    policy = PodPolicy.from_annotations(
        {
            ann.GPU_SCHEDULER_POLICY: gpu_policy,
            ann.DEVICE_SCORING_WEIGHTS: "slot={},core={},memory={}".format(*weights),
            ann.NUMA_BIND: str(numa_bind).lower(),
        }
    )
    if gpu_policy == "mutex":
        for d in devs:
            d.used = 0
    request = req(1, mem=mem_pct[0], pct=mem_pct[1])
    w = policy.weights
    scores = [
        device_score(d.count, d.totalcore, d.totalmem, d.used, d.usedcores, d.usedmem, request, w)
        for d in devs
    ]
    numas, useds, indexes = [d.numa for d in devs], [d.used for d in devs], [d.index for d in devs]
    order = try_order(numas, scores, useds, indexes, policy.gpu_policy, numa_bind)
    result = fit_pod(NodeUsage("n", devs), spec(request, policy=policy))
    assert isinstance(result, Fitted)
    assert result.devices[0][0].uuid == devs[order[0]].id


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    devices(),
    st.lists(st.tuples(requests, kinds), min_size=1, max_size=4),
    policies,
    st.data(),
)
def test_room_below_need_means_no_fit(devs, containers, policy, data):
    """The filter's cheap room test never passes over a node the fit would accept."""
    from hamid.fit import room_needed
    from hamid.model.devices import MODE_MIG

    for d in devs:
        if data.draw(st.integers(0, 9)) == 0:
            d.mode = MODE_MIG
        if data.draw(st.booleans()):  # free memory and cores exactly at a request's size
            d.usedmem = max(d.totalmem - data.draw(st.sampled_from([100, 1500, 3000])), 0)
            d.usedcores = max(d.totalcore - data.draw(st.sampled_from([10, 50, 100])), 0)
    cordoned = data.draw(st.sets(st.sampled_from([d.id for d in devs])))
    n = NodeUsage("n", devs, cordoned=cordoned)
    s = spec(*(r for r, _ in containers), kinds=[k for _, k in containers], policy=policy)
    room, need = n.room(), room_needed(s)
    if any(have < want for have, want in zip(room, need, strict=True)):
        assert not isinstance(fit_pod(n, s), Fitted)


def test_room_follows_usage_changes_and_reports_them():
    from hamid.fit import DeviceAmount

    from .helpers import cd, node

    n = node(dev("a", 0, count=2, mem=8000), dev("b", 1, count=1, mem=4000, health=False), dev("c", 2))
    changed: list[str] = []
    n.on_change = changed.append
    assert n.room() == (2, 40000, 100)  # b is unhealthy
    booked = {"c": DeviceAmount(1, 39000, 60)}
    n.add(booked)
    assert n.room() == (2, 8000, 100) and changed == ["n1"]
    n.add(effective_pod_usage(((cd("a", 8000, 40), cd("a", 0, 0)),), [ContainerKind.APP]))
    assert n.room() == (1, 1000, 40)  # a has no free slot left
    n.remove(booked)
    assert n.room() == (1, 40000, 100) and changed == ["n1"] * 3
    assert n.copy().on_change is None


def test_room_exactly_at_need_still_fits():
    from hamid.fit import room_needed

    n = NodeUsage(
        "n",
        [dev("a", 0, count=2, mem=8000, used=1, usedmem=6500, usedcores=60), dev("b", 1, used=2, count=2)],
    )
    s = spec(req(1, mem=1500, cores=40))
    assert n.room() == room_needed(s) == (1, 1500, 40)
    assert isinstance(fit_pod(n, s), Fitted)
    assert not isinstance(fit_pod(n, spec(req(1, mem=1501, cores=40))), Fitted)
    assert not isinstance(fit_pod(n, spec(req(2, mem=100))), Fitted)
