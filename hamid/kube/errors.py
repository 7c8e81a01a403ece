"""Typed errors of the kube layer: every API failure surfaces as a :class:`KubeError`."""

from __future__ import annotations

import json
from typing import Any


class KubeError(Exception):
    """An API call failed; ``status`` is the HTTP code (None when no answer came back)."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        reason: str = "",
        body: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.reason = reason
        self.body = body

    def __str__(self) -> str:
        code = f"{self.status} " if self.status is not None else ""
        reason = f"{self.reason}: " if self.reason else ""
        return f"{code}{reason}{self.message}"


class Conflict(KubeError):
    """409: a stale resourceVersion precondition, an already bound pod, or an existing name."""


class AlreadyExists(Conflict):
    """409 with reason ``AlreadyExists``: a create found the name taken."""


class NotFound(KubeError):
    """404: the object (or its namespace) does not exist."""


class Gone(KubeError):
    """410: the requested resourceVersion is too old (watch/list must restart from a fresh list)."""


class InvalidRequest(KubeError):
    """Refused before it was sent (status 400): e.g. a name that cannot be a URL path segment."""


class Timeout(KubeError):
    """The call did not finish within its deadline (or the server answered 504)."""


def error_from_status(status: int, body: bytes | str, what: str) -> KubeError:
    """Build the typed error for an HTTP answer ``status`` whose body is (usually) a ``Status``."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    parsed: dict[str, Any] | None = None
    message = text.strip()[:500] or f"HTTP {status}"
    reason = ""
    try:
        decoded = json.loads(text) if text else None
    except ValueError:
        decoded = None
    if isinstance(decoded, dict):
        parsed = decoded
        message = str(decoded.get("message") or message)
        reason = str(decoded.get("reason") or "")
    return error_from_code(status, f"{what}: {message}", reason=reason, body=parsed)


def error_from_code(
    status: int, message: str, *, reason: str = "", body: dict[str, Any] | None = None
) -> KubeError:
    """The :class:`KubeError` subclass for an HTTP status code."""
    cls: type[KubeError] = KubeError
    if status == 409:
        cls = AlreadyExists if reason == "AlreadyExists" else Conflict
    elif status == 404:
        cls = NotFound
    elif status == 410:
        cls = Gone
    elif status == 504:
        cls = Timeout
    return cls(message, status=status, reason=reason, body=body)


def outcome_unknown(exc: BaseException) -> bool:
    """Whether a failed write may still have been applied: a timeout, no answer, or a 5xx.

    A 409, 404 or other 4xx is a definite refusal by the API server: nothing was written.
    """
    if isinstance(exc, TimeoutError | Timeout):
        return True
    return isinstance(exc, KubeError) and (exc.status is None or exc.status >= 500)
