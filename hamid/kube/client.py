"""Raw-JSON Kubernetes client on top of kubernetes-asyncio's ``ApiClient``.

Objects travel as plain dicts in wire form (camelCase keys, exactly as the API server serves
them). Every call has a deadline; failures surface as :mod:`hamid.kube.errors` types.
"""

# Every ``timeout`` parameter here is a deadline enforced inside with ``asyncio.timeout``.
# ruff: noqa: ASYNC109

from __future__ import annotations

import asyncio
import json
import os
import urllib.parse
import urllib.request
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from kubernetes_asyncio.client import ApiClient, Configuration
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config import ConfigException, load_incluster_config, load_kube_config

from hamid.kube.errors import InvalidRequest, KubeError, Timeout, error_from_code, error_from_status
from hamid.log import get_logger
from hamid.model import objects
from hamid.model._wire import load_yaml
from hamid.model.errors import InvalidInput
from hamid.model.kube import JSON

log = get_logger("kube.client")

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"


@dataclass(frozen=True, slots=True)
class Resource:
    """One REST resource: ``prefix`` (``/api/v1`` or ``/apis/<group>/<version>``) and plural name."""

    prefix: str
    plural: str
    kind: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        """``v1`` or ``<group>/<version>``, as written in an object's ``apiVersion``."""
        return self.prefix.removeprefix("/api/").removeprefix("/apis/")

    def collection(self, namespace: str | None = None) -> str:
        """The collection path, across all namespaces when ``namespace`` is None."""
        if self.namespaced and namespace:
            return f"{self.prefix}/namespaces/{path_segment(namespace, 'namespace')}/{self.plural}"
        return f"{self.prefix}/{self.plural}"

    def item(self, name: str, namespace: str | None = None, subresource: str | None = None) -> str:
        """The path of one object (optionally one of its subresources).

        Raises :class:`~hamid.kube.errors.InvalidRequest` for a namespaced resource without a
        namespace and for a name or namespace that is no path segment (:func:`path_segment`).
        """
        if self.namespaced and not namespace:
            raise InvalidRequest(
                f"{self.plural} are namespaced: a namespace is required for {name!r}", status=400
            )
        path = f"{self.collection(namespace)}/{path_segment(name, f'{self.kind} name')}"
        return f"{path}/{subresource}" if subresource else path


def path_segment(value: str, what: str) -> str:
    """``value`` percent-encoded as one URL path segment.

    Kubernetes refuses names that are empty, ``.`` or ``..`` or contain ``/`` or ``%``
    (``IsValidPathSegmentName``): a dot segment would be resolved away (``pods/..`` is the
    namespace itself), so such a name raises :class:`~hamid.kube.errors.InvalidRequest` and
    nothing is sent.
    """
    if not isinstance(value, str) or value in ("", ".", "..") or "/" in value or "%" in value:
        raise InvalidRequest(
            f"{what} {value!r:.80} may not be empty, '.' or '..', nor contain '/' or '%'", status=400
        )
    return urllib.parse.quote(value, safe="")


PODS = Resource("/api/v1", "pods", "Pod", namespaced=True)
NODES = Resource("/api/v1", "nodes", "Node", namespaced=False)
EVENTS = Resource("/api/v1", "events", "Event", namespaced=True)
RESOURCE_QUOTAS = Resource("/api/v1", "resourcequotas", "ResourceQuota", namespaced=True)
LEASES = Resource("/apis/coordination.k8s.io/v1", "leases", "Lease", namespaced=True)
TOKEN_REVIEWS = Resource("/apis/authentication.k8s.io/v1", "tokenreviews", "TokenReview", namespaced=False)


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One decoded watch line: ``type`` (ADDED/MODIFIED/DELETED/BOOKMARK/ERROR) and the object."""

    type: str
    object: JSON


def _watch_event(line: bytes, what: str) -> WatchEvent:
    """A watch line decoded (ValueError if not JSON); an ERROR event raises its error (410: ``Gone``)."""
    event = json.loads(line)
    kind = event.get("type", "")
    obj = event.get("object") or {}
    if kind == "ERROR":
        code = int(obj.get("code") or 500)
        raise error_from_code(
            code, f"{what}: {obj.get('message', '')}", reason=str(obj.get("reason") or ""), body=obj
        )
    return WatchEvent(kind, obj)


def _metadata_patch(
    annotations: Mapping[str, str | None] | None,
    labels: Mapping[str, str | None] | None,
    resource_version: str | None,
    uid: str | None = None,
) -> JSON:
    meta: JSON = {}
    if uid is not None:
        meta["uid"] = uid
    if annotations is not None:
        meta["annotations"] = dict(annotations)
    if labels is not None:
        meta["labels"] = dict(labels)
    if resource_version is not None:
        meta["resourceVersion"] = resource_version
    if not meta:
        raise ValueError("a metadata patch needs annotations, labels or a resource_version")
    return {"metadata": meta}


class KubeClient:
    """A kubernetes-asyncio ``ApiClient`` speaking raw JSON dicts, every call with a deadline."""

    def __init__(self, api_client: ApiClient, *, request_timeout: float = 10.0) -> None:
        if request_timeout <= 0:
            raise ValueError(f"request_timeout must be positive, got {request_timeout}")
        self.api_client = api_client
        self.request_timeout = request_timeout

    @property
    def host(self) -> str:
        """The API server base URL."""
        return str(self.api_client.configuration.host)

    async def close(self) -> None:
        """Close the underlying HTTP session."""
        await self.api_client.close()

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- transport --------------------------------------------------------------------------

    async def _send(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None,
        body: Any,
        content_type: str | None,
        request_timeout: float | aiohttp.ClientTimeout,
    ) -> aiohttp.ClientResponse:
        headers = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        params = [(k, v) for k, v in (query or {}).items() if v is not None]
        response: aiohttp.ClientResponse = await self.api_client.call_api(
            path,
            method,
            query_params=params,
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
            _preload_content=False,
            _request_timeout=request_timeout,
        )
        return response

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str | None = None,
        timeout: float | None = None,
    ) -> JSON:
        """Send one request and return the decoded JSON answer; raise a typed error otherwise."""
        deadline = timeout if timeout is not None else self.request_timeout
        what = f"{method} {path}"
        try:
            async with asyncio.timeout(deadline):
                response = await self._send(
                    method,
                    path,
                    query=query,
                    body=body,
                    content_type=content_type,
                    request_timeout=deadline,
                )
                try:
                    data = await response.read()
                finally:
                    response.release()
        except TimeoutError as exc:
            raise Timeout(f"{what}: no answer within {deadline:g}s") from exc
        except aiohttp.ClientError as exc:
            raise KubeError(f"{what}: {type(exc).__name__}: {exc}") from exc
        except ApiException as exc:
            raise error_from_code(exc.status or 0, f"{what}: {exc.reason}") from exc
        if not 200 <= response.status <= 299:
            raise error_from_status(response.status, data, what)
        try:
            decoded = json.loads(data) if data else {}
        except ValueError as exc:
            raise KubeError(f"{what}: answer is not JSON: {data[:200]!r}", status=response.status) from exc
        if not isinstance(decoded, dict):
            raise KubeError(f"{what}: answer is not a JSON object", status=response.status)
        return decoded

    # -- generic verbs ----------------------------------------------------------------------

    async def get(
        self, resource: Resource, name: str, namespace: str | None = None, *, timeout: float | None = None
    ) -> JSON:
        """GET one object."""
        return await self.request("GET", resource.item(name, namespace), timeout=timeout)

    async def list_objects(
        self,
        resource: Resource,
        namespace: str | None = None,
        *,
        field_selector: str | None = None,
        label_selector: str | None = None,
        page_size: int | None = None,
        timeout: float | None = None,
    ) -> tuple[list[JSON], str]:
        """List objects (following ``continue`` pages); returns ``(items, resourceVersion)``.

        Items get ``kind``/``apiVersion`` filled in (list items omit them on the wire).
        """
        items: list[JSON] = []
        resource_version = ""
        async for page, version in self.list_pages(
            resource,
            namespace,
            field_selector=field_selector,
            label_selector=label_selector,
            page_size=page_size,
            timeout=timeout,
        ):
            items.extend(page)
            resource_version = version
        return items, resource_version

    async def list_pages(
        self,
        resource: Resource,
        namespace: str | None = None,
        *,
        field_selector: str | None = None,
        label_selector: str | None = None,
        page_size: int | None = None,
        timeout: float | None = None,
    ) -> AsyncGenerator[tuple[list[JSON], str]]:
        """Each page of a list as it arrives, with the list's resourceVersion: a caller that keeps
        less than whole objects (a trimmed cache record) holds one page of them at a time, not a
        whole list of 10,000 pods with their managed fields and specs."""
        resource_version = ""
        continue_token: str | None = None
        path = resource.collection(namespace)
        while True:
            query = {
                "fieldSelector": field_selector or None,
                "labelSelector": label_selector or None,
                "limit": page_size,
                "continue": continue_token,
            }
            answer = await self.request("GET", path, query=query, timeout=timeout)
            if not resource_version:
                resource_version = objects.resource_version(answer)
            page = list(answer.get("items") or ())
            for item in page:
                item.setdefault("kind", resource.kind)
                item.setdefault("apiVersion", resource.api_version)
            continue_token = objects.metadata(answer).get("continue") or None
            del answer
            yield page, resource_version
            del page  # the caller has what it keeps of it: not alive beside the next page
            if not continue_token:
                return

    async def watch(
        self,
        resource: Resource,
        namespace: str | None = None,
        *,
        resource_version: str,
        field_selector: str | None = None,
        label_selector: str | None = None,
        timeout_seconds: int = 300,
    ) -> AsyncGenerator[WatchEvent]:
        """Stream watch events from ``resource_version``; ends when the server closes the stream.

        A ``410 Gone`` (as an HTTP answer or an ERROR event) raises :class:`~hamid.kube.errors.Gone`.
        A stalled stream (no byte for ``timeout_seconds`` + the request timeout) raises ``Timeout``.
        """
        path = resource.collection(namespace)
        query = {
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_seconds),
            "fieldSelector": field_selector or None,
            "labelSelector": label_selector or None,
        }
        what = f"watch {path}"
        response = await self._open_stream(path, query, timeout_seconds, what)
        try:
            if not 200 <= response.status <= 299:
                raise error_from_status(response.status, await response.read(), what)
            async for line in response.content:
                if line.strip():
                    yield _watch_event(line, what)
        except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
            raise Timeout(f"{what}: stream stalled") from exc
        except aiohttp.ClientError as exc:
            raise KubeError(f"{what}: stream broke: {type(exc).__name__}: {exc}") from exc
        except ValueError as exc:
            raise KubeError(f"{what}: undecodable watch line: {exc}") from exc
        finally:
            response.close()

    async def _open_stream(
        self, path: str, query: Mapping[str, str | None], timeout_seconds: int, what: str
    ) -> aiohttp.ClientResponse:
        """Send a watch GET: headers within ``request_timeout``, then no byte-gap over the window."""
        stream_timeout = aiohttp.ClientTimeout(
            total=None,
            connect=self.request_timeout,
            sock_connect=self.request_timeout,
            sock_read=timeout_seconds + self.request_timeout,
        )
        try:
            async with asyncio.timeout(self.request_timeout):
                return await self._send(
                    "GET", path, query=query, body=None, content_type=None, request_timeout=stream_timeout
                )
        except TimeoutError as exc:
            raise Timeout(f"{what}: no answer within {self.request_timeout:g}s") from exc
        except aiohttp.ClientError as exc:
            raise KubeError(f"{what}: {type(exc).__name__}: {exc}") from exc

    async def create(
        self,
        resource: Resource,
        obj: Mapping[str, Any],
        namespace: str | None = None,
        *,
        timeout: float | None = None,
    ) -> JSON:
        """POST a new object (namespace taken from ``obj`` when not given)."""
        ns = namespace or objects.namespace(obj) or None
        if resource.namespaced and not ns:
            ns = "default"
        body = dict(obj)
        body.setdefault("apiVersion", resource.api_version)
        body.setdefault("kind", resource.kind)
        return await self.request("POST", resource.collection(ns), body=body, timeout=timeout)

    async def replace(
        self,
        resource: Resource,
        name: str,
        obj: Mapping[str, Any],
        namespace: str | None = None,
        *,
        timeout: float | None = None,
    ) -> JSON:
        """PUT an object; its ``metadata.resourceVersion`` (if any) is the precondition."""
        body = dict(obj)
        body.setdefault("apiVersion", resource.api_version)
        body.setdefault("kind", resource.kind)
        return await self.request("PUT", resource.item(name, namespace), body=body, timeout=timeout)

    async def patch(
        self,
        resource: Resource,
        name: str,
        patch: Any,
        namespace: str | None = None,
        *,
        subresource: str | None = None,
        content_type: str = MERGE_PATCH,
        timeout: float | None = None,
    ) -> JSON:
        """PATCH an object (merge patch by default)."""
        path = resource.item(name, namespace, subresource)
        return await self.request("PATCH", path, body=patch, content_type=content_type, timeout=timeout)

    async def delete(
        self,
        resource: Resource,
        name: str,
        namespace: str | None = None,
        *,
        grace_period_seconds: int | None = None,
        uid: str | None = None,
        timeout: float | None = None,
    ) -> JSON:
        """DELETE an object, optionally only if its UID still matches."""
        body: JSON = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if grace_period_seconds is not None:
            body["gracePeriodSeconds"] = grace_period_seconds
        if uid is not None:
            body["preconditions"] = {"uid": uid}
        return await self.request("DELETE", resource.item(name, namespace), body=body, timeout=timeout)

    # -- pods -------------------------------------------------------------------------------

    async def get_pod(self, namespace: str, name: str, *, timeout: float | None = None) -> JSON:
        """GET a pod."""
        return await self.get(PODS, name, namespace, timeout=timeout)

    async def list_pods(
        self,
        namespace: str | None = None,
        field_selector: str | None = None,
        label_selector: str | None = None,
        *,
        timeout: float | None = None,
    ) -> tuple[list[JSON], str]:
        """List pods (all namespaces when ``namespace`` is None): ``(items, resourceVersion)``."""
        return await self.list_objects(
            PODS, namespace, field_selector=field_selector, label_selector=label_selector, timeout=timeout
        )

    async def create_pod(self, pod: Mapping[str, Any], *, timeout: float | None = None) -> JSON:
        """Create a pod in ``metadata.namespace`` (``default`` when unset)."""
        return await self.create(PODS, pod, timeout=timeout)

    async def delete_pod(
        self,
        namespace: str,
        name: str,
        *,
        grace_period_seconds: int | None = None,
        uid: str | None = None,
        timeout: float | None = None,
    ) -> JSON:
        """Delete a pod (optionally only if ``uid`` matches)."""
        return await self.delete(
            PODS, name, namespace, grace_period_seconds=grace_period_seconds, uid=uid, timeout=timeout
        )

    async def patch_pod_metadata(
        self,
        namespace: str,
        name: str,
        *,
        annotations: Mapping[str, str | None] | None = None,
        labels: Mapping[str, str | None] | None = None,
        resource_version: str | None = None,
        uid: str | None = None,
        timeout: float | None = None,
    ) -> JSON:
        """Merge-patch a pod's annotations/labels (``None`` deletes a key).

        With ``resource_version`` the patch only applies to that version, with ``uid`` only to the
        pod of that UID (not a pod re-created with the same name); either mismatch raises
        :class:`~hamid.kube.errors.Conflict` and nothing is written.
        """
        body = _metadata_patch(annotations, labels, resource_version, uid)
        return await self.patch(PODS, name, body, namespace, timeout=timeout)

    async def patch_pod_status(
        self,
        namespace: str,
        name: str,
        status: Mapping[str, Any],
        *,
        strategic: bool = False,
        uid: str | None = None,
        timeout: float | None = None,
    ) -> JSON:
        """Patch ``pods/<name>/status`` with ``{"status": status}``.

        A merge patch replaces lists whole; ``strategic`` merges ``conditions`` by type, keeping the
        conditions other writers own (as kubelet and kube-scheduler patch them). With ``uid`` only
        the pod of that UID is patched (:class:`~hamid.kube.errors.Conflict` otherwise).
        """
        body: JSON = {"status": dict(status)}
        if uid is not None:
            body["metadata"] = {"uid": uid}
        content_type = STRATEGIC_MERGE_PATCH if strategic else MERGE_PATCH
        return await self.patch(
            PODS, name, body, namespace, subresource="status", content_type=content_type, timeout=timeout
        )

    async def bind_pod(
        self, namespace: str, name: str, uid: str, node: str, *, timeout: float | None = None
    ) -> None:
        """POST a ``Binding`` of the pod (checked against ``uid``) to ``node``."""
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        await self.request("POST", PODS.item(name, namespace, "binding"), body=binding, timeout=timeout)

    # -- nodes ------------------------------------------------------------------------------

    async def get_node(self, name: str, *, timeout: float | None = None) -> JSON:
        """GET a node."""
        return await self.get(NODES, name, timeout=timeout)

    async def list_nodes(
        self,
        field_selector: str | None = None,
        label_selector: str | None = None,
        *,
        timeout: float | None = None,
    ) -> tuple[list[JSON], str]:
        """List nodes: ``(items, resourceVersion)``."""
        return await self.list_objects(
            NODES, field_selector=field_selector, label_selector=label_selector, timeout=timeout
        )

    async def create_node(self, node: Mapping[str, Any], *, timeout: float | None = None) -> JSON:
        """Create a node."""
        return await self.create(NODES, node, timeout=timeout)

    async def patch_node_metadata(
        self,
        name: str,
        *,
        annotations: Mapping[str, str | None] | None = None,
        labels: Mapping[str, str | None] | None = None,
        resource_version: str | None = None,
        timeout: float | None = None,
    ) -> JSON:
        """Merge-patch a node's annotations/labels (``None`` deletes a key), like ``patch_pod_metadata``."""
        body = _metadata_patch(annotations, labels, resource_version)
        return await self.patch(NODES, name, body, timeout=timeout)

    async def patch_node_status(
        self, name: str, status: Mapping[str, Any], *, timeout: float | None = None
    ) -> JSON:
        """Merge-patch ``nodes/<name>/status`` with ``{"status": status}``."""
        return await self.patch(NODES, name, {"status": dict(status)}, subresource="status", timeout=timeout)

    # -- namespaces, quotas, token reviews --------------------------------------------------

    async def list_resource_quotas(
        self, namespace: str | None = None, *, timeout: float | None = None
    ) -> tuple[list[JSON], str]:
        """List ResourceQuotas: ``(items, resourceVersion)``."""
        return await self.list_objects(RESOURCE_QUOTAS, namespace, timeout=timeout)

    async def create_token_review(
        self, token: str, audiences: list[str] | None = None, *, timeout: float | None = None
    ) -> JSON:
        """POST a TokenReview and return the answered object (its ``status`` says who the token is)."""
        spec: JSON = {"token": token}
        if audiences:
            spec["audiences"] = list(audiences)
        return await self.create(TOKEN_REVIEWS, {"spec": spec}, timeout=timeout)

    # -- leases -----------------------------------------------------------------------------

    async def get_lease(self, namespace: str, name: str, *, timeout: float | None = None) -> JSON:
        """GET a coordination.k8s.io/v1 Lease."""
        return await self.get(LEASES, name, namespace, timeout=timeout)

    async def create_lease(
        self, namespace: str, lease: Mapping[str, Any], *, timeout: float | None = None
    ) -> JSON:
        """Create a Lease (``AlreadyExists`` if another replica was first)."""
        return await self.create(LEASES, lease, namespace, timeout=timeout)

    async def replace_lease(
        self, namespace: str, name: str, lease: Mapping[str, Any], *, timeout: float | None = None
    ) -> JSON:
        """PUT a Lease; its ``metadata.resourceVersion`` makes a concurrent update a ``Conflict``."""
        return await self.replace(LEASES, name, lease, namespace, timeout=timeout)

    # -- events -----------------------------------------------------------------------------

    async def create_event(
        self, namespace: str, event: Mapping[str, Any], *, timeout: float | None = None
    ) -> JSON:
        """Create a core/v1 Event."""
        return await self.create(EVENTS, event, namespace, timeout=timeout)

    async def patch_event(
        self, namespace: str, name: str, patch: Mapping[str, Any], *, timeout: float | None = None
    ) -> JSON:
        """Merge-patch a core/v1 Event (used to aggregate repeats)."""
        return await self.patch(EVENTS, name, dict(patch), namespace, timeout=timeout)


async def connect(
    api_server: str | None = None,
    kubeconfig: str | None = None,
    *,
    request_timeout: float = 10.0,
    context: str | None = None,
) -> KubeClient:
    """Build a :class:`KubeClient`.

    ``api_server`` alone: a plain URL, no authentication (the embedded API server). Otherwise
    ``kubeconfig`` (or ``$KUBECONFIG``) with its ``context`` (default: its current context), then
    the in-cluster service account; with both, the kubeconfig supplies credentials and
    ``api_server`` overrides its server URL.
    Raises :class:`KubeError` with every reason when no configuration works.
    """
    configuration = Configuration()
    source = ""
    kubeconfig = kubeconfig or os.environ.get("KUBECONFIG") or None
    if context and not kubeconfig:
        raise KubeError(f"--context {context!r} names a kubeconfig context, but no kubeconfig is given")
    if api_server and not kubeconfig:
        if not api_server.startswith(("http://", "https://")):
            raise KubeError(f"--api-server must be an http:// or https:// URL, got {api_server!r}")
        source = "api-server URL"
    elif kubeconfig:
        problems, contexts, current = await asyncio.to_thread(_read_kubeconfigs, kubeconfig)
        if problems:
            raise KubeError(f"kubeconfig {'; '.join(problems)} (--kubeconfig or KUBECONFIG)")
        if context and context not in contexts:
            known = ", ".join(contexts) or "none"
            raise KubeError(f"context {context!r} is not in kubeconfig {kubeconfig} (its contexts: {known})")
        # kubectl's current context of a list is the first file's that sets one (the library's, the last's)
        context = context or current or None
        try:
            await load_kube_config(
                config_file=kubeconfig, context=context, client_configuration=configuration
            )
        except Exception as exc:  # the library's errors are untyped: AttributeError for a bad shape, ...
            raise KubeError(f"cannot load kubeconfig {kubeconfig!r}: {_reason(exc)}") from exc
        source = f"kubeconfig {kubeconfig}" + (f", context {context}" if context else "")
    else:
        try:
            load_incluster_config(client_configuration=configuration)
        except ConfigException as exc:
            raise KubeError(
                "no Kubernetes configuration: pass --api-server URL or --kubeconfig PATH "
                f"(or set KUBECONFIG), or run in a pod with a service account ({exc})"
            ) from exc
        source = "in-cluster service account"
    if api_server:
        configuration.host = api_server
    configuration.host = str(configuration.host or "").rstrip("/")
    _resolve_proxy(configuration)
    try:
        api_client = ApiClient(configuration)  # reads the certificates: ssl.SSLError on bad ones
    except Exception as exc:
        raise KubeError(f"cannot use the credentials of {source}: {_reason(exc)}") from exc
    _without_env_lookups(api_client)
    log.info("kube_client_configured", source=source, host=configuration.host, proxy=configuration.proxy)
    return KubeClient(api_client, request_timeout=request_timeout)


def _reason(exc: Exception) -> str:
    """One line on why a configuration failed (the exception's text, or its type when it has none)."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300]}" if text else type(exc).__name__


def _read_kubeconfigs(paths: str) -> tuple[list[str], list[str], str]:
    """Read a ``KUBECONFIG``-style list as kubectl does before the library does: what is wrong
    with its files (not a file, not YAML, not a kubeconfig's shape: the library only warns, or
    fails in Python's own words), the context names in order, and the current context (the first
    file's that sets one). A missing file is skipped in a list of several (kubectl's rule), an
    error alone."""
    files = [p for p in paths.split(os.pathsep) if p]
    problems: list[str] = []
    contexts: list[str] = []
    current = ""
    for path in files:
        if os.path.isdir(path):
            problems.append(f"{path} is a directory, not a kubeconfig file")
            continue
        if not os.path.isfile(path):
            if len(files) == 1:
                problems.append(f"{path} does not exist")
            continue
        try:
            with open(path, "rb") as f:
                doc = load_yaml(f.read().decode("utf-8"), path)
        except (OSError, UnicodeDecodeError, InvalidInput) as exc:
            problems.append(str(exc))
            continue
        shape = _kubeconfig_shape(doc)
        if shape:
            problems.append(f"{path} is not a kubeconfig: {shape}")
            continue
        doc = doc or {}
        contexts.extend(
            str(c.get("name")) for c in doc.get("contexts") or [] if str(c.get("name")) not in contexts
        )
        current = current or str(doc.get("current-context") or "")
    if files and not problems and not any(os.path.isfile(p) for p in files):
        problems.append(f"none of {', '.join(files)} exists")
    return problems, contexts, current


def _kubeconfig_shape(doc: object) -> str:
    """Why ``doc`` is not shaped as a kubeconfig ("" when it is, as far as hamid reads it)."""
    if doc is None:
        return "the file is empty"
    if not isinstance(doc, dict):
        return f"a YAML mapping with clusters, contexts and users is expected, not {type(doc).__name__}"
    for section, inner in (("clusters", "cluster"), ("contexts", "context"), ("users", "user")):
        entries = doc.get(section)
        if entries is None:
            continue
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            return f"{section} is not a list of mappings"
        for entry in entries:
            body = entry.get(inner)
            if body is not None and not isinstance(body, dict):
                return f"{section}[].{inner} of {entry.get('name')!r} is not a mapping"
            server = (body or {}).get("server") if section == "clusters" else None
            if server is not None and not isinstance(server, str):
                return f"the server of cluster {entry.get('name')!r} is not a URL string"
    return ""


def _resolve_proxy(configuration: Configuration) -> None:
    """Resolve the proxy environment (HTTPS_PROXY, NO_PROXY, ...) once, for the API server host."""
    if configuration.proxy:
        return
    url = urllib.parse.urlsplit(str(configuration.host))
    proxies = urllib.request.getproxies()
    proxy = proxies.get(url.scheme)
    if proxy and url.hostname and not urllib.request.proxy_bypass(url.hostname):
        configuration.proxy = proxy


def _without_env_lookups(api_client: ApiClient) -> None:
    """Swap kubernetes-asyncio's ``trust_env`` session for one that skips per-request env lookups.

    With ``trust_env=True`` aiohttp consults ``.netrc`` and the proxy environment in a worker
    thread on every request (two thread hops per call); the proxy is resolved once at connect
    time instead (:func:`_resolve_proxy`), and credentials come from the kube configuration.
    """
    rest = api_client.rest_client
    connector = rest.pool_manager.connector
    rest.pool_manager.detach()
    rest.pool_manager = aiohttp.ClientSession(connector=connector, trust_env=False, read_bufsize=2**21)
