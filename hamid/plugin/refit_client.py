"""The device plugin's client of the scheduler's ``POST /refit`` (NUMA refit), secure by default.

* The server is verified with ``--scheduler-ca-file`` or the system roots; an unreadable or empty
  CA bundle is an error, never a silent fallback. ``--scheduler-tls-insecure`` is an explicit,
  logged opt-out and cannot be combined with a token (refused when the client is built, at startup).
* The caller proves its node with a client certificate (mTLS, ``--scheduler-client-cert-file`` /
  ``--scheduler-client-key-file``) and/or its projected ServiceAccount token
  (``--service-account-token-file``, re-read on every call so rotation is followed; unreadable →
  the call fails closed). A token is only ever sent over https.
* One attempt, 2 s in total, no redirects, a 1 MiB response limit. The TLS context is built once
  and rebuilt when the CA bundle, client certificate or key file changes (checked by ``stat`` on
  every call: device, inode, size, mtime), so a rotated CA is picked up (upstream #2817) without a
  handshake setup on every refit.

Every failure raises :class:`RefitError` with upstream's client messages.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp

from hamid.log import get_logger
from hamid.model.devices import ContainerDevices
from hamid.model.errors import InvalidInput
from hamid.model.refit import REFIT_TIMEOUT_S, RefitRequest, RefitResponse
from hamid.tls import TLSConfigError, client_ssl_context

log = get_logger("plugin.refit_client")

MAX_RESPONSE_BYTES = 1 << 20
REFIT_PATH = "/refit"
DEFAULT_TOKEN_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/token"


class RefitError(Exception):
    """A refit that did not commit (refused, transport, TLS, token or decoding error)."""


class RefitRefused(RefitError):
    """The scheduler answered and refused the refit."""


#: Told the outcome (``committed``, ``refused``, ``failed``) and seconds of every refit call.
RefitObserver = Callable[[str, float], None]


@dataclass(frozen=True, slots=True)
class RefitClientConfig:
    """The plugin's refit flags. ``endpoint`` empty disables refit; ``token_file`` empty sends no token."""

    endpoint: str = ""
    ca_file: str | None = None
    insecure: bool = False
    client_cert_file: str | None = None
    client_key_file: str | None = None
    token_file: str | None = DEFAULT_TOKEN_FILE
    timeout: float = REFIT_TIMEOUT_S


#: What identifies one version of a file: (device, inode, size, mtime in ns); None when unreadable.
FileVersion = tuple[int, int, int, int] | None


def _file_version(path: str | None) -> FileVersion:
    if not path:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _read_token(path: str) -> str:
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise RefitError(f"cannot read service account token for refit authentication: {exc}") from exc
    if not token:
        raise RefitError(f"cannot read service account token for refit authentication: {path} is empty")
    return token


class RefitClient:
    """Sends one ``NumaRefitRequest`` per call to ``<endpoint>/refit``."""

    def __init__(self, config: RefitClientConfig) -> None:
        endpoint = config.endpoint.strip()
        if not endpoint:
            raise InvalidInput("a refit client needs a scheduler endpoint")
        parts = urlsplit(endpoint)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise InvalidInput(f"scheduler endpoint {endpoint!r} must be an http(s) URL")
        if config.insecure and config.ca_file:
            raise InvalidInput("--scheduler-ca-file and --scheduler-tls-insecure are mutually exclusive")
        if config.insecure and config.token_file:
            raise InvalidInput(
                "--scheduler-tls-insecure cannot be used with a ServiceAccount token "
                f"(--service-account-token-file {config.token_file}): the token is never sent over "
                "unverified TLS; give --scheduler-ca-file instead, or --service-account-token-file='' "
                "for mTLS-only refit"
            )
        if bool(config.client_cert_file) != bool(config.client_key_file):
            raise InvalidInput(
                "--scheduler-client-cert-file and --scheduler-client-key-file must be given together"
            )
        if config.client_cert_file and parts.scheme != "https":
            raise InvalidInput(f"a client certificate needs an https endpoint, not {endpoint!r}")
        self.config = config
        self.observer: RefitObserver | None = None
        self.url = endpoint.rstrip("/") + REFIT_PATH
        self.scheme = parts.scheme
        self._tls: tuple[tuple[FileVersion, ...], ssl.SSLContext] | None = None
        #: How many TLS contexts this client built (once, then once per change of its files).
        self.tls_builds = 0
        if config.insecure:
            log.warning(
                "refit_tls_verification_disabled",
                flag="--scheduler-tls-insecure",
                endpoint=endpoint,
            )

    def _prepare(self) -> tuple[dict[str, str], ssl.SSLContext | None]:
        """Headers and TLS context for one call (blocking file reads: run in a thread)."""
        config = self.config
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if config.token_file:
            if self.scheme != "https":
                raise RefitError(f"authenticated refit requires HTTPS, endpoint scheme is {self.scheme!r}")
            headers["Authorization"] = "Bearer " + _read_token(config.token_file)
        if self.scheme != "https":
            return headers, None
        return headers, self._tls_context()

    def _tls_context(self) -> ssl.SSLContext:
        """The cached TLS context, rebuilt when one of its files changed (blocking: in a thread)."""
        config = self.config
        versions = tuple(
            _file_version(path) for path in (config.ca_file, config.client_cert_file, config.client_key_file)
        )
        cached = self._tls
        if cached is not None and cached[0] == versions:
            return cached[1]
        try:
            ctx = client_ssl_context(
                ca_file=config.ca_file,
                insecure=config.insecure,
                cert_file=config.client_cert_file,
                key_file=config.client_key_file,
            )
        except TLSConfigError as exc:
            if config.ca_file and not os.path.isfile(config.ca_file):
                raise RefitError(f"cannot read scheduler CA bundle {config.ca_file!r}: {exc}") from exc
            raise RefitError(f"unusable refit TLS configuration: {exc}") from exc
        self._tls = (versions, ctx)
        self.tls_builds += 1
        if cached is not None:
            log.info("refit_tls_context_rebuilt", ca_file=config.ca_file)
        return ctx

    async def refit(self, request: RefitRequest) -> ContainerDevices:
        """Send ``request`` once (2 s total); the committed devices, or :class:`RefitError`."""
        started, outcome = time.perf_counter(), "failed"
        try:
            async with asyncio.timeout(self.config.timeout):
                devices = await self._refit(request)
            outcome = "committed"
            return devices
        except RefitRefused:
            outcome = "refused"
            raise
        except TimeoutError:
            raise RefitError(f"scheduler refit did not answer within {self.config.timeout:g}s") from None
        finally:
            if self.observer is not None:
                self.observer(outcome, time.perf_counter() - started)

    async def _refit(self, request: RefitRequest) -> ContainerDevices:
        headers, ctx = await asyncio.to_thread(self._prepare)
        body = json.dumps(request.to_json()).encode()
        timeout = aiohttp.ClientTimeout(total=self.config.timeout)
        connector = aiohttp.TCPConnector(ssl=ctx if ctx is not None else False, force_close=True)
        try:
            async with (
                aiohttp.ClientSession(connector=connector, timeout=timeout, trust_env=False) as session,
                session.post(self.url, data=body, headers=headers, allow_redirects=False) as resp,
            ):
                if 300 <= resp.status < 400:
                    raise RefitError("redirects are not permitted for refit requests")
                if resp.status != 200:
                    raise RefitError(f"scheduler refit returned status {resp.status}")
                raw = bytearray()
                while len(raw) <= MAX_RESPONSE_BYTES:
                    chunk = await resp.content.read(MAX_RESPONSE_BYTES + 1 - len(raw))
                    if not chunk:
                        break
                    raw += chunk
        except aiohttp.ClientError as exc:
            raise RefitError(f"scheduler refit request failed: {type(exc).__name__}: {exc}") from exc
        if len(raw) > MAX_RESPONSE_BYTES:
            raise RefitError(f"scheduler refit response exceeds {MAX_RESPONSE_BYTES} bytes")
        try:
            response = RefitResponse.from_json(json.loads(raw))
        except (ValueError, InvalidInput) as exc:
            raise RefitError(f"cannot decode refit response: {exc}") from exc
        if not response.succeeded:
            raise RefitRefused(f"scheduler refused refit: {response.failure_reason}")
        try:
            devices = response.devices()
        except InvalidInput as exc:
            raise RefitError(f"cannot decode refit devices: {exc}") from exc
        if not devices:
            raise RefitError("scheduler refit returned no devices")
        return devices


def build_refit_client(config: RefitClientConfig) -> RefitClient | None:
    """The refit client the flags describe; None (refit disabled) when the endpoint is empty.

    Raises :class:`~hamid.model.errors.InvalidInput` for contradictory flags (checked at startup).
    """
    if not config.endpoint.strip():
        log.info("numa_refit_disabled_no_endpoint", flag="--scheduler-endpoint")
        return None
    return RefitClient(config)
