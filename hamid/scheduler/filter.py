"""The extender filter verb: plan a node for a pod, reserve it, answer kube-scheduler with one node.

:class:`Filter` refuses what it must not plan (not ready, no GPU asked, a bound pod), asks the
pure :class:`~hamid.scheduler.filter_plan.Planner` for a :class:`~hamid.scheduler.filter_plan.Plan`
(a first-seen pod that fits nowhere gets its capacity reasons computed in slices, yielding to the
loop), hands a winner to the :class:`~hamid.scheduler.filter_reserve.Reserver`, and records HAMi's
FilteringSucceed/FilteringFailed Events.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Mapping

from hamid.fit.fit import PodFitSpec
from hamid.model import objects
from hamid.model import reasons as R
from hamid.model.errors import InvalidInput
from hamid.model.kube import JSON, PodBody
from hamid.scheduler.extender_json import FilterArgs, FilterResult
from hamid.scheduler.filter_plan import ColdReasons, NumaFit, Planner
from hamid.scheduler.filter_reserve import Reserver
from hamid.scheduler.verbs import VerbContext

_MAX_FAILED_EVENTS = 5
#: Capacity reasons a /filter computes inside one plan; more are computed first, in slices.
_COLD_FITS = 100
#: The longest slice of that work between two yields to the event loop.
_SLICE_S = 0.002


class Filter:
    """The filter verb: refusals, the plan, the reserve step, the Events and the answer."""

    def __init__(self, context: VerbContext, planner: Planner, reserver: Reserver) -> None:
        self.config = context.config
        self.settings = context.settings
        self.pods = context.pods
        self.metrics = context.metrics
        self.readiness = context.readiness
        self.record = context.record
        self.planner = planner
        self.reserver = reserver
        self._unfit_events: tuple[dict[str, str], list[str]] | None = None

    async def filter(self, args: FilterArgs) -> FilterResult:
        """The extender filter verb: plan, reserve (undone on failure), answer one node."""
        started = time.perf_counter()
        try:
            result = await self._filter(args)
        finally:
            self.metrics.filter_seconds.observe(time.perf_counter() - started)
        chosen = bool(result.node_names) or bool(result.nodes)
        self.metrics.filter_results.labels("error" if result.error else "fit" if chosen else "unfit").inc()
        return result

    def _refusal(self, pod: JSON) -> FilterResult | None:
        """The answer without planning (no GPU asked, not ready, bad pod); None to plan."""
        reason = self.readiness.reason()
        if reason:
            return FilterResult(error=f"scheduler not ready: {reason}")
        refusal = _filter_refusal(pod, self.pods.get(objects.namespaced_key(pod)))
        return FilterResult(error=refusal) if refusal else None

    async def _filter(self, args: FilterArgs) -> FilterResult:
        pod = args.pod
        try:
            spec = PodFitSpec.from_pod(pod, self.config, self.settings.gpu_policy, self.settings.node_policy)
        except InvalidInput as exc:
            return FilterResult(error=str(exc))
        if not spec.wants_gpu:
            return self._cpu_only(args, spec)
        refused = self._refusal(pod)
        if refused is not None:
            return refused
        epoch = self.readiness.epoch()
        numa = NumaFit.of(pod, objects.uid(pod))
        try:
            node, fitted, failed = self.planner.plan(pod, spec, args.candidate_names, numa, _COLD_FITS)
        except ColdReasons as cold:  # a pod that fits nowhere, first seen: reasons in slices
            await self._warm(cold, spec)
            node, fitted, failed = self.planner.plan(pod, spec, args.candidate_names, numa)
        if node is None or fitted is None:
            self._record_unfit(pod, failed)
            return FilterResult(failed_nodes=failed)
        error = await self.reserver.reserve(pod, node, fitted, numa, epoch)
        if error:
            return FilterResult(error=error)
        self.record(
            pod,
            "Normal",
            R.EVENT_FILTERING_SUCCEED,
            f"find fit node({node}), {len(failed)} nodes not fit, 1 nodes fit({node}:{fitted.score:.2f})",
        )
        if args.nodes is not None:
            chosen = [n for n in args.nodes if objects.name(n) == node]
            return FilterResult(nodes=chosen, failed_nodes=failed)
        return FilterResult(node_names=[node], failed_nodes=failed)

    def _cpu_only(self, args: FilterArgs, spec: PodFitSpec) -> FilterResult:
        """A pod without GPUs: every candidate, or under ``fgd`` the node where it strands the least
        GPU (:meth:`Planner.cpu_only`).

        Such a pod reaches hamid only when the webhook routes CPU-only pods to it
        (``--schedule-cpu-pods``); kube-scheduler then scores the nodes kept, as for any pod. A
        scheduler not ready keeps every candidate (nothing is booked for such a pod).
        """
        names = args.candidate_names
        kept = None if self.readiness.reason() else self.planner.cpu_only(args.pod, spec, names)
        if kept is None:
            return FilterResult(
                node_names=list(args.node_names) if args.node_names is not None else None,
                nodes=list(args.nodes) if args.nodes is not None else None,
            )
        chosen = set(kept)
        failed = {name: R.FGD_MORE_FRAGMENTATION for name in names if name not in chosen}
        if args.nodes is not None:
            return FilterResult(
                nodes=[n for n in args.nodes if objects.name(n) in chosen], failed_nodes=failed
            )
        return FilterResult(node_names=kept, failed_nodes=failed)

    async def _warm(self, cold: ColdReasons, spec: PodFitSpec) -> None:
        """Compute the capacity reasons a plan lacked, yielding to the loop every :data:`_SLICE_S`."""
        deadline = time.perf_counter() + _SLICE_S
        for entry in cold.entries:
            if cold.shape not in entry.unfit:
                self.planner.capacity_reason(entry, cold.shape, spec, cold.quota)
            if time.perf_counter() >= deadline:
                await asyncio.sleep(0)
                deadline = time.perf_counter() + _SLICE_S

    def _record_unfit(self, pod: JSON, failed: dict[str, str]) -> None:
        """HAMi's FilteringFailed Events: one per reason (the first few), naming its nodes."""
        kept = self._unfit_events
        if kept is not None and kept[0] is failed:  # a kept no-fit answer: the same messages
            messages = kept[1]
        else:
            messages = _unfit_messages(failed)
            self._unfit_events = (failed, messages)
        for message in messages:
            self.record(pod, "Warning", R.EVENT_FILTERING_FAILED, message)


_COUNTED_REASON = re.compile(r"\d+/\d+ (\S+)")


def _unfit_messages(failed: Mapping[str, str]) -> list[str]:
    """The FilteringFailed messages of a no-fit answer (``no candidate nodes`` when empty).

    HAMi's ``recordFilteringFailures``: one message per reason *type* (each ``"<n>/<m> <Reason>"``
    part of a node's reason, as its ``ParseReason`` reads it), ``"<k> nodes <Reason>(<n1>,<n2>)"``
    with the nodes sorted; a reason without counts (a node-level one: NUMA, CPU, memory) is its
    own type, where HAMi would drop it. The first :data:`_MAX_FAILED_EVENTS` types by name.
    """
    by_type: dict[str, set[str]] = {}
    for node, reason in failed.items():
        for part in reason.split(", "):
            counted = _COUNTED_REASON.match(part)
            by_type.setdefault(counted.group(1) if counted else part, set()).add(node)
    messages = [
        f"{len(nodes)} nodes {kind}({','.join(sorted(nodes))})"
        for kind, nodes in sorted(by_type.items())[:_MAX_FAILED_EVENTS]
    ]
    return messages or ["no candidate nodes"]


def _filter_refusal(pod: JSON, cached: PodBody | None) -> str:
    """Why the filter must not plan ``pod`` ("" when it may): unnamed, or already bound or started.

    ``cached`` is the scheduler's cached pod of the same name: when it is the same pod (UID) its
    ``spec.nodeName`` and phase are newer than the extender arguments' copy. A bound or running
    pod's GPUs are in use; re-planning it would rewrite its annotations under a running container.
    """
    meta = pod["metadata"]
    for field in ("uid", "name", "namespace"):
        if not isinstance(meta.get(field), str) or not meta[field]:
            return f"extender args pod has no metadata.{field}"
    for copy in (pod, cached):
        if copy is None or objects.uid(copy) != meta["uid"]:
            continue
        spec, status = copy.get("spec"), copy.get("status")
        bound = spec.get("nodeName") if isinstance(spec, dict) else None
        phase = status.get("phase") if isinstance(status, dict) else None
        if bound or phase not in (None, "Pending"):
            where = f"bound to {bound}" if bound else f"{phase}"
            return f"pod {objects.namespaced_key(pod)} is already {where}: it is not filtered again"
    return ""
