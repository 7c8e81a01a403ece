"""``POST /refit`` over mTLS against the embedded API server: upstream's handler tests and more."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest

from hamid.model import annotations as ann
from hamid.model import reasons as R
from hamid.model.devices import MODE_MIG, ContainerDevice
from hamid.model.refit import MSG_EMPTY_ALLOWED, MSG_INCOMPLETE
from hamid.plugin.refit_client import RefitError
from tests.fixtures.tls import TLSFiles
from tests.integration.refit.harness import Env, container, d, eventually, gpu, refit_env, request

TA, AL = ann.DEVICES_TO_ALLOCATE, ann.DEVICES_ALLOCATED
CN = "system:node:n1"


def two_gpus(env: Env, mem: int = 40000) -> None:
    env.add_node("n1", [gpu("GPU-a", 0, mem), gpu("GPU-b", 1, mem)])


async def refused(env: Env, req: object, cn: str = CN) -> str:
    with pytest.raises(RefitError) as info:
        await env.mtls_client(cn).refit(req)  # type: ignore[arg-type]
    message = str(info.value)
    assert message.startswith("scheduler refused refit: "), message
    return message.removeprefix("scheduler refused refit: ")


def used(env: Env, node: str = "n1") -> dict[str, tuple[int, int, int]]:
    return env.scheduler.ledger.snapshot()[node]


async def test_moves_reservation_with_one_patch_and_event(tls_files: TLSFiles, tmp_path: Path) -> None:
    async with refit_env(tls_files, tmp_path) as env:
        two_gpus(env)
        pod = await env.place("p", "n1", ((d("GPU-a", 20000, 30),),), annotations={"keep": "me"})
        before = env.annotations("p")
        patches = env.server.requests["patch pods"]
        devices = await env.mtls_client(CN).refit(request(pod, "n1", 0, ["GPU-b"], "main"))
        assert devices == (d("GPU-b", 20000, 30),)
        assert env.server.requests["patch pods"] == patches + 1
        after = env.annotations("p")
        assert after[TA] == after[AL] == "GPU-b,NVIDIA,20000,30:;"
        assert {k: v for k, v in after.items() if k not in (TA, AL)} == {
            k: v for k, v in before.items() if k not in (TA, AL)
        }
        assert used(env) == {"GPU-a": (0, 0, 0), "GPU-b": (1, 20000, 30)}
        res = env.scheduler.ledger.reservation(pod["metadata"]["uid"])
        assert res is not None and res.raw == after[AL] and not res.init_released
        await eventually(lambda: bool(env.events(R.EVENT_NUMA_REFIT_SUCCEED)))
        (event,) = env.events(R.EVENT_NUMA_REFIT_SUCCEED)
        assert event["type"] == "Normal"
        assert event["message"] == "NUMA refit moved container 0 from [GPU-a] to [GPU-b]"
        assert env.scheduler.ledger.quotas.used("default") == (20000, 30)


async def test_noop_when_already_allowed(tls_files: TLSFiles, tmp_path: Path) -> None:
    async with refit_env(tls_files, tmp_path) as env:
        two_gpus(env)
        pod = await env.place("p", "n1", ((d("GPU-a", 20000),),))
        patches = env.server.requests["patch pods"]
        devices = await env.mtls_client(CN).refit(request(pod, "n1", 0, ["GPU-b", "GPU-a"]))
        assert devices == (d("GPU-a", 20000),)
        assert env.server.requests["patch pods"] == patches
        assert used(env)["GPU-a"] == (1, 20000, 0)
        await asyncio.sleep(0.05)
        assert not env.events(R.EVENT_NUMA_REFIT_SUCCEED)


async def test_insufficient_capacity_unmatched_and_failure_event(tls_files: TLSFiles, tmp_path: Path) -> None:
    async with refit_env(tls_files, tmp_path) as env:
        two_gpus(env)
        await env.place("other", "n1", ((d("GPU-b", 30000),),))
        pod = await env.place("p", "n1", ((d("GPU-a", 20000),),))
        before, snapshot = env.annotations("p"), used(env)
        patches = env.server.requests["patch pods"]
        reason = await refused(env, request(pod, "n1", 0, ["GPU-b"]))
        assert reason == f"no allowed device fits: 1/1 {R.CARD_INSUFFICIENT_MEMORY}"
        # replica IDs instead of physical UUIDs: told apart from exhaustion
        reason = await refused(env, request(pod, "n1", 0, ["GPU-b-0", "GPU-b-1"]))
        assert reason == f"no allowed device fits: {R.ALLOWED_DEVICE_SET_UNMATCHED}"
        assert env.server.requests["patch pods"] == patches
        assert env.annotations("p") == before and used(env) == snapshot
        await eventually(lambda: len(env.events(R.EVENT_NUMA_REFIT_FAILED)) == 2)
        messages = sorted(e["message"] for e in env.events(R.EVENT_NUMA_REFIT_FAILED))
        assert messages[0].endswith(R.CARD_INSUFFICIENT_MEMORY) and all(
            e["type"] == "Warning" for e in env.events(R.EVENT_NUMA_REFIT_FAILED)
        )


@pytest.mark.parametrize("status", [409, 422])
async def test_patch_failure_leaves_state_untouched(tls_files: TLSFiles, tmp_path: Path, status: int) -> None:
    """A definite refusal (a 4xx) rolls back at once; a 5xx may have been applied (test_outcomes.py)."""
    async with refit_env(tls_files, tmp_path) as env:
        two_gpus(env)
        env.quota("default", 100000)
        pod = await env.place("p", "n1", ((d("GPU-a", 20000, 30),),))
        await eventually(lambda: env.scheduler.ledger.quotas.used("default") == (20000, 30))
        before, snapshot = env.annotations("p"), used(env)
        env.server.faults.fail_next(1, verb="patch", path_pattern="/pods/p$", status=status)
        reason = await refused(env, request(pod, "n1", 0, ["GPU-b"]))
        assert reason.startswith("cannot patch pod annotations: ")
        assert env.annotations("p") == before and used(env) == snapshot
        assert env.scheduler.ledger.quotas.used("default") == (20000, 30)
        res = env.scheduler.ledger.reservation(pod["metadata"]["uid"])
        assert res is not None and res.raw == before[AL]


async def test_consumed_allocation_is_refused(tls_files: TLSFiles, tmp_path: Path) -> None:
    async with refit_env(tls_files, tmp_path) as env:
        two_gpus(env)
        pod = await env.place("p", "n1", ((d("GPU-a", 20000),),), pending=";")
        assert await refused(env, request(pod, "n1", 0, ["GPU-b"])) == (
            "container 0 has no pending NVIDIA allocation to refit"
        )


async def test_validation_and_identity(tls_files: TLSFiles, tmp_path: Path) -> None:
    async with refit_env(tls_files, tmp_path) as env:
        two_gpus(env)
        env.add_node("n2", [gpu("GPU-c")])
        pod = await env.place("p", "n1", ((d("GPU-a", 20000),),))
        ok = request(pod, "n1", 0, ["GPU-b"])
        cases = [
            (
                replace(ok, pod_uid="nope"),
                CN,
                "pod nope is not tracked by the scheduler",
            ),
            (
                replace(ok, pod_name="other"),
                CN,
                f"pod {ok.pod_uid} does not match default/other",
            ),
            (
                replace(ok, node_name="n2"),
                "system:node:n2",
                "pod default/p is tracked on node n1, not n2",
            ),
            (replace(ok, device_type="Ascend"), CN, 'unknown device type "Ascend"'),
            (replace(ok, allowed_device_uuids=()), CN, MSG_EMPTY_ALLOWED),
            (
                replace(ok, allowed_device_uuids=tuple(f"G{i}" for i in range(513))),
                CN,
                "refit request carries 513 allowed devices, limit is 512",
            ),
            (
                replace(ok, container_index=3),
                CN,
                "container index 3 is outside the pod's containers",
            ),
            (
                replace(ok, container_index=-1),
                CN,
                "container index -1 is outside the pod's containers",
            ),
            (replace(ok, pod_uid=""), CN, MSG_INCOMPLETE),
            (
                replace(ok, container_name="sidecar"),
                CN,
                'container index 0 is "main", not "sidecar"',
            ),
        ]
        for req, cn, want in cases:
            assert await refused(env, req, cn) == want
        assert env.annotations("p")[AL] == "GPU-a,NVIDIA,20000,0:;"
        # only refusals after the pod is identified record an Event (wrong node, index, name)
        await eventually(lambda: len(env.events(R.EVENT_NUMA_REFIT_FAILED)) == 4)


async def test_seeds_existing_allocations_and_keeps_other_bytes(tls_files: TLSFiles, tmp_path: Path) -> None:
    async with refit_env(tls_files, tmp_path) as env:
        two_gpus(env)
        layout = ((d("GPU-a", 5000),), (), (d("GPU-a", 20000),))
        containers = [container("c0", 1, 5000), container("none", 0), container("c2", 1, 20000)]
        pending = ";;GPU-a,NVIDIA,20000,0:;"
        pod = await env.place("p", "n1", layout, containers=containers, pending=pending)
        devices = await env.mtls_client(CN).refit(request(pod, "n1", 2, ["GPU-b"], "c2"))
        assert devices == (d("GPU-b", 20000),)
        after = env.annotations("p")
        assert after[TA] == ";;GPU-b,NVIDIA,20000,0:;"
        assert after[AL] == "GPU-a,NVIDIA,5000,0:;;GPU-b,NVIDIA,20000,0:;"
        assert used(env) == {"GPU-a": (1, 5000, 0), "GPU-b": (1, 20000, 0)}


async def test_competing_refits_one_wins(tls_files: TLSFiles, tmp_path: Path) -> None:
    async with refit_env(tls_files, tmp_path) as env:
        two_gpus(env)
        await env.place("other", "n1", ((d("GPU-b", 20000),),))
        p1 = await env.place("p1", "n1", ((d("GPU-a", 20000),),))
        p2 = await env.place("p2", "n1", ((d("GPU-a", 20000),),))
        client = env.mtls_client(CN)
        results = await asyncio.gather(
            client.refit(request(p1, "n1", 0, ["GPU-b"])),
            client.refit(request(p2, "n1", 0, ["GPU-b"])),
            return_exceptions=True,
        )
        wins = [r for r in results if not isinstance(r, BaseException)]
        losses = [r for r in results if isinstance(r, RefitError)]
        assert len(wins) == 1 and len(losses) == 1
        assert "no allowed device fits" in str(losses[0])
        loser = "p2" if results[0] == wins[0] else "p1"
        assert env.annotations(loser)[AL] == "GPU-a,NVIDIA,20000,0:;"
        assert used(env) == {"GPU-a": (1, 20000, 0), "GPU-b": (2, 40000, 0)}


async def test_refusals_for_mig_heterogeneous_pinned_and_foreign(tls_files: TLSFiles, tmp_path: Path) -> None:
    async with refit_env(tls_files, tmp_path) as env:
        env.add_node(
            "n1",
            [
                gpu("GPU-a", 0),
                gpu("GPU-b", 0),
                gpu("GPU-c", 1),
                gpu("GPU-d", 1),
                gpu("GPU-m", 1, mode=MODE_MIG),
            ],
        )
        p = await env.place("p", "n1", ((d("GPU-a", 20000),),))
        assert await refused(env, request(p, "n1", 0, ["GPU-m"])) == (
            "allowed device GPU-m is in MIG mode; the NUMA refit does not support MIG"
        )
        het = await env.place(
            "het", "n1", ((d("GPU-a", 10000), d("GPU-b", 20000)),), containers=[container("main", 2, 10000)]
        )
        assert await refused(env, request(het, "n1", 0, ["GPU-c", "GPU-d"])) == (
            "container 0 reserves differing amounts per device; the refit does not support heterogeneous "
            "reservations"
        )
        pinned = await env.place("pin", "n1", ((d("GPU-a", 1000),),), annotations={ann.USE_GPU_UUID: "GPU-a"})
        reason = await refused(env, request(pinned, "n1", 0, ["GPU-c"]))
        # upstream's wording: the restricted fit's own reason (issue 14 point 6), then the pin
        assert reason.startswith("no allowed device fits: 1/1 CardUuidMismatch")
        assert reason == (
            "no allowed device fits: 1/1 CardUuidMismatch (container 0 is pinned by "
            "nvidia.com/use-gpuuuid to [GPU-a], none of which is in the allowed set)"
        )
        foreign = await env.place("f", "n1", ((ContainerDevice("GPU-a", "Ascend910", 1000, 0),),))
        reason = await refused(env, request(foreign, "n1", 0, ["GPU-c"]))
        assert reason == "container 0 reserves Ascend910 devices; the NUMA refit supports only NVIDIA"
        assert env.annotations("pin")[AL] == "GPU-a,NVIDIA,1000,0:;"


async def test_keeps_shrunk_accounting_after_init_release(tls_files: TLSFiles, tmp_path: Path) -> None:
    async with refit_env(tls_files, tmp_path) as env:
        two_gpus(env)
        status = {
            "initContainerStatuses": [{"name": "init", "state": {"terminated": {"exitCode": 0}}}],
        }
        pod = await env.place(
            "p",
            "n1",
            ((d("GPU-a", 30000),), (d("GPU-a", 10000),)),
            init=[container("init", 1, 30000)],
            pending=";GPU-a,NVIDIA,10000,0:;",
            status=status,
        )
        assert used(env)["GPU-a"] == (1, 10000, 0)
        await env.mtls_client(CN).refit(request(pod, "n1", 1, ["GPU-b"], "main"))
        res = env.scheduler.ledger.reservation(pod["metadata"]["uid"])
        assert res is not None and res.init_released
        assert used(env) == {"GPU-a": (0, 0, 0), "GPU-b": (1, 10000, 0)}


async def test_init_refit_quota_on_positional_layout(tls_files: TLSFiles, tmp_path: Path) -> None:
    layout = ((d("GPU-a", 5000),), (d("GPU-a", 5000),), (d("GPU-a", 5000),))
    spec = {
        "init": [container("init", 1, 5000)],
        "containers": [container("a1", 1, 5000), container("a2", 1, 5000)],
    }
    async with refit_env(tls_files, tmp_path) as env:
        two_gpus(env)
        env.quota("default", 12000)
        pod = await env.place("p", "n1", layout, **spec)  # type: ignore[arg-type]
        assert env.scheduler.ledger.quotas.used("default") == (10000, 0)
        patches = env.server.requests["patch pods"]
        reason = await refused(env, request(pod, "n1", 0, ["GPU-b"], "init"))
        assert R.RESOURCE_QUOTA_NOT_FIT in reason
        assert env.scheduler.ledger.quotas.used("default") == (10000, 0)
        assert env.server.requests["patch pods"] == patches
    async with refit_env(tls_files, tmp_path) as env:
        two_gpus(env)
        env.quota("default", 20000)
        pod = await env.place("p", "n1", layout, **spec)  # type: ignore[arg-type]
        await env.mtls_client(CN).refit(request(pod, "n1", 0, ["GPU-b"], "init"))
        assert used(env) == {"GPU-a": (2, 10000, 0), "GPU-b": (1, 5000, 0)}
        assert env.scheduler.ledger.quotas.used("default") == (15000, 0)


SIDE = {"restartPolicy": "Always"}


@pytest.mark.parametrize(
    ("case", "init", "apps", "layout", "index", "others", "mem_b", "want"),
    [
        (
            "regular init and app use the phase peak",
            [container("init", 1, 30000)],
            [container("app", 1, 20000)],
            ((d("GPU-b", 30000),), (d("GPU-a", 20000),)),
            1,
            0,
            40000,
            (1, 30000),
        ),
        (
            "other pod usage is not released",
            [container("init", 1, 30000)],
            [container("app", 1, 20000)],
            ((d("GPU-b", 30000),), (d("GPU-a", 20000),)),
            1,
            15000,
            40000,
            None,
        ),
        (
            "sidecar starting after a larger init does not inflate the peak",
            [container("init", 1, 30000), container("side", 1, 10000, **SIDE)],
            [container("app", 1, 20000)],
            ((d("GPU-b", 30000),), (d("GPU-a", 10000),), (d("GPU-b", 20000),)),
            1,
            0,
            30000,
            (2, 30000),
        ),
        (
            "sidecar and two apps preserve three concurrent slots",
            [container("side", 1, 10000, **SIDE)],
            [container("app1", 1, 15000), container("app2", 1, 10000)],
            ((d("GPU-a", 10000),), (d("GPU-b", 15000),), (d("GPU-b", 10000),)),
            0,
            0,
            40000,
            (3, 35000),
        ),
        (
            "sidecar and app remain concurrent",
            [container("side", 1, 30000, **SIDE)],
            [container("app", 1, 20000)],
            ((d("GPU-a", 30000),), (d("GPU-b", 20000),)),
            0,
            0,
            40000,
            None,
        ),
    ],
)
async def test_phase_aware_capacity(
    tls_files: TLSFiles,
    tmp_path: Path,
    case: str,
    init: list,
    apps: list,
    layout: tuple,
    index: int,
    others: int,
    mem_b: int,
    want: tuple[int, int] | None,
) -> None:
    async with refit_env(tls_files, tmp_path) as env:
        env.add_node("n1", [gpu("GPU-a", 0, 40000), gpu("GPU-b", 1, mem_b)])
        if others:
            await env.place("other", "n1", ((d("GPU-b", others),),))
        pod = await env.place("p", "n1", layout, init=init, containers=apps)
        before = env.annotations("p")
        if want is None:
            reason = await refused(env, request(pod, "n1", index, ["GPU-b"]))
            assert R.CARD_INSUFFICIENT_MEMORY in reason, case
            assert env.annotations("p") == before
        else:
            await env.mtls_client(CN).refit(request(pod, "n1", index, ["GPU-b"]))
            slots, mem, _ = used(env)["GPU-b"]
            assert (slots, mem) == want, case


async def test_init_release_during_patch_conflicts_and_state_follows(
    tls_files: TLSFiles, tmp_path: Path
) -> None:
    async with refit_env(tls_files, tmp_path, patch_timeout=5.0) as env:
        two_gpus(env)
        pod = await env.place(
            "p", "n1", ((d("GPU-a", 30000),), (d("GPU-a", 10000),)), init=[container("init", 1, 30000)]
        )
        rule = env.server.faults.add_latency(0.5, verb="patch", path_pattern="/pods/p$")
        task = asyncio.create_task(env.mtls_client(CN).refit(request(pod, "n1", 1, ["GPU-b"])))
        await eventually(
            lambda: (
                env.scheduler.ledger.reservation(pod["metadata"]["uid"]).raw
                != pod["metadata"]["annotations"][AL]
            )
        )
        current = env.server.get("Pod", "default", "p")
        assert current is not None
        current["status"]["initContainerStatuses"] = [
            {"name": "init", "state": {"terminated": {"exitCode": 0}}}
        ]
        env.server.put(current)
        with pytest.raises(RefitError, match="cannot patch pod annotations"):
            await asyncio.wait_for(task, 10)
        env.server.faults.remove(rule.id)
        await eventually(lambda: env.scheduler.ledger.reservation(pod["metadata"]["uid"]).init_released)
        assert env.annotations("p")[AL] == pod["metadata"]["annotations"][AL]
        assert used(env) == {"GPU-a": (1, 10000, 0), "GPU-b": (0, 0, 0)}
