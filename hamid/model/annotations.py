"""Every HAMi annotation key and label (one definition each), and their codecs."""

from __future__ import annotations

# --- node annotations ---------------------------------------------------------------------
NODE_REGISTER = "hami.io/node-nvidia-register"
NODE_SCORE = "hami.io/node-nvidia-score"
NODE_HANDSHAKE = "hami.io/node-handshake"
NODE_LOCK = "hami.io/mutex.lock"
DEVICE_CORDON = "hami.io/device-cordon"

# --- pod annotations written by the scheduler and the plugin --------------------------------
VGPU_NODE = "hami.io/vgpu-node"  # annotation and label
VGPU_TIME = "hami.io/vgpu-time"
DEVICES_TO_ALLOCATE = "hami.io/vgpu-devices-to-allocate"
DEVICES_ALLOCATED = "hami.io/vgpu-devices-allocated"
MIG_ALLOCATIONS = "hami.io/vgpu-mig-allocations"
BIND_TIME = "hami.io/bind-time"
BIND_PHASE = "hami.io/bind-phase"
BIND_PHASE_ALLOCATING = "allocating"
BIND_PHASE_SUCCESS = "success"
BIND_PHASE_FAILED = "failed"

# --- pod annotations set by users ----------------------------------------------------------
USE_GPU_UUID = "nvidia.com/use-gpuuuid"
NOUSE_GPU_UUID = "nvidia.com/nouse-gpuuuid"
USE_GPU_TYPE = "nvidia.com/use-gputype"
NOUSE_GPU_TYPE = "nvidia.com/nouse-gputype"
NUMA_BIND = "nvidia.com/numa-bind"
VGPU_MODE = "nvidia.com/vgpu-mode"
GPU_SCHEDULER_POLICY = "hami.io/gpu-scheduler-policy"
NODE_SCHEDULER_POLICY = "hami.io/node-scheduler-policy"
DEVICE_SCORING_WEIGHTS = "hami.io/device-scoring-weights"
NUMA_ALIGNMENT = "hami.io/numa-alignment"

# --- labels -------------------------------------------------------------------------------
SCHEDULER_ROLE = "hami.io/scheduler-role"
WEBHOOK = "hami.io/webhook"
WEBHOOK_IGNORE = "ignore"
POD_GROUP = "scheduling.x-k8s.io/pod-group"
