"""HAMi-core (``libvgpu.so``) contract: environment variable names and mount paths (one definition).

The device plugin hands these to every hami-core container in its ``Allocate`` answer; the names
and paths are what HAMi v2.10's plugin writes and what ``libvgpu.so`` reads.
"""

from __future__ import annotations

import posixpath

#: Comma-joined GPU UUIDs the NVIDIA container runtime exposes.
ENV_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
#: Per-device memory limit, ``CUDA_DEVICE_MEMORY_LIMIT_<i>=<MiB>m`` (i = 0-based device position).
ENV_MEMORY_LIMIT_PREFIX = "CUDA_DEVICE_MEMORY_LIMIT_"
#: Streaming-multiprocessor (core) limit in percent, taken from the container's first device.
ENV_SM_LIMIT = "CUDA_DEVICE_SM_LIMIT"
#: Path (inside the container) of the shared usage cache file.
ENV_SHARED_CACHE = "CUDA_DEVICE_MEMORY_SHARED_CACHE"
#: ``true`` when device memory is scaled above physical memory (``devicememoryscaling`` > 1).
ENV_OVERSUBSCRIBE = "CUDA_OVERSUBSCRIBE"
#: HAMi-core log level (0 error, 1 warnings, 3 infos, 4 debugs).
ENV_LOG_LEVEL = "LIBCUDA_LOG_LEVEL"
#: Container env var that, when it parses as true, skips the ``/etc/ld.so.preload`` mount.
ENV_DISABLE_CONTROL = "CUDA_DISABLE_CONTROL"
#: ``disable`` when the node's device config turns the core limit off.
ENV_CORE_UTILIZATION_POLICY = "GPU_CORE_UTILIZATION_POLICY"
#: A container's task priority (0 the highest; HAMi-core's default 1), from ``nvidia.com/priority``.
ENV_TASK_PRIORITY = "CUDA_TASK_PRIORITY"
CORE_UTILIZATION_POLICY_DISABLE = "disable"

#: Directory under ``HOOK_PATH`` that holds HAMi-core on the host and is mounted in containers.
VGPU_DIR_NAME = "vgpu"
LIBVGPU_NAME = "libvgpu.so"
LD_SO_PRELOAD_HOST_NAME = "ld.so.preload"
#: Container path of the preload list that makes every process load ``libvgpu.so``.
LD_SO_PRELOAD = "/etc/ld.so.preload"
#: Host and container path of HAMi-core's cross-container lock directory.
VGPU_LOCK_DIR = "/tmp/vgpulock"
#: Directory (under ``<HOOK_PATH>/vgpu``) holding one cache directory per container.
CONTAINERS_DIR_NAME = "containers"
CACHE_SUFFIX = ".cache"
#: Host files under ``<HOOK_PATH>/vgpu``: when the license exists, both are mounted read-only.
LICENSE_HOST_NAME = "license"
VGPU_VALIDATOR_HOST_NAME = "vgpuvalidator"
#: Container paths of the license and of the validator binary.
LICENSE = "/tmp/license"
VGPU_VALIDATOR = "/usr/bin/vgpuvalidator"


def memory_limit_env(position: int) -> str:
    """``CUDA_DEVICE_MEMORY_LIMIT_<position>``."""
    return f"{ENV_MEMORY_LIMIT_PREFIX}{position}"


def memory_limit_value(mib: int) -> str:
    """The memory-limit value HAMi-core parses: ``<MiB>m``."""
    return f"{mib}m"


def vgpu_dir(hook_path: str) -> str:
    """``<HOOK_PATH>/vgpu`` (host side and container side)."""
    return posixpath.join(hook_path, VGPU_DIR_NAME)


def libvgpu_path(hook_path: str) -> str:
    """``<HOOK_PATH>/vgpu/libvgpu.so``."""
    return posixpath.join(vgpu_dir(hook_path), LIBVGPU_NAME)


def ld_so_preload_host_path(hook_path: str) -> str:
    """Host file mounted over ``/etc/ld.so.preload``: ``<HOOK_PATH>/vgpu/ld.so.preload``."""
    return posixpath.join(vgpu_dir(hook_path), LD_SO_PRELOAD_HOST_NAME)


def license_host_path(hook_path: str) -> str:
    """``<HOOK_PATH>/vgpu/license`` (its existence turns the license mounts on)."""
    return posixpath.join(vgpu_dir(hook_path), LICENSE_HOST_NAME)


def vgpu_validator_host_path(hook_path: str) -> str:
    """``<HOOK_PATH>/vgpu/vgpuvalidator``, mounted at ``/usr/bin/vgpuvalidator``."""
    return posixpath.join(vgpu_dir(hook_path), VGPU_VALIDATOR_HOST_NAME)


def containers_dir(hook_path: str) -> str:
    """``<HOOK_PATH>/vgpu/containers``: one cache directory per container, ``<podUID>_<name>``."""
    return posixpath.join(vgpu_dir(hook_path), CONTAINERS_DIR_NAME)


def container_cache_dir(hook_path: str, pod_uid: str, container_name: str) -> str:
    """Host directory mounted at ``<HOOK_PATH>/vgpu`` for one container: ``.../containers/<uid>_<name>``."""
    return posixpath.join(containers_dir(hook_path), f"{pod_uid}_{container_name}")


def shared_cache_path(hook_path: str, token: str) -> str:
    """Container path of the shared cache file: ``<HOOK_PATH>/vgpu/<token>.cache``."""
    return posixpath.join(vgpu_dir(hook_path), token + CACHE_SUFFIX)
