"""Which ``Host`` names ``/ui`` answers: the guard against DNS rebinding.

A web page the operator visits can make its own host name resolve to 127.0.0.1 and then read,
as same-origin, whatever ``kubectl port-forward`` serves there. The browser still sends that
page's name as ``Host``, so the view answers only names that are the scheduler's own or that no
outsider can register: IP literals, ``localhost`` and ``*.localhost`` (RFC 6761: always
loopback), one-label names (a Service's short name) and in-cluster Service names (``*.svc``,
``*.svc.cluster.local``), plus the operator's (``--ui-hosts``: a custom cluster domain, an
Ingress's name). A request without ``Host`` comes from no browser and is answered. Over a
loopback connection (``kubectl port-forward``, the attack's path) Service names are not answered:
multicast DNS and LLMNR let a neighbour on the operator's network answer one-label and ``.local``
names with 127.0.0.1, and in-cluster clients connect from a pod address.
"""

from __future__ import annotations

import ipaddress
import re

#: Name suffixes of in-cluster Services (the default cluster domain; ``*.svc`` fits every domain).
SERVICE_SUFFIXES = (".svc", ".svc.cluster.local")
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def host_allowed(host: str | None, extra: tuple[str, ...] = (), *, loopback: bool = False) -> bool:
    """Whether a request naming authority ``host`` (``name[:port]``, ``[v6]:port``) is answered;
    ``extra``: the operator's names (``--ui-hosts``), ``*.<domain>`` for the names under it;
    ``loopback``: the request came over a loopback connection (a port-forward)."""
    if not host:
        return True
    name = _name(host.strip().lower())
    if name is None:
        return False
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        pass
    labels = name.split(".")
    if not all(_LABEL.fullmatch(label) for label in labels):
        return False
    service = len(labels) == 1 or any(name.endswith(suffix) for suffix in SERVICE_SUFFIXES)
    return (
        labels[-1] == "localhost"
        or (service and not loopback)
        or any(name == e or (e.startswith("*.") and name.endswith(e[1:])) for e in extra)
    )


def is_loopback(address: str | None) -> bool:
    """Whether a peer address is a loopback one (None, a unix socket's: no)."""
    try:
        return address is not None and ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def parse_hosts(value: str | tuple[str, ...]) -> tuple[str, ...]:
    """``--ui-hosts``: a comma list of host names (``*.<domain>``: every name under it); ValueError
    naming one that is not a DNS name."""
    items = value.split(",") if isinstance(value, str) else list(value)
    hosts = tuple(dict.fromkeys(h.strip().lower().removesuffix(".") for h in items if h.strip()))
    for host in hosts:
        name = host[2:] if host.startswith("*.") else host
        if not name or not all(_LABEL.fullmatch(label) for label in name.split(".")):
            raise ValueError(
                f"{host!r:.80} is not a host name (a comma list of names; *.<domain> for its subdomains)"
            )
    return hosts


def _name(host: str) -> str | None:
    """The host name or address without port, brackets or the root's dot (None: not a host)."""
    if host.startswith("["):
        address, bracket, rest = host[1:].partition("]")
        port_ok = not rest or (rest.startswith(":") and _port(rest[1:]))
        return address if bracket and port_ok else None
    if host.count(":") > 1:
        return host  # an unbracketed IPv6 address (an absolute-form target's host)
    name, colon, port = host.partition(":")
    if colon and not _port(port):
        return None
    return name.removesuffix(".") or None


def _port(text: str) -> bool:
    return text.isascii() and text.isdigit() and len(text) <= 5
