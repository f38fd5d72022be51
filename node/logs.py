"""Log lines of the daemon carry the node id and term, as text or one JSON object per line."""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable
from typing import Any

from aiohttp.http_exceptions import HttpProcessingError

from config import LogFormat


class NodeContextFilter(logging.Filter):
    """Adds `node_id` and `term` to every record."""

    def __init__(self, node_id: Callable[[], str], term: Callable[[], int | None]) -> None:
        super().__init__()
        self._node_id = node_id
        self._term = term

    def filter(self, record: logging.LogRecord) -> bool:
        record.node_id = self._node_id()
        term = self._term()
        record.term = "-" if term is None else term
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, node_id, term, message."""

    def format(self, record: logging.LogRecord) -> str:
        document = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "node_id": getattr(record, "node_id", None),
            "term": getattr(record, "term", None),
            "message": record.getMessage(),
        }
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        return json.dumps(document, default=str)


def configure_logging(
    log_format: LogFormat,
    node_id: Callable[[], str],
    term: Callable[[], int | None],
    level: int = logging.INFO,
) -> logging.Handler:
    """Install one stderr handler on the root logger; returns it so it can be removed."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(NodeContextFilter(node_id, term))
    if log_format is LogFormat.JSON:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(
            logging.Formatter(
                "%(asctime)s %(levelname)s [%(node_id)s term=%(term)s] %(name)s: %(message)s"
            )
        )
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(level)
    return handler


class QuietProtocolLog(logging.LoggerAdapter[logging.Logger]):
    """aiohttp's server logger that keeps malformed requests from flooding the daemon log.

    A request the HTTP parser refuses (a NUL in a header, a garbage request line) is one DEBUG
    line, at most `debug_per_s` a second, and a WARNING every `summary_s` counts them. Every
    other record (a handler's unexpected exception) passes through unchanged.
    """

    def __init__(
        self,
        logger: logging.Logger,
        *,
        debug_per_s: float = 1.0,
        summary_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(logger, {})
        self._debug_gap_s = 1.0 / debug_per_s
        self._summary_s = summary_s
        self._clock = clock
        self._last_debug = -float("inf")
        self._window_started = clock()
        self._refused = 0
        self.refused_total = 0

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info")
        if not isinstance(exc, HttpProcessingError):
            super().log(level, msg, *args, **kwargs)
            return
        now = self._clock()
        self._refused += 1
        self.refused_total += 1
        if now - self._last_debug >= self._debug_gap_s:
            self._last_debug = now
            self.logger.debug("malformed HTTP request refused: %s", exc)
        if now - self._window_started >= self._summary_s:
            self.logger.warning(
                "%d malformed HTTP request(s) refused in the last %.0f s",
                self._refused,
                now - self._window_started,
            )
            self._refused = 0
            self._window_started = now
