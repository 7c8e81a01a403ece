"""Field and label selectors (every operator) and paginated lists, through CoreV1Api."""

from __future__ import annotations

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from hamidsim.apiserver import ApiServer
from tests.builders import pod


@pytest.fixture
async def seeded(apiserver: ApiServer) -> ApiServer:
    apiserver.put(
        {
            **pod("a1", "ns-a", node="n1", labels={"tier": "web", "env": "prod"}),
            "status": {"phase": "Running"},
        }
    )
    apiserver.put(
        {**pod("a2", "ns-a", node="n2", labels={"tier": "db", "env": "dev"}), "status": {"phase": "Pending"}}
    )
    apiserver.put({**pod("b1", "ns-b", node="n1", labels={"tier": "web"}), "status": {"phase": "Succeeded"}})
    apiserver.put(pod("b2", "ns-b"))
    return apiserver


async def names(core: client.CoreV1Api, namespace: str | None = None, **selectors: str) -> list[str]:
    if namespace is None:
        result = await core.list_pod_for_all_namespaces(**selectors)
    else:
        result = await core.list_namespaced_pod(namespace, **selectors)
    return sorted(p.metadata.name for p in result.items)


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("spec.nodeName=n1", ["a1", "b1"]),
        ("spec.nodeName==n2", ["a2"]),
        ("spec.nodeName=", ["b2"]),
        ("spec.nodeName!=n1", ["a2", "b2"]),
        ("metadata.name=a2", ["a2"]),
        ("metadata.namespace=ns-b", ["b1", "b2"]),
        ("metadata.namespace!=ns-b", ["a1", "a2"]),
        ("status.phase=Running", ["a1"]),
        ("status.phase!=Running,status.phase!=Succeeded", ["a2", "b2"]),
        ("spec.nodeName=n1,metadata.namespace=ns-a", ["a1"]),
    ],
)
async def test_field_selectors(
    core: client.CoreV1Api, seeded: ApiServer, selector: str, expected: list[str]
) -> None:
    assert await names(core, field_selector=selector) == expected


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("tier=web", ["a1", "b1"]),
        ("tier==db", ["a2"]),
        ("tier!=web", ["a2", "b2"]),
        ("tier in (web, db)", ["a1", "a2", "b1"]),
        ("tier notin (web)", ["a2", "b2"]),
        ("env", ["a1", "a2"]),
        ("!env", ["b1", "b2"]),
        ("tier=web,env=prod", ["a1"]),
        ("tier in (web),!env", ["b1"]),
    ],
)
async def test_label_selectors(
    core: client.CoreV1Api, seeded: ApiServer, selector: str, expected: list[str]
) -> None:
    assert await names(core, label_selector=selector) == expected


async def test_namespaced_list_with_selectors(core: client.CoreV1Api, seeded: ApiServer) -> None:
    assert await names(core, "ns-a", field_selector="spec.nodeName=n1") == ["a1"]
    assert await names(core, "ns-b", label_selector="tier=web", field_selector="status.phase=Succeeded") == [
        "b1"
    ]


async def test_node_index_follows_binding_and_deletion(core: client.CoreV1Api, seeded: ApiServer) -> None:
    seeded.patch("Pod", "ns-b", "b2", {"spec": {"nodeName": "n2"}})
    assert await names(core, field_selector="spec.nodeName=n2") == ["a2", "b2"]
    assert await names(core, field_selector="spec.nodeName=") == []
    seeded.delete("Pod", "ns-a", "a2")
    assert await names(core, field_selector="spec.nodeName=n2") == ["b2"]


@pytest.mark.parametrize(
    ("field_selector", "label_selector"),
    [
        ("spec.containers=x", None),
        ("nonsense", None),
        (None, "tier in web"),
        (None, "tier=(x"),
        (None, "tier in (a,b"),
    ],
)
async def test_bad_selectors_are_400(
    core: client.CoreV1Api, field_selector: str | None, label_selector: str | None
) -> None:
    with pytest.raises(ApiException) as err:
        await core.list_pod_for_all_namespaces(field_selector=field_selector, label_selector=label_selector)
    assert err.value.status == 400


async def test_node_and_event_field_selectors(core: client.CoreV1Api, apiserver: ApiServer) -> None:
    apiserver.put(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}, "spec": {"unschedulable": True}}
    )
    apiserver.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n2"}})
    nodes = await core.list_node(field_selector="spec.unschedulable=false")
    assert [n.metadata.name for n in nodes.items] == ["n2"]
    nodes = await core.list_node(field_selector="metadata.name=n1")
    assert [n.metadata.name for n in nodes.items] == ["n1"]


async def test_limit_and_continue(core: client.CoreV1Api, apiserver: ApiServer) -> None:
    for i in range(5):
        apiserver.put(pod(f"p{i}"))
    first = await core.list_namespaced_pod("default", limit=2)
    assert [p.metadata.name for p in first.items] == ["p0", "p1"]
    token = first.metadata._continue
    assert token
    apiserver.put(pod("p9"))
    second = await core.list_namespaced_pod("default", limit=2, _continue=token)
    assert [p.metadata.name for p in second.items] == ["p2", "p3"]
    assert second.metadata.resource_version == first.metadata.resource_version
    rest = await core.list_namespaced_pod("default", limit=10, _continue=second.metadata._continue)
    assert [p.metadata.name for p in rest.items] == ["p4", "p9"]
    assert not rest.metadata._continue
    with pytest.raises(ApiException) as err:
        await core.list_namespaced_pod("default", limit=2, _continue="garbage!")
    assert err.value.status == 400
