"""What the embedded API server fills in on create, as a real one does."""

from __future__ import annotations

from typing import Any

import pytest

from hamidsim.apiserver import ApiServer
from hamidsim.apiserver.errors import ApiError
from tests.builders import pod


def _with_resources(name: str, **resources: dict[str, Any]) -> dict[str, Any]:
    body = pod(name)
    body["spec"]["containers"][0]["resources"] = resources
    return body


@pytest.mark.parametrize(
    ("resources", "qos"),
    [
        ({}, "BestEffort"),
        ({"limits": {"cpu": "2", "memory": "1Gi"}}, "Guaranteed"),
        ({"limits": {"cpu": "2", "memory": "1Gi"}, "requests": {"cpu": "1"}}, "Burstable"),
        ({"requests": {"memory": "1Gi"}}, "Burstable"),
        ({"limits": {"nvidia.com/gpu": 1}}, "BestEffort"),
    ],
)
def test_qos_class_in_status(apiserver: ApiServer, resources: dict[str, Any], qos: str) -> None:
    created = apiserver.create(_with_resources("p", **resources))
    assert created["status"] == {"phase": "Pending", "qosClass": qos}


def test_requests_from_limits_keep_the_text_sent(apiserver: ApiServer) -> None:
    created = apiserver.create(
        _with_resources(
            "p", limits={"cpu": "500m", "memory": "8Gi", "nvidia.com/gpu": 2}, requests={"cpu": "250m"}
        )
    )
    resources = created["spec"]["containers"][0]["resources"]
    assert resources["limits"] == {"cpu": "500m", "memory": "8Gi", "nvidia.com/gpu": "2"}
    assert resources["requests"] == {"cpu": "250m", "memory": "8Gi", "nvidia.com/gpu": "2"}


def test_pod_defaults_and_explicit_values_win(apiserver: ApiServer) -> None:
    body = pod("p")
    body["spec"].update(
        serviceAccountName="builder",
        restartPolicy="Never",
        tolerations=[{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"}],
    )
    body["spec"]["containers"][0]["image"] = "busybox:latest"
    created = apiserver.create(body)
    spec, container = created["spec"], created["spec"]["containers"][0]
    assert (spec["serviceAccountName"], spec["serviceAccount"], spec["restartPolicy"]) == (
        "builder",
        "builder",
        "Never",
    )
    assert spec["dnsPolicy"] == "ClusterFirst" and spec["terminationGracePeriodSeconds"] == 30
    assert spec["enableServiceLinks"] is True and spec["preemptionPolicy"] == "PreemptLowerPriority"
    assert [t["key"] for t in spec["tolerations"]] == [
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
    ]
    assert "tolerationSeconds" not in spec["tolerations"][0]
    assert spec["tolerations"][1]["tolerationSeconds"] == 300
    assert container["imagePullPolicy"] == "Always"
    assert (container["terminationMessagePath"], container["terminationMessagePolicy"]) == (
        "/dev/termination-log",
        "File",
    )


def test_numbers_become_text_on_updates_without_touching_old_versions(apiserver: ApiServer) -> None:
    before = apiserver.create(_with_resources("p", limits={"cpu": "1"}))
    patched = apiserver.patch(
        "Pod",
        "default",
        "p",
        {
            "spec": {
                "containers": [{"name": "main", "resources": {"limits": {"cpu": "1", "nvidia.com/gpu": 1}}}]
            }
        },
        "application/strategic-merge-patch+json",
    )
    assert patched["spec"]["containers"][0]["resources"]["limits"] == {"cpu": "1", "nvidia.com/gpu": "1"}
    assert before["spec"]["containers"][0]["resources"]["limits"] == {"cpu": "1"}


def test_a_bad_quantity_is_refused(apiserver: ApiServer) -> None:
    with pytest.raises(ApiError) as caught:
        apiserver.create(_with_resources("p", limits={"cpu": "lots"}))
    assert caught.value.code == 422
    assert "not a Kubernetes quantity" in str(caught.value)
    assert apiserver.get("Pod", "default", "p") is None
