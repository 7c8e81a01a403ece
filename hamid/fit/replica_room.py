"""Which GPU replicas kubelet sees: hamid's plugin hides the free replicas of a GPU with no room.

kubelet counts device *replicas*, not the GPU room behind them: a GPU whose cores or memory are
fully booked still offers its free replicas, so for an aligned pod the Topology Manager takes the
lowest NUMA node with free CPUs and free replicas even when no GPU there has room. Where its NUMA
profile says so (``hidesFull``), hamid's plugin reports the free replicas of such a GPU as
Unhealthy while it has no room (replicas a container holds, or a pending booking needs, stay
Healthy), and the scheduler's predictor and ``fgd`` count only the replicas kubelet can see. This
module is the one definition of the rule both sides apply; pure, no I/O.
"""

from __future__ import annotations

from hamid.fit.usage import DeviceUsage, NodeUsage
from hamid.model.devices import MODE_MIG

#: The NUMA bucket of replicas without topology (as :data:`hamid.fit.numa_predict.NO_TOPOLOGY`).
_NO_TOPOLOGY = -1


def no_room(usedmem: int, totalmem: int, usedcores: int, totalcore: int) -> bool:
    """Whether a GPU's booked memory or cores reach its registered capacity (a capacity of 0
    is not a limit: such a GPU registers nothing on that axis)."""
    return 0 < totalmem <= usedmem or 0 < totalcore <= usedcores


def hides_free_replicas(d: DeviceUsage) -> bool:
    """Whether the plugin hides this GPU's free replicas (healthy, not MIG, no room left)."""
    return d.health and d.mode != MODE_MIG and no_room(d.usedmem, d.totalmem, d.usedcores, d.totalcore)


def hidden_replicas(usage: NodeUsage) -> dict[int, int]:
    """Free replicas per NUMA bucket that kubelet cannot see on a node whose plugin hides them
    (those of the GPUs without room; a GPU's free replicas are its count less its bookings)."""
    out: dict[int, int] = {}
    for d in usage.devices:
        if hides_free_replicas(d):
            free = max(d.count - d.used, 0)
            if free:
                bucket = d.numa if d.numa >= 0 else _NO_TOPOLOGY
                out[bucket] = out.get(bucket, 0) + free
    return out
