"""The simulated node's hardware: CPUs (per NUMA node or from ``lscpu``), reserved CPUs, NUMA
distances, memory and GPUs.

A machine file is YAML (or JSON)::

    numaNodes:                       # per NUMA node: one thread per core, one socket per node
      - {id: 0, cpus: "0-31"}        # Linux cpuset syntax or a list of ids
      - {id: 1, cpus: "32-63"}
    lscpu: |                         # ... or, instead of numaNodes, the output of
      # CPU,Core,Socket,Node         #   lscpu -p=CPU,CORE,SOCKET,NODE (threads, cores, sockets)
      0,0,0,0
      1,1,0,0
    distances: [[10, 21], [21, 10]]  # optional: numactl -H's node distances, rows by NUMA id
    reservedCpus: "0,32"             # kubelet --reserved-cpus (or reservedSystemCPUs in --config)
    memory: 512Gi                    # node capacity (optional, default 256Gi)
    numaMemory: {0: 256Gi, 1: 256Gi} # optional: per NUMA node (sysfs node<N>/meminfo MemTotal);
                                     #   default: memory in equal shares; memory defaults to the sum
    hugepages: {0: {1Gi: 8}}         # optional: per NUMA node, page size -> pages
    pods: 110                        # node pod capacity (optional, default 110)
    devices:                         # exactly the entries of ``hamid plugin --devices-file``
      - {uuid: GPU-0, index: 0, name: NVIDIA A100, memoryMiB: 81920, numa: 0, pciBusId: "0000:17:00.0"}
    links: ...                       # optional GPU link matrix, passed unchanged to the devices file

Because ``devices`` uses the plugin's inventory format, the same file can be handed to
``hamid plugin --devices-file`` (the plugin's parser checks the entries here too: this module is a
fixture shared by both sides, not part of the simulated kubelet). Every GPU's ``numa`` must be one
of the machine's NUMA nodes (or ``-1`` for unknown).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from hamid.model.errors import InvalidInput
from hamid.plugin.discovery import PhysicalGpu, devices_document, parse_devices_text
from hamidsim.kubelet.cadvisor import (
    CpuTopology,
    MachineInfo,
    NodeMemory,
    NumaNode,
    check_distances,
    format_cpu_list,
    numa_nodes_of,
    parse_cpu_list,
    parse_lscpu,
    split_memory,
)
from hamidsim.kubelet.quantity import parse_quantity

_TOP_KEYS = (
    "numaNodes",
    "lscpu",
    "distances",
    "reservedCpus",
    "memory",
    "numaMemory",
    "hugepages",
    "pods",
    "devices",
    "links",
)
_NODE_KEYS = ("id", "cpus")
DEFAULT_MEMORY = "256Gi"
DEFAULT_PODS = 110
#: Sample machine files shipped in ``sim/hamidsim/data/`` (name → file name).
SAMPLES = {
    "2numa-8gpu": "machine-2numa-8gpu.yaml",
    "1numa-2gpu": "machine-1numa-2gpu.yaml",
    "smt-2socket-8gpu": "machine-smt-2socket-8gpu.yaml",
    "rtx-pro-6000-8gpu": "machine-rtx-pro-6000-8gpu.yaml",
    "16numa-8gpu": "machine-16numa-8gpu.yaml",
}

__all__ = ["SAMPLES", "Machine", "NumaNode", "load_machine_file", "parse_machine", "parse_machine_text"]


@dataclass(frozen=True, slots=True)
class Machine(MachineInfo):
    """A validated machine description: what kubelet sees plus the GPUs and their link matrix."""

    gpus: tuple[PhysicalGpu, ...] = ()
    links: Any = None

    def devices_document(self) -> dict[str, Any]:
        """The GPUs as a ``hamid plugin --devices-file`` document (``links`` passed through unchanged)."""
        return devices_document(self.gpus, self.links)

    def describe(self) -> str:
        """One line per NUMA node: its CPUs and GPUs."""
        lines = []
        for node in sorted(self.numa_nodes, key=lambda n: n.id):
            gpus = [g.uuid for g in self.gpus if g.numa == node.id]
            lines.append(f"NUMA {node.id}: CPUs {format_cpu_list(node.cpus)}; GPUs {', '.join(gpus) or '-'}")
        return "\n".join(lines)


def _cpus(value: Any, where: str) -> frozenset[int]:
    if isinstance(value, str):
        return parse_cpu_list(value, where)
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if isinstance(value, list):
        if not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in value):
            raise InvalidInput(f"{where}: CPU ids must be non-negative integers, got {value!r}")
        return frozenset(value)
    raise InvalidInput(f'{where}: want a CPU list like "0-31" or [0, 1, 2], got {value!r}')


def _numa_nodes(raw_nodes: Any, source: str) -> CpuTopology:
    if not isinstance(raw_nodes, list) or not raw_nodes:
        raise InvalidInput(f"{source}: 'numaNodes' must be a non-empty list (or give 'lscpu')")
    nodes: dict[int, frozenset[int]] = {}
    owner: dict[int, int] = {}
    for position, item in enumerate(raw_nodes):
        where = f"{source}: numaNodes[{position}]"
        if not isinstance(item, Mapping):
            raise InvalidInput(f"{where}: expected a mapping with 'id' and 'cpus'")
        bad = sorted(set(item) - set(_NODE_KEYS))
        if bad:
            raise InvalidInput(f"{where}: unknown keys {bad}; allowed: {list(_NODE_KEYS)}")
        node_id = item.get("id")
        if isinstance(node_id, bool) or not isinstance(node_id, int) or not 0 <= node_id < 64:
            raise InvalidInput(f"{where}: id must be an integer in 0..63, got {node_id!r}")
        if node_id in nodes:
            raise InvalidInput(f"{where}: duplicate NUMA node id {node_id}")
        if "cpus" not in item:
            raise InvalidInput(f"{where}: missing 'cpus'")
        cpus = _cpus(item["cpus"], f"{where}.cpus")
        if not cpus:
            raise InvalidInput(f"{where}: NUMA node {node_id} has no CPUs")
        for cpu in sorted(cpus):
            if cpu in owner:
                raise InvalidInput(f"{where}: CPU {cpu} is already on NUMA node {owner[cpu]}")
            owner[cpu] = node_id
        nodes[node_id] = cpus
    return CpuTopology.from_numa(nodes)


def _topology(doc: Mapping[str, Any], source: str) -> CpuTopology:
    has_lscpu, has_nodes = "lscpu" in doc, "numaNodes" in doc
    if has_lscpu and has_nodes:
        raise InvalidInput(f"{source}: give either 'numaNodes' or 'lscpu', not both")
    if has_lscpu:
        if not isinstance(doc["lscpu"], str):
            raise InvalidInput(
                f"{source}: 'lscpu' is the text of lscpu -p=CPU,CORE,SOCKET,NODE as a block (|)"
            )
        return parse_lscpu(doc["lscpu"], f"{source}: lscpu")
    return _numa_nodes(doc.get("numaNodes"), source)


def _bytes(value: Any, where: str) -> int:
    if isinstance(value, bool):
        raise InvalidInput(f"{where}: want a quantity like 256Gi, got {value!r}")
    amount = parse_quantity(str(value), where)
    if amount <= 0 or amount.denominator != 1:
        raise InvalidInput(f"{where}: want a positive whole number of bytes like 256Gi, got {value!r}")
    return int(amount)


def _per_numa(doc: Mapping[str, Any], key: str, numa_ids: list[int], source: str) -> dict[int, Any]:
    raw = doc.get(key) or {}
    if not isinstance(raw, Mapping):
        raise InvalidInput(f"{source}: {key} maps NUMA node ids to values")
    result: dict[int, Any] = {}
    for node, value in raw.items():
        text = str(node) if isinstance(node, int | str) else ""
        node_id = int(text) if text.isascii() and text.isdigit() else -1
        if node_id not in numa_ids:
            raise InvalidInput(f"{source}: {key}: {node!r} is not one of the NUMA nodes {numa_ids}")
        result[node_id] = value
    return result


def _node_memory(doc: Mapping[str, Any], numa_ids: list[int], source: str) -> tuple[NodeMemory, ...]:
    """``numaMemory`` and ``hugepages`` per NUMA node (empty when neither is given)."""
    memory = {
        n: _bytes(v, f"{source}: numaMemory.{n}")
        for n, v in _per_numa(doc, "numaMemory", numa_ids, source).items()
    }
    pages: dict[int, tuple[tuple[int, int], ...]] = {}
    for node, sizes in _per_numa(doc, "hugepages", numa_ids, source).items():
        if not isinstance(sizes, Mapping):
            raise InvalidInput(f"{source}: hugepages.{node} maps page sizes (2Mi, 1Gi) to page counts")
        entries = []
        for size, count in sizes.items():
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise InvalidInput(f"{source}: hugepages.{node}.{size}: want a page count, got {count!r}")
            entries.append((_bytes(size, f"{source}: hugepages.{node} page size"), count))
        pages[node] = tuple(sorted(entries))
    if not memory and not pages:
        return ()
    if memory and set(memory) != set(numa_ids):
        raise InvalidInput(f"{source}: numaMemory must name every NUMA node {numa_ids}")
    if not memory:
        total = _bytes(doc.get("memory", DEFAULT_MEMORY), f"{source}: memory")
        memory = {n.numa: n.memory for n in split_memory(total, numa_ids)}
    nodes = tuple(NodeMemory(n, memory[n], pages.get(n, ())) for n in numa_ids)
    for entry in nodes:
        if sum(s * c for s, c in entry.hugepages) > entry.memory:
            raise InvalidInput(f"{source}: hugepages of NUMA node {entry.numa} exceed its memory")
    return nodes


def _scalars(doc: Mapping[str, Any], source: str) -> tuple[str, int]:
    memory = doc.get("memory", DEFAULT_MEMORY)
    if isinstance(memory, bool) or parse_quantity(str(memory), f"{source}: memory") <= 0:
        raise InvalidInput(f"{source}: memory must be a positive quantity like 512Gi, got {memory!r}")
    pods = doc.get("pods", DEFAULT_PODS)
    if isinstance(pods, bool) or not isinstance(pods, int) or pods <= 0:
        raise InvalidInput(f"{source}: pods must be a positive integer, got {pods!r}")
    return str(memory), pods


def parse_machine(doc: Any, text: str, source: str = "<machine file>") -> Machine:
    """Validate a decoded machine document (``text`` is its source text, for the GPU entries)."""
    if not isinstance(doc, Mapping):
        raise InvalidInput(
            f"{source}: expected a mapping with 'numaNodes' or 'lscpu' (and 'devices', 'reservedCpus')"
        )
    unknown = sorted(set(doc) - set(_TOP_KEYS))
    if unknown:
        raise InvalidInput(f"{source}: unknown keys {unknown}; allowed: {list(_TOP_KEYS)}")
    topology = _topology(doc, source)
    numa_ids = topology.numa_nodes
    distances: tuple[tuple[int, ...], ...] = ()
    if doc.get("distances") is not None:
        raw = doc["distances"]
        if not isinstance(raw, list) or not all(isinstance(row, list) for row in raw):
            raise InvalidInput(f"{source}: distances is a list of rows, one per NUMA node")
        check_distances(raw, numa_ids, f"{source}: distances")
        distances = tuple(tuple(row) for row in raw)
    reserved = _cpus(doc.get("reservedCpus", []), f"{source}: reservedCpus")
    outside = sorted(reserved - topology.cpus)
    if outside:
        raise InvalidInput(f"{source}: reservedCpus {format_cpu_list(outside)} are on no NUMA node")
    if reserved == topology.cpus:
        raise InvalidInput(f"{source}: reservedCpus cover every CPU; nothing is left for pods")
    memory, pods = _scalars(doc, source)
    node_memory = _node_memory(doc, sorted(numa_ids), source)
    if "numaMemory" in doc:
        total = sum(n.memory for n in node_memory)
        if "memory" in doc and _bytes(doc["memory"], f"{source}: memory") != total:
            raise InvalidInput(
                f"{source}: memory {doc['memory']} is not the sum of numaMemory ({total} bytes)"
            )
        memory = str(total)
    gpus: tuple[PhysicalGpu, ...] = ()
    if doc.get("devices") is not None:
        gpus = tuple(parse_devices_text(text, source))
    for gpu in gpus:
        if gpu.numa is not None and gpu.numa not in numa_ids:
            raise InvalidInput(
                f"{source}: GPU {gpu.uuid} is on NUMA node {gpu.numa}, which is not in numaNodes "
                f"{sorted(numa_ids)} (use -1 for unknown)"
            )
    return Machine(
        numa_nodes=numa_nodes_of(topology),
        reserved_cpus=reserved,
        cpu_topology=topology,
        memory=memory,
        pods=pods,
        distances=distances,
        node_memory=node_memory,
        gpus=gpus,
        links=doc.get("links"),
    )


def parse_machine_text(text: str, source: str = "<machine file>") -> Machine:
    """Parse a machine file's text (YAML or JSON)."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InvalidInput(f"{source}: not valid YAML/JSON: {exc}") from exc
    return parse_machine(doc, text, source)


def load_machine_file(path: str | os.PathLike[str]) -> Machine:
    """Read and validate a machine file (blocking file read: call it in a thread from async code)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"cannot read machine file {os.fspath(path)!r}: {exc}") from exc
    return parse_machine_text(text, os.fspath(path))


def sample_machine_path(name: str = "2numa-8gpu") -> Path:
    """The path of a sample machine file shipped with hamid (see :data:`SAMPLES`)."""
    if name not in SAMPLES:
        raise InvalidInput(f"unknown sample machine {name!r}; choose one of {sorted(SAMPLES)}")
    return Path(str(resources.files("hamidsim") / "data" / SAMPLES[name]))
