"""One quiet logger for repeated failures (python-zeroconf's QuietLogger): the first failure of a
key is logged at WARNING, the next ones at DEBUG, until the key succeeds again."""

from __future__ import annotations

import logging

__all__ = ["QuietLog"]


class QuietLog:
    """Logs a repeated failure of `key` once at WARNING, then at DEBUG until `clear(key)`."""

    __slots__ = ("_logger", "_warned")

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger
        self._warned: set[str] = set()

    def failed(self, key: str, message: str, *args: object) -> None:
        """Log a failure of `key`: at WARNING the first time since it last cleared."""
        level = logging.DEBUG if key in self._warned else logging.WARNING
        self._warned.add(key)
        self._logger.log(level, message, *args)

    def clear(self, key: str) -> None:
        """`key` works again: its next failure is logged at WARNING."""
        self._warned.discard(key)

    def warned(self, key: str) -> bool:
        """Whether a failure of `key` was logged since it last cleared."""
        return key in self._warned
