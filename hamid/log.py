"""structlog setup: JSON lines when not on a terminal, console rendering on one.

Request handlers bind ``pod`` (``namespace/name``), ``node`` and ``container`` with
:func:`structlog.contextvars.bound_contextvars` so every line of a request carries them.
"""

from __future__ import annotations

import logging
import sys
from typing import Literal

import structlog

LogFormat = Literal["auto", "json", "console"]
LOG_LEVELS = ("debug", "info", "warning", "error")


def configure(log_format: LogFormat = "auto", level: str = "info") -> None:
    """Configure structlog (and stdlib logging, for libraries) once for the process."""
    if level.lower() not in LOG_LEVELS:
        raise ValueError(f"unknown log level {level!r}; choose one of {', '.join(LOG_LEVELS)}")
    numeric = getattr(logging, level.upper())
    use_console = log_format == "console" or (log_format == "auto" and sys.stderr.isatty())
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer() if use_console else structlog.processors.JSONRenderer()
    )
    stamp = structlog.processors.TimeStamper(fmt="iso", utc=True)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            stamp,
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    # libraries log through stdlib logging: the same one line per record, their logger as component
    handler = _LibraryHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
            foreign_pre_chain=[
                structlog.stdlib.add_log_level,
                _component,
                stamp,
                structlog.processors.format_exc_info,
            ],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [h for h in root.handlers if not isinstance(h, _LibraryHandler)] + [handler]
    root.setLevel(max(numeric, logging.WARNING))


class _LibraryHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler :func:`configure` installs (replaced, not added again, when called again)."""


def _component(_logger: object, _name: str, event: structlog.typing.EventDict) -> structlog.typing.EventDict:
    """A library record's logger name as ``component``, as hamid's own lines carry theirs."""
    record = event.get("_record")
    if isinstance(record, logging.LogRecord):
        event.setdefault("component", record.name)
    return event


def get_logger(name: str) -> structlog.typing.FilteringBoundLogger:
    """A logger carrying ``component=<name>``.

    The logger is a lazy proxy: it takes the configuration in force when it is used, so module-level
    loggers created before :func:`configure` still honour the configured level and format.
    """
    logger: structlog.typing.FilteringBoundLogger = structlog.get_logger(component=name)
    return logger
