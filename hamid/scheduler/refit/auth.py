"""Who is calling ``POST /refit``: mTLS client certificates and bound ServiceAccount tokens.

A caller is accepted only when it proves a node identity equal to the request's ``nodeName``:

* ``mtls``: a client certificate verified against ``--client-ca-file`` during the TLS handshake
  with Kubernetes' node identity: subject CN ``system:node:<node>`` **and** ``O=system:nodes``, as
  kubelet's client certificates carry and the Node authorizer requires. A bare CN ``<node>`` is
  refused: with the cluster CA as client CA, any user whose name equals a node name has one. So is
  a subject with several CNs (Kubernetes reads the last, so node n2 can get one approved whose
  first CN names n1) or several ``O`` (kubelet's client certificate signer allows exactly one);
* ``token``: ``Authorization: Bearer <token>`` (TLS only), checked with a TokenReview for the
  audience ``--refit-token-audience`` (default ``hamid-refit``; the review must list it): the user is
  ``system:serviceaccount:<device-plugin-namespace>:<device-plugin-service-account>``, the token is
  bound to a pod (``authentication.kubernetes.io/pod-name``/``pod-uid``), that pod still exists in
  the device-plugin namespace with that UID and runs on ``<node>`` (upstream #2882's checks and
  messages). Mixed fleets: an upstream HAMi plugin sends its pod's default token (the API server's
  audience); ``--refit-hami-plugin-service-account <namespace>/<name>`` accepts such a token, when
  the ``hamid-refit`` review refuses it, from that ServiceAccount only, with the same pod checks.

A presented certificate decides on its own (a wrong-node certificate is refused even with a token).
With no method usable the authenticator refuses every request with a reason that says how to fix it.
Every refusal names what failed (:class:`AuthFailure`: audience, user, node, ...) in its message
and in :attr:`AuthError.kind`, which the handler logs.
"""

from __future__ import annotations

import asyncio
import enum
import ssl
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import web

from hamid.kube.client import KubeClient
from hamid.kube.errors import KubeError, NotFound
from hamid.kube.tokens import POD_NAME_EXTRA, POD_UID_EXTRA
from hamid.log import get_logger
from hamid.model import objects
from hamid.model.refit import REFIT_TIMEOUT_S
from hamid.tls import peer_subject_values

log = get_logger("scheduler.refit_auth")

MTLS = "mtls"
TOKEN = "token"
METHODS = (MTLS, TOKEN)
#: Kubernetes' node identity prefix in certificate subjects (``system:node:<nodeName>``).
NODE_CN_PREFIX = "system:node:"
#: Kubernetes' group of nodes: the ``O`` of every kubelet client certificate.
NODE_ORGANIZATION = "system:nodes"
#: Upper bound of the TokenReview plus the caller-pod lookup: the plugin's whole refit budget.
AUTH_TIMEOUT_S = REFIT_TIMEOUT_S
#: ``--refit-token-audience``: the audience of the token the plugin sends to ``/refit``. A token
#: for this audience only is useless against the API server (unlike the pod's default token).
DEFAULT_TOKEN_AUDIENCE = "hamid-refit"
_BEARER = "Bearer "


class Authenticator(Protocol):
    """What the ``/refit`` handler asks of caller authentication (:class:`RefitAuthenticator` is one)."""

    async def authenticate(self, request: web.Request, node_name: str) -> Caller: ...


class AuthFailure(enum.StrEnum):
    """What a refused caller got wrong (logged with the refusal)."""

    NOT_CONFIGURED = "not_configured"
    CREDENTIALS = "credentials"  #: none presented, or a token over plain HTTP
    CERTIFICATE = "certificate"  #: the certificate is no node identity
    AUDIENCE = "audience"  #: the token is not issued for the refit audience
    TOKEN = "token"  #: the token is not authenticated, or not bound to a pod
    USER = "user"  #: the token's user is not the device-plugin ServiceAccount
    POD = "pod"  #: the token's bound pod is gone or replaced
    NODE = "node"  #: the caller speaks for another node
    UNAVAILABLE = "unavailable"  #: TokenReview or the pod lookup failed or timed out


class AuthError(Exception):
    """The caller could not be authenticated; the message says why (it never contains the token)."""

    def __init__(self, message: str, kind: AuthFailure = AuthFailure.CREDENTIALS) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True, slots=True)
class ServiceAccount:
    """A ServiceAccount whose bound tokens may call ``/refit``."""

    namespace: str
    name: str

    @property
    def username(self) -> str:
        """The user its tokens authenticate as."""
        return f"system:serviceaccount:{self.namespace}:{self.name}"

    @classmethod
    def parse(cls, value: str) -> ServiceAccount | None:
        """``<namespace>/<name>`` (``""``: None); ValueError for any other form."""
        value = value.strip()
        if not value:
            return None
        namespace, sep, name = value.partition("/")
        if not sep or not namespace or not name or "/" in name or ":" in value:
            raise ValueError(f"{value!r} is not <namespace>/<serviceaccount>")
        return cls(namespace, name)


@dataclass(frozen=True, slots=True)
class Caller:
    """An authenticated caller: the node it speaks for, the method and who it is."""

    node: str
    method: str
    identity: str


def bearer_token(header: str | None) -> str:
    """The token of an ``Authorization`` header with the exact ``Bearer `` scheme; "" otherwise."""
    if not header or not header.startswith(_BEARER):
        return ""
    return header[len(_BEARER) :].strip()


def node_of_common_name(cn: str) -> str:
    """The node a certificate CN names: ``system:node:<n>`` → ``<n>``, any other CN as is."""
    return cn[len(NODE_CN_PREFIX) :] if cn.startswith(NODE_CN_PREFIX) else cn


def peer_certificate(request: web.Request) -> dict[str, Any] | None:
    """The verified client certificate of the request's TLS connection (None: none or plain HTTP)."""
    transport = request.transport
    if transport is None:
        return None
    cert = transport.get_extra_info("peercert")
    if not cert:
        ssl_object = transport.get_extra_info("ssl_object")
        cert = ssl_object.getpeercert() if isinstance(ssl_object, ssl.SSLObject | ssl.SSLSocket) else None
    return cert or None


def is_tls(request: web.Request) -> bool:
    """Whether the request came over TLS."""
    transport = request.transport
    return transport is not None and transport.get_extra_info("ssl_object") is not None


def parse_methods(value: str | Iterable[str]) -> tuple[str, ...]:
    """``"mtls,token"`` (or an iterable) → the method tuple; ValueError naming unknown methods."""
    items = value.split(",") if isinstance(value, str) else list(value)
    methods = tuple(dict.fromkeys(m.strip().lower() for m in items if m.strip()))
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f"unknown refit auth method(s) {', '.join(unknown)}; use {', '.join(METHODS)}")
    return methods


def _extra(user: Mapping[str, Any], key: str) -> str:
    values = (user.get("extra") or {}).get(key)
    if isinstance(values, str):
        return values
    if isinstance(values, list) and len(values) == 1 and isinstance(values[0], str):
        return values[0]
    return ""


class RefitAuthenticator:
    """Checks ``/refit`` callers with the configured methods (see the module docstring)."""

    def __init__(
        self,
        methods: Iterable[str],
        *,
        kube: KubeClient | None = None,
        verifies_client_certs: bool = False,
        device_plugin_namespace: str = "",
        device_plugin_service_account: str = "",
        token_audience: str = DEFAULT_TOKEN_AUDIENCE,
        hami_plugin_service_account: ServiceAccount | None = None,
        timeout: float = AUTH_TIMEOUT_S,
    ) -> None:
        wanted = parse_methods(methods)
        usable: list[str] = []
        self.problems: list[str] = []
        if MTLS in wanted:
            if verifies_client_certs:
                usable.append(MTLS)
            else:
                self.problems.append("mtls needs --client-ca-file (and TLS on --listen)")
        if TOKEN in wanted:
            if kube is not None and device_plugin_namespace and device_plugin_service_account:
                usable.append(TOKEN)
            else:
                self.problems.append(
                    "token needs --device-plugin-namespace and --device-plugin-service-account"
                )
        self.methods: tuple[str, ...] = tuple(usable)
        self.kube = kube
        self.timeout = timeout
        self.audience = token_audience
        self.account = ServiceAccount(device_plugin_namespace, device_plugin_service_account)
        self.hami_account = hami_plugin_service_account
        for problem in self.problems:
            log.warning("refit_auth_method_unusable", problem=problem)
        if not self.methods:
            log.error("refit_auth_disabled", effect="/refit refuses every request", problems=self.problems)

    def not_configured_reason(self) -> str:
        """Why no caller can be accepted ("" when some method is usable)."""
        if self.methods:
            return ""
        detail = "; ".join(self.problems) or "--refit-auth is empty"
        return f"no caller authentication method is configured for /refit ({detail})"

    async def authenticate(self, request: web.Request, node_name: str) -> Caller:
        """The caller of ``request`` if it proves node ``node_name``; AuthError otherwise."""
        reason = self.not_configured_reason()
        if reason:
            raise AuthError(reason, AuthFailure.NOT_CONFIGURED)
        cert = peer_certificate(request) if MTLS in self.methods else None
        if cert is not None:
            return self._from_certificate(cert, node_name)
        token = bearer_token(request.headers.get("Authorization")) if TOKEN in self.methods else ""
        if token:
            if not is_tls(request):
                raise AuthError("bearer tokens are accepted only over TLS")
            return await self.check_token(token, node_name)
        raise AuthError("no caller credentials presented")

    def _from_certificate(self, cert: dict[str, Any], node_name: str) -> Caller:
        names = peer_subject_values(cert, "commonName")
        if not names:
            raise AuthError("client certificate has no subject common name", AuthFailure.CERTIFICATE)
        if len(names) > 1:
            raise AuthError(
                f"client certificate has {len(names)} subject common names ({', '.join(names)}); "
                "Kubernetes reads the last, so it names no single node",
                AuthFailure.CERTIFICATE,
            )
        (cn,) = names
        if not cn.startswith(NODE_CN_PREFIX):
            raise AuthError(
                f"client certificate {cn!r} is not a node identity (want CN {NODE_CN_PREFIX}<node>)",
                AuthFailure.CERTIFICATE,
            )
        organizations = peer_subject_values(cert, "organizationName")
        if len(organizations) > 1:
            raise AuthError(
                f"client certificate {cn!r} has {len(organizations)} O ({', '.join(organizations)}); "
                f"a node's has O={NODE_ORGANIZATION} only",
                AuthFailure.CERTIFICATE,
            )
        if NODE_ORGANIZATION not in organizations:
            raise AuthError(
                f"client certificate {cn!r} is not in O={NODE_ORGANIZATION} "
                f"(its O: {', '.join(organizations) or 'none'})",
                AuthFailure.CERTIFICATE,
            )
        node = node_of_common_name(cn)
        if node != node_name:
            raise AuthError(
                f"client certificate {cn!r} is for node {node!r}, not {node_name!r}", AuthFailure.NODE
            )
        return Caller(node=node, method=MTLS, identity=cn)

    async def check_token(self, token: str, node_name: str) -> Caller:
        """TokenReview + bound-pod checks (upstream #2882); AuthError with upstream's reasons."""
        assert self.kube is not None
        try:
            async with asyncio.timeout(self.timeout):
                return await self._check_token(self.kube, token, node_name)
        except TimeoutError:
            raise AuthError(
                f"caller authentication did not finish within {self.timeout:g}s", AuthFailure.UNAVAILABLE
            ) from None

    async def _review(self, kube: KubeClient, token: str, audience: str) -> Mapping[str, Any]:
        """The ``status.user`` of a TokenReview for ``audience`` ("" = the API server's own)."""
        try:
            review = await kube.create_token_review(
                token, [audience] if audience else None, timeout=self.timeout
            )
        except KubeError as exc:
            raise AuthError(
                f"token is not authenticated: TokenReview failed: {exc}", AuthFailure.UNAVAILABLE
            ) from exc
        status = review.get("status") or {}
        if not status.get("authenticated"):
            error = str(status.get("error") or "rejected")
            kind = AuthFailure.AUDIENCE if audience and "audience" in error else AuthFailure.TOKEN
            raise AuthError(f"token is not authenticated: {error}", kind)
        if audience and audience not in (status.get("audiences") or ()):
            raise AuthError(
                f"token is not authenticated: not issued for audience {audience!r}", AuthFailure.AUDIENCE
            )
        return status.get("user") or {}

    async def _token_user(self, kube: KubeClient, token: str) -> tuple[Mapping[str, Any], ServiceAccount]:
        """The token's user and the ServiceAccount it must be: hamid's plugins' for a token of the
        refit audience, else (when configured) HAMi plugins' for a token of the API server's."""
        try:
            return await self._review(kube, token, self.audience), self.account
        except AuthError as exc:
            refused = exc
        if refused.kind is AuthFailure.UNAVAILABLE or not self.audience:
            raise refused
        if self.hami_account is None:
            if refused.kind is AuthFailure.AUDIENCE:
                raise AuthError(
                    f"{refused} (an upstream HAMi plugin sends its pod's default token; accept those "
                    "with --refit-hami-plugin-service-account <namespace>/<serviceaccount>)",
                    refused.kind,
                )
            raise refused
        try:
            return await self._review(kube, token, ""), self.hami_account
        except AuthError as fallback:
            raise AuthError(
                f"{refused}; as a HAMi plugin's default token: {fallback}", refused.kind
            ) from None

    async def _check_token(self, kube: KubeClient, token: str, node_name: str) -> Caller:
        user, account = await self._token_user(kube, token)
        username = str(user.get("username") or "")
        if username != account.username:
            raise AuthError(
                f"caller {username!r} is not the device-plugin service account {account.username!r}",
                AuthFailure.USER,
            )
        pod_name, pod_uid = _extra(user, POD_NAME_EXTRA), _extra(user, POD_UID_EXTRA)
        if not pod_name or not pod_uid:
            raise AuthError("token is not a bound pod service account token", AuthFailure.TOKEN)
        key = f"{account.namespace}/{pod_name}"
        try:
            pod = await kube.get_pod(account.namespace, pod_name, timeout=self.timeout)
        except NotFound:
            raise AuthError(f"cannot look up caller pod {key}: not found", AuthFailure.POD) from None
        except KubeError as exc:
            raise AuthError(f"cannot look up caller pod {key}: {exc}", AuthFailure.UNAVAILABLE) from exc
        if objects.uid(pod) != pod_uid:
            raise AuthError(f"caller pod {key} no longer matches the token's bound UID", AuthFailure.POD)
        runs_on = str(objects.section(pod, "spec").get("nodeName") or "")
        if runs_on != node_name:
            raise AuthError(f"caller pod {key} runs on node {runs_on!r}, not {node_name!r}", AuthFailure.NODE)
        return Caller(node=runs_on, method=TOKEN, identity=f"{username} ({key})")
