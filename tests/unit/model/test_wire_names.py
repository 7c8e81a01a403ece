"""HAMi's wire names pinned by their literal spelling (hami-wire, HAMi-core), not by the code's
own constants: a typo in a constant would otherwise survive every test that imports it."""

from __future__ import annotations

import pytest

from hamid.model import annotations as ann
from hamid.model import cdi, hamicore, nvidia_runtime
from hamid.model.resources import ResourceConfig

ANNOTATIONS = {
    "NODE_REGISTER": "hami.io/node-nvidia-register",
    "NODE_SCORE": "hami.io/node-nvidia-score",
    "NODE_HANDSHAKE": "hami.io/node-handshake",
    "NODE_LOCK": "hami.io/mutex.lock",
    "DEVICE_CORDON": "hami.io/device-cordon",
    "DEVICES_LISTED_FOR": "hamid.io/devices-listed-for",  # hamid's steer handshake (no HAMi key)
    "VGPU_NODE": "hami.io/vgpu-node",
    "VGPU_TIME": "hami.io/vgpu-time",
    "DEVICES_TO_ALLOCATE": "hami.io/vgpu-devices-to-allocate",
    "DEVICES_ALLOCATED": "hami.io/vgpu-devices-allocated",
    "MIG_ALLOCATIONS": "hami.io/vgpu-mig-allocations",
    "BIND_TIME": "hami.io/bind-time",
    "BIND_PHASE": "hami.io/bind-phase",
    "BIND_PHASE_ALLOCATING": "allocating",
    "BIND_PHASE_SUCCESS": "success",
    "BIND_PHASE_FAILED": "failed",
    "ALLOCATION_SIGNATURE": "hamid.io/allocation-signature",
    "ALLOCATION_BOOKED_CONDITION": "hamid.io/AllocationBooked",
    "USE_GPU_UUID": "nvidia.com/use-gpuuuid",
    "NOUSE_GPU_UUID": "nvidia.com/nouse-gpuuuid",
    "USE_GPU_TYPE": "nvidia.com/use-gputype",
    "NOUSE_GPU_TYPE": "nvidia.com/nouse-gputype",
    "NUMA_BIND": "nvidia.com/numa-bind",
    "VGPU_MODE": "nvidia.com/vgpu-mode",
    "GPU_SCHEDULER_POLICY": "hami.io/gpu-scheduler-policy",
    "NODE_SCHEDULER_POLICY": "hami.io/node-scheduler-policy",
    "DEVICE_SCORING_WEIGHTS": "hami.io/device-scoring-weights",
    "NUMA_ALIGNMENT": "hami.io/numa-alignment",
    "SCHEDULER_ROLE": "hami.io/scheduler-role",
    "ROLE_LEADER": "leader",
    "ROLE_FOLLOWER": "follower",
    "WEBHOOK": "hami.io/webhook",
    "WEBHOOK_IGNORE": "ignore",
    "HANDSHAKE_REQUESTING": "Requesting",
    "HANDSHAKE_REPORTED": "Reported",
    "HANDSHAKE_DELETED": "Deleted",
    "MODE_HAMI_CORE": "hami-core",  # the register's operating mode (imported from model.devices)
    # hamid's own NUMA prediction keys (imported from model.numa; no HAMi equivalent)
    "NUMA_PROFILE": "hamid.io/numa-profile",
    "NUMA_PLACEMENT": "hamid.io/numa-placement",
    "NUMA_PREDICTED": "hamid.io/numa-predicted",
}
HAMI_CORE_ENV = {
    "ENV_VISIBLE_DEVICES": "NVIDIA_VISIBLE_DEVICES",
    "ENV_MEMORY_LIMIT_PREFIX": "CUDA_DEVICE_MEMORY_LIMIT_",
    "ENV_SM_LIMIT": "CUDA_DEVICE_SM_LIMIT",
    "ENV_SHARED_CACHE": "CUDA_DEVICE_MEMORY_SHARED_CACHE",
    "ENV_OVERSUBSCRIBE": "CUDA_OVERSUBSCRIBE",
    "ENV_LOG_LEVEL": "LIBCUDA_LOG_LEVEL",
    "ENV_DISABLE_CONTROL": "CUDA_DISABLE_CONTROL",
    "ENV_CORE_UTILIZATION_POLICY": "GPU_CORE_UTILIZATION_POLICY",
    "ENV_TASK_PRIORITY": "CUDA_TASK_PRIORITY",
    "LD_SO_PRELOAD": "/etc/ld.so.preload",
    "VGPU_LOCK_DIR": "/tmp/vgpulock",
    "LIBVGPU_NAME": "libvgpu.so",
}

#: NVIDIA's k8s-device-plugin (api/config/v1, internal/plugin/server.go; HAMi's copy) and nvidia-ctk's
#: default CDI vendor.
NVIDIA_RUNTIME = {
    "ENVVAR": "envvar",
    "VOLUME_MOUNTS": "volume-mounts",
    "CDI_ANNOTATIONS": "cdi-annotations",
    "CDI_CRI": "cdi-cri",
    "VOLUME_MOUNTS_ROOT": "/var/run/nvidia-container-devices",
    "VOLUME_MOUNTS_HOST_PATH": "/dev/null",
    "CDI_VENDOR": "nvidia.com",
    "GPU_KIND": "nvidia.com/gpu",
    "CDI_ANNOTATION_PLUGIN": "nvidia-device-plugin",
    "GDRCOPY": "gdrcopy",
    "GDS": "gds",
    "MOFED": "mofed",
    "ENV_GDRCOPY": "NVIDIA_GDRCOPY",
    "ENV_GDS": "NVIDIA_GDS",
    "ENV_MOFED": "NVIDIA_MOFED",
    "FEATURE_ENABLED": "enabled",
    "FEATURE_DEVICE": "all",
}
#: The CDI specification's (cncf-tags/container-device-interface).
CDI = {"ANNOTATION_PREFIX": "cdi.k8s.io/"}


def _public_strings(module: object) -> dict[str, str]:
    return {
        name: value
        for name, value in vars(module).items()
        if name.isupper() and not name.startswith("_") and isinstance(value, str)
    }


@pytest.mark.parametrize(("name", "literal"), sorted(ANNOTATIONS.items()))
def test_annotation_keys_and_values(name: str, literal: str) -> None:
    assert getattr(ann, name) == literal


def test_every_annotation_constant_is_pinned_here() -> None:
    assert _public_strings(ann).keys() == ANNOTATIONS.keys()


@pytest.mark.parametrize(("name", "literal"), sorted(HAMI_CORE_ENV.items()))
def test_hami_core_environment(name: str, literal: str) -> None:
    assert getattr(hamicore, name) == literal


def test_every_hami_core_env_constant_is_pinned_here() -> None:
    env = {n for n in _public_strings(hamicore) if n.startswith("ENV_")}
    assert env <= HAMI_CORE_ENV.keys()


@pytest.mark.parametrize(
    ("module", "literals"), [(nvidia_runtime, NVIDIA_RUNTIME), (cdi, CDI)], ids=["nvidia", "cdi"]
)
def test_nvidia_runtime_and_cdi_names(module: object, literals: dict[str, str]) -> None:
    assert _public_strings(module) == literals


def test_scheduler_owned_keys_are_the_literal_ones() -> None:
    assert set(ann.SCHEDULER_OWNED_ANNOTATIONS) == {
        "hami.io/vgpu-node",
        "hami.io/vgpu-time",
        "hami.io/vgpu-devices-to-allocate",
        "hami.io/vgpu-devices-allocated",
        "hami.io/vgpu-mig-allocations",
        "hami.io/bind-time",
        "hami.io/bind-phase",
        "hamid.io/allocation-signature",
        "hamid.io/numa-predicted",
        "hamid.io/numa-placement",
    }
    assert ann.SCHEDULER_OWNED_LABELS == ("hami.io/vgpu-node",)


def test_default_resource_names() -> None:
    assert ResourceConfig().resource_names == (
        "nvidia.com/gpu",
        "nvidia.com/gpumem",
        "nvidia.com/gpumem-percentage",
        "nvidia.com/gpucores",
        "nvidia.com/priority",
    )
