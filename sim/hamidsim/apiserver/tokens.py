"""Bearer tokens the embedded API server knows, and its TokenReview answers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hamid.kube.tokens import NODE_NAME_EXTRA, NODE_UID_EXTRA, POD_NAME_EXTRA, POD_UID_EXTRA
from hamidsim.apiserver.errors import ApiError, bad_request

TOKEN_REVIEW = "authentication.k8s.io/v1"
#: Who a request without credentials is (a real server with anonymous requests enabled).
ANONYMOUS: dict[str, Any] = {"username": "system:anonymous", "groups": ["system:unauthenticated"]}


@dataclass(frozen=True)
class TokenIdentity:
    """Who a registered bearer token authenticates as (the TokenReview ``status.user``)."""

    username: str
    uid: str = ""
    groups: tuple[str, ...] = ("system:authenticated",)
    extra: Mapping[str, tuple[str, ...]] | None = None
    #: Audiences the token is valid for; ``None`` accepts any requested audience.
    audiences: tuple[str, ...] | None = None

    def user_json(self) -> dict[str, Any]:
        """``UserInfo`` as a TokenReview status carries it."""
        user: dict[str, Any] = {"username": self.username, "groups": list(self.groups)}
        if self.uid:
            user["uid"] = self.uid
        if self.extra:
            user["extra"] = {k: list(v) for k, v in self.extra.items()}
        return user


class TokenRegistry:
    """Tokens registered by tests or the admin endpoint; TokenReview authenticates only these."""

    def __init__(self) -> None:
        self._by_token: dict[str, TokenIdentity] = {}

    def register(
        self,
        token: str,
        username: str,
        *,
        uid: str = "",
        groups: Sequence[str] = ("system:authenticated",),
        extra: Mapping[str, str | Sequence[str]] | None = None,
        audiences: Sequence[str] | None = None,
    ) -> TokenIdentity:
        """Make TokenReview authenticate ``token`` as this user (``extra`` values: a string or a list)."""
        if not token:
            raise ValueError("a token must not be empty")
        normalized = {k: (v,) if isinstance(v, str) else tuple(v) for k, v in (extra or {}).items()}
        identity = TokenIdentity(
            username,
            uid,
            tuple(groups),
            normalized or None,
            tuple(audiences) if audiences is not None else None,
        )
        self._by_token[token] = identity
        return identity

    def register_pod(
        self,
        token: str,
        *,
        namespace: str,
        pod_name: str,
        pod_uid: str,
        service_account: str = "default",
        service_account_uid: str = "",
        node_name: str | None = None,
        node_uid: str | None = None,
        audiences: Sequence[str] | None = None,
    ) -> TokenIdentity:
        """Register a projected service-account token bound to a pod, as the real server reports it."""
        extra: dict[str, str] = {POD_NAME_EXTRA: pod_name, POD_UID_EXTRA: pod_uid}
        if node_name:
            extra[NODE_NAME_EXTRA] = node_name
        if node_uid:
            extra[NODE_UID_EXTRA] = node_uid
        return self.register(
            token,
            f"system:serviceaccount:{namespace}:{service_account}",
            uid=service_account_uid,
            groups=("system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"),
            extra=extra,
            audiences=audiences,
        )

    def authenticate(self, authorization: str | None) -> dict[str, Any]:
        """The ``userInfo`` of a request's ``Authorization`` header, as a real server's authenticator
        gives it to admission: none is ``system:anonymous``; a bearer token this registry does not
        know (or another scheme) is a 401. (The embedded server authorizes every user.)"""
        if not authorization:
            return dict(ANONYMOUS)
        scheme, _, token = authorization.partition(" ")
        identity = self._by_token.get(token.strip()) if scheme.lower() == "bearer" else None
        if identity is None:
            raise ApiError(401, "Unauthorized")
        return identity.user_json()

    def revoke(self, token: str) -> None:
        """Forget a token (TokenReview then answers ``authenticated: false``)."""
        self._by_token.pop(token, None)

    def review(self, body: Any) -> dict[str, Any]:
        """Answer a TokenReview request body (raises 400/422 for a malformed one)."""
        if not isinstance(body, dict) or not isinstance(body.get("spec"), dict):
            raise bad_request("a TokenReview needs a spec")
        spec = body["spec"]
        token = spec.get("token")
        wanted = spec.get("audiences") or []
        if not isinstance(token, str) or not token:
            raise ApiError(422, 'TokenReview.authentication.k8s.io "" is invalid: spec.token: Required value')
        if not isinstance(wanted, list) or not all(isinstance(a, str) for a in wanted):
            raise bad_request("spec.audiences must be a list of strings")
        identity = self._by_token.get(token)
        status: dict[str, Any]
        if identity is None:
            status = {"authenticated": False, "user": {}, "error": "invalid bearer token"}
        else:
            audiences = list(identity.audiences) if identity.audiences is not None else list(wanted)
            if wanted and identity.audiences is not None:
                audiences = [a for a in wanted if a in identity.audiences]
            if wanted and not audiences:
                status = {
                    "authenticated": False,
                    "user": {},
                    "error": f"token audiences {list(identity.audiences or [])} is invalid "
                    f"for the target audiences {wanted}",
                }
            else:
                status = {"authenticated": True, "user": identity.user_json(), "audiences": audiences}
        review = {
            "kind": "TokenReview",
            "apiVersion": TOKEN_REVIEW,
            "metadata": {"creationTimestamp": None},
            "spec": spec,
            "status": status,
        }
        return review
