"""A node that stops while a connection is being accepted closes that connection too.

Python 3.11 accepts a connection in one loop turn and attaches its transport to the listener in
the next; when the listener closed in between, the attach fails and the socket leaks (CI saw
it as an unclosed transport after a daemon of the lock cluster stopped). The race is made
exact here: the task that stops the site wakes in the same turn as the accept."""

from __future__ import annotations

import asyncio
import gc
import socket
import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, cast

import pytest
from aiohttp import web

from config.settings import AuthMode
from node.connections import ConnectionBudget, GuardedSite
from node.identity.listener import IdentitySite
from node.startup import listen_sockets


@contextmanager
def leaks_seen() -> Iterator[list[str]]:
    """The resource warnings of objects collected inside the block, as text."""
    seen: list[str] = []
    previous = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        seen.append(repr(unraisable.exc_value))

    sys.unraisablehook = hook
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", ResourceWarning)
            yield seen
            gc.collect()
    finally:
        sys.unraisablehook = previous


async def _stop_as_accepted(runner: web.AppRunner, port: int) -> None:
    """Connect while a task waits on another socket that becomes readable in the same loop turn
    as the connection; that task then stops the runner before the accept completes."""
    loop = asyncio.get_running_loop()
    wake, nudge = socket.socketpair()
    wake.setblocking(False)
    client = socket.socket()
    try:

        async def stopper() -> None:
            await loop.sock_recv(wake, 1)
            await runner.cleanup()

        task = asyncio.create_task(stopper())
        await asyncio.sleep(0)  # the stopper waits on `wake`
        nudge.send(b"x")
        client.connect(("127.0.0.1", port))  # completed by the kernel, not yet accepted
        await task
        await asyncio.sleep(0.05)
    finally:
        client.close()
        wake.close()
        nudge.close()


Make = Callable[[web.AppRunner, list[socket.socket]], web.BaseSite]


async def _site_case(make: Make) -> list[str]:
    with leaks_seen() as leaks:
        runner = web.AppRunner(web.Application(), shutdown_timeout=0.5)
        await runner.setup()
        sockets = listen_sockets("127.0.0.1", 0)
        site = make(runner, sockets)
        await site.start()
        await _stop_as_accepted(runner, int(sockets[0].getsockname()[1]))
        del site, runner, sockets
    return leaks


SITES: dict[str, Make] = {
    "plain": lambda runner, sockets: GuardedSite(runner, sockets, ConnectionBudget()),
    "tls": lambda runner, sockets: IdentitySite(
        runner,
        sockets,
        contexts=cast(Any, None),  # no byte is sent: no handshake starts
        mode=AuthMode.TLS,
        plain_ok=True,
        refused=lambda *_: None,
    ),
}


@pytest.mark.parametrize("kind", sorted(SITES))
async def test_a_connection_accepted_as_the_site_stops_is_closed_not_leaked(kind: str) -> None:
    for _ in range(3):
        leaks = await _site_case(SITES[kind])
        assert leaks == [], f"{kind} site leaked on stop: {leaks}"
