"""The leader's handshake loop: ``Requesting_<now>`` on every registered node that needs one.

HAMi's scheduler writes ``hami.io/node-handshake`` so the device plugin can tell a live scheduler
from a gone one (docs/hami-wire.md); only the replica that decides writes it.
"""

from __future__ import annotations

import asyncio
from datetime import datetime

from hamid.kube.client import KubeClient
from hamid.kube.errors import KubeError
from hamid.log import get_logger
from hamid.model import annotations as ann
from hamid.scheduler.ledger import Ledger
from hamid.scheduler.readiness import Readiness

log = get_logger("scheduler")


class Handshakes:
    """Writes the handshakes the state asks for (:attr:`~hamid.scheduler.ledger.Ledger.handshake_wanted`)."""

    def __init__(
        self,
        ledger: Ledger,
        kube: KubeClient,
        readiness: Readiness,
        *,
        interval_s: float,
        api_timeout_s: float,
    ) -> None:
        self.ledger = ledger
        self.kube = kube
        self.readiness = readiness
        self.interval_s = interval_s
        self.api_timeout_s = api_timeout_s

    async def run(self) -> None:
        """Every ``interval_s``, write the handshakes wanted while this replica decides."""
        while True:
            if not self.readiness.reason():  # only the leader writes handshakes
                await self.write()
            await asyncio.sleep(self.interval_s)

    async def write(self) -> None:
        """Write ``Requesting_<now>`` on registered nodes whose handshake is missing or stale-format."""
        for name in sorted(self.ledger.handshake_wanted):
            if name not in self.ledger.nodes:
                continue
            value = ann.format_handshake(datetime.now())
            try:
                await self.kube.patch_node_metadata(
                    name, annotations={ann.NODE_HANDSHAKE: value}, timeout=self.api_timeout_s
                )
                self.ledger.handshake_wanted.discard(name)
            except KubeError as exc:
                log.warning("handshake_write_failed", node=name, error=str(exc))
