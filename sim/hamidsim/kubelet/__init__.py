"""A simulated kubelet, laid out as kubelet's own subsystems (``pkg/kubelet/...``):

==================  ===========================================================================
``registration``    ``v1beta1.Registration`` on ``kubelet.sock`` (devicemanager/plugin/v1beta1 server)
``endpoint``        the connection to one device plugin: dial, options, ListAndWatch, RPCs
``devicemanager``   device state, capacity, topology hints, ``devicesToAllocate``, Allocate
``topologymanager`` hints, bitmasks, merge per policy, policy options, manager checks
``cpumanager``      none/static policies, options, ``SMTAlignmentError``, CPU hints and state
``cpu_assignment``  ``takeByTopologyNUMAPacked`` / ``takeByTopologyNUMADistributed``
``memorymanager``   ``None`` and ``Static`` (memory and hugepages hints, groups, reservedMemory)
``admission``       Topology Manager scopes (container, pod) and the allocatable predicate
``podresources``    the PodResources API v1 server
``status``          pod status writes with retry; ``node`` the node status and manager set-up
``config``          ``KubeletConfiguration`` (kubelet.config.k8s.io/v1beta1)
``cadvisor``        the machine as kubelet sees it: CPUs, cores, sockets, NUMA nodes, distances
``assignment``      the decision record (pod annotation ``sim.hamid.io/assignment``)
``kubelet``         :class:`SimKubelet`, the composition of the above
==================  ===========================================================================

Import rule: as the oracle the product is judged against, this package imports nothing from
``hamid.fit``, ``hamid.scheduler`` or ``hamid.plugin`` (``hamid.model``, ``hamid.kube``,
``hamid._proto`` are fine); ``tests/unit/sim/test_import_rules.py`` enforces it.
"""

from hamidsim.kubelet.assignment import (
    ASSIGNMENT_ANNOTATION,
    ContainerAssignment,
    PodAdmission,
    PreferredCall,
    read_assignment,
)
from hamidsim.kubelet.devicemanager import ResourceState, devices_on_numa
from hamidsim.kubelet.endpoint import rpc_error_text
from hamidsim.kubelet.errors import (
    REASON_TOPOLOGY_AFFINITY,
    REASON_UNEXPECTED_ADMISSION,
    TOPOLOGY_AFFINITY_MESSAGE,
    AdmissionFailure,
)
from hamidsim.kubelet.kubelet import SimKubelet
from hamidsim.kubelet.registration import is_extended_resource_name, sockets_in

__all__ = [
    "ASSIGNMENT_ANNOTATION",
    "REASON_TOPOLOGY_AFFINITY",
    "REASON_UNEXPECTED_ADMISSION",
    "TOPOLOGY_AFFINITY_MESSAGE",
    "AdmissionFailure",
    "ContainerAssignment",
    "PodAdmission",
    "PreferredCall",
    "ResourceState",
    "SimKubelet",
    "devices_on_numa",
    "is_extended_resource_name",
    "read_assignment",
    "rpc_error_text",
    "sockets_in",
]
