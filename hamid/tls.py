"""TLS contexts: a server context that reloads its certificate, and strict client contexts.

Server: TLS >= 1.2; when a client CA is given, client certificates are *optionally* verified
(callers without one, e.g. ServiceAccount-token callers of ``/refit``, still connect; a caller that
presents a certificate must present a valid one). The certificate, key and client CA are reloaded
when the files change (a rotated CA Secret is picked up like a rotated certificate): a timer task
stats them in a thread and builds a fresh context off the event loop; the per-handshake SNI
callback only swaps in the newest context (no I/O on the handshake path).

Client: verifies the server by default against a CA file or the system roots; an unreadable or
empty CA file is an error, never a silent fallback; skipping verification is explicit.

CA bundles are handed to OpenSSL whole, as it reads a CA file: the comment lines around the PEM
blocks (certifi's and distributions' bundles name issuers such as "Főtanúsítvány") may hold any
byte. Whatever a file holds, loading it raises :class:`TLSConfigError`, never another error.
"""

from __future__ import annotations

import asyncio
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from hamid.log import get_logger
from hamid.model.errors import InvalidInput

log = get_logger("tls")

_PEM_CERT_MARKER = "-----BEGIN CERTIFICATE-----"
#: What ``load_verify_locations`` may raise for CA data it cannot use (all are TLSConfigError here).
_CA_LOAD_ERRORS = (ssl.SSLError, ValueError, TypeError)


class TLSConfigError(InvalidInput):
    """A TLS file or option is unusable (missing, unreadable, empty, malformed, conflicting)."""


@dataclass(frozen=True, slots=True)
class _FileStamp:
    inode: int
    mtime_ns: int
    size: int


def _stamp(path: Path) -> _FileStamp | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return _FileStamp(st.st_ino, st.st_mtime_ns, st.st_size)


def _read_ca(ca_file: str | os.PathLike[str], what: str) -> str:
    """A PEM CA bundle as ASCII text, each non-ASCII byte a ``?`` (``cadata`` takes no other str;
    OpenSSL ignores the text around the PEM blocks and refuses such a byte inside one, so it reads
    the bundle as it reads the file); TLSConfigError if unreadable or holding no certificate."""
    name = os.fspath(ca_file)
    try:
        data = Path(ca_file).read_bytes()
    except OSError as exc:
        raise TLSConfigError(f"{what} {name!r} is unreadable: {exc}") from exc
    text = data.decode("latin-1").encode("ascii", "replace").decode("ascii")
    if _PEM_CERT_MARKER not in text:
        raise TLSConfigError(f"{what} {name!r} holds no PEM certificate")
    return text


def _build_server_context(cert_file: Path, key_file: Path, client_ca_pem: str | None) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as exc:
        raise TLSConfigError(
            f"cannot load TLS certificate {str(cert_file)!r} / key {str(key_file)!r}: {exc}"
        ) from exc
    if client_ca_pem is not None:
        try:
            ctx.load_verify_locations(cadata=client_ca_pem)
        except _CA_LOAD_ERRORS as exc:
            raise TLSConfigError(f"client CA is not a valid PEM bundle: {exc}") from exc
        ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx


class ReloadingServerContext:
    """A server ``SSLContext`` (``.context``) whose certificate follows the files on disk.

    Pass ``.context`` to the server; run :meth:`run` as an owned background task (or call
    :meth:`reload_if_changed`) to pick up rotated files. A rotation that cannot be loaded is logged
    and the previous certificate keeps serving.
    """

    def __init__(self, cert_file: Path, key_file: Path, client_ca_file: Path | None = None) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self.client_ca_file = client_ca_file
        self._client_ca_pem = _read_ca(client_ca_file, "client CA file") if client_ca_file else None
        self._stamps = self._current_stamps()
        self.context = _build_server_context(cert_file, key_file, self._client_ca_pem)
        self._current = self.context
        self.context.sni_callback = self._on_client_hello

    @property
    def verifies_clients(self) -> bool:
        """Whether client certificates are verified (a client CA was configured)."""
        return self._client_ca_pem is not None

    def _current_stamps(self) -> tuple[_FileStamp | None, ...]:
        files = (self.cert_file, self.key_file) + ((self.client_ca_file,) if self.client_ca_file else ())
        return tuple(_stamp(f) for f in files)

    def _load(self) -> tuple[ssl.SSLContext, str | None]:
        """A fresh context from the files (blocking: run in a thread), and the client CA PEM."""
        pem = _read_ca(self.client_ca_file, "client CA file") if self.client_ca_file else None
        return _build_server_context(self.cert_file, self.key_file, pem), pem

    def _on_client_hello(self, ssl_obj: ssl.SSLObject, _server_name: str | None, ctx: ssl.SSLContext) -> None:
        if self._current is not ctx:
            ssl_obj.context = self._current

    async def reload_if_changed(self) -> bool:
        """Reload when the certificate, key or client CA file changed; True when the new one is live.

        Never raises: :meth:`run` is a task of the scheduler, whose failure ends the process."""
        stamps = await asyncio.to_thread(self._current_stamps)
        if stamps == self._stamps or None in stamps:
            return False
        try:
            fresh, pem = await asyncio.to_thread(self._load)
        except Exception as exc:  # whatever the files hold: the reloader lives on, the last good one serves
            error = f"{type(exc).__name__}: {exc}"
            log.warning("tls_reload_failed", error=error, cert_file=str(self.cert_file))
            return False
        self._stamps = stamps
        self._current = fresh
        self._client_ca_pem = pem
        log.info("tls_files_reloaded", cert_file=str(self.cert_file), client_ca_file=str(self.client_ca_file))
        return True

    async def run(self, interval: float = 10.0) -> None:
        """Check the files every ``interval`` seconds until cancelled."""
        while True:
            await asyncio.sleep(interval)
            await self.reload_if_changed()


def server_ssl_context(
    cert_file: str | os.PathLike[str],
    key_file: str | os.PathLike[str],
    client_ca_file: str | os.PathLike[str] | None = None,
) -> ReloadingServerContext:
    """A TLS >= 1.2 server context reloaded on file change; optional client-cert verification."""
    return ReloadingServerContext(
        Path(cert_file), Path(key_file), Path(client_ca_file) if client_ca_file else None
    )


def client_ssl_context(
    ca_file: str | os.PathLike[str] | None = None,
    insecure: bool = False,
    cert_file: str | os.PathLike[str] | None = None,
    key_file: str | os.PathLike[str] | None = None,
) -> ssl.SSLContext:
    """A TLS >= 1.2 client context.

    Verifies the server against ``ca_file`` (or the system roots when None). ``insecure=True``
    skips verification and is mutually exclusive with ``ca_file``. ``cert_file``/``key_file``
    present a client certificate (both or neither).
    """
    if insecure and ca_file:
        raise TLSConfigError("a CA file and insecure (no verification) are mutually exclusive")
    if bool(cert_file) != bool(key_file):
        raise TLSConfigError("a client certificate needs both a certificate file and a key file")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    elif ca_file:
        pem = _read_ca(ca_file, "CA file")
        try:
            ctx.load_verify_locations(cadata=pem)
        except _CA_LOAD_ERRORS as exc:
            raise TLSConfigError(f"CA file {os.fspath(ca_file)!r} is not a valid PEM bundle: {exc}") from exc
    else:
        ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
    if cert_file and key_file:
        try:
            ctx.load_cert_chain(cert_file, key_file)
        except (OSError, ssl.SSLError) as exc:
            raise TLSConfigError(f"cannot load client certificate {os.fspath(cert_file)!r}: {exc}") from exc
    return ctx


def peer_subject_values(peercert: Mapping[str, object] | None, attribute: str) -> tuple[str, ...]:
    """Every value of ``attribute`` (``commonName``, ``organizationName``) in the subject of a verified
    peer certificate (``SSLObject.getpeercert()`` form), in order.

    All of them, never the first: a subject may repeat an attribute, and readers disagree on which
    counts (Go's ``pkix``, so Kubernetes, takes the last CN), so a caller deciding an identity must
    see them all.
    """
    subject = peercert.get("subject") if peercert else None
    if not isinstance(subject, tuple):
        return ()
    return tuple(str(value) for rdn in subject for key, value in rdn if key == attribute)
