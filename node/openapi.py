"""The OpenAPI 3.1 document of the HTTP API, built from the routes each package registers.

A route's body, query and answer schemas are the pydantic models (or JSON Schemas) its handler
validates with, so the document and the handler cannot disagree: a RouteDoc names them in
`body`, `query` and `response`, and `openapi_document` turns models into JSON Schema under
`components/schemas`. Everything is optional: a RouteDoc with only method, path and summary still
documents (string parameters, no body, any JSON answer), so a new route can start there.
`parse_body` is how a handler checks a body against the model its RouteDoc names.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, TypeVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    WithJsonSchema,
)

from config import HEADER_NODE, HEADER_NONCE, HEADER_SIGNATURE, HEADER_TIMESTAMP, shoal_version
from node.errors import BodyError

M = TypeVar("M", bound=BaseModel)

Schema = type[BaseModel] | Mapping[str, Any]
"""A pydantic model (its JSON Schema is taken) or a JSON Schema (draft 2020-12) as a mapping."""

Parameter = tuple[str, str, str] | tuple[str, str, str, Mapping[str, Any]]
"""(name, in: query|path|header, description[, JSON Schema]); the schema defaults to a string;
`"x-required": true` in it makes a query parameter required (path parameters always are)."""

JSON = "application/json"
ANY_JSON: Mapping[str, Any] = {}
BINARY: Mapping[str, Any] = {"type": "string", "format": "binary"}
TEXT: Mapping[str, Any] = {"type": "string"}

ERROR_SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "description": "Every error answer: a machine code, a human reason, the HTTP status, and "
    "for some errors the parameter, record index, field, path, free bytes, fence or retry delay",
    "required": ["error", "reason", "status"],
    "properties": {
        "error": {"type": "string", "pattern": "^[a-z_]+$"},
        "reason": {"type": "string", "minLength": 1},
        "status": {"type": "integer", "minimum": 400, "maximum": 599},
        "param": {"type": ["string", "null"]},
        "index": {"type": ["integer", "null"]},
        "field": {"type": ["string", "null"]},
        "path": {"type": ["string", "null"]},
        "free_bytes": {"type": ["integer", "null"]},
        "fence": {},
        "retry_after_s": {"type": ["number", "null"]},
    },
    "additionalProperties": False,
}
"""The one error shape of config.wire (error_body), as JSON Schema."""

BODY_CONFIG = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)
"""The model config of a request body: JSON types exactly (no "3" for 3, no true for 1), no
unknown field, no NaN or Infinity."""


RECORD_CONFIG = ConfigDict(frozen=True, extra="ignore", allow_inf_nan=False)
"""The model config of a record the API answers (a job, a run, a lock, an offer): immutable;
a field a newer peer added is ignored when read."""


Number = Annotated[int | float, WithJsonSchema({"type": "number"})]
"""A JSON number kept as it came (3 stays 3, 3.5 stays 3.5), so a record read and written
again is the same bytes; JSON Schema's number."""


class WireRecord(BaseModel):
    """A record that crosses a module or host boundary: a frozen model whose JSON Schema is the
    one the OpenAPI document shows, and whose `to_json()` is exactly what the API answers."""

    model_config = RECORD_CONFIG

    def to_json(self) -> dict[str, Any]:
        """The record as the API answers it (JSON types only)."""
        return self.model_dump(mode="json")


def _whole(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value


WholeNumber = Annotated[int, BeforeValidator(_whole)]
"""An integer field that also takes 3.0: JSON Schema's integer includes it."""


Count = Annotated[int, Field(ge=0, le=2**63 - 1), BeforeValidator(_whole)]
"""A WholeNumber from 0 to 2**63 - 1 (what SQLite and the WAL hold); usable as a list's items
(the bounds come before the validator, so the JSON Schema says minimum and maximum)."""


def _json_type(value: object) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}
    return "null" if value is None else names.get(type(value), "a number")


def check_body(model: type[M], data: object) -> M:
    """`data` (a decoded JSON body) checked by `model`, the schema the document shows for it.
    Raises BodyError naming the first bad field, what is wrong, and what the field is."""
    if not isinstance(data, dict):
        raise BodyError("body", f"body: a JSON object ({model.__name__}), not {_json_type(data)}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        location = error["loc"]
        where = ".".join(str(part) for part in location) or "body"
        known = model.model_fields.get(str(location[0])) if location else None
        described = known is not None and known.description and error["type"] != "value_error"
        hint = f" ({known.description})" if described and known is not None else ""
        raise BodyError(where, f"{where}: {error['msg']}{hint}") from None


def parse_body(model: type[M], raw: bytes, *, optional: bool = False) -> M:
    """The request body `raw` decoded and checked by `model` (check_body); with `optional`, an
    empty body is an empty object (the model's defaults). Raises BodyError."""
    if optional and not raw.strip():
        return check_body(model, {})
    try:
        data = json.loads(raw)
    except ValueError as exc:  # also bytes that are not UTF-8
        raise BodyError("body", f"body: malformed JSON: {exc}") from None
    return check_body(model, data)


SIGNATURE_HEADERS = (HEADER_NODE, HEADER_TIMESTAMP, HEADER_NONCE, HEADER_SIGNATURE)
_SCHEME_NAMES = {
    HEADER_NODE: "shoalNode",
    HEADER_TIMESTAMP: "shoalTimestamp",
    HEADER_NONCE: "shoalNonce",
    HEADER_SIGNATURE: "shoalSignature",
}
_SCHEME_TEXT = {
    HEADER_NODE: "the sender's node id",
    HEADER_TIMESTAMP: "unix seconds; refused outside the clock window",
    HEADER_NONCE: "at least 16 hex characters, never reused within the window",
    HEADER_SIGNATURE: "hex HMAC-SHA256, keyed with the secret file's bytes without surrounding "
    "whitespace, over METHOD\\npath?query\\ntimestamp\\nnonce\\nsha256_hex(body); see "
    "docs/signing.md",
}


@dataclass(frozen=True)
class RouteDoc:
    """One documented operation.

    `responses` lists (status, description); 2xx answers carry `response` (JSON Schema or model,
    any JSON when None) as `response_type`, 204 and 3xx carry nothing, 4xx/5xx the error shape.
    `parameters` are (name, in, description[, schema]) tuples; `query` is a model whose fields are
    the query parameters; `body` is the request body's schema (a model or JSON Schema), offered as
    each of `body_types`, required unless `body_optional`.
    """

    method: str
    path: str
    summary: str
    responses: tuple[tuple[int, str], ...] = ((200, "OK"),)
    authenticated: bool = True
    parameters: tuple[Parameter, ...] = field(default=())
    body: Schema | None = None
    body_types: tuple[str, ...] = (JSON,)
    body_optional: bool = False
    query: type[BaseModel] | None = None
    response: Schema | None = None
    response_type: str = JSON
    bearer: bool = False
    """Also accepts `Authorization: Bearer <metrics token>` instead of a signature."""


class _Components:
    """The named schemas of the document: pydantic models and their nested definitions."""

    def __init__(self) -> None:
        self.schemas: dict[str, Any] = {"Error": dict(ERROR_SCHEMA)}

    def schema(self, schema: Schema) -> dict[str, Any]:
        """A JSON Schema for `schema`: a $ref for a model (added to the components)."""
        if isinstance(schema, Mapping):
            hoisted = self._hoist(schema)
            assert isinstance(hoisted, dict)
            return hoisted
        name = schema.__name__
        if name not in self.schemas:
            generated = schema.model_json_schema(ref_template="#/components/schemas/{model}")
            for def_name, definition in generated.pop("$defs", {}).items():
                self.schemas.setdefault(def_name, definition)
            self.schemas[name] = generated
        return {"$ref": f"#/components/schemas/{name}"}

    def _hoist(self, value: Any) -> Any:
        """`value` with every `$defs` moved to the components and its refs pointed there (a
        JSON Schema's local `#/$defs/X` would resolve against the whole document)."""
        if isinstance(value, Mapping):
            result: dict[str, Any] = {}
            for key, item in value.items():
                if key == "$defs":
                    for def_name, definition in item.items():
                        self.schemas.setdefault(def_name, self._hoist(definition))
                elif key == "$ref" and isinstance(item, str) and item.startswith("#/$defs/"):
                    result[key] = "#/components/schemas/" + item.removeprefix("#/$defs/")
                else:
                    result[key] = self._hoist(item)
            return result
        if isinstance(value, list | tuple):
            return [self._hoist(item) for item in value]
        return value

    def query_parameters(self, model: type[BaseModel]) -> list[dict[str, Any]]:
        generated = model.model_json_schema(ref_template="#/components/schemas/{model}")
        for def_name, definition in generated.pop("$defs", {}).items():
            self.schemas.setdefault(def_name, definition)
        required = set(generated.get("required", ()))
        parameters = []
        for name, prop in generated.get("properties", {}).items():
            prop = dict(prop)
            description = prop.pop("description", prop.pop("title", name))
            parameters.append(
                {
                    "name": name,
                    "in": "query",
                    "description": description,
                    "required": name in required,
                    "schema": prop,
                }
            )
        return parameters


def _parameter(parameter: Parameter, components: _Components) -> dict[str, Any]:
    name, where, text = parameter[0], parameter[1], parameter[2]
    schema = components.schema(parameter[3]) if len(parameter) == 4 else {"type": "string"}
    required = where == "path" or bool(schema.pop("x-required", False))
    return {"name": name, "in": where, "description": text, "required": required, "schema": schema}


def _operation(doc: RouteDoc, components: _Components, signed: bool) -> dict[str, Any]:
    responses: dict[str, Any] = {}
    for code, text in doc.responses:
        answer: dict[str, Any] = {"description": text}
        if code == 204:
            pass  # no content: the one answer of a JSON route without a body
        elif 200 <= code < 300:
            schema = ANY_JSON if doc.response is None else doc.response
            answer["content"] = {doc.response_type: {"schema": components.schema(schema)}}
        elif code >= 400:
            answer["content"] = {JSON: {"schema": {"$ref": "#/components/schemas/Error"}}}
        responses[str(code)] = answer
    if doc.authenticated and signed:
        responses.setdefault(
            "401",
            {
                "description": "missing or bad signature",
                "content": {JSON: {"schema": {"$ref": "#/components/schemas/Error"}}},
            },
        )
    responses["default"] = {
        "description": "any other refusal (bad method, malformed or too large a body, ...)",
        "content": {JSON: {"schema": {"$ref": "#/components/schemas/Error"}}},
    }
    operation: dict[str, Any] = {
        "operationId": f"{doc.method.lower()} {doc.path}",
        "summary": doc.summary,
        "responses": responses,
    }
    if doc.authenticated:
        requirement: dict[str, list[str]] = {
            _SCHEME_NAMES[header]: [] for header in SIGNATURE_HEADERS
        }
        # Without a secret (a dev node on loopback) the signature headers are not needed.
        operation["security"] = [requirement] if signed else [requirement, {}]
        if doc.bearer:
            operation["security"].insert(1, {"metricsBearer": []})
    else:
        operation["security"] = [{}]
    parameters = [_parameter(parameter, components) for parameter in doc.parameters]
    if doc.query is not None:
        parameters += components.query_parameters(doc.query)
    if parameters:
        operation["parameters"] = parameters
    if doc.body is not None:
        body_schema = components.schema(doc.body)
        operation["requestBody"] = {
            "required": not doc.body_optional,
            "content": {
                kind: {"schema": body_schema if kind == JSON else dict(TEXT)}
                for kind in doc.body_types
            },
        }
    return operation


def documented_twice(docs: Iterable[RouteDoc]) -> list[str]:
    """`METHOD path` of every operation that more than one of `docs` documents, sorted."""
    counts = Counter((doc.method.upper(), doc.path) for doc in docs)
    return sorted(f"{method} {path}" for (method, path), count in counts.items() if count > 1)


def openapi_document(docs: Iterable[RouteDoc], *, signed: bool = True) -> dict[str, Any]:
    """An OpenAPI 3.1 document for `docs`; `signed`: the node has a secret, so the signature
    headers are required (without one they are optional)."""
    components = _Components()
    paths: dict[str, dict[str, Any]] = {}
    for doc in sorted(docs, key=lambda d: (d.path, d.method)):
        paths.setdefault(doc.path, {})[doc.method.lower()] = _operation(doc, components, signed)
    schemes: dict[str, Any] = {
        _SCHEME_NAMES[header]: {
            "type": "apiKey",
            "in": "header",
            "name": header,
            "description": _SCHEME_TEXT[header],
        }
        for header in SIGNATURE_HEADERS
    }
    schemes["metricsBearer"] = {"type": "http", "scheme": "bearer"}
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "shoal node API",
            "version": shoal_version(),
            "description": "Requests are signed with the four X-Shoal-* headers together "
            "(HMAC-SHA256, see each scheme), unless the node runs without a secret.",
        },
        "paths": paths,
        "components": {"schemas": components.schemas, "securitySchemes": schemes},
    }
