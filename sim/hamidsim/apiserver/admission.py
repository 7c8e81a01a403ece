"""Mutating admission webhooks, called on create and update as a real API server calls them.

For each ``MutatingWebhookConfiguration`` (by name) and each webhook in it (in order) whose rules
match the request (operation ``CREATE`` or ``UPDATE``, API group, version, resource or
``resource/subresource``, scope) and whose
``namespaceSelector`` and ``objectSelector`` match, the server POSTs an ``AdmissionReview`` (v1, or
v1beta1 when only that is listed in ``admissionReviewVersions``), with the caller's ``userInfo``
(:meth:`~hamidsim.apiserver.tokens.TokenRegistry.authenticate`) and, at UPDATE, the stored
``oldObject``, to ``clientConfig.url`` over TLS,
trusting ``clientConfig.caBundle`` (the system roots when empty), within ``timeoutSeconds`` (default
10). An allowed response's ``JSONPatch`` is applied to the object; a denial is the request's error
(``admission webhook "<name>" denied the request: <message>``, the response's code or 400). A call
that fails is an internal error under ``failurePolicy: Fail`` (the default) and skipped under
``Ignore``.

Only creates and updates (PUT, PATCH) over HTTP are admitted (the Python API seeds state
directly); an update the store changed while a webhook was asked is judged again (a real server's
retry). Not done: DELETE and CONNECT admission, ``clientConfig.service`` (the embedded server
resolves no Services: such a webhook counts as a failed call), ``matchConditions``, reinvocation,
validating webhooks and ValidatingAdmissionPolicies (the chart's policy is checked by its tests).
"""

from __future__ import annotations

import base64
import json
import ssl
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiohttp

from hamid.log import get_logger
from hamid.model import objects
from hamidsim.apiserver.defaults import apply_create_defaults
from hamidsim.apiserver.errors import ApiError, bad_request
from hamidsim.apiserver.patch import PatchError, json_patch
from hamidsim.apiserver.resources import BY_STORAGE, Resource
from hamidsim.apiserver.select import label_selector_test

if TYPE_CHECKING:
    from hamidsim.apiserver.store import Store

DEFAULT_TIMEOUT_S = 10
_CONFIGS = "mutatingwebhookconfigurations"
log = get_logger("sim.apiserver.admission")


@dataclass(frozen=True, slots=True)
class _Request:
    """What an AdmissionReview says about the request besides the object."""

    resource: Resource
    namespace: str
    operation: str
    user: dict[str, Any]
    old: dict[str, Any] | None
    subresource: str


class WebhookCallError(Exception):
    """Calling one webhook failed (transport, status, or an answer that is not an AdmissionReview)."""


def _listed(values: Any, wanted: str) -> bool:
    return isinstance(values, list) and ("*" in values or wanted in values)


def rule_matches(rule: Any, resource: Resource, operation: str, subresource: str = "") -> bool:
    """Whether one ``RuleWithOperations`` covers this request (``pods``, ``pods/status``, ``*``...)."""
    if not isinstance(rule, dict):
        return False
    scope = rule.get("scope") or "*"
    in_scope = scope == "*" or (scope == "Namespaced") == resource.namespaced
    resources = rule.get("resources") or []
    names: tuple[str, ...]
    if subresource:
        names = ("*/*", f"{resource.plural}/{subresource}", f"{resource.plural}/*", f"*/{subresource}")
    else:
        names = ("*", "*/*", resource.plural)
    return (
        _listed(rule.get("operations"), operation)
        and _listed(rule.get("apiGroups"), resource.group)
        and _listed(rule.get("apiVersions"), resource.version)
        and isinstance(resources, list)
        and any(r in names for r in resources)
        and in_scope
    )


def _ssl_context(webhook: dict[str, Any]) -> ssl.SSLContext:
    bundle = (webhook.get("clientConfig") or {}).get("caBundle")
    if not bundle:
        return ssl.create_default_context()
    try:
        pem = base64.b64decode(bundle, validate=True).decode()
        return ssl.create_default_context(cadata=pem)
    except (ValueError, ssl.SSLError) as err:
        raise WebhookCallError(f"caBundle is not a base64 PEM certificate: {err}") from err


class MutatingAdmission:
    """Runs the stored mutating webhooks for creates on one :class:`~hamidsim.apiserver.store.Store`."""

    def __init__(self, store: Store) -> None:
        self.store = store
        #: Calls made, as ``(webhook name, outcome)`` with outcome ``patched``, ``allowed``, ``denied``,
        #: ``failed`` or ``ignored`` (a failed call under ``failurePolicy: Ignore``).
        self.calls: list[tuple[str, str]] = []
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        """Close the HTTP client (the server's stop)."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _webhooks(self) -> list[dict[str, Any]]:
        table = self.store.tables[_CONFIGS]
        configs = sorted(table.all(), key=lambda s: s.name)
        return [w for c in configs for w in c.obj.get("webhooks") or [] if isinstance(w, dict)]

    def _selected(self, webhook: dict[str, Any], namespace: str, obj: dict[str, Any]) -> bool:
        labels = objects.labels(obj)
        if not label_selector_test(webhook.get("objectSelector"))(labels):
            return False
        if not namespace:
            return True
        ns = self.store.find(BY_STORAGE["namespaces"], "", namespace)
        ns_labels = objects.labels(ns.obj if ns is not None else None)
        return label_selector_test(webhook.get("namespaceSelector"))(ns_labels)

    def _matching(self, resource: Resource, operation: str, subresource: str) -> list[dict[str, Any]]:
        return [
            w
            for w in self._webhooks()
            if any(rule_matches(r, resource, operation, subresource) for r in w.get("rules") or [])
        ]

    def wants_update(self, resource: Resource, subresource: str = "") -> bool:
        """Whether any webhook's rules register UPDATE of this resource (or subresource)."""
        return bool(self._matching(resource, "UPDATE", subresource))

    async def admit(
        self,
        resource: Resource,
        namespace: str,
        obj: Any,
        user: dict[str, Any],
        old: dict[str, Any] | None = None,
        subresource: str = "",
    ) -> Any:
        """``obj`` after every matching webhook, or the error a webhook's answer or failure calls for.

        ``old`` (the stored object) makes it an UPDATE; ``user`` is the caller's ``userInfo``.
        """
        if not isinstance(obj, dict):
            return obj
        request = _Request(resource, namespace, "CREATE" if old is None else "UPDATE", user, old, subresource)
        webhooks = self._matching(resource, request.operation, subresource)
        if webhooks and old is None:  # webhooks see the object as the server will store it
            obj = json.loads(json.dumps(obj))
            obj.setdefault("metadata", {})
            apply_create_defaults(BY_STORAGE[resource.store_key].plural, obj)
        for webhook in webhooks:
            # at UPDATE the objectSelector matches when the old or the new object matches (as in
            # Kubernetes): adding an excluded label in the same update does not skip the webhook
            if self._selected(webhook, namespace, obj) or (
                old is not None and self._selected(webhook, namespace, old)
            ):
                obj = await self._call(webhook, request, obj)
        return obj

    async def _call(self, webhook: dict[str, Any], request: _Request, obj: dict[str, Any]) -> dict[str, Any]:
        name = str(webhook.get("name") or "")
        try:
            response = await self._post(webhook, self._review(webhook, request, obj))
        except WebhookCallError as err:
            if webhook.get("failurePolicy") == "Ignore":
                log.warning("admission_webhook_failed_ignored", webhook=name, error=str(err))
                self.calls.append((name, "ignored"))
                return obj
            self.calls.append((name, "failed"))
            raise ApiError(500, f'Internal error occurred: failed calling webhook "{name}": {err}') from err
        if not response.get("allowed"):
            self.calls.append((name, "denied"))
            status = response.get("status") or {}
            message = status.get("message") or "without explanation"
            code = int(status.get("code") or 400)
            raise ApiError(code, f'admission webhook "{name}" denied the request: {message}')
        patch = response.get("patch")
        if not patch:
            self.calls.append((name, "allowed"))
            return obj
        if response.get("patchType") != "JSONPatch":
            raise ApiError(500, f'webhook "{name}" answered patchType {response.get("patchType")!r}')
        try:
            patched = json_patch(obj, json.loads(base64.b64decode(patch)))
        except (ValueError, PatchError) as err:
            raise ApiError(500, f'Internal error occurred: webhook "{name}" sent a bad patch: {err}') from err
        self.calls.append((name, "patched"))
        return dict(patched)

    @staticmethod
    def _review(webhook: dict[str, Any], request: _Request, obj: dict[str, Any]) -> dict[str, Any]:
        versions = webhook.get("admissionReviewVersions") or ["v1"]
        version = "v1" if "v1" in versions else ("v1beta1" if "v1beta1" in versions else "")
        if not version:
            raise bad_request(f"webhook {webhook.get('name')!r} accepts none of AdmissionReview v1, v1beta1")
        resource = request.resource
        gvk = {"group": resource.group, "version": resource.version, "kind": resource.kind}
        gvr = {"group": resource.group, "version": resource.version, "resource": resource.plural}
        review: dict[str, Any] = {
            "uid": str(uuid.uuid4()),
            "kind": gvk,
            "resource": gvr,
            "requestKind": gvk,
            "requestResource": gvr,
            "name": objects.name(obj),
            "namespace": request.namespace,
            "operation": request.operation,
            "userInfo": request.user,
            "object": obj,
            "oldObject": request.old,
            "dryRun": False,
            "options": {"kind": f"{request.operation.title()}Options", "apiVersion": "meta.k8s.io/v1"},
        }
        if request.subresource:
            review["subResource"] = review["requestSubResource"] = request.subresource
        return {"apiVersion": f"admission.k8s.io/{version}", "kind": "AdmissionReview", "request": review}

    async def _post(self, webhook: dict[str, Any], review: dict[str, Any]) -> dict[str, Any]:
        config = webhook.get("clientConfig") or {}
        url = config.get("url")
        if not isinstance(url, str) or not url.startswith("https://"):
            raise WebhookCallError("clientConfig.url must be an https:// URL (Services are not resolved)")
        timeout = webhook.get("timeoutSeconds") or DEFAULT_TIMEOUT_S
        if self._session is None:
            self._session = aiohttp.ClientSession()
        try:
            async with self._session.post(
                url, json=review, ssl=_ssl_context(webhook), timeout=aiohttp.ClientTimeout(total=timeout)
            ) as resp:
                if resp.status != 200:
                    raise WebhookCallError(
                        f'failed to call webhook: the server answered {resp.status} for POST "{url}"'
                    )
                body = await resp.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError) as err:
            raise WebhookCallError(
                f'failed to call webhook: Post "{url}": {err or type(err).__name__}'
            ) from err
        response = body.get("response") if isinstance(body, dict) else None
        if not isinstance(response, dict) or response.get("uid") != review["request"]["uid"]:
            raise WebhookCallError("the webhook's answer is not an AdmissionReview for this request")
        return response
