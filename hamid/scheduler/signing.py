"""Signed allocations: the scheduler proves, after a restart, which allocations it wrote itself.

Every allocation the scheduler writes (the filter's, a refit's) carries
:data:`~hamid.model.annotations.ALLOCATION_SIGNATURE`: an HMAC-SHA256 over the pod UID, the node
and the exact ``hami.io/vgpu-devices-allocated`` string, with the time it was issued; for a pod with
MIG instances also over its MIG reservations (:func:`~hamid.model.mig.reservation_text`: GPU,
profile and placement per device, not the runtime ids the plugin adds later), under a domain of
their own, so a signature without MIG is byte for byte what it was. HAMi's own annotation strings
stay exactly as HAMi writes them; the signature is hamid's alone.

The value is ``v1:<key id>:<issued ms>:<hex mac>``; the key id (the first 8 hex digits of the
SHA-256 of the key) names which key of the ring signed it. A ring is a list of keys, oldest first:
the newest signs, any verifies, so a key is rotated by appending a new one, rolling the scheduler,
and dropping the old one once no running pod carries its signatures (docs/trust.md).

The signed allocation a bind or a refit booked is also recorded in the pod's status, as the
condition :data:`~hamid.model.annotations.ALLOCATION_BOOKED_CONDITION` (:func:`booked_condition`,
:func:`booked_record`): tenants may not write ``pods/status``, so after a restart the record
says what the scheduler booked even where a tenant rewrote the annotations past admission.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from hamid.kube.client import KubeClient
from hamid.model._wire import is_decimal
from hamid.model.booked import booked_condition
from hamid.model.errors import InvalidInput

VERSION = "v1"
#: The shortest key accepted (bytes of the key file's line): 256 bits of a random hex or base64 text.
MIN_KEY_BYTES = 32
_DOMAIN = b"hamid-allocation-v1"
_MIG_DOMAIN = b"hamid-allocation-mig-v1"


def key_id(key: bytes) -> str:
    """The 8-hex-digit name of a key in signatures (not secret: a hash prefix)."""
    return hashlib.sha256(key).hexdigest()[:8]


def _message(uid: str, node: str, issued: int, allocated: str, mig: str) -> bytes:
    parts = [uid.encode(), node.encode(), str(issued).encode(), allocated.encode()]
    if not mig:
        return b"\0".join((_DOMAIN, *parts))
    return b"\0".join((_MIG_DOMAIN, *parts, mig.encode()))


@dataclass(frozen=True, slots=True)
class Signed:
    """A signature that verified: which key made it and when it was issued (ms since the epoch)."""

    key_id: str
    issued: int


@dataclass(frozen=True)
class AllocationKeys:
    """A key ring, oldest first: :meth:`sign` with the newest, :meth:`verify` with any."""

    keys: tuple[bytes, ...]
    clock: Callable[[], float] = time.time

    def __post_init__(self) -> None:
        if not self.keys:
            raise InvalidInput("an allocation key ring needs at least one key")
        for i, key in enumerate(self.keys):
            if len(key) < MIN_KEY_BYTES:
                raise InvalidInput(f"allocation key {i + 1} has {len(key)} bytes; at least {MIN_KEY_BYTES}")

    @classmethod
    def generate(cls) -> AllocationKeys:
        """A ring of one fresh random key (the simulator's; a production key comes from a Secret)."""
        return cls((secrets.token_hex(32).encode(),))

    @classmethod
    def parse(cls, text: str, where: str = "allocation key file") -> AllocationKeys:
        """One key per line, oldest first (blank lines and ``#`` comments skipped)."""
        lines = [line.strip() for line in text.splitlines()]
        keys = tuple(line.encode() for line in lines if line and not line.startswith("#"))
        if not keys:
            raise InvalidInput(f"{where} holds no key (one key per line, the newest last)")
        try:
            return cls(keys)
        except InvalidInput as exc:
            raise InvalidInput(f"{where}: {exc}") from None

    def sign(self, uid: str, node: str, allocated: str, mig: str = "") -> str:
        """The signature value of ``allocated`` (and MIG reservations ``mig``) on ``node`` for pod
        ``uid``, issued now."""
        key = self.keys[-1]
        issued = int(self.clock() * 1000)
        mac = hmac.new(key, _message(uid, node, issued, allocated, mig), hashlib.sha256).hexdigest()
        return f"{VERSION}:{key_id(key)}:{issued}:{mac}"

    def verify(self, uid: str, node: str, allocated: str, value: str | None, mig: str = "") -> Signed | None:
        """The verified signature of this allocation, or None (absent, malformed or mis-signed)."""
        if not isinstance(value, str):
            return None
        parts = value.split(":")
        if len(parts) != 4 or parts[0] != VERSION or not is_decimal(parts[2]) or len(parts[2]) > 16:
            return None
        kid, issued, mac = parts[1], int(parts[2]), parts[3]
        message = _message(uid, node, issued, allocated, mig)
        for key in self.keys:
            if key_id(key) != kid:
                continue
            expected = hmac.new(key, message, hashlib.sha256).hexdigest()
            if hmac.compare_digest(expected, mac):
                return Signed(kid, issued)
        return None


async def record_booked(
    kube: KubeClient,
    keys: AllocationKeys | None,
    pod: tuple[str, str, str],
    node: str,
    allocated: str,
    *,
    budget_s: float,
    mig: str = "",
) -> None:
    """Record ``allocated`` (and MIG reservations ``mig``) on ``node`` as booked in the status of
    ``pod`` (namespace, name, uid), freshly signed, through ``pods/status`` within ``budget_s`` (a
    strategic merge: the pod's other conditions stay).

    In unsigned mode the record has an empty signature: the ledger books nothing from it (it
    proves nothing a tenant's annotation does not), but its presence, in a status tenants cannot
    write, is what tells the device plugin that this scheduler bound the pod. Raises the API's
    error (a Conflict when the pod of that name has another UID).
    """
    namespace, name, uid = pod
    if keys is None:
        condition = booked_condition(node, allocated, "", time.time(), mig)
    else:
        condition = booked_condition(node, allocated, keys.sign(uid, node, allocated, mig), keys.clock(), mig)
    await kube.patch_pod_status(
        namespace, name, {"conditions": [condition]}, strategic=True, uid=uid, timeout=budget_s
    )


def load_key_file(path: str) -> AllocationKeys:
    """The key ring in the file at ``path`` (see :meth:`AllocationKeys.parse`)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"cannot read the allocation key file {path}: {exc}") from None
    return AllocationKeys.parse(text, f"allocation key file {path}")


def describe(keys: Sequence[bytes]) -> list[str]:
    """The key ids of a ring (for the start-up log; never the keys)."""
    return [key_id(k) for k in keys]
