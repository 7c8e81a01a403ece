"""``/ui`` over real HTTP: a scheduler app against the embedded API server, pages from its caches."""

from __future__ import annotations

import asyncio
import contextlib
import html
import re
from collections.abc import AsyncIterator, MutableMapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from hamid.model import annotations as ann
from hamid.scheduler.app import SchedulerApp
from hamid.scheduler.ui.routes import CSP
from hamid.tls import client_ssl_context
from hamidsim.apiserver import ApiServer
from tests.fixtures.tls import TLSFiles
from tests.integration.scheduler.harness import loopback_options, running_app, wait_for
from tests.unit.scheduler.helpers import container, node

MARKUP = '<script>window.pwned=1</script><img src=x onerror="window.pwned=2">'


@dataclass
class Ui:
    server: ApiServer
    app: SchedulerApp
    session: aiohttp.ClientSession

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.app.ports['metrics']}"

    async def get(self, path: str, **kw: Any) -> tuple[int, str, Any]:
        async with self.session.get(self.base + path, **kw) as resp:
            return resp.status, await resp.text(), resp.headers

    async def place(self, name: str, node_name: str = "node-a", **annotations: str) -> dict[str, Any]:
        """Create a one-GPU pod and run it through /filter and /bind (a real reservation)."""
        kube = self.app.scheduler.kube
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "annotations": annotations},
            "spec": {"schedulerName": "hami-scheduler", "containers": [container("main", 1, 1000, 30)]},
        }
        pod = await kube.create_pod(body)
        extender = f"http://127.0.0.1:{self.app.ports['extender']}"
        async with self.session.post(extender + "/filter", json={"Pod": pod, "NodeNames": [node_name]}) as r:
            answer = await r.json()
        if answer.get("NodeNames"):
            meta = pod["metadata"]
            args = {"PodName": name, "PodNamespace": "default", "PodUID": meta["uid"], "Node": node_name}
            async with self.session.post(extender + "/bind", json=args) as r:
                assert (await r.json()).get("Error") in (None, ""), name
        return pod


@contextlib.asynccontextmanager
async def running_ui(**options: Any) -> AsyncIterator[Ui]:
    async with ApiServer() as server:
        server.put({"apiVersion": "v1", "kind": "Node", **node("node-a", 2)})
        async with (
            running_app(loopback_options(server, **options)) as app,
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as session,
        ):
            await wait_for(lambda: "node-a" in app.scheduler.ledger.nodes)
            yield Ui(server, app, session)


def _text(page: str) -> str:
    """The page's visible text, roughly (tags dropped, entities decoded)."""
    return html.unescape(re.sub(r"<[^>]+>", " ", page))


async def test_pages_render_from_the_caches_with_no_api_call() -> None:
    async with running_ui() as ui:
        await ui.place("runner")
        await wait_for(lambda: ui.app.scheduler.pods.get("default/runner") is not None)
        # FilteringSucceed and BindingSucceed are recorded in the background
        await wait_for(lambda: ui.server.requests["create events"] >= 2)
        before = dict(ui.server.requests)
        status, page, headers = await ui.get("/ui")
        assert status == 200, page
        assert headers["Content-Security-Policy"] == CSP
        assert headers["X-Content-Type-Options"] == "nosniff"
        assert "node-a" in page and 'href="ui/node/node-a"' in page
        status, page, _ = await ui.get("/ui/node/node-a")
        assert status == 200, page
        assert 'data-pod="default/runner"' in page  # its shares on the GPU drawn in the map
        assert "profile-missing" in page  # why predictions there are unknown
        status, page, _ = await ui.get("/ui/pod/default/runner")
        assert status == 200, page
        assert "node-a-gpu" in page and "1000 MiB, 30%" in page
        assert 'href="../../../ui/node/node-a"' in page
        status, _, _ = await ui.get("/ui/static/ui.js")
        assert status == 200
        watches = {k: v for k, v in ui.server.requests.items() if not k.startswith("watch")}
        assert watches == {k: v for k, v in before.items() if not k.startswith("watch")}


async def test_a_pending_pods_fit_reasons_and_markup_render_as_text() -> None:
    async with running_ui() as ui:
        await ui.place("typed", **{ann.USE_GPU_TYPE: MARKUP})
        await wait_for(lambda: ui.app.scheduler.history.unfit("default/typed") is not None)
        status, page, _ = await ui.get("/ui/pod/default/typed")
        assert status == 200, page
        assert "<script>window" not in page and "<img" not in page
        assert "&lt;script&gt;window.pwned=1&lt;/script&gt;" in page
        assert "Why it is pending" in page and "CardTypeMismatch" in page
        assert "pending (not bound)" in page


@pytest.mark.parametrize(
    ("path", "status", "reason"),
    [
        ("/ui/node/nowhere", 404, "registers no GPU"),
        ("/ui/pod/default/nobody", 404, "not in the scheduler"),
        ("/ui/pod/default", 404, "no page at"),
        ("/ui/elsewhere/deeper", 404, "no page at"),
        ("/ui?sort=bogus", 400, "sort must be one of"),
        ("/ui?page=0", 400, "page must be"),
        ("/ui?page=%C2%B2", 400, "page must be"),  # '²': str.isdigit holds, int refuses it
        ("/ui?page=9", 404, "past the last page"),
        ("/ui?x=1", 400, "unknown query parameter"),
        ("/ui?page=" + "9" * 5000, 400, "page must be"),  # past int()'s digit limit: no 500
        ("/ui?sort=name&sort=bogus", 400, "'sort' is given more than once"),
        ("/ui?page=1&page=x", 400, "'page' is given more than once"),
        ("/ui?order=asc&order=sideways", 400, "'order' is given more than once"),
        ("/ui/node/node-a?x=1", 400, "a node page takes no query"),  # the page exists
        ("/ui/node/node-a?_=1", 400, "a node page takes no query"),
        ("/ui/pod/default/runner?refresh", 400, "a pod page takes no query"),
        ("/ui/api/stamp/nothing", 404, "no page stamp"),
        ("/ui/static/..%2F..%2Fmetrics", 404, "no page at"),
        ("/ui/node/%3Cscript%3E", 404, "registers no GPU"),
    ],
)
async def test_bad_urls_get_an_error_page_never_a_traceback(
    path: str, status: int, reason: str, logs: list[MutableMapping[str, Any]]
) -> None:
    async with running_ui() as ui:
        got, page, headers = await ui.get(path)
        assert got == status, page
        assert reason in _text(page)
        assert "Traceback" not in page and "<script>" not in page
        assert headers["Content-Security-Policy"] == CSP
    assert not any(e["event"] == "ui_page_failed" for e in logs)  # bad input is no failure


async def test_an_absolute_form_request_target_serves_the_page() -> None:
    """RFC 9112, section 3.2.2: a server accepts ``GET http://host/path`` (some proxies and tools send it)."""
    async with running_ui() as ui:
        port = ui.app.ports["metrics"]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            f"GET http://127.0.0.1:{port}/ui/node/node-a HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            "Connection: close\r\n\r\n".encode()
        )
        answer = await reader.read()
        writer.close()
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head
        assert b"NUMA map" in body


async def test_a_booked_pod_not_bound_yet_is_drawn_and_listed_on_its_node() -> None:
    """After /filter, before /bind: the GPU's label counts the booking, so the bars draw it and the
    pod table lists it (what holds this GPU while a bind is stuck)."""
    async with running_ui() as ui:
        kube = ui.app.scheduler.kube
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "booked", "namespace": "default"},
            "spec": {"schedulerName": "hami-scheduler", "containers": [container("main", 1, 1000, 30)]},
        }
        pod = await kube.create_pod(body)
        extender = f"http://127.0.0.1:{ui.app.ports['extender']}"
        async with ui.session.post(extender + "/filter", json={"Pod": pod, "NodeNames": ["node-a"]}) as r:
            assert (await r.json()).get("NodeNames") == ["node-a"]

        def annotated() -> bool:
            cached = ui.app.scheduler.pods.get("default/booked")
            return cached is not None and ann.VGPU_NODE in (cached["metadata"].get("annotations") or {})

        await wait_for(annotated)
        status, page, _ = await ui.get("/ui/node/node-a")
        assert status == 200, page
        assert re.search(r"1000/\d+ MiB", page)  # the GPU label counts the booking
        assert 'class="share memory" data-pod="default/booked"' in page  # and its bar draws it
        assert re.search(r"default/booked\s+\(booked, not bound yet\)", _text(page))  # listed


async def test_only_get_and_head_exist() -> None:
    async with running_ui() as ui:
        async with ui.session.head(ui.base + "/ui") as resp:
            assert resp.status == 200
        for method in ("POST", "PUT", "PATCH", "DELETE"):
            async with ui.session.request(method, ui.base + "/ui/node/node-a", data=b"{}") as resp:
                assert resp.status == 405
                assert resp.headers["Allow"] == "GET, HEAD"
                assert "read-only" in await resp.text()


async def test_the_refresh_stamp_answers_304_until_the_page_changes() -> None:
    async with running_ui() as ui:
        status, body, headers = await ui.get("/ui/api/stamp/node/node-a")
        assert status == 200
        etag = headers["ETag"]
        assert body == f'{{"stamp": {etag}}}'
        status, _, _ = await ui.get("/ui/api/stamp/node/node-a", headers={"If-None-Match": etag})
        assert status == 304
        await ui.place("changer")
        await wait_for(lambda: any(d.used for d in ui.app.scheduler.ledger.nodes["node-a"].usage.devices))
        status, _, headers = await ui.get("/ui/api/stamp/node/node-a", headers={"If-None-Match": etag})
        assert status == 200 and headers["ETag"] != etag


async def test_no_ui_leaves_only_the_metrics() -> None:
    async with running_ui(ui=False) as ui:
        assert (await ui.get("/ui"))[0] == 404
        assert (await ui.get("/metrics"))[0] == 200


async def test_metrics_auth_asks_tokenreview_then_subjectaccessreview() -> None:
    async with running_ui(metrics_auth=True) as ui:
        ui.server.register_token("alice-token", "alice", groups=("ops", "system:authenticated"))
        ui.server.register_token("bob-token", "bob")
        ui.server.access.grant(groups=["ops"], paths=["/metrics", "/ui", "/ui/*"])

        def bearer(token: str) -> dict[str, Any]:
            return {"headers": {"Authorization": f"Bearer {token}"}}

        for path in ("/metrics", "/metrics/hami", "/ui", "/ui/node/node-a"):
            status, body, headers = await ui.get(path)
            assert status == 401 and "bearer token is required" in body
            assert headers["WWW-Authenticate"].startswith("Bearer")
        status, body, _ = await ui.get("/ui", **bearer("forged"))
        assert status == 401 and "not authenticated" in body
        status, body, _ = await ui.get("/ui", **bearer("bob-token"))
        assert status == 403 and "'bob' may not get /ui" in body
        for path in ("/metrics", "/ui", "/ui/node/node-a", "/ui/static/ui.css"):
            assert (await ui.get(path, **bearer("alice-token")))[0] == 200, path
        assert (await ui.get("/metrics/hami", **bearer("alice-token")))[0] == 403  # not granted
        reviews = ui.server.requests["create subjectaccessreviews"]
        assert (await ui.get("/ui", **bearer("alice-token")))[0] == 200
        assert ui.server.requests["create subjectaccessreviews"] == reviews  # cached


async def test_metrics_tls_serves_the_port_over_tls_only(tls_files: TLSFiles) -> None:
    """``--metrics-tls``: the bearer token only ever crosses the network inside TLS; plain HTTP to
    the port gets no answer, and a client that does not trust the certificate none either."""
    cert = {"tls_cert_file": str(tls_files.server.cert_file), "tls_key_file": str(tls_files.server.key_file)}
    async with running_ui(metrics_auth=True, metrics_tls=True, **cert) as ui:
        ui.server.register_token("alice-token", "alice", groups=("ops",))
        ui.server.access.grant(groups=["ops"], paths=["/metrics", "/ui", "/ui/*"])
        url = f"https://localhost:{ui.app.ports['metrics']}"
        alice = {"Authorization": "Bearer alice-token"}
        ctx = client_ssl_context(tls_files.ca_file)
        async with ui.session.get(url + "/metrics", ssl=ctx, headers=alice) as resp:
            assert resp.status == 200 and "hamid_filter_duration_seconds" in await resp.text()
        async with ui.session.get(url + "/ui", ssl=ctx) as resp:
            assert resp.status == 401  # TLS does not replace the token check
        with pytest.raises(aiohttp.ClientError):
            await ui.get("/metrics", headers=alice)  # plain HTTP
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            async with ui.session.get(url + "/metrics", ssl=client_ssl_context(), headers=alice):
                pass


async def test_metrics_auth_without_tls_warns_that_tokens_travel_in_clear(
    logs: list[MutableMapping[str, Any]],
) -> None:
    async with running_ui(metrics_auth=True):
        pass
    assert any(e["event"] == "metrics_auth_plain_http" and "--metrics-tls" in e["hint"] for e in logs)
