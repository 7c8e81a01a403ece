"""Mutating webhooks called by the embedded API server on create, over TLS with the caBundle."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import web
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from hamid.tls import server_ssl_context
from hamidsim.apiserver import ApiServer
from tests.builders import pod
from tests.fixtures.tls import TLSFiles

Answer = Callable[[dict[str, Any]], dict[str, Any]]


class Hook:
    """A TLS webhook server on loopback that answers with ``answer(request)`` and records reviews."""

    def __init__(self) -> None:
        self.reviews: list[dict[str, Any]] = []
        self.answer: Answer = lambda request: {"allowed": True}
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        review = await request.json()
        self.reviews.append(review)
        response = {"uid": review["request"]["uid"], **self.answer(review["request"])}
        return web.json_response(
            {"apiVersion": review["apiVersion"], "kind": "AdmissionReview", "response": response}
        )


@pytest.fixture
async def hook(tls_files: TLSFiles) -> AsyncIterator[Hook]:
    hook = Hook()
    app = web.Application()
    app.router.add_post("/mutate", hook.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    context = server_ssl_context(str(tls_files.server.cert_file), str(tls_files.server.key_file), None)
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context.context)
    await site.start()
    hook.url = f"https://127.0.0.1:{runner.addresses[0][1]}/mutate"
    try:
        yield hook
    finally:
        await runner.cleanup()


def configuration(url: str, ca_pem: bytes | None, **webhook: Any) -> dict[str, Any]:
    entry = {
        "name": "vgpu.hami.io",
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "clientConfig": {"url": url, **({"caBundle": base64.b64encode(ca_pem).decode()} if ca_pem else {})},
        "rules": [
            {
                "operations": ["CREATE"],
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "resources": ["pods"],
                "scope": "*",
            }
        ],
        **webhook,
    }
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "hook"},
        "webhooks": [entry],
    }


def patch_answer(ops: list[dict[str, Any]]) -> Answer:
    encoded = base64.b64encode(json.dumps(ops).encode()).decode()
    return lambda request: {"allowed": True, "patchType": "JSONPatch", "patch": encoded}


async def test_patch_from_the_webhook_is_applied(
    apiserver: ApiServer, core: client.CoreV1Api, hook: Hook, tls_files: TLSFiles
) -> None:
    apiserver.put(configuration(hook.url, tls_files.ca_file.read_bytes()))
    hook.answer = patch_answer([{"op": "replace", "path": "/spec/schedulerName", "value": "hami-scheduler"}])
    created = await core.create_namespaced_pod("default", pod("gpu"))
    assert created.spec.scheduler_name == "hami-scheduler"
    request = hook.reviews[0]["request"]
    assert request["operation"] == "CREATE" and request["namespace"] == "default"
    assert request["kind"] == {"group": "", "version": "v1", "kind": "Pod"}
    # The webhook sees the pod as it will be stored: server defaults already applied.
    assert request["object"]["spec"]["schedulerName"] == "default-scheduler"
    assert apiserver.admission.calls == [("vgpu.hami.io", "patched")]


async def test_denial_is_the_create_error_and_nothing_is_stored(
    apiserver: ApiServer, core: client.CoreV1Api, hook: Hook, tls_files: TLSFiles
) -> None:
    apiserver.put(configuration(hook.url, tls_files.ca_file.read_bytes()))
    hook.answer = lambda request: {
        "allowed": False,
        "status": {"code": 403, "message": "privileged GPU pods"},
    }
    with pytest.raises(ApiException) as caught:
        await core.create_namespaced_pod("default", pod("gpu"))
    assert caught.value.status == 403
    message = json.loads(caught.value.body)["message"]
    assert message == 'admission webhook "vgpu.hami.io" denied the request: privileged GPU pods'
    assert apiserver.get("Pod", "default", "gpu") is None


async def test_untrusted_certificate_fails_or_is_ignored_by_policy(
    apiserver: ApiServer, core: client.CoreV1Api, hook: Hook
) -> None:
    apiserver.put(configuration(hook.url, None, failurePolicy="Fail"))  # system roots: not our CA
    with pytest.raises(ApiException) as caught:
        await core.create_namespaced_pod("default", pod("gpu"))
    assert caught.value.status == 500
    message = json.loads(caught.value.body)["message"]
    assert message.startswith('Internal error occurred: failed calling webhook "vgpu.hami.io"')
    assert "certificate verify failed" in message
    assert apiserver.get("Pod", "default", "gpu") is None
    apiserver.put(configuration(hook.url, None, failurePolicy="Ignore"))
    created = await core.create_namespaced_pod("default", pod("gpu"))
    assert created.spec.scheduler_name == "default-scheduler"
    assert apiserver.admission.calls == [("vgpu.hami.io", "failed"), ("vgpu.hami.io", "ignored")]
    assert hook.reviews == []


async def test_object_and_namespace_selectors_and_rules(
    apiserver: ApiServer, core: client.CoreV1Api, hook: Hook, tls_files: TLSFiles
) -> None:
    ignore = {"matchExpressions": [{"key": "hami.io/webhook", "operator": "NotIn", "values": ["ignore"]}]}
    apiserver.put(
        configuration(
            hook.url, tls_files.ca_file.read_bytes(), objectSelector=ignore, namespaceSelector=ignore
        )
    )
    apiserver.create(
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": "skip", "labels": {"hami.io/webhook": "ignore"}},
        }
    )
    await core.create_namespaced_pod("default", pod("labelled", labels={"hami.io/webhook": "ignore"}))
    await core.create_namespaced_pod("skip", pod("in-skipped-namespace", namespace="skip"))
    await core.create_namespace({"metadata": {"name": "other"}})  # a namespace is no pod: rules do not match
    assert hook.reviews == []
    await core.create_namespaced_pod("default", pod("selected"))
    assert [r["request"]["name"] for r in hook.reviews] == ["selected"]
