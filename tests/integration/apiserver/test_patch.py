"""Every PATCH type through kubernetes-asyncio, resourceVersion preconditions, and 415."""

from __future__ import annotations

import json

import aiohttp
import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from hamidsim.apiserver import ApiServer
from hamidsim.apiserver.patch import PatchError, json_patch, merge_patch, strategic_merge_patch
from tests.builders import pod

MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"


async def test_merge_patch_sets_and_removes(core: client.CoreV1Api) -> None:
    await core.create_namespaced_pod("default", pod("m", labels={"a": "1", "b": "2"}))
    patched = await core.patch_namespaced_pod(
        "m", "default", {"metadata": {"labels": {"a": None, "c": "3"}}}, _content_type=MERGE
    )
    assert patched.metadata.labels == {"b": "2", "c": "3"}
    replaced_list = await core.patch_namespaced_pod(
        "m", "default", {"spec": {"tolerations": [{"key": "k", "operator": "Exists"}]}}, _content_type=MERGE
    )
    assert [t.key for t in replaced_list.spec.tolerations] == ["k"]


async def test_merge_patch_resource_version_is_a_precondition(core: client.CoreV1Api) -> None:
    created = await core.create_namespaced_pod("default", pod("lock"))
    rv = created.metadata.resource_version
    first = await core.patch_namespaced_pod(
        "lock",
        "default",
        {"metadata": {"resourceVersion": rv, "annotations": {"lock": "me"}}},
        _content_type=MERGE,
    )
    assert first.metadata.annotations == {"lock": "me"}
    with pytest.raises(ApiException) as err:
        await core.patch_namespaced_pod(
            "lock",
            "default",
            {"metadata": {"resourceVersion": rv, "annotations": {"lock": "you"}}},
            _content_type=MERGE,
        )
    body = json.loads(err.value.body)
    assert (err.value.status, body["kind"], body["reason"], body["code"]) == (409, "Status", "Conflict", 409)
    assert (await core.read_namespaced_pod("lock", "default")).metadata.annotations == {"lock": "me"}


async def test_strategic_merge_patch_merges_keyed_lists(core: client.CoreV1Api) -> None:
    manifest = pod("sm")
    manifest["spec"]["containers"].append({"name": "side", "image": "envoy"})
    await core.create_namespaced_pod("default", manifest)
    patched = await core.patch_namespaced_pod(
        "sm", "default", {"spec": {"containers": [{"name": "side", "image": "envoy:2"}]}}
    )
    assert [(c.name, c.image) for c in patched.spec.containers] == [("main", "busybox"), ("side", "envoy:2")]
    conditions = {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    await core.patch_namespaced_pod_status("sm", "default", conditions)
    both = await core.patch_namespaced_pod_status(
        "sm", "default", {"status": {"conditions": [{"type": "PodScheduled", "status": "True"}]}}
    )
    assert sorted(c.type for c in both.status.conditions) == ["PodScheduled", "Ready"]


async def test_json_patch_operations(core: client.CoreV1Api) -> None:
    await core.create_namespaced_pod("default", pod("jp", labels={"a": "1"}))
    ops = [
        {"op": "test", "path": "/metadata/labels/a", "value": "1"},
        {"op": "add", "path": "/metadata/annotations", "value": {"x": "1"}},
        {"op": "replace", "path": "/metadata/labels/a", "value": "2"},
        {"op": "copy", "from": "/metadata/labels/a", "path": "/metadata/labels/b"},
        {"op": "move", "from": "/metadata/annotations/x", "path": "/metadata/annotations/y"},
        {"op": "add", "path": "/spec/containers/-", "value": {"name": "two", "image": "i"}},
        {"op": "remove", "path": "/spec/containers/0"},
    ]
    patched = await core.patch_namespaced_pod("jp", "default", ops)
    assert patched.metadata.labels == {"a": "2", "b": "2"}
    assert patched.metadata.annotations == {"y": "1"}
    assert [c.name for c in patched.spec.containers] == ["two"]

    with pytest.raises(ApiException) as failed_test:
        await core.patch_namespaced_pod(
            "jp", "default", [{"op": "test", "path": "/metadata/labels/a", "value": "9"}]
        )
    assert failed_test.value.status == 422
    with pytest.raises(ApiException) as malformed:
        await core.patch_namespaced_pod("jp", "default", [{"op": "jump", "path": "/x"}])
    assert malformed.value.status == 400
    stale_rv = [{"op": "replace", "path": "/metadata/resourceVersion", "value": "1"}]
    with pytest.raises(ApiException) as stale:
        await core.patch_namespaced_pod("jp", "default", stale_rv)
    assert stale.value.status == 409


async def test_unknown_patch_type_is_415(core: client.CoreV1Api, apiserver: ApiServer) -> None:
    await core.create_namespaced_pod("default", pod("u"))
    with pytest.raises(ApiException) as apply:
        await core.patch_namespaced_pod(
            "u", "default", {"metadata": {"labels": {"a": "b"}}}, _content_type="application/apply-patch+yaml"
        )
    assert apply.value.status == 415
    assert json.loads(apply.value.body)["reason"] == "UnsupportedMediaType"
    async with aiohttp.ClientSession() as session:
        url = f"{apiserver.url}/api/v1/namespaces/default/pods/u"
        async with session.patch(url, data=b"{}", headers={"Content-Type": "text/plain"}) as resp:
            assert resp.status == 415
        async with session.patch(url, data=b"{not json", headers={"Content-Type": MERGE}) as resp:
            assert resp.status == 400
            assert (await resp.json())["kind"] == "Status"
        async with session.patch(url, data=b"[1]", headers={"Content-Type": MERGE}) as resp:
            assert resp.status == 400


def test_patch_functions_do_not_mutate_inputs() -> None:
    target = {"a": {"b": 1, "c": [1, 2]}, "containers": [{"name": "x", "image": "1"}]}
    snapshot = json.dumps(target, sort_keys=True)
    assert merge_patch(target, {"a": {"b": None, "d": 2}}) == {
        "a": {"c": [1, 2], "d": 2},
        "containers": [{"name": "x", "image": "1"}],
    }
    sm = strategic_merge_patch(target, {"containers": [{"name": "x", "$patch": "delete"}, {"name": "y"}]})
    assert sm["containers"] == [{"name": "y"}]
    assert json_patch(target, [{"op": "remove", "path": "/a/c/1"}])["a"]["c"] == [1]
    assert json.dumps(target, sort_keys=True) == snapshot
    with pytest.raises(PatchError):
        json_patch(target, [{"op": "remove", "path": "/missing"}])
    with pytest.raises(PatchError):
        json_patch(target, [{"op": "move", "from": "/a", "path": "/a/b"}])
