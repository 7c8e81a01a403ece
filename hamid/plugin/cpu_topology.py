"""The node's CPU topology as kubelet sees it, read from sysfs (blocking: call it in a thread).

kubelet learns its topology from cAdvisor, which reads ``cpu*/topology/{core_id,physical_package_id}``
and ``node*/cpulist``; a core's id is the lowest CPU id of its threads (``topology.Discover``).
NUMA distances come from ``node*/distance``; a CPU's uncore cache from ``cpu*/cache/index3/id`` and
``shared_cpu_list`` (the L3 cache cAdvisor reports; kubelet falls back to the socket id without one,
``getUncoreCacheID``). ``root`` is the sysfs mount (``/sys`` on a node, a
generated tree under the simulator and in tests).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from hamid.model._wire import is_decimal
from hamid.model.errors import InvalidInput
from hamid.model.numa import MAX_CPU_ID, MAX_NUMA_ID, CpuInfo
from hamid.plugin.hostfiles import read_text

_NODE_DIR = re.compile(r"node(0|[1-9][0-9]*)\Z")
_RANGE = re.compile(r"(\d+)(?:-(\d+))?\Z")
#: Upper bound on one sysfs file read (a cpulist of 64 Ki CPUs is far smaller).
_MAX_FILE_BYTES = 1 << 16


@dataclass(frozen=True, slots=True)
class CpuTopology:
    """Every online CPU with its core, socket, NUMA node and uncore cache, and the NUMA distances
    (None: unknown). Uncore caches that cannot be read leave every CPU's ``uncore`` None and say
    why in ``uncore_error`` (only ``prefer-align-cpus-by-uncorecache`` needs them)."""

    numa_nodes: tuple[int, ...]
    cpus: tuple[CpuInfo, ...]
    distances: tuple[tuple[int, ...], ...] | None
    uncore_error: str | None = None


def parse_sysfs_cpu_list(text: str, where: str) -> frozenset[int]:
    """The kernel's cpulist format (``0-3,8``, possibly with a trailing newline; empty allowed)."""
    value = text.strip()
    if not value:
        return frozenset()
    cpus: set[int] = set()
    for token in value.split(","):
        m = _RANGE.match(token.strip())
        if not m:
            raise InvalidInput(f"{where}: {token!r:.40} is not a CPU id or range")
        lo, hi = int(m[1]), int(m[2] if m[2] is not None else m[1])
        if hi < lo or hi > MAX_CPU_ID:
            raise InvalidInput(f"{where}: range {token!r:.40} is reversed or above CPU {MAX_CPU_ID}")
        cpus.update(range(lo, hi + 1))
    return frozenset(cpus)


def _read(path: Path) -> str:
    try:
        return read_text(path, _MAX_FILE_BYTES, "ascii")
    except OSError as exc:
        raise InvalidInput(f"cannot read {path}: {exc.strerror or exc}") from exc


def _read_int(path: Path) -> int:
    text = _read(path).strip()
    if not re.fullmatch(r"-?\d{1,9}", text):
        raise InvalidInput(f"{path}: {text!r:.40} is not an integer")
    return int(text)


def _uncore(cpu_dir: Path, socket: int) -> tuple[int, frozenset[int] | None]:
    """kubelet's uncore cache id of a CPU and the CPUs sharing that cache: its L3 cache's ``id`` and
    ``shared_cpu_list``; the socket id (and no list) when it has no L3."""
    cache = cpu_dir / "cache" / "index3"
    if not cache.is_dir():
        return socket, None
    shared = cache / "shared_cpu_list"
    return _read_int(cache / "id"), parse_sysfs_cpu_list(_read(shared), str(shared))


def _uncore_caches(base: Path, socket_of: dict[int, int]) -> tuple[dict[int, int], str | None]:
    """Each online CPU's uncore cache id, or ``{}`` and why they cannot be read."""
    uncore_of: dict[int, int] = {}
    shared: dict[int, frozenset[int]] = {}
    try:
        for cpu, socket in socket_of.items():
            uncore_of[cpu], sharing = _uncore(base / "devices" / "system" / "cpu" / f"cpu{cpu}", socket)
            if sharing is not None:
                shared[cpu] = sharing
        _check_uncore(uncore_of, shared, frozenset(socket_of))
    except InvalidInput as exc:
        return {}, str(exc)
    return uncore_of, None


def _check_uncore(
    uncore_of: dict[int, int], shared: dict[int, frozenset[int]], online: frozenset[int]
) -> None:
    """Every L3's online sharers carry its id (ids and lists from the kernel must agree)."""
    for cpu, cpus in shared.items():
        same_id = {c for c, u in uncore_of.items() if u == uncore_of[cpu]}
        if cpus & online != same_id:
            raise InvalidInput(
                f"cpu{cpu}/cache/index3: shared_cpu_list {sorted(cpus & online)} is not the CPUs of "
                f"cache id {uncore_of[cpu]} ({sorted(same_id)})"
            )


def _numa_cpus(root: Path) -> dict[int, frozenset[int]]:
    node_dir = root / "devices" / "system" / "node"
    try:
        entries = sorted(node_dir.iterdir())
    except OSError as exc:
        raise InvalidInput(f"cannot list {node_dir}: {exc.strerror or exc}") from exc
    nodes: dict[int, frozenset[int]] = {}
    for entry in entries:
        m = _NODE_DIR.match(entry.name)
        if not m:
            continue
        node = int(m[1])
        if node > MAX_NUMA_ID:
            raise InvalidInput(f"{entry}: NUMA node id above {MAX_NUMA_ID}")
        nodes[node] = parse_sysfs_cpu_list(_read(entry / "cpulist"), str(entry / "cpulist"))
    if not nodes:
        raise InvalidInput(f"{node_dir}: no NUMA nodes")
    return dict(sorted(nodes.items()))


def _online(root: Path, listed: frozenset[int]) -> frozenset[int]:
    path = root / "devices" / "system" / "cpu" / "online"
    if not path.exists():
        return listed
    return listed & parse_sysfs_cpu_list(_read(path), str(path))


def _distances(root: Path, nodes: tuple[int, ...]) -> tuple[tuple[int, ...], ...] | None:
    """``node*/distance`` rows (one entry per node, in id order); None when any file is missing."""
    rows: list[tuple[int, ...]] = []
    for node in nodes:
        path = root / "devices" / "system" / "node" / f"node{node}" / "distance"
        if not path.exists():
            return None
        fields = _read(path).split()
        if len(fields) != len(nodes) or not all(is_decimal(f) and int(f) <= 255 for f in fields):
            raise InvalidInput(f"{path}: want {len(nodes)} distances of 0-255, got {' '.join(fields):.60}")
        rows.append(tuple(int(f) for f in fields))
    return tuple(rows)


def read_cpu_topology(root: str | Path) -> CpuTopology:
    """Read the topology under sysfs ``root``; InvalidInput saying which file is missing or malformed."""
    base = Path(root)
    numa_cpus = _numa_cpus(base)
    numa_of: dict[int, int] = {}
    for node, cpus in numa_cpus.items():
        for cpu in cpus:
            if cpu in numa_of:
                raise InvalidInput(f"CPU {cpu} is listed on NUMA nodes {numa_of[cpu]} and {node}")
            numa_of[cpu] = node
    online = _online(base, frozenset(numa_of))
    if not online:
        raise InvalidInput(f"{base}: no online CPU is on a NUMA node")
    threads: dict[tuple[int, int, int], list[int]] = {}
    socket_of: dict[int, int] = {}
    for cpu in sorted(online):
        topo = base / "devices" / "system" / "cpu" / f"cpu{cpu}" / "topology"
        core_id, socket = _read_int(topo / "core_id"), _read_int(topo / "physical_package_id")
        socket_of[cpu] = socket
        threads.setdefault((numa_of[cpu], socket, core_id), []).append(cpu)
    core_of = {cpu: min(group) for group in threads.values() for cpu in group}
    uncore_of, uncore_error = _uncore_caches(base, socket_of)
    infos = tuple(CpuInfo(c, core_of[c], socket_of[c], numa_of[c], uncore_of.get(c)) for c in sorted(online))
    nodes = tuple(numa_cpus)
    return CpuTopology(nodes, infos, _distances(base, nodes), uncore_error)
