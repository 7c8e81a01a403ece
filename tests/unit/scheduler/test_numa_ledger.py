"""The scheduler's NUMA ledger (fed by events, rebuilt exactly) and the filter's use of the predictor."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from typing import Any

import pytest

from hamid.fit.fit import Fitted, PodFitSpec, fit_pod
from hamid.fit.numa_fit import pod_shape
from hamid.fit.numa_predict import Outcome, predict
from hamid.model import annotations as ann
from hamid.model import reasons as R
from hamid.model.devices import MODE_HAMI_CORE, DeviceInfo
from hamid.model.numa import (
    NUMA_PLACEMENT,
    NUMA_PREDICTED,
    NUMA_PROFILE,
    ContainerPlacement,
    PodPlacement,
    decode_prediction,
    encode_placement,
    encode_profile,
)
from hamid.scheduler.core import Scheduler
from hamid.scheduler.filter_plan import NumaFit
from hamid.scheduler.numa_ledger import NumaLedgers, Source, replay_view
from tests.unit.fit.test_numa_predict import NOW, profile_of

GPU = "nvidia.com/gpu"
#: Two NUMA nodes of 4 CPUs each (no SMT), CPU 0 reserved: NUMA 0 has 3 assignable CPUs, NUMA 1 four.
PROFILE = profile_of([(c, c, c // 4, c // 4) for c in range(8)], reserved=(0,))


def _gpu(uuid: str, index: int, numa: int, mem: int = 8000) -> DeviceInfo:
    return DeviceInfo(uuid, index, 10, mem, 100, "NVIDIA-A100", numa, MODE_HAMI_CORE, True)


def _node(name: str = "n1", profile: bool = True, mems: tuple[int, int] = (8000, 8000)) -> dict[str, Any]:
    gpus = [_gpu(f"{name}-g0", 0, 0, mems[0]), _gpu(f"{name}-g1", 1, 1, mems[1])]
    annotations = {ann.NODE_REGISTER: ann.encode_node_devices(gpus)}
    if profile:
        annotations[NUMA_PROFILE] = encode_profile(PROFILE)
    return {
        "metadata": {"name": name, "annotations": annotations},
        "status": {"allocatable": {GPU: "20"}},
    }


def _pod(
    name: str,
    cpus: int = 2,
    gpus: int = 1,
    mem: int = 1000,
    annotations: dict[str, str] | None = None,
    scheduler: str = "hami-scheduler",
    node: str = "",
) -> dict[str, Any]:
    limits = {"cpu": str(cpus), "memory": "1Gi"}
    if gpus:
        limits |= {GPU: str(gpus), "nvidia.com/gpumem": str(mem)}
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "containers": [{"name": "main", "resources": {"limits": limits, "requests": limits}}],
    }
    if node:
        spec["nodeName"] = node
    return {
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": f"uid-{name}",
            "annotations": annotations or {},
        },
        "spec": spec,
        "status": {"phase": "Pending"},
    }


def _placement(cpus: frozenset[int], numa: int, devices: tuple[str, ...] = ()) -> str:
    held = {GPU: {numa: devices}} if devices else {}
    return encode_placement(PodPlacement(1, (ContainerPlacement("main", frozenset({numa}), cpus, held),)))


def _scheduler(*nodes: dict[str, Any]) -> tuple[Scheduler, list[tuple[str, str]]]:
    scheduler = Scheduler(None)  # plan never calls the API
    scheduler.state.clock = lambda: float(NOW)
    scored: list[tuple[str, str]] = []
    scheduler.numa.report = lambda result, cause: scored.append((result, cause))
    for n in nodes:
        scheduler._node_seen(n)
    return scheduler, scored


def _plan(scheduler: Scheduler, p: dict[str, Any], names: tuple[str, ...] = ("n1",)) -> tuple[Any, ...]:
    spec = PodFitSpec.from_pod(p, scheduler.config, "spread", "binpack")
    numa = NumaFit.of(p, p["metadata"]["uid"])
    node, fitted, failed = scheduler.planner.plan(p, spec, names, numa)
    return node, fitted, failed, numa


def _source(ledgers: NumaLedgers, uid: str) -> str:
    """Where a pod's booking comes from ("" when it has none), read from the nodes' records."""
    sources = [str(entry.records[uid].source) for entry in ledgers.nodes.values() if uid in entry.records]
    return sources[0] if sources else ""


def _gpus_of(fitted: Fitted) -> list[str]:
    return [d.uuid for entry in fitted.devices for d in entry]


def test_gpu_is_fitted_on_the_numa_node_kubelet_will_choose() -> None:
    scheduler, _ = _scheduler(_node())
    # kubelet would pick NUMA 0 (lowest id) for 2 CPUs: the GPU is NUMA 0's
    node, fitted, _, numa = _plan(scheduler, _pod("a"))
    assert node == "n1" and _gpus_of(fitted) == ["n1-g0"]
    # a foreign Guaranteed pod holding NUMA 0's CPUs (observed) moves kubelet's choice to NUMA 1
    foreign = _pod("f", cpus=3, gpus=0, scheduler="default-scheduler", node="n1")
    foreign["metadata"]["annotations"][NUMA_PLACEMENT] = _placement(frozenset({1, 2, 3}), 0)
    scheduler._pod_seen(foreign)
    assert scheduler.numa.free_cpus("n1") == frozenset({4, 5, 6, 7})
    node, fitted, _, numa = _plan(scheduler, _pod("b"))
    assert node == "n1" and _gpus_of(fitted) == ["n1-g1"]
    prediction = numa.predictions["n1"]
    assert prediction is not None and prediction.containers[0].numa == frozenset({1})


def test_a_node_kubelet_would_reject_is_not_offered() -> None:
    scheduler, _ = _scheduler(_node("n1"), _node("n2", profile=False))
    # 5 exclusive CPUs fit no single NUMA node: single-numa-node rejects it on n1, even idle
    node, _, failed, numa = _plan(scheduler, _pod("big", cpus=5), ("n1",))
    assert node is None and failed == {"n1": R.NUMA_NEVER_ADMISSIBLE}
    assert numa.predictions["n1"] is not None and numa.predictions["n1"].outcome is Outcome.REJECT
    # a node without a profile keeps today's behaviour (no prediction)
    node, _, _, numa = _plan(scheduler, _pod("big2", cpus=5), ("n1", "n2"))
    assert node == "n2" and numa.predictions.get("n2") is None


def test_a_rejection_the_idle_node_would_admit_is_only_not_fit_now() -> None:
    scheduler, _ = _scheduler(_node())
    # NUMA 1's 4 CPUs hold 4 exclusive CPUs on the idle node; a foreign pod now holds two of them
    foreign = _pod("f", cpus=2, gpus=0, scheduler="default-scheduler", node="n1")
    foreign["metadata"]["annotations"][NUMA_PLACEMENT] = _placement(frozenset({4, 5}), 1)
    scheduler._pod_seen(foreign)
    node, _, failed, numa = _plan(scheduler, _pod("wide", cpus=4))
    assert node is None and failed == {"n1": R.NUMA_PREDICTED_NOT_FIT}
    assert numa.predictions["n1"] is not None and numa.predictions["n1"].outcome is Outcome.REJECT
    assert not scheduler.numa.never_admits("n1", numa.pod, numa.shape)
    # once it is gone the same pod is placed, on NUMA 1's GPU
    scheduler._pod_gone(foreign)
    node, fitted, _, _ = _plan(scheduler, _pod("wide2", cpus=4))
    assert node == "n1" and _gpus_of(fitted) == ["n1-g1"]


@pytest.mark.parametrize("mode", ["strict", "best-effort", ""])
def test_strict_is_not_placed_off_the_predicted_numa_node_best_effort_falls_back(mode: str) -> None:
    scheduler, _ = _scheduler(_node(mems=(1000, 8000)))  # NUMA 0's GPU is too small
    annotations = {ann.NUMA_ALIGNMENT: mode} if mode else {}
    node, fitted, failed, _ = _plan(scheduler, _pod("p", mem=4000, annotations=annotations))
    if mode == "strict":
        assert node is None and failed == {"n1": R.NUMA_PREDICTED_NOT_FIT}
    else:
        assert node == "n1" and _gpus_of(fitted) == ["n1-g1"]


def test_an_aligned_fit_on_a_later_node_beats_a_fallback() -> None:
    scheduler, _ = _scheduler(_node("n1", mems=(1000, 8000)), _node("n2"))
    node, fitted, _, _ = _plan(scheduler, _pod("p", mem=4000), ("n1", "n2"))
    assert node == "n2" and _gpus_of(fitted) == ["n2-g0"]


def test_without_profiles_the_plan_is_todays() -> None:
    rng = random.Random(3)
    scheduler, _ = _scheduler(*(_node(f"n{i}", profile=False) for i in range(4)))
    for i in range(20):
        p = _pod(f"p{i}", mem=rng.choice((500, 3000, 7000)))
        spec = PodFitSpec.from_pod(p, scheduler.config, "spread", "binpack")
        with_numa = scheduler.planner.plan(p, spec, ("n0", "n1", "n2", "n3"), NumaFit.of(p, f"uid-p{i}"))
        assert with_numa == scheduler.planner.plan(p, spec, ("n0", "n1", "n2", "n3"))
        node, fitted, _ = with_numa
        if node is not None and fitted is not None:
            scheduler.ledger.reserve(p, node, fitted.devices, ann.encode_pod_devices(fitted.devices))
        assert fit_pod(scheduler.ledger.nodes["n0"].usage, spec) is not None


def test_a_burst_sees_the_predictions_of_its_predecessors() -> None:
    scheduler, _ = _scheduler(_node())
    chosen = []
    for i in range(3):
        p = _pod(f"b{i}", cpus=2)
        node, fitted, _, numa = _plan(scheduler, p)
        assert node == "n1"
        prediction = numa.predictions[node]
        assert prediction is not None
        scheduler.numa.book(p["metadata"]["uid"], node, prediction, p)
        chosen.append((_gpus_of(fitted), sorted(prediction.containers[0].numa)))
    # NUMA 0 has 3 free CPUs: the first pod takes 2 there, the next two go to NUMA 1 (4 CPUs)
    assert chosen == [(["n1-g0"], [0]), (["n1-g1"], [1]), (["n1-g1"], [1])]
    assert scheduler.numa.free_cpus("n1") == frozenset({3})


def _filtered(scheduler: Scheduler, name: str, cpus: int = 2) -> dict[str, Any]:
    """A pod planned and booked as the filter does, with the annotations its patch writes."""
    p = _pod(name, cpus=cpus)
    node, fitted, _, numa = _plan(scheduler, p)
    prediction = numa.predictions[node]
    raw = ann.encode_pod_devices(fitted.devices)
    scheduler.ledger.reserve(p, node, fitted.devices, raw)
    scheduler.numa.book(p["metadata"]["uid"], node, prediction, p)
    predicted = scheduler.reserver.prediction_annotation(node, prediction)
    assert predicted is not None
    p["metadata"]["annotations"] |= {
        ann.VGPU_NODE: node,
        ann.DEVICES_ALLOCATED: raw,
        NUMA_PREDICTED: predicted,
    }
    return p


def test_ledger_is_rebuilt_exactly_from_annotations_in_any_order() -> None:
    scheduler, _ = _scheduler(_node())
    pods = [_filtered(scheduler, f"p{i}") for i in range(3)]
    foreign = _pod("f", cpus=1, gpus=0, scheduler="default-scheduler", node="n1")
    scheduler._pod_seen(foreign)  # replayed: kubelet would give it one CPU
    for p in pods:
        scheduler._pod_seen(p)
    want = scheduler.numa.free_cpus("n1"), scheduler.numa.nodes["n1"].ledger.device_counts(GPU)
    assert want[0] == frozenset()  # 3 x 2 CPUs + 1 of the 7 assignable
    for order in (pods, list(reversed(pods))):
        restarted = NumaLedgers("hami-scheduler", GPU, lambda: float(NOW), booked_on=scheduler._booked_on)
        for p in order:
            restarted.on_pod(p)  # pods before their node (a restart's list order)
        restarted.on_node(_node(), scheduler.ledger.nodes["n1"].infos)
        restarted.on_pod(foreign)
        assert (restarted.free_cpus("n1"), restarted.nodes["n1"].ledger.device_counts(GPU)) == want
        assert _source(restarted, "uid-p0") == Source.PREDICTED


def test_observed_placement_scores_the_prediction() -> None:
    scheduler, scored = _scheduler(_node())
    p = _filtered(scheduler, "hit")
    predicted = decode_prediction(p["metadata"]["annotations"][NUMA_PREDICTED]).containers[0]
    p["spec"]["nodeName"] = "n1"
    p["metadata"]["annotations"][NUMA_PLACEMENT] = _placement(predicted.cpus, 0, ("n1-g0::0",))
    scheduler._pod_seen(p)
    assert scored == [("hit", "")] and _source(scheduler.numa, "uid-hit") == Source.PLACEMENT
    # a foreign pod admitted after the prediction makes the next one miss, classified "foreign"
    q = _filtered(scheduler, "miss", cpus=1)
    foreign = _pod("f", cpus=1, gpus=0, scheduler="default-scheduler", node="n1")
    foreign["metadata"]["annotations"][NUMA_PLACEMENT] = _placement(frozenset({3}), 0)
    scheduler._pod_seen(foreign)
    q["spec"]["nodeName"] = "n1"
    q["metadata"]["annotations"][NUMA_PLACEMENT] = _placement(frozenset({4}), 1, ("n1-g1::0",))
    scheduler._pod_seen(q)
    assert scored[-1] == ("miss", "foreign")
    metrics = scheduler.metrics
    scheduler._numa_scored("miss", "order")
    assert metrics.numa_predictions.labels("miss")._value.get() == 1
    assert metrics.numa_prediction_misses.labels("order")._value.get() == 1


def test_refit_scores_a_miss_and_moves_the_booking_to_kubelets_numa_node() -> None:
    scheduler, scored = _scheduler(_node())
    p = _filtered(scheduler, "r")
    assert scheduler.numa.free_cpus("n1") == frozenset({3, 4, 5, 6, 7})
    scheduler.numa.on_refit("uid-r", "n1", 0, 1)
    assert scored == [("miss", "unmodelled")]
    assert scheduler.numa.free_cpus("n1") == frozenset({1, 2, 3, 6, 7})
    assert scheduler.numa.nodes["n1"].ledger.device_counts(GPU) == {0: (10, 10), 1: (10, 9)}
    scheduler._pod_gone(p)
    assert scheduler.numa.free_cpus("n1") == frozenset(range(1, 8))


def test_memo_is_keyed_by_ledger_version_and_shape() -> None:
    scheduler, _ = _scheduler(_node())
    ledgers = scheduler.numa
    a, b = _pod("a"), _pod("b")
    first = ledgers.predict("n1", a, pod_shape(a), "uid-a")
    assert ledgers.predict("n1", b, pod_shape(b), "uid-b") is first
    assert pod_shape(a) != pod_shape(_pod("c", cpus=3))
    ledgers.book("uid-a", "n1", first, a)
    again = ledgers.predict("n1", b, pod_shape(b), "uid-b")
    assert again is not first and again is not None and again.outcome is Outcome.PLACED


def test_filter_patch_records_the_prediction_and_undoes_it_on_failure() -> None:
    class FailingKube:
        async def patch_pod_metadata(self, *args: Any, **kwargs: Any) -> None:
            raise RuntimeError("injected")

    scheduler, _ = _scheduler(_node())
    scheduler.reserver.kube = FailingKube()  # type: ignore[assignment]
    for cache in (scheduler.pods, scheduler.nodes, scheduler.quotas):
        cache._synced.set()
    from hamid.scheduler.extender_json import FilterArgs

    args = FilterArgs(pod=_pod("x"), node_names=("n1",), nodes=None)
    result = asyncio.run(scheduler.filtering.filter(args))
    assert result.error and "injected" in result.error
    assert scheduler.numa.free_cpus("n1") == frozenset(range(1, 8))


def test_a_terminating_pod_keeps_its_booking_until_it_is_gone() -> None:
    """kubelet holds a deleted pod's CPUs until its containers stopped, then confirms the deletion:
    the ledger frees them at the delete event (or a terminal phase), not at ``deletionTimestamp``."""
    scheduler, _ = _scheduler(_node())
    foreign = _pod("f", cpus=3, gpus=0, scheduler="default-scheduler", node="n1")
    foreign["metadata"]["annotations"][NUMA_PLACEMENT] = _placement(frozenset({1, 2, 3}), 0)
    foreign["status"]["phase"] = "Running"
    scheduler._pod_seen(foreign)
    assert scheduler.numa.free_cpus("n1") == frozenset({4, 5, 6, 7})
    deleting = {**foreign["metadata"], "deletionTimestamp": "2026-01-01T00:00:00Z"}
    terminating = {**foreign, "metadata": deleting}
    scheduler._pod_updated(foreign, terminating)
    assert scheduler.numa.free_cpus("n1") == frozenset({4, 5, 6, 7})
    node, fitted, _, _ = _plan(scheduler, _pod("b", cpus=3))
    assert node == "n1" and _gpus_of(fitted) == ["n1-g1"]  # NUMA 0's CPUs are still held
    scheduler._pod_gone(terminating)
    assert scheduler.numa.free_cpus("n1") == frozenset(range(1, 8))


def test_a_terminal_pod_frees_its_booking_at_once() -> None:
    scheduler, _ = _scheduler(_node())
    foreign = _pod("f", cpus=3, gpus=0, scheduler="default-scheduler", node="n1")
    foreign["metadata"]["annotations"][NUMA_PLACEMENT] = _placement(frozenset({1, 2, 3}), 0)
    scheduler._pod_seen(foreign)
    done = {**foreign, "status": {"phase": "Succeeded"}}
    scheduler._pod_updated(foreign, done)
    assert scheduler.numa.free_cpus("n1") == frozenset(range(1, 8))


def test_a_bound_pod_listed_before_its_node_is_replayed_once_the_node_comes() -> None:
    """A restart may list pods before nodes: a bound pod without a placement (another scheduler's,
    before the node agent annotates it) is replayed when its node arrives, not dropped."""
    scheduler, _ = _scheduler(_node())
    foreign = _pod("f", cpus=2, scheduler="default-scheduler", node="n1")
    foreign["status"]["phase"] = "Running"
    scheduler._pod_seen(foreign)
    want = scheduler.numa.free_cpus("n1"), scheduler.numa.nodes["n1"].ledger.device_counts(GPU)
    assert want[0] is not None and len(want[0]) == 5  # its 2 exclusive CPUs of the 7 assignable
    restarted = NumaLedgers("hami-scheduler", GPU, lambda: float(NOW), booked_on=scheduler._booked_on)
    restarted.on_pod(foreign)  # the pod list first
    restarted.on_node(_node(), scheduler.ledger.nodes["n1"].infos)
    assert (restarted.free_cpus("n1"), restarted.nodes["n1"].ledger.device_counts(GPU)) == want
    assert _source(restarted, "uid-f") == Source.REPLAY


def test_a_gpu_health_flap_gives_a_prediction_its_booking_back() -> None:
    """Every GPU unhealthy, then healthy again (an XID flap): the pod's ``numa-predicted`` booking
    holds again, as a restarted scheduler books it from the same annotation (it was replayed as
    nothing while its replicas were unhealthy, and that empty booking kept for good)."""
    scheduler, _ = _scheduler(_node())
    scheduler._pod_seen(_filtered(scheduler, "p"))
    entry = scheduler.numa.nodes["n1"]
    assert entry.ledger is not None
    want = entry.ledger.free_cpus, entry.ledger.device_counts(GPU)
    sick = _node()
    gpus = [dataclasses.replace(_gpu(f"n1-g{i}", i, i), health=False) for i in range(2)]
    sick["metadata"]["annotations"][ann.NODE_REGISTER] = ann.encode_node_devices(gpus)
    scheduler._node_seen(sick)
    scheduler._node_seen(_node())
    assert entry.ledger is not None
    assert (entry.ledger.free_cpus, entry.ledger.device_counts(GPU)) == want
    rec = entry.records["uid-p"]
    assert rec.source is Source.PREDICTED and rec.held == rec.usage


def test_a_replayed_pod_is_kept_as_what_the_predictor_reads() -> None:
    scheduler, _ = _scheduler(_node())
    foreign = _pod("f", cpus=2, gpus=0, scheduler="default-scheduler", node="n1")
    foreign["spec"]["initContainers"] = [
        {"name": "init", "image": "x", "resources": {"limits": {"cpu": "3", "memory": "1Gi"}}},
        {
            "name": "side",
            "restartPolicy": "Always",
            "env": [{"name": "A", "value": "b"}],
            "resources": {"limits": {"cpu": "1", "memory": "64Mi"}},
        },
    ]
    foreign["status"]["qosClass"] = "Guaranteed"
    foreign["metadata"]["annotations"]["big"] = "x" * 4096
    view = replay_view(foreign)
    assert "metadata" not in view and "env" not in str(view)
    ledger = scheduler.numa.nodes["n1"].ledger
    assert predict(PROFILE, ledger, view, now=NOW) == predict(PROFILE, ledger, foreign, now=NOW)
    scheduler._pod_seen(foreign)
    assert _source(scheduler.numa, "uid-f") == Source.REPLAY
    free = scheduler.numa.free_cpus("n1")
    assert free is not None and len(free) < 7  # the replay booked its exclusive CPUs
    scheduler.numa.on_node_deleted("n1")
    scheduler.numa.on_node(_node(), scheduler.ledger.nodes["n1"].infos)  # the rebuild replays it again
    assert scheduler.numa.free_cpus("n1") == free


def test_pods_of_one_shape_share_their_booked_usage() -> None:
    scheduler, _ = _scheduler(_node())
    for name in ("a", "b"):
        p = _pod(name, cpus=1, gpus=1, node="n1")
        p["metadata"]["annotations"][NUMA_PLACEMENT] = _placement(frozenset(), 1, (f"{name}-gpu",))
        scheduler._pod_seen(p)
    records = scheduler.numa.nodes["n1"].records
    assert records["uid-a"].usage is records["uid-b"].usage
    assert records["uid-a"].usage.devices == {GPU: {1: 1}}


# -- what a tenant may write: NUMA annotations on pods admission does not guard (red-team findings) --


def _besteffort(name: str, placement: str) -> dict[str, Any]:
    """A tenant's pod of another scheduler (neither the webhook's UPDATE rule nor the policy judge
    it), bound and holding nothing, with a placement of its creator's making."""
    p = _pod(
        name, cpus=0, gpus=0, scheduler="my-own-scheduler", node="n1", annotations={NUMA_PLACEMENT: placement}
    )
    p["spec"]["containers"][0]["resources"] = {}
    return p


def test_a_placement_beyond_the_pods_own_limits_books_nothing() -> None:
    """It was booked as the truth: a pod holding nothing took NUMA 0's exclusive CPUs, sent other
    tenants' pods to NUMA 1's GPU where kubelet picks NUMA 0, or made the node `unknown`."""
    scheduler, _ = _scheduler(_node())
    many_replicas = _placement(frozenset(), 0, tuple(f"d{i}" for i in range(500)))
    for forged in (_placement(frozenset({1, 2, 3}), 0), many_replicas):
        scheduler._pod_seen(_besteffort("evil", forged))
        assert _source(scheduler.numa, "uid-evil") == ""
        assert scheduler.numa.free_cpus("n1") == frozenset(range(1, 8))
        node, fitted, _, numa = _plan(scheduler, _pod("victim"))
        assert node == "n1" and _gpus_of(fitted) == ["n1-g0"]
        assert numa.predictions["n1"].outcome is Outcome.PLACED
    # a Guaranteed pod's true placement within its limits is still the truth
    honest = _pod("honest", cpus=3, gpus=0, scheduler="default-scheduler", node="n1")
    honest["metadata"]["annotations"][NUMA_PLACEMENT] = _placement(frozenset({1, 2, 3}), 0)
    scheduler._pod_seen(honest)
    assert _source(scheduler.numa, "uid-honest") == "placement"
    assert scheduler.numa.free_cpus("n1") == frozenset({4, 5, 6, 7})


def test_a_prediction_counts_only_on_a_pod_this_scheduler_booked() -> None:
    """A pod of hamid's scheduler created past the webhook (``hami.io/webhook: ignore``), parked
    unbound with a forged prediction and ``vgpu-node``, held every CPU of the node it named."""
    scheduler, _ = _scheduler(_node())
    forged = _filtered(_scheduler(_node())[0], "parked", cpus=3)["metadata"]["annotations"][NUMA_PREDICTED]
    parked = _pod("parked", cpus=0, gpus=0, annotations={NUMA_PREDICTED: forged, ann.VGPU_NODE: "n1"})
    scheduler._pod_seen(parked)
    assert _source(scheduler.numa, "uid-parked") == ""
    assert scheduler.numa.free_cpus("n1") == frozenset(range(1, 8))
    booked = _filtered(scheduler, "booked", cpus=2)  # the filter's own: booked, and kept
    scheduler._pod_seen(booked)
    assert _source(scheduler.numa, "uid-booked") == "predicted"


def test_an_unbookable_placement_counts_once_and_books_when_room_comes_back() -> None:
    """Counted twice before, so with every pod gone the node still answered `unknown`."""
    scheduler, _ = _scheduler(_node())
    old = _pod("old", cpus=3, gpus=0, scheduler="default-scheduler", node="n1")
    old["metadata"]["annotations"][NUMA_PLACEMENT] = _placement(frozenset({1, 2, 3}), 0)
    old["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"  # terminating, still holding
    scheduler._pod_seen(old)
    new = _pod("new", cpus=3, gpus=0, scheduler="default-scheduler", node="n1")
    new["metadata"]["annotations"][NUMA_PLACEMENT] = _placement(frozenset({1, 2, 3}), 0)
    scheduler._pod_seen(new)  # kubelet already gave the CPUs again: one record unbooked
    assert scheduler.numa.nodes["n1"].unbooked == 1
    scheduler._pod_gone(old)
    assert scheduler.numa.nodes["n1"].unbooked == 0  # the room came back: booked now
    assert scheduler.numa.free_cpus("n1") == frozenset({4, 5, 6, 7})
    scheduler._pod_gone(new)
    assert scheduler.numa.nodes["n1"].unbooked == 0
    prediction = scheduler.numa.predict("n1", _pod("victim"), pod_shape(_pod("victim")), "uid-victim")
    assert prediction is not None and prediction.outcome is Outcome.PLACED


def test_a_device_of_two_numa_nodes_counts_once_against_the_limit() -> None:
    """A review: PodResources lists a device whose topology names two NUMA nodes under each, so
    one replica counted as two and a true placement was ignored as beyond the pod's limit."""
    scheduler, _ = _scheduler(_node())
    p = _pod("wide", cpus=2, gpus=1, scheduler="default-scheduler", node="n1")
    held = {GPU: {0: ("n1-g0::0",), 1: ("n1-g0::0",)}}
    placed = PodPlacement(1, (ContainerPlacement("main", frozenset({0, 1}), frozenset({1, 2}), held),))
    p["metadata"]["annotations"][NUMA_PLACEMENT] = encode_placement(placed)
    scheduler._pod_seen(p)
    assert _source(scheduler.numa, "uid-wide") == "placement"


def test_a_replaced_node_leaves_no_entry_once_its_last_pod_went() -> None:
    """Nodes replaced under new names (autoscaling, spot) do not pile up in the NUMA ledgers: a
    deleted node's entry stays while a pod's record is on it, and goes with the last one."""
    scheduler, _ = _scheduler()
    for i in range(20):
        name = f"spot-{i}"
        scheduler._node_seen(_node(name))
        running = _pod(f"p{i}", node=name, annotations={NUMA_PLACEMENT: _placement(frozenset({1, 2}), 0)})
        running["status"]["phase"] = "Running"
        scheduler._pod_seen(running)
        scheduler._node_gone(_node(name))
        assert name in scheduler.numa.nodes  # its pod's record is still held
        scheduler._pod_gone(running)
    assert not scheduler.numa.nodes
    scheduler._node_seen(_node("n1"))  # a node that comes back is modelled afresh
    assert scheduler.numa.nodes["n1"].profile == PROFILE
