"""Hide some free GPU replicas from kubelet (``--hide-replicas``).

kubelet counts device replicas, not the GPU room behind them: a GPU whose cores or memory are fully
booked still offers its free replicas, so the Topology Manager puts an aligned pod's CPUs on a NUMA
node none of whose GPUs can take it (docs/packing.md, "Aligned LS pods with NUMA on").
:class:`ReplicaRoom` keeps :meth:`GpuInventory.set_hidden` current from the scheduler's bookings on
this node's pods (``hami.io/vgpu-devices-allocated``, the same phase-aware usage the scheduler
books) by the rule of :func:`hamid.fit.replica_room.hides`: ``full`` reports the *free* replicas of
a GPU whose booked memory or cores reach its registered capacity Unhealthy; ``busy`` also those of a
partly booked GPU while some healthy GPU of the node has no booking; ``span`` as ``busy``, and while
no pod holds a replica (the pod cache listed the node), each GPU lists one free replica or what
pending bookings need, the rest left out of ListAndWatch. Only the bookings of pods
kubelet admitted (Allocate served them) count: a pod bound but not yet admitted counts for nothing,
so its GPUs are judged as before it (a GPU it fills keeps every free replica, an idle GPU it takes
stays idle) until it is admitted, and kubelet sizes its hints for it as without it (were its GPUs'
replicas hidden down to the one it needs, an 8-GPU pod would see 4 replicas per NUMA node and fail
``restricted`` with a TopologyAffinityError). What stays Healthy:

* replicas a container holds (Allocate's device IDs, and kubelet's PodResources API after a
  restart), so kubelet's allocatable never drops below what its pods request (PodResources lists
  no regular init container: after a restart a replica only such a container holds is not known);
* as many free replicas as pending bookings on the GPU still need, should one be booked on a GPU
  already without room (a share of no cores on a GPU whose cores are all booked);
* everything, while a pod that holds replicas is not known to the plugin yet (after a restart,
  before PodResources was read): hiding a held replica would shrink kubelet's allocatable.

A GPU with room again re-offers its replicas; XID unhealthiness stays separate and sticky.

``steer`` reports, while the pod the node lock names is admitted, every free replica Unhealthy on
the NUMA nodes none of its booked GPUs is on (from the moment the scheduler's ``/bind`` took the
lock, before the pod is bound, to its last container's Allocate: :mod:`hamid.plugin.steering`);
other pods' pending entries never steer. Otherwise it is ``span``.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hamid.fit.replica_room import effective_rule, hides, is_idle, no_room
from hamid.fit.usage import PodUsage, container_kinds, effective_pod_usage, init_containers_succeeded
from hamid.kube.cache import PodCache
from hamid.log import get_logger
from hamid.model import objects
from hamid.model.annotations import DEVICES_ALLOCATED, decode_pod_devices
from hamid.model.errors import InvalidInput
from hamid.model.kube import PodBody
from hamid.model.numa import SPANNING_RULES, STEERING_RULES
from hamid.plugin.allocator_rules import is_unadmitted, pending_entries, requests_resource, to_allocate
from hamid.plugin.inventory import GpuInventory
from hamid.plugin.podresources_client import HeldPod

log = get_logger("plugin.replica_room")

_TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True, slots=True)
class PodBooking:
    """What one pod on the node books and needs: usage per GPU, replicas its pending (not yet
    allocated) containers still need per GPU, and whether it holds replicas (kubelet admitted it)."""

    usage: PodUsage
    pending: Mapping[str, int]
    holds: bool


def pod_booking(pod: Mapping[str, Any], resource_name: str) -> PodBooking | None:
    """The booking of one non-terminal pod (None: an annotation that cannot be decoded)."""
    raw = objects.annotations(pod).get(DEVICES_ALLOCATED)
    try:
        if not raw:  # not hamid's: it holds replicas once admitted, if it asks for them
            return PodBooking({}, {}, requests_resource(pod, resource_name) and not is_unadmitted(pod))
        layout = decode_pod_devices(raw)
        usage = effective_pod_usage(layout, container_kinds(pod), init_containers_succeeded(pod))
        pending = pending_entries(to_allocate(pod))
    except InvalidInput:
        return None
    needs = Counter(d.uuid for entry in pending for d in entry.devices)
    return PodBooking(usage, dict(needs), len(pending) < sum(1 for entry in layout if entry))


@dataclass(slots=True)
class _Booked:
    """What the live pods of the node book per GPU (of the admitted ones), need (pending entries)
    and who holds replicas."""

    mem: Counter[str] = field(default_factory=Counter)
    cores: Counter[str] = field(default_factory=Counter)
    slots: Counter[str] = field(default_factory=Counter)
    needs: Counter[str] = field(default_factory=Counter)
    holders: set[str] = field(default_factory=set)


class ReplicaRoom:
    """Keeps the inventory's hidden replicas from the node's bookings (event-loop owned)."""

    def __init__(
        self,
        inventory: GpuInventory,
        pods: Callable[[], Iterable[PodBody]],
        resource_name: str,
        rule: str,
        topology_policy: Callable[[], str | None] = lambda: None,
    ) -> None:
        """``pods``: the pods bound to the node now (:meth:`NodePods.pods`, own writes included);
        ``rule``: which free replicas to hide (:data:`hamid.model.numa.HIDE_RULES`);
        ``topology_policy``: kubelet's Topology Manager policy as the node's NUMA profile says (None:
        not known yet), which ``span`` needs (:func:`hamid.fit.replica_room.effective_rule`)."""
        self.inventory = inventory
        self.rule = rule
        self.topology_policy = topology_policy
        self.pods = pods
        self.resource_name = resource_name
        #: Replica IDs held per pod (``namespace/name``): from Allocate, and from PodResources.
        self._allocated: dict[str, frozenset[str]] = {}
        self._listed: dict[str, frozenset[str]] = {}
        #: Per pod key: (resourceVersion, its booking), so a sync decodes only changed pods.
        self._bookings: dict[str, tuple[str, PodBooking | None]] = {}
        #: The live pods of the last sync.
        self._seen: set[str] = set()
        self._scheduled = False
        self._unknown_logged = False
        self._omitted_now: dict[str, frozenset[str]] = {}
        #: Whether ``pods`` lists every pod of the node (its cache applied its first list): only
        #: then may ``span`` take an empty list for an idle node.
        self._complete: Callable[[], bool] = lambda: True
        #: The pod the node lock names while it is being bound (``namespace/name``) and the replicas
        #: its pending booking needs per GPU: counted as a bound pod's until ``pods`` lists it.
        self._binding: tuple[str, Mapping[str, int]] | None = None
        #: Whether the last judgement steered for the pod the lock names (``steer``): the plugin
        #: confirms a list to the bind only then.
        self.steering_applied = False

    def watch(self, cache: PodCache) -> None:
        """Re-judge after every event of the node's pod cache (coalesced into one sync per loop turn);
        ``span`` lists an idle node's GPUs one replica each only once the cache has synced."""
        self._complete = lambda: cache.synced
        cache.add_handlers(
            on_add=lambda _pod: self.poke(),
            on_update=lambda _old, _new: self.poke(),
            on_delete=lambda _pod: self.poke(),
        )

    def poke(self) -> None:
        """Schedule one :meth:`sync` (several pokes in one loop turn make one)."""
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._scheduled_sync)

    def _scheduled_sync(self) -> None:
        self._scheduled = False
        self.sync()

    def allocated(self, pod_key: str, ids: Iterable[str]) -> None:
        """Allocate served ``pod_key`` these replica IDs (they are held from now on); re-judge."""
        self._allocated[pod_key] = self._allocated.get(pod_key, frozenset()) | frozenset(ids)
        if self._binding is not None and self._binding[0] == pod_key:
            # what is served is held now; the pod's other containers are still admitted steered
            left = Counter(self._binding[1])
            left.subtract(Counter(u for u in map(self.inventory.uuid_of, ids) if u is not None))
            self._binding = (pod_key, +left) if +left else None
        self.sync()

    def binding(self, pod_key: str | None, needs: Mapping[str, int] | None = None) -> bool:
        """The pod the node lock names is being bound here and its pending booking ``needs`` these
        replicas per GPU (None: no such pod any more); re-judge, and whether kubelet's view changed."""
        self._binding = None if pod_key is None else (pod_key, dict(needs or {}))
        return self.sync()

    def effective_rule(self) -> str | None:
        """The rule applied now (:func:`hamid.fit.replica_room.effective_rule`)."""
        return effective_rule(self.rule, self.topology_policy())

    def listed(self, held: Sequence[HeldPod]) -> None:
        """kubelet's PodResources answer: the replicas each active pod holds; re-judge."""
        self._listed = {
            pod.key: frozenset(
                i
                for c in pod.containers
                for ids in c.devices.get(self.resource_name, {}).values()
                for i in ids
            )
            for pod in held
        }
        self.sync()

    def sync(self) -> bool:
        """Recompute the hidden replicas from the pods now on the node; whether kubelet's view changed."""
        hidden = self.hidden()
        return self.inventory.set_hidden(hidden, f"--hide-replicas {self.rule}", self._omitted_now)

    def _booking(self, pod: Mapping[str, Any]) -> PodBooking | None:
        key, version = objects.namespaced_key(pod), objects.resource_version(pod)
        known = self._bookings.get(key)
        if known is not None and known[0] == version and version:
            return known[1]
        booking = pod_booking(pod, self.resource_name)
        self._bookings[key] = (version, booking)
        return booking

    def hidden(self) -> dict[str, frozenset[str]]:
        """The replicas to hide now, by GPU UUID (empty when nothing may be hidden)."""
        self._omitted_now = {}
        self.steering_applied = False
        booked = self._tally()
        if booked is None:
            return {}  # an allocation that cannot be read: its GPUs' room is not known
        held = self._held_ids(booked.holders)
        if held is None:
            return {}
        rule = self.effective_rule()
        # only the pod the node lock names steers: what other pods' annotations say is pending
        # keeps its replicas listed, never moves kubelet (a tenant can write its own pod's)
        binding = self._binding if rule in STEERING_RULES else None
        steered = self._steered_numa(Counter(binding[1])) if binding is not None else None
        self.steering_applied = steered is not None
        # idle: no pod holds a replica, by the annotations and by what kubelet handed out (a pod's
        # own annotations may say it waits for devices it holds)
        if rule in SPANNING_RULES and not booked.holders and not held and self._complete():
            return self._one_each(held, booked.needs, steered)
        return self._by_room(held, booked, steered)

    def _steered_numa(self, needs: Counter[str]) -> frozenset[int | None] | None:
        """The NUMA nodes of the GPUs the lock holder's pending booking needs (None: none): under
        ``steer`` only their free replicas are offered while kubelet admits the pod."""
        numa = frozenset(g.numa for g in self.inventory.gpus if needs[g.uuid] > 0)
        return numa or None

    def _tally(self) -> _Booked | None:
        """What the live pods book and need (None: a booking cannot be read)."""
        booked = _Booked()
        live: set[str] = set()
        for pod in self.pods():
            if (pod.get("status") or {}).get("phase") in _TERMINAL_PHASES:
                continue
            key = objects.namespaced_key(pod)
            live.add(key)
            booking = self._booking(pod)
            if booking is None:
                return None
            booked.needs.update(booking.pending)
            if not booking.holds:
                continue  # not admitted yet: its GPUs keep every free replica (see the module)
            booked.holders.add(key)
            for uuid, amount in booking.usage.items():
                booked.mem[uuid] += amount.mem
                booked.cores[uuid] += amount.cores
                booked.slots[uuid] += amount.slots
        if self._binding is not None and self._binding[0] not in live:
            booked.needs.update(self._binding[1])
        self._forget_gone(live)
        return booked

    def _free(self, uuid: str, held: frozenset[str]) -> list[str]:
        return [r for r in self.inventory.replica_ids(uuid) if r not in held]

    def _one_each(
        self, held: frozenset[str], needs: Counter[str], steered: frozenset[int | None] | None
    ) -> dict[str, frozenset[str]]:
        """An idle node (``span``): each healthy GPU lists one free replica or what pending bookings
        need, the others left out; ``steered``: a GPU off those NUMA nodes reports its one Unhealthy."""
        out: dict[str, frozenset[str]] = {}
        for gpu in self.inventory.gpus:
            if not self.inventory.is_healthy(gpu.uuid):
                continue
            free = self._free(gpu.uuid, held)
            listed = max(needs[gpu.uuid], 1)
            self._omitted_now[gpu.uuid] = frozenset(free[listed:])
            if steered is not None and gpu.numa not in steered and free[:listed]:
                out[gpu.uuid] = frozenset(free[:listed])
        return out

    def _by_room(
        self, held: frozenset[str], booked: _Booked, steered: frozenset[int | None] | None
    ) -> dict[str, frozenset[str]]:
        """``full``/``busy`` (and ``span``, ``steer`` outside their cases): by each GPU's room;
        ``steered``: every free replica off those NUMA nodes too, but what bookings need."""
        mem, cores, slots, needs = booked.mem, booked.cores, booked.slots, booked.needs
        idle = {g.uuid for g in self.inventory.gpus if is_idle(slots[g.uuid], mem[g.uuid], cores[g.uuid])}
        idle_on_node = any(self.inventory.is_healthy(u) for u in idle)
        out: dict[str, frozenset[str]] = {}
        for gpu in self.inventory.gpus:
            facts = self.inventory.facts(gpu.uuid)
            if facts is None:
                continue
            room = not no_room(mem[gpu.uuid], facts.memory_mib, cores[gpu.uuid], facts.cores)
            if not (
                hides(self.rule, room=room, idle=gpu.uuid in idle, idle_on_node=idle_on_node)
                or (steered is not None and gpu.numa not in steered)
            ):
                continue
            out[gpu.uuid] = frozenset(self._free(gpu.uuid, held)[needs[gpu.uuid] :])
        return out

    def _forget_gone(self, live: set[str]) -> None:
        """Forget the pods seen on the node before and gone now (a pod Allocate served before the
        pod cache listed it is kept until the cache has seen it come and go)."""
        gone = self._seen - live
        for table in (self._allocated, self._listed, self._bookings):
            for key in gone & table.keys():
                del table[key]
        self._seen = live

    def _held_ids(self, holders: set[str]) -> frozenset[str] | None:
        """Every replica a pod holds; None while a holder's replicas are not known (hide nothing)."""
        unknown = sorted(k for k in holders if k not in self._allocated and k not in self._listed)
        if unknown:
            if not self._unknown_logged:
                log.info("gpu_replicas_not_hidden_holders_unknown", pods=unknown[:5], count=len(unknown))
                self._unknown_logged = True
            return None
        self._unknown_logged = False
        return frozenset(
            i for table in (self._allocated, self._listed) for ids in table.values() for i in ids
        )
