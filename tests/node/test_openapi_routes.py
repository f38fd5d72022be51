"""The OpenAPI document of a running daemon is its router: every route documented once (a route
serving every record store once per store), nothing documented that is not routed, and the
published sync body names every record store."""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientSession, web

from config import load_settings
from health import BreakerConfig, BreakerRegistry
from node.daemon import NodeDaemon, record_schemas
from node.openapi import RouteDoc, documented_twice
from node.routes import ROUTE_DOCS, build_app
from node.runtime import NodeRuntime
from node.security import AuthPolicy
from sync import FILE_CATEGORIES
from tests.node.daemons import test_settings

STORE = "{store}"
EVALS = {
    "evals": {
        "key": "eval_id",
        "time_column": "created_at",
        "fields": {"eval_id": "text", "created_at": "real", "score": "real"},
    }
}


def _routed(app: web.Application) -> set[tuple[str, str]]:
    return {
        (route.method, route.resource.canonical)
        for route in app.router.routes()
        if route.method != "HEAD" and route.resource is not None
    }


def _pattern(template: str) -> str:
    return re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(template))


def _route_of(operation: tuple[str, str], routed: set[tuple[str, str]]) -> tuple[str, str]:
    """The one route serving a documented operation: its own path, or a template whose
    placeholder the document spells out (one operation per record store, per actor action)."""
    if operation in routed:
        return operation
    method, path = operation
    serving = [
        (m, template)
        for m, template in routed
        if m == method and re.fullmatch(_pattern(template), path) is not None
    ]
    assert len(serving) == 1, f"{method} {path} is served by {serving}, not one route"
    return serving[0]


async def _document(daemon: NodeDaemon) -> dict[str, Any]:
    url = f"http://127.0.0.1:{daemon.port}/v1/openapi.json"
    async with ClientSession() as session, session.get(url) as response:
        assert response.status == 200, await response.text()
        document: dict[str, Any] = await response.json()
        return document


async def test_the_document_holds_each_route_of_the_router_once(tmp_path: Path) -> None:
    async with NodeDaemon(test_settings(tmp_path, "doc")) as daemon:
        app = daemon.http_app
        assert app is not None
        document = await _document(daemon)
    stores = sorted(schema.name for schema in record_schemas(daemon.settings))
    docs = app[ROUTE_DOCS]
    counts = Counter((doc.method, doc.path) for doc in docs)
    assert [key for key, count in counts.items() if count > 1] == []
    assert documented_twice(docs) == []
    assert "games" in stores
    routed = _routed(app)
    documents: defaultdict[tuple[str, str], list[str]] = defaultdict(list)
    for operation in counts:
        documents[_route_of(operation, routed)].append(operation[1])
    assert set(documents) == routed, f"routes without a doc: {sorted(routed - set(documents))}"
    for (method, template), paths in documents.items():
        if STORE in template:
            expected = sorted(template.replace(STORE, store) for store in stores)
            assert sorted(paths) == expected, f"{method} {template}"
        elif "{" not in template:
            assert paths == [template], f"{method} {template}"
    published = {
        (method.upper(), path) for path, item in document["paths"].items() for method in item
    }
    assert published == set(counts)


async def test_sync_run_lists_every_record_store_among_its_categories(tmp_path: Path) -> None:
    settings = test_settings(tmp_path, "cats", record_stores=EVALS)
    async with NodeDaemon(settings) as daemon:
        document = await _document(daemon)
    stores = sorted(schema.name for schema in record_schemas(settings))
    operation = document["paths"]["/v1/sync/run"]["post"]
    schema = operation["requestBody"]["content"]["application/json"]["schema"]
    while "$ref" in schema:
        schema = document["components"]["schemas"][schema["$ref"].rsplit("/", 1)[-1]]
    categories = schema["properties"]["categories"]["items"]["enum"]
    assert {"games", "rollouts", "evals"} <= set(stores)
    assert sorted(categories) == sorted([*FILE_CATEGORIES, *stores])


def test_build_app_refuses_a_route_documented_twice(tmp_path: Path) -> None:
    settings = load_settings(env={"SHOAL_DATA_DIR": str(tmp_path)}).settings
    breakers = BreakerRegistry(BreakerConfig())
    runtime = NodeRuntime(
        settings, node_id="n", address="127.0.0.1", version="1", breakers=breakers
    )
    docs = [RouteDoc("POST", "/v1/echo", "first"), RouteDoc("post", "/v1/echo", "again")]
    with pytest.raises(ValueError, match=r"documented more than once: POST /v1/echo"):
        build_app(runtime, AuthPolicy(secret=None), [], docs)
