"""CRUD through kubernetes-asyncio's CoreV1Api: metadata, status subresources, errors as Status."""

from __future__ import annotations

import json

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from hamid.kube.client import PODS, KubeClient
from hamid.kube.errors import Conflict
from hamidsim.apiserver import ApiServer
from hamidsim.apiserver.errors import ApiError
from tests.builders import pod


def status_of(err: ApiException) -> dict:
    body = json.loads(err.body)
    assert body["kind"] == "Status"
    assert body["code"] == err.status
    return body


async def test_create_get_list_replace_delete(core: client.CoreV1Api, apiserver: ApiServer) -> None:
    created = await core.create_namespaced_pod("default", pod("a", labels={"app": "x"}))
    assert created.metadata.uid
    assert created.metadata.creation_timestamp is not None
    assert created.metadata.generation == 1
    assert created.status.phase == "Pending"
    assert created.spec.scheduler_name == "default-scheduler"
    rv = int(created.metadata.resource_version)

    got = await core.read_namespaced_pod("a", "default")
    assert got.metadata.uid == created.metadata.uid

    body = got.to_dict()
    replaced_body = client.ApiClient().sanitize_for_serialization(got)
    replaced_body["metadata"]["labels"] = {"app": "y"}
    replaced = await core.replace_namespaced_pod("a", "default", replaced_body)
    assert replaced.metadata.labels == {"app": "y"}
    assert int(replaced.metadata.resource_version) > rv
    assert replaced.metadata.generation == 1, "a metadata-only change keeps the generation"
    assert body["metadata"]["uid"] == replaced.metadata.uid

    spec_change = client.ApiClient().sanitize_for_serialization(replaced)
    spec_change["spec"]["activeDeadlineSeconds"] = 30
    bumped = await core.replace_namespaced_pod("a", "default", spec_change)
    assert bumped.metadata.generation == 2

    listed = await core.list_namespaced_pod("default")
    assert [p.metadata.name for p in listed.items] == ["a"]
    assert int(listed.metadata.resource_version) == apiserver.resource_version

    deleted = await core.delete_namespaced_pod("a", "default")
    assert deleted.metadata.name == "a"
    assert (await core.list_namespaced_pod("default")).items == []
    assert apiserver.get("Pod", "default", "a") is None


async def test_unchanged_replace_is_not_a_write(core: client.CoreV1Api, apiserver: ApiServer) -> None:
    created = await core.create_namespaced_pod("default", pod("same"))
    before = apiserver.resource_version
    again = await core.replace_namespaced_pod(
        "same", "default", client.ApiClient().sanitize_for_serialization(created)
    )
    assert again.metadata.resource_version == created.metadata.resource_version
    assert apiserver.resource_version == before


async def test_errors_are_status_bodies(core: client.CoreV1Api) -> None:
    with pytest.raises(ApiException) as missing:
        await core.read_namespaced_pod("nope", "default")
    body = status_of(missing.value)
    assert (missing.value.status, body["reason"]) == (404, "NotFound")
    assert body["details"] == {"name": "nope", "kind": "pods"}

    await core.create_namespaced_pod("default", pod("dup"))
    with pytest.raises(ApiException) as dup:
        await core.create_namespaced_pod("default", pod("dup"))
    assert (dup.value.status, status_of(dup.value)["reason"]) == (409, "AlreadyExists")

    with pytest.raises(ApiException) as bad_name:
        await core.create_namespaced_pod("default", pod("Not_A_Name"))
    assert (bad_name.value.status, status_of(bad_name.value)["reason"]) == (422, "Invalid")

    with pytest.raises(ApiException) as wrong_ns:
        await core.create_namespaced_pod("other", pod("x", namespace="default"))
    assert wrong_ns.value.status == 400


async def test_stale_put_conflicts(core: client.CoreV1Api) -> None:
    created = await core.create_namespaced_pod("default", pod("c"))
    stale = client.ApiClient().sanitize_for_serialization(created)
    await core.patch_namespaced_pod("c", "default", {"metadata": {"labels": {"v": "1"}}})
    stale["metadata"]["labels"] = {"v": "2"}
    with pytest.raises(ApiException) as err:
        await core.replace_namespaced_pod("c", "default", stale)
    body = status_of(err.value)
    assert (err.value.status, body["reason"]) == (409, "Conflict")
    assert "the object has been modified" in body["message"]
    assert (await core.read_namespaced_pod("c", "default")).metadata.labels == {"v": "1"}

    stale["metadata"].pop("resourceVersion")
    unconditional = await core.replace_namespaced_pod("c", "default", stale)
    assert unconditional.metadata.labels == {"v": "2"}


async def test_status_subresources(core: client.CoreV1Api) -> None:
    await core.create_namespaced_pod("default", pod("s"))
    ignored = await core.patch_namespaced_pod("s", "default", {"status": {"phase": "Running"}})
    assert ignored.status.phase == "Pending", "the main path ignores status, like the real server"
    running = await core.patch_namespaced_pod_status("s", "default", {"status": {"phase": "Running"}})
    assert running.status.phase == "Running"
    assert running.metadata.generation == 1
    spec_ignored = await core.patch_namespaced_pod_status("s", "default", {"spec": {"nodeName": "n"}})
    assert spec_ignored.spec.node_name is None
    assert (await core.read_namespaced_pod_status("s", "default")).status.phase == "Running"

    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "n1"},
        "status": {"capacity": {"cpu": "4"}},
    }
    created = await core.create_node(node)
    assert created.status.capacity == {"cpu": "4"}
    updated = await core.patch_node_status("n1", {"status": {"allocatable": {"cpu": "3"}}})
    assert updated.status.allocatable == {"cpu": "3"}
    assert updated.status.capacity == {"cpu": "4"}
    assert [n.metadata.name for n in (await core.list_node()).items] == ["n1"]
    await core.delete_node("n1")
    with pytest.raises(ApiException) as err:
        await core.read_node("n1")
    assert err.value.status == 404


async def test_conditions_change_only_through_status_and_merge_by_type(kube: KubeClient) -> None:
    """As the real server: the main path's PATCH and PUT keep the stored status (a tenant who may
    update its pod cannot touch its conditions), ``/status`` with a strategic patch merges
    conditions by type, and a UID in the patch is a precondition."""
    uid = (await kube.create_pod(pod("c")))["metadata"]["uid"]
    record = {
        "type": "hamid.io/AllocationBooked",
        "status": "True",
        "reason": "SignedAllocation",
        "message": "m",
    }
    await kube.patch_pod_status("default", "c", {"conditions": [record]}, strategic=True, uid=uid)
    unschedulable = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/1"}
    both = await kube.patch_pod_status("default", "c", {"conditions": [unschedulable]}, strategic=True)
    assert [c["type"] for c in both["status"]["conditions"]] == ["hamid.io/AllocationBooked", "PodScheduled"]

    forged = {"conditions": [{**record, "message": "forged"}], "phase": "Running"}
    await kube.patch(PODS, "c", {"status": forged}, "default")
    live = await kube.get_pod("default", "c")
    live["status"] = forged
    await kube.replace(PODS, "c", live, "default")
    with pytest.raises(Conflict):
        await kube.patch_pod_status("default", "c", {"conditions": [record]}, strategic=True, uid="other")
    kept = await kube.get_pod("default", "c")
    assert kept["status"]["phase"] == "Pending"
    assert kept["status"]["conditions"] == both["status"]["conditions"]


async def test_namespaces_and_cascade(core: client.CoreV1Api, apiserver: ApiServer) -> None:
    names = {n.metadata.name for n in (await core.list_namespace()).items}
    assert {"default", "kube-system", "kube-node-lease"} <= names
    ns = await core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team"}})
    assert ns.status.phase == "Active"
    await core.create_namespaced_pod("team", pod("p", namespace="team"))
    await core.delete_namespace("team")
    assert apiserver.list("pods", "team") == []
    with pytest.raises(ApiException):
        await core.read_namespace("team")


async def test_strict_namespaces() -> None:
    async with ApiServer(auto_namespaces=False) as server:
        config = client.Configuration(host=server.url)
        async with client.ApiClient(config) as api:
            core = client.CoreV1Api(api)
            with pytest.raises(ApiException) as err:
                await core.create_namespaced_pod("missing", pod("p", namespace="missing"))
            assert err.value.status == 404
            assert "namespaces" in status_of(err.value)["message"]


async def test_finalizers_delay_deletion(core: client.CoreV1Api) -> None:
    manifest = pod("f")
    manifest["metadata"]["finalizers"] = ["example.com/hold"]
    await core.create_namespaced_pod("default", manifest)
    marked = await core.delete_namespaced_pod("f", "default")
    assert marked.metadata.deletion_timestamp is not None
    still = await core.read_namespaced_pod("f", "default")
    assert still.metadata.finalizers == ["example.com/hold"]
    await core.patch_namespaced_pod("f", "default", {"metadata": {"finalizers": None}})
    with pytest.raises(ApiException) as err:
        await core.read_namespaced_pod("f", "default")
    assert err.value.status == 404


async def test_delete_preconditions(core: client.CoreV1Api) -> None:
    created = await core.create_namespaced_pod("default", pod("d"))
    with pytest.raises(ApiException) as err:
        await core.delete_namespaced_pod(
            "d", "default", body=client.V1DeleteOptions(preconditions=client.V1Preconditions(uid="other"))
        )
    assert err.value.status == 409
    await core.delete_namespaced_pod(
        "d",
        "default",
        body=client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=created.metadata.uid)),
    )


async def test_graceful_pod_deletion() -> None:
    async with (
        ApiServer(graceful_pod_deletion=True) as server,
        client.ApiClient(client.Configuration(host=server.url)) as api,
    ):
        core = client.CoreV1Api(api)
        await core.create_namespaced_pod("default", pod("g", node="n1"))
        marked = await core.delete_namespaced_pod("g", "default")
        assert marked.metadata.deletion_timestamp is not None
        assert marked.metadata.deletion_grace_period_seconds == 30
        await core.patch_namespaced_pod_status("g", "default", {"status": {"phase": "Running"}})
        assert server.get("Pod", "default", "g") is not None
        await core.delete_namespaced_pod("g", "default", grace_period_seconds=0)
        assert server.get("Pod", "default", "g") is None


async def test_delete_collection(core: client.CoreV1Api, apiserver: ApiServer) -> None:
    for name, tier in (("a", "web"), ("b", "web"), ("c", "db")):
        await core.create_namespaced_pod("default", pod(name, labels={"tier": tier}))
    await core.delete_collection_namespaced_pod("default", label_selector="tier=web")
    assert [p["metadata"]["name"] for p in apiserver.list("pods", "default")] == ["c"]


async def test_discovery(api: client.ApiClient) -> None:
    versions = await client.CoreApi(api).get_api_versions()
    assert versions.versions == ["v1"]
    groups = await client.ApisApi(api).get_api_versions()
    names = {g.name for g in groups.groups}
    assert {"coordination.k8s.io", "events.k8s.io", "authentication.k8s.io"} <= names
    resources = await client.CoordinationV1Api(api).get_api_resources()
    assert [r.name for r in resources.resources] == ["leases"]
    core_resources = {r.name for r in (await client.CoreV1Api(api).get_api_resources()).resources}
    assert {
        "pods",
        "pods/status",
        "pods/binding",
        "nodes/status",
        "events",
        "resourcequotas",
    } <= core_resources
    info = await client.VersionApi(api).get_code()
    assert info.major == "1"


async def test_python_api_round_trip(apiserver: ApiServer, core: client.CoreV1Api) -> None:
    seeded = apiserver.put({**pod("seed", node="n1"), "status": {"phase": "Running"}})
    assert seeded["status"]["phase"] == "Running"
    over_http = await core.read_namespaced_pod("seed", "default")
    assert over_http.status.phase == "Running"
    assert over_http.spec.node_name == "n1"
    copy = apiserver.get("pods", "default", "seed")
    assert copy is not None
    copy["metadata"]["labels"] = {"mutated": "yes"}
    assert apiserver.get("pods", "default", "seed")["metadata"]["labels"] == {}
    patched = apiserver.patch("Pod", "default", "seed", {"metadata": {"labels": {"k": "v"}}})
    assert patched["metadata"]["labels"] == {"k": "v"}
    assert apiserver.count("pods") == 1
    assert apiserver.delete("Pod", "default", "seed") is not None
    assert apiserver.delete("Pod", "default", "seed") is None
    with pytest.raises(KeyError):
        apiserver.get("Deployment", "default", "x")


async def test_python_api_seeding_and_listener(apiserver: ApiServer, core: client.CoreV1Api) -> None:
    seen: list[tuple[str, str, str]] = []
    remove = apiserver.add_listener(
        lambda change: seen.append((change.type, change.resource.kind, change.new.name))
    )
    assert apiserver.put_many(pod(f"bulk{i}", node="n1") for i in range(3)) == 3
    created = apiserver.create(pod("made"))
    assert created["status"] == {"phase": "Pending", "qosClass": "BestEffort"}
    with pytest.raises(ApiError) as err:
        apiserver.create(pod("made"))
    assert (err.value.code, err.value.reason) == (409, "AlreadyExists")
    await core.patch_namespaced_pod("made", "default", {"metadata": {"labels": {"a": "b"}}})
    remove()
    apiserver.delete("Pod", "default", "made")
    assert seen == [
        ("ADDED", "Pod", "bulk0"),
        ("ADDED", "Pod", "bulk1"),
        ("ADDED", "Pod", "bulk2"),
        ("ADDED", "Pod", "made"),
        ("MODIFIED", "Pod", "made"),
    ]
    on_node = apiserver.list("pods", field_selector="spec.nodeName=n1", label_selector="!missing")
    assert sorted(p["metadata"]["name"] for p in on_node) == ["bulk0", "bulk1", "bulk2"]
    assert apiserver.list("nodes") == []
