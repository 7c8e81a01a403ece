"""Extender JSON: Go-cased keys decoded case-insensitively, both node modes, errors."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hamid.model._wire import go_field
from hamid.model.errors import InvalidInput
from hamid.scheduler.extender_json import FilterResult, decode_bind_args, decode_filter_args


def test_go_field_any_case_the_last_key_wins() -> None:
    """Go's decoder sets the field for every key equal to its name but for case, in order."""
    assert go_field({"NodeNames": 1, "nodenames": 2}, "NodeNames") == 2
    assert go_field({"nodenames": 2, "NodeNames": 1}, "NodeNames") == 1
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


def _pod_with(*, name: object = "main", containers: object = None, spec: object = None) -> dict[str, object]:
    """Filter args of a Guaranteed GPU pod, its first container's name (``...``: absent) replaced."""
    main: dict[str, object] = {
        "name": name,
        "resources": {
            "limits": {"cpu": "2", "memory": "1Gi", "nvidia.com/gpu": "1"},
            "requests": {"cpu": "2", "memory": "1Gi", "nvidia.com/gpu": "1"},
        },
    }
    if name is ...:
        del main["name"]
    pod_spec = spec if spec is not None else {"containers": containers if containers is not None else [main]}
    pod = {"metadata": {"name": "g", "namespace": "default", "uid": "u"}, "spec": pod_spec}
    return {"Pod": pod, "NodeNames": ["n1"]}


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ([], "JSON object"),
        ({"NodeNames": []}, "missing pod"),
        ({"Pod": {"metadata": {}}, "NodeNames": "a"}, "list of strings"),
        ({"Pod": {"metadata": {}}}, "neither"),
        ({"Pod": {"metadata": {}}, "Nodes": {"items": [1]}}, "Node object"),
        ({"Pod": {"metadata": {}}, "Nodes": {}}, "list of Node objects, got null"),
        ({"Pod": {"metadata": {}}, "Nodes": {"items": None}}, "list of Node objects, got null"),
        ({"Pod": {"metadata": {}}, "Nodes": {"items": {"a": 1}}}, "list of Node objects, got object"),
        ({"Pod": {"metadata": {}}, "Nodes": []}, "NodeList object"),
        ({"Pod": {"metadata": {}}, "Nodes": {"items": [{"metadata": {"name": 5}}]}}, r"items\[0\]"),
        ({"Pod": {"metadata": {}}, "Nodes": {"items": [{"metadata": None}]}}, r"items\[0\]"),
        ({"Pod": {"metadata": {}}, "Nodes": {"items": [{"metadata": {"name": ""}}]}}, r"items\[0\]"),
        (_pod_with(name=...), "container 0: name must be a non-empty string"),
        (_pod_with(name=5), "container 0: name must be a non-empty string"),
        (_pod_with(name=""), "container 0: name must be a non-empty string"),
        (_pod_with(name=["main"]), "container 0: name must be a non-empty string"),
        (_pod_with(containers="main"), "spec.containers"),
        (_pod_with(containers=[7]), r"spec.containers\[0\]"),
        (_pod_with(spec=[1]), "pod spec"),
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


#: Any JSON value (what ``json.loads`` can return), nested a few levels.
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
#: Filter args whose every part may be of the wrong type (the extender's own keys, in any case).
FILTER_BODIES = st.one_of(
    JSON_VALUES,
    st.fixed_dictionaries(
        {},
        optional={
            "Pod": st.one_of(
                JSON_VALUES,
                st.fixed_dictionaries(
                    {"metadata": st.one_of(JSON_VALUES, st.just({"name": "p", "namespace": "d"}))},
                    optional={
                        "spec": st.one_of(JSON_VALUES, st.fixed_dictionaries({"containers": JSON_VALUES}))
                    },
                ),
            ),
            "NodeNames": st.one_of(JSON_VALUES, st.lists(st.text(max_size=4), max_size=3)),
            "nodes": st.one_of(JSON_VALUES, st.fixed_dictionaries({"items": JSON_VALUES})),
        },
    ),
)


@settings(max_examples=200, deadline=None)
@given(FILTER_BODIES)
def test_any_filter_body_decodes_or_is_refused_with_a_reason(body: object) -> None:
    try:
        args = decode_filter_args(body)
    except InvalidInput as exc:
        assert str(exc)
        return
    assert all(isinstance(n, str) and n for n in args.candidate_names) or args.node_names is not None


@settings(max_examples=200, deadline=None)
@given(JSON_VALUES)
def test_any_bind_body_decodes_or_is_refused_with_a_reason(body: object) -> None:
    try:
        decode_bind_args(body)
    except InvalidInput as exc:
        assert str(exc)
