"""The plan's fence on the wire: the header a node sends with every request it makes because of
its role or the plan, and the check a receiving route runs first (409 under another plan).

Senders: `fence_headers(current())`. Receivers: `fenced(handler, current)` around a route, or
`fence_refusal(request, current())` at the top of a handler.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from node.errors import PlanError
from node.plan import FENCE_HEADER, FenceVerdict, PlanFence, check_fence

FenceSource = Callable[[], PlanFence | None]
"""The fence of the plan this node applies now, or None before it applies one."""
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

REFUSAL_CODES = {
    FenceVerdict.STALE: "stale_fence",
    FenceVerdict.AHEAD: "fence_ahead",
    FenceVerdict.NO_PLAN: "fence_ahead",
    FenceVerdict.MISSING: "fence_missing",
}
"""Error code of each refusal: the sender's plan is older (stale), newer than this node's
(ahead: retry once this node applied it), or it sent none."""


def fence_headers(current: PlanFence | None) -> dict[str, str]:
    """`{X-Shoal-Fence: term.version}` of the plan this node applies; empty without a plan."""
    return {} if current is None else {FENCE_HEADER: current.to_header()}


def _refuse(status: int, code: str, reason: str, **extra: object) -> web.Response:
    body = {"error": code, "reason": reason, "status": status, **extra}
    return web.json_response(body, status=status)


def fence_refusal(
    request: web.Request, current: PlanFence | None, *, required: bool = True
) -> web.Response | None:
    """None when the request may act: its fence equals `current`, or it carries none and
    `required` is False (a request made by an operator, not because of a plan). Otherwise the
    answer to send: 409 `stale_fence` / `fence_ahead` / `fence_missing` naming both fences,
    or 400 `bad_fence` for a malformed header."""
    header = request.headers.get(FENCE_HEADER)
    if header is None and not required:
        return None
    try:
        presented = None if header is None else PlanFence.from_header(header)
    except PlanError as exc:
        return _refuse(400, "bad_fence", f"{FENCE_HEADER}: {exc}")
    result = check_fence(current, presented)
    if result.ok:
        return None
    return _refuse(409, REFUSAL_CODES[result.verdict], result.reason, fence=result.to_dict())


def fenced(handler: Handler, current: FenceSource, *, required: bool = False) -> Handler:
    """`handler` behind the fence check: a request under another plan is answered 409 and the
    handler never runs. `required`: refuse requests without a fence too."""

    async def guarded(request: web.Request) -> web.StreamResponse:
        refusal = fence_refusal(request, current(), required=required)
        if refusal is not None:
            return refusal
        return await handler(request)

    return guarded
