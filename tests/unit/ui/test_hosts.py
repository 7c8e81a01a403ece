"""The ``Host`` names ``/ui`` answers (DNS rebinding): the documented ways in, and nothing else."""

from __future__ import annotations

import pytest

from hamid.scheduler.ui.hosts import host_allowed, is_loopback, parse_hosts


@pytest.mark.parametrize(
    "host",
    [
        None,  # HTTP/1.0 without Host: no browser
        "localhost:9395",  # kubectl port-forward, then http://localhost:9395/ui
        "LOCALHOST.:9395",
        "ui.localhost",
        "127.0.0.1:9395",
        "[::1]:9395",
        "[::1]",
        "::1",  # an absolute-form target's host
        "10.244.3.17:9395",  # a pod IP (Prometheus, a port-forward to the pod)
        "hamid-scheduler:9395",  # the Service's short name, from its namespace
        "hamid-scheduler.kube-system.svc:9395",
        "hamid-scheduler.kube-system.svc.cluster.local",
    ],
)
def test_the_documented_ways_in_are_answered(host: str | None) -> None:
    assert host_allowed(host)


@pytest.mark.parametrize(
    "host",
    [
        "rebound.attacker.example:9395",  # a name rebound to 127.0.0.1
        "attacker.example",
        "localhost.attacker.example",
        "hamid-scheduler.kube-system.svc.attacker.example",
        "127.0.0.1.nip.io",
        "localhost:x",
        "[::1]x",
        "[::1",
        "bad_name:9395",
        ":9395",
    ],
)
def test_other_names_are_refused(host: str) -> None:
    assert not host_allowed(host)


def test_over_a_port_forward_service_names_are_refused() -> None:
    """A port-forward's connection is loopback; there a one-label or ``.local`` name may have been
    answered with 127.0.0.1 by a neighbour (multicast DNS, LLMNR): only loopback names and
    addresses, and the operator's, are answered."""
    for host in ("localhost:9395", "ui.localhost", "127.0.0.1:9395", "[::1]:9395", None):
        assert host_allowed(host, loopback=True)
    for host in ("hamid-scheduler:9395", "hamid-scheduler.kube-system.svc.cluster.local", "printer"):
        assert not host_allowed(host, loopback=True) and host_allowed(host)
    assert host_allowed("hamid.example.com", ("hamid.example.com",), loopback=True)


def test_loopback_peers() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("127.9.9.9")
    assert not is_loopback("10.244.3.17") and not is_loopback(None) and not is_loopback("nonsense")


def test_the_operators_names_are_answered_and_nothing_more() -> None:
    """``--ui-hosts``: a custom cluster domain (``*.`` for every name under it) or an Ingress's
    name; a name merely ending like one is not."""
    extra = parse_hosts(" *.svc.Example.Internal, hamid.example.com. ")
    assert extra == ("*.svc.example.internal", "hamid.example.com")
    for host in ("hamid-scheduler.kube-system.svc.example.internal:9395", "hamid.example.com"):
        assert host_allowed(host, extra) and not host_allowed(host)
    for host in ("svc.example.internal", "evil-svc.example.internal", "hamid.example.com.evil.io"):
        assert not host_allowed(host, extra)


@pytest.mark.parametrize("value", ["http://x.example", "a..b", "*.", "exa mple.com", "-a.com"])
def test_a_value_that_is_no_host_name_is_refused(value: str) -> None:
    with pytest.raises(ValueError, match="is not a host name"):
        parse_hosts(value)
