"""A kube-scheduler stand-in that drives a scheduler extender over HTTP, like kube-scheduler does.

It watches Pending pods with ``spec.schedulerName`` equal to its name and no ``spec.nodeName``, and
schedules them one at a time: ``POST <url>/filter`` with Go-cased ``ExtenderArgs`` in node-names
mode (``{"Pod": ..., "NodeNames": [every node in the node cache]}``), then ``POST <url>/bind`` with
``ExtenderBindingArgs`` for the first feasible node (docs/kubelet-and-extender.md §5).
A failed attempt records a ``FailedScheduling`` Warning event with kube-scheduler's message, sets the
``PodScheduled=False`` condition and retries after kube-scheduler's per-pod backoff (1 s doubling
up to 10 s by default; both configurable). A success records ``Scheduled``.

In-tree filtering, like ``NodeAffinity`` (``spec.nodeSelector`` only) and ``NodeResourcesFit``
(cpu, memory and the pod count): a node is only sent to ``/filter`` when its labels match the pod's
``nodeSelector`` and the pod's ``cpu``/``memory`` requests fit the node's ``status.allocatable`` minus
the requests of the non-terminated pods on it (bound pods from a watch of assigned pods, plus pods
this driver bound that the watch has not shown yet, like kube-scheduler's assumed pods). Failing
nodes carry kube-scheduler's reasons (``Insufficient cpu``, ``Insufficient memory``, ``Too many
pods``, ``node(s) didn't match Pod's node affinity/selector``) into the ``FailedScheduling``
message; when no node passes, the extender is not called. Extended resources (``nvidia.com/*``)
are left to the extender (HAMi marks them ``ignoredByScheduler``).

Simplifications: no other in-tree filters, no scores (among feasible nodes the first returned wins),
no prioritize or preempt verbs, the extender is interested in every pod.
"""

# Every ``timeout`` parameter here is a deadline enforced inside with ``asyncio.timeout``.
# ruff: noqa: ASYNC109

from __future__ import annotations

import asyncio
import bisect
import contextlib
import itertools
import json
import random
import ssl
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

import aiohttp

from hamid.kube.cache import NodeCache, PodCache
from hamid.kube.client import KubeClient
from hamid.kube.errors import KubeError
from hamid.kube.events import EventRecorder
from hamid.log import get_logger
from hamid.model import objects
from hamid.model.errors import InvalidInput
from hamid.model.kube import JSON, PodBody
from hamid.model.objects import object_key
from hamid.model.resources import is_sidecar
from hamidsim.kubelet.quantity import quantity_milli_value, quantity_value
from hamidsim.pulse import Pulse

log = get_logger("sim.kube_scheduler")

#: ``NodeResourcesFit`` reasons (kube-scheduler's wording).
REASON_INSUFFICIENT = "Insufficient {}"
REASON_TOO_MANY_PODS = "Too many pods"
#: ``NodeAffinity`` reason for a ``spec.nodeSelector`` mismatch.
REASON_NODE_SELECTOR = "node(s) didn't match Pod's node affinity/selector"
#: How long a pod bound by this driver counts on its node before the watch confirms it.
ASSUME_TTL_S = 30.0
_TERMINATED = ("Succeeded", "Failed")

REASON_FAILED_SCHEDULING = "FailedScheduling"
REASON_SCHEDULED = "Scheduled"
CONDITION_UNSCHEDULABLE = "Unschedulable"
CONDITION_SCHEDULER_ERROR = "SchedulerError"


class SchedulingError(Exception):
    """One failed scheduling attempt; ``unschedulable`` for a fit error (no feasible node)."""

    def __init__(self, message: str, *, unschedulable: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.unschedulable = unschedulable


@dataclass(frozen=True, slots=True)
class SchedulingAttempt:
    """The outcome of one attempt for one pod (``node`` set on success, ``error`` on failure)."""

    pod: str
    uid: str
    attempt: int
    node: str = ""
    error: str = ""
    retry_in: float = 0.0


def _lower_keys(value: Any) -> dict[str, Any]:
    """Go's case-insensitive field matching for a decoded JSON object."""
    if not isinstance(value, Mapping):
        return {}
    return {str(k).lower(): v for k, v in value.items()}


def fit_error_message(total_nodes: int, statuses: Mapping[str, list[str]]) -> str:
    """kube-scheduler's ``FitError.Error()``: ``0/N nodes are available: <count> <reason>, ....``."""
    reasons: Counter[str] = Counter()
    for node_reasons in statuses.values():
        reasons.update(node_reasons)
    message = f"0/{total_nodes} nodes are available:"
    histogram = sorted(f"{count} {reason}" for reason, count in reasons.items())
    if histogram:
        message += f" {', '.join(histogram)}."
    return message


@dataclass(frozen=True, slots=True)
class Resources:
    """Requests or capacity in kube-scheduler's units: milli-CPU and memory bytes."""

    milli_cpu: int = 0
    memory: int = 0

    def __add__(self, other: Resources) -> Resources:
        return Resources(self.milli_cpu + other.milli_cpu, self.memory + other.memory)

    def max(self, other: Resources) -> Resources:
        """Per-resource maximum."""
        return Resources(max(self.milli_cpu, other.milli_cpu), max(self.memory, other.memory))


def _amount(values: Mapping[str, Any], name: str, where: str) -> int:
    if name not in values:
        return 0
    convert = quantity_milli_value if name == "cpu" else quantity_value
    return convert(values[name], f"{where}.{name}")


def _container_requests(container: Mapping[str, Any]) -> Resources:
    """``requests`` per resource, defaulting to ``limits`` (as the API server defaults them)."""
    resources = container.get("resources") or {}
    requests = resources.get("requests") or {}
    limits = resources.get("limits") or {}
    where = f"container {container.get('name')!r}"
    out = {}
    for name in ("cpu", "memory"):
        source, section = (requests, "requests") if name in requests else (limits, "limits")
        out[name] = _amount(source, name, f"{where} resources.{section}")
    return Resources(out["cpu"], out["memory"])


def pod_requests(pod: Mapping[str, Any]) -> Resources:
    """kube-scheduler's ``computePodResourceRequest`` for cpu and memory (InvalidInput on a bad quantity).

    Containers are summed; sidecars (init containers with ``restartPolicy: Always``) add to the sum
    and stay running under later init containers; a regular init container needs its own request
    plus the sidecars started before it; the pod needs the larger of the two, plus ``spec.overhead``.
    """
    spec = pod.get("spec") or {}
    total = Resources()
    for container in spec.get("containers") or []:
        total = total + _container_requests(container)
    sidecars = Resources()
    init_peak = Resources()
    for container in spec.get("initContainers") or []:
        requests = _container_requests(container)
        if is_sidecar(container):
            total = total + requests
            sidecars = sidecars + requests
        else:
            init_peak = init_peak.max(requests + sidecars)
    overhead = spec.get("overhead") or {}
    extra = Resources(_amount(overhead, "cpu", "spec.overhead"), _amount(overhead, "memory", "spec.overhead"))
    return total.max(init_peak) + extra


def _requests_or_zero(pod: Mapping[str, Any]) -> Resources:
    try:
        return pod_requests(pod)
    except InvalidInput:
        return Resources()


def node_allocatable(node: Mapping[str, Any]) -> tuple[Resources, int]:
    """The node's ``status.allocatable`` cpu/memory and pod count (missing or unreadable = 0)."""
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    values = []
    for name in ("cpu", "memory", "pods"):
        try:
            values.append(_amount(allocatable, name, "status.allocatable"))
        except InvalidInput:
            values.append(0)
    return Resources(values[0], values[1]), values[2]


def resource_fit_reasons(
    request: Resources, allocatable: Resources, requested: Resources, allowed_pods: int, pods: int
) -> list[str]:
    """``NodeResourcesFit`` for cpu/memory and the pod count: kube-scheduler's reasons, empty if it fits."""
    reasons = []
    if pods + 1 > allowed_pods:
        reasons.append(REASON_TOO_MANY_PODS)
    if request.milli_cpu > 0 and request.milli_cpu > allocatable.milli_cpu - requested.milli_cpu:
        reasons.append(REASON_INSUFFICIENT.format("cpu"))
    if request.memory > 0 and request.memory > allocatable.memory - requested.memory:
        reasons.append(REASON_INSUFFICIENT.format("memory"))
    return reasons


#: ``schedutil.DefaultMilliCPURequest`` / ``DefaultMemoryRequest``: what scoring counts for a pod
#: that requests no cpu / memory.
DEFAULT_MILLI_CPU_REQUEST = 100
DEFAULT_MEMORY_REQUEST = 200 * 1024 * 1024
MAX_NODE_SCORE = 100


def non_zero(request: Resources) -> Resources:
    """``GetNonzeroRequests``: the requests scoring counts (defaults for a zero request)."""
    return Resources(request.milli_cpu or DEFAULT_MILLI_CPU_REQUEST, request.memory or DEFAULT_MEMORY_REQUEST)


@dataclass(slots=True)
class NodeRequests:
    """kube-scheduler's ``NodeInfo`` for cpu/memory/pods: allocatable and the bound pods' requests.

    ``requested`` sums the pods' requests (the fit), ``non_zero_requested`` their non-zero requests
    (LeastAllocated scoring); :meth:`add` / :meth:`remove` follow pods bound and gone.
    """

    allocatable: Resources
    allowed_pods: int
    requested: Resources = Resources()
    non_zero_requested: Resources = Resources()
    pods: int = 0

    def add(self, request: Resources, sign: int = 1) -> None:
        """A pod bound here (``sign`` -1: a pod gone)."""
        nz = non_zero(request)
        self.requested = Resources(
            self.requested.milli_cpu + sign * request.milli_cpu, self.requested.memory + sign * request.memory
        )
        self.non_zero_requested = Resources(
            self.non_zero_requested.milli_cpu + sign * nz.milli_cpu,
            self.non_zero_requested.memory + sign * nz.memory,
        )
        self.pods += sign

    def remove(self, request: Resources) -> None:
        """A pod gone from the node (terminated or rejected)."""
        self.add(request, -1)


def feasible_nodes(request: Resources, nodes: Iterable[tuple[str, NodeRequests]]) -> list[str]:
    """The nodes ``NodeResourcesFit``'s filter passes: :func:`resource_fit_reasons` would be empty
    (inlined: it runs for every node and pod)."""
    cpu, memory = request.milli_cpu, request.memory
    return [
        name
        for name, node in nodes
        if node.pods < node.allowed_pods
        and (cpu <= 0 or cpu <= node.allocatable.milli_cpu - node.requested.milli_cpu)
        and (memory <= 0 or memory <= node.allocatable.memory - node.requested.memory)
    ]


#: The node ordinal of a ``(free amount, ordinal)`` entry.
_ordinal = itemgetter(1)


class NodeRoomIndex:
    """``NodeResourcesFit``'s filter over many nodes, indexed by free room (what :func:`feasible_nodes`
    answers, without testing every node for every pod).

    Free milli-CPU and memory are kept sorted, so the nodes short of either are found by bisection
    and the feasible ones are every node but those (and the nodes without a pod slot), in the
    order the nodes were given. While the nodes a pod is short on stay the same, the same tuple
    object is answered (an extender caching its candidate list sees the same list). Follow pods
    bound and gone through :meth:`add` / :meth:`remove`, not on the :class:`NodeRequests` directly.
    """

    def __init__(self, nodes: Mapping[str, NodeRequests]) -> None:
        self.nodes = nodes
        self.names = tuple(nodes)
        self._ordinal = {name: i for i, name in enumerate(self.names)}
        self._cpu = sorted((self._free(n)[0], i) for i, n in enumerate(self.names))
        self._memory = sorted((self._free(n)[1], i) for i, n in enumerate(self.names))
        self._no_slot = {i for i, n in enumerate(self.names) if nodes[n].pods >= nodes[n].allowed_pods}
        self._last: tuple[set[int], tuple[str, ...]] = (set(), self.names)

    def _free(self, name: str) -> tuple[int, int]:
        node = self.nodes[name]
        return (
            node.allocatable.milli_cpu - node.requested.milli_cpu,
            node.allocatable.memory - node.requested.memory,
        )

    def add(self, name: str, request: Resources, sign: int = 1) -> None:
        """A pod bound to ``name`` (``sign`` -1: a pod gone)."""
        i = self._ordinal[name]
        cpu, memory = self._free(name)
        del self._cpu[bisect.bisect_left(self._cpu, (cpu, i))]
        del self._memory[bisect.bisect_left(self._memory, (memory, i))]
        node = self.nodes[name]
        node.add(request, sign)
        cpu, memory = self._free(name)
        bisect.insort(self._cpu, (cpu, i))
        bisect.insort(self._memory, (memory, i))
        if node.pods >= node.allowed_pods:
            self._no_slot.add(i)
        else:
            self._no_slot.discard(i)

    def remove(self, name: str, request: Resources) -> None:
        """A pod gone from ``name`` (terminated or rejected)."""
        self.add(name, request, -1)

    def feasible(self, request: Resources) -> tuple[str, ...]:
        """The nodes passing ``NodeResourcesFit`` for ``request``, in the nodes' order."""
        short = set(self._no_slot)
        for free, wanted in ((self._cpu, request.milli_cpu), (self._memory, request.memory)):
            if wanted > 0:  # (amount, i) < (wanted, -1) exactly when amount < wanted
                short.update(map(_ordinal, free[: bisect.bisect_left(free, (wanted, -1))]))
        last_short, last = self._last
        if short != last_short:
            keep = [True] * len(self.names)
            for i in short:
                keep[i] = False
            last = tuple(itertools.compress(self.names, keep))
            self._last = (short, last)
        return last


#: kube-scheduler searches every node of a cluster smaller than this, and at least this many.
MIN_FEASIBLE_NODES_TO_FIND = 100
#: The least share of the nodes kube-scheduler's adaptive ``percentageOfNodesToScore`` searches.
MIN_FEASIBLE_NODES_PERCENTAGE = 5
#: The adaptive percentage: this, less one point per this many nodes.
ADAPTIVE_BASE_PERCENTAGE, ADAPTIVE_NODES_PER_POINT = 50, 125


def nodes_to_find(percentage: int, total: int) -> int:
    """How many feasible nodes kube-scheduler looks for before it stops searching
    (``numFeasibleNodesToFind`` in ``schedule_one.go``): every node of a small cluster; else
    ``percentage`` of them (``percentageOfNodesToScore``; 0: the adaptive default, 50 % less a
    point per 125 nodes, at least 5 %), at least 100."""
    if total < MIN_FEASIBLE_NODES_TO_FIND:
        return total
    if percentage == 0:
        percentage = max(
            ADAPTIVE_BASE_PERCENTAGE - total // ADAPTIVE_NODES_PER_POINT, MIN_FEASIBLE_NODES_PERCENTAGE
        )
    return max(total * percentage // 100, MIN_FEASIBLE_NODES_TO_FIND)


class NodeSampler:
    """The nodes one kube-scheduler sends its extender: it filters the nodes in its snapshot's
    order from where its last search stopped (``nextStartNodeIndex``, so every node gets its turn),
    stops once it has :func:`nodes_to_find` feasible ones, and starts the next pod's search after
    the last node it examined (every node when too few were feasible). Its filters run in parallel;
    here in order."""

    def __init__(self, names: Iterable[str], percentage: int) -> None:
        self.ordinal = {name: i for i, name in enumerate(names)}
        self.total = len(self.ordinal)
        self.wanted = nodes_to_find(percentage, self.total)
        self.start = 0

    def sample(self, feasible: tuple[str, ...]) -> tuple[str, ...]:
        """Of the ``feasible`` nodes (in the snapshot's order), those the search finds."""
        if self.wanted >= self.total:
            return feasible
        ordinals = [self.ordinal[name] for name in feasible]
        first = bisect.bisect_left(ordinals, self.start)
        found = (feasible[first:] + feasible[:first])[: self.wanted]
        if len(found) < self.wanted:
            return found  # every node examined: the next search starts where this one did
        examined = (self.ordinal[found[-1]] - self.start) % self.total + 1
        self.start = (self.start + examined) % self.total
        return found


def default_score(request: Resources, node: NodeRequests) -> int:
    """The default profile's score of a node for a pod without affinities, taints or spreading.

    ``NodeResourcesFit`` with strategy ``LeastAllocated`` (cpu and memory, weight 1 each, over the
    non-zero requests) plus ``NodeResourcesBalancedAllocation`` (100 x (1 - the standard deviation
    of the cpu and memory fractions requested)), plugin weight 1 each; the other score plugins give
    every node the same score then.
    """
    return next(default_scores(request, {"": node}, ("",)))[1]


def default_scores(
    request: Resources, nodes: Mapping[str, NodeRequests], names: Iterable[str]
) -> Iterator[tuple[str, int]]:
    """:func:`default_score` of each of ``names`` (plain arithmetic, inlined: the trace bench scores
    about a thousand nodes for every CPU-only pod)."""
    cpu, memory = request.milli_cpu, request.memory
    cpu_request, memory_request = cpu or DEFAULT_MILLI_CPU_REQUEST, memory or DEFAULT_MEMORY_REQUEST
    for name in names:
        node = nodes[name]
        cpu_cap, memory_cap = node.allocatable.milli_cpu, node.allocatable.memory
        non_zero, requested = node.non_zero_requested, node.requested
        cpu_nz, memory_nz = cpu_request + non_zero.milli_cpu, memory_request + non_zero.memory
        least = 0
        if cpu_cap and cpu_nz <= cpu_cap:
            least += (cpu_cap - cpu_nz) * MAX_NODE_SCORE // cpu_cap
        if memory_cap and memory_nz <= memory_cap:
            least += (memory_cap - memory_nz) * MAX_NODE_SCORE // memory_cap
        std = 0.0
        if cpu_cap and memory_cap:
            cpu_fraction = min((cpu + requested.milli_cpu) / cpu_cap, 1.0)
            memory_fraction = min((memory + requested.memory) / memory_cap, 1.0)
            std = abs(cpu_fraction - memory_fraction) / 2
        yield name, least // 2 + int((1 - std) * MAX_NODE_SCORE)


def select_host(scored: Iterable[tuple[str, int]], rng: random.Random) -> str | None:
    """``selectHost``: the highest score; equal ones are chosen uniformly (reservoir sampling)."""
    best: str | None = None
    best_score, ties = -1, 0
    for name, score in scored:
        if score > best_score:
            best, best_score, ties = name, score, 1
        elif score == best_score:
            ties += 1
            if rng.randrange(ties) == 0:
                best = name
    return best


class KubeSchedulerDriver:
    """Schedules the pods of ``scheduler_name`` through the extender at ``extender_url``.

    ``run()`` is a coroutine owned by the caller; cancel it to stop. ``ssl_context`` is used for an
    ``https://`` extender URL.
    """

    def __init__(
        self,
        kube: KubeClient,
        *,
        scheduler_name: str,
        extender_url: str,
        filter_verb: str = "filter",
        bind_verb: str = "bind",
        http_timeout: float = 5.0,
        initial_backoff: float = 1.0,
        max_backoff: float = 10.0,
        ssl_context: ssl.SSLContext | None = None,
        history_size: int = 10000,
    ) -> None:
        if not scheduler_name:
            raise ValueError("the kube-scheduler driver needs a scheduler name")
        if not extender_url.startswith(("http://", "https://")):
            raise ValueError(f"extender URL must be http:// or https://, got {extender_url!r}")
        if http_timeout <= 0 or not 0 < initial_backoff <= max_backoff:
            raise ValueError(
                f"bad timings: http_timeout={http_timeout} initial_backoff={initial_backoff} "
                f"max_backoff={max_backoff}"
            )
        self.kube = kube
        self.scheduler_name = scheduler_name
        self.extender_url = extender_url.rstrip("/")
        self.filter_verb = filter_verb
        self.bind_verb = bind_verb
        self.http_timeout = http_timeout
        self.initial_backoff = initial_backoff
        self.max_backoff = max_backoff
        self.ssl_context = ssl_context
        self.history: deque[SchedulingAttempt] = deque(maxlen=history_size)
        self.bound: dict[str, str] = {}
        self._attempts: Counter[str] = Counter()
        self._queue: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
        self._queued: set[str] = set()
        self._waiting: dict[str, asyncio.TimerHandle] = {}
        self._pods: PodCache | None = None
        self._nodes: NodeCache | None = None
        self._assigned: PodCache | None = None
        self._assumed: dict[str, tuple[str, PodBody, float]] = {}
        self._pulse = Pulse()
        self._log = log.bind(scheduler=scheduler_name)

    # -- backoff ----------------------------------------------------------------------------------

    def backoff_delay(self, attempts: int) -> float:
        """kube-scheduler's per-pod backoff after ``attempts`` failures: initial x 2^(n-1), capped."""
        if attempts <= 0:
            return 0.0
        return min(self.max_backoff, self.initial_backoff * 2.0 ** min(attempts - 1, 62))

    # -- waiting ----------------------------------------------------------------------------------

    def _changed(self) -> None:
        self._pulse.fire()

    async def wait_until(self, predicate: Callable[[], bool], timeout: float = 5.0, what: str = "") -> None:
        """Wait until ``predicate()`` holds (checked after every attempt); TimeoutError after ``timeout``."""
        await self._pulse.wait_until(predicate, timeout, what)

    async def wait_bound(self, namespace: str, name: str, timeout: float = 5.0) -> str:
        """Wait until the pod is bound through the extender; returns the node name."""
        key = f"{namespace}/{name}"
        await self.wait_until(lambda: key in self.bound, timeout, f"binding of {key}")
        return self.bound[key]

    def attempts_for(self, namespace: str, name: str) -> list[SchedulingAttempt]:
        """Every recorded attempt for ``namespace/name``, oldest first."""
        key = f"{namespace}/{name}"
        return [a for a in self.history if a.pod == key]

    # -- caches -------------------------------------------------------------------------------------

    def _pod_event(self, pod: PodBody) -> None:
        spec = objects.section(pod, "spec")
        uid = objects.uid(pod)
        if spec.get("schedulerName") != self.scheduler_name or spec.get("nodeName"):
            return
        phase = objects.section(pod, "status").get("phase", "Pending")
        if phase != "Pending" or objects.metadata(pod).get("deletionTimestamp"):
            return
        if uid in self._queued or uid in self._waiting:
            return
        self._queued.add(uid)
        self._queue.put_nowait((object_key(pod), uid))

    def _pod_gone(self, pod: PodBody) -> None:
        uid = objects.uid(pod)
        handle = self._waiting.pop(uid, None)
        if handle is not None:
            handle.cancel()
        self._attempts.pop(uid, None)

    def _confirmed(self, pod: PodBody) -> None:
        """The watch of assigned pods shows the pod: it no longer needs to be assumed."""
        self._assumed.pop(objects.uid(pod), None)

    # -- in-tree filter (NodeResourcesFit) ------------------------------------------------------------

    def node_usage(self) -> dict[str, tuple[Resources, int]]:
        """Per node: summed requests and count of the non-terminated pods on it (assumed ones included)."""
        usage: dict[str, tuple[Resources, int]] = {}
        seen: set[str] = set()

        def add(node: str, pod: Mapping[str, Any]) -> None:
            requested, count = usage.get(node, (Resources(), 0))
            usage[node] = (requested + _requests_or_zero(pod), count + 1)

        for pod in [] if self._assigned is None else self._assigned.values():
            seen.add(objects.uid(pod))
            if (pod.get("status") or {}).get("phase") not in _TERMINATED:
                add(str((pod.get("spec") or {}).get("nodeName") or ""), pod)
        now = asyncio.get_running_loop().time()
        for uid, (node, assumed, since) in list(self._assumed.items()):
            if uid in seen or now - since > ASSUME_TTL_S:
                del self._assumed[uid]
            else:
                add(node, assumed)
        return usage

    def prefilter(self, pod: PodBody, nodes: list[str]) -> tuple[list[str], dict[str, list[str]]]:
        """Split ``nodes`` into those passing ``nodeSelector`` and cpu/memory fit, and the others' reasons."""
        try:
            request = pod_requests(pod)
        except InvalidInput as exc:
            raise SchedulingError(str(exc), unschedulable=True) from exc
        usage = self.node_usage()
        selector = (pod.get("spec") or {}).get("nodeSelector") or {}
        fits: list[str] = []
        failed: dict[str, list[str]] = {}
        for name in nodes:
            node = (None if self._nodes is None else self._nodes.get(name)) or {}
            labels = objects.labels(node)
            if any(labels.get(k) != v for k, v in selector.items()):
                failed[name] = [REASON_NODE_SELECTOR]
                continue
            allocatable, allowed_pods = node_allocatable(node)
            requested, count = usage.get(name, (Resources(), 0))
            reasons = resource_fit_reasons(request, allocatable, requested, allowed_pods, count)
            if reasons:
                failed[name] = reasons
            else:
                fits.append(name)
        return fits, failed

    # -- the loop ---------------------------------------------------------------------------------

    async def run(self) -> None:
        """Watch nodes and unscheduled pods and schedule them until cancelled."""
        self._nodes = NodeCache(self.kube)
        self._assigned = PodCache(
            self.kube,
            field_selector="spec.nodeName!=",
            on_add=self._confirmed,
            on_update=lambda _old, new: self._confirmed(new),
            on_delete=self._confirmed,
        )
        self._pods = PodCache(
            self.kube,
            field_selector=f"spec.schedulerName={self.scheduler_name},spec.nodeName=",
            on_add=self._pod_event,
            on_update=lambda _old, new: self._pod_event(new),
            on_delete=self._pod_gone,
        )
        events = EventRecorder(self.kube, self.scheduler_name, self.scheduler_name)
        timeout = aiohttp.ClientTimeout(total=self.http_timeout)
        try:
            async with aiohttp.ClientSession(timeout=timeout) as session, asyncio.TaskGroup() as tasks:
                tasks.create_task(self._nodes.run())
                tasks.create_task(self._pods.run())
                tasks.create_task(self._assigned.run())
                await self._nodes.wait_synced(timeout=30.0)
                await self._assigned.wait_synced(timeout=30.0)
                await self._pods.wait_synced(timeout=30.0)
                self._log.info("kube_scheduler_started", extender=self.extender_url)
                while True:
                    key, uid = await self._queue.get()
                    self._queued.discard(uid)
                    pod = self._pods.get(key)
                    if pod is None or objects.uid(pod) != uid:
                        continue
                    await self._schedule_one(session, events, pod, key, uid)
        finally:
            for handle in self._waiting.values():
                handle.cancel()
            self._waiting.clear()

    def _requeue(self, key: str, uid: str) -> None:
        self._waiting.pop(uid, None)
        pods = self._pods
        pod = None if pods is None else pods.get(key)
        if pod is None or objects.uid(pod) != uid or uid in self._queued:
            return
        self._queued.add(uid)
        self._queue.put_nowait((key, uid))

    async def _schedule_one(
        self, session: aiohttp.ClientSession, events: EventRecorder, pod: PodBody, key: str, uid: str
    ) -> None:
        attempt = self._attempts[uid] + 1
        bound = self._log.bind(pod=key, attempt=attempt)
        try:
            node = await self._filter(session, pod)
            await self._bind(session, pod, node)
        except SchedulingError as exc:
            self._attempts[uid] = attempt
            delay = self.backoff_delay(attempt)
            bound.warning("scheduling_attempt_failed", error=exc.message, retry_in_s=delay)
            self.history.append(SchedulingAttempt(key, uid, attempt, error=exc.message, retry_in=delay))
            self._changed()
            await events.record(pod, "Warning", REASON_FAILED_SCHEDULING, exc.message)
            await self._set_unscheduled(pod, exc)
            loop = asyncio.get_running_loop()
            self._waiting[uid] = loop.call_later(delay, self._requeue, key, uid)
            return
        self._attempts.pop(uid, None)
        self._assumed[uid] = (node, pod, asyncio.get_running_loop().time())
        self.bound[key] = node
        self.history.append(SchedulingAttempt(key, uid, attempt, node=node))
        bound.info("pod_bound_through_extender", node=node)
        self._changed()
        await events.record(pod, "Normal", REASON_SCHEDULED, f"Successfully assigned {key} to {node}")

    async def _set_unscheduled(self, pod: PodBody, error: SchedulingError) -> None:
        condition = {
            "type": "PodScheduled",
            "status": "False",
            "reason": CONDITION_UNSCHEDULABLE if error.unschedulable else CONDITION_SCHEDULER_ERROR,
            "message": error.message,
        }
        with contextlib.suppress(KubeError):
            # kube-scheduler's util.PatchPodStatus: a strategic patch, the other conditions stay
            await self.kube.patch_pod_status(
                objects.namespace(pod), objects.name(pod), {"conditions": [condition]}, strategic=True
            )

    async def _post(self, session: aiohttp.ClientSession, verb: str, body: JSON) -> dict[str, Any]:
        url = f"{self.extender_url}/{verb}"
        try:
            async with (
                asyncio.timeout(self.http_timeout),
                session.post(
                    url,
                    json=body,
                    ssl=self.ssl_context if url.startswith("https") and self.ssl_context else True,
                ) as resp,
            ):
                if resp.status != 200:
                    raise SchedulingError(f"failed {verb} with extender at URL {url}, code {resp.status}")
                raw = await resp.read()
        except TimeoutError as exc:
            raise SchedulingError(
                f'Post "{url}": context deadline exceeded (Client.Timeout exceeded while awaiting headers)'
            ) from exc
        except aiohttp.ClientError as exc:
            raise SchedulingError(f'Post "{url}": {type(exc).__name__}: {exc}') from exc
        try:
            decoded = json.loads(raw)
        except ValueError as exc:
            raise SchedulingError(
                f"failed {verb} with extender at URL {url}: invalid JSON answer: {exc}"
            ) from exc
        return _lower_keys(decoded)

    async def _filter(self, session: aiohttp.ClientSession, pod: PodBody) -> str:
        assert self._nodes is not None
        all_nodes = sorted(self._nodes.keys())
        if not all_nodes:
            raise SchedulingError("no nodes available to schedule pods")
        nodes, statuses = self.prefilter(pod, all_nodes)
        if not nodes:
            raise SchedulingError(fit_error_message(len(all_nodes), statuses), unschedulable=True)
        result = await self._post(session, self.filter_verb, {"Pod": pod, "NodeNames": nodes})
        if result.get("error"):
            raise SchedulingError(str(result["error"]))
        names = result.get("nodenames")
        feasible = [str(n) for n in names] if isinstance(names, list) else []
        for name in feasible:
            if name not in nodes:
                raise SchedulingError(
                    f"extender {json.dumps(self.extender_url)} claims a filtered node {json.dumps(name)} "
                    "which is not found in the input node list"
                )
        if feasible:
            return feasible[0]
        unresolvable = result.get("failedandunresolvablenodes")
        unresolvable = dict(unresolvable) if isinstance(unresolvable, Mapping) else {}
        failed = result.get("failednodes")
        failed = dict(failed) if isinstance(failed, Mapping) else {}
        for node, reason in unresolvable.items():
            statuses.setdefault(str(node), []).append(str(reason))
        for node, reason in failed.items():
            if node not in unresolvable:
                statuses.setdefault(str(node), []).append(str(reason))
        raise SchedulingError(fit_error_message(len(all_nodes), statuses), unschedulable=True)

    async def _bind(self, session: aiohttp.ClientSession, pod: PodBody, node: str) -> None:
        body = {
            "PodName": objects.name(pod),
            "PodNamespace": objects.namespace(pod),
            "PodUID": objects.uid(pod),
            "Node": node,
        }
        result = await self._post(session, self.bind_verb, body)
        if result.get("error"):
            raise SchedulingError(str(result["error"]))
