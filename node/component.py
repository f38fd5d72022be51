"""Components: the parts of a daemon, each opened in order and closed in reverse, each handing
the daemon its routes with their docs and its health checks from one place.

A route and the operations it serves in the OpenAPI document travel together as one Endpoint,
so the router and the document are built from the same list and cannot differ.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from aiohttp import web

from health import CheckFn
from node.openapi import RouteDoc


@dataclass(frozen=True)
class Endpoint(web.AbstractRouteDef):
    """One route of the router and the operations it serves in the OpenAPI document: one doc
    for a route of a fixed path; for a template route (`/v1/records/{store}`) one doc per value
    the document spells out (one per record store), or one doc of the template itself.

    An Endpoint is an aiohttp route definition (`app.add_routes([...])` registers its route).
    """

    route: web.RouteDef
    docs: tuple[RouteDoc, ...]

    def __post_init__(self) -> None:
        if not self.docs:
            raise ValueError(f"{self.route.method} {self.route.path}: a route needs a RouteDoc")
        for doc in self.docs:
            if not _serves(self.route, doc):
                raise ValueError(
                    f"{doc.method} {doc.path} is documented on the route "
                    f"{self.route.method} {self.route.path}, which does not serve it"
                )

    def register(self, router: web.UrlDispatcher) -> list[web.AbstractRoute]:
        return self.route.register(router)


def endpoint(route: web.RouteDef, *docs: RouteDoc) -> Endpoint:
    """`route` with the operations it serves (at least one)."""
    return Endpoint(route, docs)


def _template(path: str) -> re.Pattern[str]:
    placeholder = re.compile(r"\\\{[^}/]+\\\}")
    return re.compile(placeholder.sub("[^/]+", re.escape(path)))


def _serves(route: web.RouteDef, doc: RouteDoc) -> bool:
    if doc.method.upper() != route.method.upper():
        return False
    return doc.path == route.path or _template(route.path).fullmatch(doc.path) is not None


def paired(routes: Iterable[web.RouteDef], docs: Iterable[RouteDoc]) -> list[Endpoint]:
    """Every route of `routes` with the docs of `docs` it serves, in the order of `routes`: a
    doc of the route's own path, else the one template route its concrete path fits. Raises
    ValueError naming a route without a doc, a doc without a route, or a doc two routes fit."""
    routes = list(routes)
    found: dict[int, list[RouteDoc]] = {index: [] for index in range(len(routes))}
    for doc in docs:
        exact = [i for i, r in enumerate(routes) if _serves(r, doc) and r.path == doc.path]
        serving = exact or [i for i, route in enumerate(routes) if _serves(route, doc)]
        if len(serving) != 1:
            named = [f"{routes[i].method} {routes[i].path}" for i in serving]
            raise ValueError(
                f"{doc.method} {doc.path} is served by {len(serving)} routes {named}; give each "
                "documented operation exactly one route"
            )
        found[serving[0]].append(doc)
    bare = [f"{routes[i].method} {routes[i].path}" for i, docs in found.items() if not docs]
    if bare:
        raise ValueError(f"routes without a RouteDoc: {', '.join(bare)}; document each route")
    return [Endpoint(route, tuple(found[index])) for index, route in enumerate(routes)]


@dataclass(frozen=True)
class Check:
    """A health check a component contributes: run every `interval_s` by the node's checker."""

    fn: CheckFn
    interval_s: float = 30.0


@runtime_checkable
class Component(Protocol):
    """A part of the daemon. The daemon opens its components in order on its exit stack (a
    component whose `open` raised is not closed: it cleans up after itself), builds the HTTP
    app and the OpenAPI document from their `routes()`, registers their `checks()`, and closes
    them in reverse order. `routes()` and `checks()` are read after `open()`; `close()` is
    idempotent."""

    async def open(self) -> None: ...

    def routes(self) -> Sequence[Endpoint]: ...

    def checks(self) -> Mapping[str, Check]: ...

    async def close(self) -> None: ...


class Served:
    """A component of routes (and checks) only: nothing to open or close."""

    def __init__(
        self, endpoints: Iterable[Endpoint], checks: Mapping[str, Check] | None = None
    ) -> None:
        self._endpoints = tuple(endpoints)
        self._checks = dict(checks or {})

    async def open(self) -> None:
        return None

    def routes(self) -> Sequence[Endpoint]:
        return self._endpoints

    def checks(self) -> Mapping[str, Check]:
        return self._checks

    async def close(self) -> None:
        return None


async def enter(stack: AsyncExitStack, components: Iterable[Component]) -> None:
    """Open `components` in order, each closed by `stack` in reverse once it is open."""
    for component in components:
        await component.open()
        stack.push_async_callback(component.close)


def checks_of(components: Iterable[Component]) -> dict[str, Check]:
    """Every health check of `components` by name; ValueError names one two components give."""
    found: dict[str, Check] = {}
    for component in components:
        for name, check in component.checks().items():
            if name in found:
                raise ValueError(f"two components contribute a health check named {name!r}")
            found[name] = check
    return found


def endpoints_of(components: Iterable[Component]) -> list[Endpoint]:
    """Every route of `components`, in their order: what the router serves."""
    return [found for component in components for found in component.routes()]


def route_docs(endpoints: Iterable[Endpoint]) -> tuple[RouteDoc, ...]:
    """Every doc of `endpoints`: what the OpenAPI document publishes."""
    return tuple(doc for found in endpoints for doc in found.docs)
