"""`hamid sim apiserver`: the embedded in-memory API server as a standalone process."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import click
import yaml

from hamid.options import option
from hamid.signals import wait_for_signal
from hamidsim.apiserver import ApiServer
from hamidsim.apiserver.errors import ApiError
from hamidsim.apiserver.kubeconfig import write_kubeconfig


def parse_listen(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` for IPv6) -> (host, port); port 0 picks a free port."""
    host, sep, port = value.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not (port.isascii() and port.isdigit()) or not 0 <= int(port) <= 65535:
        raise click.BadParameter(f"{value!r} is not HOST:PORT (port 0-65535)", param_hint="--listen")
    return host, int(port)


def load_seed(path: Path) -> list[dict[str, Any]]:
    """Objects from a YAML or JSON file: documents, each one object or a ``List`` with ``items``."""
    try:
        documents = list(yaml.safe_load_all(path.read_text(encoding="utf-8")))
    except (OSError, yaml.YAMLError) as err:
        raise click.BadParameter(f"cannot read {path}: {err}", param_hint="--seed-file") from err
    objects: list[dict[str, Any]] = []
    for doc in documents:
        if doc is None:
            continue
        items = (
            doc.get("items") if isinstance(doc, dict) and str(doc.get("kind", "")).endswith("List") else [doc]
        )
        for item in items or []:
            if not isinstance(item, dict):
                raise click.BadParameter(f"{path}: every object must be a mapping", param_hint="--seed-file")
            objects.append(item)
    return objects


async def serve(server: ApiServer, seed: list[dict[str, Any]], kubeconfig: Path | None = None) -> None:
    """Start, seed, print the URL line (and write ``kubeconfig``), and serve until SIGINT or SIGTERM."""
    await server.start()
    try:
        for obj in seed:
            try:
                server.put(obj)
            except (ApiError, KeyError) as err:
                raise click.ClickException(f"cannot seed {json.dumps(obj)[:200]}: {err}") from err
        click.echo(f"listening on {server.url}")
        if kubeconfig is not None:
            written = await asyncio.to_thread(write_kubeconfig, kubeconfig, server.url)
            click.echo(f"kubeconfig written to {written}; use: export KUBECONFIG={written}")
        await wait_for_signal()
    finally:
        await server.stop()


@click.command("apiserver")
@option(
    "--listen",
    default="127.0.0.1:8080",
    help="HOST:PORT to serve plain HTTP on (port 0 picks a free port; the first output line names it).",
)
@option(
    "--seed-file",
    "seed_files",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="YAML or JSON file of objects (or Lists) to load before serving; repeatable.",
)
@option(
    "--history-size",
    type=click.IntRange(min=1),
    default=10_000,
    help="Watch events kept per resource; a watch from an older resourceVersion gets 410 Gone.",
)
@option(
    "--bookmark-interval",
    type=click.FloatRange(min=0.1),
    default=30.0,
    help="Seconds between BOOKMARK events on watches that allow them.",
)
@option(
    "--write-kubeconfig",
    "kubeconfig",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write a kubeconfig for kubectl pointing at this server to this path once listening.",
)
@option(
    "--auto-namespaces/--no-auto-namespaces",
    default=True,
    help="Create a namespace on first use instead of answering 404 like a real cluster.",
)
def apiserver_command(
    listen: str,
    seed_files: tuple[Path, ...],
    history_size: int,
    bookmark_interval: float,
    kubeconfig: Path | None,
    auto_namespaces: bool,
) -> None:
    """Serve an in-memory Kubernetes API server (for the demo and tests) until interrupted.

    Prints `listening on http://HOST:PORT` as its first line. Fault injection and token registration:
    POST /_sim/faults, DELETE /_sim/faults, POST /_sim/tokens, POST /_sim/watches/close.
    """
    host, port = parse_listen(listen)
    seed = [obj for path in seed_files for obj in load_seed(path)]
    server = ApiServer(
        host,
        port,
        history_size=history_size,
        bookmark_interval=bookmark_interval,
        auto_namespaces=auto_namespaces,
    )
    try:
        asyncio.run(serve(server, seed, kubeconfig))
    except OSError as err:
        raise click.ClickException(f"cannot listen on {listen}: {err}") from err
