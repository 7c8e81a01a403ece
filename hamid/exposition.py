"""What every hamid metrics endpoint shares: process metrics and no ``*_created`` series."""

from __future__ import annotations

import os
import platform
import sys

from prometheus_client import GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR, CollectorRegistry, Gauge
from prometheus_client import disable_created_metrics as _disable_created_metrics

from hamid import __version__

#: HAMi registers its scheduler and monitor collectors with the constant label ``zone="vGPU"``.
HAMI_ZONE = "vGPU"

# Counters and histograms carry no ``*_created`` series (dashboards never use them; they double
# the series count). Process-wide, set once when any metrics module is imported.
_disable_created_metrics()


def register_process_metrics(registry: CollectorRegistry) -> None:
    """``process_*``, ``python_info`` and ``python_gc_*`` series in ``registry``."""
    for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
        registry.register(collector)


def register_hami_build_info(registry: CollectorRegistry) -> None:
    """HAMi's ``hami_build_info`` (``pkg/metrics``): 1, with the build in its labels; hamid's
    version, the source revision the image was built from (``HAMID_REVISION``, set by the
    Containerfile) and Python stand where HAMi's binary names its Go build (no date)."""
    Gauge(
        "hami_build_info",
        "hami build metadata exposed as labels with a constant value of 1.",
        registry=registry,
        labelnames=("version", "revision", "build_date", "go_version", "compiler", "platform"),
    ).labels(
        __version__,
        os.environ.get("HAMID_REVISION", "")[:40],
        "",
        "",
        platform.python_implementation().lower(),
        f"{sys.platform}/{platform.machine()}",
    ).set(1)
