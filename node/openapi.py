"""The OpenAPI 3.1 document of the HTTP API, built from the routes' declarations
(config.declare): their callers, models, answers and errors; and the models of the wire.

`parse_body` is how a handler checks a body against the model its declaration names.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping
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
from config.declare import Caller, Param, Route, Schema
from node.errors import BodyError

M = TypeVar("M", bound=BaseModel)

JSON = "application/json"
BINARY: Mapping[str, Any] = {"type": "string", "format": "binary"}
TEXT: Mapping[str, Any] = {"type": "string"}


class ErrorShape(BaseModel):
    """Every error answer: a machine code, a human reason, the HTTP status, and for some errors
    the parameter, record index, field, path, free bytes, fence, retry delay, or the identity
    and role a refusal names (config.wire's error_body)."""

    model_config = ConfigDict(extra="forbid", title="Error")

    error: str = Field(pattern="^[a-z_]+$")
    reason: str = Field(min_length=1)
    status: int = Field(ge=400, le=599)
    param: str | None = None
    index: int | None = None
    field: str | None = None
    path: str | None = None
    free_bytes: int | None = None
    fence: Any = None
    retry_after_s: float | None = None
    identity: str | None = None
    role: str | None = None
    refusal: str | None = None
    cluster: str | None = None
    sender_cluster: str | None = None


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
CERTIFICATE_SCHEME = "clientCertificate"
CERTIFICATE_ROLES = {Caller.READER: "reader", Caller.PEER: "node", Caller.FENCED: "node"}
"""The client certificate role of each caller class (an operator's is `operator`)."""
ERROR_REF = {"$ref": "#/components/schemas/Error"}


class _Components:
    """The named schemas of the document: pydantic models and their nested definitions."""

    def __init__(self) -> None:
        self.schemas: dict[str, Any] = {"Error": ErrorShape.model_json_schema()}
        self._models: dict[str, type[BaseModel]] = {"Error": ErrorShape}

    def schema(self, schema: Schema) -> dict[str, Any]:
        """A JSON Schema for `schema`: a $ref for a model (added to the components). Raises
        ValueError when two models of one name would share a component."""
        if isinstance(schema, Mapping):
            hoisted = self._hoist(schema)
            assert isinstance(hoisted, dict)
            return hoisted
        name = schema.__name__
        known = self._models.setdefault(name, schema)
        if known is not schema:
            raise ValueError(
                f"two models are named {name} ({known.__module__}, {schema.__module__}): "
                "rename one, the OpenAPI document names each schema once"
            )
        if name not in self.schemas:
            self.schemas[name] = self._generated(schema)
        return {"$ref": f"#/components/schemas/{name}"}

    def _generated(self, model: type[BaseModel]) -> dict[str, Any]:
        generated = model.model_json_schema(ref_template="#/components/schemas/{model}")
        for def_name, definition in generated.pop("$defs", {}).items():
            self.schemas.setdefault(def_name, definition)
        return generated

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
        generated = self._generated(model)
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


def _parameter(parameter: Param, components: _Components) -> dict[str, Any]:
    name, where, text = parameter[0], parameter[1], parameter[2]
    schema = components.schema(parameter[3]) if len(parameter) == 4 else {"type": "string"}
    required = where == "path" or bool(schema.pop("x-required", False))
    return {"name": name, "in": where, "description": text, "required": required, "schema": schema}


def _path_parameters(declared: Route, given: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A string parameter for each placeholder of the path that `given` does not describe."""
    named = {p["name"] for p in given if p["in"] == "path"}
    found = re.findall(r"\{([^}/]+)\}", declared.path)
    return [
        {"name": name, "in": "path", "description": name, "required": True, "schema": TEXT}
        for name in found
        if name not in named
    ]


def _responses(declared: Route, components: _Components, signed: bool) -> dict[str, Any]:
    responses: dict[str, Any] = {}
    for code, text in declared.answers:
        answer: dict[str, Any] = {"description": text}
        if 200 <= code < 300 and code != 204:
            schema = components.schema({} if declared.answer is None else declared.answer)
            answer["content"] = {declared.answer_type: {"schema": schema}}
        responses[str(code)] = answer
    refusals: dict[int, list[str]] = {}
    for refusal in declared.errors:
        refusals.setdefault(refusal.status, []).append(f"{refusal.when} (`{refusal.code}`)")
    for code, texts in sorted(refusals.items()):
        responses[str(code)] = {
            "description": "; ".join(texts),
            "content": {JSON: {"schema": ERROR_REF}},
        }
    if Caller.PUBLIC not in declared.callers and signed:
        responses.setdefault(
            "401",
            {"description": "missing or bad signature", "content": {JSON: {"schema": ERROR_REF}}},
        )
    responses["default"] = {
        "description": "any other refusal (bad method, malformed or too large a body, a caller "
        "this route does not admit, ...)",
        "content": {JSON: {"schema": ERROR_REF}},
    }
    return responses


def _security(declared: Route, signed: bool, tls: bool) -> list[dict[str, list[str]]]:
    """Who may call: nobody needs a credential on a public route; else the signature (optional
    without a secret), the metrics bearer token, or a client certificate of a role admitted."""
    if Caller.PUBLIC in declared.callers:
        return [{}]
    security: list[dict[str, list[str]]] = [{_SCHEME_NAMES[h]: [] for h in SIGNATURE_HEADERS}]
    if declared.bearer:
        security.append({"metricsBearer": []})
    if declared.session:
        security.append({"dashboardSession": []})
    if tls:
        roles = sorted({CERTIFICATE_ROLES.get(caller, "operator") for caller in declared.callers})
        security.append({CERTIFICATE_SCHEME: roles})
    if not signed:
        security.append({})  # a dev node without a secret: the headers are not needed
    return security


def _operation(declared: Route, components: _Components, signed: bool, tls: bool) -> dict[str, Any]:
    operation: dict[str, Any] = {
        "operationId": f"{declared.method.lower()} {declared.path}",
        "summary": declared.summary,
        "x-shoal-callers": [caller.value for caller in Caller if caller in declared.callers],
        "responses": _responses(declared, components, signed),
        "security": _security(declared, signed, tls),
    }
    if declared.forwarded:
        operation["x-shoal-forwarded"] = True
    parameters = [_parameter(parameter, components) for parameter in declared.params]
    if declared.query is not None:
        parameters += components.query_parameters(declared.query)
    parameters = _path_parameters(declared, parameters) + parameters
    if parameters:
        operation["parameters"] = parameters
    if declared.body is not None:
        body_schema = components.schema(declared.body)
        operation["requestBody"] = {
            "required": not declared.body_optional,
            "content": {
                kind: {"schema": body_schema if kind == JSON else dict(TEXT)}
                for kind in declared.body_types
            },
        }
    return operation


def documented_twice(routes: Iterable[Route]) -> list[str]:
    """`METHOD path` of every operation more than one of `routes` documents, sorted."""
    counts = Counter(declared.operation for declared in routes)
    return sorted(operation for operation, count in counts.items() if count > 1)


def openapi_document(
    routes: Iterable[Route], *, signed: bool = True, tls: bool = False
) -> dict[str, Any]:
    """An OpenAPI 3.1 document of the declared `routes`; `signed`: the node has a secret, so
    the signature headers are required (without one they are optional); `tls`: it takes client
    certificates, whose roles each operation admits are listed."""
    components = _Components()
    paths: dict[str, dict[str, Any]] = {}
    for declared in sorted(routes, key=lambda r: (r.path, r.method)):
        operation = _operation(declared, components, signed, tls)
        paths.setdefault(declared.path, {})[declared.method.lower()] = operation
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
    schemes["dashboardSession"] = {
        "type": "apiKey",
        "in": "cookie",
        "name": "shoal_ui",
        "description": "the dashboard's session, from POST /ui/login",
    }
    if tls:
        schemes[CERTIFICATE_SCHEME] = {
            "type": "mutualTLS",
            "description": "a certificate of the cluster CA; its role (node, operator, reader) "
            "decides the routes it may call",
        }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "shoal node API",
            "version": shoal_version(),
            "description": "Requests are signed with the four X-Shoal-* headers together "
            "(HMAC-SHA256, see each scheme), unless the node runs without a secret. Each "
            "operation lists who may call it in x-shoal-callers (public, reader, peer, fenced: "
            "a node with the current plan's fence, operator); any other caller is refused.",
        },
        "paths": paths,
        "components": {"schemas": components.schemas, "securitySchemes": schemes},
    }
