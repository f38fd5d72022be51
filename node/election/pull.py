"""Fetching a plan that a heartbeat announced (its fence, digest and the members to fetch it from,
node.election.spread) and serving this node's plan to the members that fetch it from here:
`GET /v1/plan?fence=TERM.VERSION&wait_s=S` answers that plan once this node applies it (waiting
up to S seconds), else 404 `plan_not_here`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol, runtime_checkable

from aiohttp import web
from multidict import MultiMapping
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from node.election.messages import Heartbeat, PlanAnnounce
from node.errors import AnsweredError, PlanError
from node.plan import PlanFence, RolePlan
from node.security import json_error

log = logging.getLogger(__name__)

PULL_WAIT_S = 2.0
"""How long a member asked for a plan waits until it applies that plan itself."""
MAX_PULL_WAIT_S = 5.0
"""The longest wait a request may ask for."""
MAX_WAITING_REQUESTS = 64
"""Requests of a plan this node does not apply yet that wait at once; more answer at once."""


@runtime_checkable
class PlanFetcher(Protocol):
    """A transport that fetches the plan of fence `fence` from member `to`: the plan, or None
    when `to` does not apply it within `wait_s` or did not answer."""

    async def fetch_plan(self, to: str, fence: PlanFence, wait_s: float) -> RolePlan | None: ...


Adopt = Callable[[RolePlan, Heartbeat], Awaitable[bool]]
"""Adopts a fetched plan for the heartbeat that announced it; True when this node applies it."""


class PlanPuller:
    """Owns the task that fetches the newest announced plan, trying its sources in order; a
    newer announcement replaces an older pull. `close()` cancels it (idempotent)."""

    def __init__(
        self, node_id: str, fetcher: PlanFetcher, adopt: Adopt, *, wait_s: float = PULL_WAIT_S
    ) -> None:
        self._node_id = node_id
        self._fetcher = fetcher
        self._adopt = adopt
        self._wait_s = wait_s
        self._fence: PlanFence | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    def consider(self, heartbeat: Heartbeat, applied: PlanFence | None) -> None:
        """Start fetching the plan `heartbeat` announces, unless this node applies it (or a
        newer one), it names no source, or a pull of it is running."""
        fence = heartbeat.plan_fence
        if self._closed or fence is None or not heartbeat.plan_sources:
            return
        if heartbeat.plan is not None or heartbeat.plan_digest is None:
            return
        if applied is not None and applied >= fence:
            return
        running = self._task is not None and not self._task.done()
        if running and self._fence is not None and self._fence >= fence:
            return
        if self._task is not None:
            self._task.cancel()
        self._fence = fence
        self._task = asyncio.get_running_loop().create_task(
            self._pull(heartbeat), name=f"plan-pull-{self._node_id}"
        )

    async def _pull(self, heartbeat: Heartbeat) -> None:
        fence = heartbeat.plan_fence
        assert fence is not None
        for source in heartbeat.plan_sources:
            try:
                plan = await self._fetcher.fetch_plan(source, fence, self._wait_s)
                if plan is not None and await self._adopt(plan, heartbeat):
                    return
            except Exception as exc:  # a failed source: the next one is tried
                log.debug("node %s: plan %s from %s failed: %r", self._node_id, fence, source, exc)
        log.debug(
            "node %s: no source of plan %s had it (%s); the coordinator sends it whole later",
            self._node_id,
            fence.to_header(),
            ", ".join(heartbeat.plan_sources),
        )

    async def close(self) -> None:
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


class PlanWaiters:
    """Wakes the requests waiting for this node to apply a plan; bounded (MAX_WAITING_REQUESTS)."""

    def __init__(self) -> None:
        self._changed = asyncio.Event()
        self._waiting = 0

    def changed(self) -> None:
        """The applied plan changed: wake every waiter."""
        self._changed.set()
        self._changed = asyncio.Event()

    async def plan_at(
        self, fence: PlanFence, wait_s: float, current: Callable[[], RolePlan | None]
    ) -> RolePlan | None:
        """`current()` once it has fence `fence`, waiting up to `wait_s`; None when it has
        another (a newer one: the asked plan is gone) or the wait ended."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(max(wait_s, 0.0), MAX_PULL_WAIT_S)
        while True:
            plan = current()
            if plan is not None and plan.fence >= fence:
                return plan if plan.fence == fence else None
            remaining = deadline - loop.time()
            if remaining <= 0 or self._waiting >= MAX_WAITING_REQUESTS:
                return None
            self._waiting += 1
            try:
                async with asyncio.timeout(remaining):
                    await self._changed.wait()
            except TimeoutError:
                return None
            finally:
                self._waiting -= 1


class PlanQuery(BaseModel):
    """Query of `GET /v1/plan` asking for one plan (without `fence`: whatever this node applies)."""

    model_config = ConfigDict(extra="forbid")

    fence: str | None = Field(
        default=None,
        pattern=r"^[0-9]{1,19}\.[0-9]{1,19}$",
        description="TERM.VERSION: that plan only (peers)",
    )
    wait_s: float = Field(
        default=0.0, ge=0.0, le=MAX_PULL_WAIT_S, description="wait until this node applies it"
    )


class PlanHolder(Protocol):
    def plan_announce(self) -> PlanAnnounce: ...
    async def plan_at(self, fence: PlanFence, wait_s: float) -> RolePlan | None: ...


def plan_query(query: MultiMapping[str]) -> PlanQuery:
    """The query of `GET /v1/plan`, checked: a repeated or unknown key, a malformed fence or a
    wait_s out of [0, MAX_PULL_WAIT_S] is a 400 naming the query's form."""
    form = f"query [fence=TERM.VERSION[&wait_s=SECONDS (at most {MAX_PULL_WAIT_S:g})]]"
    repeated = sorted({key for key in query if len(query.getall(key)) > 1})
    if repeated:
        raise AnsweredError(400, "bad_request", f"{form}: {', '.join(repeated)} given twice")
    try:
        asked = PlanQuery.model_validate(dict(query))
        if asked.fence is not None:
            PlanFence.from_header(asked.fence)
    except (ValidationError, PlanError) as exc:
        raise AnsweredError(400, "bad_request", f"{form}: {exc}") from None
    return asked


async def serve_plan(holder: PlanHolder, asked: PlanQuery) -> web.Response:
    """`GET /v1/plan?fence=TERM.VERSION[&wait_s=S]` (a `plan_query` with a fence): the plan
    document once `holder` applies that plan (waiting up to S seconds), else 404
    `plan_not_here`."""
    fence = PlanFence.from_header(asked.fence or "")
    if await holder.plan_at(fence, asked.wait_s) is None:
        reason = f"this node does not apply plan {fence.to_header()}"
        return json_error(404, reason, code="plan_not_here")
    return web.json_response(holder.plan_announce().to_dict())
