"""The node page's NUMA map: one SVG panel per NUMA node with its CPUs and GPUs.

A CPU square is coloured by the pod holding it exclusively, dark when reserved for the system,
pale when in the shared pool; a GPU has two bars, memory and cores, split by the pods booking
them. Every mark carries ``data-pod`` (the pod's ``namespace/name``) and a ``<title>`` tooltip,
and links to the pod's page. Colours are presentation attributes (the page's CSP forbids
inline styles).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from hamid.fit.usage import DeviceUsage
from hamid.model.numa import NumaProfile
from hamid.scheduler.ui.markup import Safe, el

_PANEL_W = 430
_CELL, _GAP, _PER_ROW = 14, 3, 24
_BAR_W, _BAR_H = 400, 12
_GPU_H = 58
_HEAD = 34
#: A node with more CPUs than this (the largest servers have under 2,000) is drawn without a
#: square per CPU, its panels' titles still counting them: a page stays bounded work whatever a
#: node's profile lists (a profile may name 65,536 CPUs).
MAX_DRAWN_CPUS = 2048
#: Colour of reserved CPUs, shared CPUs and unbooked GPU capacity.
RESERVED, SHARED, FREE = "#4a4f57", "#dfe6ee", "#eef1f4"


@dataclass(frozen=True, slots=True)
class Share:
    """What one pod books on one GPU."""

    pod: str
    memory_mib: int
    cores: int


@dataclass
class MapInput:
    """Everything the map draws (built by the node page from the scheduler's ledgers)."""

    profile: NumaProfile | None
    gpus: Sequence[DeviceUsage]
    #: CPU → (pod key, where the booking comes from: placement, predicted or replay).
    exclusive: Mapping[int, tuple[str, str]] = field(default_factory=dict)
    #: GPU UUID → the pods' shares on it.
    shares: Mapping[str, Sequence[Share]] = field(default_factory=dict)


def colours(pods: Sequence[str]) -> dict[str, str]:
    """A distinct colour per pod (golden-angle hues, in the given order)."""
    return {pod: f"hsl({round(i * 137.508) % 360} 62% 52%)" for i, pod in enumerate(pods)}


def numa_map(data: MapInput, colour: Mapping[str, str], link: Callable[[str], str]) -> Safe:
    """The SVG drawing (``link(pod key)``: the pod page's URL)."""
    nodes = list(data.profile.numa_nodes) if data.profile is not None else []
    for gpu in data.gpus:
        if gpu.numa not in nodes:
            nodes.append(gpu.numa)
    nodes.sort()
    drawn = data.profile is None or len(data.profile.cpus) <= MAX_DRAWN_CPUS
    panels = [_panel(data, n, i * (_PANEL_W + 10), colour, link, drawn) for i, n in enumerate(nodes)]
    height = max((h for _, h in panels), default=_HEAD)
    width = max(len(nodes), 1) * (_PANEL_W + 10)
    return el(
        "svg",
        el("title", "NUMA map"),
        [p for p, _ in panels],
        xmlns="http://www.w3.org/2000/svg",
        class_="numa-map",
        width=width,
        height=height,
        viewBox=f"0 0 {width} {height}",
        role="img",
        aria_label="NUMA map",
    )


def _panel(
    data: MapInput, numa: int, x: int, colour: Mapping[str, str], link: Callable[[str], str], drawn: bool
) -> tuple[Safe, int]:
    """One NUMA node's panel (``drawn``: a square per CPU, else only their counts)."""
    profile = data.profile
    cpus = sorted(c.cpu for c in profile.cpus if c.numa == numa) if profile is not None else []
    reserved = profile.reserved_cpus if profile is not None else frozenset()
    held = sum(1 for c in cpus if c in data.exclusive)
    kept = sum(1 for c in cpus if c in reserved)
    title = (
        f"NUMA {numa}: {len(cpus)} CPUs ({held} exclusive, {kept} reserved, {len(cpus) - held - kept} shared)"
        if profile is not None
        else f"NUMA {numa}: CPUs unknown (no NUMA profile)"
    )
    marks = [el("text", title, x=x + 4, y=18, class_="panel-title")]
    if not drawn:
        cpus = []  # counted in the title only
    for i, cpu in enumerate(cpus):
        cx = x + 4 + (i % _PER_ROW) * (_CELL + _GAP)
        cy = _HEAD + (i // _PER_ROW) * (_CELL + _GAP)
        marks.append(_cpu(cpu, cx, cy, data.exclusive.get(cpu), cpu in reserved, colour, link))
    y = _HEAD + math.ceil(len(cpus) / _PER_ROW) * (_CELL + _GAP) + 10
    for gpu in (g for g in data.gpus if g.numa == numa):
        marks.append(_gpu(gpu, x + 4, y, data.shares.get(gpu.id, ()), colour, link))
        y += _GPU_H
    height = y + 6
    frame = el("rect", x=x, y=0, width=_PANEL_W, height=height, rx=6, class_="panel", data_numa=numa)
    return el("g", frame, marks, class_="numa", data_numa=numa), height


def _cpu(
    cpu: int,
    x: int,
    y: int,
    owner: tuple[str, str] | None,
    reserved: bool,
    colour: Mapping[str, str],
    link: Callable[[str], str],
) -> Safe:
    if owner is not None:
        pod, source = owner
        title, fill, kind = f"CPU {cpu}: exclusive to {pod} ({source})", colour.get(pod, SHARED), "exclusive"
    else:
        pod, kind, fill = None, *(("reserved", RESERVED) if reserved else ("shared", SHARED))
        title = f"CPU {cpu}: {kind}"
    rect = el(
        "rect",
        el("title", title),
        x=x,
        y=y,
        width=_CELL,
        height=_CELL,
        rx=2,
        fill=fill,
        class_=f"cpu {kind}",
        data_cpu=cpu,
        data_pod=pod,
    )
    return el("a", rect, href=link(pod)) if pod is not None else rect


def _gpu(
    gpu: DeviceUsage,
    x: int,
    y: int,
    shares: Sequence[Share],
    colour: Mapping[str, str],
    link: Callable[[str], str],
) -> Safe:
    health = "" if gpu.health else " UNHEALTHY"
    label = (
        f"GPU {gpu.index}: {gpu.usedmem}/{gpu.totalmem} MiB, {gpu.usedcores}/{gpu.totalcore}% cores, "
        f"{gpu.used}/{gpu.count} slots{health}"
    )
    detail = f"GPU {gpu.index} {gpu.type} {gpu.id}"
    parts = [el("text", el("title", detail), label, x=x, y=y + 12, class_="gpu-label")]
    bars: tuple[tuple[str, int, Callable[[Share], int]], ...] = (
        ("memory", gpu.totalmem, lambda s: s.memory_mib),
        ("cores", gpu.totalcore, lambda s: s.cores),
    )
    for row, (what, total, amount) in enumerate(bars):
        by = y + 18 + row * (_BAR_H + 4)
        parts.append(el("rect", x=x, y=by, width=_BAR_W, height=_BAR_H, fill=FREE, class_="bar"))
        offset = 0.0
        for share in shares:
            value = amount(share)
            if total <= 0 or value <= 0:
                continue
            width = min(_BAR_W - offset, _BAR_W * value / total)
            unit = "MiB" if what == "memory" else "%"
            seg = el(
                "rect",
                el("title", f"{share.pod}: {value} {unit} {what} of GPU {gpu.index}"),
                x=round(x + offset, 1),
                y=by,
                width=round(max(width, 1.0), 1),
                height=_BAR_H,
                fill=colour.get(share.pod, SHARED),
                class_=f"share {what}",
                data_pod=share.pod,
                data_gpu=gpu.id,
            )
            parts.append(el("a", seg, href=link(share.pod)))
            offset += width
    return el("g", parts, class_="gpu", data_gpu=gpu.id, data_index=gpu.index)


def legend(colour: Mapping[str, str], link: Callable[[str], str]) -> Safe:
    """The pods of the map with their colours (SVG swatches: no inline style)."""

    def swatch(fill: str) -> Safe:
        return el(
            "svg", el("rect", width=12, height=12, rx=2, fill=fill), width=12, height=12, class_="swatch"
        )

    items = [
        el("li", swatch(c), " ", el("a", pod, href=link(pod)), data_pod=pod) for pod, c in colour.items()
    ]
    items += [el("li", swatch(RESERVED), " reserved CPU"), el("li", swatch(SHARED), " shared CPU")]
    return el("ul", items, class_="legend")
