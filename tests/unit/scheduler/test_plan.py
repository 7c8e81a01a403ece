"""``Scheduler.plan`` (score index, room test, early stop) chooses what fitting every candidate would."""

from __future__ import annotations

import random
from datetime import datetime
from typing import Any

from hamid.fit.fit import Fitted, PodFitSpec, fit_pod
from hamid.fit.policy import SPREAD
from hamid.model import annotations as ann
from hamid.model import objects
from hamid.model import reasons as R
from hamid.model.devices import MODE_HAMI_CORE, MODE_MIG, DeviceInfo
from hamid.model.errors import InvalidInput
from hamid.scheduler.core import Scheduler
from hamid.scheduler.filter import _unfit_messages
from hamid.scheduler.inventory import HANDSHAKE_GRACE_S
from hamid.scheduler.state import SchedulerState
from tests.unit.scheduler.helpers import container, placed, pod

NOW = 1_000_000.0


def _node(rng: random.Random, name: str) -> dict[str, Any]:
    gpus = [
        DeviceInfo(
            id=f"{name}-g{i}",
            index=i,
            count=rng.choice((1, 2, 4)),
            devmem=rng.choice((4000, 8000)),
            devcore=100,
            type=rng.choice(("NVIDIA-A100", "NVIDIA-A100", "NVIDIA-H100")),
            numa=i % 2,
            mode=MODE_MIG if rng.random() < 0.05 else MODE_HAMI_CORE,
            health=rng.random() > 0.1,
        )
        for i in range(rng.randint(1, 4))
    ]
    annotations = {ann.NODE_REGISTER: ann.encode_node_devices(gpus)}
    if rng.random() < 0.15:
        annotations[ann.DEVICE_CORDON] = gpus[0].id
    allocatable = 10
    if rng.random() < 0.1:  # a plugin gone for longer than the grace period: unhealthy node
        stamp = datetime.fromtimestamp(NOW - HANDSHAKE_GRACE_S - 5)
        annotations[ann.NODE_HANDSHAKE] = ann.format_handshake(stamp)
        allocatable = 0
    return {
        "metadata": {"name": name, "annotations": annotations},
        "status": {"allocatable": {"nvidia.com/gpu": str(allocatable)}},
    }


def _running(rng: random.Random, i: int, state: SchedulerState) -> dict[str, Any]:
    name = rng.choice(sorted(state.ledger.nodes))
    gpu = rng.choice(state.ledger.nodes[name].infos)
    mem, cores = rng.choice((500, 1000, 3000)), rng.choice((0, 10, 30))
    return placed(pod(f"run{i}", namespace=rng.choice(("a", "b"))), name, f"{gpu.id},NVIDIA,{mem},{cores}:;")


def _request(rng: random.Random, name: str, **extra: Any) -> dict[str, Any]:
    gpus = rng.choice((1, 1, 1, 2))
    if rng.random() < 0.2:
        limits = {"nvidia.com/gpu": str(gpus), "nvidia.com/gpumem-percentage": str(rng.choice((0, 25, 50)))}
        return container(name, **extra) | {"resources": {"limits": limits}}
    return container(
        name, gpus, rng.choice((0, 500, 1000, 2500, 6000)), rng.choice((0, 10, 50, 100)), **extra
    )


def _new_pod(rng: random.Random, i: int) -> dict[str, Any]:
    containers = [_request(rng, "main")]
    if rng.random() < 0.3:
        containers.append(_request(rng, "second") if rng.random() < 0.7 else container("cpu"))
    init = None
    if rng.random() < 0.3:
        init = [_request(rng, "init", **({"restartPolicy": "Always"} if rng.random() < 0.5 else {}))]
    annotations = {ann.NODE_SCHEDULER_POLICY: rng.choice(("binpack", "spread"))}
    if rng.random() < 0.5:
        annotations[ann.GPU_SCHEDULER_POLICY] = rng.choice(("binpack", "spread", "mutex", "topology-aware"))
    if rng.random() < 0.2:
        annotations[ann.NUMA_BIND] = "true"
    return pod(
        f"new{i}", containers=containers, init=init, namespace=rng.choice(("a", "b")), annotations=annotations
    )


def _reference(
    scheduler: Scheduler, p: dict[str, Any], spec: PodFitSpec, names: tuple[str, ...]
) -> tuple[str | None, Fitted | None, dict[str, str]]:
    """Fit every candidate, then pick the best score for the policy (ties: request order)."""
    state = scheduler.state
    uid = objects.uid(p)
    previous = state.ledger.reservation(uid)
    quota = state.ledger.fit_quota(p["metadata"]["namespace"], exclude_uid=uid)
    sign = 1.0 if spec.policy.node_policy == SPREAD else -1.0
    fits: list[tuple[float, int, str, Fitted]] = []
    failed: dict[str, str] = {}
    for i, name in enumerate(names):
        if name in failed or any(f[2] == name for f in fits):
            continue
        entry = state.ledger.nodes.get(name)
        if entry is None or not entry.healthy(state.clock()):
            failed[name] = R.NODE_UNREGISTERED
            continue
        release = previous.applied if previous is not None and previous.node == name else None
        result = fit_pod(entry.usage, spec, quota, release)
        if isinstance(result, Fitted):
            fits.append((sign * result.score, i, name, result))
        else:
            failed[name] = result.reason
    if not fits:
        return None, None, failed
    _, _, best, fitted = min(fits, key=lambda f: (f[0], f[1]))
    return best, fitted, failed


def _check(
    scheduler: Scheduler, p: dict[str, Any], names: tuple[str, ...]
) -> tuple[str | None, Fitted | None]:
    spec = PodFitSpec.from_pod(p, scheduler.config, "spread", "binpack")
    want_node, want_fit, want_failed = _reference(scheduler, p, spec, names)
    node, fitted, failed = scheduler.planner.plan(p, spec, names)
    assert (node, fitted) == (want_node, want_fit)
    if node is None:
        assert failed == want_failed
    else:
        assert {n: want_failed[n] for n in failed} == failed  # every reason given is the exact one
        unregistered = {n for n in names if n not in scheduler.ledger.nodes}
        assert unregistered <= failed.keys()
        assert node not in failed
    return node, fitted


def test_plan_equals_fitting_every_candidate_on_random_states() -> None:
    chosen = unfit = refiltered = 0
    for seed in range(40):
        rng = random.Random(seed)
        scheduler = Scheduler(None)  # plan never calls the API
        state = scheduler.state
        state.clock = lambda: NOW
        names = [f"n{i}" for i in range(rng.randint(1, 14))]
        for name in names:
            state.on_node(_node(rng, name))
        if not state.ledger.nodes:
            continue
        if rng.random() < 0.5:
            hard = {"limits.nvidia.com/gpumem": str(rng.choice((4000, 20000)))}
            state.on_quota({"metadata": {"name": "q", "namespace": "a"}, "spec": {"hard": hard}})
        running = [_running(rng, i, state) for i in range(rng.randint(0, 30))]
        for r in running:
            state.ledger.on_pod(r)
        for i in range(12):
            candidates = rng.sample(names, rng.randint(1, len(names))) + ["ghost"] * (rng.random() < 0.3)
            if rng.random() < 0.2:
                candidates += candidates[:2]  # duplicates keep their first position
            p = _new_pod(rng, i)
            try:
                node, fitted = _check(scheduler, p, tuple(candidates))
            except InvalidInput:
                continue
            if node is None or fitted is None:
                unfit += 1
                continue
            chosen += 1
            state.ledger.reserve(p, node, fitted.devices, ann.encode_pod_devices(fitted.devices))
            if rng.random() < 0.5:  # a re-filter sees its own booking as free
                _check(scheduler, p, tuple(rng.sample(names, len(names))))
                refiltered += 1
            # the index follows every kind of change: pods leaving, nodes re-registering
            if running and rng.random() < 0.5:
                state.ledger.on_pod_deleted(running.pop(rng.randrange(len(running))))
            if rng.random() < 0.2:
                state.on_node(_node(rng, rng.choice(names)))
            assert state.ledger.ranked() == sorted(
                (e.usage.score(), n) for n, e in state.ledger.nodes.items()
            )
    assert chosen > 50 and unfit > 20 and refiltered > 10, (chosen, unfit, refiltered)


def test_full_nodes_ahead_are_passed_over_and_reasons_given_when_nothing_fits() -> None:
    scheduler = Scheduler(None)  # plan never calls the API
    state = scheduler.state
    for name in ("full", "free"):
        gpus = [DeviceInfo(f"{name}-g0", 0, 4, 8000, 100, "NVIDIA-A100", 0, MODE_HAMI_CORE, True)]
        state.on_node(
            {"metadata": {"name": name, "annotations": {ann.NODE_REGISTER: ann.encode_node_devices(gpus)}}}
        )
    state.ledger.on_pod(placed(pod("hog"), "full", "full-g0,NVIDIA,7500,100:;"))
    fits = pod("p", containers=[container("c", 1, 1000, 10)])
    spec = PodFitSpec.from_pod(fits, scheduler.config, "spread", "binpack")
    # binpack ranks the used node first; its room (500 MiB, 0 cores) rules it out without a fit
    assert state.ledger.ranked()[-1][1] == "full"
    node, fitted, failed = scheduler.planner.plan(fits, spec, ("full", "free"))
    assert node == "free" and fitted is not None and failed == {}
    big = pod("big", containers=[container("c", 1, 9000, 10)])
    spec = PodFitSpec.from_pod(big, scheduler.config, "spread", "binpack")
    node, _, failed = scheduler.planner.plan(big, spec, ("full", "free", "ghost"))
    assert node is None
    assert failed == {
        "full": "1/1 CardInsufficientMemory",
        "free": "1/1 CardInsufficientMemory",
        "ghost": R.NODE_UNREGISTERED,
    }


def test_a_node_keeps_the_no_fit_reasons_of_a_workloads_request_shapes() -> None:
    """A trace's few dozen GPU request shapes that fit nowhere each keep their reason on the node,
    so the next pod of any of them reads it instead of fitting again."""
    scheduler = Scheduler(None)  # plan never calls the API
    gpus = [DeviceInfo("n-g0", 0, 4, 8000, 100, "NVIDIA-A100", 0, MODE_HAMI_CORE, True)]
    scheduler.state.on_node(
        {"metadata": {"name": "n", "annotations": {ann.NODE_REGISTER: ann.encode_node_devices(gpus)}}}
    )
    for mib in range(9000, 9040):  # 40 request shapes, each too big for the GPU
        big = pod(f"big-{mib}", containers=[container("c", 1, mib, 10)])
        spec = PodFitSpec.from_pod(big, scheduler.config, "spread", "binpack")
        node, _, failed = scheduler.planner.plan(big, spec, ("n",))
        assert node is None and failed == {"n": "1/1 CardInsufficientMemory"}
    assert len(scheduler.state.ledger.nodes["n"].unfit) == 40


def test_repeated_candidate_list_follows_node_registration() -> None:
    scheduler = Scheduler(None)  # plan never calls the API
    state = scheduler.state
    rng = random.Random(3)
    state.clock = lambda: NOW
    gpus = [DeviceInfo("a-g0", 0, 4, 8000, 100, "NVIDIA-A100", 0, MODE_HAMI_CORE, True)]
    state.on_node(
        {"metadata": {"name": "a", "annotations": {ann.NODE_REGISTER: ann.encode_node_devices(gpus)}}}
    )
    names = ("ghost", "a")
    p = pod("p", containers=[container("c", 1, 1000, 10)])
    _check(scheduler, p, names)
    node, _, failed = scheduler.planner.plan(
        p, PodFitSpec.from_pod(p, scheduler.config, "spread", "binpack"), names
    )
    assert node == "a" and failed == {"ghost": R.NODE_UNREGISTERED}
    state.on_node(_node(rng, "ghost"))  # the same list now names a registered node
    _check(scheduler, p, names)
    _check(scheduler, p, tuple(names))
    state.on_node({"metadata": {"name": "a", "annotations": {}}})  # a unregisters
    node, _, failed = scheduler.planner.plan(
        p, PodFitSpec.from_pod(p, scheduler.config, "spread", "binpack"), names
    )
    assert failed.get("a") == R.NODE_UNREGISTERED and node != "a"
    _check(scheduler, p, names)


def test_a_kept_no_fit_answer_stays_exact_while_nodes_change() -> None:
    """A pod that fits nowhere is retried between changes: every answer is a full walk's."""
    rng = random.Random(7)
    scheduler = Scheduler(None)  # plan never calls the API
    state = scheduler.state
    now = [NOW]
    state.clock = lambda: now[0]
    names = tuple(f"n{i}" for i in range(12))
    for name in names:
        state.on_node(_node(rng, name))
    # a node without GPUs advertised and a young handshake: healthy until the clock says otherwise
    young = _node(rng, "young")
    young["metadata"]["annotations"][ann.NODE_HANDSHAKE] = ann.format_handshake(datetime.fromtimestamp(NOW))
    young["status"]["allocatable"]["nvidia.com/gpu"] = "0"
    state.on_node(young)
    running = [_running(rng, i, state) for i in range(20)]
    for r in running:
        state.ledger.on_pod(r)
    huge = pod("huge", containers=[container("c", 1, 9000, 10)], namespace="a")
    kept = fits = 0
    for step in range(60):
        node, _ = _check(scheduler, huge, (*names, "young", "ghost"))
        if node is not None:
            fits += 1
            continue
        kept += bool(scheduler.planner._no_fit)
        change = rng.random()
        if change < 0.3 and running:
            state.ledger.on_pod_deleted(running.pop(rng.randrange(len(running))))
        elif change < 0.6:
            r = _running(rng, 100 + step, state)
            running.append(r)
            state.ledger.on_pod(r)
        elif change < 0.8:
            state.on_node(_node(rng, rng.choice(names)))
        else:
            now[0] += HANDSHAKE_GRACE_S / 4  # "young" turns unhealthy by the clock alone
    assert kept > 30 and fits == 0, (kept, fits)
    assert not state.ledger.nodes["young"].healthy(now[0])


def test_a_first_no_fit_filter_computes_its_reasons_in_slices(monkeypatch: Any) -> None:
    """Past the cold-fit budget the reasons are computed between yields; the answer is unchanged."""
    import asyncio

    from hamid.scheduler import filter as filter_module
    from hamid.scheduler.extender_json import FilterArgs

    monkeypatch.setattr(filter_module, "_COLD_FITS", 2)
    monkeypatch.setattr(filter_module, "_SLICE_S", 0.0)  # yield after every reason
    rng = random.Random(3)
    scheduler = Scheduler(None)  # a no-fit answer calls no API
    scheduler.state.clock = lambda: NOW
    names = tuple(f"n{i}" for i in range(10))
    for name in names:
        scheduler.state.on_node(_node(rng, name))
    for cache in (scheduler.pods, scheduler.nodes, scheduler.quotas):
        cache._synced.set()
    events: list[str] = []
    scheduler.filtering.record = lambda _pod, _type, reason, _message: events.append(reason)
    huge = pod("huge", containers=[container("c", 1, 9000, 10)])
    spec = PodFitSpec.from_pod(huge, scheduler.config, "spread", "binpack")
    want = _reference(scheduler, huge, spec, names)

    async def run() -> tuple[dict[str, str], int]:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        task = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        started = ticks
        result = await scheduler.filtering.filter(FilterArgs(pod=huge, node_names=names, nodes=None))
        task.cancel()
        assert not result.error and not result.node_names
        return result.failed_nodes, ticks - started

    failed, ticks = asyncio.run(run())
    assert (None, None, failed) == want
    assert ticks > 2  # the loop ran between the slices
    assert events and set(events) == {R.EVENT_FILTERING_FAILED}


def test_filtering_failed_events_read_as_hamis_one_per_reason_type() -> None:
    """HAMi's ``recordFilteringFailures``: ``<k> nodes <Reason>(<n1>,<n2>)`` per reason type
    (an outside audit: hamid grouped by each node's whole reason, counts and ", " included)."""
    failed = {
        "n2": "1/2 CardInsufficientMemory, 1/2 CardNotHealth",
        "n1": "2/2 CardInsufficientMemory",
        "n3": R.NUMA_PREDICTED_NOT_FIT,
    }
    assert _unfit_messages(failed) == [
        "2 nodes CardInsufficientMemory(n1,n2)",
        "1 nodes CardNotHealth(n2)",
        f"1 nodes {R.NUMA_PREDICTED_NOT_FIT}(n3)",
    ]
    assert _unfit_messages({}) == ["no candidate nodes"]
