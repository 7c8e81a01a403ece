"""KubeClient against the embedded API server over real HTTP: every method and error mapping."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from hamid.kube.client import LEASES, NODES, PODS, RESOURCE_QUOTAS, KubeClient, connect
from hamid.kube.errors import AlreadyExists, Conflict, KubeError, NotFound, Timeout
from tests.builders import node, pod
from tests.integration.kube.helpers import create_namespace


async def test_pod_crud_and_metadata_patch(kube: KubeClient) -> None:
    created = await kube.create_pod(pod("p1", labels={"app": "web"}))
    assert created["metadata"]["uid"]
    got = await kube.get_pod("default", "p1")
    assert got["metadata"]["uid"] == created["metadata"]["uid"]
    assert got["kind"] == "Pod"

    patched = await kube.patch_pod_metadata(
        "default", "p1", annotations={"a": "1", "b": "2"}, labels={"tier": "gpu"}
    )
    assert patched["metadata"]["annotations"] == {"a": "1", "b": "2"}
    assert patched["metadata"]["labels"] == {"app": "web", "tier": "gpu"}

    # None deletes a key; an unrelated key stays.
    patched = await kube.patch_pod_metadata("default", "p1", annotations={"a": None}, labels={"app": None})
    assert patched["metadata"]["annotations"] == {"b": "2"}
    assert patched["metadata"]["labels"] == {"tier": "gpu"}

    await kube.delete_pod("default", "p1")
    with pytest.raises(NotFound) as info:
        await kube.get_pod("default", "p1")
    assert info.value.status == 404
    assert "p1" in str(info.value)


async def test_resource_version_precondition(kube: KubeClient) -> None:
    created = await kube.create_pod(pod("p2"))
    rv = created["metadata"]["resourceVersion"]
    ok = await kube.patch_pod_metadata("default", "p2", annotations={"k": "v1"}, resource_version=rv)
    assert ok["metadata"]["resourceVersion"] != rv
    with pytest.raises(Conflict) as info:
        await kube.patch_pod_metadata("default", "p2", annotations={"k": "v2"}, resource_version=rv)
    assert info.value.status == 409
    assert info.value.reason == "Conflict"
    # The stale patch changed nothing.
    assert (await kube.get_pod("default", "p2"))["metadata"]["annotations"] == {"k": "v1"}


async def test_metadata_patch_needs_something(kube: KubeClient) -> None:
    with pytest.raises(ValueError):
        await kube.patch_pod_metadata("default", "nope")


async def test_list_pods_with_selectors(kube: KubeClient) -> None:
    await create_namespace(kube, "team-a")
    await kube.create_pod(pod("a1", "team-a", node="n1", labels={"app": "x"}))
    await kube.create_pod(pod("a2", "team-a", node="n2", labels={"app": "y"}))
    await kube.create_pod(pod("d1", "default", node="n1", labels={"app": "x"}))

    items, rv = await kube.list_pods()
    assert {p["metadata"]["name"] for p in items} >= {"a1", "a2", "d1"}
    assert rv and int(rv) > 0
    assert all(p["kind"] == "Pod" and p["apiVersion"] == "v1" for p in items)

    items, _ = await kube.list_pods("team-a")
    assert sorted(p["metadata"]["name"] for p in items) == ["a1", "a2"]
    items, _ = await kube.list_pods(field_selector="spec.nodeName=n1")
    assert sorted(p["metadata"]["name"] for p in items) == ["a1", "d1"]
    items, _ = await kube.list_pods(label_selector="app=x")
    assert sorted(p["metadata"]["name"] for p in items) == ["a1", "d1"]
    items, _ = await kube.list_pods("team-a", label_selector="app in (y,z)")
    assert [p["metadata"]["name"] for p in items] == ["a2"]


async def test_list_follows_continue_pages(kube: KubeClient) -> None:
    for i in range(7):
        await kube.create_pod(pod(f"page-{i}"))
    items, rv = await kube.list_objects(PODS, "default", page_size=3)
    assert sorted(p["metadata"]["name"] for p in items) == [f"page-{i}" for i in range(7)]
    assert rv


async def test_pod_status_and_binding(kube: KubeClient) -> None:
    created = await kube.create_pod(pod("b1"))
    uid = created["metadata"]["uid"]
    await kube.create_node(node("n1"))
    await kube.bind_pod("default", "b1", uid, "n1")
    assert (await kube.get_pod("default", "b1"))["spec"]["nodeName"] == "n1"
    with pytest.raises(Conflict):
        await kube.bind_pod("default", "b1", uid, "n1")

    status = await kube.patch_pod_status("default", "b1", {"phase": "Running"})
    assert status["status"]["phase"] == "Running"
    assert (await kube.get_pod("default", "b1"))["status"]["phase"] == "Running"


async def test_nodes(kube: KubeClient) -> None:
    await kube.create_node(node("gpu-1", labels={"pool": "a"}))
    await kube.create_node(node("gpu-2", labels={"pool": "b"}))
    got = await kube.get_node("gpu-1")
    assert got["metadata"]["labels"] == {"pool": "a"}
    items, _ = await kube.list_nodes(label_selector="pool=b")
    assert [n["metadata"]["name"] for n in items] == ["gpu-2"]
    items, _ = await kube.list_nodes(field_selector="metadata.name=gpu-1")
    assert [n["metadata"]["name"] for n in items] == ["gpu-1"]

    rv = got["metadata"]["resourceVersion"]
    patched = await kube.patch_node_metadata("gpu-1", annotations={"hami.io/x": "y"}, resource_version=rv)
    assert patched["metadata"]["annotations"] == {"hami.io/x": "y"}
    with pytest.raises(Conflict):
        await kube.patch_node_metadata("gpu-1", labels={"pool": "c"}, resource_version=rv)
    patched = await kube.patch_node_metadata("gpu-1", annotations={"hami.io/x": None})
    assert not patched["metadata"].get("annotations")

    status = await kube.patch_node_status("gpu-1", {"allocatable": {"nvidia.com/gpu": "4"}})
    assert status["status"]["allocatable"]["nvidia.com/gpu"] == "4"
    with pytest.raises(NotFound):
        await kube.get_node("missing")
    with pytest.raises(AlreadyExists):
        await kube.create_node(node("gpu-1"))
    await kube.delete(NODES, "gpu-2")
    with pytest.raises(NotFound):
        await kube.get_node("gpu-2")


async def test_resource_quotas(kube: KubeClient) -> None:
    await create_namespace(kube, "quota-ns")
    quota = {
        "metadata": {"name": "gpu-quota", "namespace": "quota-ns"},
        "spec": {"hard": {"limits.nvidia.com/gpu": "2"}},
    }
    await kube.create(RESOURCE_QUOTAS, quota)
    items, rv = await kube.list_resource_quotas("quota-ns")
    assert [q["metadata"]["name"] for q in items] == ["gpu-quota"]
    assert items[0]["spec"]["hard"] == {"limits.nvidia.com/gpu": "2"}
    assert rv
    items, _ = await kube.list_resource_quotas()
    assert "gpu-quota" in {q["metadata"]["name"] for q in items}


async def test_leases(kube: KubeClient) -> None:
    lease = {"metadata": {"name": "lock"}, "spec": {"holderIdentity": "a", "leaseDurationSeconds": 5}}
    created = await kube.create_lease("kube-system", lease)
    assert created["apiVersion"] == "coordination.k8s.io/v1"
    with pytest.raises(AlreadyExists):
        await kube.create_lease("kube-system", lease)
    got = await kube.get_lease("kube-system", "lock")
    got["spec"]["holderIdentity"] = "b"
    replaced = await kube.replace_lease("kube-system", "lock", got)
    assert replaced["spec"]["holderIdentity"] == "b"
    # Replacing with the old resourceVersion is a conflict.
    got["spec"]["holderIdentity"] = "c"
    with pytest.raises(Conflict):
        await kube.replace_lease("kube-system", "lock", got)
    with pytest.raises(NotFound):
        await kube.get(LEASES, "other", "kube-system")


async def test_namespace_already_exists(kube: KubeClient) -> None:
    created = await create_namespace(kube, "ns-x", labels={"team": "x"})
    # The API server adds the kubernetes.io/metadata.name label, as a real one does.
    assert created["metadata"]["labels"] == {"team": "x", "kubernetes.io/metadata.name": "ns-x"}
    with pytest.raises(AlreadyExists) as info:
        await create_namespace(kube, "ns-x")
    assert isinstance(info.value, Conflict)


async def test_token_review(kube: KubeClient, apiserver: Any) -> None:
    apiserver.register_token("secret-token", "system:serviceaccount:kube-system:hami-device-plugin")
    review = await kube.create_token_review("secret-token")
    assert review["status"]["authenticated"] is True
    assert review["status"]["user"]["username"] == "system:serviceaccount:kube-system:hami-device-plugin"
    review = await kube.create_token_review("unknown-token")
    assert not review["status"].get("authenticated")


async def test_injected_errors_are_typed(kube: KubeClient, apiserver: Any) -> None:
    await kube.create_pod(pod("faulty"))
    apiserver.faults.fail_next(1, verb="get", path_pattern="/pods/faulty", status=500)
    with pytest.raises(KubeError) as info:
        await kube.get_pod("default", "faulty")
    assert info.value.status == 500
    assert not isinstance(info.value, (Conflict, NotFound, Timeout))
    apiserver.faults.fail_next(1, verb="patch", path_pattern="/pods/faulty", status=409)
    with pytest.raises(Conflict):
        await kube.patch_pod_metadata("default", "faulty", annotations={"a": "b"})
    apiserver.faults.fail_next(1, verb="get", path_pattern="/pods/faulty", status=504)
    with pytest.raises(Timeout):
        await kube.get_pod("default", "faulty")
    # The failures are spent: the next call works and nothing was half-applied.
    got = await kube.get_pod("default", "faulty")
    assert not got["metadata"].get("annotations")


async def test_slow_server_raises_timeout(kube: KubeClient, apiserver: Any) -> None:
    await kube.create_pod(pod("slow"))
    rule = apiserver.faults.add_latency(3.0, path_pattern="/pods/slow")
    with pytest.raises(Timeout) as info:
        await kube.get_pod("default", "slow", timeout=0.2)
    assert info.value.status is None
    with pytest.raises(Timeout):
        await kube.patch_pod_metadata("default", "slow", annotations={"x": "y"}, timeout=0.2)
    apiserver.faults.remove(rule.id)
    assert (await kube.get_pod("default", "slow", timeout=2))["metadata"]["name"] == "slow"


async def test_unreachable_server_is_a_kube_error(unused_tcp_port: int) -> None:
    client = await connect(api_server=f"http://127.0.0.1:{unused_tcp_port}", request_timeout=2)
    try:
        with pytest.raises(KubeError) as info:
            await client.get_node("x")
        assert info.value.status is None
    finally:
        await client.close()


async def test_connect_with_kubeconfig(
    apiserver: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "sim", "cluster": {"server": apiserver.url}}],
        "users": [{"name": "u", "user": {"token": "abc"}}],
        "contexts": [{"name": "sim", "context": {"cluster": "sim", "user": "u"}}],
        "current-context": "sim",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    monkeypatch.setenv("KUBECONFIG", str(path))
    apiserver.register_token("abc", "alice")  # the server refuses a token it does not know (401)
    client = await connect()
    try:
        assert client.host == apiserver.url
        items, _ = await client.list_nodes()
        assert items == []
    finally:
        await client.close()


async def test_connect_without_any_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)
    with pytest.raises(KubeError, match="--api-server"):
        await connect()
    with pytest.raises(KubeError, match="not valid YAML"):
        bad = tmp_path / "bad"
        bad.write_text("clusters: [")
        await connect(kubeconfig=str(bad))
    with pytest.raises(KubeError, match="http"):
        await connect(api_server="127.0.0.1:6443")


_KUBECONFIG = """apiVersion: v1
kind: Config
current-context: c
contexts: [{name: c, context: %s}]
clusters: [{name: c, cluster: %s}]
users: [{name: u, user: {token: t}}]
"""


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("[" * 3000, "nested too deeply"),
        ("", "the file is empty"),
        ("- a\n- b\n", "a YAML mapping with clusters, contexts and users is expected, not list"),
        (
            _KUBECONFIG % ("5", '{server: "https://127.0.0.1:1"}'),
            "contexts[].context of 'c' is not a mapping",
        ),
        (_KUBECONFIG % ("{cluster: c, user: u}", "{server: 5}"), "the server of cluster 'c' is not a URL"),
        (
            _KUBECONFIG
            % ("{cluster: c, user: u}", '{server: "https://127.0.0.1:1", certificate-authority-data: "%%"}'),
            "cannot use the credentials",
        ),
    ],
    ids=["deep", "empty", "list", "context-int", "server-int", "bad-ca"],
)
async def test_a_kubeconfig_of_any_shape_is_one_clear_error(tmp_path: Path, text: str, says: str) -> None:
    """Each is a KubeError naming the file in one line and what is wrong in words, never the
    library's own (a TypeError for an empty file, an AssertionError for a number as a server)."""
    path = tmp_path / "kubeconfig"
    path.write_text(text)
    with pytest.raises(KubeError) as err:
        await connect(kubeconfig=str(path))
    assert says in str(err.value) and "\n" not in str(err.value)
    assert "Error:" not in str(err.value) or "SSLError" in str(err.value)
