"""The plugin's side of the ``steer`` handshake: kubelet holds the steered list before the pod.

Under ``--hide-replicas steer`` kubelet must have been sent the steered device list (free replicas
only on the NUMA nodes of the GPUs the pod's booking needs, :mod:`hamid.plugin.replica_room`)
before it computes the pod's
hints, and it starts as soon as it sees the pod bound. The scheduler's ``/bind`` takes HAMi's node
lock (``hami.io/mutex.lock``) before it creates the Binding, and the filter wrote the booking
before that. So when the lock names a pod booked here with pending entries, the plugin steers for
it, waits until every open ListAndWatch stream has sent that list, and writes the lock value it
steered for into the Node's ``hamid.io/devices-listed-for``; the bind waits for exactly that value
before it creates the Binding (the value names one take of the lock, so an acknowledgement of an
earlier take satisfies no later bind). Steering for the pod ends when Allocate served it
(:meth:`ReplicaRoom.allocated`), when the lock no longer names it (released, undone, taken over),
or :data:`BIND_WINDOW_S` after the lock was taken (the pod gone, its scheduler stopped midway); a
pod kubelet has still not admitted by then is admitted on ``span``'s list (only the pod the lock
names steers: another pod's annotations never do).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping

from hamid.kube.errors import KubeError
from hamid.log import get_logger
from hamid.model import nodelock, objects
from hamid.model.annotations import DEVICES_LISTED_FOR, VGPU_NODE, parse_node_lock
from hamid.model.errors import InvalidInput
from hamid.model.kube import PodBody
from hamid.model.numa import STEERING_RULES
from hamid.plugin.pods import NodePods
from hamid.plugin.replica_room import ReplicaRoom, pod_booking
from hamid.plugin.service import SentLists

log = get_logger("plugin.steering")

#: A bind answers within kube-scheduler's 30 s extender timeout, so this long after the lock was
#: taken a pod it names is bound here (its pending booking steers from then on), or its bind
#: failed, or its scheduler stopped midway, or it is gone: its steering ends.
BIND_WINDOW_S = 30.0


def binding_needs(pod: PodBody | None, node: str, resource_name: str) -> Mapping[str, int] | str:
    """The replicas per GPU the pending booking of the pod a lock names needs on ``node``, or why
    it gets no steering (gone, not Pending, booked or bound elsewhere, nothing pending, unreadable)."""
    if pod is None:
        return "pod not found"
    bound = objects.section(pod, "spec").get("nodeName")
    if objects.annotations(pod).get(VGPU_NODE) != node or bound not in (None, "", node):
        return "booked or bound on another node"
    if nodelock.holder_state(pod, node) is not nodelock.Holder.PENDING:
        return "not waiting for its devices"
    booking = pod_booking(pod, resource_name)
    if booking is None:
        return f"{resource_name} booking annotations cannot be decoded"
    if not booking.pending:
        return "nothing pending"
    return booking.pending


#: How often a steering that cannot be applied yet is judged again (within the bind window).
STEER_RETRY_S = 0.25


class LockSteering:
    """Steers kubelet for the pod the node lock names, then acknowledges on the Node (event-loop owned)."""

    def __init__(self, pods: NodePods, room: ReplicaRoom, sent: SentLists) -> None:
        """``sent``: what the open ListAndWatch streams have sent (the service's)."""
        self.pods = pods
        self.room = room
        self.sent = sent
        #: The lock value steered for now (None: none).
        self._value: str | None = None
        self._wake = asyncio.Event()
        pods.node_cache.add_handlers(
            on_add=lambda _node: self.poke(),
            on_update=lambda _old, _new: self.poke(),
            on_delete=lambda _node: self.poke(),
        )

    def poke(self) -> None:
        """The lock or the rule in effect may have changed (looked at in :meth:`run`, never here)."""
        self._wake.set()

    def _wanted(self) -> str | None:
        """The lock value to steer for: the node's lock while the rule in effect is ``steer``."""
        if self.room.effective_rule() not in STEERING_RULES:
            return None
        return nodelock.lock_value(self.pods.node())

    async def run(self) -> None:
        """Follow the node lock until cancelled: each new value ends the steering for the last one
        and starts it for the pod it names."""
        steering: asyncio.Task[None] | None = None
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                value = self._wanted()
                if value == self._value:
                    continue
                if steering is not None:
                    steering.cancel()
                    await asyncio.gather(steering, return_exceptions=True)
                    steering = None
                self._value = value
                self.room.binding(None)
                if value is not None:
                    steering = asyncio.create_task(self._steer(value), name=f"steer {value}")
        finally:
            if steering is not None:
                steering.cancel()

    async def _steer(self, value: str) -> None:
        """Steer for the pod lock ``value`` names and acknowledge once every stream sent the list;
        the steering ends after :data:`BIND_WINDOW_S` at the latest."""
        loop = asyncio.get_running_loop()
        closes = loop.time() + BIND_WINDOW_S
        try:
            async with asyncio.timeout_at(closes):
                await self._steer_and_ack(value)
        except TimeoutError:
            log.warning("steer_list_not_sent", node=self.pods.node_name, lock=value, within_s=BIND_WINDOW_S)
        except KubeError as exc:
            log.warning("steer_failed", node=self.pods.node_name, lock=value, error=str(exc))
        except Exception:  # never out of the task: the bind times out, kube-scheduler retries
            log.exception("steer_crashed", node=self.pods.node_name, lock=value)
        await asyncio.sleep(max(closes - loop.time(), 0.0))
        log.debug("steer_window_closed", node=self.pods.node_name, lock=value)
        self.room.binding(None)

    async def _steer_and_ack(self, value: str) -> None:
        try:
            lock = parse_node_lock(value)
        except InvalidInput as exc:
            log.warning("steer_lock_unparsable", node=self.pods.node_name, error=str(exc))
            return
        key = nodelock.holder_key(lock)
        if key is None or lock.namespace is None or lock.name is None:
            return  # a legacy lock names no pod
        started = time.perf_counter()
        pod = self.pods.pod(key) or await self.pods.fetch_pod(lock.namespace, lock.name, remember=False)
        needs = binding_needs(pod, self.pods.node_name, self.room.resource_name)
        if isinstance(needs, str):
            log.info("steer_skipped", node=self.pods.node_name, pod=key, reason=needs)
            return
        self.room.binding(key, needs)
        if not self.room.steering_applied:
            # nothing may be hidden now (a booking that cannot be read, holders not known yet after
            # a restart): kubelet would choose, so no confirmation until the steering holds
            log.warning("steer_not_applied", node=self.pods.node_name, pod=key, lock=value)
            while not self.room.steering_applied:
                await asyncio.sleep(STEER_RETRY_S)
                self.room.sync()
        await self.sent.wait_sent(self.room.inventory.generation)
        if await self._ack(value):
            log.info(
                "devices_listed_for_bind",
                node=self.pods.node_name,
                pod=key,
                replicas=dict(needs),
                ms=round((time.perf_counter() - started) * 1000, 1),
            )

    async def _ack(self, value: str) -> bool:
        """Write ``value`` into the Node's ``hamid.io/devices-listed-for`` (a merge patch of that key
        alone) unless the lock moved on meanwhile; whether the Node says it now."""
        node = self.pods.node()
        if nodelock.lock_value(node) != value:
            return False  # nobody waits for this value any more
        if objects.annotations(node).get(DEVICES_LISTED_FOR) != value:
            patched = await self.pods.client.patch_node_metadata(
                self.pods.node_name, annotations={DEVICES_LISTED_FOR: value}, timeout=self.pods.call_timeout
            )
            self.pods.remember_node(patched)  # the lock release after Allocate writes on its version
        return True
