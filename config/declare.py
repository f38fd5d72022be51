"""Route declarations: one place says a route's method, path, callers, models, answers, errors
and summary (`@route(...)` on its handler); node builds the router, the OpenAPI document and the
access rules from them, so the three cannot differ."""

from __future__ import annotations

import inspect
import types
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, Field

if TYPE_CHECKING:
    from aiohttp import web

__all__ = [
    "JSON",
    "READ",
    "Caller",
    "Param",
    "Refusal",
    "Route",
    "Schema",
    "declared",
    "declared_route",
    "route",
    "route_defs",
    "unset",
]

JSON = "application/json"
READ_METHODS = frozenset({"GET", "HEAD"})
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"})
ATTRIBUTE = "__shoal_route__"

Schema = type[BaseModel] | Mapping[str, Any]
"""A pydantic model (its JSON Schema is generated) or, where no model fits (a binary answer, a
schema built per record store), a JSON Schema (draft 2020-12) as a mapping."""

Param = tuple[str, str, str] | tuple[str, str, str, Mapping[str, Any]]
"""(name, in: path|query, description[, JSON Schema]); the schema defaults to a string;
`"x-required": true` in it makes a query parameter required (path parameters always are)."""

Handler = Callable[..., Awaitable[Any]]
H = TypeVar("H", bound=Callable[..., Any])


class Caller(StrEnum):
    """A class of caller a route admits. A route lists every class it admits; none is implied
    by another (an operator may not vote, a node may not take a backup)."""

    PUBLIC = "public"
    """Anyone, without a credential (health, the OpenAPI document, the login page)."""
    READER = "reader"
    """A reader: a `reader` certificate, a `monitor-` signer, the dashboard's session."""
    PEER = "peer"
    """Another node of the cluster: a `node` certificate, a signer named by a node id."""
    FENCED = "fenced"
    """A node, only with the fence of the plan the receiver applies (X-Shoal-Fence): what it
    does because of the coordinator, never on its own."""
    OPERATOR = "operator"
    """An operator: an `operator` certificate, a `cli-` or `api-` signer."""


READ = (Caller.READER, Caller.PEER, Caller.OPERATOR)
"""Any authenticated caller: what a reader, a node and an operator may all read."""


@dataclass(frozen=True)
class Refusal:
    """An error a route answers: its HTTP status, its error code and when."""

    status: int
    code: str
    when: str


@dataclass(frozen=True)
class Route:
    """One declared route. `answers` are its (status, when) successes (2xx: `answer` as
    `answer_type`, any JSON when None; 204 and 3xx carry nothing); `errors` its refusals in the
    one error shape; `body` the request body's schema offered as each of `body_types`, required
    unless `body_optional`; `query` a model whose fields are the query parameters; `params`
    more parameters (path ones default to strings). `bearer`: /metrics's bearer token also
    admits; `session`: the dashboard's session cookie admits a reader. `forwarded`: a node
    may relay an operator's call to it (the relay's proof is checked by node.security).
    `each(owner, route)` gives, for a template path, the routes the document spells out (one
    per record store). GET routes also answer HEAD unless `head` is False."""

    method: str
    path: str
    callers: frozenset[Caller]
    summary: str
    answers: tuple[tuple[int, str], ...] = ((200, "OK"),)
    errors: tuple[Refusal, ...] = ()
    answer: Schema | None = None
    answer_type: str = JSON
    body: Schema | None = None
    body_types: tuple[str, ...] = (JSON,)
    body_optional: bool = False
    query: type[BaseModel] | None = None
    params: tuple[Param, ...] = ()
    bearer: bool = False
    session: bool = False
    forwarded: bool = False
    head: bool = True
    each: Callable[[Any, Route], Iterable[Route]] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        problem = _problem(self)
        if problem is not None:
            raise ValueError(f"{self.method} {self.path}: {problem}")

    @property
    def operation(self) -> str:
        """`METHOD path`, as errors and logs name it."""
        return f"{self.method} {self.path}"

    def admits(self, caller: Caller) -> bool:
        """Whether `caller` may call this route (FENCED: only with the current fence)."""
        return Caller.PUBLIC in self.callers or caller in self.callers


def _problem(declared: Route) -> str | None:
    """What is wrong with a declaration, or None."""
    callers = declared.callers
    if declared.method not in METHODS:
        return f"unknown method; one of {', '.join(sorted(METHODS))}"
    if not declared.path.startswith("/"):
        return "the path starts with /"
    if not callers:
        return "declare who may call it (callers: public, reader, peer, fenced, operator)"
    if Caller.PUBLIC in callers and len(callers) > 1:
        return "a public route admits everyone: list public alone"
    if Caller.READER in callers and declared.method not in READ_METHODS:
        return "a reader only reads: reader is for GET routes"
    if {Caller.PEER, Caller.FENCED} <= callers:
        return "peer admits a node with or without the fence: list peer or fenced, not both"
    if declared.session and Caller.READER not in callers:
        return "the dashboard's session admits a reader: list reader"
    if declared.forwarded and (Caller.OPERATOR not in callers or Caller.PEER in callers):
        return "forwarded relays an operator's call: an operator route that peers may not call"
    if not declared.summary:
        return "give a summary (the handler's docstring)"
    statuses = [status for status, _ in declared.answers] + [e.status for e in declared.errors]
    if any(status >= 400 for status, _ in declared.answers) or any(
        e.status < 400 for e in declared.errors
    ):
        return f"answers are below 400 and errors 400 or above, not {statuses}"
    return None


def _no_default(schema: dict[str, Any]) -> None:
    schema.pop("default", None)


def unset(description: str | None = None) -> Any:
    """The Field of an optional model field that is absent, never null, on the wire (a query
    parameter, a body field, an answer's field): None in Python, no `default` in its JSON
    Schema. Its type is `Annotated[T, Field(constraints)] | SkipJsonSchema[None]`."""
    return Field(default=None, description=description, json_schema_extra=_no_default)


def summary_of(handler: Callable[..., Any]) -> str:
    """The first paragraph of `handler`'s docstring, on one line."""
    text = inspect.getdoc(handler) or ""
    return " ".join(text.split("\n\n", 1)[0].split())


def route(
    method: str,
    path: str,
    *,
    callers: Iterable[Caller],
    summary: str | None = None,
    answers: tuple[tuple[int, str], ...] = ((200, "OK"),),
    errors: Iterable[Refusal] = (),
    answer: Schema | None = None,
    answer_type: str = JSON,
    body: Schema | None = None,
    body_types: tuple[str, ...] = (JSON,),
    body_optional: bool = False,
    query: type[BaseModel] | None = None,
    params: tuple[Param, ...] = (),
    bearer: bool = False,
    session: bool = False,
    forwarded: bool = False,
    head: bool = True,
    each: Callable[[Any, Route], Iterable[Route]] | None = None,
) -> Callable[[H], H]:
    """Declare the decorated handler's route (see Route); the summary defaults to the first
    paragraph of its docstring. Raises ValueError naming the route when the declaration is
    incomplete (no callers, no summary) or contradicts itself."""

    def declare(handler: H) -> H:
        declared = Route(
            method.upper(),
            path,
            frozenset(Caller(c) for c in ((callers,) if isinstance(callers, str) else callers)),
            summary if summary is not None else summary_of(handler),
            answers,
            tuple(errors),
            answer,
            answer_type,
            body,
            body_types,
            body_optional,
            query,
            params,
            bearer,
            session,
            forwarded,
            head,
            each,
        )
        vars(handler)[ATTRIBUTE] = declared
        return handler

    return declare


def declared_route(value: object) -> Route | None:
    """The Route declared on `value` (a function, method or static method), or None."""
    function = getattr(value, "__func__", value)
    found = getattr(function, "__dict__", {}).get(ATTRIBUTE)
    return found if isinstance(found, Route) else None


def declared(owner: object) -> Iterator[tuple[Route, Handler]]:
    """Every declared handler of `owner` with its Route, in definition order: the functions of
    a module, or the methods of an object's class (and its bases, bases first), bound."""
    if isinstance(owner, types.ModuleType):
        names: Iterable[str] = vars(owner)
    else:
        names = dict.fromkeys(n for cls in reversed(type(owner).__mro__) for n in vars(cls))
    for name in names:
        found = declared_route(inspect.getattr_static(owner, name, None))
        if found is not None:
            yield found, getattr(owner, name)


def route_defs(owner: object) -> list[web.RouteDef]:
    """The declared handlers of `owner` as plain aiohttp route definitions: an app that serves
    them without the node's access rules (a test's, a benchmark's)."""
    from aiohttp import web

    return [
        web.RouteDef(
            found.method,
            found.path,
            handler,
            {"allow_head": found.head} if found.method == "GET" else {},
        )
        for found, handler in declared(owner)
    ]
