"""The node's advertised devices: physical GPUs, their replicas, health, and what gets registered.

Owned by the event loop: health changes arrive through :meth:`GpuInventory.mark_unhealthy` (the XID
thread schedules it with ``loop.call_soon_threadsafe``) and wake every ``ListAndWatch`` stream and
the registration loop. XID health is sticky, as upstream; a recoverable condition (no CDI spec names
the GPU: :mod:`hamid.plugin.cdi_health`) holds only while its cause does
(:meth:`GpuInventory.set_condition`), and a GPU is healthy while neither holds. Apart from health,
free replicas may be hidden from kubelet by the ``--hide-replicas`` rule
(:meth:`GpuInventory.set_hidden`, kept by :mod:`hamid.plugin.replica_room`): they are reported
Unhealthy while the rule says so.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from hamid.log import get_logger
from hamid.model.devices import MODE_MIG, NVIDIA, DeviceInfo, MigProfile, replica_id
from hamid.model.mig import AllowedMigProfiles, allowed_profiles_for, profile_slice_key
from hamid.model.nodeconfig import NodeConfig
from hamid.plugin.allocator_rules import GpuFacts
from hamid.plugin.discovery import PhysicalGpu

log = get_logger("plugin.inventory")


@dataclass(frozen=True, slots=True)
class Replica:
    """One kubelet-visible device: ``<UUID>-<i>``, its health and NUMA (None = no topology sent)."""

    id: str
    uuid: str
    healthy: bool
    numa: int | None


def device_type(name: str) -> str:
    """The registered ``type``: the NVML name prefixed with ``NVIDIA-`` unless it starts with NVIDIA."""
    return name if name.upper().startswith(NVIDIA) else f"{NVIDIA}-{name}"


@dataclass(frozen=True, slots=True)
class ConditionChange:
    """The GPUs a :meth:`GpuInventory.set_condition` made hold the condition, and those it cleared."""

    began: tuple[str, ...] = ()
    ended: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class MigCapacity:
    """A GPU's registered dynamic MIG capability: the allowlisted profiles NVML offers, and the most
    instances one of them can have (HAMi registers that as the GPU's ``count``)."""

    profiles: tuple[MigProfile, ...]
    count: int


def mig_capacity(gpu: PhysicalGpu, allowlist: Sequence[AllowedMigProfiles]) -> MigCapacity | None:
    """HAMi's ``discoverMigProfiles``: the profiles of the first allowlist entry naming the GPU's
    model, each with what NVML reports for its slice group (``core``: its share of the full GPU's
    multiprocessors, rounded up). None, with a warning, when nothing can be registered."""
    model = device_type(gpu.name)
    if not gpu.mig_enabled:
        log.warning(
            "gpu_mig_disabled_not_registered",
            uuid=gpu.uuid,
            hint=f"enable MIG mode (nvidia-smi -i {gpu.index} -mig 1) and restart the plugin",
        )
        return None
    allowed = allowed_profiles_for(model, allowlist)
    if not allowed:
        log.warning(
            "gpu_model_not_in_mig_allowlist_not_registered",
            uuid=gpu.uuid,
            model=model,
            hint="add the model to nvidia.migProfileAllowlist in the device config",
        )
        return None
    offered = {p.slices: p for p in gpu.mig_profiles}
    full = max((p.multiprocessors for p in gpu.mig_profiles), default=0)
    profiles: list[MigProfile] = []
    counts: list[int] = []
    for name in allowed:
        found = offered.get(profile_slice_key(name))
        if found is None:
            log.warning("mig_profile_not_offered_by_gpu", uuid=gpu.uuid, model=model, profile=name)
            continue
        core = -(-found.multiprocessors * 100 // full) if full else 0
        profiles.append(MigProfile(name, found.memory_mb, core, found.slice_count, found.placements))
        counts.append(found.instance_count)
    if not profiles:
        log.warning(
            "gpu_no_mig_profile_not_registered", uuid=gpu.uuid, model=model, allowlisted=list(allowed)
        )
        return None
    log.info(
        "gpu_mig_profiles_discovered",
        uuid=gpu.uuid,
        model=model,
        profiles=[
            f"{p.name}:{p.memory_mb}MiB/{p.core}%/{[(x.start, x.size) for x in p.placements]}"
            for p in profiles
        ],
    )
    return MigCapacity(tuple(profiles), max(counts))


class GpuInventory:
    """Physical GPUs selected for this node (filters applied) and their replicas."""

    def __init__(
        self,
        gpus: Sequence[PhysicalGpu],
        settings: NodeConfig,
        mig_allowlist: Sequence[AllowedMigProfiles] = (),
    ) -> None:
        self.settings = settings
        self.gpus: tuple[PhysicalGpu, ...] = tuple(self._select(gpus, settings))
        #: In ``mig`` mode, the registered MIG capability of each GPU that has one (others are not
        #: registered: MIG mode off, model not allowlisted, or no allowlisted profile offered).
        self.mig: dict[str, MigCapacity] = {}
        if self.is_mig:
            for gpu in self.gpus:
                capacity = mig_capacity(gpu, mig_allowlist)
                if capacity is not None:
                    self.mig[gpu.uuid] = capacity
        self._healthy = {g.uuid: g.healthy for g in self.gpus}
        self._minor = {g.uuid: g.minor for g in self.gpus}
        self._unhealthy_reason = {g.uuid: "unhealthy at discovery" for g in self.gpus if not g.healthy}
        #: Recoverable conditions: condition -> the GPUs (UUIDs) it holds on.
        self._conditions: dict[str, frozenset[str]] = {}
        self._replica_uuid: dict[str, str] = {}
        self._replicas_of: dict[str, tuple[str, ...]] = {}
        for gpu in self.gpus:
            ids = tuple(replica_id(gpu.uuid, i) for i in range(settings.device_split_count))
            self._replicas_of[gpu.uuid] = ids
            self._replica_uuid.update(dict.fromkeys(ids, gpu.uuid))
        #: Replica IDs reported Unhealthy by the ``--hide-replicas`` rule (by GPU UUID; not sticky).
        self._hidden: dict[str, frozenset[str]] = {}
        #: Replica IDs left out of the list entirely (rule ``span`` on an empty node).
        self._omitted: dict[str, frozenset[str]] = {}
        self.generation = 0
        self._changed = asyncio.Event()
        #: Called when a GPU's health changed, before watchers are woken: the hidden replicas depend
        #: on which GPUs are healthy, and kubelet must get one list with both judged.
        self.on_health_change: Callable[[], object] | None = None

    @staticmethod
    def _select(gpus: Sequence[PhysicalGpu], settings: NodeConfig) -> list[PhysicalGpu]:
        chosen: list[PhysicalGpu] = []
        for gpu in sorted(gpus, key=lambda g: g.index):
            if gpu.uuid in settings.filter_uuids or gpu.index in settings.filter_indices:
                log.info("gpu_filtered_out", by="filterdevices", uuid=gpu.uuid, index=gpu.index)
                continue
            if gpu.mig_enabled and settings.operating_mode != MODE_MIG:
                log.warning(
                    "gpu_mig_enabled_not_advertised",
                    uuid=gpu.uuid,
                    mode=settings.operating_mode,
                )
                continue
            chosen.append(gpu)
        return chosen

    @property
    def is_mig(self) -> bool:
        """Whether the node runs in ``mig`` operating mode (never takes part in NUMA refit)."""
        return self.settings.operating_mode == MODE_MIG

    def uuid_of(self, device_id: str) -> str | None:
        """The physical GPU UUID of one of this node's replica IDs (None if unknown)."""
        return self._replica_uuid.get(device_id)

    def mig_profile(self, uuid: str, name: str) -> MigProfile | None:
        """The registered MIG profile ``name`` of a GPU (None: not registered for it)."""
        capacity = self.mig.get(uuid)
        return next((p for p in capacity.profiles if p.name == name), None) if capacity else None

    def minor_of(self, uuid: str) -> int | None:
        """The minor number of an advertised GPU's device node (None: unknown, or no such GPU)."""
        return self._minor.get(uuid)

    def replica_ids(self, uuid: str) -> tuple[str, ...]:
        """The replica IDs of one advertised GPU, in order (empty for an unknown UUID)."""
        return self._replicas_of.get(uuid, ())

    def replicas(self) -> list[Replica]:
        """Every replica kubelet sees, in GPU index order (topology only with enablenumatopology);
        a replica of an unhealthy GPU, or one hidden by the ``--hide-replicas`` rule, is unhealthy."""
        out: list[Replica] = []
        for gpu in self.gpus:
            numa = gpu.numa if self.settings.enable_numa_topology else None
            healthy = self.is_healthy(gpu.uuid)
            hidden = self._hidden.get(gpu.uuid, frozenset())
            omitted = self._omitted.get(gpu.uuid, frozenset())
            out.extend(
                Replica(rid, gpu.uuid, healthy and rid not in hidden, numa)
                for rid in self._replicas_of[gpu.uuid]
                if rid not in omitted
            )
        return out

    def is_healthy(self, uuid: str) -> bool:
        """Whether an advertised GPU is healthy: no XID marked it and no condition holds (hidden
        replicas aside)."""
        return self._healthy.get(uuid, False) and not any(uuid in held for held in self._conditions.values())

    def set_condition(self, condition: str, uuids: Iterable[str]) -> ConditionChange:
        """From now on ``condition`` holds on exactly these advertised GPUs (others ignored); wakes
        watchers when a GPU began or ceased to hold it."""
        wanted = frozenset(u for u in uuids if u in self._healthy)
        before = self._conditions.get(condition, frozenset())
        change = ConditionChange(tuple(sorted(wanted - before)), tuple(sorted(before - wanted)))
        if wanted:
            self._conditions[condition] = wanted
        else:
            self._conditions.pop(condition, None)
        if change.began or change.ended:
            self._health_changed()
        return change

    def hidden(self, uuid: str) -> frozenset[str]:
        """The replicas of a GPU hidden for want of room (empty: none)."""
        return self._hidden.get(uuid, frozenset())

    def set_hidden(
        self,
        hidden: Mapping[str, frozenset[str]],
        cause: str = "no room left",
        omitted: Mapping[str, frozenset[str]] | None = None,
    ) -> bool:
        """Hide exactly these replicas (by GPU UUID; ``cause``: the rule, for the log), re-offering
        all others; wakes watchers when what kubelet sees changed. Returns whether it changed."""
        wanted = {u: frozenset(ids) & frozenset(self._replicas_of.get(u, ())) for u, ids in hidden.items()}
        wanted = {u: ids for u, ids in wanted.items() if ids}
        left_out = {u: frozenset(ids) for u, ids in (omitted or {}).items() if ids}
        if wanted == self._hidden and left_out == self._omitted:
            return False
        self._omitted = left_out
        for uuid in sorted(self._hidden.keys() | wanted.keys()):
            before, after = self._hidden.get(uuid, frozenset()), wanted.get(uuid, frozenset())
            if after and not before:
                log.info("gpu_replicas_hidden", uuid=uuid, replicas=len(after), cause=cause)
            elif before and not after:
                log.info("gpu_replicas_reoffered", uuid=uuid, replicas=len(before))
            elif before != after:
                log.info("gpu_replicas_hidden_changed", uuid=uuid, replicas=len(after))
        self._hidden = wanted
        self._bump()
        return True

    def _capacity(self, gpu: PhysicalGpu) -> tuple[int, int] | None:
        """Registered (MiB, cores) of one GPU, scaling applied; None when its memory is unknown."""
        s = self.settings
        memory = gpu.memory_mib or s.preconfigured_device_memory
        if memory <= 0:
            return None
        if self.is_mig:
            return memory, 100
        return int(memory * s.device_memory_scaling), int(s.device_core_scaling * 100)

    def facts(self, uuid: str) -> GpuFacts | None:
        """Registered capacity and XID health of one advertised GPU (None: the node has no such
        GPU). Conditions are left out: Allocate checks their causes itself, as they are now."""
        gpu = next((g for g in self.gpus if g.uuid == uuid), None)
        capacity = self._capacity(gpu) if gpu is not None else None
        if capacity is None:
            return None
        return GpuFacts(capacity[0], capacity[1], self._unhealthy_reason.get(uuid))

    def device_infos(self) -> list[DeviceInfo]:
        """What ``hami.io/node-nvidia-register`` carries, one record per GPU (NUMA unknown → 0)."""
        s = self.settings
        infos: list[DeviceInfo] = []
        for gpu in self.gpus:
            capacity = self._capacity(gpu)
            if capacity is None:
                log.warning(
                    "gpu_memory_unknown_not_registered", hint="set preconfigureddevicememory", uuid=gpu.uuid
                )
                continue
            devmem, devcore = capacity
            mig = self.mig.get(gpu.uuid)
            if self.is_mig and mig is None:
                continue  # why was logged once, at start
            infos.append(
                DeviceInfo(
                    id=gpu.uuid,
                    index=gpu.index,
                    count=mig.count if mig is not None else s.device_split_count,
                    devmem=devmem,
                    devcore=devcore,
                    type=device_type(gpu.name),
                    numa=gpu.numa if gpu.numa is not None else 0,
                    mode=s.operating_mode,
                    health=self.is_healthy(gpu.uuid),
                    mig_profiles=mig.profiles if mig is not None else (),
                )
            )
        return infos

    def mark_unhealthy(self, uuid: str, reason: str) -> bool:
        """Mark a GPU unhealthy (sticky, as upstream); wakes watchers. Returns whether it changed."""
        if not self._healthy.get(uuid, False):
            return False
        self._healthy[uuid] = False
        self._unhealthy_reason[uuid] = reason
        log.warning("gpu_marked_unhealthy", uuid=uuid, reason=reason)
        self._health_changed()
        return True

    def _health_changed(self) -> None:
        if self.on_health_change is not None:
            self.on_health_change()
        self._bump()

    def _bump(self) -> None:
        self.generation += 1
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_changed(self, generation: int) -> int:
        """Wait until the generation moves past ``generation``; return the new one."""
        while self.generation == generation:
            await self._changed.wait()
        return self.generation
