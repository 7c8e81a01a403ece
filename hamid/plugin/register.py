"""Node registration: keep ``hami.io/node-nvidia-register`` equal to this node's inventory."""

from __future__ import annotations

import asyncio
import contextlib

from hamid.kube.client import KubeClient
from hamid.kube.errors import KubeError
from hamid.log import get_logger
from hamid.model.annotations import NODE_REGISTER, encode_node_devices
from hamid.model.errors import InvalidInput
from hamid.plugin.inventory import Inventory
from hamid.plugin.pods import NodePods

log = get_logger("plugin.register")

REGISTER_INTERVAL_S = 30.0
ERROR_INTERVAL_S = 5.0


class NodeRegistrar:
    """Patches the register annotation every ``interval`` s (``error_interval`` after an error),
    only when the value differs, and at once after a health change."""

    def __init__(
        self,
        client: KubeClient,
        pods: NodePods,
        inventory: Inventory,
        *,
        interval: float = REGISTER_INTERVAL_S,
        error_interval: float = ERROR_INTERVAL_S,
        call_timeout: float = 5.0,
    ) -> None:
        self.client = client
        self.pods = pods
        self.node_name = pods.node_name
        self.inventory = inventory
        self.interval = interval
        self.error_interval = error_interval
        self.call_timeout = call_timeout
        self.last_written: str | None = None
        self.patches = 0

    def _current(self) -> str | None:
        node = self.pods.node()
        if node is None:
            return self.last_written
        return ((node.get("metadata") or {}).get("annotations") or {}).get(NODE_REGISTER)

    async def register_once(self) -> bool:
        """Write the annotation if it differs from the node's; returns whether a patch was sent."""
        infos = self.inventory.device_infos()
        if not infos:
            log.warning("no GPUs to register on this node; the register annotation is not written")
            return False
        value = encode_node_devices(infos)
        if value == self.last_written and self._current() == value:
            return False
        await self.client.patch_node_metadata(
            self.node_name, annotations={NODE_REGISTER: value}, timeout=self.call_timeout
        )
        self.last_written = value
        self.patches += 1
        log.info("node devices registered", node=self.node_name, devices=len(infos))
        return True

    async def run(self) -> None:
        """Loop until cancelled."""
        while True:
            generation = self.inventory.generation
            try:
                await self.register_once()
                delay = self.interval
            except (KubeError, InvalidInput) as exc:
                log.warning(
                    "node registration failed; retrying", error=str(exc), retry_in_s=self.error_interval
                )
                delay = self.error_interval
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self.inventory.wait_changed(generation)
