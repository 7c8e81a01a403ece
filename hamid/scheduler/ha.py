"""High availability of ``hamid scheduler``: leadership terms, per-term cache re-sync, role labels.

Every gain of leadership starts a new *term*. Until the caches have caught up with the API
server as of the term's start, the scheduler refuses ``/filter``, ``/bind`` and ``/refit``
("cache of this term not synced yet"), so an A→B→A change never decides from what A saw in an
earlier term (HAMi #2911). A cache has caught up with a consistent list taken after the term
began when it has applied events up to the list's resourceVersion, or holds exactly the listed
objects at the listed versions (an idle resource whose watch carried nothing newer).

The leader labels its own pod ``hami.io/scheduler-role=leader`` and the other scheduler pods
``follower`` (HAMi's label); a follower keeps its own pod labelled ``follower``. A Service
selecting the leader label therefore reaches the replica that decides.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence

from hamid.kube.cache import WatchCache
from hamid.kube.client import KubeClient
from hamid.kube.errors import KubeError, NotFound
from hamid.log import get_logger
from hamid.model import annotations as ann
from hamid.model import objects as obj
from hamid.model.kube import JSON, Body
from hamid.model.objects import object_key
from hamid.scheduler.readiness import Readiness

log = get_logger("scheduler.ha")


def versions(objects: Sequence[Body]) -> dict[str, str]:
    """``key -> metadata.resourceVersion`` of objects."""
    return {object_key(o): obj.resource_version(o) for o in objects}


def caught_up(
    cache_version: str | None, cached: Mapping[str, str], list_version: str, listed: Mapping[str, str]
) -> bool:
    """Whether a cache (at ``cache_version``, holding ``cached``) reflects a list taken later.

    True when the cache has applied events up to the list's resourceVersion (in the one
    resourceVersion order; versions it cannot order fall back to the second test), or when it
    holds exactly the listed objects at the listed versions.
    """
    if obj.version_at_least(cache_version, list_version):
        return True
    return dict(cached) == dict(listed)


class Leadership:
    """Terms and role labels of one scheduler replica; wire ``started``/``stopped`` to an elector.

    ``run()`` owns the role-labelling loop and each term's sync task until cancelled. Without a
    ``pod_name`` no labels are written (the replica runs outside a pod). A term's sync makes
    rounds of at most ``sync_round`` s (``retry_delay`` s apart after a failure) and re-checks a
    cache on each of its events, at least every ``sync_poll`` s.
    """

    def __init__(
        self,
        kube: KubeClient,
        readiness: Readiness,
        caches: Sequence[WatchCache[Body]],
        *,
        api_timeout_s: float,
        pod_name: str | None = None,
        pod_namespace: str | None = None,
        pod_selector: str = "",
        relabel_interval: float = 30.0,
        sync_poll: float = 0.05,
        sync_round: float = 10.0,
        retry_delay: float = 1.0,
    ) -> None:
        if min(relabel_interval, sync_poll, sync_round, retry_delay) <= 0:
            raise ValueError("relabel_interval, sync_poll, sync_round and retry_delay must be > 0")
        if pod_name and not pod_namespace:
            raise ValueError("a pod name needs its namespace (--pod-namespace)")
        self.kube = kube
        self.readiness = readiness
        self.caches = tuple(caches)
        self.api_timeout_s = api_timeout_s
        self.pod_name = pod_name or ""
        self.pod_namespace = pod_namespace or ""
        self.pod_selector = pod_selector
        self.relabel_interval = relabel_interval
        self.sync_poll = sync_poll
        self.sync_round = sync_round
        self.retry_delay = retry_delay
        self.term = 0
        self._changed = asyncio.Event()
        self._sync_task: asyncio.Task[None] | None = None
        self._cancelled: set[asyncio.Task[None]] = set()
        self._cache_event = asyncio.Event()
        for cache in self.caches:
            cache.add_handlers(
                on_add=self._cache_changed,
                on_update=lambda _old, _new: self._cache_event.set(),
                on_delete=self._cache_changed,
            )
        readiness.follow()

    def _cache_changed(self, _obj: Body) -> None:
        self._cache_event.set()

    # -- elector callbacks ----------------------------------------------------------------------

    def started(self) -> None:
        """A new term: refuse decisions until its caches have caught up, then label roles."""
        self.term += 1
        self.readiness.lead()
        self._cancel_sync()
        self._sync_task = asyncio.get_running_loop().create_task(self._sync(self.term))
        self._changed.set()
        log.info("leadership_term_started", term=self.term)

    def stopped(self) -> None:
        """The term ended: refuse decisions, label this pod a follower."""
        self.readiness.follow()
        self._cancel_sync()
        self._changed.set()
        log.info("leadership_term_ended", term=self.term)

    def _cancel_sync(self) -> None:
        if self._sync_task is not None:
            self._sync_task.cancel()
            self._cancelled.add(self._sync_task)
            self._sync_task.add_done_callback(self._cancelled.discard)
            self._sync_task = None

    # -- term sync --------------------------------------------------------------------------------

    async def _catch_up(self, cache: WatchCache[Body]) -> None:
        await cache.wait_synced()
        items: list[Body] = []
        list_version = ""
        async for page, version in self.kube.list_pages(
            cache.resource,
            cache.namespace,
            field_selector=cache.field_selector,
            label_selector=cache.label_selector,
            page_size=cache.page_size,
            timeout=self.api_timeout_s,
        ):
            list_version = version
            items.extend(map(cache.record, page))  # a page of whole objects alive at a time
        listed = versions(items)
        while not caught_up(cache.resource_version, versions(cache.values()), list_version, listed):
            self._cache_event.clear()
            # a bookmark moves the version without a callback: re-check every sync_poll anyway
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.sync_poll):
                    await self._cache_event.wait()

    async def _sync(self, term: int) -> None:
        """Catch every cache up with a list taken in this term; rounds are bounded and retried."""
        while True:
            try:
                async with asyncio.timeout(self.sync_round):
                    for cache in self.caches:
                        await self._catch_up(cache)
                break
            except (KubeError, TimeoutError) as exc:
                log.warning("term_sync_retry", term=term, error=str(exc) or type(exc).__name__)
                await asyncio.sleep(self.retry_delay)
        if term == self.term and self.readiness.leading:
            self.readiness.caught_up()
            log.info("term_synced", term=term)

    # -- role labels ------------------------------------------------------------------------------

    async def _patch_role(self, pod: JSON, role: str) -> None:
        if obj.labels(pod).get(ann.SCHEDULER_ROLE) == role:
            return
        name = obj.name(pod)
        await self.kube.patch_pod_metadata(
            self.pod_namespace, name, labels={ann.SCHEDULER_ROLE: role}, timeout=self.api_timeout_s
        )
        log.info("scheduler_role_labelled", pod=f"{self.pod_namespace}/{name}", role=role)

    async def label_roles(self) -> None:
        """Leader: its pod ``leader``, other selected pods ``follower``; follower: its own pod."""
        if not self.pod_name:
            return
        kube, timeout = self.kube, self.api_timeout_s
        if self.readiness.leading:
            pods, _ = await kube.list_pods(
                self.pod_namespace, label_selector=self.pod_selector or None, timeout=timeout
            )
            if not any(obj.name(p) == self.pod_name for p in pods):
                pods.append(await kube.get_pod(self.pod_namespace, self.pod_name, timeout=timeout))
            # followers first: two pods never both carry "leader" because of this pass
            pods.sort(key=lambda p: obj.name(p) == self.pod_name)
            for pod in pods:
                own = obj.name(pod) == self.pod_name
                if not self.readiness.leading:
                    return
                await self._patch_role(pod, ann.ROLE_LEADER if own else ann.ROLE_FOLLOWER)
        else:
            await self._patch_role(
                await kube.get_pod(self.pod_namespace, self.pod_name, timeout=timeout), ann.ROLE_FOLLOWER
            )

    async def run(self) -> None:
        """Label roles on every change of leadership and every ``relabel_interval``; until cancelled."""
        try:
            while True:
                self._changed.clear()
                try:
                    await self.label_roles()
                except NotFound as exc:
                    log.warning(
                        "scheduler_pod_not_found", pod=f"{self.pod_namespace}/{self.pod_name}", error=str(exc)
                    )
                except KubeError as exc:
                    log.warning("scheduler_role_label_failed", error=str(exc))
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.relabel_interval):
                        await self._changed.wait()
        finally:
            self._cancel_sync()
            await asyncio.gather(*self._cancelled, return_exceptions=True)
