"""kubelet's memory manager (``pkg/kubelet/cm/memorymanager``): the ``None`` and ``Static`` policies.

``Static`` pins the memory and ``hugepages-*`` of Guaranteed pods to NUMA nodes. Per NUMA node and
memory type it keeps the allocatable amount (capacity minus ``reservedMemory``; regular memory also
minus the node's hugepages), the free and the reserved amount, plus the node's *group* (``Cells``):
the NUMA nodes it was last allocated together with, and how many blocks use it. Its topology
hints (``calculateHints``) list every NUMA mask whose *free* memory covers the request and that
respects the groups (a node in a multi-node group gives no single-node hint; a node used alone or
in another group is in no multi-node hint); a hint is *preferred* when its size is the smallest
whose *allocatable* memory covers the request, i.e. as if the node were empty. ``Allocate`` takes
the Topology Manager's hint (or its own default one when the hint has no NUMA affinity), extends it
when its free memory falls short, refuses one that would break a group, and fills the nodes of the
mask in id order. Errors are plain errors in kubelet, so admission reports them as
``UnexpectedAdmissionError``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from hamid.model.errors import InvalidInput
from hamidsim.kubelet.cadvisor import NodeMemory
from hamidsim.kubelet.podutil import container_requests, is_restartable_init, pod_containers, pod_qos_class
from hamidsim.kubelet.quantity import parse_quantity, quantity_value
from hamidsim.kubelet.topologymanager import NumaMask, TopologyHint, is_narrower, iterate_masks

MEMORY_POLICY_NONE = "None"
MEMORY_POLICY_STATIC = "Static"
MEMORY_POLICIES = (MEMORY_POLICY_NONE, MEMORY_POLICY_STATIC)
MEMORY = "memory"
HUGEPAGES_PREFIX = "hugepages-"
#: kubelet's default ``evictionHard`` threshold for ``memory.available``.
DEFAULT_EVICTION_MEMORY = 100 * 1024 * 1024

MemoryHints = dict[str, list[TopologyHint]]


def is_memory_resource(name: str) -> bool:
    """``memory`` or a ``hugepages-<size>`` resource (what the memory manager pins)."""
    return name == MEMORY or name.startswith(HUGEPAGES_PREFIX)


def hugepages_resource(page_size: int) -> str:
    """``HugePageResourceName``: ``hugepages-2Mi`` for 2 MiB pages (the quantity's canonical text)."""
    for suffix, shift in (("Ei", 60), ("Pi", 50), ("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10)):
        if page_size % (1 << shift) == 0:
            return f"{HUGEPAGES_PREFIX}{page_size >> shift}{suffix}"
    return f"{HUGEPAGES_PREFIX}{page_size}"


class MemoryManagerError(Exception):
    """An error of the Static policy; kubelet's admission reports it as ``UnexpectedAdmissionError``."""

    def __init__(self, text: str) -> None:
        super().__init__(f"[memorymanager] {text}")


@dataclass(frozen=True, slots=True)
class MemoryReservation:
    """One ``reservedMemory`` entry: a NUMA node and the bytes per memory type kept from pods."""

    numa_node: int
    limits: tuple[tuple[str, int], ...]


def parse_reserved_memory(value: Any, source: str) -> tuple[MemoryReservation, ...]:
    """``reservedMemory: [{numaNode: 0, limits: {memory: 1Gi}}]``."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise InvalidInput(f"{source}: reservedMemory must be a list of {{numaNode, limits}}")
    result = []
    for i, item in enumerate(value):
        where = f"{source}: reservedMemory[{i}]"
        if not isinstance(item, Mapping) or not isinstance(item.get("limits"), Mapping):
            raise InvalidInput(f"{where}: want {{numaNode: <int>, limits: {{memory: <quantity>}}}}")
        node = item.get("numaNode")
        if isinstance(node, bool) or not isinstance(node, int) or node < 0:
            raise InvalidInput(f"{where}: numaNode must be a non-negative integer")
        limits = tuple(
            sorted((str(k), quantity_value(v, f"{where}.limits.{k}")) for k, v in item["limits"].items())
        )
        result.append(MemoryReservation(node, limits))
    return tuple(result)


def system_reserved_memory(
    numa_ids: Sequence[int],
    reservations: Sequence[MemoryReservation],
    allocatable_reservation: Mapping[str, int],
) -> dict[int, dict[str, int]]:
    """``getSystemReservedMemory``: ``reservedMemory`` per NUMA node and type, checked against node
    allocatable's reservation (kube + system reserved + hard eviction) with kubelet's errors."""
    totals: dict[str, int] = {}
    for r in reservations:
        if r.numa_node not in numa_ids:
            raise InvalidInput(
                f"the reserved memory configuration references a NUMA node {r.numa_node} that does not "
                "exist on this machine"
            )
        for name, size in r.limits:
            totals[name] = totals.get(name, 0) + size
    names = set(totals) | {n for n in allocatable_reservation if is_memory_resource(n)}
    for name in sorted(names):
        reserved, expected = totals.get(name, 0), allocatable_reservation.get(name, 0)
        if reserved != expected:
            raise InvalidInput(
                f'the total amount "{reserved}" of type "{name}" is not equal to the value "{expected}" '
                "determined by Node Allocatable feature"
            )
    result: dict[int, dict[str, int]] = {n: {} for n in numa_ids}
    for r in reservations:
        result[r.numa_node].update(dict(r.limits))
    return result


def check_memory_manager(policy: str) -> None:
    """``memorymanager.NewManager``: an unknown policy is refused."""
    if policy not in MEMORY_POLICIES:
        raise InvalidInput(f'unknown policy: "{policy}"')


# --- requests ---------------------------------------------------------------------------------------


def container_memory(container: Mapping[str, Any]) -> dict[str, int]:
    """``getRequestedResources``: the container's memory and hugepages requests in bytes."""
    result: dict[str, int] = {}
    for name, raw in container_requests(container).items():
        if not is_memory_resource(name):
            continue
        value = parse_quantity(raw, f"container {container.get('name')!r} requests.{name}")
        if value.denominator != 1:
            raise MemoryManagerError("failed to represent quantity as int64")
        result[name] = int(value)
    return result


def pod_memory(pod: Mapping[str, Any]) -> dict[str, int]:
    """``getPodRequestedResources``: per type the larger of the long-running sum and the init peak
    (with the sidecars before it), for the types the app containers request."""
    init_peak: dict[str, int] = {}
    sidecars: dict[str, int] = {}
    apps: dict[str, int] = {}
    for container, is_init in pod_containers(pod):
        for name, size in container_memory(container).items():
            if not is_init:
                apps[name] = apps.get(name, 0) + size
            elif is_restartable_init(container):
                sidecars[name] = sidecars.get(name, 0) + size
            else:
                init_peak[name] = max(init_peak.get(name, 0), sidecars.get(name, 0) + size)
    return {n: max(s + sidecars.get(n, 0), init_peak.get(n, 0)) for n, s in apps.items()}


def uses_pod_level_resources(pod: Mapping[str, Any]) -> bool:
    """``IsPodLevelResourcesSet``: ``spec.resources`` names cpu or memory (Static skips such pods)."""
    resources = (pod.get("spec") or {}).get("resources") or {}
    return any(
        name in ("cpu", "memory")
        for section in ("requests", "limits")
        for name in (resources.get(section) or {})
    )


# --- machine state ----------------------------------------------------------------------------------


@dataclass(slots=True)
class MemoryTable:
    """``state.MemoryTable``: one memory type on one NUMA node, in bytes."""

    total: int
    system_reserved: int
    allocatable: int
    free: int
    reserved: int = 0


@dataclass(slots=True)
class NumaMemoryState:
    """``state.NUMANodeState``: the node's memory types, its group and how many blocks use it."""

    tables: dict[str, MemoryTable]
    cells: tuple[int, ...]
    assignments: int = 0


@dataclass(frozen=True, slots=True)
class MemoryBlock:
    """``state.Block``: memory of one type pinned to a NUMA mask."""

    numa: tuple[int, ...]
    resource: str
    size: int


def default_machine_state(
    nodes: Sequence[NodeMemory], system_reserved: Mapping[int, Mapping[str, int]]
) -> dict[int, NumaMemoryState]:
    """``getDefaultMachineState``: allocatable = capacity - reserved; regular memory also loses the
    node's hugepages."""
    state: dict[int, NumaMemoryState] = {}
    for node in nodes:
        reserved = system_reserved.get(node.numa, {})
        tables: dict[str, MemoryTable] = {}
        in_hugepages = 0
        for page_size, pages in node.hugepages:
            name = hugepages_resource(page_size)
            total = page_size * pages
            allocatable = total - reserved.get(name, 0)
            tables[name] = MemoryTable(total, reserved.get(name, 0), allocatable, allocatable)
            in_hugepages += total
        allocatable = node.memory - reserved.get(MEMORY, 0) - in_hugepages
        tables[MEMORY] = MemoryTable(node.memory, reserved.get(MEMORY, 0), allocatable, allocatable)
        state[node.numa] = NumaMemoryState(tables, (node.numa,))
    return state


def _mask_key(mask: Iterable[int]) -> tuple[int, ...]:
    return tuple(sorted(mask))


def _preferred_first(hints: Sequence[TopologyHint]) -> TopologyHint:
    """``findBestHint``: preferred over not, then the narrower mask; the first of equals."""
    best = hints[0]
    for hint in hints[1:]:
        if (hint.preferred and not best.preferred) or (
            hint.preferred == best.preferred
            and is_narrower(hint.affinity or frozenset(), best.affinity or frozenset())
        ):
            best = hint
    return best


@dataclass
class StaticMemoryPolicy:
    """The Static policy's state (``memory_manager_state``) and its hints and allocations."""

    machine: dict[int, NumaMemoryState]
    #: uid → container → blocks.
    assignments: dict[str, dict[str, list[MemoryBlock]]] = field(default_factory=dict)
    #: ``initContainersReusableMemory``: uid → NUMA mask → type → bytes an init container left.
    reusable: dict[str, dict[tuple[int, ...], dict[str, int]]] = field(default_factory=dict)

    @classmethod
    def create(
        cls, nodes: Sequence[NodeMemory], system_reserved: Mapping[int, Mapping[str, int]]
    ) -> StaticMemoryPolicy:
        """``NewPolicyStatic`` + ``Start`` on an empty state; kubelet's error without reserved memory."""
        if sum(r.get(MEMORY, 0) for r in system_reserved.values()) <= 0:
            raise InvalidInput("[memorymanager] you should specify the system reserved memory")
        return cls(default_machine_state(nodes, system_reserved))

    # -- hints ---------------------------------------------------------------------------------

    def _reusable(self, uid: str, mask: Iterable[int], resource: str) -> int:
        return self.reusable.get(uid, {}).get(_mask_key(mask), {}).get(resource, 0)

    def _respects_groups(self, mask: NumaMask) -> bool:
        bits = _mask_key(mask)
        if len(bits) == 1:
            return len(self.machine[bits[0]].cells) <= 1
        for node in bits:
            state = self.machine[node]
            if state.assignments > 0 and (len(state.cells) == 1 or _mask_key(state.cells) != bits):
                return False
        return True

    def calculate_hints(self, uid: str, requested: Mapping[str, int]) -> MemoryHints:
        """``calculateHints``: feasible by free memory, preferred by allocatable memory."""
        numa_ids = sorted(self.machine)
        min_size = len(numa_ids)
        found: list[NumaMask] = []
        for mask in iterate_masks(numa_ids):

            def total(attr: str, resource: str, mask: NumaMask = mask) -> int:
                tables = (self.machine[n].tables.get(resource) for n in mask)
                return sum(getattr(t, attr) for t in tables if t is not None)

            if any(total("allocatable", r) < size for r, size in requested.items()):
                continue
            min_size = min(min_size, len(mask))
            if not self._respects_groups(mask):
                continue
            if any(total("free", r) + self._reusable(uid, mask, r) < size for r, size in requested.items()):
                continue
            found.append(mask)
        if not found:
            return {}
        return {r: [TopologyHint(m, len(m) == min_size) for m in found] for r in requested}

    def _regenerate(self, blocks: Sequence[MemoryBlock], requested: Mapping[str, int]) -> MemoryHints | None:
        """``regenerateHints``: the held blocks' masks, or None when they differ from the request."""
        if len(blocks) != len(requested):
            return None
        hints: MemoryHints = {r: [] for r in requested}
        for block in blocks:
            if requested.get(block.resource) != block.size:
                return None
            hints[block.resource].append(TopologyHint(frozenset(block.numa), True))
        return hints

    def container_hints(
        self, pod: Mapping[str, Any], uid: str, container: Mapping[str, Any]
    ) -> MemoryHints | None:
        """``GetTopologyHints`` for one container (None: no preference)."""
        if pod_qos_class(pod) != "Guaranteed" or uses_pod_level_resources(pod):
            return None
        requested = container_memory(container)
        blocks = self.assignments.get(uid, {}).get(str(container.get("name") or ""))
        if blocks is not None:
            return self._regenerate(blocks, requested)
        return self.calculate_hints(uid, requested)

    def pod_hints(self, pod: Mapping[str, Any], uid: str) -> MemoryHints | None:
        """``GetPodTopologyHints``: one hint set for the pod's accumulated request."""
        if pod_qos_class(pod) != "Guaranteed" or uses_pod_level_resources(pod):
            return None
        requested = pod_memory(pod)
        held = self.assignments.get(uid, {})
        for container, _init in pod_containers(pod):
            blocks = held.get(str(container.get("name") or ""))
            if blocks is not None:
                return self._regenerate(blocks, requested)
        return self.calculate_hints("", requested)

    # -- allocation ----------------------------------------------------------------------------

    def _satisfies(self, mask: NumaMask, requested: Mapping[str, int]) -> bool:
        return all(
            sum(self.machine[n].tables[r].free for n in mask if r in self.machine[n].tables) >= size
            for r, size in requested.items()
        )

    def _best_hint(self, uid: str, hint: TopologyHint, requested: Mapping[str, int]) -> TopologyHint:
        """The hint ``Allocate`` pins to: the default one for a nil affinity, extended when short."""
        best = hint
        if hint.affinity is None:
            hints = self.calculate_hints(uid, requested)
            if not hints:
                raise MemoryManagerError(
                    "failed to get the default NUMA affinity, no NUMA nodes with enough memory is available"
                )
            if MEMORY not in hints:  # kubelet judges by regular memory only (a pod without it: no hint)
                raise MemoryManagerError("failed to find the default preferred hint")
            default = _preferred_first(hints[MEMORY])
            if not default.preferred and hint.preferred:
                raise MemoryManagerError("failed to find the default preferred hint")
            best = default
        assert best.affinity is not None
        if not self._satisfies(best.affinity, requested):
            mask = best.affinity
            candidates = [
                h
                for h in self.calculate_hints(uid, requested).get(MEMORY, [])
                if mask <= (h.affinity or frozenset())
            ]
            if not candidates:
                raise MemoryManagerError("failed to find NUMA nodes to extend the current topology hint")
            extended = _preferred_first(candidates)
            if not extended.preferred and best.preferred:
                raise MemoryManagerError("failed to find the extended preferred hint")
            best = extended
        assert best.affinity is not None
        if not self._respects_groups(best.affinity) and len(best.affinity) > 1:
            raise MemoryManagerError("preferred hint violates NUMA node allocation")
        return best

    def _take(self, bits: tuple[int, ...], resource: str, size: int) -> None:
        """``updateMachineState``: count the block on every node of the mask, fill them in id order."""
        for node in bits:
            state = self.machine[node]
            state.assignments += 1
            state.cells = bits
            table = state.tables.get(resource)
            if size == 0 or table is None or table.free <= 0:
                continue
            used = min(size, table.free)
            table.free -= used
            table.reserved += used
            size -= used

    def allocate(
        self, pod: Mapping[str, Any], uid: str, container: Mapping[str, Any], hint: TopologyHint
    ) -> None:
        """``Allocate``: pin the container's memory to ``hint`` (the Topology Manager's affinity)."""
        if pod_qos_class(pod) != "Guaranteed" or uses_pod_level_resources(pod):
            return
        name = str(container.get("name") or "")
        self.reusable = {u: v for u, v in self.reusable.items() if u == uid}
        held = self.assignments.get(uid, {}).get(name)
        if held is not None:
            self._update_reusable(uid, container, held, pod)
            return
        requested = container_memory(container)
        best = self._best_hint(uid, hint, requested)
        assert best.affinity is not None
        bits = _mask_key(best.affinity)
        blocks = []
        for resource, size in requested.items():
            blocks.append(MemoryBlock(bits, resource, size))
            self._take(bits, resource, max(0, size - self._reusable(uid, bits, resource)))
        self._update_reusable(uid, container, blocks, pod)
        self.assignments.setdefault(uid, {})[name] = blocks
        self._shrink_init_blocks(pod, uid, name, blocks)

    def _update_reusable(
        self, uid: str, container: Mapping[str, Any], blocks: Sequence[MemoryBlock], pod: Mapping[str, Any]
    ) -> None:
        """``updatePodReusableMemory``: a regular init container leaves its blocks reusable; any other
        container uses them up."""
        name = container.get("name")
        regular_init = any(
            c.get("name") == name and not is_restartable_init(c)
            for c, is_init in pod_containers(pod)
            if is_init
        )
        pod_reusable = self.reusable.setdefault(uid, {})
        for block in blocks:
            per_type = pod_reusable.setdefault(block.numa, {})
            if regular_init:
                per_type[block.resource] = max(per_type.get(block.resource, 0), block.size)
            elif per_type.get(block.resource, 0):
                per_type[block.resource] = max(0, per_type[block.resource] - block.size)

    def _shrink_init_blocks(
        self, pod: Mapping[str, Any], uid: str, name: str, blocks: Sequence[MemoryBlock]
    ) -> None:
        """``updateInitContainersMemoryBlocks``: the earlier regular init containers' blocks shrink by
        what this container reused, so the pod's blocks add up to what it holds."""
        held = self.assignments.get(uid, {})
        for block in blocks:
            left = block.size
            for init, is_init in pod_containers(pod):
                init_name = str(init.get("name") or "")
                if not is_init or init_name == name or left == 0:
                    break
                if is_restartable_init(init) or not held.get(init_name):
                    continue
                updated = []
                for b in held[init_name]:
                    if b.size and b.resource == block.resource and b.numa == block.numa:
                        used = min(b.size, left)
                        left -= used
                        b = MemoryBlock(b.numa, b.resource, b.size - used)
                    updated.append(b)
                held[init_name] = updated

    def remove_container(self, uid: str, name: str) -> None:
        """``RemoveContainer``: give the blocks back, node by node, and dissolve empty groups."""
        blocks = self.assignments.get(uid, {}).pop(name, None)
        if blocks is None:
            return
        if not self.assignments.get(uid):
            self.assignments.pop(uid, None)
        for block in blocks:
            size = block.size
            for node in block.numa:
                state = self.machine[node]
                state.assignments -= 1
                if state.assignments == 0:
                    state.cells = (node,)
                table = state.tables.get(block.resource)
                if size == 0 or table is None or table.reserved == 0:
                    continue
                freed = min(size, table.reserved)
                table.reserved -= freed
                table.free += freed
                size -= freed

    def release(self, uid: str) -> bool:
        """Remove every container of the pod; True if it held any memory."""
        names = list(self.assignments.get(uid, {}))
        for name in names:
            self.remove_container(uid, name)
        self.reusable.pop(uid, None)
        return bool(names)

    def restore(self, uid: str, name: str, blocks: Mapping[str, tuple[tuple[int, ...], int]]) -> None:
        """Take back a checkpointed container's blocks (as kubelet's ``validateState`` recounts them)."""
        restored = [MemoryBlock(tuple(sorted(numa)), r, size) for r, (numa, size) in sorted(blocks.items())]
        unknown = {n for b in restored for n in b.numa} - set(self.machine)
        if unknown:
            raise InvalidInput(
                f"[memorymanager] the memory assignment uses NUMA nodes {sorted(unknown)} that do not exist"
            )
        for block in restored:
            self._take(block.numa, block.resource, block.size)
        self.assignments.setdefault(uid, {})[name] = restored

    def allocatable(self) -> list[tuple[int, str, int]]:
        """``GetAllocatableMemory``: (NUMA node, type, bytes) for every non-zero allocatable amount."""
        return [
            (n, r, t.allocatable)
            for n, state in sorted(self.machine.items())
            for r, t in sorted(state.tables.items())
            if t.allocatable
        ]

    def numa_nodes(self, uid: str, name: str) -> tuple[int, ...]:
        """``GetMemoryNUMANodes``: the NUMA nodes of the container's blocks."""
        return tuple(sorted({n for b in self.assignments.get(uid, {}).get(name, []) for n in b.numa}))


def eviction_memory(value: Any, capacity: int, source: str) -> int:
    """``evictionHard``'s ``memory.available`` in bytes (kubelet's 100Mi default when the map is unset)."""
    if value is None:
        return DEFAULT_EVICTION_MEMORY
    if not isinstance(value, Mapping):
        raise InvalidInput(f"{source}: evictionHard must map signals to thresholds")
    raw = value.get("memory.available")
    if raw is None:
        return 0
    text = str(raw)
    if text.endswith("%"):
        try:
            percent = Fraction(text[:-1])
        except ValueError:
            raise InvalidInput(
                f"{source}: evictionHard memory.available {text!r} is not a percentage"
            ) from None
        return int(capacity * percent / 100)
    return quantity_value(text, f"{source}: evictionHard.memory.available")
