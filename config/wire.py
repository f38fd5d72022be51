"""The one shape of every HTTP error answer: {"error": CODE, "reason": TEXT, "status": N, ...}.

Optional fields name what was wrong: `param` (a query parameter), `index` and `field` (a record),
`path` and `free_bytes` (a full disk). Servers build answers here; clients read them here.
aiohttp's server is imported only by the functions that build a server's answer, so a client
importing this module stays light.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aiohttp import web

__all__ = [
    "STATUS_CODES",
    "ErrorAnswer",
    "error_body",
    "error_exception",
    "error_response",
    "read_error",
]

STATUS_CODES: Mapping[int, str] = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    412: "precondition_failed",
    413: "too_large",
    416: "bad_range",
    500: "internal_error",
    502: "bad_gateway",
    503: "unavailable",
    504: "gateway_timeout",
    507: "insufficient_storage",
}
"""The error code sent for a status when the route names no more specific one."""


def _default_code(status: int) -> str:
    return STATUS_CODES.get(status, "client_error" if status < 500 else "server_error")


def error_body(status: int, reason: str, code: str | None = None, **extra: Any) -> dict[str, Any]:
    """The JSON document of an error answer; `extra` fields that are None are left out."""
    body: dict[str, Any] = {"error": code or _default_code(status), "reason": reason}
    body["status"] = status
    body.update({name: value for name, value in extra.items() if value is not None})
    return body


def _headers(retry_after_s: float | None, headers: Mapping[str, str] | None) -> dict[str, str]:
    out = dict(headers or {})
    if retry_after_s is not None:
        out["Retry-After"] = str(max(1, math.ceil(retry_after_s)))
    return out


def error_response(
    status: int,
    reason: str,
    code: str | None = None,
    *,
    retry_after_s: float | None = None,
    headers: Mapping[str, str] | None = None,
    **extra: Any,
) -> web.Response:
    """An error answer in the one shape; `retry_after_s` sets Retry-After (whole seconds, >= 1)."""
    from aiohttp import web

    return web.json_response(
        error_body(status, reason, code, **extra),
        status=status,
        headers=_headers(retry_after_s, headers),
    )


def error_exception(
    status: int, reason: str, code: str | None = None, **extra: Any
) -> web.HTTPException:
    """The same answer as an exception to raise from a handler (400, 404, 409, 413, 503, 507)."""
    from aiohttp import web

    exceptions: Mapping[int, type[web.HTTPException]] = {
        400: web.HTTPBadRequest,
        404: web.HTTPNotFound,
        409: web.HTTPConflict,
        413: web.HTTPRequestEntityTooLarge,
        503: web.HTTPServiceUnavailable,
        507: web.HTTPInsufficientStorage,
    }
    return exceptions[status](
        text=json.dumps(error_body(status, reason, code, **extra)), content_type="application/json"
    )


@dataclass(frozen=True)
class ErrorAnswer:
    """An error answer as a client reads it; `reason` falls back to the body's text."""

    status: int
    code: str
    reason: str
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"HTTP {self.status} {self.code}: {self.reason}"


def read_error(status: int, body: bytes | str) -> ErrorAnswer:
    """An error answer of a node (any shape it ever had), or the raw text of another server."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict):
        reason = data.get("reason")
        code = data.get("error")
        if isinstance(reason, str) or isinstance(code, str):
            extra = {k: v for k, v in data.items() if k not in ("error", "reason", "status")}
            return ErrorAnswer(
                status,
                code if isinstance(code, str) else _default_code(status),
                reason if isinstance(reason, str) else str(code),
                extra,
            )
    return ErrorAnswer(status, _default_code(status), text.strip()[:500] or f"HTTP {status}")
