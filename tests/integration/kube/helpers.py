"""Small helpers shared by the kube-layer integration tests."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from hamid.kube.backoff import Backoff
from hamid.kube.client import KubeClient
from hamid.model.kube import JSON


def fast_backoff() -> Backoff:
    """A short backoff so retry paths run quickly in tests."""
    return Backoff(initial=0.02, maximum=0.2)


async def create_namespace(kube: KubeClient, name: str, labels: dict[str, str] | None = None) -> JSON:
    """Create a namespace (the product never does; tests need their own)."""
    meta: JSON = {"name": name, **({"labels": labels} if labels else {})}
    return await kube.request("POST", "/api/v1/namespaces", body={"metadata": meta})


async def eventually(check: Callable[[], bool], within: float = 10.0, what: str = "condition") -> None:
    """Poll ``check`` until true; fail the test after ``within`` seconds."""
    try:
        async with asyncio.timeout(within):
            while True:
                if check():
                    return
                await asyncio.sleep(0.01)
    except TimeoutError:
        raise AssertionError(f"{what} not reached within {within}s") from None


class Recorder:
    """Collects cache callbacks as ``(kind, key, resourceVersion)`` tuples."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []

    @staticmethod
    def _key(obj: dict[str, Any]) -> str:
        meta = obj["metadata"]
        return f"{meta['namespace']}/{meta['name']}" if meta.get("namespace") else meta["name"]

    def on_add(self, obj: dict[str, Any]) -> None:
        self.events.append(("add", self._key(obj), obj["metadata"]["resourceVersion"]))

    def on_update(self, old: dict[str, Any], new: dict[str, Any]) -> None:
        assert self._key(old) == self._key(new)
        self.events.append(("update", self._key(new), new["metadata"]["resourceVersion"]))

    def on_delete(self, obj: dict[str, Any]) -> None:
        self.events.append(("delete", self._key(obj), obj["metadata"]["resourceVersion"]))

    def kinds(self, key: str) -> list[str]:
        """The callback kinds seen for one key, in order."""
        return [kind for kind, k, _ in self.events if k == key]
