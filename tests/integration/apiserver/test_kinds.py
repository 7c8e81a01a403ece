"""pods/binding, events in both APIs, leases, resource quotas and TokenReview."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from hamid.kube.tokens import POD_NAME_EXTRA, POD_UID_EXTRA
from hamidsim.apiserver import ApiServer
from tests.builders import pod, quota


def binding(name: str, node: str, **annotations: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": name, "annotations": annotations},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }


async def test_binding_sets_node_and_conflicts_when_bound(core: client.CoreV1Api) -> None:
    await core.create_namespaced_pod("default", pod("b"))
    resp = await core.create_namespaced_pod_binding(
        "b", "default", binding("b", "n1", **{"example.com/bound": "yes"}), _preload_content=False
    )
    assert resp.status == 201
    status = json.loads(await resp.read())
    assert (status["kind"], status["status"]) == ("Status", "Success")
    bound = await core.read_namespaced_pod("b", "default")
    assert bound.spec.node_name == "n1"
    assert bound.metadata.annotations == {"example.com/bound": "yes"}
    assert [(c.type, c.status) for c in bound.status.conditions] == [("PodScheduled", "True")]

    with pytest.raises(ApiException) as err:
        await core.create_namespaced_pod_binding("b", "default", binding("b", "n2"), _preload_content=True)
    body = json.loads(err.value.body)
    assert (err.value.status, body["reason"]) == (409, "Conflict")
    assert "already assigned" in body["message"]
    assert (await core.read_namespaced_pod("b", "default")).spec.node_name == "n1"


async def test_bindings_collection_and_missing_pod(core: client.CoreV1Api) -> None:
    await core.create_namespaced_pod("default", pod("c"))
    resp = await core.create_namespaced_binding("default", binding("c", "n3"), _preload_content=False)
    assert resp.status == 201
    assert (await core.read_namespaced_pod("c", "default")).spec.node_name == "n3"
    with pytest.raises(ApiException) as err:
        await core.create_namespaced_pod_binding("ghost", "default", binding("ghost", "n1"))
    assert err.value.status == 404
    with pytest.raises(ApiException) as err:
        await core.create_namespaced_pod_binding("c", "default", {"metadata": {"name": "c"}, "target": {}})
    assert err.value.status == 422


async def test_events_in_both_apis(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    events = client.EventsV1Api(api)
    now = datetime.now(UTC).replace(microsecond=0)
    core_event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": "p.1", "namespace": "default"},
        "involvedObject": {"kind": "Pod", "name": "p", "namespace": "default", "uid": "u1"},
        "reason": "FilteringFailed",
        "message": "no node fits",
        "type": "Warning",
        "count": 1,
        "source": {"component": "hamid-scheduler"},
        "firstTimestamp": now.isoformat(),
        "lastTimestamp": now.isoformat(),
    }
    created = await core.create_namespaced_event("default", core_event)
    assert created.count == 1
    aggregated = await core.patch_namespaced_event("p.1", "default", {"count": 2})
    assert aggregated.count == 2

    # A core event has no eventTime, which the generated EventsV1Event model refuses (as with a real
    # server), so read it raw.
    resp = await events.read_namespaced_event("p.1", "default", _preload_content=False)
    seen = json.loads(await resp.read())
    assert seen["apiVersion"] == "events.k8s.io/v1"
    assert seen["regarding"]["name"] == "p"
    assert seen["note"] == "no node fits"
    assert seen["deprecatedCount"] == 2
    assert seen["deprecatedSource"] == {"component": "hamid-scheduler"}

    new_style = {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": "p.2", "namespace": "default"},
        "eventTime": now.strftime("%Y-%m-%dT%H:%M:%S.000000Z"),
        "reportingController": "hamid/scheduler",
        "reportingInstance": "replica-1",
        "action": "Binding",
        "reason": "BindingSucceeded",
        "regarding": {"kind": "Pod", "name": "p", "namespace": "default"},
        "note": "bound",
        "type": "Normal",
    }
    await events.create_namespaced_event("default", new_style)
    as_core = await core.read_namespaced_event("p.2", "default")
    assert (as_core.message, as_core.reporting_component, as_core.involved_object.name) == (
        "bound",
        "hamid/scheduler",
        "p",
    )
    listed = await core.list_namespaced_event(
        "default", field_selector="involvedObject.name=p,reason=BindingSucceeded"
    )
    assert [e.metadata.name for e in listed.items] == ["p.2"]
    listed_v1 = await events.list_namespaced_event(
        "default", field_selector="regarding.name=p", _preload_content=False
    )
    assert sorted(e["metadata"]["name"] for e in json.loads(await listed_v1.read())["items"]) == [
        "p.1",
        "p.2",
    ]
    only_new = await events.list_namespaced_event(
        "default", field_selector="reportingController=hamid/scheduler"
    )
    assert [e.note for e in only_new.items] == ["bound"]

    with pytest.raises(ApiException) as err:
        await events.create_namespaced_event(
            "default",
            {**new_style, "metadata": {"name": "p.3", "namespace": "default"}, "reportingController": ""},
        )
    assert err.value.status == 422


async def test_leases(api: client.ApiClient) -> None:
    leases = client.CoordinationV1Api(api)
    lease = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "hamid-scheduler", "namespace": "kube-system"},
        "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15},
    }
    created = await leases.create_namespaced_lease("kube-system", lease)
    stale = client.ApiClient().sanitize_for_serialization(created)
    body = client.ApiClient().sanitize_for_serialization(created)
    body["spec"]["holderIdentity"] = "b"
    taken = await leases.replace_namespaced_lease("hamid-scheduler", "kube-system", body)
    assert taken.spec.holder_identity == "b"
    stale["spec"]["holderIdentity"] = "c"
    with pytest.raises(ApiException) as err:
        await leases.replace_namespaced_lease("hamid-scheduler", "kube-system", stale)
    assert err.value.status == 409
    with pytest.raises(ApiException) as err:
        await leases.create_namespaced_lease("kube-system", lease)
    assert err.value.status == 409
    listed = await leases.list_namespaced_lease("kube-system")
    assert [item.spec.holder_identity for item in listed.items] == ["b"]


async def test_resource_quotas(core: client.CoreV1Api) -> None:
    await core.create_namespaced_resource_quota(
        "team", quota("gpu", "team", {"limits.nvidia.com/gpumem": "8000"})
    )
    listed = await core.list_resource_quota_for_all_namespaces()
    assert [q.spec.hard for q in listed.items] == [{"limits.nvidia.com/gpumem": "8000"}]
    updated = await core.patch_namespaced_resource_quota_status(
        "gpu", "team", {"status": {"used": {"limits.nvidia.com/gpumem": "1000"}}}
    )
    assert updated.status.used == {"limits.nvidia.com/gpumem": "1000"}


async def test_token_reviews(api: client.ApiClient, apiserver: ApiServer) -> None:
    auth = client.AuthenticationV1Api(api)
    apiserver.register_pod_token(
        "tok-1",
        namespace="kube-system",
        pod_name="hamid-plugin-x",
        pod_uid="uid-1",
        service_account="hamid-plugin",
    )
    apiserver.register_token("tok-aud", "alice", audiences=["hamid"])

    review = await auth.create_token_review(
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": "tok-1"}}
    )
    assert review.status.authenticated is True
    assert review.status.user.username == "system:serviceaccount:kube-system:hamid-plugin"
    assert "system:serviceaccounts:kube-system" in review.status.user.groups
    assert review.status.user.extra[POD_NAME_EXTRA] == ["hamid-plugin-x"]
    assert review.status.user.extra[POD_UID_EXTRA] == ["uid-1"]

    unknown = await auth.create_token_review({"spec": {"token": "nope"}})
    assert not unknown.status.authenticated

    good_aud = await auth.create_token_review({"spec": {"token": "tok-aud", "audiences": ["hamid", "x"]}})
    assert good_aud.status.authenticated is True
    assert good_aud.status.audiences == ["hamid"]
    wrong_aud = await auth.create_token_review({"spec": {"token": "tok-aud", "audiences": ["other"]}})
    assert not wrong_aud.status.authenticated

    apiserver.revoke_token("tok-1")
    revoked = await auth.create_token_review({"spec": {"token": "tok-1"}})
    assert not revoked.status.authenticated
