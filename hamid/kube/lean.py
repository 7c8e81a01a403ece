"""kubernetes-asyncio's HTTP client without its generated models and typed APIs (~40 MiB).

hamid talks to the API server in raw JSON (:mod:`hamid.kube.client` uses only ``ApiClient``,
``Configuration``, ``ApiException`` and the kubeconfig loaders), but importing any part of
kubernetes-asyncio runs the package ``__init__`` files that import every generated model and API
module. A process that never uses the typed API (``hamid plugin``) calls :func:`use_lean_client`
before anything imports kubernetes-asyncio: the three package modules whose ``__init__`` does that
are registered bare (their directories still searchable, so any submodule stays importable), and
the client's two classes are put where ``kubernetes_asyncio.config`` imports them from. Typed names
such as ``kubernetes_asyncio.client.CoreV1Api`` are then absent in that process.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from pathlib import Path

_BARE_PACKAGES = ("kubernetes_asyncio", "kubernetes_asyncio.client", "kubernetes_asyncio.client.models")


def use_lean_client() -> bool:
    """Register the bare packages; False (and nothing changed) when kubernetes-asyncio is loaded already."""
    if "kubernetes_asyncio" in sys.modules:
        return False
    spec = importlib.util.find_spec("kubernetes_asyncio")
    if spec is None or not spec.submodule_search_locations:
        return False
    root = Path(next(iter(spec.submodule_search_locations)))
    for name in _BARE_PACKAGES:
        module = types.ModuleType(name)
        module.__path__ = [str(root.joinpath(*name.split(".")[1:]))]
        module.__package__ = name
        sys.modules[name] = module
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, module)
    client = sys.modules["kubernetes_asyncio.client"]
    client.ApiClient = importlib.import_module("kubernetes_asyncio.client.api_client").ApiClient  # type: ignore[attr-defined]
    client.Configuration = importlib.import_module(  # type: ignore[attr-defined]
        "kubernetes_asyncio.client.configuration"
    ).Configuration
    return True
