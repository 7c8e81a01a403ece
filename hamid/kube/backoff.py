"""Bounded exponential backoff with jitter."""

from __future__ import annotations

import random


class Backoff:
    """Delays ``initial * factor**n`` capped at ``maximum``, each drawn uniformly in [d/2, d]."""

    def __init__(self, initial: float = 0.2, maximum: float = 30.0, factor: float = 2.0) -> None:
        if not 0 < initial <= maximum or factor < 1:
            raise ValueError(f"bad backoff: initial={initial} maximum={maximum} factor={factor}")
        self.initial = initial
        self.maximum = maximum
        self.factor = factor
        self._current = initial

    def next(self) -> float:
        """The next delay in seconds (grows until ``maximum``)."""
        delay = self._current
        self._current = min(self.maximum, self._current * self.factor)
        return random.uniform(delay / 2, delay)

    def reset(self) -> None:
        """Start again from ``initial`` (after a success)."""
        self._current = self.initial
