"""The ``hami.io/numa-alignment`` pod annotation (opt-in NUMA refit mode)."""

from __future__ import annotations

import enum
from collections.abc import Mapping

from hamid.model._wire import go_quote, type_name
from hamid.model.annotations import NUMA_ALIGNMENT
from hamid.model.errors import InvalidInput


class AlignmentMode(enum.StrEnum):
    """How a pod wants its GPUs aligned with kubelet's NUMA choice."""

    NONE = "none"
    BEST_EFFORT = "best-effort"
    STRICT = "strict"


_PARSEABLE = {mode.value: mode for mode in (AlignmentMode.BEST_EFFORT, AlignmentMode.STRICT)}


def parse_alignment(annotations: Mapping[str, str] | None) -> AlignmentMode:
    """The pod's alignment mode: ``NONE`` when the annotation is absent.

    The value is case-insensitive and whitespace-trimmed; ``best-effort`` and ``strict`` are the only
    accepted values. An empty value, an unknown value or ``"true"`` raises ``InvalidInput`` naming the
    key and the value (upstream then disables the feature for the pod and logs a warning).
    """
    if annotations is None or NUMA_ALIGNMENT not in annotations:
        return AlignmentMode.NONE
    raw = annotations[NUMA_ALIGNMENT]
    if not isinstance(raw, str):
        raise InvalidInput(f"invalid {NUMA_ALIGNMENT} annotation: want a string value, got {type_name(raw)}")
    mode = _PARSEABLE.get(raw.strip().lower())
    if mode is None:  # upstream's wording (HAMi #2729 ParseNumaAlignmentMode), which users grep for
        raise InvalidInput(
            f"invalid {NUMA_ALIGNMENT} annotation {go_quote(raw)}: expected "
            f"{go_quote(AlignmentMode.BEST_EFFORT.value)} or {go_quote(AlignmentMode.STRICT.value)}"
        )
    return mode
