"""Applying a refit plan: hold both GPU sets, move the reservation, ONE guarded patch, decide.

Until the patch is decided the pod books BOTH its old and its new GPUs (a state hold): a filter
running meanwhile can take neither, so a rollback never over-commits the old GPUs; likewise its
namespace quota counts the larger of its old and new usage. A definite refusal (409, 404, other
4xx) rolls back at once. An ambiguous failure (timeout, no answer, 5xx) may have been applied,
even later: a GET that shows the pod changed decides, and while none does, a follow-up reads it
back again within seconds (:data:`FOLLOW_UP_DELAYS_S`) unless the pod's next event decides first
(see ``Ledger.settle_on_event``) — the accounting follows what the API server holds.
"""

from __future__ import annotations

import asyncio
import functools
from dataclasses import dataclass
from typing import Literal

from hamid.fit.fit import pod_quota_usage
from hamid.kube.client import KubeClient
from hamid.kube.errors import Conflict, KubeError, NotFound, outcome_unknown
from hamid.kube.retry import RetryBudget, write_retrying
from hamid.log import get_logger
from hamid.model import annotations as ann
from hamid.model import objects
from hamid.model.kube import JSON, PodBody
from hamid.model.refit import REFIT_TIMEOUT_S
from hamid.scheduler import ledger as ledger_module
from hamid.scheduler.ledger import Hold, Ledger, Undo
from hamid.scheduler.numa_ledger import NumaLedgers
from hamid.scheduler.outbox import Spawn
from hamid.scheduler.readiness import Readiness
from hamid.scheduler.refit.plan import MSG_NOT_SYNCED, RefitPlan, RefusalCode, RefusalError
from hamid.scheduler.signing import record_booked

log = get_logger("scheduler.refit")

#: Upstream's ``refitPatchTimeout``: no longer than the device plugin's own refit budget.
PATCH_TIMEOUT_S = REFIT_TIMEOUT_S
#: Bound of the GET that learns whether a patch with an ambiguous outcome (timeout, 5xx) landed,
#: and of the GET refreshing a cached pod older than the reservation.
POD_READ_TIMEOUT_S = 2.0


#: When an undecided refit's pod is read back again (seconds after the previous try; then the
#: pod's next event or the reconcile decides, as before).
FOLLOW_UP_DELAYS_S = (0.5, 1.0, 2.0, 4.0, 8.0)


@dataclass(frozen=True, slots=True)
class _Undecided:
    """A refit whose patch outcome is unknown: what reading the pod back needs to settle it."""

    namespace: str
    name: str
    uid: str
    node: str
    precondition: str
    new_allocated: str
    hold: Hold
    undo: Undo


def _definite_code(exc: BaseException) -> RefusalCode:
    if isinstance(exc, Conflict):
        return RefusalCode.PATCH_CONFLICT
    if isinstance(exc, NotFound):
        return RefusalCode.POD_GONE
    return RefusalCode.PATCH_FAILED


class RefitCommitter:
    """Commits plans against one scheduler's state and API client (see the module docs)."""

    def __init__(
        self,
        ledger: Ledger,
        ledgers: NumaLedgers,
        kube: KubeClient,
        readiness: Readiness,
        spawn: Spawn,
        patch_timeout: float = PATCH_TIMEOUT_S,
    ) -> None:
        self.ledger = ledger
        self.ledgers = ledgers
        self.kube = kube
        self.readiness = readiness
        self.spawn = spawn
        self.patch_timeout = patch_timeout
        #: Per pod UID, its newest refit's record (a token): an older record is not sent again.
        self._recording: dict[str, object] = {}

    async def commit(self, pod: PodBody, uid: str, plan: RefitPlan, remaining: float, epoch: str) -> JSON:
        """Patch ``pod`` (guarded by its resourceVersion) with ``plan`` within ``remaining`` s.

        Returns the patched pod; raises :class:`RefusalError` with nothing left changed, or with
        the accounting following what the API server holds when the outcome was ambiguous. A
        refit whose leadership ``epoch`` no longer holds is refused before anything changes.
        """
        fenced = self.readiness.check(epoch)
        if fenced:
            message = f"{MSG_NOT_SYNCED}: scheduler not ready: {fenced}"
            raise RefusalError(RefusalCode.NOT_READY, message, identified=False)
        precondition = objects.resource_version(pod)
        ledger = self.ledger
        res = ledger.reservation(uid)
        if res is None:
            raise RefusalError(RefusalCode.UNKNOWN_POD, f"pod {uid} is not tracked by the scheduler")
        old_mem, old_cores = pod_quota_usage(res.layout, res.kinds, res.init_released)
        new_mem, new_cores = pod_quota_usage(plan.layout, res.kinds, res.init_released)
        mem, cores = max(old_mem - new_mem, 0), max(old_cores - new_cores, 0)
        hold = ledger.hold(uid, res.node, res.applied, res.namespace, mem, cores)
        signature = ledger.signature(uid, res.node, plan.new_allocated)  # a refit re-signs
        undo = ledger.move(uid, plan.layout, plan.new_allocated, signature[ann.ALLOCATION_SIGNATURE])
        namespace, name = objects.namespace(pod), objects.name(pod)
        timeout = min(self.patch_timeout, remaining)
        annotations = {
            ann.DEVICES_TO_ALLOCATE: plan.new_pending,
            ann.DEVICES_ALLOCATED: plan.new_allocated,
            **signature,
        }
        try:
            async with asyncio.timeout(timeout):
                patched = await self.kube.patch_pod_metadata(
                    namespace, name, annotations=annotations, resource_version=precondition, timeout=timeout
                )
        except (KubeError, TimeoutError) as exc:
            detail = str(exc) or f"no answer within {timeout:g}s"
            if not outcome_unknown(exc):
                undo()
                ledger.release_hold(hold)
                raise RefusalError(_definite_code(exc), f"cannot patch pod annotations: {detail}") from None
            outcome = await self.decide(namespace, name, uid, precondition, plan.new_allocated)
            if outcome is None:
                landed = functools.partial(
                    self._landed_by_event, (namespace, name, uid), res.node, plan.new_allocated
                )
                ledger.settle_on_event(hold, precondition, plan.new_allocated, landed)
                log.warning("refit_patch_outcome_unknown", held=sorted(hold.amounts))
                pending = _Undecided(
                    namespace, name, uid, res.node, precondition, plan.new_allocated, hold, undo
                )
                self.spawn(self.follow_up(pending))
                what = (
                    "its outcome is unknown; both GPU sets stay booked until the pod is read back or updated"
                )
            elif outcome is False:
                undo()
                ledger.release_hold(hold)
                what = "it was not applied"
            else:  # it landed: the refit succeeded, and the plugin must learn its devices
                ledger.release_hold(hold)
                log.info("refit_patch_applied_answer_lost", error=detail)
                return self._landed(namespace, name, uid, res.node, plan, outcome)
            raise RefusalError(
                RefusalCode.PATCH_TIMEOUT, f"cannot patch pod annotations: {detail} ({what})"
            ) from None
        except BaseException:
            undo()
            ledger.release_hold(hold)
            raise
        ledger.release_hold(hold)
        return self._landed(namespace, name, uid, res.node, plan, patched)

    def _landed(self, namespace: str, name: str, uid: str, node: str, plan: RefitPlan, patched: JSON) -> JSON:
        """The patch is on the pod: the NUMA ledger learns kubelet's choice, the record follows."""
        self._feed_ledger(uid, node, plan)
        self.spawn(self._record((namespace, name, uid), node, plan.new_allocated))
        return patched

    async def _record(self, pod: tuple[str, str, str], node: str, allocated: str) -> None:
        """Record the refitted allocation as booked in the pod's status (after its annotations
        landed: a record must never name an allocation that was not applied). Off the refit's
        path: until it lands, the annotations' later signature outranks the older record. Sent again
        through transient failures (a strategic merge of one condition: the same write twice is one),
        unless a newer refit of the pod records its own allocation meanwhile."""
        uid, token = pod[2], object()
        self._recording[uid] = token

        async def write() -> None:
            if self._recording.get(uid) is not token:
                log.info("refit_booking_record_superseded", pod=f"{pod[0]}/{pod[1]}")
                return
            await record_booked(
                self.kube, self.ledger.keys, pod, node, allocated, budget_s=POD_READ_TIMEOUT_S
            )

        async def never_read_back() -> None:
            return None

        try:
            await write_retrying(
                write, never_read_back, RetryBudget(), f"pod {pod[0]}/{pod[1]} booking record"
            )
        except (KubeError, TimeoutError) as exc:
            log.warning("refit_booking_record_failed", pod=f"{pod[0]}/{pod[1]}", error=str(exc))
        finally:
            if self._recording.get(uid) is token:
                del self._recording[uid]

    def _feed_ledger(self, uid: str, node: str, plan: RefitPlan) -> None:
        """The allowed set told which NUMA node kubelet chose: the NUMA ledger takes it at once."""
        entry = self.ledger.nodes.get(node)
        if entry is None or not plan.devices:
            return
        numa_of = {d.id: d.numa for d in entry.infos}
        numas = {numa_of.get(d.uuid) for d in plan.devices}
        numa = numas.pop() if len(numas) == 1 else None
        if numa is not None:
            self.ledgers.on_refit(uid, node, plan.index, numa)

    async def follow_up(self, pending: _Undecided) -> None:
        """Settle an undecided refit within seconds: read the pod back until it says, or an event did;
        a pod still unchanged at :data:`~hamid.scheduler.ledger.UNDECIDED_HOLD_S` was not applied
        (the reconcile judges so too; this holds where it is off).

        Under the node's lock, so no refit of the node interleaves; a hold already released (the
        pod's event, its deletion, or a reconcile decided first) ends it with nothing done.
        """
        ledger = self.ledger
        started = asyncio.get_running_loop().time()
        for delay in FOLLOW_UP_DELAYS_S:
            await asyncio.sleep(delay)
            async with ledger.node_guard(pending.node):
                if pending.hold not in ledger.holds(pending.uid):
                    return
                outcome = await self.decide(
                    pending.namespace, pending.name, pending.uid, pending.precondition, pending.new_allocated
                )
                if outcome is None or pending.hold not in ledger.holds(pending.uid):
                    continue
                if outcome is not False:
                    pod = (pending.namespace, pending.name, pending.uid)
                    self.spawn(self._record(pod, pending.node, pending.new_allocated))
                else:
                    pending.undo()
                ledger.release_hold(pending.hold)
            waited = round(asyncio.get_running_loop().time() - started, 3)
            log.info("refit_outcome_settled", applied=outcome is not False, after_s=waited)
            return
        log.warning("refit_outcome_still_unknown", held=sorted(pending.hold.amounts))
        await asyncio.sleep(ledger_module.UNDECIDED_HOLD_S - (asyncio.get_running_loop().time() - started))
        await self._settle_at_bound(pending, started)

    async def _settle_at_bound(self, pending: _Undecided, started: float) -> None:
        """An undecided refit's hold still there at the bound: landed if the pod says so, not
        applied if it is unchanged (no write waits that long at the API server); a pod that cannot
        be read decides nothing, and it is read again (the last follow-up delay apart)."""
        ledger = self.ledger
        pod = (pending.namespace, pending.name, pending.uid)
        while True:
            async with ledger.node_guard(pending.node):
                if pending.hold not in ledger.holds(pending.uid):
                    return
                outcome = await self.decide(*pod, pending.precondition, pending.new_allocated, at_bound=True)
                if pending.hold not in ledger.holds(pending.uid):
                    return
                if outcome is not None:
                    self._settled_at_bound(pending, outcome, started)
                    return
            await asyncio.sleep(FOLLOW_UP_DELAYS_S[-1])

    def _landed_by_event(self, pod: tuple[str, str, str], node: str, allocated: str) -> None:
        """A pod event (or a list) decided an undecided refit and showed it landed: its record
        follows at once, as for any landed refit (else a restart would rebuild the booking from
        the older record)."""
        log.info("refit_outcome_settled_by_event", pod=f"{pod[0]}/{pod[1]}", applied=True)
        self.spawn(self._record(pod, node, allocated))

    def _settled_at_bound(self, pending: _Undecided, outcome: JSON | Literal[False], started: float) -> None:
        """Act on what the read-back at the bound said (under the node's lock)."""
        if outcome:  # it landed after all (no event told the ledger)
            self.spawn(
                self._record(
                    (pending.namespace, pending.name, pending.uid), pending.node, pending.new_allocated
                )
            )
        else:
            pending.undo()
            log.warning(
                "refit_hold_expired",
                pod=f"{pending.namespace}/{pending.name}",
                node=pending.node,
                held=sorted(pending.hold.amounts),
                waited_s=round(asyncio.get_running_loop().time() - started, 1),
            )
        self.ledger.release_hold(pending.hold)

    async def decide(
        self,
        namespace: str,
        name: str,
        uid: str,
        precondition: str,
        new_allocated: str,
        *,
        at_bound: bool = False,
    ) -> JSON | Literal[False] | None:
        """Whether an ambiguous patch landed, from one bounded GET: the pod read back when it did,
        False when the pod changed otherwise (the patch's resourceVersion precondition can no
        longer hold), None when the GET failed or shows the pod unchanged: the API server may still
        apply a write whose client gave up (an audit saw one land after a read-back judged it not
        applied, booked over the pod placed on the GPUs its undo had freed). ``at_bound``: past
        :data:`~hamid.scheduler.ledger.UNDECIDED_HOLD_S` no write waits: unchanged is False."""
        try:
            current = await self.kube.get_pod(namespace, name, timeout=POD_READ_TIMEOUT_S)
        except NotFound:
            return False
        except KubeError as exc:
            log.warning("refit_patch_outcome_unreadable", error=str(exc))
            return None
        if objects.uid(current) != uid:
            return False
        if objects.resource_version(current) == precondition:
            return False if at_bound else None
        return current if objects.annotations(current).get(ann.DEVICES_ALLOCATED) == new_allocated else False
