"""Listen addresses (``host:port``) and starting an aiohttp app on one, failing in one line."""

from __future__ import annotations

import errno
import logging
import ssl
from typing import TYPE_CHECKING

import click
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from hamid.model._wire import is_decimal
from hamid.model.errors import InvalidInput


class ListenError(InvalidInput):
    """A listener could not be started (address in use, not available, permission); no traceback."""


def parse_listen(value: str) -> tuple[str, int]:
    """``host:port`` (``:port`` = all interfaces, ``[v6]:port`` accepted) → (host, port)."""
    host, sep, port = value.strip().rpartition(":")
    if not sep or not is_decimal(port) or not 0 <= int(port) <= 65535:
        raise InvalidInput(f"listen address {value!r} must be host:port (port 0-65535), e.g. 0.0.0.0:9443")
    if host.startswith("[") != host.endswith("]") or any(c.isspace() or c in "/?#@" for c in host):
        raise InvalidInput(f"listen address {value!r} has an invalid host {host!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


if TYPE_CHECKING:
    _StrParamType = click.ParamType[str]
else:  # click < 8.4 (the lower bound is 8.1): ParamType is not generic at run time
    _StrParamType = click.ParamType


class ListenAddress(_StrParamType):
    """A click parameter type checking ``host:port`` when the command line is parsed."""

    name = "host:port"

    def __init__(self, allow_empty: bool = False) -> None:
        self.allow_empty = allow_empty

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value).strip()
        if not text and self.allow_empty:
            return ""
        try:
            parse_listen(text)
        except InvalidInput as exc:
            self.fail(str(exc), param, ctx)
        return text


LISTEN = ListenAddress()
#: A listen address that may be empty (the listener is off).
OPTIONAL_LISTEN = ListenAddress(allow_empty=True)

#: How long a stopping listener lets requests in flight finish before cancelling them (aiohttp's
#: default is 60 s, past a pod's 30 s termination grace period).
SHUTDOWN_GRACE_S = 5.0
_BIND_REASONS = {
    errno.EADDRINUSE: "address already in use (another process listens there)",
    errno.EADDRNOTAVAIL: "address not available on this host",
    errno.EACCES: "permission denied (ports below 1024 need privileges)",
}


#: The longest part of a client's bad request quoted in the log line about it.
_QUOTED = 200


class _ClientFaults(logging.Filter):
    """aiohttp logs a request it cannot parse, a body it cannot decode and a client gone mid-body
    at ERROR with a traceback: the client's doing, not the server's, so one warning naming it (a
    log line per connection anyone can open must not be a traceback)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, (HttpProcessingError, web.RequestPayloadError, ConnectionResetError)):
            detail = " ".join(str(exc).split())[:_QUOTED]
            record.msg, record.args = f"{record.getMessage()}: {type(exc).__name__}: {detail}", None
            record.exc_info = record.exc_text = None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            return logging.getLogger(record.name).isEnabledFor(logging.WARNING)  # as if logged so
        return True


_CLIENT_FAULTS = _ClientFaults()


async def serve(
    app: web.Application, listen: str, ssl_context: ssl.SSLContext | None = None, *, what: str = "listener"
) -> tuple[web.AppRunner, int]:
    """Start ``app`` on ``listen``; returns the runner (call ``cleanup()``) and the bound port.

    A bind failure raises :class:`ListenError` naming ``what``, the address and the reason.
    """
    host, port = parse_listen(listen)
    logging.getLogger("aiohttp.server").addFilter(_CLIENT_FAULTS)  # once: the same filter
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=SHUTDOWN_GRACE_S)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=ssl_context)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        reason = _BIND_REASONS.get(exc.errno or 0, exc.strerror or str(exc))
        raise ListenError(f"cannot start the {what} on {listen}: {reason}") from None
    server = site._server
    sockets = getattr(server, "sockets", None) or ()
    bound = sockets[0].getsockname()[1] if sockets else port
    return runner, int(bound)
