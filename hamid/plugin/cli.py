"""`hamid plugin` command: the node agent (kubelet device plugin + node registration)."""

from __future__ import annotations

import asyncio
import os
from urllib.parse import urlsplit

import click

from hamid.kube.lean import use_lean_client
from hamid.listen import ListenError
from hamid.log import get_logger
from hamid.options import click_options, from_cli
from hamid.plugin.options import PluginOptions, refuse_unbuilt
from hamid.plugin.refit_client import RefitClientConfig
from hamid.signals import run_until_signal
from hamid.tls import TLSConfigError, client_ssl_context

log = get_logger("plugin")


def check_refit_config(config: RefitClientConfig) -> list[str]:
    """Refit settings that would make every refit fail, checked once at start.

    Raises :class:`click.UsageError` (one line, what to change) for a configuration under which
    no refit can succeed; returns warnings for one that works but is unsafe.
    """
    if not config.endpoint.strip():
        return []
    parts = urlsplit(config.endpoint.strip())
    scheme = parts.scheme
    if scheme not in ("http", "https") or not parts.netloc:
        raise click.UsageError(
            f"--scheduler-endpoint {config.endpoint!r} is not a URL like https://<host>:<port> "
            "(the scheduler's /refit service)"
        )
    if scheme == "http":
        if config.token_file:
            raise click.UsageError(
                f"--scheduler-endpoint {config.endpoint} is plain http://, but the ServiceAccount token is "
                "only ever sent over https: use https:// (the chart's default), or "
                "--service-account-token-file='' for unauthenticated refit (development only)"
            )
        return [f"NUMA refit over plain http:// ({config.endpoint}): unauthenticated and unencrypted"]
    if scheme == "https" and not config.insecure:
        try:
            client_ssl_context(
                ca_file=config.ca_file, cert_file=config.client_cert_file, key_file=config.client_key_file
            )
        except TLSConfigError as exc:
            raise click.UsageError(f"NUMA refit TLS: {exc}") from None
    if config.token_file and not (
        os.path.isfile(config.token_file) and os.access(config.token_file, os.R_OK)
    ):
        hint = (
            "with --scheduler-client-cert-file set, pass --service-account-token-file='' to authenticate "
            "by mTLS only"
            if config.client_cert_file
            else "mount a projected token there (the chart does) or authenticate by mTLS"
        )
        raise click.UsageError(
            f"--service-account-token-file {config.token_file} is missing, not a file or unreadable, "
            f"so every NUMA refit would fail; {hint}"
        )
    return []


@click.command("plugin")
@click_options(PluginOptions)
@refuse_unbuilt
def plugin_command(**values: object) -> None:
    """Run the node agent: GPU discovery, node registration, and the kubelet device plugin."""
    options = from_cli(PluginOptions, values)
    for warning in check_refit_config(options.refit):
        log.warning("refit_config_warning", problem=warning)
    # The plugin never uses kubernetes-asyncio's typed models: load its client without them (the
    # plugin's peak RSS, see hamid.kube.lean), so hamid.plugin.app is imported only after this.
    use_lean_client()
    from hamid.plugin.app import PluginStartupError, run_plugin

    try:
        if asyncio.run(run_until_signal(run_plugin(options))):
            log.info("plugin_stopped")
    except (PluginStartupError, ListenError) as exc:
        raise click.ClickException(str(exc)) from None
