"""Publish what NUMA prediction needs: the node's profile and each pod's observed placement.

Sources: the CPU topology from sysfs (:mod:`.cpu_topology`), kubelet's policies from its config file
(:mod:`.kubelet_config`) and kubelet's PodResources API (:mod:`.podresources_client`): the
allocatable CPUs (reserved = all - allocatable) and what every active pod holds. Outputs:

* ``hamid.io/numa-profile`` on the Node: written when its content changes (``gen`` + 1) and
  re-stamped (``at``) every :attr:`NumaSources.restamp_s`, well within the predictor's staleness
  bound, so a node agent that stopped confirming it is noticed.
* ``hamid.io/numa-placement`` on every pod that holds exclusive CPUs or devices (hamid's and
  foreign ones) or carries a prediction: written when it differs from the pod's, at most
  :attr:`NumaSources.pod_patch_qps` per second (burst :attr:`NumaSources.pod_patch_burst`), each
  value bounded by the codec's 16 KiB.

Each GPU pod's prediction is judged once, when PodResources first lists it (hit, miss or unknown;
a miss by cause, from what was listed on the node since the prediction).

Fail soft: while a source is missing the plugin serves GPUs as before, publishes nothing new and
logs the reason once (and once more when it recovers).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hamid.kube.client import KubeClient
from hamid.kube.errors import Conflict, KubeError, NotFound
from hamid.log import get_logger
from hamid.model import annotations as ann
from hamid.model import objects
from hamid.model._wire import INT64_MAX
from hamid.model.errors import InvalidInput
from hamid.model.numa import (
    CPU_OPTION_ALIGN_BY_UNCORE_CACHE,
    CPU_POLICIES,
    NO_TOPOLOGY,
    NUMA_PLACEMENT,
    NUMA_PREDICTED,
    NUMA_PROFILE,
    ContainerPlacement,
    KubeletPolicies,
    NewerFormat,
    NumaProfile,
    PodPlacement,
    ReplicaHiding,
    decode_prediction,
    decode_profile,
    encode_placement,
    encode_profile,
    miss_cause,
    profile_generation,
)
from hamid.plugin.cpu_topology import CpuTopology, read_cpu_topology
from hamid.plugin.kubelet_config import DEFAULT_KUBELET_CONFIG, load_kubelet_policies
from hamid.plugin.podresources_client import (
    DEFAULT_SOCKET,
    HeldPod,
    PodResourcesClient,
    PodResourcesUnavailable,
)
from hamid.plugin.pods import NodePods

log = get_logger("plugin.numa")


@dataclass(frozen=True, slots=True)
class NumaSources:
    """Where the publisher reads from, and how often it writes."""

    sysfs_root: str = "/sys"
    #: kubelet's config file; None: not read (no profile is published).
    kubelet_config: str | None = DEFAULT_KUBELET_CONFIG
    pod_resources_socket: str = DEFAULT_SOCKET
    #: PodResources poll period (kubelet rate-limits the API: about once a second at most).
    interval: float = 1.0
    #: Re-read sysfs and the kubelet config this often (they change with a reboot or kubelet restart).
    refresh_s: float = 60.0
    #: Re-stamp an unchanged profile's ``at`` this often (the predictor's bound is 30 minutes).
    restamp_s: float = 600.0
    pod_patch_qps: float = 10.0
    pod_patch_burst: int = 50
    call_timeout: float = 5.0


def build_profile(
    topology: CpuTopology,
    policies: KubeletPolicies,
    allocatable: frozenset[int],
    preferred_allocation: str | None = None,
    memory: Mapping[int, Mapping[str, int]] | None = None,
    hide_replicas: ReplicaHiding | None = None,
    other_devices: Iterable[str] = (),
) -> NumaProfile:
    """The profile's content (``gen`` and ``at`` 0): reserved = all - allocatable under the static policy.

    With CPU manager policy ``none`` kubelet allocates no CPUs exclusively and reports none; then
    nothing is reserved for the predictor either. ``preferred_allocation``: the resource this plugin
    serves when it offers kubelet ``GetPreferredAllocation``. Uncore caches are carried only where
    kubelet reads them (``prefer-align-cpus-by-uncorecache``): elsewhere the profile keeps the format
    older schedulers read. ``memory``: the allocatable memory per NUMA node PodResources reports,
    published under the Static memory manager policy only. ``hide_replicas``: which free replicas
    this plugin reports Unhealthy (``--hide-replicas``). ``other_devices``: the node's other
    device-plugin resources whose devices name a NUMA node.
    """
    all_cpus = frozenset(c.cpu for c in topology.cpus)
    static = policies.cpu_manager_policy == CPU_POLICIES[1]
    reserved = all_cpus - allocatable if static else frozenset()
    cpus = topology.cpus
    if not _reads_uncore(policies):
        cpus = tuple(dataclasses.replace(c, uncore=None) for c in cpus)
    return NumaProfile(
        generation=0,
        observed_at=0,
        numa_nodes=topology.numa_nodes,
        cpus=cpus,
        reserved_cpus=reserved,
        distances=topology.distances,
        policies=policies,
        preferred_allocation=preferred_allocation,
        hide_replicas=hide_replicas,
        memory=_profile_memory(memory) if policies.memory_manager_policy == "Static" else None,
        other_devices=tuple(sorted(set(other_devices))),
    )


def _profile_memory(
    memory: Mapping[int, Mapping[str, int]] | None,
) -> tuple[tuple[int, tuple[tuple[str, int], ...]], ...] | None:
    """The profile's ``memory``: non-zero bytes per NUMA node and type, sorted; None when kubelet
    reports none (then the predictor answers ``unknown`` for Guaranteed pods, never guesses)."""
    result = tuple(
        (n, tuple(sorted((t, b) for t, b in types.items() if b > 0)))
        for n, types in sorted((memory or {}).items())
        if any(b > 0 for b in types.values())
    )
    return result or None


def _reads_uncore(policies: KubeletPolicies) -> bool:
    """Whether kubelet may read uncore caches (an option value it cannot parse: the predictor
    answers unmodelled either way)."""
    try:
        return policies.option_enabled(policies.cpu_manager_options, CPU_OPTION_ALIGN_BY_UNCORE_CACHE)
    except InvalidInput:
        return True


def placement_of(held: HeldPod, numa_of: Mapping[int, int], generation: int) -> PodPlacement:
    """A pod's ``hamid.io/numa-placement`` from PodResources. Devices without topology stay, in
    bucket -1: kubelet counts them in every "enough devices" check, and a prediction books them
    there, so a placement that dropped them would free them in the scheduler's ledger. They name
    no NUMA node of the container's ``numa``."""
    containers = []
    for c in held.containers:
        devices = {res: dict(per) for res, per in c.devices.items() if per}
        numa = {numa_of[x] for x in c.cpus if x in numa_of}
        numa |= {n for per in devices.values() for n in per if n != NO_TOPOLOGY}
        numa |= {n for b in c.memory for n in b.numa}
        containers.append(ContainerPlacement(c.name, frozenset(numa), c.cpus, devices, c.memory))
    return PodPlacement(generation, tuple(containers))


def holds_anything(held: HeldPod) -> bool:
    """Whether any container holds exclusive CPUs, devices or pinned memory (what a ledger books)."""
    return any(c.cpus or c.devices or c.memory for c in held.containers)


def judge_prediction(annotations: Mapping[str, str], placement: PodPlacement) -> str:
    """``hit`` when every container both records name got the predicted NUMA node(s), else ``miss``;
    ``unknown`` without a (decodable) prediction or without a container in common."""
    raw = annotations.get(NUMA_PREDICTED)
    if raw is None:
        return "unknown"
    try:
        predicted = {c.name: c.numa for c in decode_prediction(raw).containers}
    except InvalidInput as exc:
        log.warning("numa_prediction_undecodable_counted_unknown", error=str(exc))
        return "unknown"
    observed = {c.name: c.numa for c in placement.containers}
    common = predicted.keys() & observed.keys()
    if not common:
        return "unknown"
    return "hit" if all(predicted[n] == observed[n] for n in common) else "miss"


def _predicted_at(annotations: Mapping[str, str]) -> float | None:
    """When the scheduler predicted: its filter's ``hami.io/vgpu-time`` (unix seconds; None: unknown)."""
    try:
        return float(annotations.get(ann.VGPU_TIME) or "")
    except ValueError:
        return None


def classify_miss(
    uid: str,
    annotations: Mapping[str, str],
    placement: PodPlacement,
    first_seen: Mapping[str, tuple[float, bool]],
) -> str:
    """The cause of a missed prediction as the node agent sees it (the scheduler's causes).

    ``first_seen`` maps each pod holding CPUs or devices on the node to when PodResources first
    listed it and whether it carries a prediction. ``stale``: the prediction names another profile
    generation than the placement; ``foreign``: a pod without a prediction was first listed at or
    after the prediction's time (the filter's ``hami.io/vgpu-time``, whole seconds); ``order``:
    another predicted pod was; else ``unmodelled``.
    """
    try:
        generation = decode_prediction(annotations[NUMA_PREDICTED]).generation
    except (KeyError, InvalidInput):
        generation = placement.generation
    since = _predicted_at(annotations)
    #: for each other pod first listed since the prediction: whether it carries a prediction itself
    later_predicted = (
        [predicted for u, (at, predicted) in first_seen.items() if u != uid and at >= since]
        if since is not None
        else []
    )
    return miss_cause(
        stale=generation != placement.generation,
        foreign_since=any(not predicted for predicted in later_predicted),
        own_since=any(later_predicted),
    )


class _TokenBucket:
    """At most ``rate`` per second on average, ``burst`` at once."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float]) -> None:
        self.rate, self.burst, self.clock = rate, burst, clock
        self.tokens, self.at = float(burst), clock()

    def take(self) -> bool:
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


class _Problems:
    """Log each source's problem once, and once more when it clears."""

    def __init__(self) -> None:
        self.current: dict[str, str] = {}

    def report(self, source: str, problem: str, consequence: str) -> None:
        if self.current.get(source) != problem:
            log.warning("numa_source_unavailable", source=source, consequence=consequence, error=problem)
            self.current[source] = problem

    def clear(self, source: str) -> None:
        if self.current.pop(source, None) is not None:
            log.info("numa_source_available_again", source=source)


class NumaPublisher:
    """The loop that keeps the profile and the placements of this node up to date."""

    def __init__(
        self,
        client: KubeClient,
        pods: NodePods,
        sources: NumaSources,
        *,
        resource_name: str,
        preferred_allocation: bool = False,
        on_prediction: Callable[[str, str], None] = lambda _result, _cause: None,
        on_held: Callable[[Sequence[HeldPod]], None] | None = None,
        hide_rule: str | None = None,
        clock: Callable[[], float] = time.time,
        on_profile: Callable[[], None] = lambda: None,
    ) -> None:
        self.client = client
        #: Told what PodResources lists after each read; set when the plugin hides free replicas
        #: (:class:`~hamid.plugin.replica_room.ReplicaRoom`) by ``hide_rule``, which the profile says.
        self.on_held = on_held
        #: Told each time :attr:`profile` is set: the rule in effect depends on its Topology Manager
        #: policy, and a profile taken over from the Node at a restart comes with no Node event.
        self.on_profile = on_profile
        self.hide_rule = hide_rule
        self.preferred_allocation = preferred_allocation
        self.pods = pods
        self.node_name = pods.node_name
        self.sources = sources
        self.resource_name = resource_name
        self.on_prediction = on_prediction
        self.clock = clock
        self.podresources = PodResourcesClient(sources.pod_resources_socket, timeout=sources.call_timeout)
        self.bucket = _TokenBucket(sources.pod_patch_qps, sources.pod_patch_burst, time.monotonic)
        self.problems = _Problems()
        self.profile: NumaProfile | None = None
        self.topology: CpuTopology | None = None
        self.policies: KubeletPolicies | None = None
        self._read_at = -float("inf")
        self._judged: set[str] = set()
        #: pod UID -> (when PodResources first listed it holding something, whether it is predicted)
        self._first_seen: dict[str, tuple[float, bool]] = {}
        #: pod UID -> (what PodResources reported, generation, its placement, encoded or None: too big)
        self._encodings: dict[str, tuple[HeldPod, int, PodPlacement, str | None]] = {}
        #: pod UID -> the API error its last placement write got (logged once per error)
        self._failed: dict[str, str] = {}
        self.profile_patches = 0
        self.placement_patches = 0

    async def run(self) -> None:
        """Poll and publish until cancelled; never raises (the plugin runs this in the TaskGroup that
        serves ``Allocate``: an optional feature must never end the device plugin)."""
        log.info(
            "numa_publishing_started",
            node=self.node_name,
            sysfs=self.sources.sysfs_root,
            kubelet_config=self.sources.kubelet_config,
            pod_resources=self.sources.pod_resources_socket,
        )
        while True:
            try:
                await self.publish_once()
            except KubeError as exc:
                self.problems.report("API server", str(exc), "NUMA annotations not written; retrying")
            except InvalidInput as exc:  # what this round would write is not writable: never the plugin's end
                self.problems.report("NUMA annotations", str(exc), "not written; retrying")
            except Exception as exc:  # unforeseen: this round is lost, the next one retries
                self.problems.report("NUMA publisher", f"{type(exc).__name__}: {exc}", "round lost; retrying")
            else:
                self.problems.clear("API server")
                self.problems.clear("NUMA annotations")
                self.problems.clear("NUMA publisher")
            await asyncio.sleep(self.sources.interval)

    async def publish_once(self) -> None:
        """One round: refresh the static sources when due, read PodResources, write what changed.

        What pods hold is read and handed on (``on_held``: the replicas hidden from kubelet rest on
        it) even while the profile's static sources are missing: they cost the profile only."""
        await self._refresh_static()
        profiled = self.topology is not None and self.policies is not None
        try:
            held = await self.podresources.list_pods()
            allocatable = await self.podresources.allocatable() if profiled else None
        except PodResourcesUnavailable as exc:
            self.problems.report(
                "kubelet PodResources API", str(exc), "NUMA profile and placements not published"
            )
            return
        self.problems.clear("kubelet PodResources API")
        if self.on_held is not None:
            self.on_held(held)
        if allocatable is None or self.topology is None or self.policies is None:
            return  # reported by _refresh_static
        try:
            preferred = self.resource_name if self.preferred_allocation else None
            hides = ReplicaHiding(self.resource_name, self.hide_rule) if self.hide_rule is not None else None
            others = (
                res
                for res, per_numa in allocatable.devices.items()
                if res != self.resource_name and any(n != NO_TOPOLOGY for n in per_numa)
            )
            content = build_profile(
                self.topology, self.policies, allocatable.cpus, preferred, allocatable.memory, hides, others
            )
        except InvalidInput as exc:
            self.problems.report("NUMA profile", str(exc), "not published")
            return
        self.problems.clear("NUMA profile")
        profile = await self._publish_profile(content)
        if profile is not None:
            await self._publish_placements(profile, held)

    async def _refresh_static(self) -> None:
        now = time.monotonic()
        if now - self._read_at < self.sources.refresh_s:
            return
        self._read_at = now
        try:
            self.topology = await asyncio.to_thread(read_cpu_topology, self.sources.sysfs_root)
            self.problems.clear("CPU topology (sysfs)")
        except InvalidInput as exc:
            self.topology = None
            self.problems.report("CPU topology (sysfs)", str(exc), "NUMA profile not published")
        path = self.sources.kubelet_config
        if path is None:
            self.policies = None
            self.problems.report("kubelet config", "no --kubelet-config given", "NUMA profile not published")
            return
        try:
            self.policies = await asyncio.to_thread(load_kubelet_policies, path)
            self.problems.clear("kubelet config")
        except InvalidInput as exc:
            self.policies = None
            self.problems.report("kubelet config", str(exc), "NUMA profile not published")
        self._check_uncore_caches()

    def _check_uncore_caches(self) -> None:
        """Say once why the uncore caches kubelet aligns by cannot be published."""
        error = self.topology.uncore_error if self.topology is not None else None
        if error is not None and self.policies is not None and _reads_uncore(self.policies):
            self.problems.report(
                "uncore caches (sysfs)", error, "prefer-align-cpus-by-uncorecache not predicted"
            )
        else:
            self.problems.clear("uncore caches (sysfs)")

    def _cached_profile(self) -> tuple[NumaProfile | None, int]:
        """The newest of the Node's profile and ours (the node cache may lag our own write), and
        the highest generation seen, that of a profile written by a newer hamid included (after a
        rollback the generation goes on from it rather than back to 1)."""
        node = self.pods.node()
        raw = objects.annotations(node).get(NUMA_PROFILE)
        cached: NumaProfile | None = None
        unread = 0
        if raw is not None:
            try:
                cached = decode_profile(raw)
            except InvalidInput as exc:
                if isinstance(exc, NewerFormat):
                    unread = profile_generation(raw) or 0
                log.warning("numa_profile_undecodable_replacing", error=str(exc))
        candidates = [p for p in (cached, self.profile) if p is not None]
        current = max(candidates, key=lambda p: (p.generation, p.observed_at), default=None)
        return current, max(unread, current.generation if current is not None else 0)

    async def _publish_profile(self, content: NumaProfile) -> NumaProfile | None:
        if self.pods.node() is None and self.profile is None:
            return None  # the node cache has not synced: its generation is not known yet
        now = int(self.clock())
        current, generation = self._cached_profile()
        if current is not None and dataclasses.replace(current, generation=0, observed_at=0) == content:
            if now - current.observed_at < self.sources.restamp_s:
                self.profile = current
                self.on_profile()
                return current
            reason, new = "re-stamped", dataclasses.replace(current, observed_at=now)
        else:
            reason = "new" if current is None else "changed"
            # past the top of the range (a profile written by hand or a newer hamid) start again
            following = generation + 1 if generation < INT64_MAX else 1
            new = dataclasses.replace(content, generation=following, observed_at=now)
        value = encode_profile(new)
        await self.client.patch_node_metadata(
            self.node_name, annotations={NUMA_PROFILE: value}, timeout=self.sources.call_timeout
        )
        self.profile = new
        self.on_profile()
        self.profile_patches += 1
        pol = new.policies
        log.info(
            "numa_profile_published",
            node=self.node_name,
            reason=reason,
            generation=new.generation,
            numa_nodes=len(new.numa_nodes),
            cpus=len(new.cpus),
            reserved=len(new.reserved_cpus),
            cpu_manager=pol.cpu_manager_policy,
            topology_manager=f"{pol.topology_manager_policy}/{pol.topology_manager_scope}",
            bytes=len(value),
        )
        return new

    async def _publish_placements(self, profile: NumaProfile, held: Iterable[HeldPod]) -> None:
        numa_of = {c.cpu: c.numa for c in profile.cpus}
        now = self.clock()
        listed: list[tuple[Mapping[str, Any], str, HeldPod, Mapping[str, str]]] = []
        for entry in held:
            pod = self.pods.pod(entry.key)
            if pod is None:
                continue  # not in the cache yet: next round
            uid = objects.uid(pod)
            annotations = objects.annotations(pod)
            listed.append((pod, uid, entry, annotations))
            if holds_anything(entry) and uid not in self._first_seen:
                self._first_seen[uid] = (now, NUMA_PREDICTED in annotations)
        for obj, uid, entry, annotations in listed:
            if not (holds_anything(entry) or NUMA_PREDICTED in annotations):
                continue
            placement, value = self._encoded(uid, entry, numa_of, profile.generation)
            self._judge(uid, entry, annotations, placement)
            if value is not None:
                await self._write_placement(obj, uid, annotations, placement, value)
        seen = {uid for _pod, uid, _entry, _notes in listed}
        self._judged &= seen
        self._first_seen = {uid: e for uid, e in self._first_seen.items() if uid in seen}
        self._encodings = {uid: e for uid, e in self._encodings.items() if uid in seen}
        self._failed = {uid: e for uid, e in self._failed.items() if uid in seen}

    def _encoded(
        self, uid: str, held: HeldPod, numa_of: Mapping[int, int], generation: int
    ) -> tuple[PodPlacement, str | None]:
        """The pod's placement and its annotation value, computed again only when either input changed."""
        cached = self._encodings.get(uid)
        if cached is not None and cached[0] == held and cached[1] == generation:
            return cached[2], cached[3]
        placement = placement_of(held, numa_of, generation)
        value: str | None = None
        try:
            value = encode_placement(placement)
        except InvalidInput as exc:
            log.warning("numa_placement_not_published", pod=held.key, error=str(exc))
        self._encodings[uid] = (held, generation, placement, value)
        return placement, value

    def _judge(
        self, uid: str, held: HeldPod, annotations: Mapping[str, str], placement: PodPlacement
    ) -> None:
        """Count the prediction of a GPU pod (or any predicted pod) once, when first observed."""
        if uid in self._judged:
            return
        ours = any(self.resource_name in c.devices for c in held.containers)
        if not ours and NUMA_PREDICTED not in annotations:
            return
        self._judged.add(uid)
        result = judge_prediction(annotations, placement)
        cause = classify_miss(uid, annotations, placement, self._first_seen) if result == "miss" else ""
        self.on_prediction(result, cause)
        log.info("numa_prediction_checked", pod=held.key, result=result, cause=cause or None)

    async def _write_placement(
        self,
        pod: Mapping[str, Any],
        uid: str,
        annotations: Mapping[str, str],
        placement: PodPlacement,
        value: str,
    ) -> None:
        key = objects.namespaced_key(pod)
        if annotations.get(NUMA_PLACEMENT) == value or not self.bucket.take():
            return  # unchanged, or over the rate bound: the next round writes it
        try:
            patched = await self.client.patch_pod_metadata(
                objects.namespace(pod),
                objects.name(pod),
                annotations={NUMA_PLACEMENT: value},
                uid=uid,
                timeout=self.sources.call_timeout,
            )
        except (NotFound, Conflict):
            return  # deleted or re-created meanwhile
        except KubeError as exc:  # this pod only: the others are still written
            if self._failed.get(uid) != str(exc):
                log.warning("numa_placement_write_failed_retrying", pod=key, error=str(exc))
            self._failed[uid] = str(exc)
            return
        self._failed.pop(uid, None)
        self.pods.remember(patched)
        self.placement_patches += 1
        log.info(
            "numa_placement_published",
            pod=key,
            reason="changed" if NUMA_PLACEMENT in annotations else "observed",
            generation=placement.generation,
            numa={c.name: sorted(c.numa) for c in placement.containers},
        )
