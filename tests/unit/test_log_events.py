"""One log-event style: an event name is a snake_case identifier; what varies goes in key=value fields.

Structured logs are filtered and counted by event name (``jq 'select(.event == "kubelet_registered")'``),
so a name must be a stable identifier, never a sentence with values or advice spliced in. The AST
walk covers every ``log.<level>(...)`` call in ``hamid/`` whose event is a literal (or a choice
between literals). ``PENDING`` holds the events of modules being reworked elsewhere at the time
this check was added, each with its replacement (text to put in place of the literal, fields
included); apply one, delete its row.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EVENT = re.compile(r"[a-z][a-z0-9_]*\Z")
LEVELS = frozenset({"debug", "info", "warning", "error", "exception", "critical"})

#: current event (literal text, or the source of a computed one) -> replacement (module today)
PENDING: dict[str, str] = {
    # kube/events.py
    "event not recorded: bad arguments": '"event_not_recorded", cause="bad arguments"',
    "event not recorded": '"event_not_recorded"',
    # plugin/allocator*.py
    "write failed after the call was cancelled": '"write_failed_after_cancel"',
    "cannot chmod directory (not the owner)": '"chmod_skipped_not_owner"',
    # tests/integration/plugin/test_identity.py matches the text
    "cannot identify the pending pod from the cache; reading node and pods once": (
        '"pending_pod_not_cached_reading_once"'
    ),
    "cannot re-read the pod after NUMA refit; Allocate relies on its resourceVersion guard": (
        '"pod_reread_after_refit_failed", fallback="resourceVersion guard"'
    ),
    "no preferred allocation": '"no_preferred_allocation"',
    "allocation annotation does not fill the request; no preference": (
        '"annotation_short_of_request_no_preference"'
    ),
    # the two branches of one call: replace the whole conditional
    "annotated GPUs not offered; preferring replicas on distinct GPUs": (
        '"annotated_gpus_not_offered", distinct_gpu_preference=bool(chosen)'
    ),
    "annotated GPUs not offered; no distinct-GPU preference possible": (
        '"annotated_gpus_not_offered", distinct_gpu_preference=bool(chosen)'
    ),
    "Allocate refused": '"allocate_refused"',  # tests/integration/plugin/test_bad_input.py matches the text
    "allocation failed": '"allocation_failed"',
    "cannot mark pod bind-phase failed": '"bind_phase_failed_not_marked"',
    # also quoted in README.md, docs/architecture.md, docs/refit.md
    "node lock released": '"node_lock_released"',
    "cannot release node lock": '"node_lock_release_failed"',
    "cannot release node lock: node kept changing": '"node_lock_release_failed", cause="node kept changing"',
    # plugin/app.py, plugin/cli.py
    "no node config file; using defaults": '"node_config_absent_using_defaults"',
    "GPU links unreadable; hami.io/node-nvidia-score is not written": (
        '"gpu_links_unreadable_score_not_written"'
    ),
    "no GPUs to advertise on this node (none discovered, or all filtered/MIG-enabled); not registering "
    "with kubelet or the scheduler": (
        '"no_gpus_to_advertise", cause="none discovered, or all filtered/MIG-enabled"'
    ),
    # tests/integration/plugin/test_housekeeping.py matches the text
    "XID health watcher failed; serving without GPU health checks": '"xid_watcher_failed_no_health_checks"',
    "plugin configured": '"plugin_configured"',
    "plugin stopped": '"plugin_stopped"',
    "warning": '"refit_config_warning", problem=warning',
    # plugin/metrics.py
    "metrics and health endpoints serving": '"metrics_endpoints_serving"',
    # plugin/numa_policy.py
    "NUMA refit succeeded": '"numa_refit_succeeded"',  # also scheduler/refit/handler.py
    "ignoring invalid numa-alignment annotation": '"numa_alignment_annotation_invalid_ignored"',
    # plugin/numa_publisher.py (tests/integration/plugin/test_numa_publisher.py matches some texts)
    "undecodable NUMA prediction; counted unknown": '"numa_prediction_undecodable_counted_unknown"',
    "f'{source} unavailable; {consequence}'": (
        '"numa_source_unavailable", source=source, consequence=consequence'
    ),
    "f'{source} available again'": '"numa_source_available_again", source=source',
    "publishing NUMA profile and placements": '"numa_publishing_started"',
    "the Node's NUMA profile is undecodable; replacing it": '"numa_profile_undecodable_replacing"',
    "NUMA profile published": '"numa_profile_published"',
    "NUMA placement not published": '"numa_placement_not_published"',
    "NUMA prediction checked": '"numa_prediction_checked"',
    "NUMA placement not written; retrying": '"numa_placement_write_failed_retrying"',
    "NUMA placement published": '"numa_placement_published"',
    # plugin/pods.py
    "ignoring unparsable node lock": '"node_lock_unparsable_ignored"',
    # plugin/refit_client.py
    "scheduler TLS verification is DISABLED for NUMA refit (--scheduler-tls-insecure)": (
        '"refit_tls_verification_disabled", flag="--scheduler-tls-insecure"'
    ),
    "refit TLS files changed; TLS context rebuilt": '"refit_tls_context_rebuilt"',
    "NUMA refit disabled: no scheduler endpoint (--scheduler-endpoint)": (
        '"numa_refit_disabled_no_endpoint", flag="--scheduler-endpoint"'
    ),
    # plugin/service.py (tests/integration/plugin/test_deadlines.py matches a text)
    "GetPreferredAllocation failed unexpectedly; answering no preference": (
        '"preferred_allocation_crashed_no_preference"'
    ),
    "Allocate ran past its outer deadline": '"allocate_deadline_passed"',
    "Allocate failed unexpectedly": '"allocate_crashed"',
    # sim/kubelet/* (tests/integration/sim/test_kubelet.py matches some texts), sim/kubelet_cli.py
    "best topology hint": '"best_topology_hint"',
    "registration replaces an earlier endpoint": '"registration_replaces_endpoint"',
    "device plugin connected": '"device_plugin_connected"',
    "ListAndWatch stream closed by the kubelet's own shutdown": '"list_and_watch_closed_on_shutdown"',
    "ListAndWatch ended unexpectedly for device plugin": '"list_and_watch_ended_unexpectedly"',
    "ignoring ListAndWatch update of a replaced endpoint": '"replaced_endpoint_update_ignored"',
    "processed device updates for resource": '"device_updates_processed"',
    "endpoint became unhealthy; all devices marked unhealthy": '"endpoint_unhealthy_all_devices_unhealthy"',
    "GetPreferredAllocation answered no preference": '"preferred_allocation_no_preference"',
    "GetPreferredAllocation answer breaks the contract": '"preferred_allocation_breaks_contract"',
    "GetPreferredAllocation": '"preferred_allocation_called"',
    "Allocate": '"allocate_called"',
    "simulated kubelet started": '"kubelet_started"',
    "simulated kubelet restarted": '"kubelet_restarted"',
    "released pod resources": '"pod_resources_released"',
    "could not confirm a pod deletion": '"pod_deletion_unconfirmed"',
    "running pod has an unreadable assignment": '"running_pod_assignment_unreadable"',
    "restored running pod from its assignment": '"running_pod_restored"',
    "running pod rejected on re-admission": '"running_pod_rejected_on_readmission"',
    "admission crashed": '"admission_crashed"',
    "pod admitted": '"pod_admitted"',
    "pod rejected": '"pod_rejected"',
    "node status update failed": '"node_status_update_failed"',
    "got registration request from device plugin": '"registration_request_received"',
    "bad registration request": '"registration_request_invalid"',
    "error connecting to device plugin client": '"device_plugin_connect_failed"',
    "could not update the pod status; will retry": '"pod_status_update_failed_retrying"',
    "could not record the assignment annotation": '"assignment_annotation_not_recorded"',
    "simulated kubelet stopped": '"kubelet_stopped"',
}


def _events(node: ast.expr) -> Iterator[str | None]:
    """The literal event names a call's first argument can take; None for a computed one."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node.value
    elif isinstance(node, ast.IfExp):
        yield from _events(node.body)
        yield from _events(node.orelse)
    else:
        yield None


def _offences(source: str) -> Iterator[tuple[int, str]]:
    """(line, event) for each log call in ``source`` whose event is not an identifier."""
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr not in LEVELS or not node.args:
            continue
        if not isinstance(node.func.value, ast.Name | ast.Attribute | ast.Call):
            continue
        for event in _events(node.args[0]):
            if event is None:
                yield node.lineno, ast.unparse(node.args[0])
            elif not EVENT.match(event):
                yield node.lineno, event


def _all_offences() -> list[tuple[str, int, str]]:
    out = []
    for path in sorted((ROOT / "hamid").rglob("*.py")):
        if "_proto" in path.parts:
            continue
        rel = path.relative_to(ROOT).as_posix()
        out += [(rel, line, event) for line, event in _offences(path.read_text(encoding="utf-8"))]
    return out


def test_log_events_are_identifiers() -> None:
    bad = [f"{path}:{line}: {event!r}" for path, line, event in _all_offences() if event not in PENDING]
    assert not bad, "log event names must match [a-z][a-z0-9_]* (values go in fields):\n" + "\n".join(bad)


def test_pending_rows_are_still_needed() -> None:
    seen = {event for _path, _line, event in _all_offences()}
    stale = sorted(set(PENDING) - seen)
    assert not stale, f"applied: delete these PENDING rows: {stale}"


def test_pending_replacements_follow_the_style() -> None:
    names = {event: replacement.split('"')[1] for event, replacement in PENDING.items()}
    assert all(EVENT.match(name) for name in names.values()), names


def test_the_check_sees_prose_computed_and_conditional_events() -> None:
    source = (
        "log.info('pod bound', node=n)\n"
        "self._log.warning(f'{x} failed')\n"
        "bound.info('a_b' if c else 'not ok')\n"
        "log.debug('fine_event', a=1)\n"
        "click.echo('not a log call')\n"
    )
    assert list(_offences(source)) == [(1, "pod bound"), (2, "f'{x} failed'"), (3, "not ok")]
