"""``PluginApp``: the one start-up of the node agent, from its options to a serving plugin."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from hamid.plugin.app import PluginApp, PluginStartupError
from hamid.plugin.discovery import devices_file_json
from hamid.plugin.options import PluginOptions
from hamid.plugin.refit_client import RefitClientConfig
from hamidsim.apiserver import ApiServer
from tests.integration.plugin.helpers import GPUS, NODE, eventually, short_dir


def _options(directory: Path, server: ApiServer, **kw: object) -> PluginOptions:
    devices = directory / "devices.json"
    devices.write_text(devices_file_json(list(GPUS)))
    return PluginOptions(
        node_name=NODE,
        devices_file=str(devices),
        node_config_file=str(directory / "none.json"),
        device_plugin_dir=str(directory),
        hook_path=str(directory / "hook"),
        metrics_listen="127.0.0.1:0",
        kubelet_config=None,
        api_server=server.url,
        **kw,  # type: ignore[arg-type]
    )


async def test_start_serves_the_plugin_and_its_metrics_then_stops() -> None:
    with short_dir() as directory:
        async with ApiServer() as server:
            server.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
            app = PluginApp(_options(directory, server), numa=False)
            ports = await app.start()
            try:
                await app.wait_synced()
                assert len(app.plugin.inventory.gpus) == len(GPUS)
                await eventually(lambda: app.plugin.connector.socket_path.exists())
                url = f"http://127.0.0.1:{ports['metrics']}/healthz"
                async with aiohttp.ClientSession() as session, session.get(url) as resp:
                    assert resp.status == 200
            finally:
                await app.stop()
            with pytest.raises(RuntimeError, match="not started"):
                _ = app.plugin


async def test_contradictory_refit_flags_stop_the_start_in_one_line() -> None:
    with short_dir() as directory:
        async with ApiServer() as server:
            refit = RefitClientConfig(endpoint="https://s:443", client_cert_file="/c.pem", token_file=None)
            app = PluginApp(_options(directory, server, refit=refit))
            with pytest.raises(PluginStartupError, match="must be given together"):
                await app.start()
