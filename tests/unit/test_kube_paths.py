"""Object names become exactly one URL path segment, or nothing is sent (issue 16: ``..``)."""

from __future__ import annotations

import pytest

from hamid.kube.client import NODES, PODS
from hamid.kube.errors import InvalidRequest, outcome_unknown


def test_names_are_percent_encoded_segments() -> None:
    assert PODS.item("a b?#", "team") == "/api/v1/namespaces/team/pods/a%20b%3F%23"
    assert PODS.item("p", "ns", "binding") == "/api/v1/namespaces/ns/pods/p/binding"
    assert NODES.item("node.example.com") == "/api/v1/nodes/node.example.com"


@pytest.mark.parametrize("name", ["..", ".", "", "a/b", "50%", "../x"])
def test_names_that_are_no_segment_are_refused_before_sending(name: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        PODS.item(name, "default")
    assert info.value.status == 400 and not outcome_unknown(info.value)
    with pytest.raises(InvalidRequest):
        PODS.item("p", name or ".")


def test_a_namespaced_resource_needs_a_namespace() -> None:
    with pytest.raises(InvalidRequest, match="namespace is required"):
        PODS.item("p")
