"""`Status` bodies and the one exception the embedded API server's handlers raise."""

from __future__ import annotations

from typing import Any

#: The ``reason`` the real API server puts in a ``Status`` for each HTTP code.
REASONS: dict[int, str] = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Expired",
    413: "RequestEntityTooLarge",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


def reason_for(code: int) -> str:
    """The ``Status.reason`` for an HTTP code (``Unknown`` for codes the real server has no name for)."""
    return REASONS.get(code, "Unknown")


def status_body(
    code: int,
    message: str,
    reason: str | None = None,
    details: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A ``v1.Status`` object as the real API server writes it (success bodies carry only the code)."""
    body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {}}
    if code < 400:
        body.update(status="Success", code=code)
        return body
    body.update(status="Failure", message=message, reason=reason if reason is not None else reason_for(code))
    body["code"] = code
    if details:
        body["details"] = details
    return body


class ApiError(Exception):
    """A request failed; carries the ``Status`` body the server answers with."""

    def __init__(
        self,
        code: int,
        message: str,
        reason: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.status = status_body(code, message, reason, details)

    @property
    def reason(self) -> str:
        """The ``Status.reason`` (for example ``Conflict``)."""
        return str(self.status["reason"])


def _details(resource: str, name: str, group: str = "") -> dict[str, Any]:
    details: dict[str, Any] = {"name": name, "kind": resource}
    if group:
        details["group"] = group
    return details


def _qualified(resource: str, group: str) -> str:
    return f"{resource}.{group}" if group else resource


def not_found(resource: str, name: str, group: str = "") -> ApiError:
    """404 NotFound for one object."""
    return ApiError(
        404, f'{_qualified(resource, group)} "{name}" not found', details=_details(resource, name, group)
    )


def already_exists(resource: str, name: str, group: str = "") -> ApiError:
    """409 AlreadyExists on create of an existing name."""
    return ApiError(
        409,
        f'{_qualified(resource, group)} "{name}" already exists',
        reason="AlreadyExists",
        details=_details(resource, name, group),
    )


def conflict(resource: str, name: str, why: str, group: str = "") -> ApiError:
    """409 Conflict (stale resourceVersion, failed precondition, already bound pod)."""
    return ApiError(
        409,
        f'Operation cannot be fulfilled on {_qualified(resource, group)} "{name}": {why}',
        details=_details(resource, name, group),
    )


STALE = "the object has been modified; please apply your changes to the latest version and try again"


def bad_request(message: str) -> ApiError:
    """400 BadRequest."""
    return ApiError(400, message)


def invalid(resource: str, name: str, why: str, group: str = "") -> ApiError:
    """422 Invalid (the object fails validation, or a JSON patch cannot be applied)."""
    return ApiError(
        422,
        f'{resource[:1].upper()}{resource[1:]} "{name}" is invalid: {why}',
        details=_details(resource, name, group),
    )


def gone(message: str) -> ApiError:
    """410 Expired: a resourceVersion older than the kept history."""
    return ApiError(410, message, reason="Expired")
