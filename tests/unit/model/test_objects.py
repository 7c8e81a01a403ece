"""The metadata accessors give Go's zero values for missing, null and wrongly-typed fields."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from hamid.model import objects

POD = {
    "metadata": {
        "name": "p",
        "namespace": "ns",
        "uid": "u-1",
        "resourceVersion": "42",
        "annotations": {"a": "1"},
        "labels": {"l": "2"},
    },
    "spec": {"nodeName": "n"},
}


def test_fields_of_a_full_object() -> None:
    assert objects.name(POD) == "p"
    assert objects.namespace(POD) == "ns"
    assert objects.uid(POD) == "u-1"
    assert objects.resource_version(POD) == "42"
    assert objects.annotations(POD) == {"a": "1"}
    assert objects.labels(POD) == {"l": "2"}
    assert objects.object_key(POD) == "ns/p"
    assert objects.namespaced_key(POD) == "ns/p"
    assert objects.section(POD, "spec") == {"nodeName": "n"}


@pytest.mark.parametrize(
    "obj",
    [
        None,
        {},
        {"metadata": None},
        {"metadata": []},
        {"metadata": {"annotations": None, "labels": "x", "name": None}},
    ],
)
def test_missing_or_malformed_metadata_reads_as_empty(obj: object) -> None:
    assert objects.name(obj) == ""  # type: ignore[arg-type]
    assert objects.uid(obj) == ""  # type: ignore[arg-type]
    assert objects.annotations(obj) == {}  # type: ignore[arg-type]
    assert objects.labels(obj) == {}  # type: ignore[arg-type]
    assert objects.section(obj, "spec") == {}  # type: ignore[arg-type]


def test_mappings_other_than_dict_are_read_too() -> None:
    meta = MappingProxyType({"name": "p", "annotations": MappingProxyType({"a": "1"})})
    frozen = MappingProxyType({"metadata": meta})
    assert objects.name(frozen) == "p"
    assert objects.annotations(frozen) == {"a": "1"}
    assert objects.section(MappingProxyType({"spec": MappingProxyType({"x": 1})}), "spec") == {"x": 1}


def test_cluster_scoped_key_has_no_slash_but_namespaced_key_does() -> None:
    node = {"metadata": {"name": "gpu-1"}}
    assert objects.object_key(node) == "gpu-1"
    assert objects.namespaced_key(node) == "/gpu-1"


def test_version_number_reads_integers_only() -> None:
    assert objects.version_number("42") == 42
    assert objects.version_number("") is None
    assert objects.version_number(None) is None
    assert objects.version_number("abc") is None


def test_version_at_least_orders_integers_and_equal_strings() -> None:
    assert objects.version_at_least("11", "10") is True
    assert objects.version_at_least("10", "10") is True
    assert objects.version_at_least("9", "10") is False
    assert objects.version_at_least("abc", "abc") is True  # the same version, whatever it holds
    assert objects.version_at_least("abc", "10") is None
    assert objects.version_at_least("", "10") is None


def test_newer_than_counts_unordered_versions_as_newer() -> None:
    assert objects.newer_than("11", "10")
    assert not objects.newer_than("10", "10")
    assert not objects.newer_than("", "10")
    assert objects.newer_than("abc", "10")
    assert objects.newer_than("10", "")
