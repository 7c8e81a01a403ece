"""kubelet's Static memory manager for the predictor (``pkg/kubelet/cm/memorymanager/policy_static.go``).

A node's memory state — per NUMA node and memory type the allocatable and free bytes, the node's
group (the NUMA nodes it was last pinned together with) and how many blocks use it — and what
kubelet computes from it: the hints (every NUMA mask whose *free* memory covers the request and
that respects the groups; preferred when its size is the smallest whose *allocatable* memory
covers the request, as if the node were empty) and the mask ``Allocate`` pins to (the Topology
Manager's, its own default one for a nil affinity, extended when short; refused when it would break
a group). Written from kubelet's source and tests; it shares no code with the simulator, which
judges it. Masks are ints (bit n = NUMA node n), as in :mod:`hamid.fit.numa_predict`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from fractions import Fraction

from hamid.model.errors import InvalidInput
from hamid.model.numa import MemoryBlock, NumaProfile

MEMORY = "memory"
HUGEPAGES_PREFIX = "hugepages-"

#: A hint as the memory manager gives it: (mask, preferred).
MemoryHint = tuple[int, bool]
#: Init-container memory a pod may reuse: NUMA mask → memory type → bytes.
Reusable = dict[int, dict[str, int]]


class MemoryPinError(Exception):
    """An ``Allocate`` error of the Static policy (kubelet reports it as ``UnexpectedAdmissionError``)."""

    def __init__(self, text: str) -> None:
        super().__init__(f"[memorymanager] {text}")


def is_memory_type(name: str) -> bool:
    """``memory`` or ``hugepages-<size>``: the resources the memory manager pins."""
    return name == MEMORY or name.startswith(HUGEPAGES_PREFIX)


def memory_requests(requests: Mapping[str, Fraction]) -> dict[str, int]:
    """``getRequestedResources``: bytes per memory type; a fractional byte count is kubelet's error."""
    out: dict[str, int] = {}
    for name, value in requests.items():
        if is_memory_type(name):
            if value.denominator != 1:
                raise MemoryPinError("failed to represent quantity as int64")
            out[name] = int(value)
    return out


def _bits(mask: int) -> list[int]:
    return [n for n in range(mask.bit_length()) if mask >> n & 1]


class MemoryLedger:
    """The Static memory manager's machine state of one node, kept like kubelet keeps it."""

    __slots__ = ("_blocks", "_cells", "_free", "_masks", "allocatable")

    def __init__(self, allocatable: Mapping[int, Mapping[str, int]]) -> None:
        #: Allocatable bytes per NUMA node and type (immutable, shared by copies).
        self.allocatable = {n: dict(types) for n, types in allocatable.items()}
        self._free = {n: dict(types) for n, types in allocatable.items()}
        self._cells = {n: 1 << n for n in allocatable}
        self._blocks = dict.fromkeys(allocatable, 0)
        #: Blocks booked per mask: what :meth:`release` checks a block against (kubelet's state
        #: keeps no such count; a node's group alone cannot tell, as it follows the last block).
        self._masks: dict[int, int] = {}

    @classmethod
    def for_profile(cls, profile: NumaProfile) -> MemoryLedger | None:
        """An empty node's memory state, or None when the profile carries no memory."""
        return None if profile.memory is None else cls(profile.memory_allocatable())

    def copy(self) -> MemoryLedger:
        """An independent copy."""
        other = MemoryLedger.__new__(MemoryLedger)
        other.allocatable = self.allocatable
        other._free = {n: dict(types) for n, types in self._free.items()}
        other._cells, other._blocks = dict(self._cells), dict(self._blocks)
        other._masks = dict(self._masks)
        return other

    def state_key(self) -> tuple[object, ...]:
        """The state as a hashable value (part of the scheduler's prediction memo key)."""
        return tuple(
            (n, tuple(sorted(self._free[n].items())), self._cells[n], self._blocks[n])
            for n in sorted(self._free)
        )

    def free(self, mask: int, name: str) -> int:
        """Free bytes of one type over the NUMA nodes of ``mask``."""
        return sum(self._free[n].get(name, 0) for n in _bits(mask))

    def total(self, mask: int, name: str) -> int:
        """Allocatable bytes of one type over the NUMA nodes of ``mask``."""
        return sum(self.allocatable[n].get(name, 0) for n in _bits(mask))

    def respects_groups(self, mask: int) -> bool:
        """A single node outside any group, or a multi-node mask equal to the group of each used node
        (``calculateHints``' group checks; ``isAffinityViolatingNUMAAllocations`` for multi-node)."""
        bits = _bits(mask)
        if len(bits) == 1:
            return self._cells[bits[0]].bit_count() <= 1
        return all(self._blocks[n] == 0 or self._cells[n] == mask for n in bits)

    # -- booking -------------------------------------------------------------------------

    def _check(self, blocks: Iterable[MemoryBlock]) -> list[tuple[int, MemoryBlock]]:
        out = []
        for b in blocks:
            unknown = b.numa - self._free.keys()
            if unknown or not b.numa:
                raise InvalidInput(f"ledger: memory on unknown NUMA node(s) {sorted(unknown)}")
            out.append((sum(1 << n for n in b.numa), b))
        return out

    def apply(self, blocks: Sequence[MemoryBlock]) -> None:
        """Book blocks as ``updateMachineState`` does (nodes filled in id order); InvalidInput and
        no change when a mask has too little free memory."""
        checked = self._check(blocks)
        need: dict[tuple[int, str], int] = {}
        for mask, b in checked:
            need[mask, b.resource] = need.get((mask, b.resource), 0) + b.size
        for (mask, name), size in need.items():
            if self.free(mask, name) < size:
                raise InvalidInput(f"ledger: {size} bytes of {name} on NUMA {_bits(mask)} are not free")
        for mask, b in checked:
            self._take(mask, b.resource, b.size)

    def fitting(self, blocks: Sequence[MemoryBlock]) -> tuple[MemoryBlock, ...]:
        """``blocks`` shrunk, in order, to the bytes free now (one on a NUMA node the state does not
        have left out): what :meth:`apply` then books without refusing."""
        scratch = self.copy()
        out = []
        for b in blocks:
            try:
                ((mask, _block),) = scratch._check((b,))
            except InvalidInput:
                continue
            fit = MemoryBlock(b.numa, b.resource, min(b.size, scratch.free(mask, b.resource)))
            scratch.apply((fit,))
            out.append(fit)
        return tuple(out)

    def _take(self, mask: int, name: str, size: int) -> None:
        self._masks[mask] = self._masks.get(mask, 0) + 1
        for n in _bits(mask):
            self._blocks[n] += 1
            self._cells[n] = mask
            free = self._free[n].get(name, 0)
            used = min(size, free)
            if used:
                self._free[n][name] = free - used
                size -= used

    def release(self, blocks: Sequence[MemoryBlock]) -> None:
        """Return blocks as ``RemoveContainer`` does; InvalidInput and no change if not booked.

        A node's group stays as it is until its last block goes, as in kubelet, whatever blocks
        were pinned on it after this one: a pod's blocks can be released in any order (a check
        of the group refused a multi-node block once a single-node one was pinned on one of its
        nodes, and the scheduler's ledger raised half-way through an event)."""
        checked = self._check(blocks)
        wanted: dict[int, int] = {}
        for mask, b in checked:
            wanted[mask] = wanted.get(mask, 0) + 1
            held = self.total(mask, b.resource) - self.free(mask, b.resource)
            if held < b.size or self._masks.get(mask, 0) < wanted[mask]:
                raise InvalidInput(
                    f"ledger: {b.size} bytes of {b.resource} on NUMA {_bits(mask)} are not in use"
                )
        for mask, b in checked:
            self._masks[mask] -= 1
            if not self._masks[mask]:
                del self._masks[mask]
            size = b.size
            for n in _bits(mask):
                self._blocks[n] -= 1
                if self._blocks[n] == 0:
                    self._cells[n] = 1 << n
                held = self.allocatable[n].get(b.resource, 0) - self._free[n].get(b.resource, 0)
                back = min(size, held)
                if back:
                    self._free[n][b.resource] = self._free[n].get(b.resource, 0) + back
                    size -= back

    # -- kubelet's computations --------------------------------------------------------------

    def hints(
        self, masks: Iterable[int], requested: Mapping[str, int], reusable: Reusable
    ) -> dict[str, list[MemoryHint]]:
        """``calculateHints``: ``{}`` when no mask fits (kubelet's "no preference")."""
        min_size: int | None = None
        found: list[int] = []
        for mask in masks:
            if any(self.total(mask, r) < size for r, size in requested.items()):
                continue
            if min_size is None or mask.bit_count() < min_size:
                min_size = mask.bit_count()
            if not self.respects_groups(mask):
                continue
            again = reusable.get(mask, {})
            if any(self.free(mask, r) + again.get(r, 0) < size for r, size in requested.items()):
                continue
            found.append(mask)
        if not found:
            return {}
        return {r: [(m, m.bit_count() == min_size) for m in found] for r in requested}

    def pin_mask(
        self,
        masks: Sequence[int],
        requested: Mapping[str, int],
        reusable: Reusable,
        hint: MemoryHint | None,
        narrower: Callable[[int, int], bool],
    ) -> int:
        """The mask ``Allocate`` pins to for the Topology Manager's ``hint`` ((mask, preferred);
        None for a nil affinity, a (0, preferred) marks a nil preferred one); MemoryPinError."""
        mask, preferred = hint if hint is not None else (0, False)
        if mask == 0:
            hints = self.hints(masks, requested, reusable)
            if not hints:
                raise MemoryPinError(
                    "failed to get the default NUMA affinity, no NUMA nodes with enough memory is available"
                )
            default = _best(hints.get(MEMORY, []), narrower)
            if default is None or (not default[1] and preferred):
                raise MemoryPinError("failed to find the default preferred hint")
            mask, preferred = default
        if any(self.free(mask, r) < size for r, size in requested.items()):
            wider = [h for h in self.hints(masks, requested, reusable).get(MEMORY, []) if h[0] & mask == mask]
            extended = _best(wider, narrower)
            if extended is None:
                raise MemoryPinError("failed to find NUMA nodes to extend the current topology hint")
            if not extended[1] and preferred:
                raise MemoryPinError("failed to find the extended preferred hint")
            mask = extended[0]
        if mask.bit_count() > 1 and not self.respects_groups(mask):
            raise MemoryPinError("preferred hint violates NUMA node allocation")
        return mask

    def pin(self, mask: int, requested: Mapping[str, int], reusable: Reusable) -> tuple[MemoryBlock, ...]:
        """Take the request on ``mask`` (minus what the pod's init containers left there); the
        blocks hold what was newly taken, so a pod's blocks add up to what it holds."""
        nodes = frozenset(_bits(mask))
        blocks = []
        for name, size in sorted(requested.items()):
            taken = max(0, size - reusable.get(mask, {}).get(name, 0))
            self._take(mask, name, taken)
            blocks.append(MemoryBlock(nodes, name, taken))
        return tuple(blocks)


def _best(hints: Sequence[MemoryHint], narrower: Callable[[int, int], bool]) -> MemoryHint | None:
    """``findBestHint``: preferred first, then the narrower mask; the first of equals."""
    best: MemoryHint | None = None
    for hint in hints:
        if best is None or (hint[1] and not best[1]) or (hint[1] == best[1] and narrower(hint[0], best[0])):
            best = hint
    return best


def update_reusable(reusable: Reusable, mask: int, requested: Mapping[str, int], init: bool) -> None:
    """``updatePodReusableMemory``: a regular init container leaves its request reusable on its mask
    (the largest one); any other container uses it up."""
    per_type = reusable.setdefault(mask, {})
    for name, size in requested.items():
        if init:
            per_type[name] = max(per_type.get(name, 0), size)
        elif per_type.get(name):
            per_type[name] = max(0, per_type[name] - size)
