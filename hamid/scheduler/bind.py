"""The extender bind verb: node lock (when HAMi takes one), bind-phase patch, the booking's
record in the pod's status, on a ``steer`` node the plugin's acknowledgement, Binding, undo.

Everything fits in :data:`BIND_BUDGET_S`, inside kube-scheduler's 30 s extender httpTimeout; a
failed bind leaves nothing behind (lock released, ``bind-phase``/``bind-time`` removed) and
answers in-band, never with a 500, so kube-scheduler retries the pod.
"""

from __future__ import annotations

import asyncio
import time

from hamid.fit.fit import PodFitSpec
from hamid.kube.cache import NodeCache
from hamid.kube.errors import Conflict, KubeError, NotFound, outcome_unknown
from hamid.kube.retry import RetryBudget, transient
from hamid.log import get_logger
from hamid.model import annotations as ann
from hamid.model import objects
from hamid.model import reasons as R
from hamid.model.errors import InvalidInput
from hamid.model.kube import PodBody
from hamid.model.numa import STEERING_RULES
from hamid.scheduler.extender_json import BindArgs
from hamid.scheduler.nodelock import Holder, LockContention, NodeLocker, holder_state
from hamid.scheduler.numa_ledger import NumaLedgers
from hamid.scheduler.settings import BIND_AFTER_LOCK_S, BIND_BUDGET_S
from hamid.scheduler.signing import record_booked
from hamid.scheduler.verbs import VerbContext

log = get_logger("scheduler")

#: Part of the budget the forward calls leave for undoing a failed bind (pod read, lock release,
#: bind-phase removal).
_BIND_UNDO_S = 3.0
#: The shortest timeout a bind's API call gets when its budget is nearly spent.
_MIN_CALL_S = 0.5
#: The answer of a bind still waiting for a node lock when the scheduler stops.
_SHUTTING_DOWN = (
    "scheduler shutting down: gave up waiting for the lock of node {node}; "
    "kube-scheduler retries the pod with the next leader"
)


class Fenced(Exception):
    """The leadership a bind started under ended before its next write: it writes nothing more.

    No undo either: the new leader may be binding the same pod, and a stale replica removing
    ``bind-phase`` or the node lock would undo the new leader's work (the lock expires, or the
    pod's next bind takes it as its own).
    """


class SteerUnconfirmed(Exception):
    """The node's plugin did not confirm within ``--steer-wait`` that kubelet was sent the replicas
    of the pod being bound (``steer``): bound now, kubelet could align it by another list."""


class Binder:
    """The bind verb over the verbs' shared context, the node cache, the node locker and the NUMA
    ledgers (which say by which rule a node's plugin hides replicas)."""

    def __init__(self, context: VerbContext, nodes: NodeCache, locker: NodeLocker, numa: NumaLedgers) -> None:
        self.ledger = context.ledger
        self.kube = context.kube
        self.config = context.config
        self.settings = context.settings
        self.pods = context.pods
        self.backoff = context.backoff
        self.metrics = context.metrics
        self.readiness = context.readiness
        self.record = context.record
        self.nodes = nodes
        self.locker = locker
        self.numa = numa
        #: UIDs of pods whose bind is in flight (the reconcile leaves their reservations alone).
        self.in_flight: set[str] = set()
        #: Binds running, each its own task (see :meth:`bind`).
        self._running: set[asyncio.Task[str]] = set()
        #: Set on shutdown: binds waiting for a node lock are answered at once.
        self._closing = asyncio.Event()

    def close(self) -> None:
        """The process is stopping: answer every bind waiting for a node lock now (with an error)."""
        self._closing.set()

    async def _acquire_or_close(self, args: BindArgs, wait_s: float, epoch: str) -> float:
        """:meth:`NodeLocker.acquire`, ended by :meth:`close` with :class:`LockContention`; no lock
        is taken once leadership ``epoch`` ended (a bind waiting in line across a takeover)."""
        if self._closing.is_set():
            raise LockContention(_SHUTTING_DOWN.format(node=args.node))
        acquire = asyncio.ensure_future(
            self.locker.acquire(
                args.node, args.pod_namespace, args.pod_name, wait_s, lambda: self._fenced(epoch)
            )
        )
        closing = asyncio.ensure_future(self._closing.wait())
        try:
            await asyncio.wait((acquire, closing), return_when=asyncio.FIRST_COMPLETED)
        finally:
            closing.cancel()
            if not acquire.done():
                acquire.cancel()
                await asyncio.gather(acquire, return_exceptions=True)
                raise LockContention(_SHUTTING_DOWN.format(node=args.node))
        return acquire.result()

    async def bind(self, args: BindArgs) -> str:
        """The extender bind verb; returns the error message ("" on success), never raises.

        The bind runs as its own task: a request cancelled midway (the listener's grace spent at
        shutdown) leaves it running until :meth:`drain` ends it, undoing what it wrote.
        """
        task = asyncio.create_task(self._answer(args), name=f"bind {args.pod_namespace}/{args.pod_name}")
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        return await asyncio.shield(task)

    async def drain(self) -> None:
        """At shutdown, while this replica still leads: binds still running are cancelled, and each
        undoes what it wrote (lock, ``bind-phase``) unless its Binding may have landed."""
        running = list(self._running)
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)

    async def _answer(self, args: BindArgs) -> str:
        started = time.perf_counter()
        self.in_flight.add(args.pod_uid)
        try:
            error = await self._bind(args, asyncio.get_running_loop().time() + BIND_BUDGET_S)
        except Exception as exc:  # an answer in-band, never a 500: kube-scheduler retries the pod
            log.exception("bind_error", pod=f"{args.pod_namespace}/{args.pod_name}", node=args.node)
            error = f"binding pod {args.pod_namespace}/{args.pod_name} to {args.node} failed: {exc!r}"
        finally:
            self.in_flight.discard(args.pod_uid)
        self.metrics.bind_seconds.labels("error" if error else "ok").observe(time.perf_counter() - started)
        return error

    def _call_timeout(self, deadline: float, keep: float = 0.0) -> float:
        """An API call's timeout: the API timeout, shortened so ``keep`` s of the budget remain."""
        remaining = deadline - asyncio.get_running_loop().time() - keep
        return max(min(self.settings.api_timeout_s, remaining), _MIN_CALL_S)

    async def _read_pod(self, args: BindArgs, deadline: float) -> tuple[PodBody | None, str]:
        """The named pod from the cache or the API; None and why when it cannot be read."""
        key = f"{args.pod_namespace}/{args.pod_name}"
        pod: PodBody | None = self.pods.get(key)
        if pod is not None:
            return pod, ""
        try:
            pod = await self.kube.get_pod(
                args.pod_namespace, args.pod_name, timeout=self._call_timeout(deadline, BIND_AFTER_LOCK_S)
            )
        except NotFound:
            res = self.ledger.reservation(args.pod_uid)
            if res is not None and res.key == key:  # only the named pod's own booking
                self.ledger.release(args.pod_uid)
            return None, f"pod {key} not found"
        except KubeError as exc:
            return None, f"reading pod {key} failed: {exc}"
        return pod, ""

    def _fenced(self, epoch: str) -> str:
        """The answer when the leadership the bind started under no longer holds ("" while it does)."""
        reason = self.readiness.check(epoch)
        return f"scheduler not ready: {reason}" if reason else ""

    async def _bind_target(self, args: BindArgs, deadline: float) -> tuple[PodBody | None, str]:
        """The pod a bind goes on with, or None and the answer ("" for a replay of a done bind).

        Nothing is released for a pod or node that does not exist but the named pod's own booking.
        """
        key = f"{args.pod_namespace}/{args.pod_name}"
        reason = self.readiness.reason()
        if reason:
            return None, f"scheduler not ready: {reason}"
        pod, answer = await self._read_pod(args, deadline)
        if pod is None:
            return None, answer
        if objects.uid(pod) != args.pod_uid:
            return None, f"pod {key} has uid {objects.uid(pod)}, not {args.pod_uid}"
        bound = objects.section(pod, "spec").get("nodeName")
        if bound and bound != args.node:
            return None, f"pod {key} is already bound to {bound}, not {args.node}"
        if bound and holder_state(pod, args.node) is Holder.DONE:
            # A replay for a pod already running (or allocated, finished): nothing to do, and the
            # node lock is not taken again. A bound pod still waiting for Allocate goes on: the
            # lock is its own (re-entrant) and stays for the plugin.
            log.info("bind_replayed", pod=key, node=args.node)
            return None, ""
        if self.nodes.get(args.node) is None and args.node not in self.ledger.nodes:
            self.record(pod, "Warning", R.EVENT_BINDING_FAILED, f"node {args.node} not found")
            return None, f"node {args.node} not found"
        return pod, ""

    async def _lock(self, args: BindArgs, pod: PodBody, deadline: float, epoch: str) -> str:
        """Take the node lock for a bind that books GPUs ("" when held, else the answer)."""
        key = f"{args.pod_namespace}/{args.pod_name}"
        res = self.ledger.reservation(args.pod_uid)
        if res is None or res.node != args.node:
            message = f"pod {key} has no GPU reservation on node {args.node}; filter it again"
            self.record(pod, "Warning", R.EVENT_BINDING_FAILED, message)
            return message
        loop = asyncio.get_running_loop()
        keep = BIND_AFTER_LOCK_S + self._steer_wait(args.node)
        wait_s = max(min(self.settings.bind_wait_s, deadline - loop.time() - keep), 0.0)
        try:
            waited = await self._acquire_or_close(args, wait_s, epoch)
        except (LockContention, KubeError) as exc:
            if outcome_unknown(exc):  # the take may have landed: a lock nobody uses must not stay
                await self.locker.release(args.node, args.pod_namespace, args.pod_name, deadline=deadline)
            self.backoff.note(args.node, ok=False)
            self.record(pod, "Warning", R.EVENT_BINDING_FAILED, str(exc))
            return str(exc)
        self.metrics.node_lock_wait_seconds.observe(waited)
        return ""

    async def _bind(self, args: BindArgs, deadline: float) -> str:
        key = f"{args.pod_namespace}/{args.pod_name}"
        epoch = self.readiness.epoch()
        pod, answer = await self._bind_target(args, deadline)
        if pod is None:
            return answer
        needs_lock = self._needs_lock(pod)
        held_before = self.locker.value(args.node)
        if needs_lock:
            refused = self._fenced(epoch) or await self._lock(args, pod, deadline, epoch)
            if refused:
                return refused
        # a replay for a pod bound here and waiting for Allocate: its lock and bind-phase are what
        # the plugin serves it by, so no failure of the replay undoes them
        replay = objects.section(pod, "spec").get("nodeName") == args.node
        # the lock value the node's plugin acknowledges once kubelet was sent the pod's replicas
        steered = (
            self.locker.value(args.node)
            if needs_lock and not replay and self._steer_wait(args.node)
            else None
        )
        binding = False
        try:
            fenced = self._fenced(epoch)
            if fenced:
                raise Fenced(fenced)
            await self.kube.patch_pod_metadata(
                args.pod_namespace,
                args.pod_name,
                annotations={ann.BIND_PHASE: ann.BIND_PHASE_ALLOCATING, ann.BIND_TIME: str(int(time.time()))},
                uid=args.pod_uid,
                timeout=self._call_timeout(deadline, _BIND_UNDO_S),
            )
            await self._record_booked(args, deadline)
            confirmed = steered is None or await self._steer_confirmed(args, steered, held_before, deadline)
            fenced = self._fenced(epoch)
            if fenced:
                raise Fenced(fenced)
            if not confirmed:
                raise SteerUnconfirmed(
                    f"node {args.node}: its device plugin did not confirm within --steer-wait "
                    f"{self.settings.steer_wait_s:g}s that kubelet was sent the GPU replicas booked for "
                    f"pod {key} (hide-replicas steer); kube-scheduler retries the pod"
                )
            binding = True
            await self.kube.bind_pod(
                args.pod_namespace,
                args.pod_name,
                args.pod_uid,
                args.node,
                timeout=self._call_timeout(deadline, _BIND_UNDO_S),
            )
        except asyncio.CancelledError:
            await self._undo_cancelled(args, needs_lock, epoch, binding or replay)
            raise
        except Fenced as exc:
            log.warning("bind_fenced", pod=key, node=args.node, reason=str(exc))
            return str(exc)
        except SteerUnconfirmed as exc:
            await self._undo_bind(args, needs_lock, False, deadline)
            self.backoff.note(args.node, ok=False)
            self.record(pod, "Warning", R.EVENT_BINDING_FAILED, str(exc))
            log.warning("bind_steer_unconfirmed", pod=key, node=args.node, lock=steered)
            return f"binding pod {key} to {args.node} failed: {exc}"
        except KubeError as exc:
            # A Binding that timed out may have landed; a 409 may be a retry of one that did.
            bound = (outcome_unknown(exc) or isinstance(exc, Conflict)) and await self._bound_to(
                args, deadline
            )
            if bound:
                log.info("bind_ok_already_bound", pod=key, node=args.node, error=str(exc))
            elif bound is None:
                # Unknown, the pod unreadable: an undo of a pod that is bound would strip the lock
                # and bind-phase its Allocate needs, for good (kube-scheduler never binds a bound
                # pod again). Kept, a lock whose pod is not bound goes after the stall rule's 20 s.
                self.backoff.note(args.node, ok=False)
                log.warning("bind_outcome_unknown_nothing_undone", pod=key, node=args.node, error=str(exc))
                return f"binding pod {key} to {args.node}: outcome unknown ({exc}); nothing undone"
            elif self._fenced(epoch):
                # another replica decides now and may hold this pod's lock again (re-entrant):
                # an undo of this term's writes would strip what the new term wrote
                log.warning("bind_failed_fenced_nothing_undone", pod=key, node=args.node, error=str(exc))
                return f"binding pod {key} to {args.node} failed: {exc}; nothing undone (not the leader)"
            elif replay:
                log.warning("bind_replay_failed_nothing_undone", pod=key, node=args.node, error=str(exc))
                return (
                    f"binding pod {key} to {args.node} failed: {exc}; nothing undone (the pod is bound there)"
                )
            else:
                await self._undo_bind(args, needs_lock, isinstance(exc, NotFound), deadline)
                self.backoff.note(args.node, ok=False)
                self.record(pod, "Warning", R.EVENT_BINDING_FAILED, str(exc))
                log.warning("bind_failed", pod=key, node=args.node, error=str(exc))
                return f"binding pod {key} to {args.node} failed: {exc}"
        self.backoff.note(args.node, ok=True)
        self.record(
            pod, "Normal", R.EVENT_BINDING_SUCCEED, f"Successfully binding node [{args.node}] to {key}"
        )
        log.info("bind_ok", pod=key, node=args.node)
        return ""

    def _steer_wait(self, node: str) -> float:
        """How long a bind to ``node`` waits for its plugin's acknowledgement (0: not at all): only
        where the node's NUMA profile says its plugin steers (``steer``, under a Topology Manager
        policy but ``none``)."""
        if self.settings.steer_wait_s <= 0 or self.numa.hide_rule(node) not in STEERING_RULES:
            return 0.0
        return self.settings.steer_wait_s

    async def _steer_confirmed(
        self, args: BindArgs, value: str, held_before: str | None, deadline: float
    ) -> bool:
        """Wait on the node cache until the plugin of ``args.node`` acknowledged lock ``value``
        (``hamid.io/devices-listed-for``): kubelet was sent the pod's replicas, the other NUMA
        nodes' free ones hidden, before it can see the pod bound. False after ``--steer-wait`` (or
        when the bind's budget leaves no more), counted and logged. A lock this pod held already
        (``held_before``: an earlier attempt, fenced or of unknown outcome) raises: its
        acknowledgement was for that attempt's booking, and a fresh take will do."""
        if value == held_before:
            raise SteerUnconfirmed(
                f"node {args.node}: the node lock is pod {args.pod_namespace}/{args.pod_name}'s from an "
                "earlier bind attempt, whose device list confirmation does not hold for this booking "
                "(hide-replicas steer); the lock is released and kube-scheduler retries the pod"
            )
        loop = asyncio.get_running_loop()
        started = loop.time()
        end = min(started + self.settings.steer_wait_s, deadline - _BIND_UNDO_S - _MIN_CALL_S)
        while objects.annotations(self.nodes.get(args.node)).get(ann.DEVICES_LISTED_FOR) != value:
            remaining = end - loop.time()
            if remaining <= 0:
                self.metrics.bind_steer_wait_seconds.labels("unconfirmed").observe(loop.time() - started)
                return False
            await self.ledger.wait_change(args.node, remaining)
        waited = loop.time() - started
        self.metrics.bind_steer_wait_seconds.labels("confirmed").observe(waited)
        log.info(
            "bind_steer_confirmed",
            pod=f"{args.pod_namespace}/{args.pod_name}",
            node=args.node,
            ms=round(waited * 1000, 1),
        )
        return True

    async def _record_booked(self, args: BindArgs, deadline: float) -> None:
        """Record the pod's booking in its status before it can run (docs/trust.md §3)."""
        res = self.ledger.reservation(args.pod_uid)
        if res is None or res.node != args.node:
            return
        pod = (args.pod_namespace, args.pod_name, args.pod_uid)
        timeout = self._call_timeout(deadline, _BIND_UNDO_S)
        await record_booked(
            self.kube, self.ledger.keys, pod, res.node, res.raw, budget_s=timeout, mig=res.mig_text
        )

    async def _bound_to(self, args: BindArgs, deadline: float) -> bool | None:
        """Whether the pod is bound to ``args.node`` (after a Binding whose outcome is unknown),
        read again through a few transient failures; None when it stayed unreadable (a pod that is
        gone is not bound)."""
        budget = RetryBudget()
        while True:
            try:
                pod = await self.kube.get_pod(
                    args.pod_namespace, args.pod_name, timeout=self._call_timeout(deadline)
                )
            except NotFound:
                return False
            except KubeError as exc:
                if not transient(exc) or budget.retries <= 0:
                    key = f"{args.pod_namespace}/{args.pod_name}"
                    log.warning("bind_outcome_unreadable", pod=key, error=str(exc))
                    return None
                budget.retries -= 1
                await asyncio.sleep(budget.backoff.next())
                continue
            node = objects.section(pod, "spec").get("nodeName")
            return objects.uid(pod) == args.pod_uid and node == args.node

    async def _undo_bind(self, args: BindArgs, needs_lock: bool, pod_gone: bool, deadline: float) -> None:
        """A failed bind leaves nothing behind: lock released, ``bind-phase``/``bind-time`` removed."""
        if needs_lock:
            await self.locker.release(args.node, args.pod_namespace, args.pod_name, deadline=deadline)
        if pod_gone:
            self.ledger.release(args.pod_uid)
            return
        try:
            await self.kube.patch_pod_metadata(
                args.pod_namespace,
                args.pod_name,
                annotations={ann.BIND_PHASE: None, ann.BIND_TIME: None},
                uid=args.pod_uid,
                timeout=self._call_timeout(deadline),
            )
        except KubeError as undo_exc:
            log.warning(
                "bind_phase_cleanup_failed",
                pod=f"{args.pod_namespace}/{args.pod_name}",
                error=str(undo_exc),
            )

    async def _undo_cancelled(self, args: BindArgs, needs_lock: bool, epoch: str, binding: bool) -> None:
        """A bind cancelled after its lock or ``bind-phase`` write (:meth:`drain`) undoes them as a
        failed one does, within :data:`_BIND_UNDO_S`, while this replica still leads. One cut off
        with its Binding on the wire, or replayed for a pod already bound (``binding``), keeps
        them: the pod's Allocate needs them (a lock whose pod never binds goes after the stall
        rule's 20 s)."""
        key = f"{args.pod_namespace}/{args.pod_name}"
        fenced = self._fenced(epoch)
        if binding or fenced:
            log.warning(
                "bind_cancelled_nothing_undone", pod=key, node=args.node, binding=binding, fenced=fenced
            )
            return
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()  # the undo's own calls must run; a second cancel still ends them
        deadline = asyncio.get_running_loop().time() + _BIND_UNDO_S
        try:
            async with asyncio.timeout(_BIND_UNDO_S):
                await self._undo_bind(args, needs_lock, False, deadline)
        except (TimeoutError, KubeError) as exc:
            log.warning("bind_cancelled_undo_failed", pod=key, node=args.node, error=str(exc) or repr(exc))
            return
        log.warning("bind_cancelled_undone", pod=key, node=args.node)

    def _needs_lock(self, pod: PodBody) -> bool:
        """HAMi takes the node lock only when a regular container requests the GPU count."""
        try:
            settings = self.settings
            requests = PodFitSpec.from_pod(pod, self.config, settings.gpu_policy, settings.node_policy)
        except InvalidInput:
            return True
        return requests.takes_node_lock
