"""Clients for the embedded API server tests: kubernetes-asyncio, unchanged."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from kubernetes_asyncio import client

from hamidsim.apiserver import ApiServer


@pytest.fixture
async def api(apiserver: ApiServer) -> AsyncIterator[client.ApiClient]:
    """A kubernetes-asyncio ApiClient pointed at the ``apiserver`` fixture."""
    config = client.Configuration(host=apiserver.url)
    async with client.ApiClient(config) as api_client:
        yield api_client


@pytest.fixture
def core(api: client.ApiClient) -> client.CoreV1Api:
    """CoreV1Api on the embedded server."""
    return client.CoreV1Api(api)
