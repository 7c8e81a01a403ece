"""Trust nothing a pod says about itself (issue 16): the webhook removes scheduler-owned keys and
refuses pods that would skip the scheduler; the state books only what requests and register confirm.

Wire names are spelled out literally here, so a typo in the code's constants fails these tests.
"""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import pytest

from hamid.model import annotations as ann
from hamid.model.resources import ResourceConfig
from hamid.scheduler.state import SchedulerState
from hamid.scheduler.webhook import admission_response, review_pod, review_update
from tests.unit.scheduler.helpers import container, node, pod

CFG = ResourceConfig()
OWNED = {
    "hami.io/vgpu-node": "n1",
    "hami.io/vgpu-time": "1700000000",
    "hami.io/vgpu-devices-to-allocate": "n1-gpu0,NVIDIA,97887,100:;",
    "hami.io/vgpu-devices-allocated": "n1-gpu0,NVIDIA,97887,100:;",
    "hami.io/vgpu-mig-allocations": "x",
    "hami.io/bind-phase": "success",
    "hami.io/bind-time": "1700000000",
}


def review(p: dict[str, Any], operation: str = "CREATE") -> dict[str, Any]:
    body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "u", "operation": operation, "namespace": "default", "object": p},
    }
    seen: list[tuple[str, ...]] = []
    answer = admission_response(
        body,
        lambda q, ns: review_pod(q, CFG, "hami-scheduler", lambda _ns: None, ns),
        lambda _p, k: seen.append(k),
    )
    response = answer["response"]
    response["_seen"] = seen
    return response


def patch_of(response: dict[str, Any]) -> list[dict[str, Any]]:
    return json.loads(base64.b64decode(response["patch"])) if response.get("patch") else []


@pytest.mark.parametrize("labels", [{}, {"hami.io/webhook": "ignore"}])
@pytest.mark.parametrize("scheduler", ["", "hami-scheduler", "other-scheduler"])
def test_scheduler_owned_annotations_are_removed_at_create(labels: dict[str, str], scheduler: str) -> None:
    p = pod("a", annotations={**OWNED, "team.io/keep": "yes"})
    p["metadata"]["labels"] = {**labels, "hami.io/vgpu-node": "n1"}
    if scheduler:
        p["spec"]["schedulerName"] = scheduler
    response = review(p)
    assert response["allowed"] is True
    removed = {op["path"] for op in patch_of(response) if op["op"] == "remove"}
    assert removed == {
        "/metadata/annotations/hami.io~1vgpu-node",
        "/metadata/annotations/hami.io~1vgpu-time",
        "/metadata/annotations/hami.io~1vgpu-devices-to-allocate",
        "/metadata/annotations/hami.io~1vgpu-devices-allocated",
        "/metadata/annotations/hami.io~1vgpu-mig-allocations",
        "/metadata/annotations/hami.io~1bind-phase",
        "/metadata/annotations/hami.io~1bind-time",
        "/metadata/labels/hami.io~1vgpu-node",
    }
    assert "scheduler-owned" in response["warnings"][0]
    assert len(response["_seen"]) == 1 and len(response["_seen"][0]) == 8


def test_updates_are_not_stripped_and_clean_pods_get_no_warning() -> None:
    response = review(pod("a", annotations=dict(OWNED)), operation="UPDATE")
    assert not [op for op in patch_of(response) if op["op"] == "remove"] and "warnings" not in response
    response = review(pod("b"))
    assert "warnings" not in response and response["_seen"] == []


@pytest.mark.parametrize("bypass", ["label", "scheduler"])
def test_a_gpu_pod_with_a_preset_node_is_denied_whoever_schedules_it(bypass: str) -> None:
    p = pod("a")
    p["spec"]["nodeName"] = "n1"
    if bypass == "label":
        p["metadata"]["labels"] = {"hami.io/webhook": "ignore"}
    else:
        p["spec"]["schedulerName"] = "other-scheduler"
    response = review(p)
    assert response["allowed"] is False and response["status"]["code"] == 403
    assert "spec.nodeName" in response["status"]["message"]
    cpu_only = pod("b", containers=[container("main")])
    cpu_only["spec"]["nodeName"] = "n1"
    cpu_only["spec"]["schedulerName"] = "other-scheduler"
    assert review(cpu_only)["allowed"] is True


def test_invalid_numa_alignment_is_denied_with_upstreams_wording() -> None:
    response = review(pod("a", annotations={"hami.io/numa-alignment": "bogus"}))
    assert response["allowed"] is False
    assert response["status"]["message"] == (
        'invalid hami.io/numa-alignment annotation "bogus": expected "best-effort" or "strict"'
    )
    for value in ("best-effort", "strict", " Strict "):
        assert review(pod("a", annotations={"hami.io/numa-alignment": value}))["allowed"] is True
    foreign = pod("a", annotations={"hami.io/numa-alignment": "bogus"})
    foreign["spec"]["schedulerName"] = "other-scheduler"
    assert review(foreign)["allowed"] is True  # upstream: pods of another scheduler are not judged


def _state() -> SchedulerState:
    state = SchedulerState(CFG, scheduler_name="hami-scheduler")
    state.on_node(node("n1"))
    return state


def _forged(p: dict[str, Any], raw: str, node_name: str = "n1") -> dict[str, Any]:
    p["metadata"]["annotations"].update(
        {"hami.io/vgpu-node": node_name, "hami.io/vgpu-devices-allocated": raw}
    )
    return p


@pytest.mark.parametrize(
    ("p", "raw", "why"),
    [
        (pod("cpu", containers=[container("main")]), "n1-gpu0,NVIDIA,1000,10:;", "requests no GPU"),
        (pod("huge"), "n1-gpu0,NVIDIA,2000000000,10:;", "the GPU has 8000 MiB"),
        (pod("ghost"), "GPU-not-here,NVIDIA,1000,10:;", "not registered"),
        (pod("two"), "n1-gpu0,NVIDIA,1000,10:n1-gpu1,NVIDIA,1000,10:;", "holds 2 GPUs but requests 1"),
        (pod("extra"), "n1-gpu0,NVIDIA,1000,10:;n1-gpu1,NVIDIA,1000,10:;", "2 container entries"),
    ],
)
def test_allocations_the_pod_cannot_have_are_not_booked(p: dict[str, Any], raw: str, why: str) -> None:
    state = _state()
    state.ledger.on_pod(_forged(p, raw))
    assert state.ledger.snapshot()["n1"] == {"n1-gpu0": (0, 0, 0), "n1-gpu1": (0, 0, 0)}
    assert state.ledger.quotas.used("default") == (0, 0)
    [(refused, message)] = state.ledger.refused
    assert refused is p and why in message
    state.ledger.on_pod(p)  # the same value again: no second report
    assert len(state.ledger.refused) == 1


def test_foreign_scheduler_and_other_node_are_not_booked() -> None:
    state = _state()
    foreign = _forged(pod("f"), "n1-gpu0,NVIDIA,1000,10:;")
    foreign["spec"]["schedulerName"] = "other-scheduler"
    elsewhere = _forged(pod("e"), "n1-gpu0,NVIDIA,1000,10:;")
    elsewhere["spec"]["nodeName"] = "n2"
    for p in (foreign, elsewhere):
        state.ledger.on_pod(p)
    assert state.ledger.snapshot()["n1"]["n1-gpu0"] == (0, 0, 0)
    assert [m for _p, m in state.ledger.refused] == [
        "the pod is scheduled by 'other-scheduler', which is not 'hami-scheduler'",
        "the pod runs on node n2, its hami.io/vgpu-node names n1",
    ]


def test_a_confirmed_allocation_is_booked_and_a_placed_foreign_pod_keeps_its_booking() -> None:
    state = _state()
    ok = _forged(pod("ok"), "n1-gpu0,NVIDIA,1000,10:;")
    ok["spec"]["schedulerName"] = "default-scheduler"
    state.ledger.on_pod(ok)
    assert state.ledger.snapshot()["n1"]["n1-gpu0"] == (1, 1000, 10)
    mine = pod("mine")
    mine["spec"]["schedulerName"] = "other-scheduler"
    raw = "n1-gpu1,NVIDIA,1000,10:;"
    state.ledger.reserve(mine, "n1", tuple(ann.decode_pod_devices(raw)), raw)  # this scheduler's own record
    state.ledger.on_pod(_forged(mine, raw))  # its patch seen: confirmed
    assert state.ledger.snapshot()["n1"]["n1-gpu1"] == (1, 1000, 10) and state.ledger.refused == []
    res = state.ledger.reservation("uid-mine")
    assert res is not None and not res.pending


@pytest.mark.parametrize("raw", [":::", "???", "n1-gpu0,NVIDIA,oops,10:;", "n1-gpu0,NVIDIA,1,10:;"])
def test_attack_1_a_changed_allocation_of_a_booked_pod_is_reported_and_ignored(raw: str) -> None:
    state = _state()
    p = _forged(pod("victim"), "n1-gpu1,NVIDIA,1000,10:;")
    state.ledger.on_pod(p)  # booked (unsigned mode: the first word of a pod without a booking)
    before = state.ledger.snapshot()
    tampered = copy.deepcopy(p)
    tampered["metadata"]["annotations"]["hami.io/vgpu-devices-allocated"] = raw
    state.ledger.on_pod(tampered)
    state.ledger.on_pod(tampered)  # reported once per value
    assert state.ledger.snapshot() == before
    [(reported, why)] = state.ledger.disagreed
    assert reported is tampered and "n1: n1-gpu1,NVIDIA,1000,10:; stays booked" in why
    assert state.ledger.refused == state.ledger.undecodable == state.ledger.foreign == []
    removed = copy.deepcopy(p)
    del removed["metadata"]["annotations"]["hami.io/vgpu-devices-allocated"]
    state.ledger.on_pod(removed)
    assert state.ledger.snapshot() == before and "were removed" in state.ledger.disagreed[-1][1]
    state.ledger.on_pod(p)  # the booked value again: agreed, nothing more reported
    assert len(state.ledger.disagreed) == 2
    done = copy.deepcopy(tampered)
    done["status"]["phase"] = "Succeeded"
    state.ledger.on_pod(done)  # a finished pod releases, whatever its annotations say
    assert state.ledger.snapshot()["n1"]["n1-gpu1"] == (0, 0, 0)


@pytest.mark.parametrize("raw", [":::", "???", "n1-gpu0,NVIDIA,x,10:;", ";;;;"])
def test_attack_2_an_unreadable_allocation_books_nothing(raw: str) -> None:
    state = _state()
    parked = _forged(pod("parked"), raw)  # a Pending pod of this scheduler, patched by its tenant
    state.ledger.on_pod(parked)
    assert state.ledger.snapshot()["n1"] == {"n1-gpu0": (0, 0, 0), "n1-gpu1": (0, 0, 0)}
    assert len(state.ledger.undecodable) + len(state.ledger.refused) == 1


SCHEDULER = "system:serviceaccount:kube-system:hami-scheduler"
PLUGIN = "system:serviceaccount:kube-system:hami-device-plugin"


def update(old: dict[str, Any], new: dict[str, Any], username: Any) -> dict[str, Any]:
    """The webhook's answer to an UPDATE by ``username`` (hamid's two writers allowed)."""
    body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u",
            "operation": "UPDATE",
            "namespace": "default",
            "userInfo": {"username": username},
            "oldObject": old,
            "object": new,
        },
    }

    def judge(o: Any, n: dict[str, Any], user: Any) -> Any:
        return review_update(o, n, user, {SCHEDULER, PLUGIN}, "hami-scheduler")

    answer = admission_response(
        body, lambda q, ns: review_pod(q, CFG, "hami-scheduler", lambda _ns: None, ns), None, judge
    )
    response: dict[str, Any] = answer["response"]
    return response


@pytest.mark.parametrize("key", sorted(OWNED))
@pytest.mark.parametrize("how", ["add", "modify", "remove"])
def test_only_hamid_changes_owned_annotations_after_creation(key: str, how: str) -> None:
    old = pod("a", annotations={} if how == "add" else {key: OWNED[key]})
    old["spec"]["schedulerName"] = "hami-scheduler"
    old["spec"]["nodeName"] = "n1"  # a bound pod: the CREATE rules would deny it, UPDATE has its own
    new = copy.deepcopy(old)
    if how == "remove":
        del new["metadata"]["annotations"][key]
    else:
        new["metadata"]["annotations"][key] = ":::"
    for tenant in ("system:serviceaccount:team-a:default", "system:anonymous", "", None, 7):
        denied = update(old, new, tenant)
        assert denied["allowed"] is False and denied["status"]["code"] == 403
        message = denied["status"]["message"]
        assert f"annotation {key} may be changed only by hamid's scheduler and device plugin" in message
    assert "not by system:anonymous" in update(old, new, "system:anonymous")["status"]["message"]
    assert update(old, new, SCHEDULER)["allowed"] is True and update(old, new, PLUGIN)["allowed"] is True


def test_update_rules_leave_everything_else_alone() -> None:
    old = pod("a", annotations={**OWNED, "team.io/owner": "alice"})
    old["spec"]["schedulerName"] = "hami-scheduler"
    tenant = "system:serviceaccount:team-a:default"
    mine = copy.deepcopy(old)
    mine["metadata"]["annotations"]["team.io/owner"] = "bob"
    mine["metadata"]["labels"] = {"team": "a"}
    assert update(old, mine, tenant)["allowed"] is True
    label = copy.deepcopy(old)
    label["metadata"]["labels"] = {"hami.io/vgpu-node": "n2"}
    assert "label hami.io/vgpu-node" in update(old, label, tenant)["status"]["message"]
    foreign = copy.deepcopy(old)
    foreign["spec"]["schedulerName"] = "volcano"  # another scheduler's pod: its own business
    changed = copy.deepcopy(foreign)
    changed["metadata"]["annotations"]["hami.io/vgpu-devices-allocated"] = ":::"
    assert update(foreign, changed, tenant)["allowed"] is True
    assert update("not a pod", mine, tenant)["status"]["code"] == 400  # type: ignore[arg-type]
