"""wait_until, async_wait_until and free_port."""

from __future__ import annotations

import asyncio
import itertools
import socket

import pytest

from tests.cluster import WaitTimeoutError, async_wait_until, free_port, wait_until


def test_wait_until_returns_the_first_truthy_value() -> None:
    counter = itertools.count()
    assert (
        wait_until(lambda: next(counter) >= 3 and "done", timeout_s=2, interval_s=0.001) == "done"
    )


def test_wait_until_timeout_names_the_condition_and_last_value() -> None:
    with pytest.raises(WaitTimeoutError, match=r"leader elected .*last returned \[\]"):
        wait_until(list, timeout_s=0.05, interval_s=0.01, message="leader elected")


def test_wait_until_retries_os_errors_and_chains_the_last_one() -> None:
    def refuse() -> bool:
        raise ConnectionRefusedError("nobody listens")

    with pytest.raises(WaitTimeoutError, match="last raised ConnectionRefusedError") as info:
        wait_until(refuse, timeout_s=0.05, interval_s=0.01)
    assert isinstance(info.value.__cause__, ConnectionRefusedError)


def test_wait_until_propagates_other_errors_at_once() -> None:
    def broken() -> bool:
        raise KeyError("bug")

    with pytest.raises(KeyError):
        wait_until(broken, timeout_s=5)


async def test_async_wait_until_accepts_async_and_plain_predicates() -> None:
    counter = itertools.count()

    async def ready() -> int:
        await asyncio.sleep(0)
        return next(counter) >= 2 and 7

    assert await async_wait_until(ready, timeout_s=2, interval_s=0.001) == 7
    assert await async_wait_until(lambda: "plain", timeout_s=1) == "plain"


async def test_async_wait_until_bounds_a_hung_predicate() -> None:
    async def hang() -> bool:
        await asyncio.sleep(60)
        return True

    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(WaitTimeoutError, match="hang"):
        await async_wait_until(hang, timeout_s=0.1)
    assert loop.time() - started < 5


def test_free_port_is_free_for_tcp_and_udp() -> None:
    port = free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp:
        tcp.bind(("127.0.0.1", port))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.bind(("127.0.0.1", port))
