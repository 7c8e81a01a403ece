"""The ``/ui`` routes on the metrics listener: pages, their refresh stamps and two static files.

Only GET and HEAD exist (anything else: 405 with ``Allow``); a ``Host`` that is not the
scheduler's own (:mod:`.hosts`, DNS rebinding): 421; an unknown path or object: a 404 page; a
bad query: a 400 page with the reason; before the scheduler's caches have synced: a 503 page
that says so; a failure while rendering: a 500 page that says so (logged), never a traceback.
Every response carries a strict Content-Security-Policy (scripts and styles only from this
listener's own files, no inline script or style, no framing).

A page's script polls ``/ui/api/stamp/<page>`` with ``If-None-Match``: 304 while the page's
figures are unchanged, else the new stamp, and the page reloads itself.
"""

from __future__ import annotations

import importlib.resources
import json
from collections.abc import Awaitable, Callable
from urllib.parse import unquote

from aiohttp import web

from hamid.log import get_logger
from hamid.scheduler.ui.hosts import host_allowed, is_loopback
from hamid.scheduler.ui.markup import Safe, el, join, path_part
from hamid.scheduler.ui.pages import (
    UNSYNCED,
    UNSYNCED_STAMP,
    BadRequest,
    ClusterQuery,
    NotFound,
    Page,
    cluster_page,
    cluster_stamp,
    node_href,
    node_page,
    node_stamp,
    pod_href,
    pod_page,
    pod_stamp,
    root_of,
)
from hamid.scheduler.ui.snapshot import Snapshots
from hamid.scheduler.ui.source import UiSource

log = get_logger("scheduler.ui")

UI_PREFIX = "/ui"
#: How often the page script asks whether its page changed (ms; doubled on errors up to a minute).
REFRESH_MS = 5000
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}
_STATIC = {"ui.js": "text/javascript", "ui.css": "text/css", "favicon.svg": "image/svg+xml"}
SNAPSHOTS_KEY = web.AppKey("ui_snapshots", Snapshots)
SOURCE_KEY = web.AppKey("ui_source", UiSource)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_TITLES = {
    400: "Bad request",
    404: "Not found",
    405: "Method not allowed",
    421: "Misdirected request",
    500: "Page failed",
    503: "Not ready",
}


class NotSynced(Exception):
    """The scheduler's caches have not synced yet: a 503 page that reloads itself once they have."""

    def __init__(self, stamp_path: str) -> None:
        super().__init__(UNSYNCED)
        #: The page's stamp path (``cluster``, ``node/<node>``, ``pod/<ns>/<name>``).
        self.stamp_path = stamp_path


def _static_files() -> dict[str, bytes]:
    folder = importlib.resources.files("hamid.scheduler.ui") / "static"
    return {name: (folder / name).read_bytes() for name in _STATIC}


def add_ui(app: web.Application, source: UiSource, hosts: tuple[str, ...] = ()) -> None:
    """Mount ``/ui`` on ``app`` (the metrics listener's) over ``source``; ``hosts``: names it
    answers besides its own (``--ui-hosts``)."""
    snapshots = Snapshots(source)
    app[SOURCE_KEY] = source
    app[SNAPSHOTS_KEY] = snapshots
    files = _static_files()

    async def close(_app: web.Application) -> None:
        await snapshots.close()

    app.on_cleanup.append(close)

    async def dispatch(request: web.Request) -> web.StreamResponse:
        if not host_allowed(_authority(request), hosts, loopback=is_loopback(request.remote)):
            why = (
                "this view answers only its own host names: localhost, an IP address, the Service's "
                "name or one given with --ui-hosts"
            )
            return _error(request, 421, why)
        if request.method not in ("GET", "HEAD"):
            return _error(request, 405, "this view is read-only: only GET and HEAD", {"Allow": "GET, HEAD"})
        try:
            return await _route(request, source, snapshots, files)
        except BadRequest as exc:
            return _error(request, 400, str(exc))
        except NotFound as exc:
            return _error(request, 404, str(exc))
        except NotSynced as exc:
            stamp_url = _stamp_url(root_of(request.path), exc.stamp_path)
            return _error(request, 503, str(exc), {"Retry-After": "5"}, stamp_url)
        except Exception:
            log.exception("ui_page_failed", path=request.path)
            return _error(request, 500, "this page failed to render; the scheduler's log has the details")

    app.router.add_route("*", UI_PREFIX, dispatch)
    app.router.add_route("*", UI_PREFIX + "/{tail:.*}", dispatch)


def _authority(request: web.Request) -> str | None:
    """The host the request names: an absolute-form target's (RFC 9112, section 3.2.2), else its ``Host``."""
    if not request.raw_path.startswith("/"):
        return request.url.host
    return request.headers.get("Host")


def _segments(request: web.Request) -> list[str]:
    """The path after ``/ui``, split and unquoted (the raw path: a quoted ``/`` stays inside its
    segment; the relative URL's: an absolute-form target names the scheme and host too)."""
    raw = request.rel_url.raw_path[len(UI_PREFIX) :]
    return [unquote(s) for s in raw.split("/")[1:]] if raw else []


async def _route(
    request: web.Request, source: UiSource, snapshots: Snapshots, files: dict[str, bytes]
) -> web.StreamResponse:
    parts = _segments(request)
    root = root_of(request.path)
    match parts:
        case [] | [""]:
            query = ClusterQuery.parse(ClusterQuery.values(request.query.items()))
            _synced(source, "cluster")
            return _html(request, cluster_page(source, await snapshots.get(), query, root), "cluster")
        case ["node", node] if node:
            _no_query(request, "node")
            _synced(source, f"node/{node}")
            return _html(request, node_page(source, node, root), f"node/{node}")
        case ["pod", namespace, name] if namespace and name:
            _no_query(request, "pod")
            _synced(source, f"pod/{namespace}/{name}")
            return _html(request, pod_page(source, namespace, name, root), f"pod/{namespace}/{name}")
        case ["static", name] if name in files:
            headers = {**SECURITY_HEADERS, "Cache-Control": "max-age=300"}
            return web.Response(body=files[name], content_type=_STATIC[name], headers=headers)
        case ["api", "stamp", *page]:
            return await _stamp(request, source, snapshots, page)
    raise NotFound(f"no page at {request.path}")


def _no_query(request: web.Request, page: str) -> None:
    if request.query_string:
        raise BadRequest(f"a {page} page takes no query (its URL is the whole address)")


def _synced(source: UiSource, stamp_path: str) -> None:
    if not source.synced():
        raise NotSynced(stamp_path)


async def _stamp(
    request: web.Request, source: UiSource, snapshots: Snapshots, page: list[str]
) -> web.Response:
    match page:
        case ["cluster"] | ["node", _] | ["pod", _, _] if all(page) and not source.synced():
            stamp = UNSYNCED_STAMP
        case ["cluster"]:
            stamp = cluster_stamp(source, await snapshots.get())
        case ["node", node] if node:
            stamp = node_stamp(source, node)
        case ["pod", namespace, name] if namespace and name:
            stamp = pod_stamp(source, namespace, name)
        case _:
            raise NotFound(f"no page stamp at {request.path}")
    etag = f'"{stamp}"'
    headers = {**SECURITY_HEADERS, "ETag": etag, "Cache-Control": "no-cache"}
    if request.headers.get("If-None-Match") == etag:
        return web.Response(status=304, headers=headers)
    return web.Response(text=json.dumps({"stamp": stamp}), content_type="application/json", headers=headers)


def _html(request: web.Request, page: Page, stamp_path: str) -> web.Response:
    root = root_of(request.path)
    return web.Response(
        text=document(page, root, _stamp_url(root, stamp_path)),
        content_type="text/html",
        charset="utf-8",
        headers=SECURITY_HEADERS,
    )


def _stamp_url(root: str, stamp_path: str) -> str:
    return f"{root}ui/api/stamp/{'/'.join(path_part(p) for p in stamp_path.split('/'))}"


def document(page: Page, root: str, stamp_url: str = "", status: str = "") -> str:
    """The whole HTML document around a page body."""
    crumbs: list[object] = [el("a", "cluster", href=f"{root}ui")]
    for kind, value in page.crumbs:
        href = node_href(root, value) if kind == "node" else pod_href(root, value)
        crumbs += [" / ", el("a", f"{kind} {value}", href=href)]
    head = el(
        "head",
        el("meta", charset="utf-8"),
        el("meta", name="viewport", content="width=device-width, initial-scale=1"),
        el("title", page.title),
        el("link", rel="icon", href=f"{root}ui/static/favicon.svg", type="image/svg+xml"),
        el("link", rel="stylesheet", href=f"{root}ui/static/ui.css"),
        el("script", src=f"{root}ui/static/ui.js", defer=True),
    )
    body = el(
        "body",
        el(
            "header",
            el("nav", el("strong", "hamid"), " ", crumbs, class_="crumbs"),
            el("span", status or ("auto-refresh on" if stamp_url else ""), id="refresh-status"),
        ),
        el("main", el("h1", page.title.removeprefix("hamid: ")), page.body),
        el("footer", "Read-only view of the scheduler's own caches (no API-server call per view)."),
        data_stamp=page.stamp,
        data_stamp_url=stamp_url or None,
        data_refresh_ms=REFRESH_MS if stamp_url else None,
    )
    return "<!doctype html>\n" + el("html", head, body, lang="en")


def _error(
    request: web.Request,
    status: int,
    reason: str,
    headers: dict[str, str] | None = None,
    stamp_url: str = "",
) -> web.Response:
    """An error page; with ``stamp_url`` (the page it stands in for until the caches have synced)
    it reloads itself once that page's stamp is no longer :data:`UNSYNCED_STAMP`."""
    title = _TITLES.get(status, "Error")
    root = root_of(request.path)
    body = join(el("p", reason, class_="error"), el("p", el("a", "back to the cluster", href=f"{root}ui")))
    stamp = UNSYNCED_STAMP if stamp_url else ""
    text = document(Page(f"hamid: {title}", Safe(body), stamp), root, stamp_url)
    return web.Response(
        status=status,
        text=text,
        content_type="text/html",
        charset="utf-8",
        headers={**SECURITY_HEADERS, **(headers or {})},
    )
