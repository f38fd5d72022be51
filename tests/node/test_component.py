"""The component protocol: components open in order and close in reverse on the daemon's exit
stack (one whose open failed is not closed), and two components never give one health check."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AsyncExitStack

import pytest

from health import CheckResult, HealthStatus
from node.component import Check, Component, Endpoint, Served, checks_of, enter


async def _healthy() -> CheckResult:
    return CheckResult(HealthStatus.HEALTHY, "fine")


class _Part:
    def __init__(self, name: str, log: list[str], *, fails: bool = False) -> None:
        self.name = name
        self._log = log
        self._fails = fails

    async def open(self) -> None:
        self._log.append(f"open {self.name}")
        if self._fails:
            raise OSError(f"{self.name} cannot open")

    def routes(self) -> Sequence[Endpoint]:
        return ()

    def checks(self) -> Mapping[str, Check]:
        return {self.name: Check(_healthy, interval_s=2.0)}

    async def close(self) -> None:
        self._log.append(f"close {self.name}")


async def test_components_open_in_order_and_close_in_reverse() -> None:
    log: list[str] = []
    parts = [_Part("stores", log), _Part("sync", log), _Part("jobs", log)]
    assert all(isinstance(part, Component) for part in parts)
    async with AsyncExitStack() as stack:
        await enter(stack, parts)
        assert log == ["open stores", "open sync", "open jobs"]
    assert log[3:] == ["close jobs", "close sync", "close stores"]


async def test_a_component_that_fails_to_open_stops_the_rest_and_is_not_closed() -> None:
    log: list[str] = []
    parts = [_Part("stores", log), _Part("sync", log, fails=True), _Part("jobs", log)]
    with pytest.raises(OSError, match="sync cannot open"):
        async with AsyncExitStack() as stack:
            await enter(stack, parts)
    assert log == ["open stores", "open sync", "close stores"]


def test_checks_of_names_every_check_once() -> None:
    log: list[str] = []
    checks = checks_of([_Part("locks", log), Served(checks={"runs": Check(_healthy, 1.0)})])
    assert sorted(checks) == ["locks", "runs"]
    assert checks["runs"].interval_s == 1.0
    with pytest.raises(ValueError, match="two components contribute a health check named 'locks'"):
        checks_of([_Part("locks", log), _Part("locks", log)])
