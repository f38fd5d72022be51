"""Log lines of the daemon carry the node id and term, as text or one JSON object per line."""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable

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
