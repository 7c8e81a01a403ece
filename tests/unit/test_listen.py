"""Listen addresses: parsed once, checked at parse time, bind failures in one line."""

from __future__ import annotations

import asyncio
import json
import logging
import socket

import click
import pytest
import structlog
from aiohttp import web

from hamid.listen import LISTEN, OPTIONAL_LISTEN, ListenError, parse_listen, serve
from hamid.log import configure
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


async def _raw(port: int, data: bytes, *, hang_up: bool = False) -> bytes:
    """Send raw bytes to the listener; its answer (none when the client hangs up first)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    if hang_up:
        writer.close()
        await asyncio.sleep(0.2)
        return b""
    answer = await reader.read()
    writer.close()
    return answer


async def test_a_clients_bad_request_is_one_warning_without_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """aiohttp answers a malformed request 400 and logs it at ERROR with a traceback; a hang-up
    mid-body raises in the handler's read. Both are the client's doing: one warning naming it."""

    async def echo(request: web.Request) -> web.Response:
        return web.Response(body=await request.read())

    app = web.Application()
    app.router.add_post("/x", echo)
    caplog.set_level(logging.DEBUG, logger="aiohttp.server")
    runner, port = await serve(app, "127.0.0.1:0")
    try:
        for bad in (
            b"GET x HTTP/1.1\r\nHost: h\r\n\r\n",
            b"POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: abc\r\n\r\n",
            b"POST /x HTTP/1.1\r\nHost: h\r\nBad Header: 1\r\n\r\n",
        ):
            assert (await _raw(port, bad)).split(b" ", 2)[1] == b"400"
        await _raw(port, b"POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: 1000\r\n\r\n{", hang_up=True)
    finally:
        await runner.cleanup()
    records = [r for r in caplog.records if r.name == "aiohttp.server"]
    assert len(records) == 4, [r.getMessage() for r in records]
    assert all(r.levelno == logging.WARNING and not r.exc_info for r in records)
    assert "ConnectionResetError" in records[-1].getMessage()
    assert "Content-Length: abc" in records[1].getMessage()


async def test_a_clients_bad_request_is_not_logged_under_a_level_above_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Lowered to a warning after aiohttp's level check, it was still printed under ``error``."""
    app = web.Application()
    caplog.set_level(logging.DEBUG)  # the capture takes anything that reaches it
    server_log = logging.getLogger("aiohttp.server")
    level = server_log.level
    server_log.setLevel(logging.ERROR)  # as --log-level error sets the root's
    runner, port = await serve(app, "127.0.0.1:0")
    try:
        assert (await _raw(port, b"GET x HTTP/1.1\r\nHost: h\r\n\r\n")).split(b" ", 2)[1] == b"400"
    finally:
        await runner.cleanup()
        server_log.setLevel(level)
    assert [r for r in caplog.records if r.name == "aiohttp.server"] == []


def test_library_records_are_one_line_in_the_configured_format(capsys: pytest.CaptureFixture[str]) -> None:
    """A library's record (stdlib logging) is one JSON line like hamid's own, its logger as
    ``component``, its traceback inside the line; configuring twice installs one handler."""
    root = logging.getLogger()
    saved, handlers, level = structlog.get_config(), root.handlers[:], root.level
    try:
        configure("json")
        configure("json")
        try:
            raise ValueError("boom")
        except ValueError:
            logging.getLogger("some.library").exception("failed %s", "here")
        lines = capsys.readouterr().err.splitlines()
    finally:
        structlog.configure(**saved)
        root.handlers[:] = handlers
        root.setLevel(level)
    assert len(lines) == 1, lines
    entry = json.loads(lines[0])
    assert (entry["event"], entry["component"], entry["level"]) == ("failed here", "some.library", "error")
    assert "ValueError: boom" in entry["exception"]
