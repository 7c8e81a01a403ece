"""Codecs of the NUMA profile, observed placement and prediction annotations."""

from __future__ import annotations

import contextlib
import dataclasses
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hamid.model.errors import InvalidInput
from hamid.model.numa import (
    HIDE_RULES,
    PROFILE_VERSIONS,
    ContainerPlacement,
    ContainerPrediction,
    CpuInfo,
    KubeletPolicies,
    NewerFormat,
    NumaProfile,
    PodPlacement,
    PodPrediction,
    ReplicaHiding,
    decode_placement,
    decode_prediction,
    decode_profile,
    encode_placement,
    encode_prediction,
    encode_profile,
    format_cpu_list,
    format_thread_groups,
    parse_cpu_list,
    parse_thread_groups,
    profile_generation,
)


def linux_node(sockets: int, cores_per_socket: int, threads: int, numa_per_socket: int = 1) -> NumaProfile:
    """A Linux-numbered node: thread t of core k is CPU ``t * n_cores + k``."""
    n_cores = sockets * cores_per_socket
    per_numa = cores_per_socket // numa_per_socket
    infos = sorted(
        (
            CpuInfo(t * n_cores + k, k, k // cores_per_socket, k // per_numa)
            for t in range(threads)
            for k in range(n_cores)
        ),
        key=lambda c: c.cpu,
    )
    policies = KubeletPolicies(
        "static",
        {"full-pcpus-only": "true"},
        "single-numa-node",
        "container",
        {"max-allowable-numa-nodes": "8"},
        "None",
    )
    numa = tuple(range(sockets * numa_per_socket))
    dist = tuple(tuple(10 if a == b else 21 for b in numa) for a in numa)
    return NumaProfile(
        7, 1_764_000_000, numa, tuple(infos), frozenset({0, n_cores} if threads > 1 else {0}), dist, policies
    )


def test_big_node_profile_is_small_and_round_trips() -> None:
    profile = linux_node(2, 64, 2)
    text = encode_profile(profile)
    assert len(text.encode()) < 1024  # far under the 8 KiB bound
    assert decode_profile(text) == profile
    doc = json.loads(text)
    assert doc["cores"] == "0,128x128" and doc["numa"] == {"0": "0-63,128-191", "1": "64-127,192-255"}


def test_siblings_are_known_after_decoding() -> None:
    profile = decode_profile(encode_profile(linux_node(2, 4, 2)))
    core_of = {c.cpu: c.core for c in profile.cpus}
    assert core_of[1] == core_of[9] == 1 and core_of[2] != core_of[9]


@pytest.mark.parametrize(
    ("text", "cpus"),
    [("", set()), ("0", {0}), ("0-3,8,10-11", {0, 1, 2, 3, 8, 10, 11}), ("65535", {65535})],
)
def test_cpu_list(text: str, cpus: set[int]) -> None:
    assert parse_cpu_list(text, "t") == cpus
    assert format_cpu_list(cpus) == text


@pytest.mark.parametrize(
    "text", ["3-1", "1-1", "2,1", "1,1", "0-2,2", "0-2,3", "01", "1,", ",1", " 1", "a", "-1", "65536", "1--2"]
)
def test_cpu_list_rejects_non_canonical(text: str) -> None:
    with pytest.raises(InvalidInput):
        parse_cpu_list(text, "t")


@pytest.mark.parametrize("text", ["0,1;1,2", "1,0", "0x0", "0,,1", "0x", ";", "0;0"])
def test_thread_groups_reject_garbage(text: str) -> None:
    with pytest.raises(InvalidInput):
        parse_thread_groups(text, "t")


@given(st.sets(st.integers(0, 300)))
def test_cpu_list_round_trip(cpus: set[int]) -> None:
    assert parse_cpu_list(format_cpu_list(cpus), "t") == cpus


@st.composite
def thread_groups(draw: st.DrawFn) -> list[frozenset[int]]:
    pool = draw(st.permutations(range(draw(st.integers(1, 40)))))
    groups: list[frozenset[int]] = []
    i = 0
    while i < len(pool):
        size = draw(st.integers(1, 4))
        groups.append(frozenset(pool[i : i + size]))
        i += size
    return groups


@given(thread_groups())
def test_thread_groups_round_trip(groups: list[frozenset[int]]) -> None:
    assert sorted(parse_thread_groups(format_thread_groups(groups), "t"), key=min) == sorted(groups, key=min)


@st.composite
def profiles(draw: st.DrawFn) -> NumaProfile:
    sockets = draw(st.integers(1, 4))
    numa_per_socket = draw(st.sampled_from([1, 2]))
    cores = numa_per_socket * draw(st.integers(1, 6))
    threads = draw(st.integers(1, 4))
    base = linux_node(sockets, cores, threads, numa_per_socket)
    reserved = draw(st.sets(st.sampled_from(sorted(base.all_cpus)), max_size=3))
    policies = KubeletPolicies(
        draw(st.sampled_from(["none", "static"])),
        draw(
            st.dictionaries(
                st.sampled_from(["full-pcpus-only", "align-by-socket"]), st.sampled_from(["true", "false"])
            )
        ),
        draw(st.sampled_from(["none", "best-effort", "restricted", "single-numa-node"])),
        draw(st.sampled_from(["container", "pod"])),
        draw(
            st.dictionaries(
                st.sampled_from(["prefer-closest-numa-nodes", "prefer-most-allocated-numa-node"]),
                st.just("true"),
            )
        ),
        draw(st.sampled_from(["None", "Static"])),
    )
    distances = base.distances if draw(st.booleans()) else None
    return NumaProfile(
        draw(st.integers(0, 2**40)),
        draw(st.integers(0, 2**40)),
        base.numa_nodes,
        base.cpus,
        frozenset(reserved),
        distances,
        policies,
    )


@settings(max_examples=80, suppress_health_check=[HealthCheck.too_slow])
@given(profiles())
def test_profile_round_trip(profile: NumaProfile) -> None:
    assert decode_profile(encode_profile(profile)) == profile


NAMES = st.from_regex(r"[a-z][a-z0-9-]{0,10}[a-z0-9]", fullmatch=True)
NUMA_SET = st.frozensets(st.integers(0, 7), max_size=2)
CPU_SET = st.frozensets(st.integers(0, 255), max_size=16)


@st.composite
def placements(draw: st.DrawFn) -> PodPlacement:
    names = draw(st.lists(NAMES, min_size=1, max_size=4, unique=True))
    ids = st.tuples(*[st.just(f"GPU-{i}") for i in range(draw(st.integers(1, 3)))])
    containers = tuple(
        ContainerPlacement(
            n,
            draw(NUMA_SET),
            draw(CPU_SET),
            draw(
                st.dictionaries(
                    st.just("nvidia.com/gpu"),
                    st.dictionaries(st.integers(-1, 7), ids, max_size=2),
                    max_size=1,
                )
            ),
        )
        for n in names
    )
    return PodPlacement(draw(st.integers(0, 2**40)), containers)


@st.composite
def predictions(draw: st.DrawFn) -> PodPrediction:
    names = draw(st.lists(NAMES, min_size=1, max_size=4, unique=True))
    per_numa = st.dictionaries(st.sampled_from([-1, 0, 1, 3]), st.integers(1, 8), max_size=2)
    containers = tuple(
        ContainerPrediction(
            n,
            draw(NUMA_SET),
            draw(CPU_SET),
            draw(st.dictionaries(st.just("nvidia.com/gpu"), per_numa, max_size=1)),
        )
        for n in names
    )
    return PodPrediction(draw(st.integers(0, 2**40)), containers)


@settings(max_examples=80, suppress_health_check=[HealthCheck.too_slow])
@given(placements())
def test_placement_round_trip(placement: PodPlacement) -> None:
    assert decode_placement(encode_placement(placement)) == placement


@settings(max_examples=80, suppress_health_check=[HealthCheck.too_slow])
@given(predictions())
def test_prediction_round_trip(prediction: PodPrediction) -> None:
    assert decode_prediction(encode_prediction(prediction)) == prediction


def test_prediction_vector() -> None:
    record = PodPrediction(
        3,
        (
            ContainerPrediction(
                "main", frozenset({1}), frozenset({9, 10, 41, 42}), {"nvidia.com/gpu": {1: 2}}
            ),
        ),
    )
    text = encode_prediction(record)
    assert (
        text == '{"containers":[{"cpus":"9-10,41-42","devices":{"nvidia.com/gpu":{"1":2}},'
        '"name":"main","numa":"1"}],"gen":3,"v":1}'
    )


def test_devices_without_topology_are_bucket_minus_one_in_format_3() -> None:
    """A GPU without NUMA topology is booked by a prediction in bucket -1 (kubelet counts it): the
    record carries it (the filter's patch failed on it before), as does the placement, at format 3
    so an older reader sees a newer format rather than a broken value."""
    record = PodPrediction(
        3, (ContainerPrediction("main", frozenset({1}), frozenset({9}), {"nvidia.com/gpu": {-1: 1, 1: 2}}),)
    )
    text = encode_prediction(record)
    assert json.loads(text)["v"] == 3 and json.loads(text)["containers"][0]["devices"] == {
        "nvidia.com/gpu": {"-1": 1, "1": 2}
    }
    assert decode_prediction(text) == record
    held = {"nvidia.com/gpu": {-1: ("GPU-flat",)}}
    placement = PodPlacement(3, (ContainerPlacement("main", frozenset(), frozenset(), held),))
    assert decode_placement(encode_placement(placement)) == placement
    for wrong in (text.replace('"v":3', '"v":1'), text.replace('"-1"', '"0"')):
        with pytest.raises(InvalidInput, match="does not match its content"):
            decode_prediction(wrong)
    with pytest.raises(InvalidInput, match="is not a NUMA id"):
        decode_prediction(text.replace('"-1"', '"-2"'))
    with pytest.raises(InvalidInput, match="out of range"):
        encode_prediction(PodPrediction(3, (ContainerPrediction("main", frozenset({-1}), frozenset()),)))


GOOD_PROFILE = encode_profile(linux_node(1, 2, 2))


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d.update(v=2),
        lambda d: d.update(v=True),
        lambda d: d.update(extra=1),
        lambda d: d.pop("cores"),
        lambda d: d.update(gen=-1),
        lambda d: d.update(gen="1"),
        lambda d: d.update(cores="0,2"),  # CPUs 1 and 3 missing from the thread groups
        lambda d: d.update(numa={"0": "0-2"}),  # CPU 3 on no NUMA node
        lambda d: d.update(numa={"0": "0-3", "1": "3"}),
        lambda d: d.update(numa={"00": "0-3"}),
        lambda d: d.update(numa={"64": "0-3"}),
        lambda d: d.update(sockets={"0": "0-1", "1": "2-3"}),  # a core spanning two sockets
        lambda d: d.update(reserved="9"),
        lambda d: d.update(distances=[[10, 1]]),
        lambda d: d.update(distances=[[10.5]]),
        lambda d: d["kubelet"].update(topologyManagerPolicy="fancy"),
        lambda d: d["kubelet"].update(memoryManagerPolicy="static"),
        lambda d: d["kubelet"].update(cpuManagerPolicyOptions={"full-pcpus-only": True}),
        lambda d: d["kubelet"].update(cpuManagerPolicyOptions={"Bad Name": "x"}),
        lambda d: d["kubelet"].update(unknown="x"),
    ],
)
def test_profile_rejects_bad_documents(mutate: object) -> None:
    doc = json.loads(GOOD_PROFILE)
    mutate(doc)  # type: ignore[operator]
    with pytest.raises(InvalidInput):
        decode_profile(json.dumps(doc))


def test_a_newer_format_is_a_version_skew_not_a_malformed_profile() -> None:
    """A profile of a format above every one this hamid knows, with the fields that format adds,
    is named as newer (checked before the fields); its generation is still readable. A malformed
    one of a known format stays malformed."""
    doc = json.loads(GOOD_PROFILE)
    doc.update(v=max(PROFILE_VERSIONS) + 1, gen=41, fromTheFuture={"x": 1})
    with pytest.raises(NewerFormat, match=f"format version {max(PROFILE_VERSIONS) + 1} is newer"):
        decode_profile(json.dumps(doc))
    assert profile_generation(json.dumps(doc)) == 41
    doc["v"] = max(PROFILE_VERSIONS)
    with pytest.raises(InvalidInput, match="unknown field 'fromTheFuture'") as caught:
        decode_profile(json.dumps(doc))
    assert not isinstance(caught.value, NewerFormat)
    assert profile_generation("{") is None and profile_generation('{"gen": "1"}') is None


@pytest.mark.parametrize(
    "text",
    [
        '{"v":1,"gen":1,"containers":[{"name":"a"},{"name":"a"}]}',
        '{"v":1,"gen":1,"containers":[{"name":"A"}]}',
        '{"v":1,"gen":1,"containers":[{"name":"a","devices":{"gpu":{"0":1}}}]}',
        '{"v":1,"gen":1,"containers":[{"name":"a","devices":{"x.io/g":{"0":0}}}]}',
        '{"v":1,"gen":1,"containers":[{"name":"a","devices":{"x.io/g":{"x":1}}}]}',
        '{"v":1,"gen":1,"containers":[{"name":"a","numa":"64"}]}',
        '{"v":1,"gen":1,"containers":[{"name":"a","cpus":"1-"}]}',
        '{"v":1,"gen":1,"containers":[{"name":"a","extra":1}]}',
        '{"v":1,"containers":[]}',
        "[]",
        "",
        "{",
    ],
)
def test_prediction_rejects_bad_documents(text: str) -> None:
    with pytest.raises(InvalidInput):
        decode_prediction(text)


def test_placement_needs_device_ids() -> None:
    with pytest.raises(InvalidInput):
        decode_placement('{"v":1,"gen":1,"containers":[{"name":"a","devices":{"x.io/g":{"0":3}}}]}')
    with pytest.raises(InvalidInput):
        decode_placement('{"v":1,"gen":1,"containers":[{"name":"a","devices":{"x.io/g":{"0":["a","a"]}}}]}')


def test_oversized_values_are_refused() -> None:
    with pytest.raises(InvalidInput):
        decode_prediction(" " * 20000)
    names = [ContainerPlacement(f"c{i}", frozenset(), frozenset(range(0, 512, 2))) for i in range(80)]
    with pytest.raises(InvalidInput):
        encode_placement(PodPlacement(1, tuple(names)))


@settings(max_examples=300)
@given(st.one_of(st.text(max_size=200), st.binary(max_size=100).map(lambda b: b.decode("latin-1"))))
def test_garbage_only_raises_invalid_input(text: str) -> None:
    for decode in (decode_profile, decode_placement, decode_prediction):
        with contextlib.suppress(InvalidInput):
            decode(text)


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=8),
        lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
        max_leaves=12,
    )
)
def test_json_garbage_only_raises_invalid_input(value: object) -> None:
    for doc in (
        value,
        {"v": 1, "gen": 1, "containers": value},
        {"v": 1, "gen": 1, "at": 1, "numa": value, "sockets": value, "cores": value},
    ):
        for decode in (decode_profile, decode_placement, decode_prediction):
            with contextlib.suppress(InvalidInput):
                decode(json.dumps(doc))


def test_profile_constructor_checks_core_ids() -> None:
    base = linux_node(1, 2, 2)
    wrong = tuple(CpuInfo(c.cpu, 2 if c.core == 0 else c.core, c.socket, c.numa) for c in base.cpus)
    with pytest.raises(InvalidInput):
        NumaProfile(1, 1, base.numa_nodes, wrong)
    with pytest.raises(InvalidInput):
        NumaProfile(1, 1, (0, 0), base.cpus)
    with pytest.raises(InvalidInput):
        NumaProfile(1, 1, (0,), base.cpus, policies=KubeletPolicies(topology_manager_scope="node"))


def test_profiles_of_one_kind_share_their_decoded_topology() -> None:
    first = linux_node(2, 8, 2)
    later = NumaProfile(
        first.generation + 1, first.observed_at + 60, first.numa_nodes, first.cpus, first.reserved_cpus,
        first.distances, first.policies,
    )  # fmt: skip
    a, b = decode_profile(encode_profile(first)), decode_profile(encode_profile(later))
    assert (a, b) == (first, later)
    assert a.cpus is b.cpus and a.reserved_cpus is b.reserved_cpus and a.policies is b.policies
    other = decode_profile(encode_profile(linux_node(2, 8, 2, numa_per_socket=2)))
    assert other.cpus is not a.cpus and other.numa_nodes == (0, 1, 2, 3)
    doc = json.loads(encode_profile(first))
    with pytest.raises(InvalidInput, match="gen"):  # a shared topology still checks its own fields
        decode_profile(json.dumps(doc | {"gen": -1}))


def test_profile_naming_the_preferring_plugin_is_format_2_and_older_ones_still_decode() -> None:
    """``preferred`` (the resource hamid's plugin serves with ``GetPreferredAllocation``) needs a
    reader that knows it: such profiles are format 2; profiles without it stay format 1, so older
    schedulers keep reading them; the field and the version come together or not at all."""
    plain = linux_node(2, 4, 2)
    with_plugin = dataclasses.replace(plain, preferred_allocation="nvidia.com/gpu")
    assert json.loads(encode_profile(plain))["v"] == 1
    encoded = json.loads(encode_profile(with_plugin))
    assert (encoded["v"], encoded["preferred"]) == (2, "nvidia.com/gpu")
    assert decode_profile(encode_profile(with_plugin)) == with_plugin
    assert decode_profile(encode_profile(plain)).preferred_allocation is None
    for v, extra in ((1, {"preferred": "nvidia.com/gpu"}), (2, {}), (3, {"preferred": "x"})):
        doc = {**json.loads(encode_profile(plain)), "v": v, **extra}
        with pytest.raises(InvalidInput):
            decode_profile(json.dumps(doc))


def test_profile_saying_the_plugin_hides_replicas_is_format_5_and_older_ones_decode_as_not_hiding() -> None:
    """``hideReplicas`` (which free replicas of which resource hamid's plugin reports Unhealthy)
    needs a reader that knows it: format 5; a profile without it decodes as "not hiding"."""
    node = linux_node(2, 4, 2)
    policies = dataclasses.replace(node.policies, topology_manager_policy="restricted")
    plain = dataclasses.replace(node, preferred_allocation="nvidia.com/gpu", policies=policies)
    for rule in HIDE_RULES:
        hiding = dataclasses.replace(plain, hide_replicas=ReplicaHiding("nvidia.com/gpu", rule))
        doc = json.loads(encode_profile(hiding))
        # ``span`` and ``steer`` need a reader that knows the rule: formats 7 and 8
        want = {"span": 7, "steer": 8}.get(rule, 5)
        assert (doc["v"], doc["hideReplicas"]) == (want, {"resource": "nvidia.com/gpu", "rule": rule})
        assert decode_profile(encode_profile(hiding)) == hiding
        for v in range(1, want):
            with pytest.raises(InvalidInput, match="format version"):
                decode_profile(json.dumps({**doc, "v": v}))
    assert json.loads(encode_profile(plain))["v"] == 2
    assert decode_profile(encode_profile(plain)).hide_replicas is None
    bad: list[object] = [1, {"resource": "nvidia.com/gpu"}, {"resource": "nvidia.com/gpu", "rule": "some"}]
    for value in bad:
        with pytest.raises(InvalidInput, match="hideReplicas"):
            decode_profile(json.dumps({**doc, "hideReplicas": value}))


@pytest.mark.parametrize(
    ("policy", "want"), [("restricted", 8), ("none", 8), ("single-numa-node", 9), ("best-effort", 9)]
)
def test_a_profile_steering_beyond_restricted_is_format_9(policy: str, want: int) -> None:
    """Plugins of format 8 steer only under ``restricted``: a profile saying ``steer`` under
    ``single-numa-node`` or ``best-effort``, where newer plugins steer too, needs format 9, and one
    of 8 saying so (an older plugin, which does not steer there) is refused, never misread."""
    node = linux_node(2, 4, 2)
    policies = dataclasses.replace(node.policies, topology_manager_policy=policy)
    hiding = ReplicaHiding("nvidia.com/gpu", "steer")
    steer = dataclasses.replace(node, policies=policies, hide_replicas=hiding)
    doc = json.loads(encode_profile(steer))
    assert doc["v"] == want
    assert decode_profile(encode_profile(steer)) == steer
    for v in range(1, want):
        with pytest.raises(InvalidInput, match="format version"):
            decode_profile(json.dumps({**doc, "v": v}))


def test_profile_naming_other_numa_devices_is_format_6_and_older_ones_decode_as_none() -> None:
    """``devices``: the node's other device-plugin resources whose devices name a NUMA node (the
    predictor answers unknown for pods asking them); format 6, absent = none."""
    plain = linux_node(2, 4, 2)
    other = dataclasses.replace(plain, other_devices=("example.com/nic", "rdma/hca"))
    doc = json.loads(encode_profile(other))
    assert (doc["v"], doc["devices"]) == (6, ["example.com/nic", "rdma/hca"])
    assert decode_profile(encode_profile(other)) == other
    assert "devices" not in json.loads(encode_profile(plain))
    assert decode_profile(encode_profile(plain)).other_devices == ()
    for v in (1, 2, 3, 4, 5):
        with pytest.raises(InvalidInput, match="format version"):
            decode_profile(json.dumps({**doc, "v": v}))
    for value in ("rdma/hca", [1], ["nic"], ["rdma/hca", "example.com/nic"], ["a/b", "a/b"]):
        with pytest.raises(InvalidInput, match="devices"):
            decode_profile(json.dumps({**doc, "devices": value}))


def with_uncore(profile: NumaProfile, cores_per_cache: int) -> NumaProfile:
    """``profile`` with an uncore (L3) cache per ``cores_per_cache`` cores, ids 0, 1, ... by core id."""
    cores = sorted({c.core for c in profile.cpus})
    cache = {core: i // cores_per_cache for i, core in enumerate(cores)}
    return dataclasses.replace(
        profile, cpus=tuple(dataclasses.replace(c, uncore=cache[c.core]) for c in profile.cpus)
    )


def test_profile_with_uncore_caches_is_format_3_and_round_trips() -> None:
    """``uncore`` (kubelet's uncore cache per CPU, for ``prefer-align-cpus-by-uncorecache``) needs a
    reader that knows it: format 3, with or without ``preferred``; the version is the highest any
    field needs, so a profile without it is still read by format 1 and 2 readers."""
    plain = linux_node(2, 64, 2)
    cached = with_uncore(plain, 8)
    doc = json.loads(encode_profile(cached))
    assert doc["v"] == 3 and doc["uncore"]["0"] == "0-7,128-135" and len(doc["uncore"]) == 16
    assert len(encode_profile(cached).encode()) < 1500
    assert decode_profile(encode_profile(cached)) == cached
    both = dataclasses.replace(cached, preferred_allocation="nvidia.com/gpu")
    assert json.loads(encode_profile(both))["v"] == 3
    assert decode_profile(encode_profile(both)) == both
    assert decode_profile(encode_profile(plain)).cpus[0].uncore is None
    for v in (1, 2, 4):
        with pytest.raises(InvalidInput, match="format version"):
            decode_profile(json.dumps({**doc, "v": v}))


@pytest.mark.parametrize(
    ("uncore", "error"),
    [
        ({"0": "0-7"}, "same CPUs"),  # CPUs 8-15 lack a cache
        ({"0": "0-8", "1": "8-15"}, "listed twice"),
        ({"0": "0-2,4-7", "1": "3,8-15"}, "spans uncore caches"),  # CPU 3 and its sibling 11 apart
        ({"0": "0-7", "x": "8-15"}, "canonical id"),
    ],
)
def test_incoherent_uncore_caches_are_refused(uncore: dict[str, str], error: str) -> None:
    doc = json.loads(encode_profile(with_uncore(linux_node(1, 8, 2), 4)))
    with pytest.raises(InvalidInput, match=error):
        decode_profile(json.dumps({**doc, "uncore": uncore}))
    partial = linux_node(1, 8, 2)
    mixed = partial.cpus[:1] + tuple(dataclasses.replace(c, uncore=0) for c in partial.cpus[1:])
    with pytest.raises(InvalidInput, match="every CPU or for none"):
        dataclasses.replace(partial, cpus=mixed)
