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


def update_configuration(url: str, ca_pem: bytes, operations: list[str]) -> dict[str, Any]:
    config = configuration(url, ca_pem)
    config["webhooks"][0]["rules"][0]["operations"] = operations
    return config


async def test_update_is_sent_with_the_old_object_and_the_callers_identity(
    apiserver: ApiServer, core: client.CoreV1Api, hook: Hook, tls_files: TLSFiles
) -> None:
    apiserver.put(update_configuration(hook.url, tls_files.ca_file.read_bytes(), ["CREATE", "UPDATE"]))
    await core.create_namespaced_pod("default", pod("gpu"))
    patch = {"metadata": {"annotations": {"team.io/owner": "alice"}}}
    await core.patch_namespaced_pod("gpu", "default", patch)
    create, update = (r["request"] for r in hook.reviews)
    assert create["operation"] == "CREATE" and create["oldObject"] is None
    assert create["userInfo"] == {"username": "system:anonymous", "groups": ["system:unauthenticated"]}
    assert update["operation"] == "UPDATE" and update["options"]["kind"] == "UpdateOptions"
    assert "team.io/owner" not in (update["oldObject"]["metadata"].get("annotations") or {})
    assert update["object"]["metadata"]["annotations"] == {"team.io/owner": "alice"}
    # a registered bearer token is its user; the review says who asked
    apiserver.register_token("plugin-token", "system:serviceaccount:kube-system:hamid-device-plugin")
    config = client.Configuration(host=apiserver.url)
    config.api_key = {"BearerToken": "plugin-token"}
    config.api_key_prefix = {"BearerToken": "Bearer"}
    async with client.ApiClient(config) as api:
        await client.CoreV1Api(api).patch_namespaced_pod(
            "gpu", "default", {"metadata": {"labels": {"a": "b"}}}
        )
    assert hook.reviews[-1]["request"]["userInfo"]["username"] == (
        "system:serviceaccount:kube-system:hamid-device-plugin"
    )
    # an unknown token is refused before anything else
    config.api_key = {"BearerToken": "forged"}
    async with client.ApiClient(config) as api:
        with pytest.raises(ApiException) as caught:
            await client.CoreV1Api(api).read_namespaced_pod("gpu", "default")
    assert caught.value.status == 401


async def test_a_denied_update_changes_nothing_and_create_only_rules_skip_updates(
    apiserver: ApiServer, core: client.CoreV1Api, hook: Hook, tls_files: TLSFiles
) -> None:
    apiserver.put(update_configuration(hook.url, tls_files.ca_file.read_bytes(), ["CREATE"]))
    await core.create_namespaced_pod("default", pod("gpu"))
    await core.patch_namespaced_pod("gpu", "default", {"metadata": {"annotations": {"x": "1"}}})
    assert [r["request"]["operation"] for r in hook.reviews] == ["CREATE"]
    apiserver.put(update_configuration(hook.url, tls_files.ca_file.read_bytes(), ["UPDATE"]))
    hook.answer = lambda request: {"allowed": False, "status": {"code": 403, "message": "not yours"}}
    before = apiserver.get("Pod", "default", "gpu")
    with pytest.raises(ApiException) as caught:
        await core.patch_namespaced_pod("gpu", "default", {"metadata": {"annotations": {"x": "2"}}})
    assert caught.value.status == 403
    assert json.loads(caught.value.body)["message"].endswith("denied the request: not yours")
    assert apiserver.get("Pod", "default", "gpu") == before
    body = await core.read_namespaced_pod("gpu", "default")
    body.metadata.annotations["x"] = "3"
    with pytest.raises(ApiException):  # PUT too
        await core.replace_namespaced_pod("gpu", "default", body)
    # the status subresource is another resource: a rule for pods does not cover pods/status
    await core.patch_namespaced_pod_status("gpu", "default", {"status": {"message": "hi"}})


async def test_an_update_adding_the_excluded_label_is_still_judged(
    apiserver: ApiServer, core: client.CoreV1Api, hook: Hook, tls_files: TLSFiles
) -> None:
    ignore = {"matchExpressions": [{"key": "hami.io/webhook", "operator": "NotIn", "values": ["ignore"]}]}
    config = update_configuration(hook.url, tls_files.ca_file.read_bytes(), ["UPDATE"])
    config["webhooks"][0]["objectSelector"] = ignore
    apiserver.put(config)
    await core.create_namespaced_pod("default", pod("gpu"))
    patch = {"metadata": {"labels": {"hami.io/webhook": "ignore"}, "annotations": {"x": "1"}}}
    await core.patch_namespaced_pod("gpu", "default", patch)
    assert len(hook.reviews) == 1  # the old object matched the selector
    await core.patch_namespaced_pod("gpu", "default", {"metadata": {"annotations": {"x": "2"}}})
    assert len(hook.reviews) == 1  # neither version matches any more
