"""SubjectAccessReview answers of the embedded API server, from rules registered by tests.

The server itself authorizes nothing (every request is allowed); it only answers
SubjectAccessReviews — the question a component such as kube-rbac-proxy or
``hamid scheduler --metrics-auth`` asks on behalf of its own callers. RBAC's rules for
non-resource URLs are followed: a rule names users and/or groups, verbs (``*`` for all) and paths,
where a path ending in ``*`` matches every path it prefixes. Resource attributes are answered
"not allowed" (no rule here grants resources).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hamidsim.apiserver.errors import ApiError, bad_request

SUBJECT_ACCESS_REVIEW = "authorization.k8s.io/v1"


@dataclass(frozen=True)
class AccessRule:
    """``verbs`` on non-resource ``paths`` granted to ``users`` and members of ``groups``."""

    users: tuple[str, ...]
    groups: tuple[str, ...]
    verbs: tuple[str, ...]
    paths: tuple[str, ...]

    def allows(self, user: str, groups: Sequence[str], verb: str, path: str) -> bool:
        """Whether the rule grants ``verb`` on ``path`` to the user (RBAC's non-resource matching)."""
        subject = user in self.users or any(g in self.groups for g in groups)
        verb_ok = "*" in self.verbs or verb in self.verbs
        path_ok = any(p == path or (p.endswith("*") and path.startswith(p[:-1])) for p in self.paths)
        return subject and verb_ok and path_ok


class AccessRules:
    """Rules registered by tests or the cluster harness; SubjectAccessReview reads only these."""

    def __init__(self) -> None:
        self._rules: list[AccessRule] = []

    def grant(
        self,
        *,
        users: Sequence[str] = (),
        groups: Sequence[str] = (),
        verbs: Sequence[str] = ("get",),
        paths: Sequence[str],
    ) -> AccessRule:
        """Allow ``verbs`` on non-resource ``paths`` for ``users`` and ``groups``."""
        if not users and not groups:
            raise ValueError("a rule needs at least one user or group")
        if not paths or not all(isinstance(p, str) and (p.startswith("/") or p == "*") for p in paths):
            raise ValueError("non-resource paths start with '/' (or are '*')")
        rule = AccessRule(tuple(users), tuple(groups), tuple(verbs), tuple(paths))
        self._rules.append(rule)
        return rule

    def clear(self) -> None:
        """Forget every rule (every review then answers not allowed)."""
        self._rules.clear()

    def review(self, body: Any) -> dict[str, Any]:
        """Answer a SubjectAccessReview request body (400/422 for a malformed one)."""
        if not isinstance(body, dict) or not isinstance(body.get("spec"), dict):
            raise bad_request("a SubjectAccessReview needs a spec")
        spec = body["spec"]
        user, groups = spec.get("user") or "", spec.get("groups") or []
        if (
            not isinstance(user, str)
            or not isinstance(groups, list)
            or not all(isinstance(g, str) for g in groups)
        ):
            raise bad_request("spec.user must be a string and spec.groups a list of strings")
        if not user and not groups:
            raise ApiError(
                422,
                'SubjectAccessReview.authorization.k8s.io "" is invalid: spec.user: Invalid value: "": '
                "at least one of user or group must be specified",
            )
        attributes = spec.get("nonResourceAttributes")
        if spec.get("resourceAttributes") is not None and attributes is None:
            status = {"allowed": False, "reason": "the embedded API server grants no resources"}
        elif not isinstance(attributes, dict):
            raise ApiError(
                422,
                'SubjectAccessReview.authorization.k8s.io "" is invalid: spec.resourceAttributes: '
                "Invalid value: null: exactly one of nonResourceAttributes or resourceAttributes must be "
                "specified",
            )
        else:
            path, verb = str(attributes.get("path") or ""), str(attributes.get("verb") or "")
            allowed = any(r.allows(user, groups, verb, path) for r in self._rules)
            status = {"allowed": allowed}
            if not allowed:
                status["reason"] = f"no rule allows {verb} on {path}"
        return {
            "kind": "SubjectAccessReview",
            "apiVersion": SUBJECT_ACCESS_REVIEW,
            "metadata": {"creationTimestamp": None},
            "spec": spec,
            "status": status,
        }
