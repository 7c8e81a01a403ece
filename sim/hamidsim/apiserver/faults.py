"""Fault injection for the embedded API server: added latency and "fail the next N requests"."""

from __future__ import annotations

import asyncio
import itertools
import re
from dataclasses import dataclass, field
from typing import Any

from hamidsim.apiserver.errors import ApiError, bad_request

#: Request verbs a rule may name: Kubernetes verbs, or HTTP methods (any case).
K8S_VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")
HTTP_METHODS = ("get", "post", "put", "patch", "delete")


@dataclass
class FaultRule:
    """One rule: ``kind`` is ``latency`` (sleep ``seconds``) or ``fail`` (answer ``status``)."""

    id: int
    kind: str
    verb: str | None
    path_pattern: str | None
    seconds: float = 0.0
    status: int = 0
    message: str = ""
    #: Requests still to fail (``fail`` rules); ``None`` for latency rules, which stay until removed.
    remaining: int | None = None
    _regex: re.Pattern[str] | None = field(default=None, repr=False)

    def matches(self, verb: str, method: str, path: str) -> bool:
        """Whether a request (Kubernetes verb, HTTP method, URL path) is subject to this rule."""
        if self.verb is not None and self.verb not in (verb, method.lower()):
            return False
        return self._regex is None or self._regex.search(path) is not None

    def to_json(self) -> dict[str, Any]:
        """The rule as the admin endpoint shows it."""
        out: dict[str, Any] = {
            "id": self.id,
            "type": self.kind,
            "verb": self.verb,
            "pathPattern": self.path_pattern,
        }
        if self.kind == "latency":
            out["seconds"] = self.seconds
        else:
            out.update(status=self.status, remaining=self.remaining, message=self.message)
        return out


def _check_verb(verb: str | None) -> str | None:
    if verb is None:
        return None
    lowered = verb.lower()
    if lowered not in K8S_VERBS and lowered not in HTTP_METHODS:
        raise bad_request(f"unknown verb {verb!r}; use one of {', '.join(K8S_VERBS + HTTP_METHODS)}")
    return lowered


def _compile(pattern: str | None) -> re.Pattern[str] | None:
    if pattern is None:
        return None
    try:
        return re.compile(pattern)
    except re.error as err:
        raise bad_request(f"invalid path pattern {pattern!r}: {err}") from err


class Faults:
    """The fault rules of one server; every matching rule applies to each request, in order added."""

    def __init__(self) -> None:
        self._rules: list[FaultRule] = []
        self._ids = itertools.count(1)

    @property
    def rules(self) -> list[FaultRule]:
        """The active rules."""
        return list(self._rules)

    def add_latency(
        self, seconds: float, verb: str | None = None, path_pattern: str | None = None
    ) -> FaultRule:
        """Delay every matching request by ``seconds`` until the rule is removed.

        ``verb`` is a Kubernetes verb (get, list, watch, create, update, patch, delete,
        deletecollection) or an HTTP method; ``path_pattern`` a regex searched in the URL path.
        """
        if not isinstance(seconds, int | float) or isinstance(seconds, bool) or not 0 <= seconds <= 3600:
            raise bad_request("latency seconds must be a number between 0 and 3600")
        rule = FaultRule(
            next(self._ids),
            "latency",
            _check_verb(verb),
            path_pattern,
            seconds=float(seconds),
            _regex=_compile(path_pattern),
        )
        self._rules.append(rule)
        return rule

    def fail_next(
        self,
        n: int,
        verb: str | None = None,
        path_pattern: str | None = None,
        status: int = 500,
        message: str | None = None,
    ) -> FaultRule:
        """Answer the next ``n`` matching requests with a ``Status`` of code ``status``."""
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise bad_request("the number of requests to fail must be a positive integer")
        if not isinstance(status, int) or isinstance(status, bool) or not 400 <= status <= 599:
            raise bad_request("an injected failure status must be an HTTP error code (400-599)")
        rule = FaultRule(
            next(self._ids),
            "fail",
            _check_verb(verb),
            path_pattern,
            status=status,
            message=message or f"injected failure (HTTP {status})",
            remaining=n,
            _regex=_compile(path_pattern),
        )
        self._rules.append(rule)
        return rule

    def remove(self, rule_id: int) -> bool:
        """Drop one rule; ``False`` when there is no such rule."""
        before = len(self._rules)
        self._rules = [r for r in self._rules if r.id != rule_id]
        return len(self._rules) != before

    def clear(self) -> None:
        """Drop every rule."""
        self._rules.clear()

    def add_from_json(self, body: Any) -> FaultRule:
        """A rule from the admin endpoint's JSON (``type`` latency or fail)."""
        if not isinstance(body, dict):
            raise bad_request("a fault rule must be a JSON object")
        kind = body.get("type")
        verb, pattern = body.get("verb"), body.get("pathPattern")
        if verb is not None and not isinstance(verb, str):
            raise bad_request("verb must be a string")
        if pattern is not None and not isinstance(pattern, str):
            raise bad_request("pathPattern must be a string")
        if kind == "latency":
            return self.add_latency(body.get("seconds"), verb, pattern)  # type: ignore[arg-type]
        if kind == "fail":
            message = body.get("message")
            if message is not None and not isinstance(message, str):
                raise bad_request("message must be a string")
            return self.fail_next(body.get("count", 1), verb, pattern, body.get("status", 500), message)
        raise bad_request('a fault rule needs "type": "latency" or "fail"')

    async def before(self, verb: str, method: str, path: str) -> None:
        """Apply the rules to one request: sleep for latency rules, raise for a failing one."""
        delay = 0.0
        failure: FaultRule | None = None
        for rule in self._rules:
            if not rule.matches(verb, method, path):
                continue
            if rule.kind == "latency":
                delay += rule.seconds
            elif failure is None and rule.remaining:
                failure = rule
                rule.remaining -= 1
        self._rules = [r for r in self._rules if r.remaining is None or r.remaining > 0]
        if delay:
            await asyncio.sleep(delay)
        if failure is not None:
            raise ApiError(failure.status, failure.message)
