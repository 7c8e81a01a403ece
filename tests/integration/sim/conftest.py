"""Simulator fixtures: captured structlog entries (every level) for one test."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
import structlog
from structlog.testing import LogCapture


@pytest.fixture
def logs() -> Iterator[list[dict[str, Any]]]:
    """Every log entry (debug and up) written during the test, with bound context."""
    saved = structlog.get_config()
    capture = LogCapture()
    structlog.configure(
        processors=[structlog.contextvars.merge_contextvars, capture],
        wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG),
        cache_logger_on_first_use=False,
    )
    try:
        yield capture.entries
    finally:
        structlog.configure(**saved)
