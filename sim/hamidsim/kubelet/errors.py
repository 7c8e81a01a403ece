"""kubelet's pod admission failures (``pkg/kubelet/cm/admission``, ``topologymanager``, ``lifecycle``)."""

from __future__ import annotations

REASON_TOPOLOGY_AFFINITY = "TopologyAffinityError"
REASON_UNEXPECTED_ADMISSION = "UnexpectedAdmissionError"
TOPOLOGY_AFFINITY_MESSAGE = "Resources cannot be allocated with Topology locality"
#: ``kubelet.rejectPod`` prefixes the pod status message with this.
REJECTED_PREFIX = "Pod was rejected: "


class AdmissionFailure(Exception):
    """A pod admission failure carrying kubelet's reason and message."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def unexpected(error: str) -> AdmissionFailure:
    """``unexpectedAdmissionError``: any error that is not an admission error of its own type."""
    return AdmissionFailure(
        REASON_UNEXPECTED_ADMISSION, f"Allocate failed due to {error}, which is unexpected"
    )


def topology_affinity_error() -> AdmissionFailure:
    """``TopologyAffinityError``: the merged hint is not preferred under restricted/single-numa-node."""
    return AdmissionFailure(REASON_TOPOLOGY_AFFINITY, TOPOLOGY_AFFINITY_MESSAGE)
