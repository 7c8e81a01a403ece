"""How a device plugin hands GPUs to the NVIDIA container stack (one definition of each name).

The device list strategies, paths and environment variables are those of NVIDIA's k8s-device-plugin
(``api/config/v1``, ``internal/plugin/server.go``), which HAMi's plugin copies. The CDI kinds are
the ones ``nvidia-ctk cdi generate`` writes by default (vendor ``nvidia.com``), not the
``k8s.device-plugin.nvidia.com`` kind NVIDIA's and HAMi's plugins generate for themselves: hamid
generates no spec and names devices of the spec the node already has.
"""

from __future__ import annotations

#: ``NVIDIA_VISIBLE_DEVICES=<GPU UUIDs>``, read by the NVIDIA container runtime (the default).
ENVVAR = "envvar"
#: ``NVIDIA_VISIBLE_DEVICES`` names :data:`VOLUME_MOUNTS_ROOT`; one mount per GPU under it.
VOLUME_MOUNTS = "volume-mounts"
#: CDI devices in a ``cdi.k8s.io/`` container annotation.
CDI_ANNOTATIONS = "cdi-annotations"
#: CDI devices in the ``Allocate`` answer's ``cdi_devices`` (CRI field; kubelet 1.29+: the
#: DevicePluginCDIDevices gate is off in 1.28, and an older kubelet drops them silently).
CDI_CRI = "cdi-cri"
#: Every strategy, in upstream's order.
STRATEGIES = (ENVVAR, VOLUME_MOUNTS, CDI_ANNOTATIONS, CDI_CRI)
CDI_STRATEGIES = (CDI_ANNOTATIONS, CDI_CRI)

#: Directory whose entries (named by GPU UUID) list the GPUs with ``volume-mounts``.
VOLUME_MOUNTS_ROOT = "/var/run/nvidia-container-devices"
#: What each of those entries is a mount of.
VOLUME_MOUNTS_HOST_PATH = "/dev/null"

#: CDI vendor and the kind of the GPU devices (``nvidia.com/gpu=<UUID>``).
CDI_VENDOR = "nvidia.com"
GPU_KIND = f"{CDI_VENDOR}/gpu"
#: The plugin name in the CDI annotation key (``cdi.k8s.io/nvidia-device-plugin_<response id>``).
CDI_ANNOTATION_PLUGIN = "nvidia-device-plugin"

#: Optional features a GPU container may be started with (upstream's order).
GDRCOPY = "gdrcopy"
GDS = "gds"
MOFED = "mofed"
FEATURES = (GDRCOPY, GDS, MOFED)
#: The runtime's switch for each feature, set to :data:`FEATURE_ENABLED`.
ENV_GDRCOPY = "NVIDIA_GDRCOPY"
ENV_GDS = "NVIDIA_GDS"
ENV_MOFED = "NVIDIA_MOFED"
FEATURE_ENVS = {GDRCOPY: ENV_GDRCOPY, GDS: ENV_GDS, MOFED: ENV_MOFED}
FEATURE_ENABLED = "enabled"
#: With CDI, a feature is the device ``all`` of its own kind (``nvidia.com/gds=all``).
FEATURE_DEVICE = "all"


def feature_kind(feature: str) -> str:
    """The CDI kind of a feature's device (``nvidia-ctk cdi generate --mode=<f> --class=<f>``)."""
    return f"{CDI_VENDOR}/{feature}"
