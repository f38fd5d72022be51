"""The OpenAPI document of a running daemon is its router: every route documented once (a route
serving every record store once per store), nothing documented that is not routed, both built
from the one list of components, and the published sync body names every record store."""

from __future__ import annotations

import dataclasses
import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientSession, web

from config import load_settings
from config.declare import READ, Caller, route
from health import BreakerConfig, BreakerRegistry
from node.boot import record_schemas
from node.component import Endpoint, Served, endpoints, endpoints_of
from node.daemon import NodeDaemon
from node.openapi import documented_twice
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


def _runtime(tmp_path: Path) -> NodeRuntime:
    settings = load_settings(env={"SHOAL_DATA_DIR": str(tmp_path)}).settings
    breakers = BreakerRegistry(BreakerConfig())
    return NodeRuntime(settings, node_id="n", address="127.0.0.1", version="1", breakers=breakers)


class Echo:
    @route("POST", "/v1/echo", callers=[Caller.OPERATOR])
    async def echo(self, request: web.Request) -> web.Response:
        """Echo (test route)"""
        return await _echo(request)


def test_build_app_refuses_a_route_declared_twice(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"declared more than once: POST /v1/echo"):
        build_app(
            _runtime(tmp_path),
            AuthPolicy(secret=None),
            [CoreRoutes(), Served(Echo()), Served(Echo())],
        )


def test_a_route_without_callers_or_without_a_declaration_is_refused_at_startup(
    tmp_path: Path,
) -> None:
    with pytest.raises(ValueError, match=r"POST /v1/nobody: declare who may call it"):

        @route("POST", "/v1/nobody", callers=[])
        async def nobody(request: web.Request) -> web.Response:
            """Nobody may call it"""
            return web.json_response({})

    class Bare:
        async def open(self) -> None:
            return None

        def routes(self) -> list[web.RouteDef]:
            return [web.post("/v1/bare", _echo)]

        def checks(self) -> dict[str, Any]:
            return {}

        async def close(self) -> None:
            return None

    bare: Any = Bare()
    with pytest.raises(ValueError, match=r"Bare serves POST /v1/bare without a declaration"):
        build_app(_runtime(tmp_path), AuthPolicy(secret=None), [CoreRoutes(), bare])


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
        served_endpoints = endpoints_of(components)
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
    served = [(found.route.method, found.route.path) for found in served_endpoints]
    assert len(served) == len(set(served)), "a route served by two components"
    assert set(served) == _routed(app)
    docs = [doc for found in served_endpoints for doc in found.docs]
    assert tuple(docs) == app[ROUTE_DOCS]
    published = {(m.upper(), path) for path, item in document["paths"].items() for m in item}
    assert published == {(doc.method, doc.path) for doc in docs}
    assert len(docs) == len(published), "an operation documented twice"
    records = [found for found in served_endpoints if found.route.path == "/v1/records/{store}"]
    assert sorted(doc.path for found in records for doc in found.docs) == [
        "/v1/records/evals",
        "/v1/records/games",
        "/v1/records/rollouts",
    ]


class Things:
    @route("GET", "/v1/things", callers=READ)
    async def listing(self, request: web.Request) -> web.Response:
        """list"""
        return web.json_response([])

    @route(
        "POST",
        "/v1/things/{name}",
        callers=[Caller.OPERATOR],
        summary="a thing",
        each=lambda things, found: [
            dataclasses.replace(found, path=f"/v1/things/{name}", summary=f"thing {name}")
            for name in things.names
        ],
    )
    async def change(self, request: web.Request) -> web.Response:
        return web.json_response({})

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names


def test_declarations_give_each_route_its_operations_in_definition_order() -> None:
    found = endpoints(Things(("a", "b")))
    assert all(isinstance(one, Endpoint) for one in found)
    assert [(one.route.method, one.route.path) for one in found] == [
        ("GET", "/v1/things"),
        ("POST", "/v1/things/{name}"),
    ]
    assert [doc.path for doc in found[1].docs] == ["/v1/things/a", "/v1/things/b"]
    assert found[1].docs[0].summary == "thing a"
    assert found[0].route.summary == "list"  # the docstring's first paragraph
    app = web.Application()
    app.add_routes(found)
    assert _routed(app) == {("GET", "/v1/things"), ("POST", "/v1/things/{name}")}
    other = dataclasses.replace(found[0].route, path="/v1/other")
    with pytest.raises(ValueError, match=r"GET /v1/other .* does not serve it"):
        Endpoint(found[0].route, found[0].handler, (other,))
    with pytest.raises(ValueError, match=r"a reader only reads"):
        route("POST", "/v1/x", callers=[Caller.READER], summary="x")(_echo)
    with pytest.raises(ValueError, match=r"list public alone"):
        route("GET", "/v1/x", callers=[Caller.PUBLIC, Caller.PEER], summary="x")(_echo)
