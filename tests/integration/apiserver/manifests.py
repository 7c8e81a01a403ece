"""Small manifests for the embedded API server tests."""

from __future__ import annotations

from typing import Any


def pod(name: str, namespace: str = "default", node: str | None = None, **labels: str) -> dict[str, Any]:
    """A minimal pod manifest."""
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "busybox"}]}
    if node is not None:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": spec,
    }
