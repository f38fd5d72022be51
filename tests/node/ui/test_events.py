"""The event hub: snapshots shared by every page, sent only on change, job logs followed."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientResponse, ClientSession, ClientTimeout, web
from aiohttp.test_utils import TestServer

from node.security import error_middleware
from node.ui.events import LOG_TAIL_BYTES, EventHub

INTERVAL_S = 0.05


class Counter:
    """A topic whose value the test sets, counting how often it is computed."""

    def __init__(self) -> None:
        self.value = 0
        self.calls = 0

    async def __call__(self) -> dict[str, int]:
        self.calls += 1
        return {"value": self.value}


async def _events(answer: ClientResponse, count: int) -> list[tuple[str, Any]]:
    """The next `count` events (name, data) of a stream."""
    found: list[tuple[str, Any]] = []
    name = ""
    while len(found) < count:
        line = (await answer.content.readline()).decode().rstrip("\n")
        if line.startswith("event: "):
            name = line.removeprefix("event: ")
        elif line.startswith("data: "):
            found.append((name, json.loads(line.removeprefix("data: "))))
    return found


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[EventHub, Counter, TestServer, Path]]:
    counter = Counter()
    logs = tmp_path / "job1"
    logs.mkdir()

    def log_paths(job_id: str) -> Mapping[str, Path] | None:
        if job_id != "job1":
            return None
        return {"stdout": logs / "stdout.log", "stderr": logs / "stderr.log"}

    hub = EventHub({"counter": counter}, log_paths, interval_s=INTERVAL_S)
    await hub.open()
    app = web.Application(middlewares=[error_middleware])
    app.router.add_get("/v1/events", hub.handle_events)
    async with TestServer(app, host="127.0.0.1") as server:
        yield hub, counter, server, logs
        await hub.close()


async def test_pages_share_one_snapshot_and_get_it_only_on_change(
    served: tuple[EventHub, Counter, TestServer, Path],
) -> None:
    hub, counter, server, _ = served
    url = server.make_url("/v1/events?topics=counter")
    async with ClientSession(timeout=ClientTimeout(total=10)) as session:
        async with session.get(url) as first, session.get(url) as second:
            assert await _events(first, 2) == [("hello", ["counter"]), ("counter", {"value": 0})]
            assert await _events(second, 2) == [("hello", ["counter"]), ("counter", {"value": 0})]
            assert hub.streams == 2
            calls = counter.calls
            await asyncio.sleep(INTERVAL_S * 6)  # several ticks of both streams pass
            # at most one computation per interval for both pages together
            assert counter.calls - calls <= 8
            counter.value = 1
            assert await _events(first, 1) == [("counter", {"value": 1})]  # unchanged ticks: none
            assert await _events(second, 1) == [("counter", {"value": 1})]
        await _until(lambda: hub.streams == 0)


async def _until(check: Any, timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not check():
            await asyncio.sleep(0.01)


async def test_a_job_log_is_followed_from_its_tail(
    served: tuple[EventHub, Counter, TestServer, Path],
) -> None:
    _, _, server, logs = served
    (logs / "stdout.log").write_bytes(b"x" * (LOG_TAIL_BYTES + 10) + b"\nold line\n")
    url = server.make_url("/v1/events?topics=log:job1")
    async with (
        ClientSession(timeout=ClientTimeout(total=10)) as session,
        session.get(url) as answer,
    ):
        (_, _), (name, chunk) = await _events(answer, 2)
        assert name == "log"
        assert chunk["stream"] == "stdout"
        assert chunk["text"].endswith("old line\n")
        assert len(chunk["text"]) == LOG_TAIL_BYTES
        with (logs / "stderr.log").open("a") as err:
            err.write("new error\n")
        with (logs / "stdout.log").open("a") as out:
            out.write("new line\n")
        events = await _events(answer, 2)
        assert sorted((c["stream"], c["text"]) for _, c in events) == [
            ("stderr", "new error\n"),
            ("stdout", "new line\n"),
        ]


@pytest.mark.parametrize(
    ("topics", "status"),
    [("nope", 400), ("", 400), ("counter,log:ghost", 404), (",".join(["counter"] * 17), 400)],
)
async def test_bad_topics_are_refused(
    served: tuple[EventHub, Counter, TestServer, Path], topics: str, status: int
) -> None:
    _, _, server, _ = served
    url = server.make_url(f"/v1/events?topics={topics}")
    async with ClientSession() as session, session.get(url) as answer:
        assert answer.status == status
        assert (await answer.json())["status"] == status


async def test_close_ends_the_open_streams(
    served: tuple[EventHub, Counter, TestServer, Path],
) -> None:
    hub, _, server, _ = served
    url = server.make_url("/v1/events?topics=counter")
    async with (
        ClientSession(timeout=ClientTimeout(total=10)) as session,
        session.get(url) as answer,
    ):
        await _events(answer, 2)
        await hub.close()
        assert (await answer.content.read()).strip() == b""  # the stream ended


async def test_a_head_request_answers_without_a_stream(
    served: tuple[EventHub, Counter, TestServer, Path],
) -> None:
    _, _, server, _ = served
    url = server.make_url("/v1/events?topics=counter")
    async with (
        ClientSession(timeout=ClientTimeout(total=5)) as session,
        session.head(url) as answer,
    ):
        assert answer.status == 200
        assert answer.headers["Content-Type"] == "text/event-stream"


async def test_a_followed_log_is_looked_at_more_often_than_topics_change(tmp_path: Path) -> None:
    log = tmp_path / "stdout.log"
    log.write_text("")
    hub = EventHub({}, lambda job_id: {"stdout": log}, interval_s=30.0)
    app = web.Application()
    app.router.add_get("/v1/events", hub.handle_events)
    async with TestServer(app, host="127.0.0.1") as server, ClientSession() as session:
        url = server.make_url("/v1/events?topics=log:j")
        async with session.get(url, timeout=ClientTimeout(total=5)) as answer:
            await _events(answer, 1)  # hello
            with log.open("a") as out:
                out.write("a line\n")
            ((_, chunk),) = await _events(answer, 1)  # long before the 30 s topic interval
            assert chunk["text"] == "a line\n"
        await hub.close()
