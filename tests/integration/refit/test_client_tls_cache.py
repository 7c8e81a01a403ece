"""The refit client builds its TLS context once and again only when its files change (issue 17)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from hamid.model.devices import ContainerDevice
from hamid.model.refit import RefitRequest
from hamid.plugin.refit_client import RefitClient, RefitClientConfig, RefitError
from hamidsim.certs import CertificateAuthority
from tests.fixtures.tls import TLSFiles, commented_bundle
from tests.integration.refit.fake_scheduler import fake_scheduler

REQ = RefitRequest("u", "ns", "p", "n1", 0, "NVIDIA", ("GPU-2",), container_name="main")
DEVICES = (ContainerDevice("GPU-2", "NVIDIA", 1000, 10),)


def _replace(target: Path, source: Path) -> None:
    """Write ``source``'s bytes over ``target`` with a later mtime (as a rotation would)."""
    shutil.copyfile(source, target)
    stat = target.stat()
    os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))


async def test_tls_context_is_reused_and_rebuilt_on_rotation(tls_files: TLSFiles, tmp_path: Path) -> None:
    ca_file = tmp_path / "ca.crt"
    shutil.copyfile(tls_files.ca_file, ca_file)
    pair = tls_files.client("system:node:n1")
    async with fake_scheduler(tls_files) as fake:
        client = RefitClient(
            RefitClientConfig(
                endpoint=fake.url,
                ca_file=str(ca_file),
                client_cert_file=str(pair.cert_file),
                client_key_file=str(pair.key_file),
                token_file=None,
            )
        )
        for _ in range(3):
            assert await client.refit(REQ) == DEVICES
        assert client.tls_builds == 1  # one context for every call
        other = CertificateAuthority.create(tmp_path / "other", "other CA")
        _replace(ca_file, other.cert_file)  # rotated to a CA that does not sign the server
        with pytest.raises(RefitError, match="scheduler refit request failed"):
            await client.refit(REQ)
        assert client.tls_builds == 2
        _replace(ca_file, tls_files.ca_file)  # and back
        assert await client.refit(REQ) == DEVICES
        assert client.tls_builds == 3
        renewed = tls_files.ca.issue_client(tmp_path / "renewed", "system:node:n1")  # renewal is followed
        _replace(pair.cert_file, renewed.cert_file)
        _replace(pair.key_file, renewed.key_file)
        assert await client.refit(REQ) == DEVICES
        assert client.tls_builds == 4
        ca_file.unlink()  # gone: fails closed, nothing stale is used
        with pytest.raises(RefitError, match="cannot read scheduler CA bundle"):
            await client.refit(REQ)
        assert len(fake.requests) == 5


async def test_a_rotation_to_a_ca_bundle_with_non_ascii_comments_is_used(
    tls_files: TLSFiles, tmp_path: Path
) -> None:
    """A certifi-style bundle (issuers named in non-ASCII comment lines) rotated in during a refit
    was a TypeError out of the client; it is read as OpenSSL reads it."""
    ca_file = tmp_path / "ca.crt"
    shutil.copyfile(tls_files.ca_file, ca_file)
    async with fake_scheduler(tls_files) as fake:
        client = RefitClient(RefitClientConfig(endpoint=fake.url, ca_file=str(ca_file), token_file=None))
        assert await client.refit(REQ) == DEVICES
        _replace(ca_file, commented_bundle(tls_files.ca_file, tmp_path / "bundle.pem"))
        assert await client.refit(REQ) == DEVICES
        assert client.tls_builds == 2
