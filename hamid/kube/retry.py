"""Retrying a resourceVersion-guarded write through transient API failures, within a budget.

A transient failure is a 429 (throttled: nothing was written), a 5xx, a timeout or no answer
(the write may have landed). Before a write whose outcome is unknown is sent again, one read
decides whether it landed: a guarded write that landed would otherwise come back as a 409 and
look like someone else's change. A 409 or another 4xx is a definite answer and is raised at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from hamid.kube.backoff import Backoff
from hamid.kube.errors import Conflict, KubeError, outcome_unknown
from hamid.log import get_logger

log = get_logger("kube.retry")

T = TypeVar("T")

#: Status of a throttled request: the API server wrote nothing (APF, or a webhook's 429).
TOO_MANY_REQUESTS = 429


def transient(exc: BaseException) -> bool:
    """Whether a failed API call is worth sending again: a 429, a 5xx, a timeout or no answer."""
    return outcome_unknown(exc) or (isinstance(exc, KubeError) and exc.status == TOO_MANY_REQUESTS)


@dataclass
class RetryBudget:
    """Transient retries one operation may spend (shared by all its writes), with their backoff."""

    retries: int = 3
    backoff: Backoff = field(default_factory=lambda: Backoff(initial=0.2, maximum=1.0))

    @property
    def worst_wait_s(self) -> float:
        """The longest the budget's backoff can sleep in all (its delays, at their maximum)."""
        total, delay = 0.0, self.backoff.initial
        for _ in range(self.retries):
            total += delay
            delay = min(self.backoff.maximum, delay * self.backoff.factor)
        return total


async def write_retrying(
    write: Callable[[], Awaitable[T]],
    landed: Callable[[], Awaitable[T | None]],
    budget: RetryBudget,
    what: str,
) -> T:
    """``write()``, sent again after a transient failure while ``budget`` lasts.

    ``landed()`` reads back after a failure whose outcome is unknown (and after a 409 that
    followed one): the written object when the write is in it, None otherwise. The last failure
    is raised when the budget is spent.
    """
    ambiguous = False
    while True:
        try:
            return await write()
        except (KubeError, TimeoutError) as exc:
            if isinstance(exc, Conflict) and not ambiguous:
                raise
            if outcome_unknown(exc) or isinstance(exc, Conflict):
                ambiguous = True
                written = await _read_back(landed, what)
                if written is not None:
                    log.info("write_landed_despite_error", what=what, error=str(exc) or type(exc).__name__)
                    return written
            if isinstance(exc, Conflict) or not transient(exc) or budget.retries <= 0:
                raise
            budget.retries -= 1
            delay = budget.backoff.next()
            log.warning(
                "write_retry", what=what, error=str(exc) or type(exc).__name__, delay_s=round(delay, 3)
            )
            await asyncio.sleep(delay)


async def _read_back(landed: Callable[[], Awaitable[T | None]], what: str) -> T | None:
    try:
        return await landed()
    except (KubeError, TimeoutError) as exc:
        log.warning("write_outcome_unreadable", what=what, error=str(exc) or type(exc).__name__)
        return None
