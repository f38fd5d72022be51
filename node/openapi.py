"""The OpenAPI document of the HTTP API, built from the routes each package registers."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from config import shoal_version


@dataclass(frozen=True)
class RouteDoc:
    """One documented operation: method, path (aiohttp syntax), summary, answers."""

    method: str
    path: str
    summary: str
    responses: tuple[tuple[int, str], ...] = ((200, "OK"),)
    authenticated: bool = True
    parameters: tuple[tuple[str, str, str], ...] = field(default=())
    """(name, in: query|path, description)"""


def openapi_document(docs: Iterable[RouteDoc]) -> dict[str, Any]:
    """An OpenAPI 3.1 document for `docs`."""
    paths: dict[str, dict[str, Any]] = {}
    for doc in sorted(docs, key=lambda d: (d.path, d.method)):
        operation: dict[str, Any] = {
            "summary": doc.summary,
            "responses": {str(code): {"description": text} for code, text in doc.responses},
        }
        if doc.authenticated:
            operation["security"] = [{"shoalSignature": []}]
            operation["responses"].setdefault("401", {"description": "missing or bad signature"})
        if doc.parameters:
            operation["parameters"] = [
                {"name": name, "in": where, "description": text, "required": where == "path"}
                for name, where, text in doc.parameters
            ]
        paths.setdefault(doc.path, {})[doc.method.lower()] = operation
    return {
        "openapi": "3.1.0",
        "info": {"title": "shoal node API", "version": shoal_version()},
        "paths": paths,
        "components": {
            "securitySchemes": {
                "shoalSignature": {
                    "type": "apiKey",
                    "in": "header",
                    "name": "X-Shoal-Signature",
                    "description": "HMAC-SHA256 over method, path?query, X-Shoal-Timestamp, "
                    "X-Shoal-Nonce and sha256(body); see the README",
                },
                "metricsBearer": {"type": "http", "scheme": "bearer"},
            }
        },
    }
