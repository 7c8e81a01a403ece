"""TLS contexts: generated certificates, optional client verification, reload on change."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from hamid.tls import TLSConfigError, client_ssl_context, peer_subject_values, server_ssl_context
from hamidsim.certs import CertificateAuthority
from tests.fixtures.tls import TLSFiles, commented_bundle
from tests.integration.kube.helpers import eventually


async def _serve(ctx: ssl.SSLContext) -> tuple[web.AppRunner, int]:
    async def whoami(request: web.Request) -> web.Response:
        ssl_obj = request.transport.get_extra_info("ssl_object") if request.transport else None
        names = peer_subject_values(ssl_obj.getpeercert() if ssl_obj else None, "commonName")
        return web.json_response({"cn": ", ".join(names) or None})

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


async def test_a_ca_bundle_with_non_ascii_comments_is_read_as_openssl_reads_it(
    tls_files: TLSFiles, tmp_path: Path
) -> None:
    """A certifi-style bundle names issuers in comment lines ("Főtanúsítvány"): the text went to
    ``cadata`` as a str, which takes ASCII only, and both contexts failed with a TypeError traceback."""
    import aiohttp

    bundle = commented_bundle(tls_files.ca_file, tmp_path / "bundle.pem")
    server = server_ssl_context(tls_files.server.cert_file, tls_files.server.key_file, bundle)
    runner, port = await _serve(server.context)
    try:
        pair = tls_files.client("system:node:n1")
        ctx = client_ssl_context(bundle, cert_file=pair.cert_file, key_file=pair.key_file)
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
            session.get(f"https://localhost:{port}/whoami", ssl=ctx) as resp,
        ):
            assert (await resp.json()) == {"cn": "system:node:n1"}
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("block", ["\u0151MIIB", "AAAA"], ids=["non-ascii", "not-a-certificate"])
def test_a_ca_bundle_that_cannot_be_loaded_is_a_tls_config_error(
    tls_files: TLSFiles, tmp_path: Path, block: str
) -> None:
    bad = tmp_path / "bad.pem"
    bad.write_text(f"-----BEGIN CERTIFICATE-----\n{block}\n-----END CERTIFICATE-----\n", encoding="utf-8")
    with pytest.raises(TLSConfigError, match="not a valid PEM bundle"):
        client_ssl_context(bad)
    with pytest.raises(TLSConfigError, match="client CA"):
        server_ssl_context(tls_files.server.cert_file, tls_files.server.key_file, bad)


def _subjects(ctx: ssl.SSLContext) -> set[str]:
    return {name for cert in ctx.get_ca_certs() for name in peer_subject_values(cert, "commonName")}


def _openssl_reads(path: Path) -> set[str] | None:
    """The CAs OpenSSL takes from the file (``cafile``), None where it refuses it."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        ctx.load_verify_locations(cafile=str(path))
    except ssl.SSLError:
        return None
    return _subjects(ctx)


def _hamid_reads(path: Path) -> set[str] | None:
    try:
        return _subjects(client_ssl_context(path))
    except TLSConfigError:
        return None


@pytest.mark.parametrize(
    "case", ["crlf", "markers-in-a-comment", "indented", "half-written", "x509-header", "non-ascii-comment"]
)
def test_a_ca_bundle_is_read_as_openssl_reads_the_file(tmp_path: Path, case: str) -> None:
    """Review s24 R3: extracting the PEM blocks by pattern loaded half a half-written bundle without
    a word, refused a bundle whose comment named the markers and dropped old ``X509 CERTIFICATE``
    blocks; the bundle goes to OpenSSL whole (non-ASCII bytes as ``?``)."""
    one = CertificateAuthority.create(tmp_path / "a", "CA one").cert_file.read_text()
    two = CertificateAuthority.create(tmp_path / "b", "CA two").cert_file.read_text()
    text = {
        "crlf": (one + two).replace("\n", "\r\n"),
        "markers-in-a-comment": "# -----BEGIN CERTIFICATE----- ... -----END CERTIFICATE-----\n" + one + two,
        "indented": "".join(f"    {line}\n" for line in (one + two).splitlines()),
        "half-written": one + two[: len(two) // 2],
        "x509-header": one + two.replace(" CERTIFICATE-----", " X509 CERTIFICATE-----"),
        "non-ascii-comment": "# F\u0151tan\u00fas\u00edtv\u00e1ny\n" + one + two,
    }[case]
    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes(text.encode())
    assert _hamid_reads(bundle) == _openssl_reads(bundle)
    assert _hamid_reads(bundle) in ({"CA one", "CA two"}, None)


async def test_the_reloader_task_outlives_any_rotation(
    tls_files: TLSFiles, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, logs: list[dict[str, Any]]
) -> None:
    """The scheduler runs :meth:`ReloadingServerContext.run` as a task whose failure ends the
    process: a rotation to a certifi-style bundle is loaded, and one that raises anything at all
    (an injected fault) is logged while the last good context keeps serving."""
    import aiohttp

    client_ca = tmp_path / "clients.crt"
    client_ca.write_bytes(tls_files.ca_file.read_bytes())
    server = server_ssl_context(tls_files.server.cert_file, tls_files.server.key_file, client_ca)
    reloader = asyncio.create_task(server.run(interval=0.02))
    runner, port = await _serve(server.context)
    try:
        rotated = CertificateAuthority.create(tmp_path / "rotated", "rotated client CA")
        pair = rotated.issue_client(tmp_path / "rotated", "system:node:n1")
        ctx = client_ssl_context(tls_files.ca_file, cert_file=pair.cert_file, key_file=pair.key_file)
        commented_bundle(rotated.cert_file, client_ca)
        await eventually(lambda: any(e["event"] == "tls_files_reloaded" for e in logs))

        def unforeseen(*_args: object) -> ssl.SSLContext:
            raise RuntimeError("injected")

        monkeypatch.setattr("hamid.tls._build_server_context", unforeseen)
        client_ca.write_bytes(tls_files.ca_file.read_bytes() + rotated.cert_file.read_bytes())
        await eventually(lambda: any(e["event"] == "tls_reload_failed" for e in logs))
        failed = next(e for e in logs if e["event"] == "tls_reload_failed")
        assert failed["error"] == "RuntimeError: injected" and not reloader.done()
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
            session.get(f"https://localhost:{port}/whoami", ssl=ctx) as resp,
        ):
            assert (await resp.json()) == {"cn": "system:node:n1"}  # the rotated CA's context serves
    finally:
        reloader.cancel()
        await asyncio.gather(reloader, return_exceptions=True)
        await runner.cleanup()
