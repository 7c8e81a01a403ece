"""Listen addresses: parsed once, checked at parse time, bind failures in one line."""

from __future__ import annotations

import socket

import click
import pytest
from aiohttp import web

from hamid.listen import LISTEN, OPTIONAL_LISTEN, ListenError, parse_listen, serve
from hamid.model.errors import InvalidInput


@pytest.mark.parametrize(
    ("text", "parsed"),
    [(":9395", ("0.0.0.0", 9395)), ("127.0.0.1:0", ("127.0.0.1", 0)), ("[::1]:9443", ("::1", 9443))],
)
def test_parse_listen(text: str, parsed: tuple[str, int]) -> None:
    assert parse_listen(text) == parsed


@pytest.mark.parametrize(
    "text", ["nonsense", "host:", ":65536", "a b:80", "[::1:80", "http://x:80", ":\u00b2"]
)
def test_bad_listen_addresses(text: str) -> None:
    with pytest.raises(InvalidInput, match="listen address"):
        parse_listen(text)


def test_click_types() -> None:
    assert OPTIONAL_LISTEN.convert("", None, None) == ""
    with pytest.raises(click.BadParameter):
        LISTEN.convert("", None, None)


async def test_bind_failure_is_a_listen_error() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(
            ListenError,
            match=f"cannot start the metrics listener on 127.0.0.1:{port}: address already in use",
        ):
            await serve(web.Application(), f"127.0.0.1:{port}", what="metrics listener")
