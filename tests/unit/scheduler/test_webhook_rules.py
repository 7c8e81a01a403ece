"""Webhook rules (docs/hami-wire.md §1.3, §3.9) and AdmissionReview v1/v1beta1 answers."""

from __future__ import annotations

import base64
import json

import pytest

from hamid.fit.fit import Quota
from hamid.model import annotations as ann
from hamid.model.errors import InvalidInput
from hamid.model.resources import ResourceConfig
from hamid.scheduler.webhook import admission_response, review_pod
from tests.unit.scheduler.helpers import container, pod

CFG = ResourceConfig()


def review(p: dict, quota: Quota | None = None, config: ResourceConfig = CFG):
    return review_pod(p, config, "hami-scheduler", lambda _ns: quota)


def ops_by_path(verdict) -> dict:
    return {op["path"]: op for op in verdict.patch}


@pytest.mark.parametrize(
    ("limits", "cores"),
    [
        ({"nvidia.com/gpu": "1"}, "100"),
        ({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "100"}, "100"),
        ({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50"}, None),
        ({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8192"}, None),
        ({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "70"}, "70"),
    ],
)
def test_exclusive_default_cores(limits: dict, cores: str | None) -> None:
    p = pod("a", containers=[{"name": "c", "resources": {"limits": dict(limits)}}])
    verdict = review(p)
    assert verdict.allowed
    ops = ops_by_path(verdict)
    assert ops["/spec/schedulerName"]["value"] == "hami-scheduler"
    new = ops.get("/spec/containers/0", {"value": p["spec"]["containers"][0]})["value"]
    assert new["resources"]["limits"].get("nvidia.com/gpucores") == cores
    assert p["spec"]["containers"][0]["resources"]["limits"] == limits  # original untouched


def test_default_gpu_num_injected() -> None:
    p = pod("a", containers=[{"name": "c", "resources": {"limits": {"nvidia.com/gpumem": "1000"}}}])
    new = ops_by_path(review(p))["/spec/containers/0"]["value"]
    assert new["resources"]["limits"]["nvidia.com/gpu"] == "1"


def test_skips() -> None:
    plain = pod("a", containers=[container("c")])
    assert review(plain).patch == ()
    other = pod("a")
    other["spec"]["schedulerName"] = "volcano"
    assert review(other).patch == ()
    ignored = pod("a")
    ignored["metadata"]["labels"] = {ann.WEBHOOK: ann.WEBHOOK_IGNORE}
    assert review(ignored).patch == ()


def test_denials() -> None:
    priv = pod("a", containers=[container("c", 1, 1000, 10, securityContext={"privileged": True})])
    verdict = review(priv)
    assert not verdict.allowed and verdict.message == "container c is privileged"
    assigned = pod("a")
    assigned["spec"]["nodeName"] = "n1"
    assert review(assigned).message == "pod has node assigned"
    empty = pod("a")
    empty["spec"]["containers"] = []
    assert review(empty).message == "pod has no containers"
    bad_pct = pod(
        "a",
        containers=[
            {
                "name": "c",
                "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "150"}},
            }
        ],
    )
    assert "within [0, 100]" in review(bad_pct).message
    # HAMi keeps any integer core count (int32-wrapped: 2^32 + 50 is 50; -1 is booked as -1)
    for cores in ("-1", str(2**32 + 50)):
        wrapped = pod("a", containers=[container("c", 1, 1000, 10)])
        wrapped["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpucores"] = cores
        assert "nvidia.com/gpucores must be within [0, 2147483647]" in review(wrapped).message


def test_fractions_are_read_rounded_up_as_hamis_webhook_reads_them() -> None:
    """``Quantity.Value`` rounds up: a percentage of 99.5 is 100 (the whole card: 100 cores) and a
    priority of 1.5 is 2; both pods are admitted."""
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "99.5", "nvidia.com/priority": "1.5"}
    p = pod("a", containers=[{"name": "c", "resources": {"limits": dict(limits)}}])
    verdict = review(p)
    assert verdict.allowed, verdict.message
    new = ops_by_path(verdict)["/spec/containers/0"]["value"]
    assert new["resources"]["limits"]["nvidia.com/gpucores"] == "100"
    assert {e["name"]: e["value"] for e in new["env"]} == {"CUDA_TASK_PRIORITY": "2"}


def test_quota_precheck_uses_init_peak() -> None:
    p = pod("a", init=[container("i", 1, 5000, 10)], containers=[container("c", 2, 1000, 10)])
    assert review(p, Quota(mem_limit=5000, used_mem=0)).allowed
    denied = review(p, Quota(mem_limit=5000, used_mem=1))
    assert not denied.allowed and denied.message == "exceeding resource quota"


def test_env_rules() -> None:
    config = ResourceConfig(gpu_core_policy="force", overwrite_env=True)
    p = pod("a", containers=[container("gpu", 1, 1000, 10), container("cpu")])
    p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/priority"] = "1"
    ops = ops_by_path(review(p, config=config))
    gpu_env = {e["name"]: e["value"] for e in ops["/spec/containers/0"]["value"]["env"]}
    cpu_env = {e["name"]: e["value"] for e in ops["/spec/containers/1"]["value"]["env"]}
    assert gpu_env == {"CUDA_TASK_PRIORITY": "1", "GPU_CORE_UTILIZATION_POLICY": "force"}
    assert cpu_env["NVIDIA_VISIBLE_DEVICES"] == "none"
    # ``env: null`` is an absent env to Kubernetes: the rules add to a new one (it raised, a 500)
    for c in p["spec"]["containers"]:
        c["env"] = None
    ops = ops_by_path(review(p, config=config))
    assert {e["name"] for e in ops["/spec/containers/0"]["value"]["env"]} == set(gpu_env)
    assert {e["name"] for e in ops["/spec/containers/1"]["value"]["env"]} == set(cpu_env)


@pytest.mark.parametrize("version", ["admission.k8s.io/v1", "admission.k8s.io/v1beta1"])
def test_admission_review_versions(version: str) -> None:
    body = {"apiVersion": version, "kind": "AdmissionReview", "request": {"uid": "u-1", "object": pod("a")}}
    answer = admission_response(body, lambda p, ns: review(p))
    assert answer["apiVersion"] == version and answer["kind"] == "AdmissionReview"
    response = answer["response"]
    assert response["uid"] == "u-1" and response["allowed"] and response["patchType"] == "JSONPatch"
    patch = json.loads(base64.b64decode(response["patch"]))
    assert {"op": "add", "path": "/spec/schedulerName", "value": "hami-scheduler"} in patch
    with pytest.raises(InvalidInput):
        admission_response({"apiVersion": "v2", "request": {"uid": "x"}}, lambda p, ns: review(p))
    with pytest.raises(InvalidInput):
        admission_response({"apiVersion": version, "request": {}}, lambda p, ns: review(p))


#: (--force-overwrite-default-scheduler, pod's schedulerName, pod kind) -> its schedulerName after
#: the webhook. Kinds: "gpu" asks for nvidia.com/gpu; "cpu" none; "cpu+" none, with
#: --schedule-cpu-pods. HAMi's table (webhook.go Handle, webhook_test.go), plus the CPU-pod rule.
SCHEDULER_NAME_TABLE = [
    (True, "", "gpu", "hami-scheduler"),
    (True, "", "cpu", ""),
    (True, "", "cpu+", "hami-scheduler"),
    (True, "default-scheduler", "gpu", "hami-scheduler"),
    (True, "default-scheduler", "cpu", "default-scheduler"),
    (True, "default-scheduler", "cpu+", "hami-scheduler"),
    (True, "hami-scheduler", "gpu", "hami-scheduler"),
    (True, "hami-scheduler", "cpu", "hami-scheduler"),
    (True, "hami-scheduler", "cpu+", "hami-scheduler"),
    (True, "volcano", "gpu", "volcano"),
    (True, "volcano", "cpu", "volcano"),
    (True, "volcano", "cpu+", "volcano"),
    (False, "", "gpu", "hami-scheduler"),
    (False, "", "cpu", ""),
    (False, "", "cpu+", "hami-scheduler"),
    (False, "default-scheduler", "gpu", "default-scheduler"),
    (False, "default-scheduler", "cpu", "default-scheduler"),
    (False, "default-scheduler", "cpu+", "default-scheduler"),
    (False, "hami-scheduler", "gpu", "hami-scheduler"),
    (False, "hami-scheduler", "cpu", "hami-scheduler"),
    (False, "hami-scheduler", "cpu+", "hami-scheduler"),
    (False, "volcano", "gpu", "volcano"),
    (False, "volcano", "cpu", "volcano"),
    (False, "volcano", "cpu+", "volcano"),
]


@pytest.mark.parametrize(("force", "current", "kind", "after"), SCHEDULER_NAME_TABLE)
def test_scheduler_name_table(force: bool, current: str, kind: str, after: str) -> None:
    # a GPU pod asking memory only: a pod the rules handle gets the GPU count injected
    limits = {"nvidia.com/gpumem": "1000"} if kind == "gpu" else {"cpu": "1"}
    p = pod("a", containers=[{"name": "c", "resources": {"limits": limits}}])
    if current:
        p["spec"]["schedulerName"] = current
    verdict = review_pod(
        p, CFG, "hami-scheduler", lambda _ns: None, cpu_pods=kind == "cpu+", take_default=force
    )
    assert verdict.allowed
    ops = ops_by_path(verdict)
    assert ops.get("/spec/schedulerName", {"value": current})["value"] == after
    handled = not current or current == "hami-scheduler" or (force and current == "default-scheduler")
    if not handled:  # left alone: no rule applied at all (HAMi: "different scheduler assigned")
        assert verdict.patch == ()
    elif kind == "gpu":
        assert ops["/spec/containers/0"]["value"]["resources"]["limits"]["nvidia.com/gpu"] == "1"


@pytest.mark.parametrize("force", [True, False])
def test_a_gpu_pod_on_a_preset_node_is_denied_whoever_schedules_it(force: bool) -> None:
    p = pod("a")
    p["spec"]["schedulerName"] = "default-scheduler"
    p["spec"]["nodeName"] = "n1"
    verdict = review_pod(p, CFG, "hami-scheduler", lambda _ns: None, take_default=force)
    # handed over: HAMi's "pod has node assigned"; left alone: hamid's own rule (docs/trust.md)
    assert not verdict.allowed and verdict.code == 403
