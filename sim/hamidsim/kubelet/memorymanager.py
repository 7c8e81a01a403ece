"""kubelet's memory manager (``pkg/kubelet/cm/memorymanager``): the ``None`` policy is modelled (no
memory hints, no pinning); ``Static`` is refused with a clear message, since its memory and hugepages
hints would take part in the Topology Manager's merge and the simulator does not compute them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hamid.model.errors import InvalidInput
from hamidsim.kubelet.quantity import quantity_value

MEMORY_POLICY_NONE = "None"
MEMORY_POLICY_STATIC = "Static"
MEMORY_POLICIES = (MEMORY_POLICY_NONE, MEMORY_POLICY_STATIC)


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


def check_memory_manager(policy: str, reserved: Sequence[MemoryReservation]) -> None:
    """Refuse what the simulator cannot honour, with kubelet's reason where kubelet has one."""
    if policy not in MEMORY_POLICIES:
        raise InvalidInput(f'unknown policy: "{policy}"')
    if policy == MEMORY_POLICY_STATIC:
        raise InvalidInput(
            "memoryManagerPolicy Static is not modelled by the simulated kubelet: its memory and hugepages "
            "hints would change the Topology Manager's merge; use None (reservedMemory is then ignored)"
        )
