"""HA probe: two real ``hamid scheduler`` processes campaigning for one Lease (short lease flags).

A pause is a SIGSTOP of the leader's whole process past its lease: the other takes over; the old
one wakes and is sent, at the same moment as the new leader, a pod asking 60 % of the one idle GPU.
The fence refuses on the old leader's own clock: no over-commit. Failover after ``kill -9`` comes
no later than the lease duration after the killed leader's last renewal (by the Lease's own
``renewTime`` and the new holder's ``acquireTime``), after SIGTERM (the Lease is released) within
about a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path

import aiohttp
import pytest

from hamid.model import objects
from hamid.scheduler.signing import AllocationKeys
from hamidsim.apiserver import ApiServer
from hamidsim.replicas import (
    PROBE_LEASE,
    PROBE_LEASE_NAME,
    PROBE_LEASE_NAMESPACE,
    SchedulerProcess,
    booked_mem,
    elected,
    gpu_node,
    gpu_pod,
    wait_for,
    write_key_file,
)

pytestmark = pytest.mark.slow

LEASE_S = PROBE_LEASE[0]
#: The kill round's timings: a retry period long enough that waiting for the next tick (client-go's
#: way, up to 2 x 1.2 s late) cannot pass for taking over at the lease's end.
KILL_LEASE = (3.0, 2.0, 1.0)
GPU_MEM = 10_000
#: 60 % of the GPU: two of them never fit.
POD_MEM = 6_000


@contextlib.asynccontextmanager
async def replica_pair(
    apiserver: ApiServer, tmp_path: Path, lease: tuple[float, float, float] = PROBE_LEASE
) -> AsyncIterator[list[SchedulerProcess]]:
    """Replicas ``a`` and ``b`` (one allocation key ring) against the API server, one GPU node
    ``n1``; killed afterwards."""
    apiserver.put(gpu_node("n1", GPU_MEM))
    key_file = write_key_file(AllocationKeys.generate(), tmp_path / "keys")
    replicas = [SchedulerProcess(name, apiserver.url, lease, key_file=key_file) for name in ("a", "b")]
    try:
        for replica in replicas:
            await replica.start()
        yield replicas
    finally:
        for replica in replicas:
            await replica.close()


@pytest.fixture
async def pair(apiserver: ApiServer, tmp_path: Path) -> AsyncIterator[list[SchedulerProcess]]:
    """:func:`replica_pair` with the probe's lease timings."""
    async with replica_pair(apiserver, tmp_path) as replicas:
        yield replicas


def lease_time(apiserver: ApiServer, field: str) -> float:
    """A MicroTime of the probe's Lease as POSIX seconds."""
    lease = apiserver.get("Lease", PROBE_LEASE_NAMESPACE, PROBE_LEASE_NAME)
    assert lease is not None
    return datetime.fromisoformat(lease["spec"][field]).timestamp()


async def test_a_paused_leader_wakes_fenced_and_two_pods_never_over_commit(
    apiserver: ApiServer, pair: list[SchedulerProcess]
) -> None:
    async with aiohttp.ClientSession() as session:
        old = await elected(pair, session, 30)
        (new,) = [r for r in pair if r is not old]
        old.signal(signal.SIGSTOP)
        try:
            took = await wait_for(lambda: new.ready(session), LEASE_S + 10, "the other replica takes over")
            await asyncio.sleep(max(0.0, LEASE_S + 1 - took))  # paused well past the lease
            p_old = apiserver.put(gpu_pod("p-old", POD_MEM))
            p_new = apiserver.put(gpu_pod("p-new", POD_MEM))
        finally:
            old.signal(signal.SIGCONT)
        # at the same moment, as two kube-schedulers would: the woken replica and the new leader
        on_old, on_new = await asyncio.gather(
            old.schedule(session, p_old, ["n1"]), new.schedule(session, p_new, ["n1"])
        )
    assert on_new == "n1", on_new
    assert on_old.startswith("error: scheduler not ready:"), on_old
    assert "lease not renewed" in on_old or "not the leader" in on_old, on_old
    assert booked_mem(apiserver.list("Pod", "default"), "n1") == POD_MEM
    bound = [p for p in apiserver.list("Pod", "default") if objects.section(p, "spec").get("nodeName")]
    assert [objects.name(p) for p in bound] == ["p-new"]


async def test_failover_after_kill_within_the_lease_and_after_sigterm_at_once(
    apiserver: ApiServer, tmp_path: Path
) -> None:
    lease_s, _, retry_s = KILL_LEASE
    async with replica_pair(apiserver, tmp_path, KILL_LEASE) as pair, aiohttp.ClientSession() as session:
        killed = await elected(pair, session, 30)
        (other,) = [r for r in pair if r is not killed]
        killed.signal(signal.SIGKILL)
        await asyncio.sleep(0.3)  # a renewal the killed replica had in flight has landed
        last_renewal = lease_time(apiserver, "renewTime")
        after_kill = await wait_for(lambda: other.ready(session), lease_s + 10, "takeover after kill -9")
        # taken at renewTime + leaseDuration (both wall clocks are this machine's), not on the
        # taker's next retry tick after it saw the record expire (up to 2 x 1.2 s later)
        assert lease_time(apiserver, "acquireTime") - last_renewal <= lease_s + 0.5
        assert after_kill <= lease_s + 1.0, after_kill
        await killed.close()
        await killed.start()
        await wait_for(lambda: killed.synced(session), 30, "the restarted replica synced")
        other.signal(signal.SIGTERM)
        after_term = await wait_for(lambda: killed.ready(session), lease_s + 10, "takeover after SIGTERM")
        assert await other.wait_exit(10) == 0
        assert after_term <= retry_s * 1.2 + 1.5, after_term
