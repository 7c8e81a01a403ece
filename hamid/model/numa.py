"""NUMA records for predictive placement: the node's NUMA profile, observed and predicted placements.

Pure data and strict codecs (no I/O). Three annotations, all under hamid's own ``hamid.io/`` prefix
(none of them exists in HAMi; a ``hami.io/`` key HAMi might define later with another meaning must
not collide with ours):

* ``hamid.io/numa-profile`` (node): CPUs with their core, socket and NUMA node, reserved CPUs,
  NUMA distances and kubelet's policies — what the predictor needs to replay kubelet's choice.
* ``hamid.io/numa-placement`` (pod): what kubelet actually assigned (PodResources API), per container.
* ``hamid.io/numa-predicted`` (pod): the scheduler's prediction, written in the filter's patch so
  the per-NUMA ledger can be rebuilt exactly after a restart.

CPU sets use the Linux cpulist syntax (``0-63,128-191``); SMT siblings are encoded as run-length
thread groups (``0,128x128`` = 128 cores {0,128}, {1,129}, ...), so a 2-socket, 64-core, 2-thread node's
profile is a few hundred bytes. Every decoder raises :class:`InvalidInput` on anything malformed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from hamid.model._wire import (
    INT64_MAX,
    load_json,
    parse_go_bool,
    parse_go_int,
    want_int,
    want_list,
    want_object,
    want_str,
)
from hamid.model.errors import InvalidInput

NUMA_PROFILE = "hamid.io/numa-profile"
NUMA_PLACEMENT = "hamid.io/numa-placement"
NUMA_PREDICTED = "hamid.io/numa-predicted"

FORMAT_VERSION = 1
#: Bound on one encoded annotation (Kubernetes allows 256 KiB for all annotations of an object).
MAX_ANNOTATION_BYTES = 16 * 1024
MAX_CPU_ID = 65535
MAX_NUMA_ID = 63  # kubelet's NUMA bitmask is 64 bits wide
#: NUMA bucket of a device whose plugin advertised no topology (kubelet's fake NUMA node -1).
NO_TOPOLOGY = -1
MAX_DEVICE_ID_LENGTH = 256

#: The Topology Manager policy NUMA alignment needs (the only one that rejects a pod it cannot align).
SINGLE_NUMA_NODE = "single-numa-node"
TM_POLICIES = ("none", "best-effort", "restricted", SINGLE_NUMA_NODE)
TM_SCOPES = ("container", "pod")
CPU_POLICIES = ("none", "static")
MEMORY_POLICIES = ("None", "Static")
TM_OPTION_PREFER_CLOSEST = "prefer-closest-numa-nodes"
TM_OPTION_MAX_NUMA_NODES = "max-allowable-numa-nodes"
TM_OPTION_PREFER_MOST_ALLOCATED = "prefer-most-allocated-numa-node"
CPU_OPTION_FULL_PCPUS_ONLY = "full-pcpus-only"
CPU_OPTION_STRICT_RESERVATION = "strict-cpu-reservation"
CPU_OPTION_DISTRIBUTE_ACROSS_CORES = "distribute-cpus-across-cores"
CPU_OPTION_DISTRIBUTE_ACROSS_NUMA = "distribute-cpus-across-numa"
CPU_OPTION_ALIGN_BY_UNCORE_CACHE = "prefer-align-cpus-by-uncorecache"
DEFAULT_MAX_ALLOWABLE_NUMA_NODES = 8

_INT = r"(?:0|[1-9][0-9]{0,4})"
_CPU_TOKEN = re.compile(rf"({_INT})(?:-({_INT}))?\Z")
_GROUP = re.compile(rf"({_INT}(?:,{_INT})*)(?:x([1-9][0-9]{{0,4}}))?\Z")
_OPTION_NAME = re.compile(r"[a-z0-9][a-z0-9.-]{0,62}\Z")
_NUMA_KEY = re.compile(r"(?:0|[1-9][0-9]?)\Z")
#: A pod record's device bucket: a NUMA node, or -1 for devices without topology.
_DEVICE_NUMA_KEY = re.compile(r"(?:-1|0|[1-9][0-9]?)\Z")


# ==========================================================================================
# CPU lists and thread groups
# ==========================================================================================


def format_cpu_list(cpus: Iterable[int]) -> str:
    """The canonical Linux cpulist of a CPU set (ascending ranges, ``""`` when empty)."""
    ordered = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def parse_cpu_list(text: object, where: str) -> frozenset[int]:
    """A canonical cpulist: ascending, non-overlapping, non-adjacent tokens; ``""`` is the empty set."""
    value = want_str(text, where)
    if value == "":
        return frozenset()
    if len(value) > MAX_ANNOTATION_BYTES:
        raise InvalidInput(f"{where}: cpu list is too long")
    cpus: list[int] = []
    last = -2
    for token in value.split(","):
        m = _CPU_TOKEN.match(token)
        if not m:
            raise InvalidInput(f"{where}: {token!r:.40} is not a CPU id or range")
        lo = int(m[1])
        hi = lo if m[2] is None else int(m[2])
        if hi <= lo and m[2] is not None:
            raise InvalidInput(f"{where}: range {token!r} is empty or not ascending")
        if hi > MAX_CPU_ID:
            raise InvalidInput(f"{where}: CPU {hi} is above {MAX_CPU_ID}")
        if lo <= last + 1:
            raise InvalidInput(f"{where}: {token!r} is not after the previous token (not canonical)")
        cpus.extend(range(lo, hi + 1))
        last = hi
    return frozenset(cpus)


def format_thread_groups(groups: Iterable[Iterable[int]]) -> str:
    """Run-length encode thread groups (sorted by first CPU): ``a,b xN`` = N groups shifted by 0..N-1."""
    ordered = sorted(tuple(sorted(g)) for g in groups)
    tokens: list[str] = []
    i = 0
    while i < len(ordered):
        run = 1
        while i + run < len(ordered) and ordered[i + run] == tuple(c + run for c in ordered[i]):
            run += 1
        head = ",".join(map(str, ordered[i]))
        tokens.append(head if run == 1 else f"{head}x{run}")
        i += run
    return ";".join(tokens)


def parse_thread_groups(text: object, where: str) -> tuple[frozenset[int], ...]:
    """Decode :func:`format_thread_groups` output; every CPU must appear in exactly one group."""
    value = want_str(text, where)
    if value == "":
        return ()
    seen: set[int] = set()
    groups: list[frozenset[int]] = []
    for token in value.split(";"):
        m = _GROUP.match(token)
        if not m:
            raise InvalidInput(f"{where}: {token!r:.40} is not a thread group")
        head = [int(c) for c in m[1].split(",")]
        if head != sorted(set(head)):
            raise InvalidInput(f"{where}: thread group {m[1]!r} is not strictly ascending")
        for shift in range(int(m[2] or 1)):
            group = frozenset(c + shift for c in head)
            if max(group) > MAX_CPU_ID:
                raise InvalidInput(f"{where}: CPU {max(group)} is above {MAX_CPU_ID}")
            if seen & group:
                raise InvalidInput(f"{where}: CPU {min(seen & group)} is in two thread groups")
            seen |= group
            groups.append(group)
    return tuple(groups)


# ==========================================================================================
# Node NUMA profile
# ==========================================================================================


#: Memory types the Static memory manager pins: regular memory and hugepages of one page size.
_MEMORY_TYPE = re.compile(r"(?:memory|hugepages-[1-9][0-9]{0,9}(?:Ki|Mi|Gi|Ti|Pi|Ei)?)\Z")
#: Format version of a profile that carries ``memory`` (readers of 1 to 3 refuse the field).
PROFILE_MEMORY_VERSION = 4
#: Format version of a profile that carries ``hideReplicas`` (readers of 1 to 4 refuse the field).
PROFILE_HIDE_REPLICAS_VERSION = 5
#: Format version of a profile that carries ``devices`` (readers of 1 to 5 refuse the field).
PROFILE_DEVICES_VERSION = 6
#: Format version of a profile whose ``hideReplicas`` rule is ``span`` (readers of 1 to 6 know
#: only ``full`` and ``busy``).
PROFILE_SPAN_VERSION = 7
#: Format version of a profile whose ``hideReplicas`` rule is ``steer`` (readers of 1 to 7 know
#: only ``full``, ``busy`` and ``span``).
PROFILE_STEER_VERSION = 8
#: Format version of a profile whose rule is ``steer`` under Topology Manager ``single-numa-node``
#: or ``best-effort`` (plugins of 8 steer only under ``restricted``; a scheduler must not expect
#: their steering elsewhere).
PROFILE_STEER_POLICIES_VERSION = 9
#: The rules by which hamid's device plugin hides free GPU replicas from kubelet
#: (:mod:`hamid.fit.replica_room`): ``full`` hides those of a GPU with no room; ``busy`` also
#: those of a partly booked GPU while the node has an idle one; ``span`` as ``busy``, and a node
#: with nothing booked lists one free replica per GPU (the others left out of the list); ``steer``
#: as ``span``, and while a booked pod is admitted only the NUMA nodes of its GPUs offer free
#: replicas.
HIDE_FULL, HIDE_BUSY, HIDE_SPAN, HIDE_STEER = HIDE_RULES = ("full", "busy", "span", "steer")
#: What ``steer`` applies under Topology Manager ``single-numa-node`` or ``best-effort``, where
#: ``span``'s listing would not help: ``busy``, and the steering (never configured, only applied;
#: :func:`hamid.fit.replica_room.effective_rule`).
HIDE_BUSY_STEER = "busy+steer"
#: The rules under which an idle node lists one free replica per GPU (``span``'s listing).
SPANNING_RULES = frozenset({HIDE_SPAN, HIDE_STEER})
#: The applied rules under which the plugin steers kubelet to the booked GPUs' NUMA node.
STEERING_RULES = frozenset({HIDE_STEER, HIDE_BUSY_STEER})
#: The Topology Manager policies but ``restricted`` under which ``steer`` still steers (it does not
#: list one replica per GPU there).
STEERED_WITHOUT_SPAN = frozenset({SINGLE_NUMA_NODE, "best-effort"})
#: The format version each rule needs beyond :data:`PROFILE_HIDE_REPLICAS_VERSION`.
_RULE_VERSIONS = {HIDE_SPAN: PROFILE_SPAN_VERSION, HIDE_STEER: PROFILE_STEER_VERSION}


@dataclass(frozen=True, slots=True)
class ReplicaHiding:
    """Which free replicas of ``resource`` hamid's device plugin reports Unhealthy, by ``rule``."""

    resource: str
    rule: str


#: Format version of a placement or prediction whose containers carry ``memory``.
POD_MEMORY_VERSION = 2
#: Format version of a placement or prediction with devices without topology (bucket -1), with or
#: without ``memory``: a reader that knows no such bucket sees a newer format, not corruption.
POD_NO_TOPOLOGY_VERSION = 3


@dataclass(frozen=True, slots=True)
class MemoryBlock:
    """Memory of one type (``memory``, ``hugepages-1Gi``) the Static memory manager pinned to the
    NUMA node(s) ``numa``, in bytes (kubelet's ``state.Block``; PodResources' ``ContainerMemory``)."""

    numa: frozenset[int]
    resource: str
    size: int


def _check_memory_type(name: object, where: str) -> str:
    if not isinstance(name, str) or not _MEMORY_TYPE.match(name):
        raise InvalidInput(f"{where}: {name!r:.40} is not memory or hugepages-<size>")
    return name


@dataclass(frozen=True, slots=True)
class CpuInfo:
    """One logical CPU. ``core`` is kubelet's unique core id: the lowest CPU id of its thread group.

    ``uncore``: kubelet's ``UncoreCacheID`` (the CPU's L3 cache id, else its socket id), or None
    when the profile does not carry uncore caches.
    """

    cpu: int
    core: int
    socket: int
    numa: int
    uncore: int | None = None


@dataclass(frozen=True, slots=True)
class KubeletPolicies:
    """The kubelet settings that decide NUMA placement (KubeletConfiguration names, values verbatim)."""

    cpu_manager_policy: str = "none"
    cpu_manager_options: Mapping[str, str] = field(default_factory=dict)
    topology_manager_policy: str = "none"
    topology_manager_scope: str = "container"
    topology_manager_options: Mapping[str, str] = field(default_factory=dict)
    memory_manager_policy: str = "None"

    def __post_init__(self) -> None:
        """Reject values kubelet itself would not start with (policy names are enumerations)."""
        _check_choice(self.cpu_manager_policy, CPU_POLICIES, "cpuManagerPolicy")
        _check_choice(self.topology_manager_policy, TM_POLICIES, "topologyManagerPolicy")
        _check_choice(self.topology_manager_scope, TM_SCOPES, "topologyManagerScope")
        _check_choice(self.memory_manager_policy, MEMORY_POLICIES, "memoryManagerPolicy")
        for where, options in (
            ("cpuManagerPolicyOptions", self.cpu_manager_options),
            ("topologyManagerPolicyOptions", self.topology_manager_options),
        ):
            for name, value in options.items():
                if not isinstance(name, str) or not _OPTION_NAME.match(name):
                    raise InvalidInput(f"{where}: {name!r:.70} is not an option name")
                if not isinstance(value, str) or len(value) > 64:
                    raise InvalidInput(f"{where}.{name}: want a string of at most 64 characters")
        object.__setattr__(self, "cpu_manager_options", MappingProxyType(dict(self.cpu_manager_options)))
        object.__setattr__(
            self, "topology_manager_options", MappingProxyType(dict(self.topology_manager_options))
        )

    @property
    def rejects_unpreferred(self) -> bool:
        """Whether the Topology Manager admits only a preferred merged hint (``restricted``,
        ``single-numa-node``); ``best-effort`` admits any, ``none`` computes none."""
        return self.topology_manager_policy in ("restricted", SINGLE_NUMA_NODE)

    def max_allowable_numa_nodes(self) -> int:
        """``max-allowable-numa-nodes`` (default 8); InvalidInput when kubelet could not parse it."""
        raw = self.topology_manager_options.get(TM_OPTION_MAX_NUMA_NODES)
        if raw is None:
            return DEFAULT_MAX_ALLOWABLE_NUMA_NODES
        return parse_go_int(raw, -(2**63), INT64_MAX, TM_OPTION_MAX_NUMA_NODES)

    def option_enabled(self, options: Mapping[str, str], name: str) -> bool:
        """A boolean policy option as kubelet parses it (``strconv.ParseBool``); absent is off."""
        raw = options.get(name)
        return False if raw is None else parse_go_bool(raw, name)


def _check_choice(value: object, choices: tuple[str, ...], where: str) -> None:
    if value not in choices:
        raise InvalidInput(f"{where}: {value!r:.40} is not one of {', '.join(choices)}")


@dataclass(frozen=True, slots=True)
class NumaProfile:
    """What kubelet sees of a node's CPU topology, and how it is configured to place containers.

    ``generation`` grows on every change of the profile (ledgers built for another generation are
    stale); ``observed_at`` (unix seconds) is when the node agent last confirmed it.
    ``distances[i][j]`` is the distance between the i-th and j-th entries of ``numa_nodes``.
    """

    generation: int
    observed_at: int
    numa_nodes: tuple[int, ...]
    cpus: tuple[CpuInfo, ...]
    reserved_cpus: frozenset[int] = frozenset()
    distances: tuple[tuple[int, ...], ...] | None = None
    policies: KubeletPolicies = field(default_factory=KubeletPolicies)
    #: The resource hamid's device plugin serves with ``GetPreferredAllocation`` offered to kubelet
    #: (the plugin then prefers the annotated GPUs' replicas); None: not offered.
    preferred_allocation: str | None = None
    #: The Static memory manager's allocatable bytes per NUMA node and memory type (PodResources
    #: ``GetAllocatableResources``: capacity minus ``reservedMemory`` and, for regular memory, the
    #: hugepages); None when kubelet reports none (memory manager policy None).
    memory: tuple[tuple[int, tuple[tuple[str, int], ...]], ...] | None = None
    #: The free GPU replicas hamid's device plugin reports Unhealthy to kubelet
    #: (:mod:`hamid.fit.replica_room`); None: every free replica is offered (older profiles, or
    #: the plugin's ``--hide-replicas=off``).
    hide_replicas: ReplicaHiding | None = None
    #: The node's other device-plugin resources whose devices name a NUMA node (PodResources
    #: ``GetAllocatableResources``): kubelet's Topology Manager weighs their hints too, which the
    #: predictor does not replay, so a pod asking one is ``unknown``. Empty: none (or older agents).
    other_devices: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        """Check the topology is coherent (one core/socket/NUMA per CPU, cores inside one NUMA)."""
        _check_profile(self)

    def memory_allocatable(self) -> dict[int, dict[str, int]]:
        """Allocatable bytes per NUMA node (every node of the profile) and memory type."""
        given = {n: dict(types) for n, types in self.memory or ()}
        return {n: given.get(n, {}) for n in self.numa_nodes}

    @property
    def all_cpus(self) -> frozenset[int]:
        """Every online CPU kubelet knows."""
        return frozenset(c.cpu for c in self.cpus)

    def cpus_of_numa(self, numa: int) -> frozenset[int]:
        """The CPUs of one NUMA node."""
        return frozenset(c.cpu for c in self.cpus if c.numa == numa)

    def distance(self, a: int, b: int) -> int | None:
        """The distance between two NUMA nodes, ``None`` when the profile has none."""
        if self.distances is None:
            return None
        index = {n: i for i, n in enumerate(self.numa_nodes)}
        return self.distances[index[a]][index[b]]


def _check_profile(p: NumaProfile) -> None:
    want_int(p.generation, "numa profile generation", 0)
    want_int(p.observed_at, "numa profile observedAt", 0)
    if not p.numa_nodes or list(p.numa_nodes) != sorted(set(p.numa_nodes)):
        raise InvalidInput("numa profile: NUMA nodes must be non-empty, unique and ascending")
    if p.numa_nodes[0] < 0 or p.numa_nodes[-1] > MAX_NUMA_ID:
        raise InvalidInput(f"numa profile: NUMA ids must be within 0-{MAX_NUMA_ID}")
    if not p.cpus:
        raise InvalidInput("numa profile: no CPUs")
    ids = [c.cpu for c in p.cpus]
    if ids != sorted(set(ids)):
        raise InvalidInput("numa profile: CPUs must be unique and ascending")
    if ids[0] < 0 or ids[-1] > MAX_CPU_ID:
        raise InvalidInput(f"numa profile: CPU ids must be within 0-{MAX_CPU_ID}")
    _check_cpu_groups(p)
    if not p.reserved_cpus <= frozenset(ids):
        raise InvalidInput("numa profile: reserved CPUs are not all online CPUs")
    if p.distances is not None:
        _check_distances(p.distances, len(p.numa_nodes))
    for numa, types in p.memory or ():
        if numa not in p.numa_nodes:
            raise InvalidInput(f"numa profile: memory of unknown NUMA node {numa}")
        for name, size in types:
            _check_memory_type(name, f"numa profile: memory of NUMA node {numa}")
            want_int(size, f"numa profile: {name} of NUMA node {numa}", 1, INT64_MAX)


def _check_cpu_groups(p: NumaProfile) -> None:
    """Every CPU on a known NUMA node and socket; a core on one socket and NUMA node, named by its
    lowest CPU id (how the encoding groups thread siblings)."""
    groups: dict[int, tuple[int, int]] = {}
    for c in p.cpus:
        if c.numa not in p.numa_nodes:
            raise InvalidInput(f"numa profile: CPU {c.cpu} is on unknown NUMA node {c.numa}")
        if not 0 <= c.socket <= MAX_CPU_ID:
            raise InvalidInput(f"numa profile: CPU {c.cpu} has an invalid socket {c.socket}")
        where = groups.setdefault(c.core, (c.socket, c.numa))
        if where != (c.socket, c.numa):
            raise InvalidInput(f"numa profile: core {c.core} spans sockets or NUMA nodes")
    _check_uncore(p)
    lowest: dict[int, int] = {}
    for c in p.cpus:  # ascending: the first CPU seen of a core is its lowest
        lowest.setdefault(c.core, c.cpu)
    if any(core != cpu for core, cpu in lowest.items()):
        raise InvalidInput("numa profile: a core id must be the lowest CPU id of its threads")


def _check_uncore(p: NumaProfile) -> None:
    """Uncore caches for every CPU or for none; a core's threads share one cache."""
    carried = {c.uncore is not None for c in p.cpus}
    if len(carried) > 1:
        raise InvalidInput("numa profile: uncore caches must be given for every CPU or for none")
    cache_of_core: dict[int, int | None] = {}
    for c in p.cpus:
        if c.uncore is not None and not 0 <= c.uncore <= MAX_CPU_ID:
            raise InvalidInput(f"numa profile: CPU {c.cpu} has an invalid uncore cache {c.uncore}")
        if cache_of_core.setdefault(c.core, c.uncore) != c.uncore:
            raise InvalidInput(f"numa profile: core {c.core} spans uncore caches")


def _check_distances(distances: Sequence[Sequence[int]], n: int) -> None:
    """An n x n matrix of SLIT distances (0 to 255), as sysfs ``node*/distance`` reports them."""
    if len(distances) != n or any(len(row) != n for row in distances):
        raise InvalidInput(f"numa profile: distances must be a {n}x{n} matrix")
    for row in distances:
        for d in row:
            want_int(d, "numa profile distance", 0, 255)


# --- profile codec -------------------------------------------------------------------------

_PROFILE_KEYS = frozenset(
    {
        "v",
        "gen",
        "at",
        "numa",
        "sockets",
        "cores",
        "reserved",
        "distances",
        "kubelet",
        "preferred",
        "uncore",
        "memory",
        "hideReplicas",
        "devices",
    }
)
#: A profile naming ``preferred`` (format 2) is unknown to readers of format 1; others stay 1.
PROFILE_PREFERRED_VERSION = 2
#: A profile carrying ``uncore`` caches (format 3) is unknown to readers of formats 1 and 2.
PROFILE_UNCORE_VERSION = 3
#: The format version each optional field needs: a profile is written with the highest version its
#: fields need (1 without any), so older readers keep reading every profile they can understand.
_FIELD_VERSIONS = {
    "preferred": PROFILE_PREFERRED_VERSION,
    "uncore": PROFILE_UNCORE_VERSION,
    "memory": PROFILE_MEMORY_VERSION,
    "hideReplicas": PROFILE_HIDE_REPLICAS_VERSION,
    "devices": PROFILE_DEVICES_VERSION,
}
PROFILE_VERSIONS = (
    FORMAT_VERSION,
    PROFILE_PREFERRED_VERSION,
    PROFILE_UNCORE_VERSION,
    PROFILE_MEMORY_VERSION,
    PROFILE_HIDE_REPLICAS_VERSION,
    PROFILE_DEVICES_VERSION,
    PROFILE_SPAN_VERSION,
    PROFILE_STEER_VERSION,
    PROFILE_STEER_POLICIES_VERSION,
)


def profile_version(doc: Mapping[str, object]) -> int:
    """The format version of a profile document: the highest its top-level fields need, and
    the version its ``hideReplicas`` rule needs (``span``: 7, ``steer``: 8, ``steer`` under
    ``single-numa-node`` or ``best-effort``: 9)."""
    version = max((_FIELD_VERSIONS.get(f, FORMAT_VERSION) for f in doc), default=FORMAT_VERSION)
    hiding = doc.get("hideReplicas")
    if isinstance(hiding, Mapping):
        rule = str(hiding.get("rule"))
        version = max(version, _RULE_VERSIONS.get(rule, FORMAT_VERSION))
        kubelet = doc.get("kubelet")
        policy = kubelet.get("topologyManagerPolicy") if isinstance(kubelet, Mapping) else None
        if rule == HIDE_STEER and policy in STEERED_WITHOUT_SPAN:
            version = max(version, PROFILE_STEER_POLICIES_VERSION)
    return version


_KUBELET_KEYS = {
    "cpuManagerPolicy": "cpu_manager_policy",
    "cpuManagerPolicyOptions": "cpu_manager_options",
    "topologyManagerPolicy": "topology_manager_policy",
    "topologyManagerScope": "topology_manager_scope",
    "topologyManagerPolicyOptions": "topology_manager_options",
    "memoryManagerPolicy": "memory_manager_policy",
}


def encode_profile(profile: NumaProfile) -> str:
    """The ``hamid.io/numa-profile`` value (compact JSON, bounded)."""
    by_numa: dict[int, list[int]] = {n: [] for n in profile.numa_nodes}
    by_socket: dict[int, list[int]] = {}
    by_core: dict[int, list[int]] = {}
    by_uncore: dict[int, list[int]] = {}
    for c in profile.cpus:
        by_numa[c.numa].append(c.cpu)
        by_socket.setdefault(c.socket, []).append(c.cpu)
        by_core.setdefault(c.core, []).append(c.cpu)
        if c.uncore is not None:
            by_uncore.setdefault(c.uncore, []).append(c.cpu)
    pol = profile.policies
    doc: dict[str, object] = {
        "v": FORMAT_VERSION,
        "gen": profile.generation,
        "at": profile.observed_at,
        "numa": {str(n): format_cpu_list(cpus) for n, cpus in by_numa.items()},
        "sockets": {str(s): format_cpu_list(cpus) for s, cpus in sorted(by_socket.items())},
        "cores": format_thread_groups(by_core.values()),
        "reserved": format_cpu_list(profile.reserved_cpus),
        "kubelet": {key: _plain(getattr(pol, attr)) for key, attr in _KUBELET_KEYS.items()},
    }
    if profile.distances is not None:
        doc["distances"] = [list(row) for row in profile.distances]
    if profile.preferred_allocation is not None:
        doc["preferred"] = profile.preferred_allocation
    if by_uncore:
        doc["uncore"] = {str(u): format_cpu_list(cpus) for u, cpus in sorted(by_uncore.items())}
    if profile.memory is not None:
        doc["memory"] = {str(n): dict(types) for n, types in profile.memory}
    if profile.hide_replicas is not None:
        doc["hideReplicas"] = {"resource": profile.hide_replicas.resource, "rule": profile.hide_replicas.rule}
    if profile.other_devices:
        doc["devices"] = list(profile.other_devices)
    doc["v"] = profile_version(doc)
    return _bounded(json.dumps(doc, separators=(",", ":"), sort_keys=True), NUMA_PROFILE)


def _plain(value: object) -> object:
    return dict(value) if isinstance(value, Mapping) else value


def _bounded(text: str, key: str) -> str:
    if len(text.encode()) > MAX_ANNOTATION_BYTES:
        raise InvalidInput(f"{key}: encoded value is over {MAX_ANNOTATION_BYTES} bytes")
    return text


def _load(
    text: object, key: str, keys: frozenset[str], versions: tuple[int, ...] = (FORMAT_VERSION,)
) -> Mapping[str, object]:
    if isinstance(text, str) and len(text) > MAX_ANNOTATION_BYTES:
        raise InvalidInput(f"{key}: value is over {MAX_ANNOTATION_BYTES} bytes")
    doc = want_object(load_json(text, key), key)
    version = doc.get("v")
    if isinstance(version, int) and not isinstance(version, bool) and version > max(versions):
        # checked before the fields, which a newer format may add: a version skew, not corruption
        raise NewerFormat(
            f"{key}: format version {version} is newer than this hamid reads (up to "
            f"{max(versions)}); upgrade hamid (a rolling upgrade has nodes ahead of the scheduler)"
        )
    unknown = sorted(set(doc) - keys)
    if unknown:
        raise InvalidInput(f"{key}: unknown field {unknown[0]!r:.40}")
    if version not in versions or isinstance(version, bool):
        want = " or ".join(map(str, versions))
        raise InvalidInput(f"{key}: want format version {want}, got {version!r:.20}")
    return doc


class NewerFormat(InvalidInput):
    """A value written by a newer hamid than this one (a version skew during a rolling upgrade or
    after a rollback): unreadable here, but not malformed."""


def profile_generation(text: object) -> int | None:
    """The ``gen`` of a profile this hamid cannot decode (a newer format), so a rolled-back node
    agent replacing it continues the generation instead of starting again at 1; None: none readable."""
    try:
        doc = want_object(load_json(text, NUMA_PROFILE), NUMA_PROFILE)
        return want_int(doc.get("gen"), f"{NUMA_PROFILE}.gen", 0)
    except InvalidInput:
        return None


def _id_map(value: object, where: str) -> dict[int, frozenset[int]]:
    out: dict[int, frozenset[int]] = {}
    for k, v in want_object(value, where).items():
        if not re.fullmatch(_INT, k):
            raise InvalidInput(f"{where}: key {k!r:.20} is not a canonical id")
        out[int(k)] = parse_cpu_list(v, f"{where}.{k}")
    return out


def _cpu_owner(groups: Mapping[int, frozenset[int]], where: str) -> dict[int, int]:
    owner: dict[int, int] = {}
    for gid, cpus in groups.items():
        for cpu in cpus:
            if cpu in owner:
                raise InvalidInput(f"{where}: CPU {cpu} is listed twice")
            owner[cpu] = gid
    return owner


def _options(value: object, where: str) -> dict[str, str]:
    return {k: want_str(v, f"{where}.{k}") for k, v in want_object(value, where).items()}


def _policies(value: object) -> KubeletPolicies:
    where = f"{NUMA_PROFILE}.kubelet"
    doc = want_object(value, where)
    unknown = sorted(set(doc) - set(_KUBELET_KEYS))
    if unknown:
        raise InvalidInput(f"{where}: unknown field {unknown[0]!r:.40}")
    kwargs: dict[str, object] = {}
    for key, attr in _KUBELET_KEYS.items():
        if key in doc:
            raw = doc[key]
            kwargs[attr] = (
                _options(raw, f"{where}.{key}")
                if key.endswith("Options")
                else want_str(raw, f"{where}.{key}")
            )
    return KubeletPolicies(**kwargs)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class _Topology:
    """A profile's parts other than ``gen`` and ``at``: equal on nodes of one kind, so shared."""

    numa_nodes: tuple[int, ...]
    cpus: tuple[CpuInfo, ...]
    reserved_cpus: frozenset[int]
    distances: tuple[tuple[int, ...], ...] | None
    policies: KubeletPolicies
    preferred_allocation: str | None
    memory: tuple[tuple[int, tuple[tuple[str, int], ...]], ...] | None
    hide_replicas: ReplicaHiding | None
    other_devices: tuple[str, ...]

    def profile(self, generation: int, observed_at: int) -> NumaProfile:
        """The profile of this topology for one generation and confirmation time."""
        return NumaProfile(
            generation,
            observed_at,
            self.numa_nodes,
            self.cpus,
            self.reserved_cpus,
            self.distances,
            self.policies,
            self.preferred_allocation,
            self.memory,
            self.hide_replicas,
            self.other_devices,
        )


#: Decoded topologies by their canonical JSON: a cluster's thousands of nodes share a few kinds
#: (dropped when full: only the sharing is lost; plain dict operations, safe from any thread).
_TOPOLOGIES: dict[str, _Topology] = {}
_TOPOLOGY_CACHE_SIZE = 256


def decode_profile(text: object) -> NumaProfile:
    """Parse ``hamid.io/numa-profile``; InvalidInput on anything malformed or incoherent.

    Profiles of equal content (but for ``gen`` and ``at``) share one decoded topology (immutable).
    """
    key = NUMA_PROFILE
    doc = _load(text, key, _PROFILE_KEYS, PROFILE_VERSIONS)
    for required in ("gen", "at", "numa", "sockets", "cores"):
        if required not in doc:
            raise InvalidInput(f"{key}: missing field {required!r}")
    if doc["v"] != profile_version(doc):
        needs = ", ".join(f"{f!r} needs {v}" for f, v in _FIELD_VERSIONS.items())
        rules = ", ".join(f"rule {r!r} {v}" for r, v in _RULE_VERSIONS.items())
        raise InvalidInput(
            f"{key}: format version {doc['v']} does not match its fields "
            f"({needs}, {rules}, rule {HIDE_STEER!r} under "
            f"{' or '.join(sorted(STEERED_WITHOUT_SPAN))} {PROFILE_STEER_POLICIES_VERSION}; "
            "else 1, the highest applies)"
        )
    content = json.dumps({k: v for k, v in doc.items() if k not in ("gen", "at")}, sort_keys=True)
    topology = _TOPOLOGIES.get(content)
    shared = topology is not None
    if topology is None:
        topology = _decode_topology(doc)
    profile = topology.profile(want_int(doc["gen"], f"{key}.gen", 0), want_int(doc["at"], f"{key}.at", 0))
    if not shared:  # coherent (the profile checked it): share it from now on
        if len(_TOPOLOGIES) >= _TOPOLOGY_CACHE_SIZE:
            _TOPOLOGIES.clear()
        _TOPOLOGIES[content] = topology
    return profile


def _decode_topology(doc: Mapping[str, object]) -> _Topology:
    key = NUMA_PROFILE
    numa = _id_map(doc["numa"], f"{key}.numa")
    numa_of = _cpu_owner(numa, f"{key}.numa")
    socket_of = _cpu_owner(_id_map(doc["sockets"], f"{key}.sockets"), f"{key}.sockets")
    core_of: dict[int, int] = {}
    for group in parse_thread_groups(doc["cores"], f"{key}.cores"):
        for cpu in group:
            core_of[cpu] = min(group)
    if not set(numa_of) == set(socket_of) == set(core_of):
        raise InvalidInput(f"{key}: numa, sockets and cores must list the same CPUs")
    uncore_of: dict[int, int] = {}
    if "uncore" in doc:
        uncore_of = _cpu_owner(_id_map(doc["uncore"], f"{key}.uncore"), f"{key}.uncore")
        if set(uncore_of) != set(numa_of):
            raise InvalidInput(f"{key}: uncore must list the same CPUs as numa")
    cpus = tuple(CpuInfo(c, core_of[c], socket_of[c], numa_of[c], uncore_of.get(c)) for c in sorted(numa_of))
    distances = None
    if "distances" in doc:
        rows = want_list(doc["distances"], f"{key}.distances")
        distances = tuple(
            tuple(
                want_int(d, f"{key}.distances[{i}]", 0, 255) for d in want_list(row, f"{key}.distances[{i}]")
            )
            for i, row in enumerate(rows)
        )
    return _Topology(
        numa_nodes=tuple(sorted(numa)),
        cpus=cpus,
        reserved_cpus=parse_cpu_list(doc.get("reserved", ""), f"{key}.reserved"),
        distances=distances,
        policies=_policies(doc.get("kubelet", {})),
        preferred_allocation=want_str(doc["preferred"], f"{key}.preferred") if "preferred" in doc else None,
        memory=_decode_memory(doc["memory"]) if "memory" in doc else None,
        hide_replicas=_decode_hiding(doc["hideReplicas"]) if "hideReplicas" in doc else None,
        other_devices=_decode_devices(doc["devices"]) if "devices" in doc else (),
    )


def _decode_devices(value: object) -> tuple[str, ...]:
    where = f"{NUMA_PROFILE}.devices"
    names = tuple(want_str(v, f"{where}[{i}]") for i, v in enumerate(want_list(value, where)))
    for name in names:
        if "/" not in name:
            raise InvalidInput(f"{where}: {name!r:.60} is not an extended resource name")
    if list(names) != sorted(set(names)):
        raise InvalidInput(f"{where}: must be sorted without repeats")
    return names


def _decode_hiding(value: object) -> ReplicaHiding:
    where = f"{NUMA_PROFILE}.hideReplicas"
    doc = want_object(value, where)
    if set(doc) != {"resource", "rule"}:
        raise InvalidInput(f"{where}: must have exactly resource and rule")
    rule = want_str(doc["rule"], f"{where}.rule")
    if rule not in HIDE_RULES:
        raise InvalidInput(f"{where}.rule: {rule!r} is not one of {', '.join(HIDE_RULES)}")
    return ReplicaHiding(want_str(doc["resource"], f"{where}.resource"), rule)


def _decode_memory(value: object) -> tuple[tuple[int, tuple[tuple[str, int], ...]], ...]:
    where = f"{NUMA_PROFILE}.memory"
    out = []
    for n, types in sorted(want_object(value, where).items()):
        if not _NUMA_KEY.match(n):
            raise InvalidInput(f"{where}: key {n!r:.20} is not a NUMA id")
        sizes = want_object(types, f"{where}.{n}")
        out.append(
            (
                int(n),
                tuple(sorted((t, want_int(v, f"{where}.{n}.{t}", 1, INT64_MAX)) for t, v in sizes.items())),
            )
        )
    return tuple(sorted(out))


# ==========================================================================================
# Observed placement and prediction (per pod, per container)
# ==========================================================================================


@dataclass(frozen=True, slots=True)
class ContainerPlacement:
    """What one container holds: its NUMA node(s), exclusive CPUs, device IDs per resource per NUMA
    bucket (:data:`NO_TOPOLOGY` for devices without topology, never one of ``numa``)."""

    name: str
    numa: frozenset[int]
    cpus: frozenset[int]
    devices: Mapping[str, Mapping[int, tuple[str, ...]]] = field(default_factory=dict)
    #: The Static memory manager's blocks (PodResources ``memory``), one per type, sorted by type.
    memory: tuple[MemoryBlock, ...] = ()


@dataclass(frozen=True, slots=True)
class ContainerPrediction:
    """The predicted share of one container: NUMA node(s), exclusive CPUs, device counts per NUMA.

    ``devices`` counts the replicas the container newly takes per NUMA bucket (:data:`NO_TOPOLOGY`
    for devices without topology); replicas reused from an init container stay on the container
    that took them, so a pod's usage is the sum over containers.
    """

    name: str
    numa: frozenset[int]
    cpus: frozenset[int]
    devices: Mapping[str, Mapping[int, int]] = field(default_factory=dict)
    #: The blocks the Static memory manager will pin (sizes after init-container reuse), sorted by type.
    memory: tuple[MemoryBlock, ...] = ()


@dataclass(frozen=True, slots=True)
class PodPlacement:
    """``hamid.io/numa-placement``: observed from kubelet's PodResources API for profile ``generation``."""

    generation: int
    containers: tuple[ContainerPlacement, ...]


@dataclass(frozen=True, slots=True)
class PodPrediction:
    """``hamid.io/numa-predicted``: the scheduler's prediction against profile ``generation``."""

    generation: int
    containers: tuple[ContainerPrediction, ...]


_POD_KEYS = frozenset({"v", "gen", "containers"})
_CONTAINER_KEYS = frozenset({"name", "numa", "cpus", "devices", "memory"})
_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z")
_RESOURCE = re.compile(r"[A-Za-z0-9][-A-Za-z0-9_.]{0,252}/[A-Za-z0-9][-A-Za-z0-9_.]{0,62}\Z")
_DEVICE_ID = re.compile(rf"[\x21-\x7e]{{1,{MAX_DEVICE_ID_LENGTH}}}\Z")


def _encode_pod(gen: int, containers: Iterable[ContainerPlacement | ContainerPrediction], key: str) -> str:
    rows = []
    flat = False
    for c in containers:
        flat = flat or any(NO_TOPOLOGY in per for per in c.devices.values())
        devices = {
            res: {str(n): (list(v) if isinstance(v, tuple) else v) for n, v in sorted(per_numa.items())}
            for res, per_numa in sorted(c.devices.items())
        }
        row: dict[str, object] = {
            "name": c.name,
            "numa": format_cpu_list(c.numa),
            "cpus": format_cpu_list(c.cpus),
        }
        if devices:
            row["devices"] = devices
        if c.memory:
            row["memory"] = {b.resource: [format_cpu_list(b.numa), b.size] for b in c.memory}
        rows.append(row)
    doc = {"v": _pod_version(any("memory" in row for row in rows), flat), "gen": gen, "containers": rows}
    return _bounded(json.dumps(doc, separators=(",", ":"), sort_keys=True), key)


def _pod_version(memory: bool, flat: bool) -> int:
    """A pod record's format version: the lowest that carries its content (``memory`` blocks,
    devices without topology)."""
    return POD_NO_TOPOLOGY_VERSION if flat else POD_MEMORY_VERSION if memory else FORMAT_VERSION


def encode_placement(placement: PodPlacement) -> str:
    """The ``hamid.io/numa-placement`` value."""
    _check_pod(placement.generation, placement.containers, NUMA_PLACEMENT, ids=True)
    return _encode_pod(placement.generation, placement.containers, NUMA_PLACEMENT)


def encode_prediction(prediction: PodPrediction) -> str:
    """The ``hamid.io/numa-predicted`` value."""
    _check_pod(prediction.generation, prediction.containers, NUMA_PREDICTED, ids=False)
    return _encode_pod(prediction.generation, prediction.containers, NUMA_PREDICTED)


def _check_pod(
    gen: int, containers: Iterable[ContainerPlacement | ContainerPrediction], key: str, ids: bool
) -> None:
    want_int(gen, f"{key}.gen", 0)
    names: set[str] = set()
    for c in containers:
        where = f"{key} container {c.name!r:.70}"
        if not isinstance(c.name, str) or not _NAME.match(c.name) or c.name in names:
            raise InvalidInput(f"{where}: not a unique container name")
        names.add(c.name)
        if any(not 0 <= n <= MAX_NUMA_ID for n in c.numa) or any(not 0 <= x <= MAX_CPU_ID for x in c.cpus):
            raise InvalidInput(f"{where}: NUMA or CPU id out of range")
        for res, per_numa in c.devices.items():
            if not isinstance(res, str) or not _RESOURCE.match(res):
                raise InvalidInput(f"{where}: {res!r:.70} is not an extended resource name")
            for n, v in per_numa.items():
                if isinstance(n, bool) or not isinstance(n, int) or not NO_TOPOLOGY <= n <= MAX_NUMA_ID:
                    raise InvalidInput(f"{where}: {res}: NUMA {n!r:.20} out of range")
                _check_devices(v, f"{where}: {res} on NUMA {n}", ids)
        types = [b.resource for b in c.memory]
        if len(set(types)) != len(types):
            raise InvalidInput(f"{where}: one memory block per memory type")
        for b in c.memory:
            _check_memory_type(b.resource, where)
            want_int(b.size, f"{where}: {b.resource} size", 0, INT64_MAX)
            if not b.numa or any(not 0 <= n <= MAX_NUMA_ID for n in b.numa):
                raise InvalidInput(f"{where}: {b.resource} NUMA nodes missing or out of range")


def _check_devices(value: object, where: str, ids: bool) -> None:
    if ids:
        if not isinstance(value, tuple) or not value:
            raise InvalidInput(f"{where}: want a non-empty tuple of device IDs")
        if len(set(value)) != len(value) or not all(
            isinstance(d, str) and _DEVICE_ID.match(d) for d in value
        ):
            raise InvalidInput(f"{where}: device IDs must be unique printable strings")
    else:
        want_int(value, where, 1, 1 << 20)


def _decode_memory_blocks(value: object, where: str) -> tuple[MemoryBlock, ...]:
    blocks = []
    for name, raw in sorted(want_object(value, where).items()):
        pair = want_list(raw, f"{where}.{name}")
        if len(pair) != 2:
            raise InvalidInput(f"{where}.{name}: want [NUMA nodes, bytes]")
        numa = parse_cpu_list(pair[0], f"{where}.{name}")
        blocks.append(
            MemoryBlock(numa, _check_memory_type(name, where), want_int(pair[1], f"{where}.{name}", 0))
        )
    return tuple(blocks)


def _decode_pod(
    text: object, key: str, ids: bool
) -> tuple[
    int, list[tuple[str, frozenset[int], frozenset[int], dict[str, dict[int, Any]], tuple[MemoryBlock, ...]]]
]:
    doc = _load(text, key, _POD_KEYS, (FORMAT_VERSION, POD_MEMORY_VERSION, POD_NO_TOPOLOGY_VERSION))
    if "gen" not in doc or "containers" not in doc:
        raise InvalidInput(f"{key}: missing field 'gen' or 'containers'")
    rows = want_list(doc["containers"], f"{key}.containers")
    gen = want_int(doc["gen"], f"{key}.gen", 0)
    out = []
    for i, raw in enumerate(rows):
        where = f"{key}.containers[{i}]"
        row = want_object(raw, where)
        unknown = sorted(set(row) - _CONTAINER_KEYS)
        if unknown or "name" not in row:
            raise InvalidInput(
                f"{where}: unknown field {unknown[0]!r:.40}" if unknown else f"{where}: no name"
            )
        devices: dict[str, dict[int, Any]] = {}  # ids (tuples) or counts, checked by _check_pod
        for res, per_numa in want_object(row.get("devices", {}), f"{where}.devices").items():
            devices[res] = {}
            for n, v in want_object(per_numa, f"{where}.devices.{res}").items():
                if not _DEVICE_NUMA_KEY.match(n):
                    raise InvalidInput(f"{where}.devices.{res}: key {n!r:.20} is not a NUMA id")
                if ids:
                    items = want_list(v, f"{where}.devices.{res}.{n}")
                    devices[res][int(n)] = tuple(want_str(d, f"{where}.devices.{res}.{n}") for d in items)
                else:
                    devices[res][int(n)] = v
        out.append(
            (
                want_str(row["name"], f"{where}.name"),
                parse_cpu_list(row.get("numa", ""), f"{where}.numa"),
                parse_cpu_list(row.get("cpus", ""), f"{where}.cpus"),
                devices,
                _decode_memory_blocks(row.get("memory", {}), f"{where}.memory"),
            )
        )
    memory = any("memory" in row for row in rows)
    flat = any(NO_TOPOLOGY in per for row in out for per in row[3].values())
    if doc["v"] != _pod_version(memory, flat):
        raise InvalidInput(
            f"{key}: format version {doc['v']} does not match its content "
            "(2 with memory, 3 with a device without topology, else 1)"
        )
    return gen, out


def decode_placement(text: object) -> PodPlacement:
    """Parse ``hamid.io/numa-placement``; InvalidInput on anything malformed."""
    gen, rows = _decode_pod(text, NUMA_PLACEMENT, ids=True)
    containers = tuple(ContainerPlacement(*row) for row in rows)
    _check_pod(gen, containers, NUMA_PLACEMENT, ids=True)
    return PodPlacement(gen, containers)


def decode_prediction(text: object) -> PodPrediction:
    """Parse ``hamid.io/numa-predicted``; InvalidInput on anything malformed."""
    gen, rows = _decode_pod(text, NUMA_PREDICTED, ids=False)
    containers = tuple(ContainerPrediction(*row) for row in rows)
    _check_pod(gen, containers, NUMA_PREDICTED, ids=False)
    return PodPrediction(gen, containers)


#: Why a prediction missed: the ``cause`` of ``hamid_numa_prediction_misses_total``, in the
#: scheduler's metrics and the plugin's (docs/numa-prediction.md, "Scoring").
MISS_CAUSES = ("order", "foreign", "stale", "unmodelled")


def miss_cause(*, stale: bool, foreign_since: bool, own_since: bool) -> str:
    """The cause of a missed prediction, the first that applies (scheduler and plugin alike).

    ``stale``: the profile generation changed between prediction and admission; ``foreign_since``:
    a pod without a prediction (another scheduler's) came to hold CPUs or devices on the node since
    the prediction; ``own_since``: other predicted pods were admitted on the node since (kubelet took
    them in another order than the scheduler predicted them); otherwise ``unmodelled``.
    """
    if stale:
        return MISS_CAUSES[2]
    if foreign_since:
        return MISS_CAUSES[1]
    if own_since:
        return MISS_CAUSES[0]
    return MISS_CAUSES[3]
