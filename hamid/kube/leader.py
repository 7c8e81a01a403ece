"""Lease-based leadership (coordination.k8s.io/v1): campaign for a Lease, or follow one.

:class:`LeaderElector` campaigns, following client-go's algorithm. :class:`LeaseFollower` follows
the Lease another process campaigns for (HAMi's model: the extender leads iff the kube-scheduler
in its pod holds the kube-scheduler Lease).

The campaigning elector's lease is taken when free or expired, renewed every ``retry_period``,
and lost when no renewal succeeds within ``renew_deadline``. Expiry is the earlier of
``leaseDuration`` after this replica saw the record change (client-go's rule, blind to clock
skew but late by up to a poll) and the record's ``renewTime + leaseDuration`` on this replica's
wall clock (:func:`takeover_at`); a candidate schedules its next try at that instant rather than
on its retry tick, so it takes over within ``leaseDuration`` of the holder's last renewal.
Every update is a PUT carrying the lease's resourceVersion, so two candidates can never both win.

Both also *fence* their leadership on this replica's own monotonic clock (:func:`fence_clock`,
which keeps counting while the process or its VM is frozen): :meth:`LeaderElector.lease_invalid`
says why the replica must not decide, without waiting for its renew loop — past
``lease_duration - skew_margin`` since the last successful renewal, measured from when that
renewal was sent. Another candidate takes over no sooner than ``lease_duration`` after it saw
that renewal, so a replica that wakes from a pause longer than its lease refuses before it
could decide beside the new leader. :attr:`LeaderElector.epoch` names the lease term a decision
started under (holder, acquireTime, leaseTransitions), so a write can refuse a stale one.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from hamid.kube.client import LEASES, KubeClient
from hamid.kube.errors import Conflict, KubeError, NotFound
from hamid.log import get_logger
from hamid.model import objects
from hamid.model.kube import JSON

log = get_logger("kube.leader")

JITTER = 1.2
#: Part of the lease duration a replica gives up before the others may take over (clock-rate
#: skew, the time between a check and the write it guards reaching the API server).
SKEW_MARGIN_FRACTION = 0.1
#: The release on the way out is bounded: a stopping process does not wait on a slow API server.
RELEASE_TIMEOUT_S = 2.0
#: A candidate tries this long after the holder's lease expires (a sleep may end a tick early).
TAKEOVER_SLACK_S = 0.01


def fence_clock() -> float:
    """Seconds on a monotonic clock that also counts suspended time (CLOCK_BOOTTIME on Linux)."""
    return time.clock_gettime(time.CLOCK_BOOTTIME) if hasattr(time, "CLOCK_BOOTTIME") else time.monotonic()


def default_skew_margin(lease_duration: float) -> float:
    """The fence margin for a lease duration (:data:`SKEW_MARGIN_FRACTION` of it)."""
    return lease_duration * SKEW_MARGIN_FRACTION


def _lease_epoch(spec: dict[str, Any]) -> str:
    """A lease term's name: holder, acquireTime and leaseTransitions of the record."""
    holder, acquired = spec.get("holderIdentity") or "", spec.get("acquireTime") or ""
    return f"{holder}@{acquired}#{spec.get('leaseTransitions') or 0}"


def _micro_time(posix: float) -> str:
    """A POSIX timestamp as a Lease MicroTime."""
    return datetime.fromtimestamp(posix, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse_time(value: object) -> float | None:
    """A Lease MicroTime (RFC 3339) as a POSIX timestamp; None when absent or malformed."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def takeover_at(
    spec: dict[str, Any],
    observed_at: float,
    now: float,
    wall_now: float,
    default: float,
    renewed_no_earlier_than: float | None = None,
) -> float:
    """When (on the clock of ``observed_at`` and ``now``) another holder's lease ``spec`` expires.

    The earlier of ``leaseDuration`` after the record was observed to change (``observed_at``)
    and ``renewTime + leaseDuration`` read on the wall clock (``wall_now`` is the wall time at
    ``now``). The holder fences itself ``skew_margin`` before the latter on its own monotonic
    clock, so taking over then is safe while the two wall clocks differ by less than the
    margin (docs/reliability.md §7.2). A renewTime absent, malformed or in the future (this
    replica's clock is behind) leaves the observed bound alone, and so does one older than
    ``renewed_no_earlier_than`` (wall time): a record seen to change is a renewal of moments ago,
    so an old renewTime on it is the holder's clock stepped back, not a lease about to run out.
    """
    duration = spec.get("leaseDurationSeconds")
    held_for = float(duration) if isinstance(duration, int | float) and duration > 0 else default
    observed = observed_at + held_for
    renewed = _parse_time(spec.get("renewTime"))
    if renewed is None or renewed > wall_now:
        return observed
    if renewed_no_earlier_than is not None and renewed < renewed_no_earlier_than:
        return observed
    return min(observed, now + renewed + held_for - wall_now)


class _TermEnded(Exception):
    """A leading replica's term is over without a failed renewal: it must step down and start a
    new term (its callbacks resync what it decides from) rather than renew on."""


class LeaderElector:
    """Campaign for the Lease ``namespace/name`` as ``identity``; ``run()`` until cancelled."""

    def __init__(
        self,
        client: KubeClient,
        namespace: str,
        name: str,
        identity: str,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        *,
        on_started_leading: Callable[[], None] | None = None,
        on_stopped_leading: Callable[[], None] | None = None,
        release_on_cancel: bool = True,
        skew_margin: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not identity:
            raise ValueError("leader election needs a non-empty identity")
        if not lease_duration > renew_deadline > retry_period > 0:
            raise ValueError(
                "leader election needs lease_duration > renew_deadline > retry_period > 0, got "
                f"{lease_duration}, {renew_deadline}, {retry_period}"
            )
        self.client = client
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self.release_on_cancel = release_on_cancel
        self.skew_margin = default_skew_margin(lease_duration) if skew_margin is None else skew_margin
        if not 0 <= self.skew_margin < lease_duration - retry_period:
            raise ValueError(
                f"skew margin {self.skew_margin:g} leaves the lease invalid between renewals "
                f"(lease_duration {lease_duration:g}, retry_period {retry_period:g})"
            )
        self._valid_until = -math.inf
        self._epoch = ""
        self._on_started = on_started_leading
        self._on_stopped = on_stopped_leading
        self._is_leader = False
        self._lease: JSON | None = None
        self._observed_spec: dict[str, Any] | None = None
        self._observed_at = 0.0
        #: Wall time when the record in view was seen to change from an earlier one (None: the
        #: first record seen, which may be a lease left long ago).
        self._changed_wall: float | None = None
        #: When (loop clock) the lease another replica holds expires; None unless the last try
        #: found it held.
        self._takeover_at: float | None = None
        self._clock = clock
        self._log = log.bind(lease=f"{namespace}/{name}", identity=identity)

    @property
    def is_leader(self) -> bool:
        """True while this replica holds the lease."""
        return self._is_leader

    @property
    def holder(self) -> str:
        """The holder identity last observed on the lease ("" when unknown or released)."""
        return str((self._observed_spec or {}).get("holderIdentity") or "")

    @property
    def epoch(self) -> str:
        """The lease term this replica last wrote (holder@acquireTime#transitions; "" before)."""
        return self._epoch

    def lease_invalid(self) -> str:
        """Why this replica must not decide on its lease now ("" while it holds a valid one)."""
        if not self._is_leader:
            return "not the leader"
        late = fence_clock() - self._valid_until
        if late >= 0:
            return (
                f"lease not renewed for {late + self.lease_duration - self.skew_margin:.1f}s "
                f"(valid {self.lease_duration:g}s less a {self.skew_margin:g}s margin)"
            )
        return ""

    def _renewed(self, written: JSON, sent: float) -> None:
        """A create or replace of the lease succeeded: valid until ``sent`` + duration - margin."""
        self._valid_until = sent + self.lease_duration - self.skew_margin
        self._epoch = _lease_epoch(dict(written.get("spec") or {}))

    def _set_leader(self, leading: bool) -> None:
        if leading == self._is_leader:
            return
        self._is_leader = leading
        if not leading:
            self._valid_until = -math.inf
        self._log.info("leading_started" if leading else "leading_stopped")
        callback = self._on_started if leading else self._on_stopped
        if callback is not None:
            try:
                callback()
            except Exception:
                self._log.exception("leader_callback_failed")

    def _observe(self, lease: JSON, now: float) -> dict[str, Any]:
        spec = dict(lease.get("spec") or {})
        if spec != self._observed_spec:
            self._changed_wall = self._clock() if self._observed_spec is not None else None
            self._observed_spec = spec
            self._observed_at = now
        self._lease = lease
        return spec

    async def _try_acquire_or_renew(self, renewing: bool = False) -> bool:
        """One GET and create-or-replace. ``renewing`` (this replica leads): a lease that no
        longer names it (deleted, released, taken) is not taken back here, since another term
        may have decided meanwhile; :class:`_TermEnded` says so, and :meth:`run` starts a new one."""
        loop = asyncio.get_running_loop()
        sent = fence_clock()
        now_time = _micro_time(self._clock())
        duration_s = max(1, math.ceil(self.lease_duration))
        try:
            lease = await self.client.get_lease(self.namespace, self.name)
        except NotFound:
            if renewing:
                raise _TermEnded("the lease was deleted") from None
            body = {
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": {
                    "holderIdentity": self.identity,
                    "leaseDurationSeconds": duration_s,
                    "acquireTime": now_time,
                    "renewTime": now_time,
                    "leaseTransitions": 0,
                },
            }
            created = await self.client.create_lease(self.namespace, body)
            self._observe(created, loop.time())
            self._renewed(created, sent)
            return True
        now = loop.time()
        spec = self._observe(lease, now)
        holder = str(spec.get("holderIdentity") or "")
        if renewing and (holder != self.identity or _lease_epoch(spec) != self._epoch):
            raise _TermEnded(f"the lease names {holder or 'no holder'} in term {_lease_epoch(spec)}")
        if holder and holder != self.identity:
            # a renewal seen as a change was written at most two retry periods (and the margin) ago
            slack = 2 * self.retry_period * JITTER + self.skew_margin
            earliest = None if self._changed_wall is None else self._changed_wall - slack
            expires = takeover_at(spec, self._observed_at, now, self._clock(), self.lease_duration, earliest)
            if expires > now:
                self._takeover_at = expires
                return False
        new_spec = dict(spec)
        new_spec.update(holderIdentity=self.identity, leaseDurationSeconds=duration_s, renewTime=now_time)
        if holder != self.identity:
            new_spec["acquireTime"] = now_time
            new_spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        body = {"metadata": dict(objects.metadata(lease)), "spec": new_spec}
        replaced = await self.client.replace_lease(self.namespace, self.name, body)
        self._observe(replaced, loop.time())
        self._renewed(replaced, sent)
        return True

    async def _attempt(self, deadline: float | None = None) -> bool:
        """One try (bounded by ``deadline`` on the loop clock, a renewal when given one); API
        errors count as a failed try."""
        loop = asyncio.get_running_loop()
        budget = self.renew_deadline if deadline is None else max(0.0, deadline - loop.time())
        try:
            async with asyncio.timeout(budget):
                return await self._try_acquire_or_renew(renewing=deadline is not None)
        except (KubeError, TimeoutError) as exc:
            self._log.debug("lease_attempt_failed", error=str(exc), error_type=type(exc).__name__)
            return False

    async def _acquire(self) -> None:
        loop = asyncio.get_running_loop()
        released = asyncio.Event()
        watcher = asyncio.create_task(self._watch_release(released), name="lease-release-watch")
        try:
            while True:
                self._takeover_at = None
                released.clear()
                if await self._attempt():
                    return
                wait = self.retry_period * random.uniform(1.0, JITTER)
                if self._takeover_at is not None:  # the holder's lease runs out before the next tick
                    wait = min(wait, self._takeover_at - loop.time() + TAKEOVER_SLACK_S)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(max(wait, 0.0)):
                        await released.wait()
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)

    async def _watch_release(self, released: asyncio.Event) -> None:
        """Set ``released`` when the lease's holder releases it (an empty ``holderIdentity``, as a
        stopping leader writes), so a rolling update hands over at once rather than on the next
        retry tick. Best effort: a watch that fails (a 403 without ``watch`` on leases, a broken
        stream) is opened again a retry period later, and the tick tries meanwhile."""
        selector = f"metadata.name={self.name}"
        while True:
            version = str(objects.metadata(self._lease).get("resourceVersion") or "") if self._lease else ""
            try:
                events = self.client.watch(
                    LEASES,
                    self.namespace,
                    resource_version=version,
                    field_selector=selector,
                    timeout_seconds=60,
                )
                async for event in events:
                    spec = event.object.get("spec") or {}
                    if event.type in ("ADDED", "MODIFIED") and not spec.get("holderIdentity"):
                        released.set()
            except KubeError as exc:
                self._log.debug("lease_watch_failed", error=str(exc), error_type=type(exc).__name__)
            await asyncio.sleep(self.retry_period)

    async def _renew_until_lost(self) -> None:
        """Renew until a renewal misses its deadline, the fence lapsed (a pause longer than the
        lease: another term may have come and gone), or the lease names another term."""
        loop = asyncio.get_running_loop()
        try:
            while True:
                await asyncio.sleep(self.retry_period)
                lapsed = self.lease_invalid()
                if lapsed:
                    raise _TermEnded(lapsed)
                deadline = loop.time() + self.renew_deadline
                while not await self._attempt(deadline):
                    remaining = deadline - loop.time()
                    if remaining <= 0:
                        self._log.warning("lease_renew_deadline_missed")
                        return
                    await asyncio.sleep(min(self.retry_period, remaining))
                    lapsed = self.lease_invalid()  # a suspend in the sleep: the loop clock stood still
                    if lapsed:
                        raise _TermEnded(lapsed)
        except _TermEnded as ended:
            self._log.warning("lease_term_ended", reason=str(ended))

    async def _release(self) -> None:
        """Hand the lease over on the way out: an empty holder, so a candidate takes it at once.

        A renewal cancelled in flight may have landed unseen, leaving this replica's copy stale: a
        409 reads the lease again and releases it if this replica still holds it."""
        if self._lease is None or self.holder != self.identity:
            return
        try:
            async with asyncio.timeout(min(self.renew_deadline, RELEASE_TIMEOUT_S)):
                try:
                    await self._put_released(self._lease)
                except Conflict:
                    lease = await self.client.get_lease(self.namespace, self.name)
                    if (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                        return
                    await self._put_released(lease)
            self._log.info("lease_released")
        except (KubeError, TimeoutError) as exc:
            self._log.warning("lease_release_failed", error=str(exc))

    async def _put_released(self, lease: JSON) -> None:
        now_time = _micro_time(self._clock())
        spec = dict(lease.get("spec") or {})
        spec.update(holderIdentity="", leaseDurationSeconds=1, acquireTime=now_time, renewTime=now_time)
        body = {"metadata": dict(objects.metadata(lease)), "spec": spec}
        await self.client.replace_lease(self.namespace, self.name, body)

    async def run(self) -> None:
        """Campaign, lead, and campaign again after losing the lease; release it when cancelled."""
        try:
            while True:
                await self._acquire()
                self._set_leader(True)
                await self._renew_until_lost()
                self._set_leader(False)
        finally:
            # stop deciding first, then hand the lease over (client-go's ReleaseOnCancel)
            leading = self._is_leader
            self._set_leader(False)
            if leading and self.release_on_cancel:
                await self._release()


class LeaseFollower:
    """Follow a Lease that another process campaigns for (kube-scheduler beside hamid).

    kube-scheduler writes ``holderIdentity = <hostname>_<uuid>``; this replica leads iff the
    holder starts with ``<hostname>_`` and ``renewTime + leaseDurationSeconds`` is in the future
    on the local clock. The Lease is read every ``poll_interval`` (sooner when the lease would
    expire first). A change of holder, ``acquireTime`` or ``leaseTransitions`` while leading
    (another replica held it in between, or kube-scheduler restarted) ends the term and starts a
    new one, so ``on_started_leading`` runs once per term. Read errors keep the last observed
    record, whose expiry still ends leadership.
    """

    def __init__(
        self,
        client: KubeClient,
        namespace: str,
        name: str,
        hostname: str,
        *,
        poll_interval: float = 2.0,
        request_timeout: float = 5.0,
        on_started_leading: Callable[[], None] | None = None,
        on_stopped_leading: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.time,
        skew_margin: float = 1.0,
    ) -> None:
        if not hostname:
            raise ValueError("following a lease needs a non-empty hostname")
        if not poll_interval > 0 or not request_timeout > 0:
            raise ValueError(
                f"poll_interval and request_timeout must be > 0, got {poll_interval}, {request_timeout}"
            )
        self.client = client
        self.namespace = namespace
        self.name = name
        self.hostname = hostname
        self.poll_interval = poll_interval
        self.request_timeout = request_timeout
        self._on_started = on_started_leading
        self._on_stopped = on_stopped_leading
        self._clock = clock
        self.skew_margin = skew_margin
        self._valid_until = -math.inf
        self._spec: dict[str, Any] = {}
        self._term: tuple[str, str, int] | None = None
        #: Changes the lease watch applied; a read sent before one is not taken (it may be older).
        self._watched = 0
        self._log = log.bind(lease=f"{namespace}/{name}", hostname=hostname)

    @property
    def is_leader(self) -> bool:
        """True while the observed holder is this replica's kube-scheduler and the lease is valid."""
        return self._term is not None

    @property
    def holder(self) -> str:
        """The holder identity last observed on the lease ("" when unknown or released)."""
        return str(self._spec.get("holderIdentity") or "")

    @property
    def epoch(self) -> str:
        """The lease term this replica leads under (holder@acquireTime#transitions; "" when none)."""
        return _lease_epoch(self._spec) if self._term is not None else ""

    def lease_invalid(self) -> str:
        """Why this replica must not decide on the followed lease now ("" while valid).

        Judged on :func:`fence_clock` from when the read that showed the renewal was sent, so a
        replica waking from a pause refuses before its next read.
        """
        if self._term is None:
            return "not the leader"
        late = fence_clock() - self._valid_until
        if late >= 0:
            return (
                f"the followed lease expired {late:.1f}s ago on this replica's clock "
                f"(less a {self.skew_margin:g}s margin)"
            )
        return ""

    def expires_at(self) -> float | None:
        """When the observed lease expires (POSIX seconds); None without a renewal on record."""
        renewed = _parse_time(self._spec.get("renewTime"))
        duration = self._spec.get("leaseDurationSeconds")
        if renewed is None or not isinstance(duration, int | float):
            return None
        return renewed + float(duration)

    def _observed_term(self) -> tuple[str, str, int] | None:
        """The (holder, acquireTime, transitions) this replica leads under, or None."""
        holder = self.holder
        expires = self.expires_at()
        if not holder.startswith(f"{self.hostname}_") or expires is None or expires <= self._clock():
            return None
        return holder, str(self._spec.get("acquireTime") or ""), int(self._spec.get("leaseTransitions") or 0)

    def _callback(self, leading: bool) -> None:
        self._log.info("leading_started" if leading else "leading_stopped", holder=self.holder)
        callback = self._on_started if leading else self._on_stopped
        if callback is not None:
            try:
                callback()
            except Exception:
                self._log.exception("leader_callback_failed")

    def _update(self) -> None:
        term = self._observed_term()
        if term == self._term:
            return
        if self._term is not None:
            self._term = None
            self._callback(False)
        if term is not None:
            self._term = term
            self._callback(True)

    async def _read(self) -> None:
        sent, sent_wall = fence_clock(), self._clock()
        watched = self._watched
        try:
            lease = await self.client.get_lease(self.namespace, self.name, timeout=self.request_timeout)
        except NotFound:
            if watched == self._watched:
                self._spec = {}
        except (KubeError, TimeoutError) as exc:
            self._log.debug("lease_read_failed", error=str(exc), error_type=type(exc).__name__)
        else:
            if watched != self._watched:
                return  # the watch showed a change while this read was out: its answer may be older
            self._spec = dict(lease.get("spec") or {})
            expires = self.expires_at()
            left = -math.inf if expires is None else expires - sent_wall
            # the renewal this read shows happened before its answer came back: a lease lasts no
            # longer than its duration from now on the monotonic clock, whatever the wall clock did
            duration = self._spec.get("leaseDurationSeconds")
            bound = fence_clock() + float(duration) if isinstance(duration, int | float) else math.inf
            self._valid_until = min(sent + left, bound) - self.skew_margin

    async def _watch_term_end(self, changed: asyncio.Event) -> None:
        """End the term as soon as the lease shows another one: kube-scheduler released it (a
        rolling update) or another took it. A poll would leave up to ``poll_interval`` in which
        two replicas decide (an HA audit). An event never extends the fence (only a read whose
        send time is known does); a watch that fails is opened again a poll interval later."""
        selector = f"metadata.name={self.name}"
        while True:
            try:
                events = self.client.watch(
                    LEASES, self.namespace, resource_version="", field_selector=selector, timeout_seconds=60
                )
                async for event in events:
                    if event.type not in ("ADDED", "MODIFIED", "DELETED"):
                        continue  # a BOOKMARK carries no spec: it is no release
                    spec = {} if event.type == "DELETED" else dict(event.object.get("spec") or {})
                    if self._term is not None and _lease_epoch(spec) != _lease_epoch(self._spec):
                        self._watched += 1
                        self._spec = spec
                        self._update()
                        changed.set()
            except KubeError as exc:
                self._log.debug("lease_watch_failed", error=str(exc), error_type=type(exc).__name__)
            await asyncio.sleep(self.poll_interval)

    async def run(self) -> None:
        """Follow the lease until cancelled; leadership ends (callback) on the way out."""
        changed = asyncio.Event()
        watcher = asyncio.create_task(self._watch_term_end(changed), name="lease-follow-watch")
        try:
            while True:
                changed.clear()
                await self._read()
                self._update()
                wait = self.poll_interval
                expires = self.expires_at()
                if self.is_leader and expires is not None:
                    wait = min(wait, max(expires - self._clock(), 0.0) + 0.01)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):
                        await changed.wait()
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
            if self._term is not None:
                self._term = None
                self._callback(False)
