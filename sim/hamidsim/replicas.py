"""Real ``hamid scheduler`` replicas as subprocesses, for HA probes: pause, wake, kill, stop.

Each :class:`SchedulerProcess` runs the ``hamid scheduler`` command (campaign-mode leader
election, plain HTTP listeners on free loopback ports) against an API server URL. A pause is a
``SIGSTOP`` of the whole process, the most faithful stand-in for a VM freeze or CPU starvation:
no timer, no socket and no clock of its own moves on until ``SIGCONT``. The probe calls speak to
the replica's extender (``/filter``, ``/bind``) and probes (``/readyz``) as kube-scheduler and the
kubelet would.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from hamid.model import annotations as ann
from hamid.model.devices import MODE_HAMI_CORE, DeviceInfo
from hamid.model.kube import JSON
from hamid.scheduler.signing import AllocationKeys

#: Lease timings of a probe (seconds): short, so a run takes seconds, in kube-scheduler's ratios.
PROBE_LEASE = (3.0, 2.0, 0.5)
#: Where the probe replicas campaign.
PROBE_LEASE_NAMESPACE = "kube-system"
PROBE_LEASE_NAME = "hamid-ha-probe"
_HTTP_TIMEOUT_S = 30.0


def gpu_node(name: str, mem: int) -> JSON:
    """A Node registering one healthy hami-core GPU of ``mem`` MiB (``<name>-gpu0``)."""
    gpu = DeviceInfo(f"{name}-gpu0", 0, 10, mem, 100, "NVIDIA-A100", 0, MODE_HAMI_CORE, True)
    annotations = {ann.NODE_REGISTER: ann.encode_node_devices([gpu])}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "annotations": annotations},
        "status": {"allocatable": {"nvidia.com/gpu": "10"}},
    }


def gpu_pod(name: str, mem: int, namespace: str = "default") -> JSON:
    """A Pending pod of one container asking one GPU with ``mem`` MiB."""
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(mem)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}-{uuid.uuid4().hex[:8]}"},
        "spec": {"containers": [{"name": "main", "image": "busybox", "resources": {"limits": limits}}]},
        "status": {"phase": "Pending"},
    }


def booked_mem(pods: list[JSON], node: str) -> int:
    """MiB of GPU memory the pods' allocation annotations hold on ``node``."""
    total = 0
    for pod in pods:
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        allocated = annotations.get(ann.DEVICES_ALLOCATED)
        if allocated and annotations.get(ann.VGPU_NODE) == node:
            total += sum(d.usedmem for c in ann.decode_pod_devices(allocated) for d in c)
    return total


def free_port() -> int:
    """A loopback TCP port free now (the replica binds it a moment later)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def write_key_file(keys: AllocationKeys, path: Path) -> str:
    """Write a key ring as ``--allocation-key-file`` reads it (one key per line, mode 0600)."""
    path.write_text("".join(key.decode() + "\n" for key in keys.keys), encoding="utf-8")
    path.chmod(0o600)
    return str(path)


def _seconds(value: float) -> str:
    return f"{value:g}s"


@dataclass
class SchedulerProcess:
    """One ``hamid scheduler`` subprocess campaigning for :data:`PROBE_LEASE_NAME`."""

    name: str
    api_server: str
    lease: tuple[float, float, float] = PROBE_LEASE
    extra_args: tuple[str, ...] = ()
    lease_name: str = PROBE_LEASE_NAME
    #: The allocation key file the replicas of one cluster share (:func:`write_key_file`); empty:
    #: the replica runs unsigned (``--allow-unsigned-allocations``).
    key_file: str = ""
    ports: dict[str, int] = field(default_factory=dict)
    proc: asyncio.subprocess.Process | None = None

    def command(self) -> list[str]:
        """The command line (``python -c`` of the console script, so no install is needed)."""
        duration, renew, retry = self.lease
        self.ports = {key: free_port() for key in ("extender", "cluster", "metrics")}
        return [
            sys.executable,
            "-c",
            "from hamid.cli import main; main()",
            "--log-level",
            "warning",
            "scheduler",
            f"--api-server={self.api_server}",
            f"--extender-listen=127.0.0.1:{self.ports['extender']}",
            f"--listen=127.0.0.1:{self.ports['cluster']}",
            f"--metrics-listen=127.0.0.1:{self.ports['metrics']}",
            "--leader-elect",
            "--leader-elect-mode=campaign",
            f"--leader-elect-namespace={PROBE_LEASE_NAMESPACE}",
            f"--leader-elect-name={self.lease_name}",
            f"--leader-elect-lease-duration={_seconds(duration)}",
            f"--leader-elect-renew-deadline={_seconds(renew)}",
            f"--leader-elect-retry-period={_seconds(retry)}",
            f"--leader-identity=host-{self.name}",
            f"--allocation-key-file={self.key_file}" if self.key_file else "--allow-unsigned-allocations",
            *self.extra_args,
        ]

    async def start(self) -> None:
        """Start the process (its output goes to this process's stderr)."""
        self.proc = await asyncio.create_subprocess_exec(
            *self.command(), stdout=asyncio.subprocess.DEVNULL, env={**os.environ, "PYTHONUNBUFFERED": "1"}
        )

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError(f"replica {self.name} is not started")
        return self.proc.pid

    def signal(self, sig: signal.Signals) -> None:
        """Send ``sig`` to the replica (SIGSTOP pauses it, SIGCONT wakes it)."""
        os.kill(self.pid, sig)

    async def wait_exit(self, within: float) -> int:
        """The exit status, waiting at most ``within`` s (TimeoutError otherwise)."""
        assert self.proc is not None
        async with asyncio.timeout(within):
            return await self.proc.wait()

    async def close(self) -> None:
        """Make sure the process is gone (woken if paused, then killed)."""
        if self.proc is None or self.proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.signal(signal.SIGCONT)
            self.proc.kill()
        await self.proc.wait()

    def url(self, listener: str, path: str) -> str:
        return f"http://127.0.0.1:{self.ports[listener]}{path}"

    async def _ok(self, session: aiohttp.ClientSession, path: str) -> bool:
        try:
            async with session.get(self.url("cluster", path), timeout=aiohttp.ClientTimeout(1)) as resp:
                return resp.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def ready(self, session: aiohttp.ClientSession) -> bool:
        """Whether ``/readyz`` answers 200 (this replica decides)."""
        return await self._ok(session, "/readyz")

    async def synced(self, session: aiohttp.ClientSession) -> bool:
        """Whether ``/readyz/webhook`` answers 200 (its caches are synced, leader or not)."""
        return await self._ok(session, "/readyz/webhook")

    async def extender(self, session: aiohttp.ClientSession, verb: str, body: JSON) -> JSON:
        """POST ``body`` to ``/filter`` or ``/bind``; the decoded answer."""
        timeout = aiohttp.ClientTimeout(_HTTP_TIMEOUT_S)
        async with session.post(self.url("extender", f"/{verb}"), json=body, timeout=timeout) as resp:
            answer = await resp.json(content_type=None)
            if resp.status != 200 or not isinstance(answer, dict):
                raise RuntimeError(f"/{verb} of replica {self.name} answered {resp.status}: {answer!r}")
            return answer

    async def schedule(self, session: aiohttp.ClientSession, pod: JSON, nodes: list[str]) -> str:
        """Filter then bind ``pod`` as kube-scheduler does; the node it was bound to, or the error."""
        meta = pod["metadata"]
        answer = await self.extender(session, "filter", {"Pod": pod, "NodeNames": nodes})
        chosen = answer.get("NodeNames") or []
        if answer.get("Error") or not chosen:
            return f"error: {answer.get('Error') or answer.get('FailedNodes')}"
        args = {
            "PodName": meta["name"],
            "PodNamespace": meta["namespace"],
            "PodUID": meta["uid"],
            "Node": chosen[0],
        }
        bound = await self.extender(session, "bind", args)
        return f"error: {bound['Error']}" if bound.get("Error") else str(chosen[0])


async def wait_for(check: Any, within: float, what: str, poll: float = 0.02) -> float:
    """Await ``check()`` (async) until true; the seconds it took (TimeoutError naming ``what``)."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    while not await check():
        if loop.time() - started > within:
            raise TimeoutError(f"{what}: not within {within:g}s")
        await asyncio.sleep(poll)
    return loop.time() - started


async def leader_of(
    replicas: list[SchedulerProcess], session: aiohttp.ClientSession
) -> SchedulerProcess | None:
    """The one replica whose ``/readyz`` is 200 (None when none or several are)."""
    ready = [r for r in replicas if await r.ready(session)]
    return ready[0] if len(ready) == 1 else None


async def elected(
    replicas: list[SchedulerProcess], session: aiohttp.ClientSession, within: float
) -> SchedulerProcess:
    """The one replica that decides, once there is one (TimeoutError past ``within`` seconds)."""

    async def one() -> bool:
        return await leader_of(replicas, session) is not None

    await wait_for(one, within, "one replica decides")
    leader = await leader_of(replicas, session)
    if leader is None:
        raise TimeoutError("leadership changed while it was read")
    return leader
