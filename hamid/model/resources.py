"""Resource names and per-container device requests (HAMi ``ContainerDeviceRequest``)."""

from __future__ import annotations

from dataclasses import dataclass

from hamid.model.devices import NVIDIA

#: ``MemPercentagereq`` sentinel meaning "no percentage given".
MEM_PERCENTAGE_UNSET = 101


@dataclass(frozen=True, slots=True)
class ContainerDeviceRequest:
    """What one container asks of one device type (HAMi field names in snake case)."""

    nums: int
    type: str = NVIDIA
    memreq: int = 0
    mem_percentage_req: int = MEM_PERCENTAGE_UNSET
    coresreq: int = 0


@dataclass(frozen=True, slots=True)
class ResourceConfig:
    """HAMi's ``nvidia:`` device-config section (resource names and request defaults)."""

    resource_count_name: str = "nvidia.com/gpu"
    resource_memory_name: str = "nvidia.com/gpumem"
    resource_memory_percentage_name: str = "nvidia.com/gpumem-percentage"
    resource_core_name: str = "nvidia.com/gpucores"
    resource_priority_name: str = "nvidia.com/priority"
    default_memory: int = 0
    default_cores: int = 0
    default_gpu_num: int = 1
    memory_factor: int = 1
    overwrite_env: bool = False
    disable_core_limit: bool = False
    gpu_core_policy: str = "default"
    runtime_class_name: str = ""

    @property
    def resource_names(self) -> tuple[str, ...]:
        """Every HAMi resource name of the NVIDIA path (for ``managedResources``)."""
        return (
            self.resource_count_name,
            self.resource_memory_name,
            self.resource_memory_percentage_name,
            self.resource_core_name,
            self.resource_priority_name,
        )
