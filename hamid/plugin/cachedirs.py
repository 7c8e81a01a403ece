"""Removal of HAMi-core's per-container cache directories of pods that left the node.

Allocate creates ``<HOOK_PATH>/vgpu/containers/<podUID>_<container>`` for every container it serves
(HAMi-core keeps its shared usage cache there). HAMi's vGPUmonitor removed them once the pod was
gone; hamid's plugin does it itself, periodically, from the synced node-scoped pod cache. Only
directories named like ``<uid>_<container>`` are touched, never one of a pod the cache still holds,
and never one younger than the sweep interval (a pod Allocate served before the cache saw it).
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import time
from collections.abc import Collection

from hamid.log import get_logger
from hamid.model import hamicore, objects
from hamid.plugin.pods import NodePods

log = get_logger("plugin.cachedirs")

#: How often the sweep runs by default.
CLEANUP_INTERVAL_S = 300.0
#: ``<pod UID>_<container name>``: a Kubernetes UID (a UUID) and a DNS-1123 label.
_CACHE_DIR = re.compile(
    r"(?P<uid>[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})_[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
)


def pod_uid_of(name: str) -> str | None:
    """The pod UID of a cache directory name, or None when the name is not ``<uid>_<container>``."""
    match = _CACHE_DIR.fullmatch(name)
    return match["uid"] if match else None


def sweep(directory: str, keep_uids: Collection[str], min_age_s: float) -> list[str]:
    """Remove cache directories of pods not in ``keep_uids`` (blocking: call it in a thread).

    Skips names that are not ``<uid>_<container>``, anything that is not a real directory, and
    directories modified less than ``min_age_s`` ago. Returns the removed names.
    """
    removed: list[str] = []
    try:
        with os.scandir(directory) as listing:
            entries = list(listing)
    except FileNotFoundError:
        return removed
    now = time.time()
    for entry in entries:
        uid = pod_uid_of(entry.name)
        if uid is None or uid in keep_uids:
            continue
        try:
            if not entry.is_dir(follow_symlinks=False):
                continue
            if now - entry.stat(follow_symlinks=False).st_mtime < min_age_s:
                continue
            shutil.rmtree(entry.path)
        except (OSError, RecursionError) as exc:
            # the container wrote that tree: one it made too deep to remove must not keep every
            # later directory on the node (this sweep meets it first each time) from going
            log.warning("cache_dir_remove_failed", path=entry.path, error=str(exc) or type(exc).__name__)
            continue
        removed.append(entry.name)
    return removed


class CacheDirCleaner:
    """Every ``interval`` seconds, removes cache directories whose pod is no longer on this node.

    ``min_age`` (default: ``interval``) spares directories modified more recently than that.
    """

    def __init__(
        self,
        pods: NodePods,
        hook_path: str,
        *,
        interval: float = CLEANUP_INTERVAL_S,
        min_age: float | None = None,
    ) -> None:
        self.pods = pods
        self.directory = hamicore.containers_dir(hook_path)
        self.interval = interval
        self.min_age = interval if min_age is None else min_age

    async def sweep_once(self) -> list[str]:
        """One sweep against the synced pod cache (waits for the sync)."""
        await self.pods.wait_synced()
        keep = {objects.uid(p) for p in self.pods.pods()}
        removed = await asyncio.to_thread(sweep, self.directory, keep, self.min_age)
        if removed:
            log.info("cache_dirs_removed", directories=removed)
        return removed

    async def run(self) -> None:
        """Sweep every ``interval`` until cancelled; a failed sweep is logged and retried next time."""
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.sweep_once()
            except Exception as exc:  # never take the plugin down: the next sweep retries
                log.exception("cache_dir_cleanup_failed", directory=self.directory, error=str(exc))
