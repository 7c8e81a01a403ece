"""The chart hands the device plugin what NUMA prediction needs: kubelet's config file and its
PodResources socket directory, mounted read-only from the host, paths changeable by values."""

from __future__ import annotations

import helm_python
import pytest

from tests.unit.deploy.helm_render import container, flag_values, mounts, render, volumes

PLUGIN = "hamid-device-plugin"


def _plugin(values: dict[str, object]) -> tuple[dict[str, str | None], dict, dict]:
    ds = render(values).get("DaemonSet", PLUGIN)
    c = container(ds, "device-plugin")
    return flag_values(c["args"]), mounts(c), volumes(ds)


def test_defaults_mount_kubelets_config_and_pod_resources_read_only() -> None:
    args, m, v = _plugin({})
    assert args["--kubelet-config"] == "/var/lib/kubelet/config.yaml"
    assert args["--pod-resources-socket"] == "/var/lib/kubelet/pod-resources/kubelet.sock"
    config, sockets = m["/var/lib/kubelet/config.yaml"], m["/var/lib/kubelet/pod-resources"]
    assert config["readOnly"] is True and sockets["readOnly"] is True
    assert v[config["name"]]["hostPath"] == {"path": "/var/lib/kubelet/config.yaml", "type": "FileOrCreate"}
    assert v[sockets["name"]]["hostPath"] == {
        "path": "/var/lib/kubelet/pod-resources",
        "type": "DirectoryOrCreate",
    }
    # only the socket directory: not the rest of /var/lib/kubelet (pki, pod volumes)
    assert "/var/lib/kubelet" not in m


def test_paths_follow_the_values() -> None:
    numa = {
        "kubeletConfig": "/etc/kubernetes/kubelet.conf.yaml",
        "podResourcesPath": "/data/kubelet/pod-resources/",
    }
    args, m, v = _plugin({"devicePlugin": {"numaPublish": numa}})
    assert args["--kubelet-config"] == "/etc/kubernetes/kubelet.conf.yaml"
    assert args["--pod-resources-socket"] == "/data/kubelet/pod-resources/kubelet.sock"
    assert v[m["/etc/kubernetes/kubelet.conf.yaml"]["name"]]["hostPath"]["path"] == numa["kubeletConfig"]
    assert v[m["/data/kubelet/pod-resources"]["name"]]["hostPath"]["path"] == "/data/kubelet/pod-resources"


def test_no_kubelet_config_publishes_no_profile_and_mounts_nothing() -> None:
    args, m, _v = _plugin({"devicePlugin": {"numaPublish": {"kubeletConfig": ""}}})
    assert args["--kubelet-config"] in ("", None)
    assert "/var/lib/kubelet/config.yaml" not in m


@pytest.mark.parametrize(
    "numa", [{"kubeletConfig": "config.yaml"}, {"podResourcesPath": ""}, {"podResourcesPaths": "/x"}]
)
def test_schema_refuses_bad_paths(numa: dict[str, str]) -> None:
    with pytest.raises(helm_python.HelmError):
        render({"devicePlugin": {"numaPublish": numa}})
