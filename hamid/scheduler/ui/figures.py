"""The figures of the web view, computed from a :class:`~.source.UiSource` (read-only, no I/O).

Definitions (``docs/ui.md`` explains them to operators):

- a GPU is *allocated* when a pod books a slot on it, *idle* when healthy and unbooked;
- a pod is *aligned* when every container holding GPUs has all of them on the NUMA node(s) of
  the exclusive CPUs kubelet gave that container (its observed ``hamid.io/numa-placement`` read
  with the node's NUMA profile; without exclusive CPUs, of its pinned memory), *unaligned* when
  one GPU is elsewhere, *unknown* while nothing was observed (or the placement is unreadable) or
  when a GPU-holding container has neither exclusive CPUs nor pinned memory (its CPUs are the
  shared pool, on every NUMA node: nothing to be aligned with);
- the *typical aligned pod* takes one GPU and, per GPU, the median number of exclusive CPUs
  that the aligned pods of the cluster hold per GPU (rounded up; :data:`DEFAULT_TYPICAL_CPUS`
  when no aligned pod holds exclusive CPUs);
- an idle GPU is *stranded* when its NUMA node has fewer free exclusive CPUs (the node's NUMA
  ledger) than the typical aligned pod needs: an aligned pod cannot use it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hamid.fit.numa_predict import (
    DEFAULT_PROFILE_MAX_AGE_S,
    UNKNOWN_PROFILE_MISSING,
    UNKNOWN_PROFILE_STALE,
    UNKNOWN_UNMODELLED,
    unmodelled_reason,
)
from hamid.model import objects
from hamid.model.devices import DeviceInfo, PodDevices
from hamid.model.errors import InvalidInput
from hamid.model.kube import PodBody
from hamid.model.numa import (
    MISS_CAUSES,
    NUMA_PLACEMENT,
    ContainerPlacement,
    NumaProfile,
    PodPlacement,
    decode_placement,
)
from hamid.model.resources import all_containers
from hamid.scheduler.inventory import NodeEntry
from hamid.scheduler.numa_ledger import HIT, MISS, UNKNOWN, NodeNuma
from hamid.scheduler.ui.source import Counted, UiSource

ALIGNED, UNALIGNED = "aligned", "unaligned"
ALIGNMENTS = (ALIGNED, UNALIGNED, UNKNOWN)
#: Exclusive CPUs per GPU of the typical aligned pod when no aligned pod holds exclusive CPUs.
DEFAULT_TYPICAL_CPUS = 1
PROFILE_OK = "ok"
PROFILE_INVALID = "profile-invalid"
#: The node list's sortable columns (the first is the default order).
SORT_KEYS = (
    "name",
    "gpus",
    "allocated",
    "idle",
    "stranded",
    "aligned",
    "unaligned",
    "unknown",
    "pods",
    "profile",
)


@dataclass(frozen=True, slots=True)
class Alignment:
    """A GPU pod's alignment and, unless aligned, why."""

    state: str
    why: str = ""
    #: An aligned pod's exclusive CPUs per GPU (rounded up): a sample of the typical aligned pod.
    cpus_per_gpu: int | None = None


def profile_state(numa: NodeNuma | None, now: float) -> tuple[str, str]:
    """``(code, message)``: ``ok``, or why a NUMA prediction on the node answers ``unknown``.

    The same checks, in the same order, as :func:`hamid.fit.numa_predict.predict` makes before
    it looks at a pod, plus the ledger's own state (records it could not book).
    """
    if numa is None or (numa.profile is None and not numa.profile_raw):
        return UNKNOWN_PROFILE_MISSING, "the node publishes no NUMA profile (hamid.io/numa-profile)"
    profile = numa.profile
    if profile is None:
        return PROFILE_INVALID, "the node's hamid.io/numa-profile cannot be decoded"
    if now - profile.observed_at > DEFAULT_PROFILE_MAX_AGE_S:
        return UNKNOWN_PROFILE_STALE, f"the NUMA profile is older than {DEFAULT_PROFILE_MAX_AGE_S:.0f} s"
    if numa.ledger is None:
        return UNKNOWN_PROFILE_STALE, "the NUMA ledger could not be built for the node's GPUs and profile"
    if numa.unbooked:
        return UNKNOWN_PROFILE_STALE, f"the NUMA ledger disagrees with {numa.unbooked} pod(s)"
    why = unmodelled_reason(profile)
    if why is not None:
        return UNKNOWN_UNMODELLED, why
    return PROFILE_OK, ""


def placement_of(pod: PodBody) -> PodPlacement | str:
    """The pod's observed placement, or why there is none."""
    raw = objects.annotations(pod).get(NUMA_PLACEMENT)
    if not raw:
        return "kubelet's placement is not observed yet (no hamid.io/numa-placement)"
    try:
        return decode_placement(raw)
    except InvalidInput as exc:
        return f"hamid.io/numa-placement cannot be decoded: {exc}"


def has_gpus(layout: PodDevices) -> bool:
    """Whether an allocation holds any GPU."""
    return any(layout)


def alignment(
    pod: PodBody, layout: PodDevices, infos: Mapping[str, DeviceInfo], profile: NumaProfile | None
) -> Alignment:
    """Whether each GPU-holding container's GPUs sit on the NUMA node(s) of its exclusive CPUs.

    An unaligned container decides (a pod is unaligned if any container is), then one that
    cannot be judged (unknown), else the pod is aligned.
    """
    placement = placement_of(pod)
    if isinstance(placement, str):
        return Alignment(UNKNOWN, placement)
    placed = {c.name: c for c in placement.containers}
    names = [str(c.get("name") or "") for c in all_containers(pod)]
    unknown = ""
    for index, devices in enumerate(layout):
        if not devices:
            continue
        name = names[index] if index < len(names) else f"#{index}"
        if any(d.uuid not in infos for d in devices):
            unknown = unknown or f"container {name}: a GPU is not registered on the node"
            continue
        home = home_numa(placed.get(name), profile)
        if isinstance(home, str):
            unknown = unknown or f"container {name}: {home}"
            continue
        numa, what = home
        gpus = {infos[d.uuid].numa for d in devices}
        if not gpus <= numa:
            return Alignment(
                UNALIGNED,
                f"container {name}: GPUs on NUMA {_list(sorted(gpus))}, its {what} on NUMA "
                f"{_list(sorted(numa))}",
            )
    if unknown:
        return Alignment(UNKNOWN, unknown)
    held = sum(len(devices) for devices in layout)
    cpus = sum(len(c.cpus) for c in placement.containers)
    return Alignment(ALIGNED, "", math.ceil(cpus / held) if held else None)


def home_numa(
    container: ContainerPlacement | None, profile: NumaProfile | None
) -> tuple[frozenset[int], str] | str:
    """The NUMA node(s) kubelet tied a container to and by what, or why there are none.

    Its exclusive CPUs' NUMA nodes; without exclusive CPUs, its pinned memory's. Never the
    placement's ``numa`` as such: node agents add the NUMA nodes of the container's
    topology-aware devices to it (docs/numa-prediction.md), its GPUs' own among them, against
    which every GPU would look aligned.
    """
    if container is None:
        return "kubelet's placement does not list it"
    if container.cpus:
        if profile is None:
            if container.devices or container.memory:
                return "the node publishes no NUMA profile: its CPUs' NUMA nodes are not known"
            return container.numa, "exclusive CPUs"  # nothing but the CPUs in it
        numa_of = _cpu_numa(profile)
        missing = sorted(container.cpus.difference(numa_of))
        if missing:
            return f"its CPU {missing[0]} is not in the node's NUMA profile"
        return frozenset(numa_of[c] for c in container.cpus), "exclusive CPUs"
    memory = frozenset(n for block in container.memory for n in block.numa)
    if memory:
        return memory, "pinned memory"
    return "it holds no exclusive CPUs or pinned memory (its CPUs are the shared pool, on every NUMA node)"


class _CpuNuma:
    """CPU → NUMA node of a profile, kept for the profile asked last: a node's pods share one
    profile, so a snapshot builds the table once per node, not once per pod."""

    def __init__(self) -> None:
        self._profile: NumaProfile | None = None
        self._table: dict[int, int] = {}

    def __call__(self, profile: NumaProfile) -> dict[int, int]:
        if profile is not self._profile:
            self._profile, self._table = profile, {c.cpu: c.numa for c in profile.cpus}
        return self._table


_cpu_numa = _CpuNuma()


def _list(values: Iterable[int]) -> str:
    return ",".join(map(str, values))


def typical_cpus(samples: list[int]) -> int:
    """The typical aligned pod's exclusive CPUs per GPU (see the module docs)."""
    held = [s for s in samples if s > 0]
    return math.ceil(statistics.median(held)) if held else DEFAULT_TYPICAL_CPUS


def free_cpus_by_numa(numa: NodeNuma | None) -> dict[int, int] | None:
    """Free exclusive CPUs per NUMA node in the node's NUMA ledger (None without a ledger)."""
    if numa is None or numa.profile is None or numa.ledger is None:
        return None
    free = numa.ledger.free_cpus
    out = dict.fromkeys(numa.profile.numa_nodes, 0)
    for cpu in numa.profile.cpus:
        if cpu.cpu in free:
            out[cpu.numa] += 1
    return out


@dataclass(slots=True)
class NodeRow:
    """One node of the cluster page."""

    name: str
    gpus: int = 0
    allocated: int = 0
    idle: int = 0
    stranded: int = 0
    aligned: int = 0
    unaligned: int = 0
    unknown: int = 0
    pods: int = 0
    profile: str = PROFILE_OK
    #: ``(numa, idle GPUs, free exclusive CPUs)`` (free None: no ledger), for :meth:`strand`.
    idle_by_numa: tuple[tuple[int, int, int | None], ...] = ()

    def strand(self, typical: int) -> None:
        """Count the idle GPUs an aligned typical pod cannot use (its NUMA node lacks free CPUs)."""
        self.stranded = sum(
            idle for _, idle, free in self.idle_by_numa if free is not None and free < typical
        )

    def value(self, key: str) -> Any:
        """The column ``key`` (one of :data:`SORT_KEYS`)."""
        return getattr(self, key)


def gpu_counts(entry: NodeEntry) -> tuple[int, int, dict[int, int]]:
    """``(allocated, idle, idle per NUMA node)`` of a node's GPUs."""
    allocated, idle = 0, 0
    by_numa: dict[int, int] = {}
    for d in entry.usage.devices:
        if d.used > 0:
            allocated += 1
        elif d.health:
            idle += 1
            by_numa[d.numa] = by_numa.get(d.numa, 0) + 1
    return allocated, idle, by_numa


@dataclass
class NodeFigures:
    """A node's row and what the cluster page gathers beside it."""

    row: NodeRow
    #: Exclusive CPUs per GPU of each aligned pod on the node.
    samples: list[int] = field(default_factory=list)
    #: ``(pod key, node, why)`` of each unaligned pod on the node.
    unaligned: list[tuple[str, str, str]] = field(default_factory=list)


def node_figures(source: UiSource, name: str, entry: NodeEntry) -> NodeFigures:
    """A node's figures (stranded GPUs counted later by :meth:`NodeRow.strand`)."""
    numa = source.numa.nodes.get(name)
    allocated, idle, idle_numa = gpu_counts(entry)
    out = NodeFigures(NodeRow(name, len(entry.usage.devices), allocated, idle))
    row = out.row
    row.profile = profile_state(numa, source.now())[0]
    free = free_cpus_by_numa(numa)
    row.idle_by_numa = tuple(
        (n, count, free.get(n, 0) if free is not None else None) for n, count in sorted(idle_numa.items())
    )
    infos = {i.id: i for i in entry.infos}
    profile = numa.profile if numa is not None else None
    for pod in source.index.on_unsorted(name):
        row.pods += 1
        res = source.bookings.reservation(objects.uid(pod))
        if res is None or not has_gpus(res.layout):
            continue
        found = alignment(pod, res.layout, infos, profile)
        if found.state == ALIGNED:
            row.aligned += 1
            if found.cpus_per_gpu is not None:
                out.samples.append(found.cpus_per_gpu)
        elif found.state == UNALIGNED:
            row.unaligned += 1
            out.unaligned.append((objects.namespaced_key(pod), name, found.why))
        else:
            row.unknown += 1
    return out


def figures_key(source: UiSource, name: str, entry: NodeEntry) -> Hashable:
    """What a node's figures depend on: equal keys, equal figures (cheap to compute).

    Its NUMA ledger's version (profile, ledger and records), whether its profile has aged, its
    pods (the index's per-node version), its GPUs' usage and health, and its registration.
    """
    numa = source.numa.nodes.get(name)
    profile = numa.profile if numa is not None else None
    aged = profile is not None and source.now() - profile.observed_at > DEFAULT_PROFILE_MAX_AGE_S
    usage = tuple((d.used, d.health) for d in entry.usage.devices)
    return (
        numa.version if numa is not None else -1,
        aged,
        source.index.version_of(name),
        usage,
        entry.register_raw,
    )


def counter_values(counter: Counted) -> dict[str, float]:
    """A single-label counter's ``*_total`` samples by label value."""
    out: dict[str, float] = {}
    for family in counter.collect():
        for sample in family.samples:
            if sample.name.endswith("_total") and sample.labels:
                out[next(iter(sample.labels.values()))] = sample.value
    return out


def prediction_scores(source: UiSource) -> dict[str, dict[str, int]]:
    """``{"result": {hit, miss, unknown}, "miss": {cause: n}}`` since the scheduler started."""
    results = counter_values(source.scores.numa_predictions)
    causes = counter_values(source.scores.numa_prediction_misses)
    return {
        "result": {r: int(results.get(r, 0)) for r in (HIT, MISS, UNKNOWN)},
        "miss": {c: int(causes.get(c, 0)) for c in MISS_CAUSES},
    }
