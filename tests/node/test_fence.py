"""The fence helpers every role-dependent route reuses: the sender's header and the receiver's
409 check around a handler."""

from __future__ import annotations

from typing import Any

from aiohttp import ClientSession, web
from aiohttp.test_utils import TestServer

from node.fence import fence_headers, fenced
from node.plan import FENCE_HEADER, PlanFence


def test_fence_headers_name_the_applied_plan() -> None:
    assert fence_headers(PlanFence(4, 2)) == {FENCE_HEADER: "4.2"}
    assert fence_headers(None) == {}


async def test_fenced_route_refuses_every_other_plan_and_never_runs_the_handler() -> None:
    current: list[PlanFence | None] = [PlanFence(4, 2)]
    ran: list[str] = []

    async def start_job(request: web.Request) -> web.Response:
        ran.append(request.headers.get(FENCE_HEADER, "-"))
        return web.json_response({"started": True})

    app = web.Application()
    app.router.add_post("/v1/jobs", fenced(start_job, lambda: current[0]))
    app.router.add_post("/v1/locks", fenced(start_job, lambda: current[0], required=True))
    answers: dict[tuple[str, str | None], tuple[int, Any]] = {}
    async with TestServer(app, host="127.0.0.1") as server, ClientSession() as session:
        for path in ("/v1/jobs", "/v1/locks"):
            for header in ("4.2", "4.1", "3.9", "5.0", None, "x"):
                headers = {} if header is None else {FENCE_HEADER: header}
                async with session.post(server.make_url(path), headers=headers) as response:
                    answers[path, header] = (response.status, await response.json())
        current[0] = None
        async with session.post(
            server.make_url("/v1/jobs"), headers={FENCE_HEADER: "4.2"}
        ) as response:
            no_plan = (response.status, await response.json())
    assert answers["/v1/jobs", "4.2"] == (200, {"started": True})
    for stale in ("4.1", "3.9"):
        status, body = answers["/v1/jobs", stale]
        assert (status, body["error"], body["status"]) == (409, "stale_fence", 409)
        assert body["fence"] == {
            "verdict": "stale",
            "current": [4, 2],
            "presented": PlanFence.from_header(stale).to_list(),
            "reason": body["reason"],
        }
    assert answers["/v1/jobs", "5.0"][1]["error"] == "fence_ahead"
    assert answers["/v1/jobs", None] == (200, {"started": True})  # an operator's request
    assert answers["/v1/locks", None][1]["error"] == "fence_missing"
    assert answers["/v1/jobs", "x"][0] == 400
    assert answers["/v1/jobs", "x"][1]["error"] == "bad_fence"
    assert no_plan[0] == 409
    assert no_plan[1]["error"] == "fence_ahead"
    assert ran == ["4.2", "-", "4.2"]  # refused requests never reached the handler
