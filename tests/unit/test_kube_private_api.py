"""kubernetes-asyncio's private layout, which two hamid modules rely on, in the releases hamid knows.

``hamid/kube/lean.py`` registers kubernetes-asyncio's packages bare (it relies on which modules hold
``ApiClient`` and ``Configuration`` and on ``kubernetes_asyncio.config`` importing only those from
``kubernetes_asyncio.client``), and ``hamid/kube/client.py`` replaces ``ApiClient.rest_client.pool_manager``
(the aiohttp session) and calls ``ApiClient.call_api`` with keyword arguments. Neither is public API,
so the installed release must be one these checks passed on; on any other the first test fails with
one line that says what to do.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import aiohttp
import pytest
from kubernetes_asyncio.client import ApiClient, Configuration

from hamid.kube.client import _without_env_lookups

REPO = Path(__file__).resolve().parents[2]

#: The releases whose private layout this file's checks (and the plugin's lean-client test) passed on.
KNOWN = ("30.1.0", "32.3.2", "34.3.3", "35.0.1", "36.1.0")

LEAN_CHILD = textwrap.dedent(
    """
    import json, sys
    from hamid.kube.lean import use_lean_client
    lean = use_lean_client()
    import hamid.kube.client  # the whole kube client's import graph, on the bare packages
    from kubernetes_asyncio.client import ApiClient, Configuration
    from kubernetes_asyncio.client.api_client import ApiClient as Real
    from kubernetes_asyncio.client.configuration import Configuration as RealConfiguration
    loaded = [m for m in sys.modules if m.startswith("kubernetes_asyncio")]
    print(json.dumps({"lean": lean, "same": ApiClient is Real and Configuration is RealConfiguration,
                      "models": sorted(m for m in loaded if ".models." in m)[:3]}))
    """
)


def test_the_installed_release_is_one_whose_private_layout_hamid_knows() -> None:
    version = importlib.metadata.version("kubernetes-asyncio")
    if version not in KNOWN:
        pytest.fail(
            f"kubernetes-asyncio {version} is not a release hamid/kube/lean.py and hamid/kube/client.py "
            f"were checked against ({', '.join(KNOWN)}): run {Path(__file__).relative_to(REPO)} and "
            "tests/integration/plugin/test_lean_client.py with it, then add it to KNOWN",
            pytrace=False,
        )


def test_the_bare_packages_still_hold_the_client_and_load_no_model() -> None:
    env = {"PYTHONPATH": os.pathsep.join([str(REPO), *sys.path]), "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-c", LEAN_CHILD], capture_output=True, text=True, timeout=60, env=env, check=True
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"lean": True, "same": True, "models": []}


def test_call_api_takes_the_keywords_the_client_sends() -> None:
    sent = {"query_params", "header_params", "body", "auth_settings", "_preload_content", "_request_timeout"}
    assert sent <= set(inspect.signature(ApiClient.call_api).parameters)


async def test_the_http_session_is_where_the_swap_replaces_it() -> None:
    api = ApiClient(Configuration(host="http://127.0.0.1:9"))
    try:
        before = api.rest_client.pool_manager
        assert isinstance(before, aiohttp.ClientSession) and before.trust_env
        connector = before.connector
        _without_env_lookups(api)
        after = api.rest_client.pool_manager
        assert isinstance(after, aiohttp.ClientSession) and not after.trust_env
        assert connector is not None and after.connector is connector and before.connector is None
    finally:
        await api.close()
