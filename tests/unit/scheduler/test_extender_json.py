"""Extender JSON: Go-cased keys decoded case-insensitively, both node modes, errors."""

from __future__ import annotations

import pytest

from hamid.model.errors import InvalidInput
from hamid.scheduler.extender_json import FilterResult, decode_bind_args, decode_filter_args, go_field


def test_go_field_exact_first_then_folded() -> None:
    assert go_field({"NodeNames": 1, "nodenames": 2}, "NodeNames") == 1
    assert go_field({"nodenames": 2}, "NodeNames") == 2
    assert go_field({"NODENAMES": 3}, "NodeNames") == 3
    assert go_field({}, "NodeNames") is None


def test_filter_args_modes() -> None:
    pod = {"metadata": {"name": "p"}}
    names = decode_filter_args({"Pod": pod, "NodeNames": ["a", "b"]})
    assert names.candidate_names == ("a", "b") and names.nodes is None
    lower = decode_filter_args({"pod": pod, "nodenames": ["a"]})
    assert lower.candidate_names == ("a",)
    full = decode_filter_args({"Pod": pod, "Nodes": {"metadata": {}, "items": [{"metadata": {"name": "x"}}]}})
    assert full.candidate_names == ("x",) and full.node_names is None


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ([], "JSON object"),
        ({"NodeNames": []}, "missing pod"),
        ({"Pod": {"metadata": {}}, "NodeNames": "a"}, "list of strings"),
        ({"Pod": {"metadata": {}}}, "neither"),
        ({"Pod": {"metadata": {}}, "Nodes": {"items": [1]}}, "Node objects"),
    ],
)
def test_filter_args_errors(body: object, reason: str) -> None:
    with pytest.raises(InvalidInput, match=reason):
        decode_filter_args(body)


def test_bind_args() -> None:
    args = decode_bind_args({"PodName": "p", "podNamespace": "ns", "PodUID": "u", "Node": "n"})
    assert (args.pod_name, args.pod_namespace, args.pod_uid, args.node) == ("p", "ns", "u", "n")
    with pytest.raises(InvalidInput, match="PodUID"):
        decode_bind_args({"PodName": "p", "PodNamespace": "ns", "Node": "n"})


def test_filter_result_go_names() -> None:
    out = FilterResult(node_names=["a"], failed_nodes={"b": "node unregistered"}).to_json()
    assert out == {"NodeNames": ["a"], "FailedNodes": {"b": "node unregistered"}}
    assert FilterResult(error="x").to_json() == {"FailedNodes": {}, "Error": "x"}
    assert (
        FilterResult(nodes=[{"metadata": {"name": "a"}}]).to_json()["Nodes"]["items"][0]["metadata"]["name"]
        == "a"
    )
