"""What kubelet learns about its node from cAdvisor's ``MachineInfo``: CPUs with their core, socket and
NUMA node, NUMA distances, memory and pod capacity.

kubelet builds its CPU topology (``cpumanager/topology.Discover``) from this: a CPU's core id is the
lowest CPU id among its thread siblings, sockets and NUMA nodes are taken as reported. The machine
can be given per NUMA node (``{id: 0, cpus: "0-31"}``: one thread per core, one socket per NUMA
node) or as the output of ``lscpu -p=CPU,CORE,SOCKET,NODE`` (real threads, cores and sockets).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from hamid.model.errors import InvalidInput
from hamidsim.kubelet.quantity import quantity_value

#: Linux's distance to the local node and to any remote node when the firmware reports no SLIT.
LOCAL_DISTANCE = 10
REMOTE_DISTANCE = 20
LSCPU_COLUMNS = ("CPU", "CORE", "SOCKET", "NODE")
#: ``lscpu -p=CPU,CORE,SOCKET,NODE,CACHE``: the cache column (``L1d:L1i:L2:L3`` ids) adds the
#: uncore cache, the last (L3) id.
LSCPU_COLUMNS_WITH_CACHE = (*LSCPU_COLUMNS, "CACHE")


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
        if last - first > 65536:
            raise InvalidInput(f"{where}: range {item!r} is implausibly large")
        cpus.update(range(first, last + 1))
    return frozenset(cpus)


@dataclass(frozen=True, slots=True)
class CpuInfo:
    """One logical CPU: kubelet's ``CPUInfo`` (core id = lowest CPU id of the physical core)."""

    core: int
    socket: int
    numa: int
    #: ``UncoreCacheID``: the CPU's last-level (L3) cache; None when cAdvisor reports none, where
    #: kubelet falls back to the socket id (``getUncoreCacheID``).
    uncore: int | None = None

    @property
    def uncore_id(self) -> int:
        """The uncore cache id kubelet uses."""
        return self.socket if self.uncore is None else self.uncore


class CpuTopology:
    """kubelet's ``CPUTopology``: every CPU with its core, socket and NUMA node."""

    def __init__(self, details: Mapping[int, CpuInfo]) -> None:
        if not details:
            raise InvalidInput("a CPU topology needs at least one CPU")
        self.details: dict[int, CpuInfo] = dict(sorted(details.items()))

    @classmethod
    def from_numa(cls, numa_cpus: Mapping[int, Iterable[int]]) -> CpuTopology:
        """One thread per core and one socket per NUMA node (machine files without ``lscpu``)."""
        return cls({cpu: CpuInfo(cpu, node, node) for node, cpus in numa_cpus.items() for cpu in cpus})

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CpuTopology) and self.details == other.details

    def __hash__(self) -> int:
        return hash(tuple(self.details.items()))

    @cached_property
    def numa_cpus(self) -> dict[int, frozenset[int]]:
        """CPU ids per NUMA node."""
        result: dict[int, set[int]] = {}
        for cpu, info in self.details.items():
            result.setdefault(info.numa, set()).add(cpu)
        return {n: frozenset(c) for n, c in sorted(result.items())}

    @cached_property
    def core_cpus(self) -> dict[int, frozenset[int]]:
        """Thread siblings per core id."""
        result: dict[int, set[int]] = {}
        for cpu, info in self.details.items():
            result.setdefault(info.core, set()).add(cpu)
        return {c: frozenset(s) for c, s in sorted(result.items())}

    @cached_property
    def uncore_cpus(self) -> dict[int, frozenset[int]]:
        """CPU ids per uncore (L3) cache."""
        result: dict[int, set[int]] = {}
        for cpu, info in self.details.items():
            result.setdefault(info.uncore_id, set()).add(cpu)
        return {u: frozenset(c) for u, c in sorted(result.items())}

    @cached_property
    def socket_cpus(self) -> dict[int, frozenset[int]]:
        """CPU ids per socket."""
        result: dict[int, set[int]] = {}
        for cpu, info in self.details.items():
            result.setdefault(info.socket, set()).add(cpu)
        return {s: frozenset(c) for s, c in sorted(result.items())}

    @property
    def cpus(self) -> frozenset[int]:
        """Every CPU id."""
        return frozenset(self.details)

    @property
    def numa_nodes(self) -> list[int]:
        """NUMA node ids in ascending order."""
        return list(self.numa_cpus)

    @property
    def sockets(self) -> list[int]:
        """Socket ids in ascending order."""
        return list(self.socket_cpus)

    def cpus_per_core(self) -> int:
        """``CPUsPerCore``: threads per core (CPUs / cores, as kubelet computes it)."""
        return len(self.details) // len(self.core_cpus)

    def cpus_per_socket(self) -> int:
        """``CPUsPerSocket``."""
        return len(self.details) // len(self.socket_cpus)

    def cpus_in(self, nodes: Iterable[int]) -> frozenset[int]:
        """All CPUs of the given NUMA nodes."""
        return frozenset().union(*(self.numa_cpus.get(n, frozenset()) for n in nodes))

    def cpus_in_sockets(self, sockets: Iterable[int]) -> frozenset[int]:
        """All CPUs of the given sockets."""
        return frozenset().union(*(self.socket_cpus.get(s, frozenset()) for s in sockets))

    def sockets_in_numa(self, nodes: Iterable[int]) -> frozenset[int]:
        """Sockets holding CPUs of the given NUMA nodes."""
        wanted = set(nodes)
        return frozenset(i.socket for i in self.details.values() if i.numa in wanted)

    def siblings(self, cpus: Iterable[int]) -> frozenset[int]:
        """The given CPUs and every thread sibling of theirs."""
        return frozenset().union(*(self.core_cpus[self.details[c].core] for c in cpus if c in self.details))

    def describe(self) -> str:
        """``2 sockets, 2 NUMA nodes, 64 cores, 128 CPUs`` (for logs and the demo)."""
        return (
            f"{len(self.socket_cpus)} sockets, {len(self.numa_cpus)} NUMA nodes, "
            f"{len(self.core_cpus)} cores, {len(self.details)} CPUs"
        )


def _lscpu_row(line: str, number: int, where: str) -> tuple[int, int, int, int, int | None]:
    """``CPU,CORE,SOCKET,NODE[,CACHE]`` of one line (an empty NODE is 0; CACHE's last id is L3)."""
    fields = [f.strip() for f in line.split(",")]
    cache = fields[4].split(":")[-1] if len(fields) == 5 else ""
    if (
        len(fields) not in (4, 5)
        or not all(f.isascii() and f.isdigit() for f in fields[:3])
        or not ((fields[3].isascii() and fields[3].isdigit()) or not fields[3])
        or not ((cache.isascii() and cache.isdigit()) or not cache)
    ):
        raise InvalidInput(f"{where}: line {number} {line!r} is not CPU,CORE,SOCKET,NODE[,CACHE] (integers)")
    cpu, core, socket = (int(f) for f in fields[:3])
    node = int(fields[3]) if fields[3] else 0
    if node >= 64:
        raise InvalidInput(f"{where}: line {number}: NUMA node {node} is out of range 0..63")
    return cpu, core, socket, node, int(cache) if cache else None


def parse_lscpu(text: str, where: str = "lscpu") -> CpuTopology:
    """The output of ``lscpu -p=CPU,CORE,SOCKET,NODE`` (comment lines allowed), optionally with a
    fifth column ``CACHE`` (``lscpu -p=CPU,CORE,SOCKET,NODE,CACHE``) giving the uncore cache."""
    rows: dict[int, tuple[int, int, int, int | None]] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            header = tuple(c.strip().upper() for c in line.lstrip("#").split(","))
            if (
                len(header) >= 4
                and header[0] == "CPU"
                and header not in (LSCPU_COLUMNS, LSCPU_COLUMNS_WITH_CACHE)
            ):
                raise InvalidInput(
                    f"{where}: columns {list(header)}; run lscpu -p=CPU,CORE,SOCKET,NODE[,CACHE]"
                )
            continue
        cpu, core, socket, node, uncore = _lscpu_row(line, number, where)
        if cpu in rows:
            raise InvalidInput(f"{where}: line {number}: CPU {cpu} is listed twice")
        rows[cpu] = (core, socket, node, uncore)
    if not rows:
        raise InvalidInput(f"{where}: no CPU lines")
    threads: dict[tuple[int, int], list[int]] = {}
    for cpu, (core, socket, _, _) in rows.items():
        threads.setdefault((socket, core), []).append(cpu)
    details: dict[int, CpuInfo] = {}
    for (socket, _), cpus in threads.items():
        nodes = {rows[c][2] for c in cpus}
        if len(nodes) != 1:
            raise InvalidInput(
                f"{where}: the threads {sorted(cpus)} of one core are on NUMA nodes {sorted(nodes)}"
            )
        for cpu in cpus:
            details[cpu] = CpuInfo(min(cpus), socket, rows[cpu][2], rows[cpu][3])
    return CpuTopology(details)


@dataclass(frozen=True, slots=True)
class NumaNode:
    """One NUMA node and the CPU ids on it."""

    id: int
    cpus: frozenset[int]


@dataclass(frozen=True, slots=True)
class NodeMemory:
    """What cAdvisor reports for one NUMA node: its memory (``node<N>/meminfo`` MemTotal) and its
    hugepages as (page size, pages) in bytes (``node<N>/hugepages/hugepages-<kB>kB/nr_hugepages``)."""

    numa: int
    memory: int
    hugepages: tuple[tuple[int, int], ...] = ()


def split_memory(total: int, numa_ids: Sequence[int]) -> tuple[NodeMemory, ...]:
    """``total`` bytes in equal shares over the NUMA nodes, the rest on the last one."""
    share = total // len(numa_ids)
    rest = total - share * len(numa_ids)
    return tuple(NodeMemory(n, share + (rest if n == numa_ids[-1] else 0)) for n in numa_ids)


@dataclass(frozen=True, slots=True)
class MachineInfo:
    """The node as kubelet sees it (cAdvisor ``MachineInfo`` plus the machine's ``reservedCpus``)."""

    numa_nodes: tuple[NumaNode, ...]
    reserved_cpus: frozenset[int]
    cpu_topology: CpuTopology
    memory: str = "256Gi"
    pods: int = 110
    #: ``distances[a][b]``: the SLIT distance between NUMA nodes (index = position in ``numa_ids``).
    distances: tuple[tuple[int, ...], ...] = field(default=())
    #: Memory and hugepages per NUMA node; empty: ``memory`` split evenly, no hugepages.
    node_memory: tuple[NodeMemory, ...] = field(default=())

    def memory_per_numa(self) -> tuple[NodeMemory, ...]:
        """Memory per NUMA node: as given, else the capacity in equal shares."""
        return self.node_memory or split_memory(quantity_value(self.memory, "machine memory"), self.numa_ids)

    @property
    def numa_ids(self) -> list[int]:
        """NUMA node ids, ascending."""
        return sorted(n.id for n in self.numa_nodes)

    @property
    def all_cpus(self) -> frozenset[int]:
        """Every CPU id of the machine."""
        return self.cpu_topology.cpus

    def distance(self, a: int, b: int) -> int:
        """The NUMA distance between nodes ``a`` and ``b`` (Linux's 10/20 when none were given)."""
        ids = self.numa_ids
        if self.distances:
            return self.distances[ids.index(a)][ids.index(b)]
        return LOCAL_DISTANCE if a == b else REMOTE_DISTANCE


def numa_nodes_of(topology: CpuTopology) -> tuple[NumaNode, ...]:
    """The NUMA nodes of a CPU topology."""
    return tuple(NumaNode(n, cpus) for n, cpus in topology.numa_cpus.items())


def check_distances(distances: Sequence[Sequence[int]], numa_ids: Sequence[int], where: str) -> None:
    """A square matrix over the NUMA nodes, 10 on the diagonal, symmetric, larger off the diagonal."""
    size = len(numa_ids)
    if len(distances) != size or any(len(row) != size for row in distances):
        raise InvalidInput(f"{where}: want a {size}x{size} matrix (one row per NUMA node {list(numa_ids)})")
    for i, row in enumerate(distances):
        for j, value in enumerate(row):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 256:
                raise InvalidInput(f"{where}[{i}][{j}]: a distance is an integer in 1..255, got {value!r}")
            if i == j and value != LOCAL_DISTANCE:
                raise InvalidInput(f"{where}[{i}][{i}]: a node's distance to itself is {LOCAL_DISTANCE}")
            if i != j and (value != distances[j][i] or value <= LOCAL_DISTANCE):
                raise InvalidInput(f"{where}[{i}][{j}]: remote distances are symmetric and above 10")
