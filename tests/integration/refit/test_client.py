"""The plugin's refit client: wire fields, upstream error messages, TLS and token rules (#2817, #2882)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hamid.model.devices import ContainerDevice
from hamid.model.errors import InvalidInput
from hamid.model.refit import RefitRequest
from hamid.plugin.refit_client import RefitClient, RefitClientConfig, RefitError, build_refit_client
from hamidsim.certs import CertificateAuthority
from tests.fixtures.tls import TLSFiles
from tests.integration.refit.fake_scheduler import fake_scheduler

REQ = RefitRequest(
    pod_uid="u1",
    pod_namespace="ns",
    pod_name="p",
    node_name="n1",
    container_index=2,
    container_name="main",
    device_type="NVIDIA",
    allowed_device_uuids=("GPU-2", "GPU-3"),
)


def token_file(tmp_path: Path, value: str = "tok-123") -> Path:
    path = tmp_path / "token"
    path.write_text(value + "\n")
    return path


def client(url: str, **kw: object) -> RefitClient:
    return RefitClient(RefitClientConfig(endpoint=url, **kw))  # type: ignore[arg-type]


async def test_round_trip_sends_every_field_and_token(tls_files: TLSFiles, tmp_path: Path) -> None:
    async with fake_scheduler(tls_files) as fake:
        c = client(fake.url + "/", ca_file=str(tls_files.ca_file), token_file=str(token_file(tmp_path)))
        devices = await c.refit(REQ)
        assert devices == (ContainerDevice("GPU-2", "NVIDIA", 1000, 10),)
        assert fake.requests == [
            {
                "podUID": "u1",
                "podNamespace": "ns",
                "podName": "p",
                "nodeName": "n1",
                "containerIndex": 2,
                "containerName": "main",
                "deviceType": "NVIDIA",
                "allowedDeviceUUIDs": ["GPU-2", "GPU-3"],
            }
        ]
        assert fake.headers[0]["Authorization"] == "Bearer tok-123"


@pytest.mark.parametrize(
    ("kw", "want"),
    [
        (
            {"body": {"succeeded": False, "failureReason": "no allowed device fits: x"}},
            "scheduler refused refit: no allowed device fits: x",
        ),
        ({"status": 500, "body": {}}, "scheduler refit returned status 500"),
        ({"body": {"succeeded": True}}, "scheduler refit returned no devices"),
        ({"body": {"succeeded": True, "containerDevices": "GPU-2,NVIDIA"}}, "cannot decode refit devices"),
        ({"raw": b"<html>"}, "cannot decode refit response"),
        (
            {"raw": b'{"succeeded": true, "x": "' + b"a" * (2 << 20) + b'"}'},
            "scheduler refit response exceeds 1048576 bytes",
        ),
    ],
)
async def test_response_handling(tls_files: TLSFiles, tmp_path: Path, kw: dict, want: str) -> None:
    async with fake_scheduler(tls_files, **kw) as fake:
        with pytest.raises(RefitError, match="^" + re.escape(want)):
            await client(fake.url, ca_file=str(tls_files.ca_file), token_file=None).refit(REQ)
        assert len(fake.requests) == 1  # one attempt, no retry


async def test_tls_verifies_by_default_and_insecure_is_explicit(tls_files: TLSFiles, tmp_path: Path) -> None:
    async with fake_scheduler(tls_files) as fake:
        # system roots do not know the test CA
        with pytest.raises(RefitError, match="scheduler refit request failed"):
            await client(fake.url, token_file=None).refit(REQ)
        other = CertificateAuthority.create(tmp_path / "other", "other CA")
        with pytest.raises(RefitError, match="scheduler refit request failed"):
            await client(fake.url, ca_file=str(other.cert_file), token_file=None).refit(REQ)
        # explicit opt-out works without a token ...
        assert await client(fake.url, insecure=True, token_file=None).refit(REQ)
        # ... and is refused up front (startup) when a token would be sent: never a per-call failure
        with pytest.raises(
            InvalidInput, match="--scheduler-tls-insecure cannot be used with a ServiceAccount"
        ):
            client(fake.url, insecure=True, token_file=str(token_file(tmp_path)))
        assert all("Authorization" not in h for h in fake.headers)


async def test_unusable_ca_fails_closed(tls_files: TLSFiles, tmp_path: Path) -> None:
    empty = tmp_path / "empty.crt"
    empty.write_text("")
    garbage = tmp_path / "garbage.crt"
    garbage.write_text("-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n")
    async with fake_scheduler(tls_files) as fake:
        with pytest.raises(RefitError, match="cannot read scheduler CA bundle"):
            await client(fake.url, ca_file=str(tmp_path / "absent.crt"), token_file=None).refit(REQ)
        for bad in (empty, garbage):
            with pytest.raises(RefitError, match="unusable refit TLS configuration"):
                await client(fake.url, ca_file=str(bad), token_file=None).refit(REQ)
        assert fake.requests == []


async def test_token_rules(tls_files: TLSFiles, tmp_path: Path) -> None:
    async with fake_scheduler(None) as plain:
        with pytest.raises(RefitError, match="authenticated refit requires HTTPS, endpoint scheme is 'http'"):
            await client(plain.url, token_file=str(token_file(tmp_path))).refit(REQ)
        assert plain.requests == []
        assert await client(plain.url, token_file=None).refit(REQ)  # development: no token, no TLS
    async with fake_scheduler(tls_files) as fake:
        with pytest.raises(RefitError, match="cannot read service account token for refit authentication"):
            await client(fake.url, ca_file=str(tls_files.ca_file), token_file=str(tmp_path / "absent")).refit(
                REQ
            )
        with pytest.raises(RefitError, match="is empty"):
            await client(
                fake.url, ca_file=str(tls_files.ca_file), token_file=str(token_file(tmp_path, ""))
            ).refit(REQ)
        assert fake.requests == []


async def test_redirects_are_rejected(tls_files: TLSFiles, tmp_path: Path) -> None:
    async with fake_scheduler(None) as target, fake_scheduler(tls_files, redirect_to="") as fake:
        for where in (fake.url + "/refit", target.url + "/refit"):
            fake.redirect_to = where
            with pytest.raises(RefitError, match="redirects are not permitted for refit requests"):
                await client(
                    fake.url, ca_file=str(tls_files.ca_file), token_file=str(token_file(tmp_path))
                ).refit(REQ)
        assert target.requests == []


async def test_one_attempt_within_the_deadline(tls_files: TLSFiles) -> None:
    async with fake_scheduler(tls_files, delay=5.0) as fake:
        with pytest.raises(RefitError, match=r"did not answer within 0\.2s"):
            await client(fake.url, ca_file=str(tls_files.ca_file), token_file=None, timeout=0.2).refit(REQ)
        assert len(fake.requests) == 1


async def test_mtls_client_certificate_is_presented(tls_files: TLSFiles) -> None:
    pair = tls_files.client("system:node:n1")
    async with fake_scheduler(tls_files) as fake:
        c = client(
            fake.url,
            ca_file=str(tls_files.ca_file),
            client_cert_file=str(pair.cert_file),
            client_key_file=str(pair.key_file),
            token_file=None,
        )
        assert await c.refit(REQ)


def test_configuration_errors() -> None:
    assert build_refit_client(RefitClientConfig(endpoint="  ")) is None
    with pytest.raises(InvalidInput, match="must be an http"):
        RefitClient(RefitClientConfig(endpoint="ftp://x"))
    with pytest.raises(InvalidInput, match="mutually exclusive"):
        RefitClient(RefitClientConfig(endpoint="https://x", ca_file="/ca", insecure=True, token_file=None))
    with pytest.raises(InvalidInput, match="token is never sent over unverified TLS"):
        build_refit_client(RefitClientConfig(endpoint="https://x", insecure=True))  # default token file
    with pytest.raises(InvalidInput, match="must be given together"):
        RefitClient(RefitClientConfig(endpoint="https://x", client_cert_file="/c"))
    with pytest.raises(InvalidInput, match="needs an https endpoint"):
        RefitClient(RefitClientConfig(endpoint="http://x", client_cert_file="/c", client_key_file="/k"))
    built = build_refit_client(RefitClientConfig(endpoint="https://sched.ns.svc:443/"))
    assert built is not None and built.url == "https://sched.ns.svc:443/refit" and built.config.token_file
