"""The scheduler's pod cache keeps only what it reads, and decides the same on trimmed pods."""

from __future__ import annotations

import copy
import json
from typing import Any

from hamid.fit.fit import PodFitSpec
from hamid.fit.usage import container_kinds, init_containers_succeeded
from hamid.model import annotations as ann
from hamid.model.booked import booked_condition
from hamid.model.nodelock import holder_state
from hamid.model.resources import ResourceConfig, all_containers
from hamid.scheduler.podtrim import trim_scheduler_pod
from hamid.scheduler.state import SchedulerState
from tests.unit.scheduler.helpers import container, node, placed, pod, signed, ticking_keys

LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def realistic(p: dict[str, Any]) -> dict[str, Any]:
    """``p`` dressed as the API server serves it: env, volumes, probes, managedFields, statuses."""
    p = copy.deepcopy(p)
    meta = p["metadata"]
    meta.update(
        resourceVersion="42",
        generateName="web-",
        creationTimestamp="2024-01-01T00:00:00Z",
        labels={"app": "web", ann.VGPU_NODE: "n1"},
        ownerReferences=[{"kind": "ReplicaSet", "name": "web-1", "uid": "rs", "controller": True}],
        managedFields=[{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}],
    )
    meta["annotations"][LAST_APPLIED] = json.dumps(p["spec"])
    meta["annotations"][ann.GPU_SCHEDULER_POLICY] = "binpack"
    for c in all_containers(p):
        c.update(
            image="registry/app:1",
            env=[{"name": f"V{i}", "value": "x" * 40} for i in range(10)],
            volumeMounts=[{"name": "data", "mountPath": "/data"}],
            securityContext={"privileged": False},
            livenessProbe={"httpGet": {"path": "/", "port": 80}},
        )
    p["spec"].update(
        nodeName="n1",
        schedulerName="hami-scheduler",
        volumes=[{"name": "data", "emptyDir": {}}],
        tolerations=[{"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"}],
    )
    p["status"].update(
        conditions=[{"type": "Ready", "status": "True"}],
        podIP="10.0.0.1",
        containerStatuses=[{"name": "main", "image": "registry/app:1", "state": {"running": {}}}],
    )
    return p


def _fleet() -> list[dict[str, Any]]:
    done = {"state": {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": "t"}}}
    pods = []
    for i in range(12):
        init = [container("init", 1, 700, 5)] if i % 3 == 0 else None
        p = pod(f"p{i}", init=init, containers=[container("main", 1, 1000 + i, 10)])
        alloc = ("n1-gpu0,NVIDIA,700,5:;" if init else "") + f"n1-gpu{i % 2},NVIDIA,{1000 + i},10:;"
        placed(p, "n1", alloc)
        if i % 6 == 0:
            p["status"]["initContainerStatuses"] = [{"name": "init", "image": "x", **done}]
        if i % 4 == 1:
            p["status"]["phase"] = "Running"
        pods.append(realistic(p))
    return pods


def test_trim_keeps_what_the_scheduler_reads() -> None:
    full = _fleet()[0]
    trimmed = trim_scheduler_pod(full)
    assert full["metadata"]["annotations"][LAST_APPLIED]  # the input is left alone
    meta = trimmed["metadata"]
    assert set(meta) == {"name", "namespace", "uid", "resourceVersion", "labels", "annotations"}
    assert LAST_APPLIED not in meta["annotations"]
    assert (
        meta["annotations"][ann.DEVICES_ALLOCATED] == full["metadata"]["annotations"][ann.DEVICES_ALLOCATED]
    )
    assert meta["annotations"][ann.GPU_SCHEDULER_POLICY] == "binpack"
    assert set(trimmed["spec"]) == {"nodeName", "schedulerName", "initContainers", "containers"}
    assert trimmed["spec"]["containers"][0] == {
        "name": "main",
        "resources": full["spec"]["containers"][0]["resources"],
    }
    assert trimmed["status"] == {
        "phase": "Pending",
        "initContainerStatuses": [{"name": "init", "state": {"terminated": {"exitCode": 0}}}],
    }
    assert len(json.dumps(trimmed)) * 3 < len(json.dumps(full))


def test_decisions_on_trimmed_pods_equal_those_on_full_pods() -> None:
    config = ResourceConfig()
    states = {}
    for label, view in (("full", lambda p: p), ("trimmed", trim_scheduler_pod)):
        state = SchedulerState(config)
        state.on_node(node("n1"))
        for p in _fleet():
            state.ledger.on_pod(view(p))
        states[label] = state
    assert states["full"].ledger.snapshot() == states["trimmed"].ledger.snapshot()
    assert states["full"].ledger.quotas.used("default") == states["trimmed"].ledger.quotas.used("default")
    assert any(u != (0, 0, 0) for u in states["full"].ledger.snapshot()["n1"].values())
    released = 0
    for full in _fleet():
        trimmed = trim_scheduler_pod(full)
        assert PodFitSpec.from_pod(trimmed, config, "spread", "binpack") == PodFitSpec.from_pod(
            full, config, "spread", "binpack"
        )
        assert container_kinds(trimmed) == container_kinds(full)
        assert init_containers_succeeded(trimmed) == init_containers_succeeded(full)
        released += init_containers_succeeded(full)
        assert holder_state(trimmed, "n1") == holder_state(full, "n1")
        assert [c["name"] for c in all_containers(trimmed)] == [c["name"] for c in all_containers(full)]
    assert released == 2


def test_trim_passes_malformed_parts_through_for_the_reader_to_reject() -> None:
    bad = {"metadata": {"name": "x", "annotations": None}, "spec": {"containers": "nope"}, "status": {}}
    trimmed = trim_scheduler_pod(bad)
    assert trimmed["spec"]["containers"] == "nope"
    assert "annotations" not in trimmed["metadata"]


def test_replicas_share_their_container_parts_and_strings() -> None:
    """Pods of one workload hold one copy of what they repeat; differing values stay apart."""
    a, b = (
        trim_scheduler_pod(
            json.loads(json.dumps(realistic(pod(name, containers=[container("c", 1, 1000, 10)]))))
        )
        for name in ("a", "b")
    )
    assert a["spec"]["containers"] is b["spec"]["containers"]
    assert a["metadata"]["namespace"] is b["metadata"]["namespace"]
    assert a["metadata"]["labels"] == b["metadata"]["labels"]
    keys_a, keys_b = list(a["metadata"]["annotations"]), list(b["metadata"]["annotations"])
    assert all(x is y for x, y in zip(keys_a, keys_b, strict=True))
    other = trim_scheduler_pod(realistic(pod("c", containers=[container("c", 1, 2000, 10)])))
    assert other["spec"]["containers"] != a["spec"]["containers"]
    # equal JSON of different types is never one part: 1 is not true
    one, true = (
        {"metadata": {"uid": u}, "spec": {"containers": [{"name": "x", "restartPolicy": v}]}}
        for u, v in (("1", 1), ("2", True))
    )
    assert trim_scheduler_pod(one)["spec"]["containers"][0]["restartPolicy"] is not True
    assert trim_scheduler_pod(true)["spec"]["containers"][0]["restartPolicy"] is True


def test_the_kept_annotations_are_every_annotation_key_hamid_defines() -> None:
    """A key added to hamid/model without its place in ``HAMID_ANNOTATION_KEYS`` would be trimmed away."""
    not_annotations = {
        ann.SCHEDULER_ROLE,
        ann.WEBHOOK,
        ann.ALLOCATION_BOOKED_CONDITION,
    }  # labels, a condition
    defined = {
        value
        for name, value in vars(ann).items()
        if name.isupper() and isinstance(value, str) and "/" in value and value not in not_annotations
    }
    assert len(ann.HAMID_ANNOTATION_KEYS) == len(set(ann.HAMID_ANNOTATION_KEYS))
    assert set(ann.HAMID_ANNOTATION_KEYS) == defined
    p = pod("p", annotations=dict.fromkeys(defined, "x") | {LAST_APPLIED: "{}"})
    assert set(trim_scheduler_pod(p)["metadata"]["annotations"]) == defined


def test_the_booked_record_is_the_one_condition_kept() -> None:
    """A restart books the record when a tenant rewrote the annotations: trimmed pods must carry it."""
    keys = ticking_keys()
    raw = "n1-gpu0,NVIDIA,1000,10:;"
    full = realistic(signed(placed(pod("a", containers=[container("main", 1, 1000, 10)]), "n1", raw), keys))
    record = booked_condition("n1", raw, keys.sign(full["metadata"]["uid"], "n1", raw), 1.0)
    full["status"]["conditions"] = [{"type": "Ready", "status": "True"}, record]
    full["metadata"]["annotations"][ann.DEVICES_ALLOCATED] = "n1-gpu1,NVIDIA,1,10:;"  # tampered
    trimmed = trim_scheduler_pod(full)
    assert trimmed["status"]["conditions"] == [record]
    snapshots = []
    for view in (full, trimmed):
        state = SchedulerState(keys=keys)
        state.on_node(node("n1"))
        state.ledger.on_pod(view)
        snapshots.append(state.ledger.snapshot())
    assert snapshots[0] == snapshots[1] and snapshots[0]["n1"]["n1-gpu0"] == (1, 1000, 10)
