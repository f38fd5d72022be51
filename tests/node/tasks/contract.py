"""Functions and classes the contract suite sends to every backend."""

from __future__ import annotations

import os
import threading
import time
from typing import Any


def square(x: int) -> int:
    return x * x


def add(a: int, b: int = 0) -> int:
    return a + b


def size_of(blob: bytes) -> int:
    return len(blob)


def failing_task(reason: str) -> None:
    raise ValueError(f"bad input: {reason}")


def sleep_then(seconds: float, value: Any) -> Any:
    time.sleep(seconds)
    return value


def block_on(path: str, value: Any) -> Any:
    """Wait (bounded) until `path` exists, then return `value`."""
    deadline = time.monotonic() + 60
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)
    return value


class Counter:
    def __init__(self, start: int = 0) -> None:
        self.value = start
        self._lock = threading.Lock()

    def incr(self, by: int = 1) -> int:
        with self._lock:
            self.value += by
            return self.value

    def get(self) -> int:
        return self.value

    def fail(self) -> None:
        raise KeyError("no such key in the actor")

    def pid(self) -> int:
        return os.getpid()


class InitCounting:
    """Appends its pid to `path` when built, so a test can count the instances made."""

    def __init__(self, path: str) -> None:
        with open(path, "a") as f:
            f.write(f"{os.getpid()}\n")
        self.calls = 0

    def incr(self) -> int:
        self.calls += 1
        return self.calls

    def host_pid(self) -> int:
        return os.getpid()
