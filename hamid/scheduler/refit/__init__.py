"""``POST /refit``: move one container's pending GPU reservation onto GPUs kubelet allows (NUMA refit).

Wire-compatible with HAMi's ``RefitNumaAllocation`` (docs/refit.md §2-§4): refusals are
in-band (HTTP 200, ``succeeded: false``; malformed JSON too), a missing body answers 400. The
decision (:mod:`.plan`, pure) re-runs the normal fit restricted to the allowed GPUs with the
reservation's amounts (every policy kept, phase-aware capacity, quota on the positional layout);
the commit (:mod:`.commit`) is ONE merge patch of both allocation annotations (only the target
container's entry changes, every other byte is kept) guarded by the pod's resourceVersion; the
handler (:mod:`.handler`) holds one deadline (the refit budget of both sides of the wire,
:data:`hamid.model.refit.REFIT_TIMEOUT_S`) from the request's arrival over authentication
(:mod:`.auth`), the cache wait, the node's guard and the patch.

Better than upstream: the lock is the scheduler's *per-node* lock, and the reservation is moved
tentatively before the patch is awaited (rolled back on failure), so a slow API server delays only
refits of that node and filters never see a stale plan; a pod deleted meanwhile is neither
released twice nor resurrected (#3027).
"""

from hamid.scheduler.refit.commit import PATCH_TIMEOUT_S, POD_READ_TIMEOUT_S, RefitCommitter
from hamid.scheduler.refit.handler import (
    MSG_NO_BODY,
    SYNC_WAIT_S,
    RefitHost,
    RefitMetrics,
    RefitService,
    refit_routes,
)
from hamid.scheduler.refit.plan import (
    MSG_NOT_SYNCED,
    NoOp,
    RefitFacts,
    RefitPlan,
    RefusalCode,
    RefusalError,
    Refused,
    identify,
    plan_refit,
    splice_entry,
)

__all__ = [
    "MSG_NOT_SYNCED",
    "MSG_NO_BODY",
    "PATCH_TIMEOUT_S",
    "POD_READ_TIMEOUT_S",
    "SYNC_WAIT_S",
    "NoOp",
    "RefitCommitter",
    "RefitFacts",
    "RefitHost",
    "RefitMetrics",
    "RefitPlan",
    "RefitService",
    "RefusalCode",
    "RefusalError",
    "Refused",
    "identify",
    "plan_refit",
    "refit_routes",
    "splice_entry",
]
