"""The simulated kubelet's PodResources answer: the containers kubelet's ``List`` and ``Get`` report.

kubelet (``pkg/kubelet/apis/podresources/server_v1.go``) walks ``spec.initContainers`` keeping the
restartable ones only, then ``spec.containers``; its ``TestListPodResourcesWithInitContainersV1``
lists the app container alone for "pod having an init container". The simulator listed every
container, so the node agent's placements showed regular init containers kubelet never reports
(outside audit s24, F1).
"""

from __future__ import annotations

from hamidsim.kubelet.assignment import ContainerAssignment, PodAdmission
from hamidsim.kubelet.podresources import PodResourcesView


def _record() -> PodAdmission:
    """A pod admitted with a regular init container, a sidecar and two app containers."""
    containers = [
        ContainerAssignment("init", 0, True, None, cpus=frozenset({1, 2})),
        ContainerAssignment("side", 1, True, None, cpus=frozenset({1}), restartable=True),
        ContainerAssignment("app", 2, False, None, cpus=frozenset({2})),
        ContainerAssignment("shared", 3, False, None),
    ]
    return PodAdmission("default", "p", "uid-p", "n1", True, containers=containers)


def test_list_reports_sidecars_then_app_containers_never_a_regular_init_container() -> None:
    view = PodResourcesView(list, dict, frozenset, lambda _resource: {})
    listed = view.pod(_record()).containers
    assert [c.name for c in listed] == ["side", "app", "shared"]
    assert [list(c.cpu_ids) for c in listed] == [[1], [2], []]


def test_the_assignment_annotation_keeps_which_init_containers_restart() -> None:
    """A restarted simulated kubelet reads its records back from the annotation: a sidecar stays
    listed after that."""
    record = _record()
    again = PodAdmission.from_json(record.namespace, record.name, record.to_json())
    assert [(c.name, c.init, c.restartable) for c in again.containers] == [
        ("init", True, False),
        ("side", True, True),
        ("app", False, False),
        ("shared", False, False),
    ]
