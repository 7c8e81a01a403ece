"""The runtime-facing part of an Allocate answer, per device list strategy, as HAMi's
``getAllocateResponse`` shapes it (literal values, not the module's constants)."""

from __future__ import annotations

import pytest

from hamid.plugin.device_lists import DeviceListAnswer, DeviceLists, check_strategies
from hamid.plugin.hamicore_answer import ContainerAnswer, MountSpec

ID = "5b9e0c5a-5f1e-4a55-9a1d-0c1c2b5e8f00"
KEY = f"cdi.k8s.io/nvidia-device-plugin_{ID}"
ONE = ["GPU-a"]
TWO = ["GPU-b", "GPU-a"]  # the booking's order


def _answer(
    strategies: tuple[str, ...], uuids: list[str], features: tuple[str, ...] = ()
) -> DeviceListAnswer:
    return DeviceLists(strategies, features).answer(uuids, ID)


def test_envvar_names_the_uuids() -> None:
    assert _answer(("envvar",), ONE) == DeviceListAnswer({"NVIDIA_VISIBLE_DEVICES": "GPU-a"})
    assert _answer(("envvar",), TWO) == DeviceListAnswer({"NVIDIA_VISIBLE_DEVICES": "GPU-b,GPU-a"})


def test_volume_mounts_names_the_root_and_mounts_dev_null_per_gpu() -> None:
    assert _answer(("volume-mounts",), TWO) == DeviceListAnswer(
        {"NVIDIA_VISIBLE_DEVICES": "/var/run/nvidia-container-devices"},
        (
            MountSpec("/var/run/nvidia-container-devices/GPU-b", "/dev/null", False),
            MountSpec("/var/run/nvidia-container-devices/GPU-a", "/dev/null", False),
        ),
    )
    # upstream applies volume-mounts after envvar: the env then names the root
    both = _answer(("envvar", "volume-mounts"), ONE)
    assert both.envs == {"NVIDIA_VISIBLE_DEVICES": "/var/run/nvidia-container-devices"}
    assert both.mounts == (MountSpec("/var/run/nvidia-container-devices/GPU-a", "/dev/null", False),)


def test_cdi_annotations_alone_leave_the_env_to_the_spec() -> None:
    assert _answer(("cdi-annotations",), ONE) == DeviceListAnswer(annotations={KEY: "nvidia.com/gpu=GPU-a"})
    assert _answer(("cdi-annotations",), TWO) == DeviceListAnswer(
        annotations={KEY: "nvidia.com/gpu=GPU-b,nvidia.com/gpu=GPU-a"}
    )


def test_cdi_cri_names_cdi_devices() -> None:
    assert _answer(("cdi-cri",), TWO) == DeviceListAnswer(
        cdi_devices=("nvidia.com/gpu=GPU-b", "nvidia.com/gpu=GPU-a")
    )
    both = _answer(("cdi-cri", "cdi-annotations"), ONE)
    assert both == DeviceListAnswer(
        annotations={KEY: "nvidia.com/gpu=GPU-a"}, cdi_devices=("nvidia.com/gpu=GPU-a",)
    )


def test_envvar_with_cdi_gives_both() -> None:
    assert _answer(("envvar", "cdi-cri"), TWO) == DeviceListAnswer(
        {"NVIDIA_VISIBLE_DEVICES": "GPU-b,GPU-a"},
        cdi_devices=("nvidia.com/gpu=GPU-b", "nvidia.com/gpu=GPU-a"),
    )


FEATURE_ENVS = {"NVIDIA_GDRCOPY": "enabled", "NVIDIA_GDS": "enabled", "NVIDIA_MOFED": "enabled"}
FEATURE_DEVICES = ("nvidia.com/gdrcopy=all", "nvidia.com/gds=all", "nvidia.com/mofed=all")


def test_features_are_env_switches_or_cdi_devices() -> None:
    features = ("gdrcopy", "gds", "mofed")
    assert _answer(("envvar",), ONE, features).envs == {"NVIDIA_VISIBLE_DEVICES": "GPU-a", **FEATURE_ENVS}
    only_cdi = _answer(("cdi-cri",), ONE, features)
    assert only_cdi == DeviceListAnswer(cdi_devices=("nvidia.com/gpu=GPU-a", *FEATURE_DEVICES))
    mixed = _answer(("volume-mounts", "cdi-annotations"), ONE, ("gds",))
    assert mixed.envs == {
        "NVIDIA_VISIBLE_DEVICES": "/var/run/nvidia-container-devices",
        "NVIDIA_GDS": "enabled",
    }
    assert mixed.annotations == {KEY: "nvidia.com/gpu=GPU-a,nvidia.com/gds=all"}
    with pytest.raises(ValueError, match="unknown features"):
        DeviceLists(("envvar",), ("imex",))


def test_the_answer_goes_before_hami_cores() -> None:
    core = ContainerAnswer(
        {"CUDA_DEVICE_SM_LIMIT": "30"}, (MountSpec("/h/vgpu/libvgpu.so", "/h/vgpu/libvgpu.so", True),), "/c"
    )
    merged = _answer(("volume-mounts", "cdi-annotations"), ONE).before(core)
    assert merged == ContainerAnswer(
        {"NVIDIA_VISIBLE_DEVICES": "/var/run/nvidia-container-devices", "CUDA_DEVICE_SM_LIMIT": "30"},
        (MountSpec("/var/run/nvidia-container-devices/GPU-a", "/dev/null", False), *core.mounts),
        "/c",
        annotations={KEY: "nvidia.com/gpu=GPU-a"},
    )


@pytest.mark.parametrize(
    ("strategies", "any_cdi", "all_cdi"),
    [
        (("envvar",), False, False),
        (("volume-mounts", "cdi-annotations"), True, False),
        (("cdi-annotations", "cdi-cri"), True, True),
    ],
)
def test_cdi_only_or_not(strategies: tuple[str, ...], any_cdi: bool, all_cdi: bool) -> None:
    lists = DeviceLists(strategies)
    assert (lists.any_cdi, lists.all_cdi) == (any_cdi, all_cdi)


def test_strategies_are_checked_once_each() -> None:
    assert check_strategies([" cdi-cri", "envvar", "", "cdi-cri "]) == ("cdi-cri", "envvar")
    with pytest.raises(
        ValueError, match=r"'cdi', 'nvml': not a device list strategy; choose from envvar, vol"
    ):
        check_strategies(["envvar", "cdi", "nvml"])
    with pytest.raises(ValueError, match="no device list strategy"):
        check_strategies(["", " "])
    with pytest.raises(ValueError, match="not a device list strategy"):
        DeviceLists(("index",))
