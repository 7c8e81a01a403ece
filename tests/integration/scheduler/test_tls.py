"""TLS contexts: generated certificates, optional client verification, reload on change."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import pytest
from aiohttp import web

from hamid.tls import TLSConfigError, client_ssl_context, peer_common_name, server_ssl_context
from hamidsim.certs import CertificateAuthority
from tests.fixtures.tls import TLSFiles


async def _serve(ctx: ssl.SSLContext) -> tuple[web.AppRunner, int]:
    async def whoami(request: web.Request) -> web.Response:
        ssl_obj = request.transport.get_extra_info("ssl_object") if request.transport else None
        cn = peer_common_name(ssl_obj.getpeercert() if ssl_obj else None)
        return web.json_response({"cn": cn})

    app = web.Application()
    app.router.add_get("/whoami", whoami)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx)
    await site.start()
    port = runner.addresses[0][1]
    return runner, port


async def _server_cert_serial(port: int, ca_file: Path) -> int:
    ctx = client_ssl_context(ca_file=ca_file)
    _reader, writer = await asyncio.wait_for(
        asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname="localhost"), 10
    )
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    finally:
        writer.close()
    from cryptography import x509

    return x509.load_der_x509_certificate(der).serial_number


async def test_client_cert_optional_and_cn_seen(tls_files: TLSFiles) -> None:
    import aiohttp

    server = server_ssl_context(tls_files.server.cert_file, tls_files.server.key_file, tls_files.ca_file)
    assert server.verifies_clients
    runner, port = await _serve(server.context)
    try:
        client_pair = tls_files.client("system:node:n1")
        with_cert = client_ssl_context(
            tls_files.ca_file, cert_file=client_pair.cert_file, key_file=client_pair.key_file
        )
        without = client_ssl_context(tls_files.ca_file)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            async with session.get(f"https://localhost:{port}/whoami", ssl=with_cert) as resp:
                assert (await resp.json()) == {"cn": "system:node:n1"}
            async with session.get(f"https://localhost:{port}/whoami", ssl=without) as resp:
                assert (await resp.json()) == {"cn": None}
            # a certificate from another CA is rejected, not treated as anonymous
            other = CertificateAuthority.create(tls_files.directory / "other", "other CA")
            rogue = other.issue_client(tls_files.directory / "other", "system:node:n1")
            rogue_ctx = client_ssl_context(
                tls_files.ca_file, cert_file=rogue.cert_file, key_file=rogue.key_file
            )
            with pytest.raises(aiohttp.ClientError):
                async with session.get(f"https://localhost:{port}/whoami", ssl=rogue_ctx) as resp:
                    await resp.read()
    finally:
        await runner.cleanup()


async def test_server_reloads_rotated_certificate(tls_files: TLSFiles) -> None:
    server = server_ssl_context(tls_files.server.cert_file, tls_files.server.key_file)
    runner, port = await _serve(server.context)
    try:
        first = await _server_cert_serial(port, tls_files.ca_file)
        assert not await server.reload_if_changed()
        tls_files.ca.issue_server(tls_files.directory)  # same file names, new key and serial
        assert await server.reload_if_changed()
        second = await _server_cert_serial(port, tls_files.ca_file)
        assert second != first
    finally:
        await runner.cleanup()


async def test_server_reloads_rotated_client_ca(tls_files: TLSFiles) -> None:
    import aiohttp

    client_ca = tls_files.directory / "clients.crt"
    client_ca.write_bytes(tls_files.ca_file.read_bytes())
    server = server_ssl_context(tls_files.server.cert_file, tls_files.server.key_file, client_ca)
    runner, port = await _serve(server.context)
    try:
        rotated = CertificateAuthority.create(tls_files.directory / "rotated", "rotated client CA")
        pair = rotated.issue_client(tls_files.directory / "rotated", "system:node:n1")
        ctx = client_ssl_context(tls_files.ca_file, cert_file=pair.cert_file, key_file=pair.key_file)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            with pytest.raises(aiohttp.ClientError):  # signed by a CA the server does not trust yet
                async with session.get(f"https://localhost:{port}/whoami", ssl=ctx) as resp:
                    await resp.read()
            client_ca.write_bytes(rotated.cert_file.read_bytes())
            assert await server.reload_if_changed()
            async with session.get(f"https://localhost:{port}/whoami", ssl=ctx) as resp:
                assert (await resp.json()) == {"cn": "system:node:n1"}
            client_ca.write_text("garbage")  # a broken rotation keeps the last good CA
            assert not await server.reload_if_changed()
            async with session.get(f"https://localhost:{port}/whoami", ssl=ctx) as resp:
                assert (await resp.json()) == {"cn": "system:node:n1"}
    finally:
        await runner.cleanup()


async def test_broken_rotation_keeps_serving(tls_files: TLSFiles) -> None:
    server = server_ssl_context(tls_files.server.cert_file, tls_files.server.key_file)
    runner, port = await _serve(server.context)
    try:
        first = await _server_cert_serial(port, tls_files.ca_file)
        tls_files.server.cert_file.write_text("garbage")
        assert not await server.reload_if_changed()
        assert await _server_cert_serial(port, tls_files.ca_file) == first
    finally:
        await runner.cleanup()


def test_client_context_errors(tmp_path: Path, tls_files: TLSFiles) -> None:
    empty = tmp_path / "empty.crt"
    empty.write_text("")
    with pytest.raises(TLSConfigError, match="no PEM certificate"):
        client_ssl_context(empty)
    with pytest.raises(TLSConfigError, match="unreadable"):
        client_ssl_context(tmp_path / "missing.crt")
    with pytest.raises(TLSConfigError, match="mutually exclusive"):
        client_ssl_context(tls_files.ca_file, insecure=True)
    with pytest.raises(TLSConfigError, match="both"):
        client_ssl_context(tls_files.ca_file, cert_file=tls_files.server.cert_file)
    insecure = client_ssl_context(insecure=True)
    assert insecure.verify_mode == ssl.CERT_NONE
    strict = client_ssl_context(tls_files.ca_file)
    assert strict.verify_mode == ssl.CERT_REQUIRED and strict.minimum_version == ssl.TLSVersion.TLSv1_2


def test_server_context_bad_key(tmp_path: Path, tls_files: TLSFiles) -> None:
    with pytest.raises(TLSConfigError, match="cannot load"):
        server_ssl_context(tls_files.server.cert_file, tmp_path / "nokey.pem")
    empty = tmp_path / "ca.pem"
    empty.write_text("nothing")
    with pytest.raises(TLSConfigError, match="client CA"):
        server_ssl_context(tls_files.server.cert_file, tls_files.server.key_file, empty)
