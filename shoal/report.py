"""Progress reports of one rank, batched: `Reporter.add` only appends to a bounded buffer (a few
microseconds); a daemon thread posts the buffer to the local daemon every `interval_s`
(POST /v1/training/reports). While the daemon is unreachable or busy the newest reports are kept
and the oldest dropped (counted); an answer that refuses the reports is recorded as the
session's failure, raised at the next `report()`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from shoal._daemon import DaemonClient
from shoal.errors import DaemonAnswerError, DaemonUnreachableError, SessionError
from shoal.place import RankPlace

__all__ = ["REPORTS_PATH", "Reporter"]

log = logging.getLogger(__name__)

REPORTS_PATH = "/v1/training/reports"
MAX_PENDING = 1024
"""Reports kept while the daemon does not take them; older ones are dropped (and counted)."""
MAX_BATCH = 512
"""Reports per POST (the daemon's body model allows as many)."""
POST_TIMEOUT_S = 2.0
BROKEN_CHARS = 300
"""A `broken` reason is cut to this (node.training.models.MAX_DETAIL_CHARS)."""

Report = tuple[int, float, float | None, Mapping[str, float]]
"""(step, unix time, compute_s, scalars)."""


class Reporter:
    """Batches one rank's reports to its daemon (None: no daemon, every report dropped after
    one warning). `on_failure` is told of a refusal (a bad body, a bad signature);
    `on_generation` of the daemon's current generation after each post."""

    def __init__(
        self,
        client: DaemonClient | None,
        place: RankPlace,
        *,
        interval_s: float = 0.5,
        max_pending: int = MAX_PENDING,
        on_failure: Callable[[BaseException], None],
        on_generation: Callable[[int], None] | None = None,
    ) -> None:
        self._client = client
        self._place = place
        self._interval_s = interval_s
        self._pending: deque[Report] = deque(maxlen=max_pending)
        self.dropped = 0
        """Reports dropped so far: the buffer overflowed, or there is no daemon to take them."""
        self._dropped_sent = 0
        self._on_failure = on_failure
        self._on_generation = on_generation
        self._wake = threading.Event()
        self._stop = False
        self._warned = False
        self.posted = 0
        """Reports the daemon accepted."""
        self._thread: threading.Thread | None = None
        if client is not None:
            self._thread = threading.Thread(
                target=self._run, name=f"shoal-report-rank{place.rank}", daemon=True
            )
            self._thread.start()

    def add(self, step: int, compute_s: float | None, scalars: Mapping[str, float]) -> None:
        """Queue one report (never blocks, never raises)."""
        pending = self._pending
        if self._client is None:
            self.dropped += 1
            if not self._warned:
                self._warned = True
                log.warning(
                    "shoal: no daemon (SHOAL_DAEMON_URL is unset): progress reports are dropped"
                )
            return
        if len(pending) == pending.maxlen:
            self.dropped += 1
        pending.append((step, time.time(), compute_s, scalars))

    def move(self, place: RankPlace) -> None:
        """Report as `place` from now on (the session re-formed in place): what is queued was
        reported in the old place and is sent as such first."""
        self._post_pending()
        self._place = place

    def broken(self, reason: str) -> None:
        """Tell the daemon now that this rank's group broke under it (what is queued goes
        first); never raises."""
        self._post_pending()
        client = self._client
        if client is None:
            return
        body = self._body([])
        body["broken"] = reason[:BROKEN_CHARS]
        try:
            client.request("POST", REPORTS_PATH, body, timeout_s=POST_TIMEOUT_S)
        except (DaemonUnreachableError, DaemonAnswerError) as exc:
            log.warning("shoal: cannot tell the daemon that the group broke: %s", exc)

    def flush(self) -> None:
        """Post what is queued now (from the calling thread)."""
        self._post_pending()

    def close(self, timeout_s: float = POST_TIMEOUT_S) -> None:
        """Post what is left (one try) and stop the thread; idempotent."""
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s + 1.0)
            self._thread = None

    def _run(self) -> None:
        while not self._stop:
            self._wake.wait(self._interval_s)
            self._wake.clear()
            self._post_pending()
        self._post_pending()

    def _take(self) -> list[Report]:
        batch: list[Report] = []
        while self._pending and len(batch) < MAX_BATCH:
            try:
                batch.append(self._pending.popleft())
            except IndexError:  # pragma: no cover - only this thread takes
                break
        return batch

    def _put_back(self, batch: list[Report]) -> None:
        """Return an unsent batch in front of newer reports, keeping only the newest."""
        room = (self._pending.maxlen or MAX_PENDING) - len(self._pending)
        keep = batch[-room:] if room > 0 else []
        self.dropped += len(batch) - len(keep)
        self._pending.extendleft(reversed(keep))

    def _post_pending(self) -> None:
        client = self._client
        while client is not None and self._pending:
            batch = self._take()
            try:
                body = self._body(batch)
                answer = client.request("POST", REPORTS_PATH, body, timeout_s=POST_TIMEOUT_S)
            except (DaemonUnreachableError, DaemonAnswerError) as exc:
                if self._refused(exc, batch):
                    continue
                self._put_back(batch)
                return
            self.posted += len(batch)
            self._dropped_sent += body["dropped"]
            generation = answer.get("generation") if isinstance(answer, Mapping) else None
            if isinstance(generation, int) and self._on_generation is not None:
                self._on_generation(generation)

    def _refused(self, exc: Exception, batch: list[Report]) -> bool:
        """True when the batch is dropped for good (refused); False to keep and retry."""
        transient = isinstance(exc, DaemonUnreachableError) or (
            isinstance(exc, DaemonAnswerError) and (exc.status >= 500 or exc.status == 429)
        )
        if transient:
            level = logging.DEBUG if self._warned else logging.WARNING
            log.log(level, "shoal: reports wait for the daemon: %s", exc)
            self._warned = True
            return False
        assert isinstance(exc, DaemonAnswerError)
        if exc.status == 404:  # a daemon of an older release: it keeps no progress
            log.warning("shoal: %s does not take progress reports; they are dropped", exc.url)
            self._client = None
            self._pending.clear()
            return True
        failure = SessionError(f"the daemon refused {len(batch)} progress reports: {exc}")
        failure.__cause__ = exc
        self._on_failure(failure)
        return True

    def _body(self, batch: list[Report]) -> dict[str, Any]:
        place = self._place
        return {
            "generation": place.generation,
            "rank": place.rank,
            "local_rank": place.local_rank,
            "world_size": place.world_size,
            "pid": os.getpid(),
            "dropped": self.dropped - self._dropped_sent,
            "reports": [
                {"step": step, "at": at, "compute_s": compute_s, "scalars": dict(scalars)}
                for step, at, compute_s, scalars in batch
            ],
        }
