"""Bad and hostile input on /filter, /bind and /webhook over real HTTP: a 4xx or an in-band error
with the reason, never a 500, and nothing changes (issue 16)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.kube.helpers import create_namespace
from tests.integration.scheduler.harness import Env, running_scheduler, wait_for
from tests.unit.scheduler.helpers import pod

DEEP = 100_000


def nested(depth: int) -> bytes:
    """A JSON body nested ``depth`` lists deep."""
    return b"[" * depth + b"]" * depth


def review(obj: Any, operation: str = "CREATE") -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "u-1", "operation": operation, "namespace": "default", "object": obj},
    }


async def post_raw(env: Env, base: str, path: str, body: bytes) -> tuple[int, str]:
    async with env.session.post(base + path, data=body, headers={"Content-Type": "application/json"}) as resp:
        return resp.status, await resp.text()


async def _registered(env: Env, *names: str) -> None:
    for name in names:
        env.add_node(name)
    await wait_for(lambda: all(n in env.scheduler.ledger.nodes for n in names))


async def test_deep_nesting_is_a_400_on_every_route() -> None:
    async with running_scheduler() as env:
        for base, path in ((env.extender, "/filter"), (env.extender, "/bind"), (env.cluster, "/webhook")):
            for depth in (65, 2000, DEEP):
                status, text = await post_raw(env, base, path, nested(depth))
                assert status == 400 and "nested deeper than 64" in text, (path, depth, text)
            status, text = await post_raw(env, base, path, b'{"a": NaN}')
            assert status == 400 and "NaN" in text


@pytest.mark.parametrize(
    "change",
    [
        {"annotations": ["x"]},
        {"annotations": {"hami.io/numa-alignment": 7}},
        {"annotations": {"nvidia.com/use-gpuuuid": {"a": 1}}},
        {"namespace": 5},
        {"name": ["a"]},
        {"resources": None},
    ],
)
async def test_filter_and_bind_answer_malformed_pods_in_band(change: dict[str, Any]) -> None:
    async with running_scheduler() as env:
        await _registered(env, "n1")
        p = pod("a")
        if "resources" in change:
            p["spec"]["containers"][0]["resources"] = None
        else:
            p["metadata"].update(change)
        before = env.scheduler.ledger.snapshot()
        status, body = await env.post(env.extender, "/filter", {"Pod": p, "NodeNames": ["n1"]})
        assert status in (200, 400), body
        if status == 200 and "resources" not in change:
            assert body.get("Error"), body
        assert env.scheduler.ledger.snapshot() == before
        bind = {"PodName": p["metadata"]["name"], "PodNamespace": p["metadata"]["namespace"]}
        status, body = await env.post(env.extender, "/bind", {**bind, "PodUID": "uid-a", "Node": "n1"})
        assert status in (200, 400) and (status == 400 or body.get("Error")), body
        assert env.scheduler.ledger.snapshot() == before


@pytest.mark.parametrize("obj", [[], ["pod"], "pod", 7, True, {"kind": "Secret"}, None])
async def test_webhook_denies_an_object_that_is_no_pod(obj: Any) -> None:
    async with running_scheduler() as env:
        status, body = await env.post(env.cluster, "/webhook", review(obj))
        assert status == 200, body
        response = body["response"]
        assert response["allowed"] is False and response["status"]["code"] == 400
        assert "not a Pod" in response["status"]["message"]


async def test_webhook_allows_objectless_delete() -> None:
    async with running_scheduler() as env:
        status, body = await env.post(env.cluster, "/webhook", review(None, "DELETE"))
        assert status == 200 and body["response"]["allowed"] is True


async def test_webhook_denies_malformed_pods_with_the_reason() -> None:
    async with running_scheduler() as env:
        for change, word in (
            ({"annotations": ["x"]}, "annotations"),
            ({"labels": "x"}, "labels"),
        ):
            p = pod("a")
            p["metadata"].update(change)
            status, body = await env.post(env.cluster, "/webhook", review(p))
            assert status == 200 and body["response"]["allowed"] is False
            assert word in body["response"]["status"]["message"]
        p = pod("a")
        p["spec"]["containers"][0]["resources"] = None
        status, body = await env.post(env.cluster, "/webhook", review(p))
        assert status == 200 and "allowed" in body["response"], body
        bad_ns = review(pod("a"))
        bad_ns["request"]["namespace"] = ["x"]
        status, body = await env.post(env.cluster, "/webhook", bad_ns)
        assert status == 200 and body["response"]["allowed"] is False


async def test_dot_dot_pod_name_never_reaches_the_namespace() -> None:
    async with running_scheduler() as env:
        await _registered(env, "n1")
        await create_namespace(env.kube, "team")
        p = pod("..", namespace="team")
        body = await env.filter(p, ["n1"])
        assert "may not be" in body["Error"], body
        stored = env.server.get("Namespace", None, "team")
        assert "annotations" not in stored["metadata"] or not stored["metadata"]["annotations"]
        assert env.scheduler.ledger.reservation("uid-..") is None


async def test_body_that_is_not_utf8_is_a_400() -> None:
    async with running_scheduler() as env:
        status, text = await post_raw(env, env.extender, "/filter", b'{"Pod": "\xff"}')
        assert status == 400 and "malformed JSON" in text


async def test_refusals_are_counted_and_recorded_as_events() -> None:
    async with running_scheduler() as env:
        await _registered(env, "n1")
        forged = {
            "hami.io/vgpu-node": "n1",
            "hami.io/vgpu-devices-allocated": "n1-gpu0,NVIDIA,2000000000,10:;",
        }
        status, body = await env.post(env.cluster, "/webhook", review(pod("a", annotations=dict(forged))))
        assert status == 200 and body["response"]["allowed"] and body["response"]["warnings"]
        cpu_only = pod("b", annotations=dict(forged))
        cpu_only["spec"]["containers"][0].pop("resources")
        await env.create_pod(cpu_only)
        registry = env.scheduler.metrics.registry

        def counted(where: str) -> float:
            return registry.get_sample_value("hamid_untrusted_annotations_total", {"where": where}) or 0.0

        await wait_for(lambda: counted("booking") == 1)
        assert counted("webhook") == 1
        assert env.scheduler.ledger.snapshot()["n1"]["n1-gpu0"] == (0, 0, 0)
        await wait_for(
            lambda: any(
                e.get("reason") == "AllocationAnnotationRefused" for e in env.server.list("Event", "default")
            )
        )
        [event] = [
            e for e in env.server.list("Event", "default") if e.get("reason") == "AllocationAnnotationRefused"
        ]
        assert event["involvedObject"]["name"] == "b" and "requests no GPU" in event["message"]


def _guaranteed(name: str, container_name: object) -> dict[str, Any]:
    """A Guaranteed GPU pod (CPU and memory requests equal to limits); ``...`` drops the name."""
    p = pod(name)
    main = p["spec"]["containers"][0]
    main["resources"]["limits"].update({"cpu": "2", "memory": "1Gi"})
    main["resources"]["requests"] = dict(main["resources"]["limits"])
    if container_name is ...:
        del main["name"]
    else:
        main["name"] = container_name
    return p


async def test_guaranteed_pod_with_a_bad_container_name_after_a_good_one_is_refused_in_band(
    logs: list[dict[str, Any]],
) -> None:
    async with running_scheduler() as env:
        await _registered(env, "n1")
        good = await env.create_pod(_guaranteed("good", "main"))
        status, body = await env.post(env.extender, "/filter", {"Pod": good, "NodeNames": ["n1"]})
        assert status == 200 and body.get("NodeNames") == ["n1"], body
        before = env.scheduler.ledger.snapshot()
        for bad in (..., 5, None, "", ["main"], {"a": 1}):
            p = _guaranteed("bad", bad)
            status, body = await env.post(env.extender, "/filter", {"Pod": p, "NodeNames": ["n1"]})
            assert status == 200, body
            assert body["Error"] == "extender args pod container 0: name must be a non-empty string", body
        assert env.scheduler.ledger.snapshot() == before
    assert not [e for e in logs if e.get("exc_info") or e["log_level"] in ("error", "critical")]


@pytest.mark.parametrize(
    "nodes",
    [{}, {"items": None}, {"items": "n1"}, {"items": [{}]}, {"items": [{"metadata": {"name": 1}}]}, [], "x"],
)
async def test_a_malformed_nodes_envelope_gets_an_error(nodes: Any) -> None:
    async with running_scheduler() as env:
        await _registered(env, "n1")
        status, body = await env.post(env.extender, "/filter", {"Pod": pod("a"), "Nodes": nodes})
        assert status == 200 and body["Error"].startswith("Nodes"), body
