"""Node registration: keep ``hami.io/node-nvidia-register`` equal to this node's inventory, and
``hami.io/node-nvidia-score`` equal to the pair scores of the registered GPUs' links."""

from __future__ import annotations

import asyncio
import contextlib

from hamid.kube.client import KubeClient
from hamid.kube.errors import KubeError
from hamid.kube.events import EventRecorder
from hamid.log import get_logger
from hamid.model import objects
from hamid.model.annotations import NODE_REGISTER, NODE_SCORE, encode_node_devices, encode_pair_scores
from hamid.model.errors import InvalidInput
from hamid.model.gpulinks import ASYMMETRIC_MESSAGE, ASYMMETRIC_REASON, GpuLinks, pair_scores
from hamid.plugin.inventory import GpuInventory
from hamid.plugin.pods import NodePods

log = get_logger("plugin.register")

REGISTER_INTERVAL_S = 30.0
ERROR_INTERVAL_S = 5.0


class NodeRegistrar:
    """Patches the register and score annotations every ``interval`` s (``error_interval`` after
    an error), only the ones whose value differs, and at once after a health change.

    The score is HAMi's ``calculateGPUScore`` over the registered GPUs (in register order) from
    ``links``; with ``links`` None (a devices file without ``links``) it is not written, as HAMi's
    plugin writes it only when it computes it. A pair with asymmetric links scores 0 and the
    node gets HAMi's ``AsymmetricGPUP2PLink`` Warning each time the score is written.
    """

    def __init__(
        self,
        client: KubeClient,
        pods: NodePods,
        inventory: GpuInventory,
        *,
        links: GpuLinks | None = None,
        interval: float = REGISTER_INTERVAL_S,
        error_interval: float = ERROR_INTERVAL_S,
        call_timeout: float = 5.0,
    ) -> None:
        self.client = client
        self.pods = pods
        self.node_name = pods.node_name
        self.inventory = inventory
        self.links = links
        self.events = EventRecorder(client, "hamid-device-plugin", pods.node_name)
        self.interval = interval
        self.error_interval = error_interval
        self.call_timeout = call_timeout
        self.last_written: dict[str, str | None] = {}
        self.patches = 0
        #: Whether the node's annotations were found or written as this plugin wants them.
        self.node_registered = False

    def _current(self) -> dict[str, str | None]:
        node = self.pods.node()
        if node is None:
            return dict(self.last_written)
        annotations = objects.annotations(node)
        return {key: annotations.get(key) for key in (NODE_REGISTER, NODE_SCORE)}

    async def register_once(self) -> bool:
        """Write the annotations that differ from the node's; returns whether a patch was sent."""
        infos = self.inventory.device_infos()
        if not infos:
            log.warning("node_registration_skipped_no_gpus")
            return False
        wanted = {NODE_REGISTER: encode_node_devices(infos)}
        asymmetric: tuple[tuple[str, str], ...] = ()
        if self.links is not None:
            scores = pair_scores(self.links, [info.id for info in infos])
            wanted[NODE_SCORE] = encode_pair_scores(scores.scores)
            asymmetric = scores.asymmetric
        current = self._current()
        changed = {key: value for key, value in wanted.items() if current.get(key) != value}
        if not changed:
            self.node_registered = True
            return False
        await self.client.patch_node_metadata(self.node_name, annotations=changed, timeout=self.call_timeout)
        self.last_written.update(changed)
        self.patches += 1
        self.node_registered = True
        log.info("node_devices_registered", node=self.node_name, devices=len(infos), keys=sorted(changed))
        if NODE_SCORE in changed and asymmetric:
            log.warning("gpu_links_asymmetric_scored_zero", node=self.node_name, pairs=list(asymmetric))
            node = self.pods.node() or {"kind": "Node", "metadata": {"name": self.node_name}}
            await self.events.record(node, "Warning", ASYMMETRIC_REASON, ASYMMETRIC_MESSAGE)
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
                    "node_registration_failed_retrying", error=str(exc), retry_in_s=self.error_interval
                )
                delay = self.error_interval
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self.inventory.wait_changed(generation)
