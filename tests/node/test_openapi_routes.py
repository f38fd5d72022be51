"""The OpenAPI document of a running daemon is its router: every route documented once (a route
serving every record store once per store), nothing documented that is not routed, both built
from the one list of components, and the published sync body names every record store."""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientSession, web

from config import load_settings
from health import BreakerConfig, BreakerRegistry
from node.boot import record_schemas
from node.component import Endpoint, Served, endpoint, endpoints_of, paired
from node.daemon import NodeDaemon
from node.openapi import RouteDoc, documented_twice
from node.routes import ROUTE_DOCS, CoreRoutes, build_app
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
    first = endpoint(web.post("/v1/echo", _echo), RouteDoc("POST", "/v1/echo", "first"))
    again = endpoint(web.post("/v1/echo", _echo), RouteDoc("post", "/v1/echo", "again"))
    with pytest.raises(ValueError, match=r"documented more than once: POST /v1/echo"):
        build_app(
            runtime, AuthPolicy(secret=None), [CoreRoutes(), Served([first]), Served([again])]
        )


async def _echo(request: web.Request) -> web.Response:
    return web.json_response(await request.json())


async def test_the_app_and_the_health_checks_are_the_components_routes_and_checks(
    tmp_path: Path,
) -> None:
    async with NodeDaemon(test_settings(tmp_path, "parts", record_stores=EVALS)) as daemon:
        app = daemon.http_app
        assert app is not None
        document = await _document(daemon)
        components = daemon.components
        endpoints = endpoints_of(components)
        assert daemon.runtime is not None
        assert daemon.runtime.health is not None
        health = {c.name: c.message for c in daemon.runtime.health.summary().components}
    contributed = {name for component in components for name in component.checks()}
    assert {"jobs", "locks", "runs", "sync"} <= contributed
    for name in [*contributed, "membership", "election", "discovery"]:
        assert health.get(name, "not checked yet") != "not checked yet", name
    names = {type(component).__name__ for component in components}
    assert {"CoreRoutes", "RecordsComponent", "SyncComponent", "JobApi", "Dashboard"} <= names
    assert {"LockApi", "RunApi", "ActorRoutes"} <= names
    served = [(found.route.method, found.route.path) for found in endpoints]
    assert len(served) == len(set(served)), "a route served by two components"
    assert set(served) == _routed(app)
    docs = [doc for found in endpoints for doc in found.docs]
    assert tuple(docs) == app[ROUTE_DOCS]
    published = {(m.upper(), path) for path, item in document["paths"].items() for m in item}
    assert published == {(doc.method, doc.path) for doc in docs}
    assert len(docs) == len(published), "an operation documented twice"
    records = [found for found in endpoints if found.route.path == "/v1/records/{store}"]
    assert sorted(doc.path for found in records for doc in found.docs) == [
        "/v1/records/evals",
        "/v1/records/games",
        "/v1/records/rollouts",
    ]


def test_paired_gives_each_route_its_docs_and_refuses_a_route_or_doc_alone() -> None:
    routes = [web.get("/v1/things", _echo), web.post("/v1/things/{name}", _echo)]
    listing = RouteDoc("GET", "/v1/things", "list")
    one = RouteDoc("POST", "/v1/things/a", "thing a")
    other = RouteDoc("POST", "/v1/things/b", "thing b")
    endpoints = paired(routes, [one, listing, other])
    assert [found.docs for found in endpoints] == [(listing,), (one, other)]
    assert all(isinstance(found, Endpoint) for found in endpoints)
    app = web.Application()
    app.add_routes(endpoints)
    assert _routed(app) == {("GET", "/v1/things"), ("POST", "/v1/things/{name}")}
    with pytest.raises(ValueError, match=r"routes without a RouteDoc: POST /v1/things/\{name\}"):
        paired(routes, [listing])
    with pytest.raises(ValueError, match=r"DELETE /v1/things is served by 0 routes"):
        paired(routes, [listing, one, RouteDoc("DELETE", "/v1/things", "gone")])
    with pytest.raises(ValueError, match=r"GET /v1/other .* does not serve it"):
        endpoint(routes[0], RouteDoc("GET", "/v1/other", "elsewhere"))
    with pytest.raises(ValueError, match=r"needs a RouteDoc"):
        endpoint(routes[0])
