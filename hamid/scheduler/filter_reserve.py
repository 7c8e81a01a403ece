"""The ``/filter`` reserve step: book a plan's GPUs (and CPUs, NUMA placement), then patch the pod.

The booking comes first, synchronously, so a filter running meanwhile plans around it; the patch of
the allocation annotations follows, and any failure undoes every booking. Nothing is booked or
written once the leadership the filter started under has ended.
"""

from __future__ import annotations

import time

from hamid.fit.fit import Fitted
from hamid.fit.node_room import CpuMem, pod_cpu_mem
from hamid.fit.numa_predict import Outcome, Prediction
from hamid.log import get_logger
from hamid.model import annotations as ann
from hamid.model import objects
from hamid.model.errors import InvalidInput
from hamid.model.kube import JSON
from hamid.model.mig import reservation_text
from hamid.model.numa import NUMA_PREDICTED, encode_prediction
from hamid.scheduler.filter_plan import NumaFit
from hamid.scheduler.node_cpu_mem import NodeCpuMem
from hamid.scheduler.numa_ledger import UNKNOWN, NumaLedgers
from hamid.scheduler.verbs import VerbContext

log = get_logger("scheduler")


class Reserver:
    """Books a plan in the ledger, the CPU/memory view and the NUMA ledgers, and patches the pod."""

    def __init__(self, context: VerbContext, ledgers: NumaLedgers, cpu_mem: NodeCpuMem) -> None:
        self.ledger = context.ledger
        self.kube = context.kube
        self.readiness = context.readiness
        self.metrics = context.metrics
        self.api_timeout_s = context.settings.api_timeout_s
        self.ledgers = ledgers
        self.cpu_mem = cpu_mem
        #: Pods whose allocation patch is on the wire: a second filter of one of them (kube-scheduler
        #: gave up on the first) waits for its retry, or the slower patch could land last and name
        #: GPUs the ledger no longer books.
        self._writing: set[str] = set()

    async def reserve(self, pod: JSON, node: str, fitted: Fitted, numa: NumaFit, epoch: str) -> str:
        """Book the fit, then patch the allocation annotations; "" when done, else the error.

        Nothing is booked or written unless the leadership the filter started under still holds.
        """
        fenced = self.readiness.check(epoch)
        if fenced:
            return f"scheduler not ready: {fenced}"
        uid, name = objects.uid(pod), objects.namespaced_key(pod)
        if uid in self._writing:
            return f"an earlier filter of pod {name} is still writing its allocation; retry"
        raw = ann.encode_pod_devices(fitted.devices)
        mig = reservation_text(fitted.mig)
        signature = self.ledger.signature(uid, node, raw, mig)
        annotations: dict[str, str | None] = {
            ann.VGPU_NODE: node,
            ann.VGPU_TIME: str(int(time.time())),
            ann.DEVICES_TO_ALLOCATE: raw,
            ann.DEVICES_ALLOCATED: raw,
            **signature,
        }
        if mig or ann.MIG_ALLOCATIONS in objects.annotations(pod):  # HAMi writes none for no MIG device
            annotations[ann.MIG_ALLOCATIONS] = mig or None
        prediction = numa.predictions.get(node)
        predicted = self.prediction_annotation(node, prediction)
        if predicted is not None or NUMA_PREDICTED in objects.annotations(pod):
            annotations[NUMA_PREDICTED] = predicted
        undos = [
            self.ledger.reserve(
                pod, node, fitted.devices, raw, signature[ann.ALLOCATION_SIGNATURE], fitted.mig
            )
        ]
        self._writing.add(uid)
        try:
            undos.append(self.cpu_mem.assume(uid, node, _cpu_mem(pod)))
            if predicted is not None and prediction is not None:
                undos.append(self.ledgers.book(uid, node, prediction, pod))
            await self.kube.patch_pod_metadata(
                objects.namespace(pod),
                objects.name(pod),
                annotations=annotations,
                labels={ann.VGPU_NODE: node},
                uid=uid,
                timeout=self.api_timeout_s,
            )
        except BaseException as exc:  # any failure, a cancelled request too: no booking left behind
            for undo in reversed(undos):
                undo()
            if not isinstance(exc, Exception):
                raise
            log.warning("filter_patch_failed", pod=name, node=node, error=str(exc))
            return f"patching pod {name} failed: {exc}"
        finally:
            self._writing.discard(uid)
        self.ledger.confirm(uid, node, raw)
        if prediction is not None and prediction.outcome is Outcome.UNKNOWN:
            self.metrics.numa_predictions.labels(UNKNOWN).inc()
        log.info("filter_fit", pod=name, node=node, devices=raw, mig=mig, numa=_describe(prediction))
        return ""

    def prediction_annotation(self, node: str, prediction: Prediction | None) -> str | None:
        """The ``hamid.io/numa-predicted`` value of a placed prediction on ``node`` (None otherwise)."""
        if prediction is None or prediction.outcome is not Outcome.PLACED:
            return None
        profile = self.ledgers.nodes[node].profile
        return encode_prediction(prediction.record(profile.generation)) if profile is not None else None


def _cpu_mem(pod: JSON) -> CpuMem:
    """The pod's cpu/memory request (nothing when unreadable: kube-scheduler would not pass it)."""
    try:
        return pod_cpu_mem(pod)
    except InvalidInput:
        return CpuMem()


def _describe(prediction: Prediction | None) -> str:
    """The prediction for the filter's log line: ``placed numa=0,1``, ``unknown: reason``, ``none``."""
    if prediction is None:
        return "none"
    if prediction.outcome is Outcome.PLACED:
        numas = sorted({n for c in prediction.containers for n in c.numa})
        return f"placed numa={','.join(map(str, numas)) or '-'}"
    return f"{prediction.outcome}: {prediction.reason}"
