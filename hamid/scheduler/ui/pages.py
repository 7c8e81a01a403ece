"""The three pages (cluster, node, pod) and the error page, rendered from a :class:`UiSource`.

Each page is bounded work: the cluster page reads the background :class:`~.snapshot.Snapshot`
and renders one page of :data:`PAGE_SIZE` nodes; a node page reads one node's ledgers and its
pods (at most :data:`MAX_POD_ROWS` listed); a pod page reads one pod. Every value from the
cluster passes through :mod:`.markup` (escaped).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from hamid.model import objects
from hamid.model._wire import is_decimal
from hamid.model.alignment import parse_alignment
from hamid.model.devices import DeviceInfo
from hamid.model.errors import InvalidInput
from hamid.model.kube import PodBody
from hamid.model.numa import NUMA_PREDICTED, decode_prediction, format_cpu_list
from hamid.model.resources import all_containers
from hamid.scheduler.ledger import Reservation
from hamid.scheduler.numa_ledger import NodeNuma, PodRecord
from hamid.scheduler.ui.figures import (
    ALIGNMENTS,
    SORT_KEYS,
    NodeRow,
    alignment,
    has_gpus,
    placement_of,
    prediction_scores,
    profile_state,
)
from hamid.scheduler.ui.history import HOUR_S, REFIT_REASONS
from hamid.scheduler.ui.markup import Safe, el, join, path_part
from hamid.scheduler.ui.numa_map import MapInput, Share, colours, legend, numa_map
from hamid.scheduler.ui.snapshot import Snapshot
from hamid.scheduler.ui.source import UiSource

#: Nodes per page of the cluster page.
PAGE_SIZE = 50
#: The namespace shown for a booking whose pod the cache does not hold (its UID as the name).
_UNKNOWN_POD = "(pod not cached)"
#: Pods listed on a node page at most.
MAX_POD_ROWS = 500


class BadRequest(Exception):
    """A query the page cannot answer (400 with the reason)."""


class NotFound(Exception):
    """No such node or pod (404 with the reason)."""


#: What the pages answer before the scheduler's caches have synced (503).
UNSYNCED = (
    "The scheduler's caches have not synced yet: it is still listing the cluster's pods and nodes "
    "(its /readyz answers 503 until then), so this view has no figures to show. This page reloads "
    "itself when they are ready."
)
#: The refresh stamp of every page while the caches have not synced.
UNSYNCED_STAMP = "unsynced"


@dataclass(frozen=True)
class Page:
    """A rendered page: its title, body and refresh stamp (what the page script polls for)."""

    title: str
    body: Safe
    stamp: str
    crumbs: tuple[tuple[str, str], ...] = ()


def root_of(path: str) -> str:
    """The relative prefix from ``path`` to the listener's root (links work behind a path proxy)."""
    return "../" * max(path.count("/") - 1, 0)


def node_href(root: str, node: str) -> str:
    """The node page's URL relative to a page whose root prefix is ``root``."""
    return f"{root}ui/node/{path_part(node)}"


def pod_href(root: str, key: str) -> str:
    """The pod page's URL (``key``: ``namespace/name``)."""
    namespace, _, name = key.partition("/")
    return f"{root}ui/pod/{path_part(namespace)}/{path_part(name)}"


def _stamp(*parts: object) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def _table(head: Sequence[object], rows: Sequence[Sequence[object]], **attributes: object) -> Safe:
    return el(
        "table",
        el("thead", el("tr", [el("th", h) for h in head])) if head else None,
        el("tbody", [el("tr", [el("td", c) for c in row]) for row in rows]),
        **attributes,
    )


def _figure(label: str, value: object, cls: str = "") -> Safe:
    return el(
        "div", el("span", value, class_="value"), el("span", label, class_="label"), class_=f"figure {cls}"
    )


# -- cluster ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClusterQuery:
    """The cluster page's query: sort column, direction and page number (validated)."""

    sort: str = "name"
    descending: bool = False
    page: int = 1

    @classmethod
    def parse(cls, query: Mapping[str, str]) -> ClusterQuery:
        """Validate ``?sort=&order=&page=``; :class:`BadRequest` with the reason."""
        unknown = sorted(set(query) - {"sort", "order", "page"})
        if unknown:
            raise BadRequest(f"unknown query parameter {unknown[0]!r} (use sort, order, page)")
        sort = query.get("sort", "name")
        if sort not in SORT_KEYS:
            raise BadRequest(f"sort must be one of {', '.join(SORT_KEYS)}")
        order = query.get("order", "desc" if sort != "name" else "asc")
        if order not in ("asc", "desc"):
            raise BadRequest("order must be asc or desc")
        raw = query.get("page", "1")
        if len(raw) > 7 or not is_decimal(raw) or not 1 <= int(raw) <= 1_000_000:
            raise BadRequest("page must be a whole number from 1")
        return cls(sort, order == "desc", int(raw))

    @staticmethod
    def values(pairs: Iterable[tuple[str, str]]) -> dict[str, str]:
        """The query's parameters; :class:`BadRequest` for one given twice (no value silently wins)."""
        out: dict[str, str] = {}
        for key, value in pairs:
            if key in out:
                raise BadRequest(f"query parameter {key!r} is given more than once")
            out[key] = value
        return out

    def href(self, root: str, **changes: object) -> str:
        """This query's URL with ``changes`` (sort, descending, page)."""
        sort = str(changes.get("sort", self.sort))
        descending = bool(changes.get("descending", self.descending))
        page = int(str(changes.get("page", self.page)))
        return f"{root}ui?sort={sort}&order={'desc' if descending else 'asc'}&page={page}"


def cluster_page(source: UiSource, snapshot: Snapshot, query: ClusterQuery, root: str) -> Page:
    """GPU and pod figures, prediction scores, the hour's refits, one page of nodes."""
    rows = snapshot.ordered(query.sort, query.descending)
    pages = max(1, -(-len(rows) // PAGE_SIZE))
    if query.page > pages:
        raise NotFound(f"page {query.page} is past the last page ({pages})")
    shown = rows[(query.page - 1) * PAGE_SIZE : query.page * PAGE_SIZE]
    scores = prediction_scores(source)
    refits = source.history.refits_since(HOUR_S)
    building = (
        el(
            "p",
            "Gathering the figures of every node; this page reloads itself when they are ready.",
            class_="note",
            id="building",
        )
        if snapshot.building
        else None
    )
    body = join(
        _leader_note(source),
        building,
        _cluster_figures(snapshot, scores, refits),
        el("h2", "Nodes"),
        _node_table(shown, query, root),
        _pager(query, pages, root),
        _unaligned(snapshot, root),
    )
    return Page("hamid: NUMA alignment", body, cluster_stamp(source, snapshot))


def cluster_stamp(source: UiSource, snapshot: Snapshot) -> str:
    """Changes when the cluster page's figures change."""
    scores = prediction_scores(source)
    return _stamp(snapshot.stamp, scores, source.history.refits_since(HOUR_S), source.leading())


def _leader_note(source: UiSource) -> Safe | None:
    if source.leading():
        return None
    return el(
        "p",
        "This replica follows the leader: its ledgers follow the cluster's objects, predictions and "
        "refits are counted by the leader.",
        class_="note",
    )


def _cluster_figures(snapshot: Snapshot, scores: dict[str, dict[str, int]], refits: dict[str, int]) -> Safe:
    t = snapshot.totals
    gpus = el(
        "section",
        el("h2", "GPUs"),
        _figure("allocated", t["allocated"]),
        _figure("idle", t["idle"]),
        _figure("stranded", t["stranded"], "warn" if t["stranded"] else ""),
        el(
            "p",
            f"of {t['gpus']} GPUs on {t['nodes']} nodes. Stranded: idle on a NUMA node with fewer "
            f"free exclusive CPUs than the typical aligned pod takes per GPU ({snapshot.typical_cpus}).",
            class_="hint",
        ),
        class_="card",
        id="gpus",
    )
    pods = el(
        "section",
        el("h2", "GPU pods"),
        [_figure(a, t[a], "warn" if a == "unaligned" and t[a] else "") for a in ALIGNMENTS],
        el("p", f"{t['pods']} pods bound to these nodes.", class_="hint"),
        class_="card",
        id="pods",
    )
    result, miss = scores["result"], scores["miss"]
    predictions = el(
        "section",
        el("h2", "NUMA predictions"),
        [_figure(r, n) for r, n in result.items()],
        el("p", "misses by cause: ", ", ".join(f"{c} {n}" for c, n in miss.items()), class_="hint"),
        class_="card",
        id="predictions",
    )
    hour = el(
        "section",
        el("h2", "Refits, last hour"),
        _figure("moved", refits[REFIT_REASONS[0]]),
        _figure("refused", refits[REFIT_REASONS[1]], "warn" if refits[REFIT_REASONS[1]] else ""),
        class_="card",
        id="refits",
    )
    return el("div", gpus, pods, predictions, hour, class_="cards")


def _node_table(rows: Sequence[NodeRow], query: ClusterQuery, root: str) -> Safe:
    head = []
    for key in SORT_KEYS:
        descending = not query.descending if key == query.sort else key != "name"
        arrow = (" ▼" if query.descending else " ▲") if key == query.sort else ""
        head.append(el("a", key, arrow, href=query.href(root, sort=key, descending=descending, page=1)))
    body = []
    for r in rows:
        cells: list[object] = [el("a", r.name, href=node_href(root, r.name))]
        cells += [r.value(k) for k in SORT_KEYS[1:]]
        body.append(cells)
    return _table(head, body, class_="nodes", id="nodes")


def _pager(query: ClusterQuery, pages: int, root: str) -> Safe:
    prev = el("a", "← previous", href=query.href(root, page=query.page - 1)) if query.page > 1 else None
    nxt = el("a", "next →", href=query.href(root, page=query.page + 1)) if query.page < pages else None
    return el("nav", prev, f" page {query.page} of {pages} ", nxt, class_="pager")


def _unaligned(snapshot: Snapshot, root: str) -> Safe:
    if not snapshot.unaligned:
        return el("p", "No GPU pod runs off its NUMA node.", class_="hint", id="unaligned")
    rows = [
        [el("a", key, href=pod_href(root, key)), el("a", node, href=node_href(root, node)), why]
        for key, node, why in snapshot.unaligned
    ]
    return join(el("h2", "Unaligned pods"), _table(["pod", "node", "why"], rows, id="unaligned"))


# -- node -------------------------------------------------------------------------------------------


def node_page(source: UiSource, name: str, root: str) -> Page:
    """A node's profile, its NUMA map and its pods: those bound to it and those the filter booked
    on it whose bind is still to come (their GPU shares count in the ledger's usage already)."""
    entry = source.bookings.nodes.get(name)
    numa = source.numa.nodes.get(name)
    if entry is None and (numa is None or numa.profile is None):
        raise NotFound(f"node {name!r} registers no GPU with this scheduler")
    pods = [(pod, True) for pod in source.index.on(name)] + [
        (pod, False) for pod in source.index.booked_on(name) if _booked_here(source, pod, name)
    ]
    pods.sort(key=lambda held: objects.namespaced_key(held[0]))
    infos = {i.id: i for i in entry.infos} if entry is not None else {}
    profile = numa.profile if numa is not None else None
    exclusive: dict[int, tuple[str, str]] = {}
    for uid, record in numa.records.items() if numa is not None else ():
        holder = source.index.by_uid(uid)
        key = objects.namespaced_key(holder) if holder is not None else f"{_UNKNOWN_POD}/{uid}"
        for cpu in record.usage.cpus:
            exclusive[cpu] = (key, str(record.source))
    shares: dict[str, list[Share]] = {}
    rows: list[_PodRow] = []
    for pod, bound in pods:
        key = objects.namespaced_key(pod)
        res = source.bookings.reservation(objects.uid(pod))
        gpus: list[str] = []
        for devices in res.layout if res is not None else ():
            for d in devices:
                shares.setdefault(d.uuid, []).append(Share(key, d.usedmem, d.usedcores))
                gpus.append(str(infos[d.uuid].index) if d.uuid in infos else d.uuid)
        rec = numa.records.get(objects.uid(pod)) if numa is not None else None
        state = (
            alignment(pod, res.layout, infos, profile).state
            if res is not None and has_gpus(res.layout)
            else ""
        )
        rows.append((key, bound, gpus, rec, state))
    keys = sorted({k for k, _ in exclusive.values()} | {s.pod for per in shares.values() for s in per})
    colour = colours(keys)
    link = lambda key: pod_href(root, key)  # noqa: E731
    data = MapInput(profile, entry.usage.devices if entry is not None else (), exclusive, shares)
    code, why = profile_state(numa, source.now())
    body = join(
        _profile_section(numa, code, why, source.now()),
        el("h2", "NUMA map"),
        el("div", numa_map(data, colour, link), class_="map"),
        legend(colour, link),
        el("h2", "Pods"),
        _node_pods(rows, root),
    )
    return Page(f"hamid: node {name}", body, node_stamp(source, name), (("node", name),))


def _booked_here(source: UiSource, pod: PodBody, node: str) -> bool:
    """Whether the ledger books pending ``pod`` on ``node`` (its annotation may name an older try)."""
    res = source.bookings.reservation(objects.uid(pod))
    return res is not None and res.node == node


def node_stamp(source: UiSource, name: str) -> str:
    """Changes when the node page changes: its ledgers, its pods, its GPUs' usage, its profile's state."""
    entry = source.bookings.nodes.get(name)
    numa = source.numa.nodes.get(name)
    if entry is None and (numa is None or numa.profile is None):
        raise NotFound(f"node {name!r} registers no GPU with this scheduler")
    usage = tuple((d.used, d.usedmem, d.usedcores, d.health) for d in entry.usage.devices) if entry else ()
    code = profile_state(numa, source.now())[0]
    return _stamp(numa.version if numa is not None else -1, source.index.version_of(name), usage, code)


def _profile_section(numa: NodeNuma | None, code: str, why: str, now: float) -> Safe:
    profile = numa.profile if numa is not None else None
    rows: list[list[object]] = [["prediction", "ready" if code == "ok" else f"unknown: {code} ({why})"]]
    if profile is not None:
        pol = profile.policies

        def options(o: Mapping[str, str]) -> str:
            return ", ".join(f"{k}={v}" for k, v in sorted(o.items())) or "-"

        rows += [
            ["NUMA nodes", ", ".join(map(str, profile.numa_nodes))],
            ["CPUs", f"{len(profile.cpus)} ({format_cpu_list(c.cpu for c in profile.cpus)})"],
            ["reserved CPUs", format_cpu_list(profile.reserved_cpus) or "-"],
            ["CPU manager", f"{pol.cpu_manager_policy}; options {options(pol.cpu_manager_options)}"],
            [
                "topology manager",
                f"{pol.topology_manager_policy}, scope {pol.topology_manager_scope}; "
                f"options {options(pol.topology_manager_options)}",
            ],
            ["memory manager", pol.memory_manager_policy],
            ["profile generation", profile.generation],
            ["confirmed", f"{max(0, round(now - profile.observed_at))} s ago"],
        ]
    return el("section", el("h2", "Profile"), _table([], rows, class_="kv"), id="profile")


#: ``(pod key, bound, GPU indexes, NUMA ledger record, alignment)``.
_PodRow = tuple[str, bool, list[str], PodRecord | None, str]


def _node_pods(rows: Sequence[_PodRow], root: str) -> Safe:
    body = []
    for key, bound, gpus, rec, state in rows[:MAX_POD_ROWS]:
        body.append(
            [
                join(
                    el("a", key, href=pod_href(root, key)),
                    None if bound else el("span", " (booked, not bound yet)", class_="hint"),
                ),
                ", ".join(gpus) or "-",
                format_cpu_list(rec.usage.cpus) if rec is not None and rec.usage.cpus else "-",
                str(rec.source) if rec is not None else "-",
                el("span", state or "-", class_=f"state {state}"),
            ]
        )
    more = (
        el("p", f"{len(rows) - MAX_POD_ROWS} more pods not listed.", class_="hint")
        if len(rows) > MAX_POD_ROWS
        else None
    )
    return join(
        _table(["pod", "GPUs", "exclusive CPUs", "booked from", "alignment"], body, id="node-pods"), more
    )


# -- pod --------------------------------------------------------------------------------------------


def pod_page(source: UiSource, namespace: str, name: str, root: str) -> Page:
    """A pod's GPUs, CPUs, predicted and observed NUMA nodes, refit history and fit reasons."""
    key = f"{namespace}/{name}"
    pod = source.pods.get(key)
    if pod is None:
        raise NotFound(f"pod {key!r} is not in the scheduler's cache")
    uid = objects.uid(pod)
    node = str(objects.section(pod, "spec").get("nodeName") or "")
    res = source.bookings.reservation(uid)
    entry = source.bookings.nodes.get(res.node if res is not None else node)
    infos = {i.id: i for i in entry.infos} if entry is not None else {}
    numa = source.numa.nodes.get(node) if node else None
    refits = source.history.refits(key, uid)
    unfit = None if node else source.history.unfit(key, uid)
    body = join(
        _pod_summary(pod, node, res, infos, numa, root),
        el("h2", "Containers"),
        _containers(pod, res, infos),
        el("h2", "Refit history"),
        _table(
            ["time (UTC)", "type", "reason", "message"],
            [[_when(e.at), e.type, e.reason, el("code", e.message)] for e in refits],
            id="refits",
        )
        if refits
        else el("p", "No refit of this pod since the scheduler started.", class_="hint", id="refits"),
        el("section", el("h2", "Why it is pending"), el("pre", unfit.message), id="unfit") if unfit else None,
        el("h2", "hamid annotations"),
        _table(
            ["key", "value"],
            [[k, el("code", v)] for k, v in sorted(objects.annotations(pod).items())],
            id="annotations",
        ),
    )
    crumbs = ((("node", node),) if node else ()) + (("pod", key),)
    return Page(f"hamid: pod {key}", body, pod_stamp(source, namespace, name), crumbs)


def pod_stamp(source: UiSource, namespace: str, name: str) -> str:
    """Changes when the pod page changes: the pod, its reservation, its Events, its node's ledger."""
    key = f"{namespace}/{name}"
    pod = source.pods.get(key)
    if pod is None:
        raise NotFound(f"pod {key!r} is not in the scheduler's cache")
    uid = objects.uid(pod)
    res = source.bookings.reservation(uid)
    node = str(objects.section(pod, "spec").get("nodeName") or "")
    numa = source.numa.nodes.get(node) if node else None
    rec = numa.records.get(uid) if numa is not None else None
    return _stamp(
        objects.metadata(pod).get("resourceVersion"),
        res.raw if res is not None else "",
        (str(rec.source), rec.usage) if rec is not None else None,
        source.history.refits(key, uid),
        source.history.unfit(key, uid),
    )


def _pod_summary(
    pod: PodBody, node: str, res: object, infos: Mapping[str, DeviceInfo], numa: object, root: str
) -> Safe:
    try:
        mode = str(parse_alignment(objects.annotations(pod)))
    except InvalidInput as exc:
        mode = f"invalid: {exc}"
    layout = getattr(res, "layout", ())
    profile = getattr(numa, "profile", None)
    state = alignment(pod, layout, infos, profile) if layout and has_gpus(layout) else None
    rec = numa.records.get(objects.uid(pod)) if numa is not None else None  # type: ignore[attr-defined]
    rows: list[list[object]] = [
        ["node", el("a", node, href=node_href(root, node)) if node else "pending (not bound)"],
        ["phase", objects.section(pod, "status").get("phase") or "-"],
        ["uid", objects.uid(pod)],
        ["alignment mode (hami.io/numa-alignment)", mode],
        ["alignment", f"{state.state}{': ' + state.why if state.why else ''}" if state else "books no GPU"],
        [
            "NUMA ledger booking",
            f"{rec.source}, CPUs {format_cpu_list(rec.usage.cpus) or '-'}" if rec else "-",
        ],
    ]
    return el("section", _table([], rows, class_="kv"), id="summary")


def _containers(pod: PodBody, res: Reservation | None, infos: Mapping[str, DeviceInfo]) -> Safe:
    names = [str(c.get("name") or "") for c in all_containers(pod)]
    layout = res.layout if res is not None else ()
    placement = placement_of(pod)
    observed = {c.name: c for c in placement.containers} if not isinstance(placement, str) else {}
    predicted = _predicted(pod)
    rows = []
    for i, name in enumerate(names):
        devices = layout[i] if i < len(layout) else ()
        gpus = [el("div", _gpu_text(d.uuid, d.usedmem, d.usedcores, infos.get(d.uuid))) for d in devices]
        seen = observed.get(name)
        rows.append(
            [
                name,
                gpus or "-",
                format_cpu_list(seen.cpus) if seen is not None and seen.cpus else "-",
                _numa_text(predicted.get(name)),
                _numa_text(seen.numa if seen is not None else None),
            ]
        )
    note = el("p", placement, class_="hint") if isinstance(placement, str) else None
    return join(
        _table(
            ["container", "GPUs", "exclusive CPUs", "predicted NUMA", "observed NUMA"], rows, id="containers"
        ),
        note,
    )


def _gpu_text(uuid: str, memory: int, cores: int, info: DeviceInfo | None) -> str:
    where = f"GPU {info.index} (NUMA {info.numa})" if info is not None else "GPU ? (not registered)"
    return f"{where} {uuid}: {memory} MiB, {cores}%"


def _predicted(pod: PodBody) -> dict[str, frozenset[int]]:
    raw = objects.annotations(pod).get(NUMA_PREDICTED)
    if not raw:
        return {}
    try:
        return {c.name: c.numa for c in decode_prediction(raw).containers}
    except InvalidInput:
        return {}


def _numa_text(numa: frozenset[int] | None) -> str:
    return ",".join(map(str, sorted(numa))) if numa else "-"


def _when(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(at))
