"""The scheduler's record of a booking in a pod's status: the condition ``hamid.io/AllocationBooked``.

hamid's ``/bind`` writes it before the Binding, and every refit after its annotations landed
(docs/trust.md §3.1). Tenants are not granted writes to ``pods/status`` and a pod's create starts
its status empty, so the record is what neither a tenant nor a pod that skipped the webhook can
forge: the scheduler's ledger books from it (when its signature verifies), and the device plugin
serves only pods that carry it (or hold the node lock), and only the allocation it names.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from hamid.model.annotations import ALLOCATION_BOOKED_CONDITION

#: The condition's reason (CamelCase, as Kubernetes writes reasons).
BOOKED_REASON = "SignedAllocation"


@dataclass(frozen=True, slots=True)
class BookedRecord:
    """The allocation a pod's status records as booked, with its signature (not yet verified;
    empty from a scheduler that runs unsigned) and its MIG reservations (``""``: none; the text of
    :func:`~hamid.model.mig.reservation_text`)."""

    node: str
    allocated: str
    signature: str
    mig: str = ""


def booked_condition(node: str, allocated: str, signature: str, now: float, mig: str = "") -> dict[str, str]:
    """The pod condition recording the allocation ``allocated`` on ``node`` (and its MIG reservations
    ``mig``, a field only when there are some) as booked."""
    fields = {"node": node, "allocated": allocated, "signature": signature}
    if mig:
        fields["mig"] = mig
    message = json.dumps(fields, separators=(",", ":"), sort_keys=True)
    return {
        "type": ALLOCATION_BOOKED_CONDITION,
        "status": "True",
        "reason": BOOKED_REASON,
        "message": message,
        "lastTransitionTime": datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def booked_conditions(conditions: Any) -> list[Any]:
    """The record among a pod's ``status.conditions`` (a list of at most one, whatever its content)."""
    if not isinstance(conditions, list):
        return []
    return [c for c in conditions if isinstance(c, dict) and c.get("type") == ALLOCATION_BOOKED_CONDITION]


def booked_record(pod: Mapping[str, Any]) -> BookedRecord | None:
    """The record :func:`booked_condition` wrote in ``pod``'s status; None when absent or unreadable."""
    for condition in booked_conditions((pod.get("status") or {}).get("conditions")):
        try:
            fields = json.loads(condition.get("message") or "")
        except (TypeError, ValueError):
            return None
        if not isinstance(fields, dict):
            return None
        node, allocated, signature = (fields.get(k) for k in ("node", "allocated", "signature"))
        mig = fields.get("mig", "")
        if (
            isinstance(node, str)
            and isinstance(allocated, str)
            and isinstance(signature, str)
            and isinstance(mig, str)
        ):
            return BookedRecord(node, allocated, signature, mig)
        return None
    return None
