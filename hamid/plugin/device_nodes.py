"""The NVIDIA device nodes ``Allocate`` declares to kubelet as ``DeviceSpec`` (``--pass-device-specs``).

Why: the NVIDIA container runtime adds a GPU container's device nodes behind the runtime's back.
Where the runtime rebuilds a container's device cgroup from its declared devices (runc under the
systemd cgroup driver after ``systemctl daemon-reload``), those nodes are dropped and CUDA fails
with ``Failed to initialize NVML: Unknown Error``. Declared ``DeviceSpec`` entries survive that.

What is declared is what NVIDIA's device plugin (and HAMi's copy of it) declares: the control
nodes that exist, then ``/dev/nvidia<minor>`` of every GPU the container is given, all ``rw``.
The host path is the node under ``--dev-root`` (``/``, or the driver container's root); whether a
node exists is looked up where this process sees that root (``--dev-root-ctr-path``), not in its
own ``/dev``, which the runtime filled for its own needs. Blocking calls: run them in a thread.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from hamid.plugin.errors import AllocationError

#: Control nodes declared when they exist (the order NVIDIA's plugin lists them in).
CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
#: Read and write, no mknod: what NVIDIA's plugin grants.
PERMISSIONS = "rw"
#: Where the driver lists the device minor of each MIG capability (``gpu0/gi1/ci0/access 13``).
MIG_MINORS = "/proc/driver/nvidia-caps/mig-minors"
#: Larger than any mig-minors file (a line per GPU instance and compute instance of every GPU).
MIG_MINORS_LIMIT = 1 << 20
_MIG_MINOR_LINE = re.compile(r"(gpu\d+/gi\d+(?:/ci\d+)?/access) (\d+)\Z")


@dataclass(frozen=True, slots=True)
class DeviceSpec:
    """One device node of an Allocate answer (kubelet's ``v1beta1.DeviceSpec``)."""

    container_path: str
    host_path: str
    permissions: str = PERMISSIONS


def gpu_node(minor: int) -> str:
    """The device node of the GPU with this minor number, as the container sees it."""
    return f"/dev/nvidia{minor}"


def gpu_nodes(uuids: Iterable[str], minor_of: Callable[[str], int | None]) -> dict[str, str]:
    """The device node of each distinct GPU of one container, by UUID in allocation order.

    Refuses (``minor-unknown``) a GPU whose minor number discovery could not read: its node cannot
    be named, and a container without it would lose the GPU at the next reload.
    """
    nodes: dict[str, str] = {}
    for uuid in uuids:
        minor = minor_of(uuid)
        if minor is None:
            raise AllocationError(
                f"--pass-device-specs: the minor number of GPU {uuid} is unknown (NVML could not read "
                "it, or the devices file gives no 'minor'), so its /dev/nvidia<minor> node cannot be "
                "declared; fix discovery or turn --pass-device-specs off",
                code="minor-unknown",
            )
        nodes[uuid] = gpu_node(minor)
    return nodes


def parse_mig_minors(text: str) -> dict[str, int]:
    """The capability minors of ``/proc/driver/nvidia-caps/mig-minors`` by ``gpu<m>/gi<g>[/ci<c>]/access``
    (the ``config``/``monitor`` lines and lines of another shape are left out)."""
    minors: dict[str, int] = {}
    for line in text.splitlines():
        match = _MIG_MINOR_LINE.match(line.strip())
        if match:
            minors[match.group(1)] = int(match.group(2))
    return minors


def mig_nodes(
    minors: Mapping[str, int],
    uuid: str,
    minor_of: Callable[[str], int | None],
    mig_uuid: str,
    instance: tuple[int, int],
) -> dict[str, str]:
    """The device nodes of one MIG device by what each is, as NVIDIA's plugin declares them: the
    parent GPU's (:func:`gpu_nodes`, which refuses an unknown minor), then the capability nodes of
    its GPU instance and compute instance (``instance``). Refuses (``device-node-missing``) a
    capability the driver does not list."""
    parent = gpu_nodes([uuid], minor_of)
    minor = minor_of(uuid)
    gpu_instance, compute_instance = instance
    wanted = (
        f"gpu{minor}/gi{gpu_instance}/access",
        f"gpu{minor}/gi{gpu_instance}/ci{compute_instance}/access",
    )
    missing = [w for w in wanted if w not in minors]
    if missing:
        raise AllocationError(
            f"--pass-device-specs: the driver lists no MIG capability {', '.join(missing)} in {MIG_MINORS}",
            code="device-node-missing",
        )
    gi, ci = (f"/dev/nvidia-caps/nvidia-cap{minors[w]}" for w in wanted)
    return {**parent, f"{mig_uuid} (GPU instance)": gi, f"{mig_uuid} (compute instance)": ci}


@dataclass(frozen=True, slots=True)
class DeviceNodes:
    """Where the NVIDIA device nodes are: under ``dev_root`` on the host (the paths kubelet gets)
    and under ``seen_root`` for this process (where their existence is checked)."""

    dev_root: str = "/"
    seen_root: str = "/"

    def host_path(self, node: str) -> str:
        """``node`` (``/dev/...``) under the host's dev root."""
        return os.path.join(self.dev_root, node.lstrip("/"))

    def seen_path(self, node: str) -> str:
        """``node`` (``/dev/...``) where this process sees it."""
        return os.path.join(self.seen_root, node.lstrip("/"))

    def check_root(self) -> str | None:
        """What is wrong with the seen root's ``dev`` directory (None: a directory). Blocking."""
        path = self.seen_path("/dev")
        if os.path.isdir(path):
            return None
        return (
            f"{path} is not a directory: mount the host's {self.host_path('/dev')} there "
            "(the chart does with devicePlugin.passDeviceSpecs), or point --dev-root-ctr-path at it"
        )

    def present(self, nodes: Iterable[str]) -> frozenset[str]:
        """Which of ``nodes`` exist where this process sees them. Blocking."""
        return frozenset(n for n in nodes if os.path.exists(self.seen_path(n)))

    def specs(self, gpus: Mapping[str, str], present: frozenset[str]) -> tuple[DeviceSpec, ...]:
        """One container's ``DeviceSpec`` entries: the control nodes in ``present``, then the node of
        each GPU (``gpus``: :func:`gpu_nodes`). Refuses (``device-node-missing``) GPU nodes not in
        ``present``: the runtime would fail to create the container, with a vaguer error."""
        missing = [f"{node} of GPU {uuid}" for uuid, node in gpus.items() if node not in present]
        if missing:
            raise AllocationError(
                f"--pass-device-specs: no device node {', '.join(missing)} under {self.seen_path('/dev')}; "
                f"check that --dev-root ({self.dev_root}) is where the driver's device nodes are on the host",
                code="device-node-missing",
            )
        nodes = [*(n for n in CONTROL_NODES if n in present), *gpus.values()]
        return tuple(DeviceSpec(n, self.host_path(n)) for n in dict.fromkeys(nodes))
