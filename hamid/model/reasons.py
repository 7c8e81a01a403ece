"""HAMi's fit-failure reasons and the Event reasons hamid records (one definition each)."""

from __future__ import annotations

# --- per-device fit reasons (HAMi ``pkg/device/common``), counted as "<n>/<m> <Reason>" --------
CARD_TYPE_MISMATCH = "CardTypeMismatch"
CARD_UUID_MISMATCH = "CardUuidMismatch"
CARD_TIME_SLICING_EXHAUSTED = "CardTimeSlicingExhausted"
CARD_COMPUTE_UNITS_EXHAUSTED = "CardComputeUnitsExhausted"
CARD_INSUFFICIENT_MEMORY = "CardInsufficientMemory"
CARD_INSUFFICIENT_CORE = "CardInsufficientCore"
CARD_NOT_HEALTH = "CardNotHealth"
CARD_CORDONED = "CardCordoned"
NUMA_NOT_FIT = "NumaNotFit"
EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT = "ExclusiveDeviceAllocateConflict"
NODE_INSUFFICIENT_DEVICE = "NodeInsufficientDevice"
ALLOCATED_CARDS_INSUFFICIENT_REQUEST = "AllocatedCardsInsufficientRequest"
RESOURCE_QUOTA_NOT_FIT = "ResourceQuotaNotFit"
#: HAMi's dynamic MIG: no allowed profile with the memory has a free placement on the GPU.
CARD_MIG_TOPOLOGY_INFEASIBLE = "CardMigTopologyInfeasible"
ALLOWED_DEVICE_SET_UNMATCHED = "AllowedDeviceSetUnmatched"
NODE_UNREGISTERED = "node unregistered"
#: hamid: the node has a register but its labels do not match ``--node-label-selector`` (HAMi
#: reports such a node, never registered there, as ``node unregistered``).
NODE_NOT_SELECTED = "node unregistered: labels do not match --node-label-selector"
#: hamid: the NUMA predictor says kubelet would reject the pod on the node, or (``strict`` pods) its
#: GPUs cannot be on the NUMA node kubelet will choose.
NUMA_PREDICTED_NOT_FIT = "NumaPredictedNotFit"
#: hamid: kubelet would reject the pod on the node even with nothing else running there (e.g. more
#: exclusive CPUs than any NUMA node holds, beside GPU replicas that fit one, under ``restricted``):
#: no scheduling choice helps; the pod's request, or the node's kubelet policy, must change.
NUMA_NEVER_ADMISSIBLE = "NumaNeverAdmissible"
#: kube-scheduler's NodeResourcesFit reasons, given by the ``fgd`` node policy (which knows every
#: node's CPU and memory) for a node whose room is short of the pod's request.
INSUFFICIENT_CPU = "Insufficient cpu"
INSUFFICIENT_MEMORY = "Insufficient memory"
#: hamid: under the ``fgd`` node policy, a CPU-only pod would strand more GPU capacity on this
#: node than on the candidates hamid kept.
FGD_MORE_FRAGMENTATION = "FgdMoreFragmentation"

# --- Event reasons --------------------------------------------------------------------------
EVENT_FILTERING_SUCCEED = "FilteringSucceed"
EVENT_FILTERING_FAILED = "FilteringFailed"
EVENT_BINDING_SUCCEED = "BindingSucceed"
EVENT_BINDING_FAILED = "BindingFailed"
EVENT_NUMA_REFIT_SUCCEED = "NumaRefitSucceed"
EVENT_NUMA_REFIT_FAILED = "NumaRefitFailed"
EVENT_UNDECODABLE_ALLOCATION = "UndecodableAllocation"
EVENT_ALLOCATION_REFUSED = "AllocationAnnotationRefused"
#: hamid: an allocation its scheduler cannot prove it wrote (unsigned or mis-signed): not booked.
EVENT_ALLOCATION_FOREIGN = "AllocationAnnotationForeign"
#: hamid: a booked pod's allocation annotations were changed after the booking: ignored.
EVENT_ALLOCATION_IGNORED = "AllocationAnnotationIgnored"
