"""Components: the parts of a daemon, each opened in order and closed in reverse, each handing
the daemon its declared routes and its health checks from one place.

A route is its declaration (config.declare's Route: method, path, callers, models, errors) and
its handler together, as one Endpoint: the router, the OpenAPI document and the access rules
are all built from the same Endpoints and cannot differ.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from aiohttp import web

from config.declare import Route, declared
from health import CheckFn, LoopHealth

Handler = Callable[..., Awaitable[Any]]


@dataclass(frozen=True)
class Endpoint(web.AbstractRouteDef):
    """A declared route and its handler: `docs` are the operations the OpenAPI document shows
    for it, the route itself, or for a template route (`/v1/records/{store}`) one per value it
    spells out (one per record store).

    An Endpoint is an aiohttp route definition (`app.add_routes([...])` registers its route).
    """

    route: Route
    handler: Handler
    docs: tuple[Route, ...]

    def __post_init__(self) -> None:
        if not self.docs:
            raise ValueError(f"{self.route.operation}: a route documents at least one operation")
        for doc in self.docs:
            if not _serves(self.route, doc):
                raise ValueError(
                    f"{doc.operation} is documented on the route {self.route.operation}, "
                    "which does not serve it"
                )
            if doc.callers != self.route.callers or doc.forwarded != self.route.forwarded:
                raise ValueError(f"{doc.operation}: its callers differ from its route's")

    def register(self, router: web.UrlDispatcher) -> list[web.AbstractRoute]:
        kwargs = {"allow_head": self.route.head} if self.route.method == "GET" else {}
        definition = web.RouteDef(self.route.method, self.route.path, self.handler, kwargs)
        return definition.register(router)


def _template(path: str) -> re.Pattern[str]:
    placeholder = re.compile(r"\\\{[^}/]+\\\}")
    return re.compile(placeholder.sub("[^/]+", re.escape(path)))


def _serves(route: Route, doc: Route) -> bool:
    if doc.method != route.method:
        return False
    return doc.path == route.path or _template(route.path).fullmatch(doc.path) is not None


def endpoint(route: Route, handler: Handler, owner: object = None) -> Endpoint:
    """`handler` served as `route`, documented as the operations `route.each(owner, route)`
    gives (the route alone without `each`)."""
    docs = (route,) if route.each is None else tuple(route.each(owner, route))
    return Endpoint(route, handler, docs)


def endpoints(*owners: object) -> list[Endpoint]:
    """Every declared handler of `owners` (objects or modules; config.declare.declared) as an
    Endpoint, in order."""
    return [
        endpoint(found, handler, owner) for owner in owners for found, handler in declared(owner)
    ]


LOOP_CHECK_INTERVAL_S = 1.0
"""How often the health of the background loops (sync, election, discovery, locks, runs) is
read: a cheap read of what each loop last reported."""


@dataclass(frozen=True)
class Check:
    """A health check a component contributes: run every `interval_s` by the node's checker."""

    fn: CheckFn
    interval_s: float = 30.0


def loop_check(loop: LoopHealth | None) -> dict[str, Check]:
    """The health check of a background loop, under the loop's name, read every
    LOOP_CHECK_INTERVAL_S; none while the loop does not exist yet."""
    if loop is None:
        return {}
    return {loop.name: Check(loop.check, interval_s=LOOP_CHECK_INTERVAL_S)}


@runtime_checkable
class Component(Protocol):
    """A part of the daemon. The daemon opens its components in order on its exit stack (a
    component whose `open` raised is not closed: it cleans up after itself), builds the HTTP
    app, its access rules and the OpenAPI document from their `routes()`, registers their
    `checks()`, and closes them in reverse order. `routes()` and `checks()` are read after
    `open()`; `close()` is idempotent."""

    async def open(self) -> None: ...

    def routes(self) -> Sequence[Endpoint]: ...

    def checks(self) -> Mapping[str, Check]: ...

    async def close(self) -> None: ...


class Served:
    """A component of routes (and checks) only: nothing to open or close. `owners` are objects
    (or modules) whose declared handlers it serves."""

    def __init__(self, *owners: object, checks: Mapping[str, Check] | None = None) -> None:
        self._endpoints = tuple(endpoints(*owners))
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
    """Every route of `components`, in their order: what the router serves. Raises ValueError
    naming a route a component hands over without a declaration."""
    found: list[Endpoint] = []
    for component in components:
        for served in component.routes():
            if not isinstance(served, Endpoint):
                raise ValueError(
                    f"{type(component).__name__} serves {_named(served)} without a declaration:"
                    " declare it with config.declare.route (method, path, callers, models)"
                )
            found.append(served)
    return found


def _named(served: object) -> str:
    method, path = getattr(served, "method", "?"), getattr(served, "path", repr(served))
    return f"{method} {path}"


def route_docs(served: Iterable[Endpoint]) -> tuple[Route, ...]:
    """Every documented operation of `served`: what the OpenAPI document publishes."""
    return tuple(doc for found in served for doc in found.docs)
