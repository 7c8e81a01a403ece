"""The Helm chart, rendered offline by the real Helm engine, object by object."""

from __future__ import annotations

import base64
import functools
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import click
import helm_python
import kubernetes_validate
import pytest
import yaml
from cryptography import x509

from hamid.cli import cli
from hamid.fit.fgd import HALF_LIFE_RANGE, check_half_life, parse_workload
from hamid.model import annotations as ann
from hamid.model.mig import AllowedMigProfiles
from hamid.model.nodeconfig import NodeConfig, resolve_node_config
from hamid.model.resources import ResourceConfig, load_device_config
from hamid.options import from_cli
from hamid.plugin.cli import plugin_command
from hamid.plugin.device_lists import DeviceLists
from hamid.plugin.device_nodes import DeviceNodes
from hamid.plugin.options import PluginOptions
from hamid.plugin.refit_client import RefitClientConfig, build_refit_client
from hamid.scheduler.options import SchedulerOptions
from tests.unit.deploy.helm_render import (
    CHART_DIR,
    KUBE_VERSION,
    NAMESPACE,
    Rendered,
    container,
    flag_values,
    iter_rules,
    lint,
    mounts,
    render,
    split_mode_args,
    volumes,
)

SCHED = "hamid-scheduler"
WEBHOOK_SVC = "hamid-scheduler-webhook"
PLUGIN = "hamid-device-plugin"
SEED_NODE = "gpu-node-1"
SEED_NODE_CONFIG = json.dumps(
    {
        "nodeconfig": [
            {
                "name": SEED_NODE,
                "operatingmode": "hami-core",
                "enablenumatopology": True,
                "enablegetpreferredallocation": True,
            }
        ]
    },
    indent=2,
)
SEED = {
    "devicePlugin": {
        "enableNumaTopology": True,
        "numaRefit": {"enabled": True},
        "nodeConfiguration": {"config": SEED_NODE_CONFIG},
    }
}
ENDPOINT = f"https://hamid-scheduler.{NAMESPACE}.svc:443"
CHART_CA_FILE = "/etc/hamid/scheduler-ca/ca.crt"


def refit(**settings: Any) -> dict[str, Any]:
    """Values with NUMA refit enabled plus ``settings`` under devicePlugin.numaRefit."""
    return {"devicePlugin": {"numaRefit": {"enabled": True, **settings}}}


SCENARIOS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "seed": SEED,
    "ca-secret": refit(caSecret="my-scheduler-ca"),
    "ca-file": refit(caFile="/etc/pki/scheduler/ca.pem"),
    # unverified TLS only works without a token: mTLS-only caller authentication
    "tls-insecure": {
        "scheduler": {"refitAuth": ["mtls"], "tls": {"clientCASecret": "cluster-ca"}},
        "devicePlugin": {
            "numaRefit": {"enabled": True, "tlsInsecure": True, "kubeletClientCert": {"enabled": True}}
        },
    },
    "existing-cert-no-ca": {**refit(), "scheduler": {"tls": {"existingSecret": "my-tls"}}},
    "existing-cert-with-ca": {
        **refit(),
        "scheduler": {"tls": {"existingSecret": "my-tls", "caBundle": "-----BEGIN CERTIFICATE-----\nMIIB\n"}},
    },
    "ha": {
        "scheduler": {"replicas": 2, "admissionWebhook": {"whitelistNamespaces": ["kube-system", "gpu-free"]}}
    },
    "host-network": {"devicePlugin": {"hostNetwork": True, "numaRefit": {"enabled": True}}},
    "ui-hosts": {"scheduler": {"uiHosts": ["*.svc.example.internal", "hamid.example.com"]}},
    "mtls": {
        "scheduler": {"refitAuth": ["token", "mtls"], "tls": {"clientCASecret": "cluster-ca"}},
        "devicePlugin": {"numaRefit": {"enabled": True, "kubeletClientCert": {"enabled": True}}},
    },
    # HAMi's scheduler keys: only labelled nodes, default-scheduler pods left alone
    "node-selection": {
        "scheduler": {
            "nodeLabelSelector": {"gpu": "on", "example.com/pool": "a", "empty": ""},
            "forceOverwriteDefaultScheduler": False,
        }
    },
    "device-specs": {"devicePlugin": {"passDeviceSpecs": True, "nvidiaDriverRoot": "/run/nvidia/driver/"}},
    # a runtime that injects GPUs through CDI only, with HAMi's feature switches
    "cdi": {
        "devicePlugin": {
            "deviceListStrategy": "cdi-annotations, cdi-cri",
            "cdiSpecDirs": ["/etc/cdi", "/var/run/cdi", "/opt/cdi"],
            "gdsEnabled": True,
            "mofedEnabled": True,
        }
    },
}


@functools.cache
def rendered(scenario: str) -> Rendered:
    """One render per scenario per test session (rendering generates RSA keys)."""
    return render(SCENARIOS[scenario])


def plugin_args(r: Rendered) -> dict[str, str | None]:
    return flag_values(container(r.get("DaemonSet", PLUGIN), "device-plugin")["args"])


def scheduler_args(r: Rendered) -> dict[str, str | None]:
    return flag_values(container(r.get("Deployment", SCHED), "hamid-scheduler")["args"])


def kube_scheduler_config(r: Rendered) -> dict[str, Any]:
    return yaml.safe_load(r.get("ConfigMap", SCHED)["data"]["config.yaml"])


# --- every scenario: schemas, lint, CLI flags ---------------------------------------------------


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_every_object_validates_against_kubernetes_schemas(scenario: str) -> None:
    r = rendered(scenario)
    assert r.objects
    for obj in r.objects:
        kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_lint_is_clean(scenario: str) -> None:
    assert lint(SCENARIOS[scenario]) == []


#: The plugin's refit-client options (fixed names in the contract), built with NUMA refit (issue 6).
REFIT_CLIENT_OPTIONS = {
    "--scheduler-endpoint",
    "--scheduler-ca-file",
    "--scheduler-tls-insecure",
    "--scheduler-client-cert-file",
    "--scheduler-client-key-file",
    "--service-account-token-file",
}


def _option_names(command: click.Command) -> set[str]:
    return {name for p in command.params for name in (*p.opts, *p.secondary_opts)}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@pytest.mark.parametrize(
    ("kind", "name", "container_name", "mode"),
    [("Deployment", SCHED, "hamid-scheduler", "scheduler"), ("DaemonSet", PLUGIN, "device-plugin", "plugin")],
)
def test_chart_passes_only_real_cli_options(
    scenario: str, kind: str, name: str, container_name: str, mode: str
) -> None:
    args = container(rendered(scenario).get(kind, name), container_name)["args"]
    global_args, mode_args = split_mode_args(args, mode)
    assert set(flag_values(global_args)) <= _option_names(cli)
    known = _option_names(cli.get_command(click.Context(cli), mode))
    unknown = set(flag_values(mode_args)) - known
    if (
        mode == "plugin"
        and "--scheduler-endpoint" not in known
        and unknown
        and unknown <= REFIT_CLIENT_OPTIONS
    ):
        pytest.skip(f"`hamid plugin` has no refit client options yet (issue 6): {sorted(unknown)}")
    assert not unknown, f"`hamid {mode}` has no option(s) {sorted(unknown)}"


# --- defaults -------------------------------------------------------------------------------------


def test_defaults_render_the_expected_objects() -> None:
    kinds = {(o["kind"], o["metadata"]["name"]) for o in rendered("defaults").objects}
    assert {
        ("Deployment", SCHED),
        ("Service", SCHED),
        ("Service", WEBHOOK_SVC),
        ("ConfigMap", SCHED),
        ("ConfigMap", "hamid-device-config"),
        ("ConfigMap", "hamid-scheduler-ca"),
        ("Secret", "hamid-scheduler-tls"),
        ("MutatingWebhookConfiguration", "hamid-webhook"),
        ("ClusterRole", SCHED),
        ("ClusterRole", PLUGIN),
        ("ServiceAccount", SCHED),
        ("ServiceAccount", PLUGIN),
        ("DaemonSet", PLUGIN),
        ("ConfigMap", PLUGIN),
    } <= kinds
    # no leader election with one replica: the Service selects the one pod, no role labels
    assert not any(k == "Role" for k, _ in kinds)
    service = rendered("defaults").get("Service", SCHED)
    assert ann.SCHEDULER_ROLE not in service["spec"]["selector"]
    assert "--leader-elect" not in scheduler_args(rendered("defaults"))


def test_seed_switches_are_off_by_default() -> None:
    r = rendered("defaults")
    device_config = load_device_config(
        r.get("ConfigMap", "hamid-device-config")["data"]["device-config.yaml"]
    )
    assert device_config.node_defaults.enable_numa_topology is False
    args = plugin_args(r)
    assert "--scheduler-endpoint" not in args  # empty endpoint = refit disabled
    assert "--scheduler-tls-insecure" not in args
    node_config = resolve_node_config(
        r.get("ConfigMap", PLUGIN)["data"]["config.json"], "your-node-name", NodeConfig()
    )
    assert node_config.enable_numa_topology is False
    assert node_config.enable_get_preferred_allocation is False


def test_kube_scheduler_configuration() -> None:
    config = kube_scheduler_config(rendered("defaults"))
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert config["kind"] == "KubeSchedulerConfiguration"
    assert config["profiles"] == [{"schedulerName": "hami-scheduler"}]
    assert config["leaderElection"] == {"leaderElect": False}
    assert "percentageOfNodesToScore" not in config  # kube-scheduler's adaptive default, as HAMi's
    (extender,) = config["extenders"]
    assert extender["urlPrefix"] == "http://127.0.0.1:9444"
    assert extender["filterVerb"] == "filter"
    assert extender["bindVerb"] == "bind"
    assert extender["nodeCacheCapable"] is True
    assert extender["httpTimeout"] == "30s"
    assert "prioritizeVerb" not in extender
    managed = extender["managedResources"]
    assert [m["name"] for m in managed] == list(ResourceConfig().resource_names)
    assert all(m["ignoredByScheduler"] is True for m in managed)
    # the extender's loopback port is the one hamid listens on
    assert scheduler_args(rendered("defaults"))["--extender-listen"] == "127.0.0.1:9444"


def test_device_config_is_hamis_format_with_the_chart_resource_names() -> None:
    text = rendered("defaults").get("ConfigMap", "hamid-device-config")["data"]["device-config.yaml"]
    config = load_device_config(text)
    assert config.resources == ResourceConfig()
    assert config.node_defaults.device_split_count == 10
    # HAMi's default dynamic-MIG allowlist, read back as the scheduler and the plugins read it
    allowed = {m: e.profiles for e in config.mig_profile_allowlist for m in e.models}
    assert allowed["A100-SXM4-40GB"] == ("1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb")
    assert allowed["H200-SXM5"] == ("1g.18gb", "2g.35gb", "3g.71gb", "7g.141gb")


def test_mig_profile_allowlist_is_configurable_and_checked() -> None:
    def allowlist(value: object) -> tuple[AllowedMigProfiles, ...]:
        text = render({"devices": {"nvidia": {"migProfileAllowlist": value}}}).get(
            "ConfigMap", "hamid-device-config"
        )["data"]["device-config.yaml"]
        return load_device_config(text).mig_profile_allowlist

    assert (
        allowlist(None)
        == load_device_config(
            rendered("defaults").get("ConfigMap", "hamid-device-config")["data"]["device-config.yaml"]
        ).mig_profile_allowlist
    )
    assert allowlist([]) == ()
    assert allowlist([{"models": ["A30"], "profiles": ["1g.6gb"]}]) == (
        AllowedMigProfiles(("A30",), ("1g.6gb",)),
    )
    with pytest.raises(helm_python.HelmError, match="migProfileAllowlist"):
        render({"devices": {"nvidia": {"migProfileAllowlist": [{"models": ["A30"], "profiles": ["big"]}]}}})
    with pytest.raises(helm_python.HelmError, match="migProfileAllowlist"):
        render({"devices": {"nvidia": {"migProfileAllowlist": [{"models": ["A30"]}]}}})


def test_scheduler_container_args_and_mounts() -> None:
    deployment = rendered("defaults").get("Deployment", SCHED)
    c = container(deployment, "hamid-scheduler")
    global_args, _ = split_mode_args(c["args"], "scheduler")
    assert global_args == ["--log-format=json", "--log-level=info"]
    args = flag_values(c["args"])
    assert args["--listen"] == "0.0.0.0:9443"
    assert args["--tls-cert-file"] == "/tls/tls.crt"
    assert args["--tls-key-file"] == "/tls/tls.key"
    assert args["--scheduler-name"] == "hami-scheduler"
    assert args["--device-config-file"] == "/device-config/device-config.yaml"
    assert args["--node-lock-timeout"] == "5m"
    assert "--leader-elect" not in args
    # caller authentication on /refit wired by default: bound token + TokenReview
    assert args["--refit-auth"] == "token"
    assert args["--device-plugin-namespace"] == NAMESPACE
    assert args["--device-plugin-service-account"] == PLUGIN
    assert set(mounts(c)) == {"/tls", "/device-config", "/allocation-keys"}
    # signed allocations and the identities that may change scheduler-owned annotations
    assert args["--allocation-key-file"] == "/allocation-keys/keys"
    assert volumes(deployment)["allocation-keys"]["secret"]["secretName"] == "hamid-allocation-keys"
    assert "--allow-unsigned-allocations" not in args
    assert args["--service-account"] == f"{NAMESPACE}/{SCHED}"
    assert volumes(deployment)["tls"]["secret"]["secretName"] == "hamid-scheduler-tls"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert labels[ann.WEBHOOK] == ann.WEBHOOK_IGNORE
    ks = container(deployment, "kube-scheduler")
    assert "--config=/config/config.yaml" in ks["command"]
    assert ks["image"].startswith("registry.k8s.io/kube-scheduler:v")


def test_service_is_cluster_ip_443_to_9443() -> None:
    service = rendered("defaults").get("Service", SCHED)
    assert service["spec"]["type"] == "ClusterIP"
    https = next(p for p in service["spec"]["ports"] if p["name"] == "https")
    assert https["port"] == 443
    ports = container(rendered("defaults").get("Deployment", SCHED), "hamid-scheduler")["ports"]
    assert {"name": "https", "containerPort": 9443, "protocol": "TCP"} in ports
    assert https["targetPort"] == "https"


def test_rbac_is_exactly_what_each_mode_uses() -> None:
    r = rendered("defaults")
    scheduler = set(iter_rules(r.get("ClusterRole", SCHED)))
    assert scheduler == {
        *{("", "pods", v) for v in ("get", "list", "watch", "patch")},
        ("", "pods/binding", "create"),
        ("", "pods/status", "patch"),
        *{("", "nodes", v) for v in ("get", "list", "watch", "patch")},
        ("", "events", "create"),
        ("", "events", "patch"),
        *{("", "resourcequotas", v) for v in ("get", "list", "watch")},
        ("authentication.k8s.io", "tokenreviews", "create"),
    }
    plugin = set(iter_rules(r.get("ClusterRole", PLUGIN)))
    assert plugin == {
        *{("", "nodes", v) for v in ("get", "list", "watch", "patch")},
        *{("", "pods", v) for v in ("get", "list", "watch", "patch")},
    }  # no events: the plugin emits none
    binding = r.get("ClusterRoleBinding", PLUGIN)
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": PLUGIN, "namespace": NAMESPACE}]
    # kube-scheduler (same pod) gets Kubernetes' own roles for a second scheduler
    roles = {b["roleRef"]["name"] for b in r.all("ClusterRoleBinding")}
    assert {"system:kube-scheduler", "system:volume-scheduler"} <= roles


def test_generated_certificate_ca_is_shared_by_secret_webhook_and_plugins() -> None:
    r = rendered("defaults")
    secret = r.get("Secret", "hamid-scheduler-tls")
    ca_pem = base64.b64decode(secret["data"]["ca.crt"])
    ca = x509.load_pem_x509_certificate(ca_pem)
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    cert.verify_directly_issued_by(ca)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    names = sans.get_values_for_type(x509.DNSName)
    assert {f"{SCHED}.{NAMESPACE}.svc", f"{WEBHOOK_SVC}.{NAMESPACE}.svc"} <= set(names)
    # the Secret records the names: an upgrade that changes them regenerates the certificate
    assert secret["metadata"]["annotations"]["hamid.io/tls-dns-names"] == ",".join(names)
    assert r.get("ConfigMap", "hamid-scheduler-ca")["data"]["ca.crt"].strip() == ca_pem.decode().strip()
    (hook,) = r.get("MutatingWebhookConfiguration", "hamid-webhook")["webhooks"]
    assert base64.b64decode(hook["clientConfig"]["caBundle"]) == ca_pem


def test_webhook() -> None:
    (hook,) = rendered("defaults").get("MutatingWebhookConfiguration", "hamid-webhook")["webhooks"]
    assert hook["admissionReviewVersions"] == ["v1", "v1beta1"]
    assert hook["failurePolicy"] == "Ignore"
    assert hook["sideEffects"] == "None"
    assert hook["clientConfig"]["service"] == {
        "name": WEBHOOK_SVC,
        "namespace": NAMESPACE,
        "path": "/webhook",
        "port": 443,
    }
    assert hook["rules"][0]["resources"] == ["pods"]
    assert hook["rules"][0]["operations"] == ["CREATE", "UPDATE"]
    [condition] = hook["matchConditions"]  # hamid's own updates never wait for the webhook
    assert f"system:serviceaccount:{NAMESPACE}:{SCHED}" in condition["expression"]
    ignore = {"key": ann.WEBHOOK, "operator": "NotIn", "values": [ann.WEBHOOK_IGNORE]}
    assert hook["objectSelector"]["matchExpressions"] == [ignore]
    assert hook["namespaceSelector"]["matchExpressions"] == [ignore]


def test_daemonset_defaults() -> None:
    ds = rendered("defaults").get("DaemonSet", PLUGIN)
    assert ds["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
    }
    spec = ds["spec"]["template"]["spec"]
    assert "hostNetwork" not in spec
    assert "dnsPolicy" not in spec
    c = container(ds, "device-plugin")
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    args = flag_values(c["args"])
    assert args["--node-config-file"] == "/config/config.json"
    assert args["--device-plugin-dir"] == "/var/lib/kubelet/device-plugins/"
    assert args["--hook-path"] == "/usr/local"
    m = mounts(c)
    assert {"/var/lib/kubelet/device-plugins", "/usr/local/vgpu", "/tmp/vgpulock", "/config"} <= set(m)
    v = volumes(ds)
    assert (
        v[m["/var/lib/kubelet/device-plugins"]["name"]]["hostPath"]["path"]
        == "/var/lib/kubelet/device-plugins"
    )
    assert v[m["/usr/local/vgpu"]["name"]]["hostPath"]["path"] == "/usr/local/vgpu"
    assert v[m["/config"]["name"]]["configMap"]["name"] == PLUGIN
    # explicit projected, pod-bound ServiceAccount token (refit caller identity)
    assert spec["automountServiceAccountToken"] is False
    token_volume = v[m["/var/run/secrets/kubernetes.io/serviceaccount"]["name"]]
    sources = token_volume["projected"]["sources"]
    assert {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}} in sources
    assert c["securityContext"]["privileged"] is True
    init = container(ds, "install-hami-core", init=True)
    assert mounts(init)["/usr/local/vgpu"]["name"] == m["/usr/local/vgpu"]["name"]
    assert init["command"] == ["/bin/sh", "-c"]


def _install_script(hook_path: Path, image_dir: Path) -> str:
    ds = render({"global": {"gpuHookPath": str(hook_path)}}).get("DaemonSet", PLUGIN)
    script = container(ds, "install-hami-core", init=True)["args"][0]
    assert "src=/opt/hamid/hami-core\n" in script
    return script.replace("src=/opt/hamid/hami-core\n", f"src={image_dir}\n")


def test_init_container_installs_hami_core_on_the_host(tmp_path: Path) -> None:
    image_dir = tmp_path / "image"
    image_dir.mkdir()
    (image_dir / "libvgpu.so").write_bytes(b"\x7fELF new")
    (image_dir / "ld.so.preload").write_text("/usr/local/vgpu/libvgpu.so\n")
    host = tmp_path / "host"
    (host / "vgpu").mkdir(parents=True)
    (host / "vgpu" / "libvgpu.so").write_bytes(b"\x7fELF old")
    old_inode = (host / "vgpu" / "libvgpu.so").stat().st_ino
    script = _install_script(host, image_dir)
    subprocess.run(["/bin/sh", "-c", script], check=True, timeout=30)
    assert (host / "vgpu" / "libvgpu.so").read_bytes() == b"\x7fELF new"
    # replaced by rename: running containers keep the old file
    assert (host / "vgpu" / "libvgpu.so").stat().st_ino != old_inode
    # a non-default hook path gets a matching preload line
    assert (host / "vgpu" / "ld.so.preload").read_text() == f"{host}/vgpu/libvgpu.so\n"
    assert (host / "vgpu" / "containers").is_dir()


def test_init_container_refuses_an_image_without_libvgpu(tmp_path: Path) -> None:
    image_dir = tmp_path / "image"
    image_dir.mkdir()
    script = _install_script(tmp_path / "host", image_dir)
    done = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, timeout=30)
    assert done.returncode == 1
    assert "carries no HAMi-core libvgpu.so" in done.stderr


# --- the seed's values ----------------------------------------------------------------------------


def test_seed_values_enable_topology_and_refit_with_verified_tls() -> None:
    r = rendered("seed")
    device_config = load_device_config(
        r.get("ConfigMap", "hamid-device-config")["data"]["device-config.yaml"]
    )
    assert device_config.node_defaults.enable_numa_topology is True
    node_config = resolve_node_config(
        r.get("ConfigMap", PLUGIN)["data"]["config.json"], SEED_NODE, device_config.node_defaults
    )
    assert node_config.operating_mode == "hami-core"
    assert node_config.enable_numa_topology is True
    assert node_config.enable_get_preferred_allocation is True
    args = plugin_args(r)
    assert args["--scheduler-endpoint"] == ENDPOINT
    # a token minted for /refit only (its own audience), not the plugin's API credential
    assert args["--service-account-token-file"] == "/var/run/secrets/kubernetes.io/serviceaccount/refit-token"
    sources = volume_sources(r.get("DaemonSet", PLUGIN), "/var/run/secrets/kubernetes.io/serviceaccount")
    assert {
        "serviceAccountToken": {"path": "refit-token", "audience": "hamid-refit", "expirationSeconds": 3607}
    } in sources
    assert (
        "--refit-token-audience=hamid-refit"
        in container(r.get("Deployment", SCHED), "hamid-scheduler")["args"]
    )
    # secure by default: the chart's own CA, mounted, verifies the scheduler
    assert args["--scheduler-ca-file"] == CHART_CA_FILE
    assert "--scheduler-tls-insecure" not in args
    ds = r.get("DaemonSet", PLUGIN)
    mount = mounts(container(ds, "device-plugin"))["/etc/hamid/scheduler-ca"]
    assert volumes(ds)[mount["name"]]["configMap"]["name"] == "hamid-scheduler-ca"
    assert "verified with the scheduler's CA" in r.notes


def test_ca_secret_is_mounted_and_used() -> None:
    r = rendered("ca-secret")
    assert plugin_args(r)["--scheduler-ca-file"] == CHART_CA_FILE
    ds = r.get("DaemonSet", PLUGIN)
    mount = mounts(container(ds, "device-plugin"))["/etc/hamid/scheduler-ca"]
    secret = volumes(ds)[mount["name"]]["secret"]
    assert secret["secretName"] == "my-scheduler-ca"
    assert secret["items"] == [{"key": "ca.crt", "path": "ca.crt"}]


def test_ca_file_is_passed_as_is() -> None:
    r = rendered("ca-file")
    assert plugin_args(r)["--scheduler-ca-file"] == "/etc/pki/scheduler/ca.pem"
    assert "/etc/hamid/scheduler-ca" not in mounts(container(r.get("DaemonSet", PLUGIN), "device-plugin"))


def test_explicit_tls_insecure() -> None:
    r = rendered("tls-insecure")
    args = plugin_args(r)
    assert "--scheduler-tls-insecure" in args
    assert "--scheduler-ca-file" not in args
    assert args["--service-account-token-file"] == ""  # mTLS only: no token over unverified TLS
    assert "NOT VERIFIED" in r.notes
    # the plugin accepts exactly these refit flags at startup
    config = RefitClientConfig(
        endpoint=str(args["--scheduler-endpoint"]),
        insecure=True,
        client_cert_file=args["--scheduler-client-cert-file"],
        client_key_file=args["--scheduler-client-key-file"],
        token_file=args["--service-account-token-file"] or None,
    )
    assert build_refit_client(config) is not None


def volume_sources(ds: dict, mount_path: str) -> list[dict]:
    """The projected sources of the volume mounted at ``mount_path`` in the device-plugin container."""
    spec = ds["spec"]["template"]["spec"]
    name = mounts(container(ds, "device-plugin"))[mount_path]["name"]
    return next(v for v in spec["volumes"] if v["name"] == name)["projected"]["sources"]


def test_token_auth_sends_the_token_and_mtls_only_sends_none() -> None:
    assert plugin_args(rendered("mtls"))["--service-account-token-file"] == (
        "/var/run/secrets/kubernetes.io/serviceaccount/refit-token"
    )
    mtls_only = render(
        {
            "scheduler": {"refitAuth": ["mtls"], "tls": {"clientCASecret": "cluster-ca"}},
            "devicePlugin": {"numaRefit": {"enabled": True, "kubeletClientCert": {"enabled": True}}},
        }
    )
    args = plugin_args(mtls_only)
    assert args["--service-account-token-file"] == ""
    assert args["--scheduler-ca-file"] == CHART_CA_FILE


def test_a_given_ca_wins_over_tls_insecure() -> None:
    args = plugin_args(render(refit(tlsInsecure=True, caSecret="ca")))
    assert args["--scheduler-ca-file"] == CHART_CA_FILE
    assert "--scheduler-tls-insecure" not in args


def test_custom_scheduler_endpoint() -> None:
    args = plugin_args(render(refit(schedulerEndpoint="https://sched.example:8443")))
    assert args["--scheduler-endpoint"] == "https://sched.example:8443"


# --- other shapes ---------------------------------------------------------------------------------


def test_existing_certificate_without_ca_uses_system_roots() -> None:
    r = rendered("existing-cert-no-ca")
    assert [s["metadata"]["name"] for s in r.all("Secret")] == ["hamid-allocation-keys"]  # no TLS one
    assert not r.has("ConfigMap", "hamid-scheduler-ca")
    (hook,) = r.get("MutatingWebhookConfiguration", "hamid-webhook")["webhooks"]
    assert "caBundle" not in hook["clientConfig"]
    assert volumes(r.get("Deployment", SCHED))["tls"]["secret"]["secretName"] == "my-tls"
    args = plugin_args(r)
    assert "--scheduler-ca-file" not in args
    assert "--scheduler-tls-insecure" not in args


def test_existing_certificate_with_ca_bundle_hands_it_out() -> None:
    r = rendered("existing-cert-with-ca")
    ca = SCENARIOS["existing-cert-with-ca"]["scheduler"]["tls"]["caBundle"]
    assert r.get("ConfigMap", "hamid-scheduler-ca")["data"]["ca.crt"].strip() == ca.strip()
    (hook,) = r.get("MutatingWebhookConfiguration", "hamid-webhook")["webhooks"]
    assert base64.b64decode(hook["clientConfig"]["caBundle"]).decode() == ca
    assert plugin_args(r)["--scheduler-ca-file"] == CHART_CA_FILE


def test_leader_election_with_more_than_one_replica() -> None:
    r = rendered("ha")
    args = scheduler_args(r)
    assert "--leader-elect" in args
    assert args["--leader-elect-namespace"] == NAMESPACE
    lease = args["--leader-elect-name"]
    config = kube_scheduler_config(r)
    # hamid follows the Lease its pod's kube-scheduler campaigns for (HAMi's model)
    assert args["--leader-elect-mode"] == "follow"
    assert config["leaderElection"]["leaderElect"] is True
    assert config["leaderElection"]["resourceName"] == lease
    assert config["leaderElection"]["resourceNamespace"] == NAMESPACE
    # one set of Lease timings for both (kube-scheduler's defaults), valid for hamid's options
    timings = {"leaseDuration": "15s", "renewDeadline": "10s", "retryPeriod": "2s"}
    assert {k: config["leaderElection"][k] for k in timings} == timings
    flags = ("--leader-elect-lease-duration", "--leader-elect-renew-deadline", "--leader-elect-retry-period")
    assert [args[f] for f in flags] == list(timings.values())
    parsed = from_cli(SchedulerOptions, {f[2:].replace("-", "_") + "_s": args[f] for f in flags})
    assert parsed.leader_elect_lease_duration_s == 15.0 and parsed.leader_elect_retry_period_s == 2.0
    role = r.get("Role", f"{SCHED}-leader-election")
    assert set(iter_rules(role)) == {
        ("coordination.k8s.io", "leases", v) for v in ("get", "create", "update", "watch")
    }
    named = next(rule for rule in role["rules"] if "resourceNames" in rule)
    assert named["resourceNames"] == [lease]
    # role labels: own pod from the downward API, peers by the Deployment's selector labels
    deployment = r.get("Deployment", SCHED)
    c = container(deployment, "hamid-scheduler")
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in c["env"]}
    assert env == {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}
    selector = dict(pair.split("=") for pair in str(args["--scheduler-pod-selector"]).split(","))
    assert selector == deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    # /refit and metrics reach only the leader; the webhook every ready replica
    service = r.get("Service", SCHED)
    assert service["spec"]["selector"] == {**selector, ann.SCHEDULER_ROLE: "leader"}
    assert r.get("Service", WEBHOOK_SVC)["spec"]["selector"] == selector
    (hook,) = r.get("MutatingWebhookConfiguration", "hamid-webhook")["webhooks"]
    assert hook["clientConfig"]["service"]["name"] == WEBHOOK_SVC
    # the leader patches scheduler pods' labels
    assert ("", "pods", "patch") in set(iter_rules(r.get("ClusterRole", SCHED)))
    assert {
        "key": "kubernetes.io/metadata.name",
        "operator": "NotIn",
        "values": ["kube-system", "gpu-free"],
    } in hook["namespaceSelector"]["matchExpressions"]
    c = container(r.get("Deployment", SCHED), "hamid-scheduler")
    # followers stay ready (caches synced) to answer the webhook
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz/webhook"


def test_host_network_plugin_resolves_cluster_dns() -> None:
    spec = rendered("host-network").get("DaemonSet", PLUGIN)["spec"]["template"]["spec"]
    assert spec["hostNetwork"] is True
    assert spec["dnsPolicy"] == "ClusterFirstWithHostNet"


def test_mtls_caller_authentication() -> None:
    r = rendered("mtls")
    args = scheduler_args(r)
    assert args["--refit-auth"] == "token,mtls"
    assert args["--client-ca-file"] == "/client-ca/ca.crt"
    pargs = plugin_args(r)
    cert = "/var/lib/kubelet/pki/kubelet-client-current.pem"
    assert pargs["--scheduler-client-cert-file"] == cert
    assert pargs["--scheduler-client-key-file"] == cert
    assert "/var/lib/kubelet/pki" in mounts(container(r.get("DaemonSet", PLUGIN), "device-plugin"))


def test_pass_device_specs_mounts_the_driver_root_where_the_plugin_looks() -> None:
    """The flags parsed by the real ``hamid plugin``: host paths under nvidiaDriverRoot, looked up
    in the read-only mount of its dev/; off by default (no flag, no mount)."""
    ds = rendered("device-specs").get("DaemonSet", PLUGIN)
    c = container(ds, "device-plugin")
    _, mode_args = split_mode_args(c["args"], "plugin")
    context = plugin_command.make_context("plugin", [*mode_args, "--node-name=n1"])
    nodes = from_cli(PluginOptions, context.params).device_nodes()
    assert nodes == DeviceNodes("/run/nvidia/driver/", "/driver-root-parent/driver")
    assert nodes.host_path("/dev/nvidia0") == "/run/nvidia/driver/dev/nvidia0"
    # a driver container's root is seen through its parent: a restarted driver container's new
    # root, mounted at the same place, shows there (a mount of the root or its dev/ keeps the old)
    mount = mounts(c)["/driver-root-parent"]
    assert mount["readOnly"] is True and mount["mountPropagation"] == "HostToContainer"
    assert volumes(ds)[mount["name"]]["hostPath"] == {"path": "/run/nvidia", "type": "Directory"}
    host_driver = render({"devicePlugin": {"passDeviceSpecs": True}}).get("DaemonSet", PLUGIN)
    host_mount = mounts(container(host_driver, "device-plugin"))["/driver-root/dev"]
    assert volumes(host_driver)[host_mount["name"]]["hostPath"]["path"] == "/dev"  # the default root: /
    assert flag_values(container(host_driver, "device-plugin")["args"])["--dev-root"] == "/"
    defaults = container(rendered("defaults").get("DaemonSet", PLUGIN), "device-plugin")
    assert not {"--pass-device-specs", "--dev-root", "--dev-root-ctr-path"} & set(
        flag_values(defaults["args"])
    )
    assert nodes.seen_path("/dev") not in mounts(defaults)


def _plugin_options(pod_owner: dict[str, Any]) -> PluginOptions:
    """The device plugin's args as the real ``hamid plugin`` parses them."""
    _, mode_args = split_mode_args(container(pod_owner, "device-plugin")["args"], "plugin")
    context = plugin_command.make_context("plugin", [*mode_args, "--node-name=n1"])
    return from_cli(PluginOptions, context.params)


def test_cdi_strategies_mount_the_spec_directories_read_only() -> None:
    """HAMi's keys reach the real CLI; each CDI spec directory is mounted read-only where the plugin
    reads it; envvar (the default) mounts none and sets no feature."""
    ds = rendered("cdi").get("DaemonSet", PLUGIN)
    options = _plugin_options(ds)
    lists = options.device_lists()
    assert lists.strategies == ("cdi-annotations", "cdi-cri") and lists.all_cdi
    assert lists.features == ("gds", "mofed")
    assert options.cdi_spec_dirs == ("/etc/cdi", "/var/run/cdi", "/opt/cdi")
    seen = mounts(container(ds, "device-plugin"))
    for directory in options.cdi_spec_dirs:
        assert seen[directory]["readOnly"] is True
        host = volumes(ds)[seen[directory]["name"]]["hostPath"]
        assert host == {"path": directory, "type": "DirectoryOrCreate"}
    defaults = rendered("defaults").get("DaemonSet", PLUGIN)
    options = _plugin_options(defaults)
    assert options.device_lists() == DeviceLists(("envvar",), ())
    assert not {"/etc/cdi", "/var/run/cdi"} & set(mounts(container(defaults, "device-plugin")))
    mixed = render({"devicePlugin": {"deviceListStrategy": "envvar,cdi-cri", "gdrcopyEnabled": True}})
    options = _plugin_options(mixed.get("DaemonSet", PLUGIN))
    assert options.device_lists() == DeviceLists(("envvar", "cdi-cri"), ("gdrcopy",))
    assert "/var/run/cdi" in mounts(container(mixed.get("DaemonSet", PLUGIN), "device-plugin"))


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"devicePlugin": {"nvidiaDriverRoot": "run/nvidia/driver"}}, "nvidiaDriverRoot"),
        ({"devicePlugin": {"deviceListStrategy": "envvar,cdi"}}, "deviceListStrategy"),
        ({"devicePlugin": {"deviceListStrategy": ["envvar"]}}, "deviceListStrategy"),
        ({"devicePlugin": {"cdiSpecDirs": ["etc/cdi"]}}, "cdiSpecDirs"),
        ({"devicePlugin": {"gdsEnabled": "true"}}, "gdsEnabled"),
        ({"devicePlugin": {"deviceIDStrategy": "index"}}, "deviceIDStrategy"),
        ({"devicePlugin": {"passDeviceSpecs": "yes"}}, "passDeviceSpecs"),
        ({"scheduler": {"refitAuth": ["mtls"]}}, "clientCASecret"),
        ({"scheduler": {"refitAuth": ["password"]}}, "unknown method"),
        ({"devicePlugin": {"nodeConfiguration": {"config": "{not json"}}}, "not valid JSON"),
        (refit(tlsInsecure=True), "tlsInsecure=true cannot work with token authentication"),
    ],
)
def test_bad_values_fail_with_a_reason(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm_python.HelmError, match=message):
        render(values)


@pytest.mark.parametrize("kube_version", ["v1.31.2+k3s1", "v1.35.6-eks-8f3a2c1"])
def test_renders_for_distribution_version_strings(kube_version: str) -> None:
    """Vendor suffixes broke upstream's image tags and semver checks (docs/reliability.md §13)."""
    report = helm_python.lint(CHART_DIR, SEED, strict=True, namespace=NAMESPACE, kube_version=kube_version)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_fgd_policy_and_pinned_workload() -> None:
    shapes = [{"cpu": "8", "memory": "32Gi", "gpus": 1, "gpuShare": 50, "weight": 3}, {"cpu": "4"}]
    chart = render(
        {
            "scheduler": {
                "defaultSchedulerPolicy": {"nodeSchedulerPolicy": "fgd", "gpuSchedulerPolicy": "fgd"},
                "fgd": {"halfLife": 2000, "workload": shapes},
            }
        }
    )
    args = flag_values(container(chart.get("Deployment", SCHED), "hamid-scheduler")["args"])
    assert args["--node-scheduler-policy"] == args["--gpu-scheduler-policy"] == "fgd"
    assert args["--fgd-half-life"] == "2000"
    assert args["--fgd-workload-file"] == "/device-config/fgd-workload.yaml"
    text = chart.get("ConfigMap", "hamid-device-config")["data"]["fgd-workload.yaml"]
    assert len(parse_workload(yaml.safe_load(text)).shapes) == 2
    defaults = flag_values(
        container(rendered("defaults").get("Deployment", SCHED), "hamid-scheduler")["args"]
    )
    assert "--fgd-workload-file" not in defaults and defaults["--node-scheduler-policy"] == "binpack"
    with pytest.raises(helm_python.HelmError, match="gpuShare"):
        render({"scheduler": {"fgd": {"workload": [{"gpus": 1, "gpuShare": 0}]}}})


def test_schedule_cpu_pods_sends_every_pod_to_the_extender() -> None:
    """scheduleCpuPods: the flag, no managedResources (every pod of the profile reaches /filter),
    and NodeResourcesFit ignoring HAMi's resources in their stead; off by default."""
    chart = render({"scheduler": {"scheduleCpuPods": True}})
    args = flag_values(container(chart.get("Deployment", SCHED), "hamid-scheduler")["args"])
    assert "--schedule-cpu-pods" in args
    config = kube_scheduler_config(chart)
    (extender,) = config["extenders"]
    assert "managedResources" not in extender
    (profile,) = config["profiles"]
    (fit,) = profile["pluginConfig"]
    assert fit["name"] == "NodeResourcesFit"
    assert fit["args"]["ignoredResources"] == list(ResourceConfig().resource_names)
    defaults = rendered("defaults")
    assert "--schedule-cpu-pods" not in flag_values(
        container(defaults.get("Deployment", SCHED), "hamid-scheduler")["args"]
    )
    assert "pluginConfig" not in kube_scheduler_config(defaults)["profiles"][0]


def test_device_plugin_runtime_class_reaches_gpu_pods_as_in_hamis_chart() -> None:
    """A HAMi values file sets ``devicePlugin.runtimeClassName``; HAMi's chart hands it to the
    webhook too, which puts it on GPU pods (an outside audit: hamid's chart dropped it there)."""

    def runtime_class(values: dict[str, Any]) -> str:
        text = render(values).get("ConfigMap", "hamid-device-config")["data"]["device-config.yaml"]
        return load_device_config(text).resources.runtime_class_name

    assert runtime_class({}) == ""
    hami_values = {"devicePlugin": {"runtimeClassName": "nvidia"}}
    assert runtime_class(hami_values) == "nvidia"
    assert (
        render(hami_values).get("DaemonSet", PLUGIN)["spec"]["template"]["spec"]["runtimeClassName"]
        == "nvidia"
    )
    own = {**hami_values, "devices": {"nvidia": {"runtimeClassName": "nvidia-cdi"}}}
    assert runtime_class(own) == "nvidia-cdi"
    # "" keeps GPU pods on the default runtime while the plugin runs under its own class
    assert runtime_class({**hami_values, "devices": {"nvidia": {"runtimeClassName": ""}}}) == ""


def test_hamis_node_label_selector_and_force_overwrite_reach_the_scheduler() -> None:
    """HAMi's ``scheduler.nodeLabelSelector`` (a map) and ``forceOverwriteDefaultScheduler``
    become flags the real ``hamid scheduler`` parses into the same settings."""
    command = cli.get_command(click.Context(cli), "scheduler")
    assert command is not None

    def settings(r: Rendered) -> Any:
        args = container(r.get("Deployment", SCHED), "hamid-scheduler")["args"]
        wanted = [
            a for a in args if a.startswith(("--node-label-selector", "--force-overwrite", "--no-force"))
        ]
        with command.make_context("scheduler", list(wanted)) as ctx:
            return from_cli(SchedulerOptions, ctx.params).settings, wanted

    chosen, args = settings(rendered("node-selection"))
    assert args == [
        "--no-force-overwrite-default-scheduler",
        "--node-label-selector=empty=,example.com/pool=a,gpu=on",
    ]
    assert chosen.force_overwrite_default_scheduler is False
    assert chosen.node_label_selector.pairs == (("empty", ""), ("example.com/pool", "a"), ("gpu", "on"))
    defaults, args = settings(rendered("defaults"))
    assert args == ["--force-overwrite-default-scheduler"]  # HAMi's default, and every node
    assert defaults.force_overwrite_default_scheduler is True and defaults.node_label_selector.pairs == ()


def test_the_share_of_nodes_kube_scheduler_sends_is_a_value_and_checked() -> None:
    every = render({"scheduler": {"kubeScheduler": {"percentageOfNodesToScore": 100}}})
    assert kube_scheduler_config(every)["percentageOfNodesToScore"] == 100
    for wrong in (101, -1, "50%"):
        with pytest.raises(helm_python.HelmError, match="percentageOfNodesToScore"):
            render({"scheduler": {"kubeScheduler": {"percentageOfNodesToScore": wrong}}})


def test_schema_takes_the_fgd_half_lives_the_scheduler_takes() -> None:
    """Out of ``HALF_LIFE_RANGE`` the scheduler would not start: the chart refuses it first."""
    for absurd in (0.01, 1e-300, 1e13):
        with pytest.raises(helm_python.HelmError, match="halfLife"):
            render({"scheduler": {"fgd": {"halfLife": absurd}}})
    for edge in HALF_LIFE_RANGE:
        args = flag_values(
            container(
                render({"scheduler": {"fgd": {"halfLife": edge}}}).get("Deployment", SCHED), "hamid-scheduler"
            )["args"]
        )
        assert check_half_life(float(args["--fgd-half-life"])) == edge


@pytest.mark.parametrize(
    ("selector", "message"),
    [
        ({"gpu": True}, "'/scheduler/nodeLabelSelector/gpu': got boolean, want string"),  # gpu: on, unquoted
        ({"gpu": "o n"}, "'/scheduler/nodeLabelSelector/gpu': 'o n' does not match pattern"),
        ({"gpu": "x" * 64}, "'/scheduler/nodeLabelSelector/gpu': maxLength: got 64, want 63"),
        ({"Example.com/gpu": "on"}, "invalid propertyName 'Example.com/gpu'"),
        ({"gpu=on": "x"}, "invalid propertyName 'gpu=on'"),
        ({"k" * 64: "on"}, f"invalid propertyName '{'k' * 64}'"),  # a label name has at most 63
        ({"example.com/" + "k" * 64: "on"}, f"invalid propertyName 'example.com/{'k' * 64}'"),
        ({"a" * 254 + "/gpu": "on"}, f"invalid propertyName '{'a' * 254}/gpu'"),  # a prefix has at most 253
    ],
)
def test_schema_refuses_a_node_label_selector_that_is_no_label(
    selector: dict[str, Any], message: str
) -> None:
    values = {"scheduler": {"nodeLabelSelector": selector}}
    with pytest.raises(helm_python.HelmError, match=re.escape(message)):
        render(values)
    assert any(
        message in e for e in helm_python.lint(CHART_DIR, values, strict=True, namespace=NAMESPACE)["errors"]
    )
