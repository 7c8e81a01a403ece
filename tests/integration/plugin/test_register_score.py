"""The plugin writes ``hami.io/node-nvidia-score`` as HAMi's plugin does, on change only."""

from __future__ import annotations

from hamid.model.annotations import decode_pair_scores
from hamid.model.gpulinks import GpuLink
from hamid.model.nodeconfig import NodeConfig
from hamid.plugin.discovery import PhysicalGpu

from .helpers import NODE, eventually, running_plugin, stored_annotations

SCORE = "hami.io/node-nvidia-score"  # the wire name, spelled out
GPUS = tuple(PhysicalGpu(f"GPU-{i}", i, "A100", 40960, 0, f"0000:{i:02x}:00.0") for i in range(3))


def mirrored(pairs: dict[tuple[int, int], GpuLink]) -> dict[str, dict[str, GpuLink]]:
    out: dict[str, dict[str, GpuLink]] = {}
    for (a, b), link in pairs.items():
        out.setdefault(f"GPU-{a}", {})[f"GPU-{b}"] = link
        out.setdefault(f"GPU-{b}", {})[f"GPU-{a}"] = link
    return out


async def test_score_written_with_the_register_and_rewritten_only_on_change() -> None:
    links = mirrored({(0, 1): GpuLink("SINGLE", 4), (0, 2): GpuLink("SYSTEM"), (1, 2): GpuLink("NODE", 2)})
    async with running_plugin(NodeConfig(device_split_count=2), gpus=GPUS, links=links) as (env, _):
        registrar = env.plugin.registrar
        await eventually(lambda: SCORE in stored_annotations(env.server, "Node", NODE, None))
        value = stored_annotations(env.server, "Node", NODE, None)[SCORE]
        assert value == (
            '[{"uuid":"GPU-0","score":{"GPU-1":450,"GPU-2":10}},'
            '{"uuid":"GPU-1","score":{"GPU-0":450,"GPU-2":220}},'
            '{"uuid":"GPU-2","score":{"GPU-0":10,"GPU-1":220}}]'
        )
        await eventually(lambda: env.plugin.pods.node()["metadata"]["annotations"].get(SCORE) == value)
        patches = registrar.patches
        assert not await registrar.register_once()  # nothing changed: no patch
        env.server.patch("Node", None, NODE, {"metadata": {"annotations": {SCORE: "[]"}}})
        await eventually(lambda: env.plugin.pods.node()["metadata"]["annotations"].get(SCORE) == "[]")
        assert await registrar.register_once()  # someone changed it: written again, alone
        assert registrar.patches == patches + 1
        assert stored_annotations(env.server, "Node", NODE, None)[SCORE] == value


async def test_filtered_gpus_are_not_scored_and_no_links_means_no_score() -> None:
    links = mirrored({(0, 1): GpuLink("NODE"), (0, 2): GpuLink("NODE"), (1, 2): GpuLink("NODE")})
    config = NodeConfig(device_split_count=2, filter_indices=(1,))
    async with running_plugin(config, gpus=GPUS, links=links) as (env, _):
        await eventually(lambda: SCORE in stored_annotations(env.server, "Node", NODE, None))
        scores = decode_pair_scores(stored_annotations(env.server, "Node", NODE, None)[SCORE])
        assert scores == {"GPU-0": {"GPU-2": 20}, "GPU-2": {"GPU-0": 20}}
    async with running_plugin(NodeConfig(device_split_count=2), gpus=GPUS) as (env, _):
        await eventually(lambda: env.plugin.registrar.patches == 1)
        assert SCORE not in stored_annotations(env.server, "Node", NODE, None)


async def test_asymmetric_pair_scores_zero_and_warns_on_the_node() -> None:
    links = {"GPU-0": {"GPU-1": GpuLink("NODE", 4)}, "GPU-1": {"GPU-0": GpuLink("NODE")}}
    async with running_plugin(NodeConfig(device_split_count=2), gpus=GPUS[:2], links=links) as (env, _):
        await eventually(lambda: SCORE in stored_annotations(env.server, "Node", NODE, None))
        value = stored_annotations(env.server, "Node", NODE, None)[SCORE]
        assert decode_pair_scores(value) == {"GPU-0": {"GPU-1": 0}, "GPU-1": {"GPU-0": 0}}

        def warned() -> bool:
            events = env.server.list("Event", "default")
            return any(e.get("reason") == "AsymmetricGPUP2PLink" and e["type"] == "Warning" for e in events)

        await eventually(warned)
