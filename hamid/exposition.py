"""What every hamid metrics endpoint shares: process metrics and no ``*_created`` series."""

from __future__ import annotations

from prometheus_client import GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR, CollectorRegistry
from prometheus_client import disable_created_metrics as _disable_created_metrics

# Counters and histograms carry no ``*_created`` series (dashboards never use them; they double
# the series count). Process-wide, set once when any metrics module is imported.
_disable_created_metrics()


def register_process_metrics(registry: CollectorRegistry) -> None:
    """``process_*``, ``python_info`` and ``python_gc_*`` series in ``registry``."""
    for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
        registry.register(collector)
