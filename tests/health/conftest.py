"""Fixtures of the health tests: a fake clock that moves only when told."""

from __future__ import annotations

import pytest


class FakeClock:
    """A monotonic clock for breakers and checkers; `advance` moves it."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()
