"""``SchedulerApp``: the one start-up of the scheduler — bound ports, synced caches, clean stop."""

from __future__ import annotations

import asyncio
import socket

import aiohttp
import pytest

from hamid.listen import ListenError
from hamid.scheduler.app import SchedulerApp
from hamidsim.apiserver import ApiServer
from tests.integration.scheduler.harness import loopback_options


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


async def test_start_binds_every_listener_and_stop_releases_them() -> None:
    async with ApiServer() as server:
        app = SchedulerApp(loopback_options(server))
        ports = await app.start()
        try:
            assert set(ports) == {"extender", "cluster", "metrics"}
            await app.wait_synced(10)
            async with aiohttp.ClientSession() as session:
                async with session.get(f"http://127.0.0.1:{ports['metrics']}/metrics") as resp:
                    assert resp.status == 200 and "hamid_filter_duration_seconds" in await resp.text()
                async with session.get(f"http://127.0.0.1:{ports['cluster']}/readyz") as resp:
                    assert resp.status == 200
        finally:
            await app.stop()
        assert all(_free(port) for port in ports.values())


async def test_a_failed_start_stops_what_it_started() -> None:
    async with ApiServer() as server:
        with socket.socket() as busy:
            busy.bind(("127.0.0.1", 0))
            busy.listen()
            port = busy.getsockname()[1]
            app = SchedulerApp(loopback_options(server, metrics_listen=f"127.0.0.1:{port}"))
            with pytest.raises(ListenError, match="metrics listener"):
                await app.start()
        assert all(_free(p) for p in app.ports.values())
        with pytest.raises(RuntimeError, match="not started"):
            _ = app.scheduler


async def test_wait_returns_when_stopped() -> None:
    async with ApiServer() as server:
        app = SchedulerApp(loopback_options(server))
        await app.start()
        try:
            stop = asyncio.Event()
            waiter = asyncio.create_task(app.wait(stop))
            await asyncio.sleep(0.05)
            assert not waiter.done()
            stop.set()
            await asyncio.wait_for(waiter, 5)
        finally:
            await app.stop()


async def test_the_clock_passed_at_construction_times_the_scheduler() -> None:
    """Back-off ends, handshake ages and hold expiries all read the one injected clock."""
    now = [1_000_000.0]
    async with ApiServer() as server:
        app = SchedulerApp(loopback_options(server), clock=lambda: now[0])
        await app.start(run=False)
        try:
            scheduler = app.scheduler
            assert scheduler.state.clock() == 1_000_000.0
            scheduler.bind_backoff.note("gpu-1", ok=False)
            assert scheduler.bind_backoff.active(now[0], {"gpu-1"}) == {"gpu-1": 1_000_005.0}
            now[0] += 6
            assert scheduler.bind_backoff.active(scheduler.state.clock(), {"gpu-1"}) == {}
        finally:
            await app.stop()
