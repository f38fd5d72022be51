"""The dashboard's one event stream per page: GET /v1/events?topics=a,b,log:JOB (Server-Sent
Events).

A topic's snapshot is computed at most once per `interval_s` however many pages read it, and a
page is sent a topic only when its snapshot changed: at most one update per topic per second,
nothing when nothing moves. `log:JOB` follows a job's stdout and stderr from where the page
joined (the last LOG_TAIL_BYTES first). A sampler keeps the node's last minutes for sparklines.
A window topic (a time series of many points) is sent whole to a page once, then as its newest
points only, while the page's copy still reaches them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from aiohttp import web

from node.security import bad_request
from node.ui.access import add_security_headers

log = logging.getLogger(__name__)

INTERVAL_S = 1.0
SAMPLE_S = 2.0
HISTORY_SAMPLES = 300
"""Ten minutes of samples at SAMPLE_S."""
KEEPALIVE_S = 15.0
LOG_POLL_S = 0.25
"""How often a followed job log is looked at (a stat per stream): new lines reach the page
well within a second; topics still change at most once per interval."""
LOG_TAIL_BYTES = 64 * 1024
LOG_CHUNK_BYTES = 256 * 1024
"""At most this much of one stream is sent per update (a flood catches up over updates)."""
MAX_TOPICS = 16
LOG_STREAMS = ("stdout", "stderr")

TopicFn = Callable[[], Awaitable[Any]]
LogPaths = Callable[[str], Mapping[str, Path] | None]
"""A job id -> its log files by stream, None for an unknown job."""
Sampler = Callable[[], Awaitable[Mapping[str, float]]]


class HistoryTopic(TypedDict):
    """The `history` topic: the node's recent samples (oldest first) and their interval."""

    samples: list[Mapping[str, float]]
    sample_s: float


@dataclass(frozen=True)
class Window:
    """What a window topic answers: its whole window (`full`), its newest points (`tail`, from
    time `tail_from`; the page merges them), the window's `shape` (its series: a page whose
    copy has another shape gets `full`) and the time of its newest point."""

    full: Any
    tail: Any
    shape: str
    tail_from: float
    newest: float


WindowFn = Callable[[], Awaitable[Window]]


@dataclass
class _Cached:
    computed_at: float = float("-inf")
    text: str = ""
    version: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    window: Window | None = None
    tail_text: str = ""


@dataclass(frozen=True)
class _Held:
    """What a page holds of a window topic."""

    version: int
    shape: str
    newest: float


class EventHub:
    """Shared snapshots of every topic and the node's recent samples. `open()`, then serve
    `handle_events`; `close()` ends every open stream."""

    def __init__(
        self,
        topics: Mapping[str, TopicFn],
        log_paths: LogPaths,
        sampler: Sampler | None = None,
        *,
        windows: Mapping[str, tuple[WindowFn, float]] | None = None,
        interval_s: float = INTERVAL_S,
        sample_s: float = SAMPLE_S,
    ) -> None:
        """`windows`: the window topics by name, each with the most often it is recomputed."""
        self._windows = dict(windows or {})
        self._topics = {**topics, "history": self._history_topic, **self._windows_as_topics()}
        self._log_paths = log_paths
        self._sampler = sampler
        self.interval_s = interval_s
        self._sample_s = sample_s
        self._cache: dict[str, _Cached] = {name: _Cached() for name in self._topics}
        self.history: deque[Mapping[str, float]] = deque(maxlen=HISTORY_SAMPLES)
        self._closing = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.streams = 0
        """Event streams open now."""

    def _windows_as_topics(self) -> dict[str, TopicFn]:
        return {name: self._window_fn(name) for name in self._windows}

    def _window_fn(self, name: str) -> TopicFn:
        async def compute() -> Window:
            return await self._windows[name][0]()

        return compute

    @property
    def topics(self) -> tuple[str, ...]:
        return tuple(self._topics)

    async def open(self) -> None:
        if self._sampler is not None and self._task is None:
            self._task = asyncio.create_task(self._sample_forever(), name="ui-sampler")

    async def close(self) -> None:
        """End every stream and the sampler. Idempotent."""
        self._closing.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _sample_forever(self) -> None:
        assert self._sampler is not None
        while not self._closing.is_set():
            try:
                self.history.append(dict(await self._sampler()))
            except Exception as exc:  # a failed sample leaves a gap in the sparkline
                log.debug("dashboard sample failed: %s", exc)
            await asyncio.sleep(self._sample_s)

    async def _history_topic(self) -> HistoryTopic:
        return {"samples": list(self.history), "sample_s": self._sample_s}

    async def snapshot(self, topic: str) -> tuple[int, str]:
        """(version, JSON text) of `topic`, recomputed when older than `interval_s`; the
        version changes only when the text does."""
        cached = await self._fresh(topic)
        return cached.version, cached.text

    async def _fresh(self, topic: str) -> _Cached:
        """The topic's cache, recomputed when older than its interval."""
        cached = self._cache[topic]
        window = self._windows.get(topic)
        interval_s = self.interval_s if window is None else window[1]
        async with cached.lock:
            now = time.monotonic()
            if now - cached.computed_at >= interval_s:
                answer = await self._topics[topic]()
                full = answer.full if isinstance(answer, Window) else answer
                text = json.dumps(full, separators=(",", ":"))
                if text != cached.text:
                    cached.text, cached.version = text, cached.version + 1
                    if isinstance(answer, Window):
                        cached.window = answer
                        cached.tail_text = json.dumps(answer.tail, separators=(",", ":"))
                cached.computed_at = now
            return cached

    async def window_text(self, topic: str, held: _Held | None) -> tuple[_Held, str | None]:
        """What a page holding `held` of window `topic` is sent now: None when its copy is
        current, the tail when its copy has the window's shape and reaches the tail's first
        point, else the whole window."""
        cached = await self._fresh(topic)
        window = cached.window
        if window is None or (held is not None and held.version == cached.version):
            return held or _Held(cached.version, "", float("-inf")), None
        now = _Held(cached.version, window.shape, window.newest)
        if held is not None and held.shape == window.shape and held.newest >= window.tail_from:
            return now, cached.tail_text
        return now, cached.text

    def parse_topics(self, raw: str) -> tuple[list[str], list[str]]:
        """(topics, job ids to follow) of a `topics` parameter; raises a 400 naming the bad
        one."""
        names = [name for name in raw.split(",") if name]
        if not names or len(names) > MAX_TOPICS:
            raise bad_request(
                f"topics: give 1 to {MAX_TOPICS} of {', '.join(self.topics)} or log:JOB_ID",
                param="topics",
            )
        topics, jobs = [], []
        for name in names:
            if name.startswith("log:"):
                job_id = name.removeprefix("log:")
                if self._log_paths(job_id) is None:
                    raise web.HTTPNotFound(reason=f"topics: no job {job_id!r} on this node")
                jobs.append(job_id)
            elif name in self._topics:
                topics.append(name)
            else:
                raise bad_request(
                    f"topics: unknown topic {name!r}; known: {', '.join(self.topics)}, log:JOB_ID",
                    param="topics",
                )
        return topics, jobs

    async def handle_events(self, request: web.Request) -> web.StreamResponse:
        """GET /v1/events: the stream of `topics` until the page goes or the hub closes."""
        topics, jobs = self.parse_topics(request.query.get("topics", ""))
        if request.method == "HEAD":
            head = web.Response(content_type="text/event-stream")
            add_security_headers(head)
            return head
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store"}
        )
        add_security_headers(response)
        await response.prepare(request)
        self.streams += 1
        try:
            await self._stream(response, topics, [_LogFollow(j, self._log_paths) for j in jobs])
        except ConnectionError:
            pass  # the page went away
        finally:
            self.streams -= 1
        return response

    async def _stream(
        self, response: web.StreamResponse, topics: list[str], follows: list[_LogFollow]
    ) -> None:
        sent: dict[str, int] = {}
        held: dict[str, _Held] = {}
        quiet_since = time.monotonic()
        wait_s = min(self.interval_s, LOG_POLL_S) if follows else self.interval_s
        await response.write(f"retry: 2000\nevent: hello\ndata: {json.dumps(topics)}\n\n".encode())
        while not self._closing.is_set():
            chunks = []
            for topic in topics:
                if topic in self._windows:
                    held[topic], update = await self.window_text(topic, held.get(topic))
                    if update is not None:
                        chunks.append(f"event: {topic}\ndata: {update}\n\n")
                    continue
                version, text = await self.snapshot(topic)
                if sent.get(topic) != version:
                    sent[topic] = version
                    chunks.append(f"event: {topic}\ndata: {text}\n\n")
            chunks += [chunk for follow in follows for chunk in follow.read()]
            if not chunks and time.monotonic() - quiet_since >= KEEPALIVE_S:
                chunks.append(": keepalive\n\n")
            if chunks:
                await response.write("".join(chunks).encode())
                quiet_since = time.monotonic()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), wait_s)


class _LogFollow:
    """One page's position in one job's stdout and stderr."""

    def __init__(self, job_id: str, log_paths: LogPaths) -> None:
        self.job_id = job_id
        self._log_paths = log_paths
        self._offsets: dict[str, int | None] = dict.fromkeys(LOG_STREAMS)

    def read(self) -> list[str]:
        """An event per stream that grew since the last read."""
        paths = self._log_paths(self.job_id) or {}
        events = []
        for stream, path in paths.items():
            text, offset = self._read_stream(stream, path)
            if text:
                data = {"job_id": self.job_id, "stream": stream, "offset": offset, "text": text}
                events.append(f"event: log\ndata: {json.dumps(data)}\n\n")
        return events

    def _read_stream(self, stream: str, path: Path) -> tuple[str, int]:
        try:
            with path.open("rb") as file:
                size = file.seek(0, 2)
                offset = self._offsets.get(stream)
                if offset is None or offset > size:
                    offset = max(0, size - LOG_TAIL_BYTES)
                file.seek(offset)
                data = file.read(min(size - offset, LOG_CHUNK_BYTES))
        except FileNotFoundError:
            return "", 0
        self._offsets[stream] = offset + len(data)
        return data.decode("utf-8", errors="replace"), offset
