"""Per-container requests (docs/hami-wire.md §1.2 vectors), quantities, pods and the device-config YAML."""

from __future__ import annotations

from typing import Any

import pytest

from hamid.model.errors import InvalidInput
from hamid.model.mig import AllowedMigProfiles
from hamid.model.nodeconfig import NodeConfig
from hamid.model.resources import (
    MEM_PERCENTAGE_UNSET,
    ContainerDeviceRequest,
    DeviceConfig,
    ResourceConfig,
    all_containers,
    container_request,
    init_container_count,
    is_sidecar,
    load_device_config,
    pod_requests,
)

GPU, MEM, PCT, CORES = (
    "nvidia.com/gpu",
    "nvidia.com/gpumem",
    "nvidia.com/gpumem-percentage",
    "nvidia.com/gpucores",
)


def ctr(limits: dict[str, Any] | None = None, requests: dict[str, Any] | None = None) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if limits is not None:
        resources["limits"] = limits
    if requests is not None:
        resources["requests"] = requests
    return {"name": "c", "resources": resources}


def req(nums: int, mem: int, pct: int, cores: int) -> ContainerDeviceRequest:
    return ContainerDeviceRequest(
        nums=nums, type="NVIDIA", memreq=mem, mem_percentage_req=pct, coresreq=cores
    )


# TestGenerateResourceRequests (factor 1, nvidia.com/* names), plus TestGenerateResourceRequests_* variants.
@pytest.mark.parametrize(
    ("container", "expected"),
    [
        (ctr({GPU: "1"}), req(1, 0, 100, 0)),
        (ctr({GPU: "2", MEM: "4096"}), req(2, 4096, 101, 0)),
        (ctr({GPU: "1", PCT: "50"}), req(1, 0, 50, 0)),
        (ctr({GPU: "1", PCT: "150"}), req(1, 0, 100, 0)),
        (ctr({GPU: "1", PCT: "101"}), req(1, 0, 100, 0)),
        (ctr({GPU: "1", PCT: str(2**32 + 50)}), req(1, 0, 100, 0)),
        (ctr({GPU: "1", PCT: "0"}), req(1, 0, 100, 0)),
        (ctr({GPU: "1", PCT: "-1"}), req(1, 0, 100, 0)),
        (ctr({GPU: "1", MEM: "2000", PCT: "0"}), req(1, 2000, 101, 0)),
        (ctr({GPU: "1", CORES: "50"}), req(1, 0, 100, 50)),
        (ctr(requests={GPU: "1"}), req(1, 0, 100, 0)),
        (ctr({GPU: "1", MEM: "16Gi"}), None),
        (ctr({GPU: "1", MEM: "16.0Gi"}), None),
    ],
)
def test_generate_resource_requests_vectors(
    container: dict[str, Any], expected: ContainerDeviceRequest
) -> None:
    assert container_request(container, ResourceConfig()) == expected


def test_memory_factor() -> None:
    config = ResourceConfig(memory_factor=2)
    assert container_request(ctr({GPU: "1", MEM: "1024"}), config) == req(1, 2048, 101, 0)
    assert container_request(ctr({GPU: "1", MEM: "1Gi"}), config) is None
    # MaxInt32 // factor is the largest accepted value
    assert container_request(ctr({GPU: "1", MEM: str((2**31 - 1) // 2)}), config) is not None
    assert container_request(ctr({GPU: "1", MEM: str((2**31 - 1) // 2 + 1)}), config) is None
    # factor 0 or negative acts as 1
    assert container_request(ctr({GPU: "1", MEM: "10"}), ResourceConfig(memory_factor=0)) == req(
        1, 10, 101, 0
    )


def test_default_memory_keeps_percentage_unset() -> None:
    config = ResourceConfig(default_memory=512)
    assert container_request(ctr({GPU: "1"}), config) == req(1, 512, MEM_PERCENTAGE_UNSET, 0)
    # an explicit percentage wins over defaultMemory
    assert container_request(ctr({GPU: "1", PCT: "30"}), config) == req(1, 0, 30, 0)


def test_default_cores_and_explicit_cores() -> None:
    config = ResourceConfig(default_cores=20)
    assert container_request(ctr({GPU: "1"}), config) == req(1, 0, 100, 20)
    assert container_request(ctr({GPU: "1", CORES: "0"}), config) == req(1, 0, 100, 0)
    # not an integer: the default, as HAMi (``AsInt64`` fails, ``corenum`` stays the default)
    assert container_request(ctr({GPU: "1", CORES: "0.5"}), config) == req(1, 0, 100, 20)


def test_limits_before_requests_per_resource() -> None:
    container = ctr({GPU: "2", MEM: "1000"}, {GPU: "1", MEM: "3000", CORES: "40"})
    assert container_request(container, ResourceConfig()) == req(2, 1000, 101, 40)


@pytest.mark.parametrize(
    "container",
    [
        {"name": "none"},
        ctr({"cpu": "1"}),
        ctr({GPU: "0"}),
        ctr({GPU: "-1"}),
        ctr({GPU: "1.5"}),
        ctr({GPU: "500m"}),
        ctr({GPU: str(2**31)}),
        ctr({GPU: "1", MEM: "1.5"}),
        ctr({GPU: "1", MEM: "-1"}),
        ctr({GPU: "1", CORES: "-5"}),
    ],
)
def test_empty_requests(container: dict[str, Any]) -> None:
    assert container_request(container, ResourceConfig()) is None


def test_numbers_and_canonical_quantities_are_integers() -> None:
    # the API server serves 2000 as "2k"; JSON numbers are accepted too
    assert container_request(ctr({GPU: 1, MEM: "2k"}), ResourceConfig()) == req(1, 2000, 101, 0)
    assert container_request(ctr({GPU: 2.0, MEM: 4096}), ResourceConfig()) == req(2, 4096, 101, 0)
    assert container_request(ctr({GPU: "1", MEM: "1Ki"}), ResourceConfig()) == req(1, 1024, 101, 0)


def test_custom_resource_names() -> None:
    config = ResourceConfig(resource_count_name="example.com/vgpu", resource_memory_name="example.com/vmem")
    assert container_request(ctr({"example.com/vgpu": "1", "example.com/vmem": "100"}), config) == req(
        1, 100, 101, 0
    )
    assert container_request(ctr({GPU: "1"}), config) is None


def test_invalid_quantity_names_container_and_resource() -> None:
    with pytest.raises(InvalidInput, match=r"'c'.*nvidia.com/gpumem"):
        container_request(ctr({GPU: "1", MEM: "lots"}), ResourceConfig())


@pytest.mark.parametrize(
    "container",
    [{"name": "c", "resources": []}, {"name": "c", "resources": {"limits": "x"}}, "not a container"],
)
def test_malformed_container_raises(container: Any) -> None:
    with pytest.raises(InvalidInput):
        container_request(container, ResourceConfig())


POD: dict[str, Any] = {
    "metadata": {"name": "p", "namespace": "ns"},
    "spec": {
        "initContainers": [
            {"name": "init", "resources": {"limits": {GPU: "1", MEM: "500"}}},
            {"name": "sidecar", "restartPolicy": "Always"},
        ],
        "containers": [
            {"name": "main", "resources": {"limits": {GPU: "1", MEM: "2000", CORES: "50"}}},
            {"name": "nogpu"},
        ],
    },
}


def test_pod_requests_init_first() -> None:
    assert [c["name"] for c in all_containers(POD)] == ["init", "sidecar", "main", "nogpu"]
    assert init_container_count(POD) == 2
    assert pod_requests(POD, ResourceConfig()) == [req(1, 500, 101, 0), None, req(1, 2000, 101, 50), None]


def test_pod_without_spec_or_containers() -> None:
    assert all_containers({}) == []
    assert pod_requests({"spec": {"containers": []}}, ResourceConfig()) == []


@pytest.mark.parametrize(
    "pod", [[], {"spec": []}, {"spec": {"containers": {}}}, {"spec": {"initContainers": ["x"]}}]
)
def test_malformed_pod_raises(pod: Any) -> None:
    with pytest.raises(InvalidInput):
        pod_requests(pod, ResourceConfig())


def test_is_sidecar() -> None:
    init, sidecar = POD["spec"]["initContainers"]
    assert is_sidecar(sidecar)
    assert not is_sidecar(init)
    assert not is_sidecar({"restartPolicy": "OnFailure"})


# ---- device config YAML ------------------------------------------------------------------------

CHART_CONFIG = """
nvidia:
  resourceCountName: nvidia.com/gpu
  resourceMemoryName: nvidia.com/gpumem
  resourceMemoryPercentageName: nvidia.com/gpumem-percentage
  resourceCoreName: nvidia.com/gpucores
  resourcePriorityName: nvidia.com/priority
  overwriteEnv: false
  defaultMemory: 0
  defaultCores: 0
  defaultGPUNum: 1
  memoryFactor: 1
  deviceSplitCount: 10
  deviceMemoryScaling: 1
  deviceCoreScaling: 1
  libCudaLogLevel: 1
  gpuCorePolicy: default
  runtimeClassName: ""
  migProfileAllowlist:
    - models: ["A100"]
      profiles: ["1g.5gb"]
cambricon:
  resourceCountName: cambricon.com/vmlu
"""


def test_load_chart_device_config() -> None:
    config = load_device_config(CHART_CONFIG)
    assert config.resources == ResourceConfig()
    assert config.node_defaults == NodeConfig(device_split_count=10, lib_cuda_log_level="1")
    assert config.mig_profile_allowlist == (AllowedMigProfiles(("A100",), ("1g.5gb",)),)


def test_load_device_config_overrides() -> None:
    text = """
nvidia:
  resourceCountName: example.com/gpu
  defaultMemory: 1024
  defaultCores: 10
  defaultGPUNum: 2
  memoryFactor: 4
  overwriteEnv: true
  disableCoreLimit: true
  gpuCorePolicy: force
  runtimeClassName: nvidia
  deviceSplitCount: 4
  deviceMemoryScaling: 1.5
  deviceCoreScaling: 2
  preConfiguredDeviceMemory: 8192
  libCudaLogLevel: "4"
  enableNumaTopology: true
"""
    config = load_device_config(text)
    assert config.resources == ResourceConfig(
        resource_count_name="example.com/gpu",
        default_memory=1024,
        default_cores=10,
        default_gpu_num=2,
        memory_factor=4,
        overwrite_env=True,
        disable_core_limit=True,
        gpu_core_policy="force",
        runtime_class_name="nvidia",
    )
    assert config.node_defaults == NodeConfig(
        device_split_count=4,
        device_memory_scaling=1.5,
        device_core_scaling=2.0,
        preconfigured_device_memory=8192,
        lib_cuda_log_level="4",
        enable_numa_topology=True,
    )


@pytest.mark.parametrize("text", ["", "# nothing\n", "other: {}\n", "nvidia:\n"])
def test_load_device_config_defaults(text: str) -> None:
    assert load_device_config(text) == DeviceConfig()


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("nvidia: [1]", "nvidia"),
        ("- a\n- b\n", "device config"),
        ("nvidia:\n  defaultMemory: -1\n", "defaultMemory"),
        ("nvidia:\n  defaultCores: ten\n", "defaultCores"),
        ("nvidia:\n  overwriteEnv: 1\n", "overwriteEnv"),
        ("nvidia:\n  resourceCountName: ''\n", "resourceCountName"),
        ("nvidia:\n  gpuCorePolicy: sometimes\n", "gpuCorePolicy"),
        ("nvidia:\n  deviceSplitCount: -2\n", "devicesplitcount"),
        ("nvidia:\n  deviceMemoryScaling: 0\n", "devicememoryscaling"),
        ("nvidia:\n  libCudaLogLevel: loud\n", "libCudaLogLevel"),
        ("nvidia: {a: [}\n", "not valid YAML"),
        (f"nvidia:\n  deviceCoreScaling: {10**400}\n", "out of range"),  # no OverflowError
        ("nvidia:\n  when: 2026-13-01\n", "not valid YAML: month must be in 1..12"),
        ("nvidia:\n  migProfileAllowlist: {models: [A30]}\n", "migProfileAllowlist"),
        ("nvidia:\n  migProfileAllowlist: [{models: [A30], profiles: [big]}]\n", r"migProfileAllowlist\[0\]"),
    ],
)
def test_load_device_config_errors(text: str, match: str) -> None:
    with pytest.raises(InvalidInput, match=match):
        load_device_config(text)
