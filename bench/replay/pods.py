"""The openb trace as the FGD experiment reads it: nodes, pods, the seeded arrival, the pod manifests.

Read from ``../shared/traces/openb/`` (never copied into the repository); see
``docs/packing.md`` (method) for the mapping of a trace pod onto a Kubernetes pod.
"""

from __future__ import annotations

import csv
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hamid.model import annotations as ann
from hamid.model.resources import ResourceConfig

#: Where the shared trace lives, relative to the repository root (``../shared/traces/openb``).
TRACE_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "traces" / "openb"
NODES_CSV = TRACE_DIR / "openb_node_list_gpu_node.csv"
PODS_CSV = TRACE_DIR / "openb_pod_list_default.csv"
PUBLISHED_CSV = TRACE_DIR / "fgd_published_results.csv"
WHERE_TO_GET = (
    "the public openb trace is Alibaba's cluster-trace-gpu-v2023 (github.com/alibaba/clusterdata, "
    "folder cluster-trace-gpu-v2023/csv/; also hkust-adsl/kubernetes-scheduler-simulator, data/csv/)"
)
#: Trace QoS classes whose GPU pods become Guaranteed, NUMA-aligned pods when NUMA is on.
ALIGNED_QOS = ("LS", "Guaranteed")
#: The experiment inflates the arrivals with clones until this share of the cluster's GPUs.
INFLATION = 1.3
MILLI = 1000
RESOURCES = ResourceConfig()


class TraceError(Exception):
    """A trace file that is missing or cannot be read (the message says which and why)."""


@dataclass(frozen=True, slots=True)
class TraceNode:
    """One GPU node of ``openb_node_list_gpu_node.csv``."""

    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str


@dataclass(frozen=True, slots=True)
class TracePod:
    """One pod of ``openb_pod_list_default.csv`` (``gpu_milli`` per GPU; 0 GPUs: CPU only)."""

    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_spec: str
    qos: str

    @property
    def gpu_request(self) -> int:
        """The milli-GPUs the pod asks for in all (what "arrived" counts)."""
        return self.num_gpu * self.gpu_milli if self.num_gpu else 0

    @property
    def gpu_models(self) -> tuple[str, ...] | None:
        """The GPU models it accepts (``gpu_spec`` ``A|B``; None: any)."""
        return tuple(self.gpu_spec.split("|")) if self.gpu_spec else None

    @property
    def gpu_percent(self) -> int:
        """Its share of each GPU, in percent of the GPU's cores and memory (100: whole GPUs)."""
        return self.gpu_milli // 10


def _rows(path: Path, columns: Sequence[str]) -> list[dict[str, str]]:
    if not path.is_file():
        raise TraceError(f"trace file {path} not found: {WHERE_TO_GET}")
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in columns if c not in (reader.fieldnames or ())]
        if missing:
            raise TraceError(f"{path}: missing columns {missing}")
        return list(reader)


def _int(row: dict[str, str], key: str, where: str) -> int:
    try:
        value = int(row[key] or 0)
    except ValueError:
        raise TraceError(f"{where}: {key} {row[key]!r} is not an integer") from None
    if value < 0:
        raise TraceError(f"{where}: {key} {value} is negative")
    return value


def read_nodes(path: Path) -> list[TraceNode]:
    """The trace's GPU nodes (TraceError when the file is missing or malformed)."""
    nodes = []
    for line, row in enumerate(_rows(path, ("sn", "cpu_milli", "memory_mib", "gpu", "model")), start=2):
        where = f"{path}:{line}"
        nodes.append(
            TraceNode(
                row["sn"],
                _int(row, "cpu_milli", where),
                _int(row, "memory_mib", where),
                _int(row, "gpu", where),
                row["model"],
            )
        )
    if not nodes:
        raise TraceError(f"{path}: no nodes")
    return nodes


def read_pods(path: Path) -> list[TracePod]:
    """The trace's pods (TraceError when the file is missing or malformed)."""
    columns = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec", "qos")
    pods = []
    for line, row in enumerate(_rows(path, columns), start=2):
        where = f"{path}:{line}"
        pod = TracePod(
            row["name"],
            _int(row, "cpu_milli", where),
            _int(row, "memory_mib", where),
            _int(row, "num_gpu", where),
            _int(row, "gpu_milli", where),
            row["gpu_spec"].strip(),
            row["qos"].strip(),
        )
        if pod.num_gpu and not 0 < pod.gpu_milli <= MILLI:
            raise TraceError(f"{where}: gpu_milli {pod.gpu_milli} is not within (0, 1000]")
        if pod.num_gpu > 1 and pod.gpu_milli != MILLI:
            raise TraceError(f"{where}: a pod of {pod.num_gpu} GPUs must ask for whole GPUs")
        pods.append(pod)
    if not pods:
        raise TraceError(f"{path}: no pods")
    return pods


def parse_seeds(text: str) -> list[int]:
    """``42``, ``42,44`` or ``42-51``."""
    seeds: list[int] = []
    try:
        for part in text.split(","):
            low, _, high = part.partition("-")
            seeds.extend(range(int(low), int(high or low) + 1))
    except ValueError:
        raise SystemExit(f"--seeds: {text!r} is not like 42, 42,44 or 42-51") from None
    return seeds


def arrivals(pods: Sequence[TracePod], capacity_milli: int, seed: int) -> list[TracePod]:
    """The experiment's sequence: the pods shuffled with ``seed``, then uniformly drawn clones of
    trace pods appended until the arrived GPU request reaches :data:`INFLATION` of the capacity."""
    rng = random.Random(seed)
    sequence = list(pods)
    rng.shuffle(sequence)
    arrived = sum(p.gpu_request for p in sequence)
    if not any(p.gpu_request for p in pods):
        return sequence
    clone = 0
    while arrived < INFLATION * capacity_milli:
        pod = rng.choice(pods)
        clone += 1
        sequence.append(replace(pod, name=f"{pod.name}-clone-{clone}"))
        arrived += pod.gpu_request
    return sequence


def aligned_shape(pod: TracePod, numa: bool) -> bool:
    """Whether the pod becomes Guaranteed with whole CPUs and ``numa-alignment: best-effort``."""
    return numa and pod.num_gpu > 0 and pod.qos in ALIGNED_QOS


def manifest(pod: TracePod, uid: str, numa: bool) -> dict[str, Any]:
    """The Kubernetes pod a trace pod becomes (before the webhook), as ``docs/packing.md`` states.

    NUMA on: a GPU pod of QoS ``LS``/``Guaranteed`` is Guaranteed (whole CPUs, rounded up, limits =
    requests) and opts into ``hami.io/numa-alignment: best-effort``; every other pod (and every pod
    with NUMA off) is Burstable with its exact requests. A share of one GPU asks ``gpucores`` =
    ``gpumem-percentage`` = ``gpu_milli / 10``; whole GPUs ask for 100 % of each.
    """
    annotations: dict[str, str] = {}
    if aligned_shape(pod, numa):
        cpu = str(math.ceil(pod.cpu_milli / MILLI))
        amounts = {"cpu": cpu, "memory": f"{pod.memory_mib}Mi"}
        resources: dict[str, Any] = {"requests": dict(amounts), "limits": dict(amounts)}
        annotations[ann.NUMA_ALIGNMENT] = "best-effort"
    else:
        resources = {"requests": {"cpu": f"{pod.cpu_milli}m", "memory": f"{pod.memory_mib}Mi"}}
    if pod.num_gpu:
        percent = str(pod.gpu_percent)
        resources.setdefault("limits", {}).update(
            {
                RESOURCES.resource_count_name: str(pod.num_gpu),
                RESOURCES.resource_core_name: percent,
                RESOURCES.resource_memory_percentage_name: percent,
            }
        )
    if pod.gpu_spec:
        annotations[ann.USE_GPU_TYPE] = ",".join(pod.gpu_models or ())
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod.name, "namespace": "default", "uid": uid, "annotations": annotations},
        "spec": {"containers": [{"name": "main", "image": "trace", "resources": resources}]},
        "status": {"phase": "Pending"},
    }
