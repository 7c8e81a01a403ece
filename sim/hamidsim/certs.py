"""Generate a CA and leaf certificates with ``cryptography`` (tests, the demo, fixtures).

Not for production PKI: keys are EC P-256, validity is short and fixed by the caller.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_DEFAULT_DAYS = 30


@dataclass(frozen=True, slots=True)
class CertPair:
    """A certificate and its private key, both PEM files on disk."""

    cert_file: Path
    key_file: Path


@dataclass(frozen=True)
class CertificateAuthority:
    """An in-memory CA that signs leaf certificates and writes them as PEM files."""

    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey
    cert_file: Path

    @classmethod
    def create(
        cls, directory: Path, common_name: str = "hamid test CA", days: int = _DEFAULT_DAYS
    ) -> CertificateAuthority:
        """Create a self-signed CA and write ``ca.crt`` (and ``ca.key``) into ``directory``."""
        directory.mkdir(parents=True, exist_ok=True)
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        now = _now()
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256())
        )
        cert_file = directory / "ca.crt"
        _write(cert_file, cert.public_bytes(serialization.Encoding.PEM))
        _write(directory / "ca.key", _key_pem(key), private=True)
        return cls(cert=cert, key=key, cert_file=cert_file)

    def issue_server(
        self,
        directory: Path,
        name: str = "server",
        dns_names: tuple[str, ...] = ("localhost",),
        ip_addresses: tuple[str, ...] = ("127.0.0.1",),
        days: int = _DEFAULT_DAYS,
    ) -> CertPair:
        """Issue a server certificate with the given DNS and IP SANs (``<name>.crt``/``.key``)."""
        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns_names]
        sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
        common_name = dns_names[0] if dns_names else (ip_addresses[0] if ip_addresses else name)
        return self._issue(directory, name, (common_name,), sans, ExtendedKeyUsageOID.SERVER_AUTH, days)

    def issue_client(
        self,
        directory: Path,
        common_name: str,
        name: str | None = None,
        days: int = _DEFAULT_DAYS,
        organizations: tuple[str, ...] | None = None,
        more_common_names: tuple[str, ...] = (),
    ) -> CertPair:
        """Issue a client certificate whose subject CN is ``common_name`` (e.g. ``system:node:n1``).

        ``organizations`` are the subject's ``O`` values; by default ``system:nodes`` for a
        ``system:node:<name>`` CN, as in kubelet's client certificates, and none otherwise.
        ``more_common_names``: further CNs after it (a subject repeating CN, as a hostile CSR may).
        """
        if organizations is None:
            organizations = ("system:nodes",) if common_name.startswith("system:node:") else ()
        file_stem = name or "_".join((common_name, *more_common_names)).replace(":", "_").replace("/", "_")
        return self._issue(
            directory,
            file_stem,
            (common_name, *more_common_names),
            [],
            ExtendedKeyUsageOID.CLIENT_AUTH,
            days,
            organizations,
        )

    def _issue(
        self,
        directory: Path,
        stem: str,
        common_names: tuple[str, ...],
        sans: list[x509.GeneralName],
        usage: x509.ObjectIdentifier,
        days: int,
        organizations: tuple[str, ...] = (),
    ) -> CertPair:
        directory.mkdir(parents=True, exist_ok=True)
        key = ec.generate_private_key(ec.SECP256R1())
        now = _now()
        builder = (
            x509.CertificateBuilder()
            .subject_name(
                x509.Name(
                    [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
                    + [x509.NameAttribute(NameOID.COMMON_NAME, cn) for cn in common_names]
                )
            )
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), critical=False
            )
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        pair = CertPair(cert_file=directory / f"{stem}.crt", key_file=directory / f"{stem}.key")
        _write(pair.cert_file, cert.public_bytes(serialization.Encoding.PEM))
        _write(pair.key_file, _key_pem(key), private=True)
        return pair


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _write(path: Path, data: bytes, private: bool = False) -> None:
    """Write atomically (temp file + rename) so a reloading server never reads half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    if private:
        tmp.chmod(0o600)
    tmp.replace(path)
