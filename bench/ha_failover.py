"""HA failover of two real ``hamid scheduler`` processes: pauses, kill -9 and SIGTERM, measured.

Two replicas campaign for one Lease against the embedded API server (one node, one idle GPU of
10,000 MiB). Each run has three rounds:

* pause: the leader is stopped (SIGSTOP, a VM freeze) for ``--pauses`` seconds, past its Lease;
  the other takes over; the old leader is woken (SIGCONT) and, at the same moment, each replica
  is sent one pod asking 6,000 MiB (60 % of the GPU) as its kube-scheduler would (filter, bind).
  Over-commit (both booked) is counted; so are the old leader's fenced refusals.
* kill: the leader is killed (SIGKILL); the time until the other's ``/readyz`` answers 200, and
  the Lease's own gap from the killed leader's last ``renewTime`` to the new ``acquireTime``.
* term: the leader gets SIGTERM (it releases its Lease); the time until the other decides and
  until the stopped process exited.

Usage: ``python bench/ha_failover.py`` (kube-scheduler's Lease timings 15s/10s/2s, 3 runs,
pauses of 16, 23 and 30 s; about 4 minutes). Last output line: one JSON object with ``runs``,
``over_commits`` (must be 0; a round whose new leader did not bind its pod fails the run),
``fenced``, ``pause_takeover_s``, ``kill_failover_s``, ``kill_lease_gap_s_max`` and
``term_failover_s`` (p50 and max), ``term_exit_s_max`` and ``peak_rss_mib`` (this process).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import signal
import sys
import tempfile
from datetime import datetime
from pathlib import Path

import aiohttp
from benchstats import peak_rss_mib, percentile, print_figures

from hamid.log import configure

configure("json", "error")  # before the modules below bind their loggers

from hamid.scheduler.signing import AllocationKeys  # noqa: E402
from hamidsim.apiserver import ApiServer  # noqa: E402
from hamidsim.replicas import (  # noqa: E402
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

NODE = "n1"
GPU_MEM = 10_000
POD_MEM = 6_000


async def pause_round(
    server: ApiServer,
    replicas: list[SchedulerProcess],
    session: aiohttp.ClientSession,
    pause: float,
    run: int,
) -> tuple[float, bool, int]:
    """(takeover seconds, over-committed, fenced answers of the woken leader)."""
    old = await elected(replicas, session, 120)
    (new,) = [r for r in replicas if r is not old]
    old.signal(signal.SIGSTOP)
    try:
        took = await wait_for(lambda: new.ready(session), pause + 60, "takeover during the pause")
        await asyncio.sleep(max(0.0, pause - took))
        # the stored copies: their UIDs are the server's, as kube-scheduler would send them
        p_old = server.put(gpu_pod(f"old-{run}", POD_MEM))
        p_new = server.put(gpu_pod(f"new-{run}", POD_MEM))
    finally:
        old.signal(signal.SIGCONT)
    on_old, on_new = await asyncio.gather(
        old.schedule(session, p_old, [NODE]), new.schedule(session, p_new, [NODE])
    )
    if on_new != NODE:  # the round proves nothing unless the new leader placed its pod
        raise RuntimeError(f"run {run}: the new leader did not bind its pod: {on_new}")
    pods = server.list("Pod", "default")
    over = booked_mem(pods, NODE) > GPU_MEM
    fenced = int("scheduler not ready" in on_old)
    for pod in pods:
        server.delete("Pod", "default", pod["metadata"]["name"])
    return took, over, fenced


def lease_time(server: ApiServer, field: str) -> float:
    """A MicroTime of the replicas' Lease as POSIX seconds."""
    lease = server.get("Lease", PROBE_LEASE_NAMESPACE, PROBE_LEASE_NAME)
    if lease is None:
        raise RuntimeError("the replicas' Lease is gone")
    return datetime.fromisoformat(lease["spec"][field]).timestamp()


async def stop_round(
    server: ApiServer, replicas: list[SchedulerProcess], session: aiohttp.ClientSession, sig: signal.Signals
) -> tuple[float, float, float]:
    """(seconds until the other decides, seconds until the stopped one exited, seconds from the
    stopped leader's last renewTime to the new holder's acquireTime); restarts it."""
    leader = await elected(replicas, session, 120)
    (other,) = [r for r in replicas if r is not leader]
    loop = asyncio.get_running_loop()
    started = loop.time()
    leader.signal(sig)
    ready = asyncio.ensure_future(wait_for(lambda: other.ready(session), 120, f"takeover after {sig.name}"))
    await leader.wait_exit(30)
    exited = loop.time() - started
    await asyncio.sleep(0.2)  # a request the stopped leader had in flight has landed
    last_renewal = lease_time(server, "renewTime")  # after SIGTERM: perhaps the new holder's already
    took = await ready
    gap = lease_time(server, "acquireTime") - last_renewal
    await leader.start()
    await wait_for(lambda: leader.synced(session), 120, "the restarted replica synced")
    return took, exited, gap


async def run(runs: int, lease: tuple[float, float, float], pauses: list[float]) -> dict[str, object]:
    figures: dict[str, list[float]] = {
        "pause": [],
        "kill": [],
        "kill_lease_gap": [],
        "term": [],
        "term_exit": [],
    }
    over_commits = fenced = 0
    async with ApiServer() as server, aiohttp.ClientSession() as session:
        server.put(gpu_node(NODE, GPU_MEM))
        keys_dir = Path(tempfile.mkdtemp(prefix="hamid-ha-keys-"))  # one key ring for the pair
        key_file = write_key_file(AllocationKeys.generate(), keys_dir / "keys")
        replicas = [SchedulerProcess(name, server.url, lease, key_file=key_file) for name in ("a", "b")]
        try:
            for replica in replicas:
                await replica.start()
            for i in range(runs):
                took, over, refused = await pause_round(server, replicas, session, pauses[i % len(pauses)], i)
                figures["pause"].append(took)
                over_commits += over
                fenced += refused
                took, _, gap = await stop_round(server, replicas, session, signal.SIGKILL)
                figures["kill"].append(took)
                figures["kill_lease_gap"].append(gap)
                took, exited, _ = await stop_round(server, replicas, session, signal.SIGTERM)
                figures["term"].append(took)
                figures["term_exit"].append(exited)
                print(f"run {i + 1}: { ({k: round(v[-1], 2) for k, v in figures.items()}) }", file=sys.stderr)
        finally:
            for replica in replicas:
                await replica.close()
            shutil.rmtree(keys_dir, ignore_errors=True)
    return {
        "runs": runs,
        "lease_s": list(lease),
        "pauses_s": [pauses[i % len(pauses)] for i in range(runs)],
        "over_commits": over_commits,
        "fenced": fenced,
        "pause_takeover_s_max": max(figures["pause"]),
        "kill_failover_s_p50": percentile(figures["kill"], 0.5),
        "kill_failover_s_max": max(figures["kill"]),
        "kill_lease_gap_s_max": max(figures["kill_lease_gap"]),
        "term_failover_s_p50": percentile(figures["term"], 0.5),
        "term_failover_s_max": max(figures["term"]),
        "term_exit_s_max": max(figures["term_exit"]),
        "peak_rss_mib": peak_rss_mib(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="runs of the three rounds (default 3)")
    parser.add_argument("--lease-duration", type=float, default=15.0, help="seconds (default 15)")
    parser.add_argument("--renew-deadline", type=float, default=10.0, help="seconds (default 10)")
    parser.add_argument("--retry-period", type=float, default=2.0, help="seconds (default 2)")
    parser.add_argument(
        "--pauses", default="16,23,30", help="comma list of pause seconds, cycled (default 16,23,30)"
    )
    args = parser.parse_args()
    lease = (args.lease_duration, args.renew_deadline, args.retry_period)
    pauses = [float(p) for p in args.pauses.split(",")]
    figures = asyncio.run(run(args.runs, lease, pauses))
    print_figures(figures)
    sys.exit(1 if figures["over_commits"] else 0)


if __name__ == "__main__":
    main()
