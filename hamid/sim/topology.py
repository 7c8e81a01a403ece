"""Kubelet's Topology Manager, device-manager hint generation and static CPU manager, as pure code.

Everything here reproduces ``pkg/kubelet/cm/{topologymanager,devicemanager,cpumanager}`` (see
``reference/kubelet-and-extender.md`` §2.5, §2.6, §3): the same hint sets, the same merge and the
same admission answer per policy, the same aligned / unaligned / no-affinity split of free devices
and the same CPU picks. Where Go iterates a map (arbitrary order), this code iterates in sorted order,
which is one of the orders Go may produce.

NUMA masks are ``frozenset[int]``; ``None`` is kubelet's nil mask ("any NUMA node").
Device topology is ``tuple[int, ...] | None``: ``None`` is an unset ``TopologyInfo``, ``()`` a set one
with no nodes (kubelet treats the two differently in one place, §2.5 "reusable" devices).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from hamid.model.errors import InvalidInput

# --- policies -----------------------------------------------------------------------------------

POLICY_NONE = "none"
POLICY_BEST_EFFORT = "best-effort"
POLICY_RESTRICTED = "restricted"
POLICY_SINGLE_NUMA_NODE = "single-numa-node"
TOPOLOGY_POLICIES = (POLICY_NONE, POLICY_BEST_EFFORT, POLICY_RESTRICTED, POLICY_SINGLE_NUMA_NODE)

CPU_POLICY_NONE = "none"
CPU_POLICY_STATIC = "static"
CPU_POLICIES = (CPU_POLICY_NONE, CPU_POLICY_STATIC)

#: kubelet's ``defaultMaxAllowableNUMANodes``: more NUMA nodes than this and the TM refuses to start.
MAX_ALLOWABLE_NUMA_NODES = 8
#: The fake NUMA node kubelet files devices without topology under (``nodeWithoutTopology``).
NODE_WITHOUT_TOPOLOGY = -1

NumaMask = frozenset[int]
DeviceTopology = tuple[int, ...] | None


@dataclass(frozen=True, slots=True)
class TopologyHint:
    """kubelet's ``TopologyHint``: a NUMA mask (None = any) and whether it is preferred."""

    affinity: NumaMask | None
    preferred: bool

    def describe(self) -> str:
        """``{0}✓``-style text for logs (``any`` for a nil mask)."""
        mask = "any" if self.affinity is None else "{" + ",".join(map(str, sorted(self.affinity))) + "}"
        return f"{mask}{'+' if self.preferred else '-'}"


# One provider's answer: None (no map at all) or resource → hints (None = don't care, [] = cannot).
ProviderHints = Mapping[str, list[TopologyHint] | None] | None


def mask_value(mask: Iterable[int]) -> int:
    """The mask as kubelet's uint64 bitmask (bit n = NUMA node n)."""
    return sum(1 << n for n in set(mask) if 0 <= n < 64)


def is_narrower(a: NumaMask, b: NumaMask) -> bool:
    """``bitmask.IsNarrowerThan``: fewer nodes, or as many nodes and numerically smaller."""
    if len(a) == len(b):
        return mask_value(a) < mask_value(b)
    return len(a) < len(b)


def iterate_masks(numa_nodes: Sequence[int]) -> Iterator[NumaMask]:
    """``bitmask.IterateBitMasks``: every non-empty subset, by size, in combination order."""
    nodes = list(numa_nodes)
    for size in range(1, len(nodes) + 1):
        for combo in itertools.combinations(nodes, size):
            yield frozenset(combo)


def check_numa_nodes(numa_nodes: Sequence[int], policy: str) -> None:
    """Refuse a policy other than ``none`` on more than 8 NUMA nodes, like kubelet does at start."""
    if policy not in TOPOLOGY_POLICIES:
        raise InvalidInput(f"unknown topology manager policy {policy!r}; choose one of {TOPOLOGY_POLICIES}")
    if policy != POLICY_NONE and len(numa_nodes) > MAX_ALLOWABLE_NUMA_NODES:
        raise InvalidInput(
            f"unsupported on machines with more than {MAX_ALLOWABLE_NUMA_NODES} NUMA Nodes "
            f"(this machine has {len(numa_nodes)})"
        )


# --- device manager hints (topology_hints.go) ---------------------------------------------------


def has_topology_alignment(all_devices: Mapping[str, DeviceTopology]) -> bool:
    """``deviceHasTopologyAlignment``: some device of the resource reports at least one NUMA node."""
    return any(topo for topo in all_devices.values())


def _any_set(mask: NumaMask, topology: DeviceTopology) -> bool:
    return bool(topology) and any(n in mask for n in topology or ())


def generate_device_hints(
    numa_nodes: Sequence[int],
    all_devices: Mapping[str, DeviceTopology],
    available: Iterable[str],
    reusable: Iterable[str],
    request: int,
) -> list[TopologyHint]:
    """``generateDeviceTopologyHints`` for one resource.

    ``all_devices`` is every device of the resource (healthy or not, allocated or not) with its
    topology; ``available`` the free healthy ones; ``reusable`` those released by this pod's init
    containers.
    """
    available_list = sorted(set(available))
    reusable_list = sorted(set(reusable))
    min_affinity_size = len(numa_nodes)
    found: list[NumaMask] = []
    for mask in iterate_masks(numa_nodes):
        devices_in_mask = sum(1 for topo in all_devices.values() if _any_set(mask, topo))
        if devices_in_mask >= request and len(mask) < min_affinity_size:
            min_affinity_size = len(mask)
        matching = 0
        disqualified = False
        for device in reusable_list:
            topo = all_devices.get(device)
            if topo is None:
                continue
            if not _any_set(mask, topo):
                disqualified = True
                break
            matching += 1
        if disqualified:
            continue
        matching += sum(1 for d in available_list if _any_set(mask, all_devices.get(d)))
        if matching >= request:
            found.append(mask)
    return [TopologyHint(mask, len(mask) == min_affinity_size) for mask in found]


def device_hints_for_resource(
    numa_nodes: Sequence[int],
    all_devices: Mapping[str, DeviceTopology],
    available: Iterable[str],
    reusable: Iterable[str],
    request: int,
    already_allocated: Iterable[str] = (),
) -> list[TopologyHint] | None:
    """``GetTopologyHints`` for one requested resource: None = no preference, [] = cannot satisfy."""
    if not has_topology_alignment(all_devices):
        return None
    allocated = set(already_allocated)
    if allocated:
        if len(allocated) != request:
            return []
        return generate_device_hints(numa_nodes, all_devices, allocated, (), request)
    available_set = set(available)
    reusable_set = set(reusable)
    if len(available_set | reusable_set) < request:
        return []
    return generate_device_hints(numa_nodes, all_devices, available_set, reusable_set, request)


# --- Topology Manager merge (policy.go, policy_*.go) ---------------------------------------------


def filter_providers_hints(providers_hints: Sequence[ProviderHints]) -> list[list[TopologyHint]]:
    """``filterProvidersHints``: normalise each provider's answer into one hint list per resource."""
    result: list[list[TopologyHint]] = []
    for hints in providers_hints:
        if not hints:
            result.append([TopologyHint(None, True)])
            continue
        for resource in sorted(hints):
            resource_hints = hints[resource]
            if resource_hints is None:
                result.append([TopologyHint(None, True)])
            elif not resource_hints:
                result.append([TopologyHint(None, False)])
            else:
                result.append(list(resource_hints))
    return result


def _narrowest_hint(hints: Sequence[TopologyHint]) -> TopologyHint | None:
    best: TopologyHint | None = None
    for hint in hints:
        if hint.affinity is None:
            continue
        if best is None or is_narrower(hint.affinity, best.affinity or frozenset()):
            best = hint
    return best


def _max_of_min_affinity_counts(filtered: Sequence[Sequence[TopologyHint]]) -> int:
    result = 0
    for hints in filtered:
        narrowest = _narrowest_hint(hints)
        if narrowest is not None and narrowest.affinity is not None:
            result = max(result, len(narrowest.affinity))
    return result


def _merge_permutation(default: NumaMask, permutation: Sequence[TopologyHint]) -> TopologyHint:
    preferred = True
    affinities: list[NumaMask] = []
    for hint in permutation:
        if hint.affinity is not None:
            affinities.append(hint.affinity)
            if hint.affinity != affinities[0]:
                preferred = False
        if not hint.preferred:
            preferred = False
    merged = default
    for affinity in affinities:
        merged = merged & affinity
    return TopologyHint(frozenset(merged), preferred)


class _HintMerger:
    def __init__(self, numa_nodes: Sequence[int], hints: list[list[TopologyHint]]) -> None:
        self.default = frozenset(numa_nodes)
        self.hints = hints
        self.best_non_preferred = _max_of_min_affinity_counts(hints)

    @staticmethod
    def _compare_masks(current: TopologyHint, candidate: TopologyHint) -> TopologyHint:
        cur, cand = current.affinity or frozenset(), candidate.affinity or frozenset()
        if cand == cur:
            return current
        return current if is_narrower(cur, cand) else candidate

    def _compare(self, current: TopologyHint | None, candidate: TopologyHint) -> TopologyHint | None:
        cand_count = len(candidate.affinity or ())
        if cand_count == 0:
            return current
        if current is None:
            return candidate
        if not current.preferred and candidate.preferred:
            return candidate
        if current.preferred and not candidate.preferred:
            return current
        if current.preferred and candidate.preferred:
            return self._compare_masks(current, candidate)
        cur_count = len(current.affinity or ())
        best = self.best_non_preferred
        if cur_count > best:
            if cand_count > cur_count:
                return current
            if cand_count == cur_count:
                return self._compare_masks(current, candidate)
            return candidate
        if cur_count == best:
            if cand_count != best:
                return current
            return self._compare_masks(current, candidate)
        if cand_count > best:
            return current
        if cand_count == best:
            return candidate
        if cand_count > cur_count:
            return candidate
        if cand_count == cur_count:
            return self._compare_masks(current, candidate)
        return current

    def merge(self) -> TopologyHint:
        best: TopologyHint | None = None
        for permutation in itertools.product(*self.hints):
            best = self._compare(best, _merge_permutation(self.default, permutation))
        return best if best is not None else TopologyHint(self.default, False)


def _filter_single_numa_hints(all_hints: list[list[TopologyHint]]) -> list[list[TopologyHint]]:
    return [
        [h for h in hints if h.preferred and (h.affinity is None or len(h.affinity) == 1)]
        for hints in all_hints
    ]


def merge_hints(
    policy: str, numa_nodes: Sequence[int], providers_hints: Sequence[ProviderHints]
) -> tuple[TopologyHint, bool]:
    """The Topology Manager's ``Merge`` for ``policy``: ``(best hint, admit)``.

    Policy ``none`` computes nothing: ``(TopologyHint(None, False), True)``, like kubelet's.
    """
    if policy == POLICY_NONE:
        return TopologyHint(None, False), True
    filtered = filter_providers_hints(providers_hints)
    if policy == POLICY_SINGLE_NUMA_NODE:
        best = _HintMerger(numa_nodes, _filter_single_numa_hints(filtered)).merge()
        if best.affinity == frozenset(numa_nodes):
            best = TopologyHint(None, best.preferred)
        return best, best.preferred
    if policy == POLICY_RESTRICTED:
        best = _HintMerger(numa_nodes, filtered).merge()
        return best, best.preferred
    if policy == POLICY_BEST_EFFORT:
        return _HintMerger(numa_nodes, filtered).merge(), True
    raise InvalidInput(f"unknown topology manager policy {policy!r}; choose one of {TOPOLOGY_POLICIES}")


# --- device selection helpers (manager.go: filterByAffinity) -------------------------------------


def filter_by_affinity(
    all_devices: Mapping[str, DeviceTopology],
    available: Iterable[str],
    affinity: NumaMask | None,
) -> tuple[set[str], set[str], set[str]]:
    """``filterByAffinity``: split free devices into (aligned, unaligned, no-affinity) for a hint."""
    available_set = set(available)
    if not has_topology_alignment(all_devices) or affinity is None:
        return set(), set(), available_set
    per_node: dict[int, set[str]] = {}
    for device in available_set:
        topo = all_devices.get(device)
        if not topo:
            per_node.setdefault(NODE_WITHOUT_TOPOLOGY, set()).add(device)
            continue
        for node in topo:
            per_node.setdefault(node, set()).add(device)

    def order(node: int) -> tuple[int, int, int]:
        if node in affinity:
            group = 0
        elif node == NODE_WITHOUT_TOPOLOGY:
            group = 2
        else:
            group = 1
        return (group, len(per_node[node]), node)

    nodes = sorted(per_node, key=order)
    aligned: set[str] = set()
    unaligned: set[str] = set()
    no_affinity: set[str] = set()
    for device in available_set:
        for node in nodes:
            if device in per_node[node]:
                if node == NODE_WITHOUT_TOPOLOGY:
                    no_affinity.add(device)
                elif node in affinity:
                    aligned.add(device)
                else:
                    unaligned.add(device)
                break
    return aligned, unaligned, no_affinity


# --- pods: quantities, QoS, container requests -------------------------------------------------

_QUANTITY_RE = re.compile(
    r"(?P<sign>[+-]?)(?P<num>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?:(?P<bin>Ki|Mi|Gi|Ti|Pi|Ei)|[eE](?P<exp>[+-]?[0-9]+)|(?P<dec>[numkMGTPE]?))\Z"
)
_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


def parse_quantity(value: object, where: str = "quantity") -> Fraction:
    """A Kubernetes quantity (``"8"``, ``"500m"``, ``"16Gi"``, a JSON number) as an exact fraction."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise InvalidInput(f"{where}: want a quantity, got {type(value).__name__}")
    if isinstance(value, int | float):
        return Fraction(value)
    match = _QUANTITY_RE.match(value.strip())
    if not match:
        raise InvalidInput(f"{where}: {value!r} is not a Kubernetes quantity")
    number = Fraction(match["num"])
    if match["bin"]:
        number *= 2 ** _BINARY[match["bin"]]
    else:
        exponent = int(match["exp"]) if match["exp"] is not None else _DECIMAL[match["dec"]]
        if abs(exponent) > 40:
            raise InvalidInput(f"{where}: {value!r} is out of range")
        number *= Fraction(10) ** exponent
    return -number if match["sign"] == "-" else number


def _ceil(value: Fraction) -> int:
    return -((-value.numerator) // value.denominator)


def quantity_value(value: object, where: str = "quantity") -> int:
    """Go's ``Quantity.Value()``: the quantity rounded up to an integer."""
    return _ceil(parse_quantity(value, where))


def quantity_milli_value(value: object, where: str = "quantity") -> int:
    """Go's ``Quantity.MilliValue()``: the quantity times 1000, rounded up."""
    return _ceil(parse_quantity(value, where) * 1000)


def _resources(container: Mapping[str, Any], section: str) -> Mapping[str, Any]:
    resources = container.get("resources") or {}
    if not isinstance(resources, Mapping):
        raise InvalidInput(f"container {container.get('name')!r}: resources must be an object")
    values = resources.get(section) or {}
    if not isinstance(values, Mapping):
        raise InvalidInput(f"container {container.get('name')!r}: resources.{section} must be an object")
    return values


def container_limits(container: Mapping[str, Any]) -> dict[str, Any]:
    """``resources.limits`` of a container (empty when unset)."""
    return dict(_resources(container, "limits"))


def container_requests(container: Mapping[str, Any]) -> dict[str, Any]:
    """``resources.requests`` after API-server defaulting (a limit without a request becomes the request)."""
    requests = dict(_resources(container, "requests"))
    for name, limit in _resources(container, "limits").items():
        requests.setdefault(name, limit)
    return requests


def pod_containers(pod: Mapping[str, Any]) -> list[tuple[dict[str, Any], bool]]:
    """``(container, is_init)`` for init containers then app containers (kubelet's admission order)."""
    spec = pod.get("spec") or {}
    if not isinstance(spec, Mapping):
        raise InvalidInput("pod spec must be an object")
    result: list[tuple[dict[str, Any], bool]] = []
    for key, is_init in (("initContainers", True), ("containers", False)):
        items = spec.get(key) or []
        if not isinstance(items, list) or not all(isinstance(c, dict) for c in items):
            raise InvalidInput(f"pod spec.{key} must be a list of objects")
        result.extend((c, is_init) for c in items)
    return result


def is_restartable_init(container: Mapping[str, Any]) -> bool:
    """A sidecar: an init container with ``restartPolicy: Always``."""
    return container.get("restartPolicy") == "Always"


def pod_qos_class(pod: Mapping[str, Any]) -> str:
    """``v1qos.GetPodQOS``: ``status.qosClass`` if set, else computed from cpu/memory requests and limits."""
    status = pod.get("status") or {}
    if isinstance(status, Mapping) and status.get("qosClass"):
        return str(status["qosClass"])
    requests: dict[str, Fraction] = {}
    limits: dict[str, Fraction] = {}
    guaranteed = True
    for container, _ in pod_containers(pod):
        name = container.get("name")
        for resource, raw in container_requests(container).items():
            if resource in ("cpu", "memory"):
                q = parse_quantity(raw, f"container {name!r} requests.{resource}")
                if q > 0:
                    requests[resource] = requests.get(resource, Fraction(0)) + q
        found: set[str] = set()
        for resource, raw in container_limits(container).items():
            if resource in ("cpu", "memory"):
                q = parse_quantity(raw, f"container {name!r} limits.{resource}")
                if q > 0:
                    found.add(resource)
                    limits[resource] = limits.get(resource, Fraction(0)) + q
        if found != {"cpu", "memory"}:
            guaranteed = False
    if not requests and not limits:
        return "BestEffort"
    if guaranteed:
        for resource, req in requests.items():
            if limits.get(resource) != req:
                guaranteed = False
                break
    if guaranteed and len(requests) == len(limits):
        return "Guaranteed"
    return "Burstable"


def guaranteed_cpus(pod: Mapping[str, Any], container: Mapping[str, Any]) -> int:
    """The static policy's ``guaranteedCPUs``: integer CPU request of a Guaranteed pod's container, else 0."""
    if pod_qos_class(pod) != "Guaranteed":
        return 0
    raw = container_requests(container).get("cpu")
    if raw is None:
        return 0
    where = f"container {container.get('name')!r} requests.cpu"
    value = quantity_value(raw, where)
    if value * 1000 != quantity_milli_value(raw, where):
        return 0
    return value


# --- static CPU manager (policy_static.go, cpu_assignment.go) -----------------------------------


@dataclass(frozen=True, slots=True)
class CpuTopology:
    """CPU ids per NUMA node (one socket per NUMA node, one thread per core)."""

    numa_cpus: Mapping[int, frozenset[int]]

    @property
    def numa_nodes(self) -> list[int]:
        """NUMA node ids in ascending order."""
        return sorted(self.numa_cpus)

    def cpus_in(self, nodes: Iterable[int]) -> frozenset[int]:
        """All CPUs of the given NUMA nodes."""
        result: set[int] = set()
        for node in nodes:
            result |= self.numa_cpus.get(node, frozenset())
        return frozenset(result)


def generate_cpu_hints(
    topology: CpuTopology, available: Iterable[int], reusable: Iterable[int], request: int
) -> list[TopologyHint]:
    """``generateCPUTopologyHints`` (without ``align-by-socket``)."""
    available_list = sorted(set(available))
    reusable_list = sorted(set(reusable))
    node_of = {cpu: node for node, cpus in topology.numa_cpus.items() for cpu in cpus}
    min_affinity_size = len(topology.numa_nodes)
    found: list[NumaMask] = []
    for mask in iterate_masks(topology.numa_nodes):
        if len(topology.cpus_in(mask)) >= request and len(mask) < min_affinity_size:
            min_affinity_size = len(mask)
        if any(node_of.get(c) not in mask for c in reusable_list):
            continue
        matching = len(reusable_list) + sum(1 for c in available_list if node_of.get(c) in mask)
        if matching >= request:
            found.append(mask)
    return [TopologyHint(mask, len(mask) == min_affinity_size) for mask in found]


class CpuAllocationError(Exception):
    """The static policy could not take the requested CPUs (kubelet's error text)."""


def take_by_topology(topology: CpuTopology, available: Iterable[int], count: int) -> frozenset[int]:
    """``takeByTopologyNUMAPacked`` for one-thread cores and one socket per NUMA node.

    Whole free NUMA nodes first (when the request needs at least a node's worth), then single CPUs
    from the NUMA node with the fewest free CPUs first, lowest CPU id first.
    """
    free = set(available)
    if count == 0:
        return frozenset()
    if len(free) < count:
        raise CpuAllocationError(
            f"not enough cpus available to satisfy request: requested={count}, available={len(free)}"
        )
    result: set[int] = set()

    def sorted_nodes() -> list[int]:
        with_free = [n for n in topology.numa_nodes if free & topology.numa_cpus[n]]
        return sorted(with_free, key=lambda n: (len(free & topology.numa_cpus[n]), n))

    for node in sorted_nodes():
        node_cpus = topology.numa_cpus[node]
        if node_cpus <= free and count - len(result) >= len(node_cpus):
            result |= node_cpus
            free -= node_cpus
            if len(result) == count:
                return frozenset(result)
    for node in sorted_nodes():
        for cpu in sorted(free & topology.numa_cpus[node]):
            result.add(cpu)
            if len(result) == count:
                return frozenset(result)
    raise CpuAllocationError("failed to allocate cpus")


def allocate_cpus(
    topology: CpuTopology, count: int, affinity: NumaMask | None, allocatable: Iterable[int]
) -> frozenset[int]:
    """The static policy's ``allocateCPUs``: CPUs inside the hint's NUMA nodes first, then any others."""
    allocatable_set = frozenset(allocatable)
    result: frozenset[int] = frozenset()
    if affinity is not None:
        aligned = allocatable_set & topology.cpus_in(sorted(affinity))
        result = take_by_topology(topology, aligned, min(count, len(aligned)))
    remaining = take_by_topology(topology, allocatable_set - result, count - len(result))
    return result | remaining


def format_cpu_list(cpus: Iterable[int]) -> str:
    """Linux cpuset list syntax: ``0-3,8,10-11``."""
    ordered = sorted(set(cpus))
    parts: list[str] = []
    for _, group in itertools.groupby(enumerate(ordered), key=lambda p: p[1] - p[0]):
        run = [c for _, c in group]
        parts.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
    return ",".join(parts)


def parse_cpu_list(text: str, where: str = "cpu list") -> frozenset[int]:
    """Parse Linux cpuset list syntax (``0-3,8``); raise InvalidInput on anything else."""
    cpus: set[int] = set()
    if not text.strip():
        return frozenset()
    for part in text.split(","):
        item = part.strip()
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", item)
        if not match:
            raise InvalidInput(f"{where}: {item!r} is not a CPU id or range (e.g. 0-3,8)")
        first = int(match[1])
        last = int(match[2]) if match[2] is not None else first
        if last < first:
            raise InvalidInput(f"{where}: range {item!r} ends before it starts")
        cpus.update(range(first, last + 1))
    return frozenset(cpus)
