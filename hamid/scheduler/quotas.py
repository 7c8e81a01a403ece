"""GPU ResourceQuotas of the namespaces and the memory/cores their pods book.

The limits come from ResourceQuota events (``limits.<gpumem>`` / ``limits.<gpucores>``; the
tightest object of a namespace wins); the usage is shifted by the ledger
(:mod:`hamid.scheduler.ledger`) whenever a reservation or hold is booked or released.
"""

from __future__ import annotations

from hamid.fit.fit import quota_limits
from hamid.log import get_logger
from hamid.model import objects
from hamid.model.errors import InvalidInput
from hamid.model.kube import QuotaBody
from hamid.model.resources import ResourceConfig

log = get_logger("scheduler.quotas")


class QuotaBook:
    """Quota limits per namespace and the usage booked against them (event-loop owned)."""

    def __init__(self, config: ResourceConfig) -> None:
        self.config = config
        self._objects: dict[str, dict[str, tuple[int | None, int | None]]] = {}
        self._used: dict[str, list[int]] = {}

    def blank_copy(self) -> QuotaBook:
        """The same limits with no usage (the reconcile's shadow judges quotas as this book does)."""
        copy = QuotaBook(self.config)
        copy._objects = {ns: dict(found) for ns, found in self._objects.items()}
        return copy

    def on_quota(self, quota: QuotaBody) -> None:
        """Apply a ResourceQuota add/update (``limits.<gpumem>`` / ``limits.<gpucores>``)."""
        hard = objects.section(quota, "spec").get("hard") or {}
        ns = objects.namespace(quota)
        try:
            limits = quota_limits(hard, self.config)
        except InvalidInput as exc:
            log.warning("resource_quota_invalid", namespace=ns, error=str(exc))
            return
        self._objects.setdefault(ns, {})[objects.name(quota)] = limits

    def on_quota_deleted(self, quota: QuotaBody) -> None:
        """Forget a deleted ResourceQuota."""
        ns = objects.namespace(quota)
        found = self._objects.get(ns)
        if found is not None:
            found.pop(objects.name(quota), None)
            if not found:
                del self._objects[ns]

    def namespaces(self) -> list[str]:
        """Namespaces with a GPU ResourceQuota or GPU usage booked (for metrics, as HAMi's quota
        manager keeps an entry for every namespace whose pods hold GPUs)."""
        return sorted(self._objects.keys() | self._used.keys())

    def limits(self, namespace: str) -> tuple[int | None, int | None] | None:
        """The tightest (memory MiB, cores %) limits of the namespace; None without a quota."""
        found = self._objects.get(namespace)
        if not found:
            return None
        mems = [m for m, _ in found.values() if m is not None]
        cores = [c for _, c in found.values() if c is not None]
        return (min(mems) if mems else None, min(cores) if cores else None)

    def used(self, namespace: str) -> tuple[int, int]:
        """(memory MiB, cores %) booked by the namespace's pods."""
        used = self._used.get(namespace)
        return (used[0], used[1]) if used else (0, 0)

    def shift(self, namespace: str, mem: int, cores: int) -> None:
        """Add ``mem`` MiB and ``cores`` % (negative to release) to the namespace's usage."""
        used = self._used.setdefault(namespace, [0, 0])
        used[0] += mem
        used[1] += cores
        if used == [0, 0]:
            del self._used[namespace]
