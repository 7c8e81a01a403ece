"""The scheduler follows the plugin's ``--hide-replicas``: it predicts with the replicas kubelet sees."""

from __future__ import annotations

import dataclasses
from typing import Any

from hamid.fit.numa_fit import pod_shape
from hamid.fit.numa_predict import Outcome
from hamid.model import annotations as ann
from hamid.model import reasons as R
from hamid.model.numa import NUMA_PROFILE, ReplicaHiding, decode_profile, encode_profile
from hamid.scheduler.core import Scheduler
from tests.unit.scheduler.test_numa_ledger import GPU, _gpus_of, _node, _plan, _pod, _scheduler


def _hiding_node(rule: str = "full", topology_policy: str | None = None) -> dict[str, Any]:
    node = _node()
    notes = node["metadata"]["annotations"]
    profile = decode_profile(notes[NUMA_PROFILE])
    if topology_policy is not None:
        policies = dataclasses.replace(profile.policies, topology_manager_policy=topology_policy)
        profile = dataclasses.replace(profile, policies=policies)
    notes[NUMA_PROFILE] = encode_profile(dataclasses.replace(profile, hide_replicas=ReplicaHiding(GPU, rule)))
    return node


def _numa(prediction: Any) -> set[int]:
    assert prediction is not None and prediction.outcome is Outcome.PLACED
    return set(prediction.containers[0].numa)


def _fill_gpu0(scheduler: Scheduler, mem: int = 8000, gpu: str = "n1-g0") -> None:
    """``full``: one CPU and ``mem`` MiB of GPU 0 (NUMA 0; all of it by default; or ``gpu``),
    planned and booked as the filter does."""
    p = _pod("full", cpus=1, mem=mem, annotations={ann.USE_GPU_UUID: gpu})
    node, fitted, _, numa = _plan(scheduler, p)
    assert node == "n1" and _gpus_of(fitted) == [gpu]
    scheduler.ledger.reserve(p, node, fitted.devices, ann.encode_pod_devices(fitted.devices))
    scheduler.numa.book("uid-full", node, numa.predictions[node], p)


def test_a_full_gpu_moves_the_prediction_and_the_fit_to_the_other_numa_node() -> None:
    """NUMA 0 still has the CPUs: where the plugin hides full GPUs' free replicas, kubelet's device
    hint is NUMA 1 alone, so the prediction and the GPU are there (aligned); elsewhere kubelet
    keeps NUMA 0 and the GPU can only be an unaligned fallback on NUMA 1."""
    for node, want in ((_hiding_node(), {1}), (_node(), {0})):
        scheduler, _ = _scheduler(node)
        _fill_gpu0(scheduler)
        chosen, fitted, _failed, numa = _plan(scheduler, _pod("b", cpus=2))
        assert chosen == "n1" and _gpus_of(fitted) == ["n1-g1"]
        assert _numa(numa.predictions["n1"]) == want


def test_the_memo_tells_hidden_replicas_apart() -> None:
    scheduler, _ = _scheduler(_hiding_node())
    _fill_gpu0(scheduler)
    ledgers, usage = scheduler.numa, scheduler.state.inventory.nodes["n1"].usage
    p = _pod("b", cpus=2)
    seen = ledgers.predict("n1", p, pod_shape(p), "uid-b")  # no usage: nothing known hidden
    hidden = ledgers.predict("n1", p, pod_shape(p), "uid-b", usage)
    assert _numa(seen) == {0} and _numa(hidden) == {1}
    assert ledgers.hidden("n1", usage) == {0: 9}


def test_busy_sends_the_next_pod_to_the_idle_gpu_while_full_keeps_it_on_the_shared_one() -> None:
    """GPU 0 holds a share (room left), GPU 1 is idle: under ``busy`` GPU 0's free replicas are
    hidden, kubelet's hint is NUMA 1 and the pod goes to GPU 1 aligned; under ``full`` GPU 0
    still offers them, the hint is NUMA 0 and the pod shares GPU 0 (aligned there)."""
    for node, want, gpu in ((_hiding_node("busy"), {1}, "n1-g1"), (_hiding_node("full"), {0}, "n1-g0")):
        scheduler, _ = _scheduler(node)
        _fill_gpu0(scheduler, mem=2000)
        chosen, fitted, _failed, numa = _plan(scheduler, _pod("b", cpus=2))
        assert chosen == "n1" and _gpus_of(fitted) == [gpu]
        assert _numa(numa.predictions["n1"]) == want
        usage = scheduler.state.inventory.nodes["n1"].usage
        assert scheduler.numa.hidden("n1", usage) == ({0: 9} if want == {1} else {})


def test_span_predicts_a_pod_wider_than_a_numa_node_admitted_on_the_idle_node_only() -> None:
    """Both GPUs and 5 exclusive CPUs (NUMA 0 has 3 assignable, NUMA 1 has 4) under ``restricted``:
    where every replica is listed kubelet never admits it (``NumaNeverAdmissible``); under ``span``
    the idle node lists one replica per GPU, the spanning hint is preferred, and the pod is placed
    across both NUMA nodes; once a share is booked there every replica is listed again."""
    wide = _pod("wide", cpus=5, gpus=2)
    busy, _ = _scheduler(_hiding_node("busy", "restricted"))
    chosen, _fitted, failed, _fit = _plan(busy, wide)
    assert chosen is None and failed == {"n1": R.NUMA_NEVER_ADMISSIBLE}
    span, _ = _scheduler(_hiding_node("span", "restricted"))
    usage = span.state.inventory.nodes["n1"].usage
    assert span.numa.omitted("n1", usage) == {0: 9, 1: 9} and span.numa.hidden("n1", usage) == {}
    chosen, fitted, _failed, fit = _plan(span, wide)
    assert chosen == "n1" and sorted(_gpus_of(fitted)) == ["n1-g0", "n1-g1"]
    assert _numa(fit.predictions["n1"]) == {0, 1}
    # a share booked on GPU 0: every replica listed, the wide pod is refused (but not "never")
    _fill_gpu0(span, mem=2000)
    assert span.numa.omitted("n1", usage) == {}
    chosen, _fitted, failed, _fit = _plan(span, wide)
    assert chosen is None and failed["n1"] != R.NUMA_NEVER_ADMISSIBLE


def test_span_never_admissible_only_when_both_lists_reject() -> None:
    """Both GPUs and 3 exclusive CPUs (NUMA 0 assigns 3): on the idle ``span`` node kubelet would
    reject it (the CPUs prefer NUMA 0, the devices only the span), but once anything is booked every
    replica is listed and it fits NUMA 0: refused, yet not ``NumaNeverAdmissible``."""
    narrow = _pod("narrow", cpus=3, gpus=2)
    span, _ = _scheduler(_hiding_node("span", "restricted"))
    chosen, _fitted, failed, _fit = _plan(span, narrow)
    assert chosen is None and failed == {"n1": R.NUMA_PREDICTED_NOT_FIT}
    busy, _ = _scheduler(_hiding_node("busy", "restricted"))
    chosen, _fitted, _failed, _fit = _plan(busy, narrow)
    assert chosen == "n1"


def test_span_predicts_a_pod_asking_more_replicas_than_the_idle_node_lists_on_the_full_list() -> None:
    """Three containers sharing GPU replicas ask 3 of the 2 listed: once bound, the plugin lists
    what the booking needs, so the prediction takes the full list rather than refusing the pod."""
    pod = _pod("three", cpus=1, gpus=1)
    main = pod["spec"]["containers"][0]
    pod["spec"]["containers"] = [dict(main, name=f"c{i}") for i in range(3)]
    span, _ = _scheduler(_hiding_node("span", "restricted"))
    chosen, _fitted, failed, _fit = _plan(span, pod)
    assert chosen == "n1", failed


def test_span_is_busy_under_single_numa_node() -> None:
    scheduler, _ = _scheduler(_hiding_node("span", "single-numa-node"))
    usage = scheduler.state.inventory.nodes["n1"].usage
    assert scheduler.numa.hide_rule("n1") == "busy" and scheduler.numa.omitted("n1", usage) == {}


def test_steer_lets_the_gpu_policy_choose_and_kubelet_follow_it() -> None:
    """GPU 0 (NUMA 0) holds a share, GPU 1 (NUMA 1) is idle, and ``binpack`` prefers GPU 0. Under
    ``busy`` GPU 0's free replicas are hidden, kubelet's hint is NUMA 1 and the pod can only go to
    GPU 1; under ``steer`` only the booked GPU's NUMA node offers free replicas while the pod is
    admitted, so kubelet gives its CPUs NUMA 0 and the pod packs GPU 0, aligned."""
    binpack = {"hami.io/gpu-scheduler-policy": "binpack"}
    for rule, gpu, want in (("busy", "n1-g1", {1}), ("steer", "n1-g0", {0})):
        scheduler, _ = _scheduler(_hiding_node(rule, "restricted"))
        _fill_gpu0(scheduler, mem=2000)
        chosen, fitted, _failed, numa = _plan(scheduler, _pod("b", cpus=2, annotations=binpack))
        assert chosen == "n1" and _gpus_of(fitted) == [gpu]
        assert _numa(numa.predictions["n1"]) == want


def test_steer_books_a_pod_across_numa_nodes_only_as_the_unaligned_fallback() -> None:
    """Both GPUs and 3 exclusive CPUs, a share on GPU 1: a booking on both NUMA nodes steers
    nothing, kubelet's hint is NUMA 0 (its CPUs, and GPU 0's replicas) and the plugin hands out GPU
    0's replicas only, so the booking is never predicted to be followed; no NUMA node holds both
    GPUs, and the pod (not ``strict``) runs as the unaligned fallback with kubelet's prediction."""
    steer, _ = _scheduler(_hiding_node("steer", "restricted"))
    _fill_gpu0(steer, mem=2000, gpu="n1-g1")
    chosen, fitted, _failed, numa = _plan(steer, _pod("two", cpus=3, gpus=2))
    assert chosen == "n1" and sorted(_gpus_of(fitted)) == ["n1-g0", "n1-g1"]
    assert _numa(numa.predictions["n1"]) == {0}
    strict = _pod("strict", cpus=3, gpus=2, annotations={"hami.io/numa-alignment": "strict"})
    chosen, _fitted, failed, _numa_fit = _plan(steer, strict)
    assert chosen is None and failed == {"n1": R.NUMA_PREDICTED_NOT_FIT}
