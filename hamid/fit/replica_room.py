"""Which GPU replicas kubelet sees: hamid's plugin hides some free replicas from it.

kubelet counts device *replicas*, not the GPU room behind them: for an aligned pod the Topology
Manager takes the lowest NUMA node with free CPUs and free replicas, even when no GPU there can
take the pod. Where its NUMA profile says so (``hideReplicas``), hamid's plugin reports some free
replicas as Unhealthy, by one of three rules:

* ``full``: those of a GPU with no room (booked cores or memory at capacity);
* ``busy``: those too of every partly booked GPU while the node has an idle one (healthy, nothing
  booked), so an aligned pod's CPUs go to a NUMA node with an idle GPU whenever the node has one
  (most aligned pods ask whole GPUs); once no GPU is idle, partly booked GPUs with room are offered
  again and shares still fit;
* ``span``: as ``busy``, and while nothing is booked on the node each GPU *lists* one free replica
  (or as many as pending bookings need), the others left out of the list: kubelet sizes its NUMA
  hints by every listed device, healthy or not, so a pod asking more GPUs than one NUMA node has
  (and CPUs that need more than one) then gets a preferred spanning hint under ``restricted``;
* ``steer``: as ``span``, and while the pod the node lock names waits for kubelet's admission
  every free replica on the NUMA nodes its booked GPUs are not on is hidden: kubelet's device hint
  is then the NUMA node of the GPUs the scheduler chose, so the pod's exclusive CPUs follow them
  instead of going to the lowest NUMA node with CPUs and replicas (the plugin confirms the list
  before the bind; docs/operating.md). Each side judges it on its own inputs: the scheduler on the
  booking it predicts (``keep``), the plugin on the lock holder's.

Replicas a container holds, or a pending booking needs, stay Healthy (the plugin's side). The
scheduler's predictor and ``fgd`` count only the replicas kubelet can see. This module is the one
definition of the rule both sides apply, each on the bookings it already uses; pure, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping

from hamid.fit.usage import DeviceUsage, NodeUsage
from hamid.model.devices import MODE_MIG
from hamid.model.numa import (
    HIDE_BUSY,
    HIDE_BUSY_STEER,
    HIDE_STEER,
    NO_TOPOLOGY,
    SPANNING_RULES,
    STEERED_WITHOUT_SPAN,
    STEERING_RULES,
)


def effective_rule(rule: str | None, topology_policy: str | None) -> str | None:
    """The rule a node's plugin applies: ``span`` leaves replicas out of the list only under Topology
    Manager ``restricted``, the one policy a preferred spanning hint helps (under ``single-numa-node``
    it could only reject pods, under ``best-effort`` and ``none`` it changes nothing); elsewhere it
    is ``busy``. ``steer`` still steers under ``single-numa-node`` and ``best-effort``, whose merged
    hint follows the device hint too (``busy+steer``), and under ``none`` is ``busy``. Both sides
    read the policy from the node's NUMA profile."""
    if rule == HIDE_STEER and topology_policy in STEERED_WITHOUT_SPAN:
        return HIDE_BUSY_STEER
    if rule in SPANNING_RULES and topology_policy != "restricted":
        return HIDE_BUSY
    return rule


def no_room(usedmem: int, totalmem: int, usedcores: int, totalcore: int) -> bool:
    """Whether a GPU's booked memory or cores reach its registered capacity (a capacity of 0
    is not a limit: such a GPU registers nothing on that axis)."""
    return 0 < totalmem <= usedmem or 0 < totalcore <= usedcores


def is_idle(used: int, usedmem: int, usedcores: int) -> bool:
    """Whether a GPU has no booking at all (no replica, memory or cores booked)."""
    return used == 0 and usedmem == 0 and usedcores == 0


def hides(rule: str | None, *, room: bool, idle: bool, idle_on_node: bool) -> bool:
    """Whether a healthy GPU's free replicas are hidden under ``rule`` (None: nothing hidden):
    ``room``: it has room left; ``idle``: nothing booked on it; ``idle_on_node``: some healthy
    GPU of the node has nothing booked."""
    if rule is None:
        return False
    if not room:
        return True
    return rule in (HIDE_BUSY, *SPANNING_RULES, *STEERING_RULES) and not idle and idle_on_node


def _takes_part(d: DeviceUsage) -> bool:
    """A healthy GPU not in MIG mode (MIG nodes never take part; unhealthy GPUs offer nothing)."""
    return d.health and d.mode != MODE_MIG


def idle_on_node(usage: NodeUsage) -> bool:
    """Whether some healthy GPU of the node has nothing booked."""
    return any(_takes_part(d) and is_idle(d.used, d.usedmem, d.usedcores) for d in usage.devices)


def hides_free_replicas(d: DeviceUsage, rule: str | None, idle_elsewhere: bool) -> bool:
    """Whether the plugin hides this GPU's free replicas (``idle_elsewhere``: :func:`idle_on_node`)."""
    return _takes_part(d) and hides(
        rule,
        room=not no_room(d.usedmem, d.totalmem, d.usedcores, d.totalcore),
        idle=is_idle(d.used, d.usedmem, d.usedcores),
        idle_on_node=idle_elsewhere,
    )


def hidden_by_gpu(
    usage: NodeUsage, rule: str | None, keep: Mapping[str, int] | None = None
) -> dict[str, int]:
    """Free replicas kubelet cannot see per GPU ID on a node whose plugin hides them by ``rule``
    (a GPU's free replicas are its count less its bookings and those left out of the list;
    ``keep``: per GPU ID, the replicas a pending booking still needs, which the plugin keeps
    Healthy; under ``steer`` every free replica on the other NUMA nodes is hidden too)."""
    out: dict[str, int] = {}
    if rule is None:
        return out
    keep = keep or {}
    idle = idle_on_node(usage)
    steered = steered_numa(usage, rule, keep)
    omitted = omitted_by_gpu(usage, rule, keep) if steered is not None else {}
    for d in usage.devices:
        if hides_free_replicas(d, rule, idle) or (
            steered is not None and _takes_part(d) and d.numa not in steered
        ):
            hidden = d.count - d.used - keep.get(d.id, 0) - omitted.get(d.id, 0)
            if hidden > 0:
                out[d.id] = hidden
    return out


def steered_numa(usage: NodeUsage, rule: str | None, keep: Mapping[str, int]) -> frozenset[int] | None:
    """Under ``steer``, the NUMA nodes of the GPUs a pending booking needs, whose replicas alone
    kubelet sees free while it admits the pod (None: nothing steered)."""
    if rule not in STEERING_RULES:
        return None
    numa = frozenset(d.numa for d in usage.devices if keep.get(d.id, 0) > 0)
    return numa or None


def hidden_replicas(
    usage: NodeUsage, rule: str | None, keep: Mapping[str, int] | None = None
) -> dict[int, int]:
    """:func:`hidden_by_gpu` summed per NUMA bucket."""
    return _per_numa(usage, hidden_by_gpu(usage, rule, keep))


def _per_numa(usage: NodeUsage, by_gpu: Mapping[str, int]) -> dict[int, int]:
    """Replica counts per GPU ID summed per NUMA bucket of the GPUs."""
    numa = {d.id: d.numa if d.numa >= 0 else NO_TOPOLOGY for d in usage.devices}
    out: dict[int, int] = {}
    for gpu, n in by_gpu.items():
        out[numa[gpu]] = out.get(numa[gpu], 0) + n
    return out


def lists_one_per_gpu(rule: str | None, usage: NodeUsage) -> bool:
    """Whether the plugin lists one free replica per GPU: rule ``span`` (or ``steer``) on a node with
    nothing booked."""
    return rule in SPANNING_RULES and all(
        is_idle(d.used, d.usedmem, d.usedcores) for d in usage.devices if _takes_part(d)
    )


def omitted_by_gpu(
    usage: NodeUsage, rule: str | None, keep: Mapping[str, int] | None = None
) -> dict[str, int]:
    """Free replicas per GPU ID the plugin leaves out of its list (kubelet does not count them at
    all): under ``span`` or ``steer`` on a node with nothing booked, all but one per GPU (or as
    many as pending bookings need)."""
    if not lists_one_per_gpu(rule, usage):
        return {}
    out: dict[str, int] = {}
    for d in usage.devices:
        if _takes_part(d):
            n = max(d.count - max((keep or {}).get(d.id, 0), 1), 0)
            if n:
                out[d.id] = n
    return out


def omitted_replicas(
    usage: NodeUsage, rule: str | None, keep: Mapping[str, int] | None = None
) -> dict[int, int]:
    """:func:`omitted_by_gpu` summed per NUMA bucket."""
    return _per_numa(usage, omitted_by_gpu(usage, rule, keep))
