"""OpenAPI documents, Table responses, field validation and protobuf bodies over HTTP."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import aiohttp
import pytest

from hamidsim.apiserver import ApiServer
from hamidsim.apiserver.openapi_gen import DEFINITIONS_FILE, _json_schema_definitions, build_definitions
from hamidsim.apiserver.protobuf import MAGIC, MEDIA_TYPE
from hamidsim.apiserver.resources import RESOURCES
from hamidsim.apiserver.tables import human_duration, pod_status
from tests.builders import pod

TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"


def test_committed_definitions_are_generated_from_the_1_35_schemas() -> None:
    assert json.loads(DEFINITIONS_FILE.read_text()) == build_definitions(_json_schema_definitions())


async def test_v3_index_and_group_documents(apiserver: ApiServer) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.get(apiserver.url + "/openapi/v3") as resp:
            index = await resp.json()
        assert set(index["paths"]) >= {"api/v1", "apis/coordination.k8s.io/v1", "apis/events.k8s.io/v1"}
        async with http.get(apiserver.url + index["paths"]["api/v1"]["serverRelativeURL"]) as resp:
            doc = await resp.json()
    patch = doc["paths"]["/api/v1/namespaces/{namespace}/pods/{name}"]["patch"]
    assert patch["x-kubernetes-group-version-kind"] == {"group": "", "version": "v1", "kind": "Pod"}
    assert "fieldValidation" in [p["name"] for p in patch["parameters"]]
    assert "application/strategic-merge-patch+json" in patch["requestBody"]["content"]
    schemas = doc["components"]["schemas"]
    containers = schemas["io.k8s.api.core.v1.PodSpec"]["properties"]["containers"]
    assert containers["x-kubernetes-patch-merge-key"] == "name"
    refs = {part.split('"')[0] for part in json.dumps(doc).split('"#/components/schemas/')[1:]}
    assert refs <= set(schemas), "every reference resolves inside the document"
    for resource in RESOURCES:
        if resource.group == "" and resource.stored:
            assert any(
                s.get("x-kubernetes-group-version-kind")
                == [{"group": "", "kind": resource.kind, "version": "v1"}]
                for s in schemas.values()
            ), resource.kind


async def test_v2_is_json_and_refuses_protobuf_only(apiserver: ApiServer) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.get(apiserver.url + "/openapi/v2", headers={"Accept": "application/json"}) as resp:
            doc = await resp.json()
        protobuf = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf"
        async with http.get(apiserver.url + "/openapi/v2", headers={"Accept": protobuf}) as resp:
            assert resp.status == 406
    assert doc["swagger"] == "2.0"
    assert doc["definitions"]["io.k8s.apimachinery.pkg.api.resource.Quantity"]["type"] == "string"
    assert "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}" in doc["paths"]


async def test_tables_for_list_and_get(apiserver: ApiServer) -> None:
    apiserver.create(pod("web"))
    async with aiohttp.ClientSession(headers={"Accept": TABLE}) as http:
        async with http.get(apiserver.url + "/api/v1/namespaces/default/pods") as resp:
            listed = await resp.json()
        async with http.get(
            apiserver.url + "/api/v1/namespaces/default/pods/web?includeObject=Object"
        ) as resp:
            one = await resp.json()
    assert listed["kind"] == "Table" and listed["apiVersion"] == "meta.k8s.io/v1"
    names = [c["name"] for c in listed["columnDefinitions"]]
    assert names[:5] == ["Name", "Ready", "Status", "Restarts", "Age"]
    assert [c["priority"] for c in listed["columnDefinitions"]][5:7] == [1, 1]
    assert listed["rows"][0]["cells"][:4] == ["web", "0/1", "Pending", "0"]
    assert listed["rows"][0]["object"]["kind"] == "PartialObjectMetadata"
    assert one["rows"][0]["object"]["spec"]["containers"][0]["name"] == "main"


async def test_strict_field_validation_and_warnings(apiserver: ApiServer) -> None:
    body = pod("typo")
    body["spec"]["containers"][0]["imagee"] = "x"
    url = apiserver.url + "/api/v1/namespaces/default/pods"
    async with aiohttp.ClientSession() as http:
        async with http.post(url + "?fieldValidation=Strict", json=body) as resp:
            assert resp.status == 400
            assert 'unknown field "spec.containers[0].imagee"' in (await resp.json())["message"]
        assert apiserver.get("Pod", "default", "typo") is None
        async with http.post(url + "?fieldValidation=Warn", json=body) as resp:
            assert resp.status == 201
            assert resp.headers.getall("Warning") == ['299 - "unknown field \\"spec.containers[0].imagee\\""']
        async with http.post(url + "?fieldValidation=Sloppy", json=pod("other")) as resp:
            assert resp.status == 400


def _field(number: int, payload: bytes) -> bytes:
    return bytes([number << 3 | 2, len(payload)]) + payload


def _unknown(api_version: str, kind: str, raw: bytes) -> bytes:
    type_meta = _field(1, api_version.encode()) + _field(2, kind.encode())
    return MAGIC + _field(1, type_meta) + _field(2, raw)


async def test_protobuf_namespace_and_refusals(apiserver: ApiServer) -> None:
    labels = _field(11, _field(1, b"team") + _field(2, b"gpu"))
    namespace = _field(1, _field(1, b"proto-ns") + labels)
    headers = {"Content-Type": MEDIA_TYPE, "Accept": "application/vnd.kubernetes.protobuf,application/json"}
    async with aiohttp.ClientSession(headers=headers) as http:
        async with http.post(
            apiserver.url + "/api/v1/namespaces", data=_unknown("v1", "Namespace", namespace)
        ) as resp:
            assert resp.status == 201 and resp.content_type == "application/json"
        async with http.post(
            apiserver.url + "/api/v1/namespaces/default/pods", data=_unknown("v1", "Pod", b"")
        ) as resp:
            assert resp.status == 415
            assert "kind v1/Pod" in (await resp.json())["message"]
        odd = _field(1, _field(1, b"odd") + _field(15, b"?"))
        async with http.post(
            apiserver.url + "/api/v1/namespaces", data=_unknown("v1", "Namespace", odd)
        ) as resp:
            assert resp.status == 415
            assert "field 15 of ObjectMeta" in (await resp.json())["message"]
    stored = apiserver.get("Namespace", None, "proto-ns")
    assert stored is not None
    assert stored["metadata"]["labels"] == {"team": "gpu", "kubernetes.io/metadata.name": "proto-ns"}
    assert apiserver.get("Namespace", None, "odd") is None


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (-5, "<invalid>"),
        (59, "59s"),
        (119, "119s"),
        (125, "2m5s"),
        (600, "10m"),
        (3 * 3600 + 60, "3h1m"),
        (30 * 3600, "30h"),
        (3 * 86400 + 3600, "3d1h"),
        (100 * 86400, "100d"),
        (800 * 86400, "2y70d"),
    ],
)
def test_human_duration(seconds: int, text: str) -> None:
    assert human_duration(seconds) == text


def test_pod_status_reasons() -> None:
    base = pod("p")
    waiting = {
        **base,
        "status": {
            "phase": "Pending",
            "containerStatuses": [{"name": "main", "state": {"waiting": {"reason": "ContainerCreating"}}}],
        },
    }
    assert pod_status(waiting) == "ContainerCreating"
    failed = {**base, "status": {"phase": "Failed", "reason": "UnexpectedAdmissionError"}}
    assert pod_status(failed) == "UnexpectedAdmissionError"
    later = (datetime.now(UTC) + timedelta(seconds=30)).strftime("%Y-%m-%dT%H:%M:%SZ")
    deleting = {
        **base,
        "metadata": {**base["metadata"], "deletionTimestamp": later},
        "status": {"phase": "Running"},
    }
    assert pod_status(deleting) == "Terminating"
