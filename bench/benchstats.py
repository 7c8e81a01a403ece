"""Figures shared by the benchmark scripts (imported as ``benchstats`` when a script runs)."""

from __future__ import annotations

import json
import resource
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` by nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def peak_rss_mib(pid: int | None = None) -> float:
    """Peak resident set size in MiB of this process, or of process ``pid`` (Linux ``VmHWM``)."""
    if pid is None:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def print_figures(figures: Mapping[str, Any]) -> None:
    """Print the figures as the script's last output line: one JSON object, floats rounded."""
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in figures.items()}), flush=True)
