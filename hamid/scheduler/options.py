"""Every ``hamid scheduler`` option, defined once (flag, env var, default, parser, help, checks).

:class:`SchedulerOptions` is what the CLI parses, what :class:`~hamid.scheduler.app.SchedulerApp`
runs with and what the simulator and tests construct; the decision settings inside it are
:class:`~hamid.scheduler.settings.SchedulerSettings`, whose defaults stay there.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import click

from hamid.fit.fgd import HALF_LIFE_RANGE, Workload, check_half_life, parse_workload
from hamid.fit.policy import GPU_POLICIES, NODE_POLICIES
from hamid.listen import LISTEN
from hamid.log import get_logger
from hamid.model._wire import load_yaml
from hamid.model.errors import InvalidInput
from hamid.model.labels import LABEL_KEY, LABEL_NAME, parse_node_label_selector
from hamid.model.resources import DeviceConfig, load_device_config
from hamid.options import Opt, OptionError, nested_field, option_field, or_none
from hamid.scheduler.refit.auth import (
    DEFAULT_TOKEN_AUDIENCE,
    MTLS,
    TOKEN,
    ServiceAccount,
    parse_methods,
)
from hamid.scheduler.settings import DEFAULT_BIND_WAIT_S, DEFAULT_SCHEDULER_NAME, SchedulerSettings
from hamid.scheduler.signing import AllocationKeys, load_key_file
from hamid.scheduler.ui.hosts import parse_hosts

log = get_logger("scheduler.options")

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_ZERO = re.compile(r"0+(?:\.0*)?(?:ns|us|µs|ms|s|m|h)?")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
LEADER_ELECT_MODES = ("follow", "campaign")
DEFAULT_POD_SELECTOR = "app.kubernetes.io/name=hamid,app.kubernetes.io/component=scheduler"
#: Where HAMi's chart installs the device plugin (and kube-scheduler's Lease lives).
DEFAULT_NAMESPACE = "kube-system"
#: The device plugin's ServiceAccount in HAMi's chart (``/refit`` token callers).
DEFAULT_DEVICE_PLUGIN_SERVICE_ACCOUNT = "hami-device-plugin"
#: The scheduler's ServiceAccount in HAMi's chart.
DEFAULT_SCHEDULER_SERVICE_ACCOUNT = "hami-scheduler"


def _service_account(text: str) -> ServiceAccount:
    account = ServiceAccount.parse(text)
    if account is None:
        raise InvalidInput("a ServiceAccount <namespace>/<name> is required")
    return account


#: A label selector of equality terms (``k=v``, ``k==v``, ``k!=v``, ``k``, ``!k``), comma-separated
#: (set-based ``in``/``notin`` terms are not taken: the chart writes equality terms).
_LABEL_TERM = rf"\s*(?:!?{LABEL_KEY}|{LABEL_KEY}\s*(?:==?|!=)\s*(?:{LABEL_NAME})?)\s*"
_LABEL_SELECTOR = re.compile(rf"{_LABEL_TERM}(?:,{_LABEL_TERM})*")

#: Go's largest duration (int64 nanoseconds, about 292 years).
_MAX_DURATION_S = (2**63 - 1) / 1e9


def parse_duration(text: str) -> timedelta:
    """A Go duration (``5m``, ``1h30m``, ``300ms``) as a timedelta; must be positive."""
    value = text.strip()
    pos, total = 0, 0.0
    for m in _DURATION.finditer(value):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
        pos = m.end()
    if not value or pos != len(value) or total <= 0:
        raise InvalidInput(f"{text!r} is not a positive duration like 5m, 30s or 1h30m")
    if total > _MAX_DURATION_S:
        raise InvalidInput(f"{text!r} is longer than a Go duration can be (2562047h)")
    return timedelta(seconds=total)


def parse_interval(text: str) -> float:
    """Seconds of a Go duration that may be zero (``0`` or ``0s``: disabled); see :func:`parse_duration`."""
    value = text.strip()
    if _ZERO.fullmatch(value):
        return 0.0
    return parse_duration(value).total_seconds()


def parse_seconds(text: str) -> float:
    """Seconds of a positive Go duration."""
    return parse_duration(text).total_seconds()


def format_duration(value: timedelta | float) -> str:
    """A Go duration text for seconds or a timedelta (``300`` → ``5m``), as ``--help`` shows defaults."""
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if seconds == 0:
        return "0"
    for unit, size in (("h", 3600.0), ("m", 60.0), ("s", 1.0), ("ms", 1e-3)):
        if seconds >= size and (seconds / size).is_integer():
            return f"{int(seconds / size)}{unit}"
    return f"{seconds:g}s"


def load_device_config_file(path: str) -> DeviceConfig:
    """The HAMi device-config YAML at ``path`` (empty: the defaults)."""
    if not path.strip():
        return DeviceConfig()
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidInput(f"cannot read {path}: {exc}") from exc
    return load_device_config(text)


def load_fgd_workload_file(path: str) -> Workload | None:
    """The ``fgd`` workload an operator pins (YAML list of shapes; empty path: learned online)."""
    if not path.strip():
        return None
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidInput(f"cannot read {path}: {exc}") from exc
    return parse_workload(load_yaml(text, path))


def _half_life(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise InvalidInput(f"{text!r} is not a number") from None
    return check_half_life(value)


def _gpu_policy(text: str) -> str:
    unknown = sorted({t.strip() for t in text.split(",")} - set(GPU_POLICIES))
    if unknown:
        raise InvalidInput(
            f"unknown policy {', '.join(map(repr, unknown))} in {text!r}; "
            f"use {', '.join(GPU_POLICIES)} or a comma chain of them"
        )
    return text


#: ``refit_auth`` not given (identity-compared: no method list can be this object).
_REFIT_AUTH_UNSET: tuple[str, ...] = ("<token, plus mtls with a client CA>",)


def _no_default(_value: object) -> None:
    return None


#: The ``hamid scheduler`` flags of :class:`SchedulerSettings` fields (defaults: that class's).
SETTINGS_FLAGS = {
    "scheduler_name": Opt("schedulerName the webhook sets on GPU pods."),
    "node_policy": Opt(
        "Default node policy (pod annotation hami.io/node-scheduler-policy overrides).",
        flag="--node-scheduler-policy",
        type=click.Choice(NODE_POLICIES),
    ),
    "gpu_policy": Opt(
        "Default GPU policy: binpack, spread, mutex, numa, topology-aware, fgd or a comma chain "
        "(pod annotation hami.io/gpu-scheduler-policy overrides).",
        flag="--gpu-scheduler-policy",
        parse=_gpu_policy,
    ),
    "fgd_workload": Opt(
        "YAML file pinning the fgd policy's typical workload: a list of shapes {cpu, memory, gpus, "
        "gpuShare (percent of one GPU), gpuModels, aligned, weight}. Unset: learned online from "
        "every pod the scheduler sees.",
        flag="--fgd-workload-file",
        parse=load_fgd_workload_file,
        show=_no_default,
    ),
    "fgd_half_life": Opt(
        "Pods after which a shape the fgd policy learned weighs half as much as a new one "
        f"({HALF_LIFE_RANGE[0]:g} to {HALF_LIFE_RANGE[1]:,.0f}).",
        flag="--fgd-half-life",
        parse=_half_life,
    ),
    "schedule_cpu_pods": Opt(
        "The webhook also sets --scheduler-name on pods without GPUs, so that the fgd node policy "
        "places them where they strand the least GPU (kube-scheduler's profile must then send every "
        "pod to the extender: the chart's scheduler.scheduleCpuPods does). Off: HAMi's behaviour.",
    ),
    "force_overwrite_default_scheduler": Opt(
        "The webhook hands pods whose schedulerName is default-scheduler (the API server's "
        "default, so every pod that names no scheduler) to --scheduler-name, as it does pods that "
        "name none: GPU pods, and every pod with --schedule-cpu-pods. Off "
        "(--no-force-overwrite-default-scheduler, HAMi's =false): such pods keep default-scheduler "
        "and are not mutated; hamid places only pods that name --scheduler-name.",
    ),
    "node_label_selector": Opt(
        "Only nodes carrying all these labels are GPU candidates: key=value pairs separated by "
        "commas, each an exact match (HAMi's format; repeated flags add pairs). A node that stops "
        "matching takes no new GPU pod (its pods' bookings stay accounted) and is registered "
        "again once it matches. Empty (default): every node with a register.",
        parse=parse_node_label_selector,
        show=_no_default,
        repeatable=True,
    ),
    "node_lock_timeout": Opt(
        "Age after which a node lock (hami.io/mutex.lock) expires; a holder still Pending and "
        "unallocated keeps it longer (see --node-lock-max-hold).",
        parse=parse_duration,
        show=format_duration,
    ),
    "node_lock_max_hold": Opt(
        "Hard cap on how long a pod still Pending and unallocated keeps a node lock past "
        "--node-lock-timeout; after it the lock is taken over with a warning. At least --node-lock-timeout.",
        parse=parse_duration,
        show=format_duration,
    ),
    "bind_wait_s": Opt(
        "How long a bind waits for a contended node lock before failing; at most (and by default) "
        "19s, what a /bind's 27 s budget inside kube-scheduler's 30 s extender timeout leaves after "
        "the writes that follow the lock (a longer value is used as 19s, with a warning).",
        flag="--bind-wait",
        parse=parse_seconds,
        show=format_duration,
    ),
    "steer_wait_s": Opt(
        "How long a bind to a node whose plugin hides replicas by steer waits, after taking the "
        "node lock and before the Binding, for the plugin to confirm on the Node "
        "(hamid.io/devices-listed-for = the lock value) that kubelet was sent the pod's replicas; "
        "unconfirmed, the bind fails (the lock released) and kube-scheduler retries the pod. Taken "
        "from the bind's budget, so the lock wait on such nodes is that much shorter; 0 disables "
        "the wait (a kubelet that reads the plugin's list synchronously).",
        flag="--steer-wait",
        parse=parse_interval,
        show=format_duration,
    ),
    "reconcile_interval_s": Opt(
        "How often the leader checks its GPU accounting against a fresh LIST of pods and repairs "
        "drift (missed watch events): logged, counted in hamid_reconcile_drift_total; 0 disables.",
        flag="--reconcile-interval",
        parse=parse_interval,
        show=format_duration,
    ),
}


@dataclass(frozen=True)
class SchedulerOptions:
    """Every ``hamid scheduler`` option (the refit routes read the ``refit_*``/``device_plugin_*`` ones)."""

    extender_listen: str = option_field(
        "host:port of the kube-scheduler extender (/filter, /bind), plain HTTP.",
        default="127.0.0.1:9444",
        type=LISTEN,
    )
    listen: str = option_field(
        "host:port of /webhook, /healthz, /readyz (and /refit); TLS with the cert flags.",
        default="0.0.0.0:9443",
        type=LISTEN,
    )
    metrics_listen: str = option_field(
        "host:port of Prometheus /metrics (hamid's names) and /metrics/hami (HAMi's names).",
        default=":9395",
        type=LISTEN,
    )
    ui: bool = option_field(
        "Serve /ui on --metrics-listen: a read-only web view of the cluster's NUMA alignment "
        "(docs/ui.md), from the scheduler's own caches.",
        default=True,
    )
    ui_hosts: tuple[str, ...] = option_field(
        "Host names /ui answers besides its own (an IP address, localhost, the Service's names "
        "under .svc): comma list, *.<domain> for every name under it; a custom cluster domain or "
        "an Ingress's name. Any other name gets 421 (DNS rebinding). [default: none]",
        default=(),
        parse=parse_hosts,
        show=_no_default,
    )
    metrics_auth: bool = option_field(
        "Require Kubernetes authentication on --metrics-listen (/metrics, /metrics/hami, /ui): a "
        "bearer token TokenReview authenticates and a SubjectAccessReview allows (get on the "
        "request path), as kube-rbac-proxy checks. Off: anyone reaching the port may read them.",
        default=False,
    )
    metrics_tls: bool = option_field(
        "Serve --metrics-listen over TLS too, with the --tls-cert-file certificate (reloaded when it "
        "changes), so --metrics-auth's bearer tokens never cross the network in clear text. Off: "
        "plain HTTP.",
        default=False,
    )
    tls_cert_file: str | None = option_field(
        "PEM server certificate for --listen (and --metrics-tls; reloaded when it changes).",
        default=None,
        parse=or_none,
    )
    tls_key_file: str | None = option_field(
        "PEM private key of --tls-cert-file.", default=None, parse=or_none
    )
    client_ca_file: str | None = option_field(
        "PEM CA verifying client certificates (mTLS callers of /refit).", default=None, parse=or_none
    )
    settings: SchedulerSettings = nested_field(SchedulerSettings, SETTINGS_FLAGS)
    device_config: DeviceConfig = option_field(
        "HAMi device-config YAML (its nvidia: section).",
        default_factory=DeviceConfig,
        flag="--device-config-file",
        parse=load_device_config_file,
        show=_no_default,
    )
    leader_elect: bool = option_field(
        "Only one replica decides (/filter /bind /refit); see --leader-elect-mode.", default=False
    )
    leader_elect_mode: str = option_field(
        "follow: lead while the kube-scheduler in this pod holds the Lease named below (its "
        "holderIdentity starts with '<--leader-identity>_'); campaign: campaign for that Lease "
        "(no kube-scheduler beside hamid; never name kube-scheduler's Lease then).",
        default="follow",
        type=click.Choice(LEADER_ELECT_MODES),
    )
    leader_elect_namespace: str = option_field(
        "Namespace of the leader-election Lease.", default=DEFAULT_NAMESPACE
    )
    leader_elect_name: str = option_field(
        "Name of the leader-election Lease (in follow mode: kube-scheduler's resourceName).",
        default=DEFAULT_SCHEDULER_NAME,
    )
    leader_elect_lease_duration_s: float = option_field(
        "campaign: how long the Lease stays valid after a renewal; a replica decides only while "
        "its own clock says so (less a tenth as margin), the others take over once it expired.",
        default=15.0,
        flag="--leader-elect-lease-duration",
        parse=parse_seconds,
        show=format_duration,
    )
    leader_elect_renew_deadline_s: float = option_field(
        "campaign: how long the leader keeps retrying a failed renewal before it steps down "
        "(shorter than --leader-elect-lease-duration).",
        default=10.0,
        flag="--leader-elect-renew-deadline",
        parse=parse_seconds,
        show=format_duration,
    )
    leader_elect_retry_period_s: float = option_field(
        "How often the Lease is read (follow) or acquisition and renewal are retried (campaign; "
        "shorter than --leader-elect-renew-deadline).",
        default=2.0,
        flag="--leader-elect-retry-period",
        parse=parse_seconds,
        show=format_duration,
    )
    leader_identity: str | None = option_field(
        "This replica's hostname in Lease holder identities (default: the pod's hostname).",
        default=None,
        parse=or_none,
    )
    pod_name: str | None = option_field(
        "This scheduler's pod (role labels).", default=None, aliases=["POD_NAME"], parse=or_none
    )
    pod_namespace: str | None = option_field(
        "Namespace of --pod-name.", default=None, aliases=["POD_NAMESPACE"], parse=or_none
    )
    scheduler_pod_selector: str = option_field(
        "Label selector of all scheduler pods in --pod-namespace; the leader labels them "
        "hami.io/scheduler-role=follower and its own pod leader.",
        default=DEFAULT_POD_SELECTOR,
    )
    api_server: str | None = option_field(
        "API server URL (no auth, e.g. the embedded one); default kubeconfig/in-cluster.",
        default=None,
        parse=or_none,
    )
    kubeconfig: str | None = option_field(
        "kubeconfig file (default $KUBECONFIG, then in-cluster).", default=None, parse=or_none
    )
    device_plugin_namespace: str = option_field(
        "Namespace of the device plugin ServiceAccount (/refit token auth).", default=DEFAULT_NAMESPACE
    )
    device_plugin_service_account: str = option_field(
        "ServiceAccount of the device plugin (/refit token auth; with --service-account, the only "
        "identities the webhook lets change scheduler-owned pod annotations).",
        default=DEFAULT_DEVICE_PLUGIN_SERVICE_ACCOUNT,
    )
    service_account: ServiceAccount = option_field(
        "This scheduler's own ServiceAccount <namespace>/<name>: besides the device plugin's, the "
        "only identity the webhook lets change scheduler-owned pod annotations after creation.",
        default=ServiceAccount(DEFAULT_NAMESPACE, DEFAULT_SCHEDULER_SERVICE_ACCOUNT),
        parse=_service_account,
        show=lambda value: f"{value.namespace}/{value.name}",
    )
    allocation_keys: AllocationKeys | None = option_field(
        "File of the HMAC keys signing the allocations this scheduler writes, one per line, the "
        "newest (signing) last; any verifies (rotation: docs/trust.md). After a restart only "
        "allocations signed with one of them are booked. Required by `hamid scheduler` unless "
        "--allow-unsigned-allocations.",
        default=None,
        flag="--allocation-key-file",
        parse=load_key_file,
        show=_no_default,
    )
    allow_unsigned_allocations: bool = option_field(
        "Also book allocations that carry no signature, for pods without a booking (pods placed "
        "before signing: one upgrade rollout), and run without --allocation-key-file. A tenant "
        "who can write pod annotations then books what it likes after a restart.",
        default=False,
    )
    #: Accepted /refit caller authentication (empty: none, every refit is refused); unset: token,
    #: plus mtls when a client CA is configured (so a start without mTLS never warns).
    refit_auth: tuple[str, ...] = option_field(
        "Accepted /refit caller authentication: comma list of mtls, token; empty refuses every "
        "/refit (the plugins' mismatch policy then decides alone) "
        "[default: token, plus mtls when --client-ca-file is set].",
        default=_REFIT_AUTH_UNSET,
        parse=parse_methods,
        show=_no_default,
    )
    #: Audience TokenReview checks refit tokens against ("" = the API server's default audience).
    refit_token_audience: str = option_field(
        "Audience a /refit bearer token must be issued for (TokenReview spec.audiences); the "
        "plugin sends a projected token with this audience, so its API-server token is never sent. "
        "Empty: the API server's default audience.",
        default=DEFAULT_TOKEN_AUDIENCE,
    )
    #: Mixed fleets: upstream HAMi plugins' ServiceAccount, whose default tokens /refit accepts.
    refit_hami_plugin_service_account: ServiceAccount | None = option_field(
        "Mixed fleets with upstream HAMi device plugins: their ServiceAccount <namespace>/<name>. "
        "/refit then also accepts that ServiceAccount's default (API-server audience) bound token, "
        "with the same pod and node checks. Empty (default): only --refit-token-audience tokens.",
        default=None,
        parse=ServiceAccount.parse,
        show=lambda _value: "",
    )

    def __post_init__(self) -> None:
        """The checks spanning several options (the CLI reports them against the named flag)."""
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise OptionError("--tls-cert-file", "--tls-cert-file and --tls-key-file must be given together")
        if self.client_ca_file and not self.tls_cert_file:
            raise OptionError(
                "--client-ca-file",
                "needs --tls-cert-file and --tls-key-file (client certificates come only over TLS)",
            )
        if self.metrics_tls and not self.tls_cert_file:
            raise OptionError("--metrics-tls", "needs --tls-cert-file and --tls-key-file (its certificate)")
        self._check_names()
        settings = self.settings
        if settings.bind_wait_s > DEFAULT_BIND_WAIT_S:
            # a bind never waits longer anyway (its budget inside kube-scheduler's 30 s call): say
            # so and use the most it can wait, so that an older configuration still starts
            log.warning(
                "bind_wait_capped",
                given=format_duration(settings.bind_wait_s),
                used=format_duration(DEFAULT_BIND_WAIT_S),
                reason="a /bind answers within kube-scheduler's 30 s extender timeout",
            )
            object.__setattr__(
                self, "settings", dataclasses.replace(settings, bind_wait_s=DEFAULT_BIND_WAIT_S)
            )
            settings = self.settings
        if settings.steer_wait_s >= DEFAULT_BIND_WAIT_S:
            raise OptionError(
                "--steer-wait",
                f"{format_duration(settings.steer_wait_s)} leaves a bind no time to wait for the node "
                f"lock (a /bind has {format_duration(DEFAULT_BIND_WAIT_S)} for both)",
            )
        if settings.node_lock_max_hold < settings.node_lock_timeout:
            raise OptionError(
                "--node-lock-max-hold",
                f"{format_duration(settings.node_lock_max_hold)} is shorter than --node-lock-timeout "
                f"{format_duration(settings.node_lock_timeout)}",
            )
        try:
            _gpu_policy(settings.gpu_policy)
        except InvalidInput as exc:
            raise OptionError("--gpu-scheduler-policy", str(exc)) from None
        if self.leader_elect_mode not in LEADER_ELECT_MODES:
            raise OptionError(
                "--leader-elect-mode",
                f"unknown leader election mode {self.leader_elect_mode!r} "
                f"(use {', '.join(LEADER_ELECT_MODES)})",
            )
        self._check_lease_timings()
        if self.refit_auth is _REFIT_AUTH_UNSET:
            object.__setattr__(self, "refit_auth", (MTLS, TOKEN) if self.client_ca_file else (TOKEN,))

    def _check_names(self) -> None:
        """Names a running scheduler cannot do without: an empty one would leave GPU pods to the
        default scheduler, or a replica that can never lead, or /refit tokens never matched."""
        names = {
            "--scheduler-name": self.settings.scheduler_name,
            "--device-plugin-namespace": self.device_plugin_namespace,
            "--device-plugin-service-account": self.device_plugin_service_account,
        }
        if self.leader_elect:
            names |= {
                "--leader-elect-name": self.leader_elect_name,
                "--leader-elect-namespace": self.leader_elect_namespace,
            }
        for flag, value in names.items():
            if not value.strip():
                raise OptionError(flag, "must not be empty")
        if not _LABEL_SELECTOR.fullmatch(self.scheduler_pod_selector.strip()):
            raise OptionError(
                "--scheduler-pod-selector",
                f"{self.scheduler_pod_selector!r} is not a label selector like app=hamid,component=scheduler",
            )

    def _check_lease_timings(self) -> None:
        """kube-scheduler's rules: retry period < renew deadline < lease duration."""
        lease, renew = self.leader_elect_lease_duration_s, self.leader_elect_renew_deadline_s
        retry = self.leader_elect_retry_period_s
        if not renew < lease:
            raise OptionError(
                "--leader-elect-renew-deadline",
                f"{format_duration(renew)} is not shorter than "
                f"--leader-elect-lease-duration {format_duration(lease)}",
            )
        if not retry < renew:
            raise OptionError(
                "--leader-elect-retry-period",
                f"{format_duration(retry)} is not shorter than "
                f"--leader-elect-renew-deadline {format_duration(renew)}",
            )

    @property
    def annotation_writers(self) -> frozenset[str]:
        """Usernames that may change scheduler-owned pod annotations: this scheduler, the plugin
        (and upstream HAMi plugins of a mixed fleet)."""
        accounts = [
            self.service_account,
            ServiceAccount(self.device_plugin_namespace, self.device_plugin_service_account),
        ]
        if self.refit_hami_plugin_service_account is not None:
            accounts.append(self.refit_hami_plugin_service_account)
        return frozenset(a.username for a in accounts)

    def require_allocation_keys(self) -> None:
        """A production start: refuse to run unsigned unless --allow-unsigned-allocations says so."""
        if self.allocation_keys is None and not self.allow_unsigned_allocations:
            raise OptionError(
                "--allocation-key-file",
                "required: without a key the scheduler cannot tell its own allocations from a "
                "tenant's after a restart (the chart mounts one from a generated Secret); pass "
                "--allow-unsigned-allocations to run unsigned anyway",
            )

    @property
    def tls(self) -> bool:
        """Whether ``--listen`` serves TLS."""
        return bool(self.tls_cert_file and self.tls_key_file)
