"""SubjectAccessReview on the embedded API server: answers from registered non-resource rules."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from hamid.kube.client import connect
from hamid.kube.errors import KubeError
from hamid.scheduler.ui.access import SUBJECT_ACCESS_REVIEWS, subject_access_review
from hamidsim.apiserver import ApiServer
from tests.unit.deploy.helm_render import KUBE_VERSION


async def _review(server: ApiServer, body: dict[str, Any]) -> dict[str, Any]:
    kube = await connect(server.url)
    try:
        return await kube.create(SUBJECT_ACCESS_REVIEWS, body)
    finally:
        await kube.close()


@pytest.mark.parametrize(
    ("user", "path", "allowed"),
    [
        ({"username": "alice"}, "/metrics", True),
        ({"username": "alice"}, "/metrics/hami", False),
        ({"username": "carol", "groups": ["viewers"]}, "/ui/node/n1", True),
        ({"username": "carol", "groups": ["viewers"]}, "/ui", True),
        ({"username": "carol", "groups": ["viewers"]}, "/uix", False),
        ({"username": "bob"}, "/metrics", False),
    ],
)
async def test_rules_decide_like_rbac_non_resource_urls(
    apiserver: ApiServer, user: dict[str, Any], path: str, allowed: bool
) -> None:
    apiserver.access.grant(users=["alice"], paths=["/metrics"])
    apiserver.access.grant(groups=["viewers"], paths=["/ui", "/ui/*"])
    body = subject_access_review(user, path, "get")
    kubernetes_validate.validate(body, KUBE_VERSION, strict=True)  # what hamid sends
    answer = await _review(apiserver, body)
    assert answer["kind"] == "SubjectAccessReview"
    assert answer["status"]["allowed"] is allowed
    if not allowed:
        assert answer["status"]["reason"] == f"no rule allows get on {path}"


async def test_a_verb_not_granted_is_not_allowed(apiserver: ApiServer) -> None:
    apiserver.access.grant(users=["alice"], paths=["/metrics"])
    answer = await _review(apiserver, subject_access_review({"username": "alice"}, "/metrics", "post"))
    assert answer["status"]["allowed"] is False


async def test_resource_attributes_are_never_allowed(apiserver: ApiServer) -> None:
    apiserver.access.grant(users=["alice"], verbs=["*"], paths=["*"])
    body = {"spec": {"user": "alice", "resourceAttributes": {"verb": "get", "resource": "pods"}}}
    answer = await _review(apiserver, body)
    assert answer["status"] == {"allowed": False, "reason": "the embedded API server grants no resources"}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"nonResourceAttributes": {"path": "/metrics", "verb": "get"}}, "at least one of user or group"),
        ({"user": "alice"}, "exactly one of nonResourceAttributes or resourceAttributes"),
    ],
)
async def test_malformed_reviews_are_refused(
    apiserver: ApiServer, spec: dict[str, Any], message: str
) -> None:
    with pytest.raises(KubeError, match=message):
        await _review(apiserver, {"spec": spec})


def test_rules_need_a_subject_and_absolute_paths() -> None:
    server = ApiServer()
    with pytest.raises(ValueError, match="user or group"):
        server.access.grant(paths=["/metrics"])
    with pytest.raises(ValueError, match="start with '/'"):
        server.access.grant(users=["a"], paths=["metrics"])
