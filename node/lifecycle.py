"""The daemon's own long-lived parts as components, beside the served ones of node.parts: the
WAL, membership, the election, the HTTP server, the background sync loop and the CRL spread's
loops (health and auto-stop are components of node.boot and node.providers.own, discovery of
node.discovery.start). Each is built with the handles it needs, opened in the one list's order
(node.assembly) and closed in reverse; none serves routes."""

from __future__ import annotations

import asyncio
import logging
import random
import socket
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from aiohttp import web

from config import Inventory
from node.component import LOOP_CHECK_INTERVAL_S, Check, Endpoint, loop_check
from node.election.elector import Elector
from node.election.service import ElectionService
from node.identity import CertificateGate, CrlSpread
from node.identity.component import api_site, api_tls_workers
from node.identity.terminator import TlsWorkers
from node.membership.checks import membership_check
from node.membership.service import Membership
from node.runtime import NodeRuntime
from node.sync_service import SyncService
from wal import WriteAheadLog

log = logging.getLogger("node.daemon")

NO_ROUTES: tuple[Endpoint, ...] = ()


class WalPart:
    """The write-ahead log: opened (and recovered) first, closed last."""

    def __init__(self, wal: WriteAheadLog) -> None:
        self.wal = wal

    async def open(self) -> None:
        await self.wal.open()
        pending = await self.wal.pending()
        if pending:
            log.warning("WAL %s holds %d pending operations", self.wal.path, len(pending))

    def routes(self) -> Sequence[Endpoint]:
        return NO_ROUTES

    def checks(self) -> Mapping[str, Check]:
        return {}  # the WAL's checks are health's (node.boot.host_health)

    async def close(self) -> None:
        await self.wal.close()


class MembershipPart:
    """Membership over UDP on the API's port number, started once the API listens."""

    def __init__(self, membership: Membership) -> None:
        self.membership = membership

    async def open(self) -> None:
        await self.membership.start()

    def routes(self) -> Sequence[Endpoint]:
        return NO_ROUTES

    def checks(self) -> Mapping[str, Check]:
        return {"membership": Check(membership_check(self.membership), interval_s=5.0)}

    async def close(self) -> None:
        await self.membership.close()


class ElectionPart:
    """The election over membership: its elector runs from `open()` to `close()`."""

    def __init__(
        self,
        election: ElectionService,
        membership: Membership,
        inventory: Inventory | None,
        secret: bytes | None,
        wal: WriteAheadLog,
        rng: random.Random,
    ) -> None:
        self.election = election
        self._membership = membership
        self._inventory = inventory
        self._secret = secret
        self._wal = wal
        self._rng = rng
        self.elector: Elector | None = None

    async def open(self) -> None:
        self.elector = await self.election.start(
            self._membership, self._inventory, self._secret, self._wal, self._rng
        )

    def routes(self) -> Sequence[Endpoint]:
        return NO_ROUTES

    def checks(self) -> Mapping[str, Check]:
        return loop_check(None if self.elector is None else self.elector.loop_health)

    async def close(self) -> None:
        await self.election.close()


class ApiServer:
    """The HTTP API on the bound `sockets`: the app `build` makes of the components opened
    before this one, served from `open()`; `close()` ends the dashboard's event streams, then
    stops the server (answers in flight get `shutdown_timeout_s`)."""

    def __init__(
        self,
        runtime: NodeRuntime,
        sockets: list[socket.socket],
        build: Callable[[], web.Application],
        identity: CertificateGate | None,
        before_stop: Callable[[], Any],
        *,
        protocol_log: logging.Logger | Any,
        max_line_size: int,
        shutdown_timeout_s: float = 2.0,
    ) -> None:
        self._runtime = runtime
        self._sockets = sockets
        self._build = build
        self._identity = identity
        self._before_stop = before_stop
        self._protocol_log = protocol_log
        self._max_line_size = max_line_size
        self._shutdown_timeout_s = shutdown_timeout_s
        self.app: web.Application | None = None
        self._runner: web.AppRunner | None = None
        self._tls_workers: TlsWorkers | None = None

    async def open(self) -> None:
        self.app = self._build()
        runner = web.AppRunner(
            self.app,
            access_log=None,
            shutdown_timeout=self._shutdown_timeout_s,
            max_line_size=self._max_line_size,
            logger=self._protocol_log,
        )
        await runner.setup()
        self._runner = runner
        try:
            if self._identity is not None:
                self._tls_workers = api_tls_workers(self._runtime.settings)
            if self._tls_workers is not None:
                self._tls_workers.start()
            site = api_site(
                runner, self._sockets, self._runtime.settings, self._identity, self._tls_workers
            )
            await site.start()
        except BaseException:
            await self.close()
            raise

    def routes(self) -> Sequence[Endpoint]:
        return NO_ROUTES

    def checks(self) -> Mapping[str, Check]:
        workers = self._tls_workers
        if workers is None:
            return {}
        return {"tls_workers": Check(workers.check, interval_s=LOOP_CHECK_INTERVAL_S)}

    async def close(self) -> None:
        runner, self._runner = self._runner, None
        try:
            await self._before_stop()
        finally:
            if runner is not None:
                await runner.cleanup()
            workers, self._tls_workers = self._tls_workers, None
            if workers is not None:  # after the answers in flight, which they encrypt
                await asyncio.to_thread(workers.stop)
            for sock in self._sockets:  # closed by the site once it started; else here
                sock.close()


class SyncLoop:
    """Background sync from every alive member of `membership`, every `sync_interval_s`."""

    def __init__(self, sync: SyncService, membership: Membership) -> None:
        self._sync = sync
        self._membership = membership
        self._task: asyncio.Task[None] | None = None

    async def open(self) -> None:
        self._sync.attach(self._membership)
        self._task = asyncio.create_task(self._sync.run_forever(), name="background-sync")

    def routes(self) -> Sequence[Endpoint]:
        return NO_ROUTES

    def checks(self) -> Mapping[str, Check]:
        return {}  # its loop's health is the sync component's `sync` check

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


class CrlLoops:
    """The CRL spread's loops (fetching peers' CRLs, watching the files, SIGHUP), started once
    the API listens; its route is served from the start (node.identity.component)."""

    def __init__(self, spread: CrlSpread) -> None:
        self.spread = spread

    async def open(self) -> None:
        self.spread.start()

    def routes(self) -> Sequence[Endpoint]:
        return NO_ROUTES

    def checks(self) -> Mapping[str, Check]:
        return {}

    async def close(self) -> None:
        await self.spread.close()
