"""Fault injection from Python and over the admin HTTP endpoint."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from hamidsim.apiserver import ApiServer
from tests.builders import pod


async def test_fail_next_from_python(core: client.CoreV1Api, apiserver: ApiServer) -> None:
    apiserver.put(pod("a"))
    apiserver.faults.fail_next(2, "patch", r"/pods/a$", 503)
    for _ in range(2):
        with pytest.raises(ApiException) as err:
            await core.patch_namespaced_pod("a", "default", {"metadata": {"labels": {"x": "1"}}})
        body = json.loads(err.value.body)
        assert (err.value.status, body["kind"], body["code"], body["reason"]) == (
            503,
            "Status",
            503,
            "ServiceUnavailable",
        )
    assert apiserver.get("Pod", "default", "a")["metadata"]["labels"] == {}
    await core.read_namespaced_pod("a", "default")
    patched = await core.patch_namespaced_pod("a", "default", {"metadata": {"labels": {"x": "1"}}})
    assert patched.metadata.labels == {"x": "1"}
    assert apiserver.faults.rules == []


async def test_fail_matches_verb_and_path(core: client.CoreV1Api, apiserver: ApiServer) -> None:
    apiserver.faults.fail_next(1, "list", "/nodes", 500)
    await core.list_namespaced_pod("default")
    with pytest.raises(ApiException) as err:
        await core.list_node()
    assert err.value.status == 500
    apiserver.faults.fail_next(1, "watch", None, 429)
    with pytest.raises(ApiException) as throttled:
        await core.list_namespaced_pod("default", watch=True, timeout_seconds=1)
    assert throttled.value.status == 429
    assert throttled.value.headers["Retry-After"] == "1"


async def test_latency_from_python(core: client.CoreV1Api, apiserver: ApiServer) -> None:
    rule = apiserver.faults.add_latency(5.0, "get", "/pods/slow")
    apiserver.put(pod("slow"))
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(core.read_namespaced_pod("slow", "default"), 0.2)
    assert apiserver.faults.remove(rule.id)
    assert (await asyncio.wait_for(core.read_namespaced_pod("slow", "default"), 5)).metadata.name == "slow"


async def test_admin_endpoint(core: client.CoreV1Api, apiserver: ApiServer) -> None:
    async with aiohttp.ClientSession(base_url=apiserver.url) as http:
        async with http.post(
            "/_sim/faults",
            json={"type": "fail", "count": 1, "verb": "create", "pathPattern": "/pods", "status": 409},
        ) as resp:
            assert resp.status == 201
            rule = await resp.json()
        assert rule["remaining"] == 1
        with pytest.raises(ApiException) as err:
            await core.create_namespaced_pod("default", pod("x"))
        assert err.value.status == 409
        await core.create_namespaced_pod("default", pod("x"))

        async with http.post("/_sim/faults", json={"type": "latency", "seconds": 5, "verb": "GET"}) as resp:
            latency = await resp.json()
        async with http.get("/_sim/faults") as resp:
            assert [r["id"] for r in (await resp.json())["rules"]] == [latency["id"]]
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(core.read_namespaced_pod("x", "default"), 0.2)
        async with http.delete(f"/_sim/faults/{latency['id']}") as resp:
            assert resp.status == 200
        async with http.delete("/_sim/faults/999") as resp:
            assert resp.status == 404
        async with http.post("/_sim/faults", json={"type": "fail", "count": 3}) as resp:
            assert resp.status == 201
        async with http.delete("/_sim/faults") as resp:
            assert resp.status == 200
        assert apiserver.faults.rules == []
        await core.read_namespaced_pod("x", "default")

        for bad in (
            {"type": "explode"},
            {"type": "fail", "status": 200},
            {"type": "latency", "seconds": -1},
            {"type": "fail", "verb": "fly"},
            {"type": "fail", "pathPattern": "("},
            [1],
        ):
            async with http.post("/_sim/faults", json=bad) as resp:
                assert resp.status == 400, bad
                assert (await resp.json())["kind"] == "Status"

        async with http.post(
            "/_sim/tokens", json={"token": "t", "username": "bob", "extra": {"k": "v"}}
        ) as resp:
            assert resp.status == 201
        review = await client.AuthenticationV1Api(core.api_client).create_token_review(
            {"spec": {"token": "t"}}
        )
        assert (review.status.user.username, review.status.user.extra) == ("bob", {"k": ["v"]})

        watch = await core.list_namespaced_pod(
            "default", watch=True, resource_version=str(apiserver.resource_version), _preload_content=False
        )
        await asyncio.sleep(0.05)
        async with http.post("/_sim/watches/close", json={"kind": "pods"}) as resp:
            assert (await resp.json()) == {"closed": 1}
        assert await asyncio.wait_for(watch.content.readline(), 5) == b""
        watch.release()
        async with http.get("/_sim/stats") as resp:
            stats = await resp.json()
        assert stats["objects"]["pods"] == 1
        assert stats["requests"]["create pods"] == 2


async def test_bad_requests_never_500(apiserver: ApiServer) -> None:
    async with aiohttp.ClientSession(base_url=apiserver.url) as http:
        cases = [
            ("POST", "/api/v1/namespaces/default/pods", b"{", 400),
            ("POST", "/api/v1/namespaces/default/pods", b"[]", 400),
            ("POST", "/api/v1/namespaces/default/pods", b'{"kind":"Node","apiVersion":"v1"}', 400),
            ("POST", "/api/v1/namespaces/default/pods", b'{"metadata":{"name":"a","labels":[1]}}', 400),
            (
                "POST",
                "/api/v1/namespaces/default/pods",
                b'{"metadata":{"name":"a","resourceVersion":"3"}}',
                400,
            ),
            ("GET", "/api/v1/namespaces/default/widgets", b"", 404),
            ("GET", "/api/v1/pods/x", b"", 404),
            ("GET", "/apis/nope/v1", b"", 404),
            ("GET", "/api/v1/namespaces/default/pods?limit=abc", b"", 400),
            ("GET", "/api/v1/namespaces/default/pods?watch=1&resourceVersion=abc", b"", 400),
            ("PUT", "/api/v1/namespaces/default/pods/missing", b'{"metadata":{"name":"missing"}}', 404),
            ("DELETE", "/api/v1/namespaces/default/pods/missing", b"", 404),
            ("POST", "/apis/authentication.k8s.io/v1/tokenreviews", b'{"spec":{}}', 422),
            ("PATCH", "/api/v1/namespaces/default/pods/missing/log", b"{}", 404),
            ("GET", "/_sim/nothing", b"", 404),
            ("GET", "/apis/authentication.k8s.io/v1/tokenreviews", b"", 405),
            ("OPTIONS", "/api/v1/nodes", b"", 405),
            ("POST", "/api/v1/namespaces/default/pods/x/status", b"{}", 405),
        ]
        for method, path, body, code in cases:
            async with http.request(
                method, path, data=body, headers={"Content-Type": "application/json"}
            ) as resp:
                assert resp.status == code, (method, path, await resp.text())
                payload = await resp.json()
                assert payload["kind"] == "Status" and payload["code"] == code
