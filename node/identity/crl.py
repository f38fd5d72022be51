"""The CRL travels through the cluster: every node serves the CRL it uses (`GET /v1/tls/crl`)
and fetches every alive peer's each `tls.crl_refresh_s`; the highest CRL number signed by the
CA wins, is written to the node's CRL file and used from the next request on. A revocation
given to any one node so reaches every node within one membership round plus crl_refresh_s.
The same task reloads the TLS files when they change on disk, and on SIGHUP, and refuses in the
membership the peers whose certificates are revoked (node.identity.revoked)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import Iterable
from typing import Any

from aiohttp import web

from config.declare import READ, Refusal, route
from config.settings import AuthMode
from config.tls.context import TlsContexts
from net import Identity, NetError, PeerClient
from node.identity.peers import AUTH_META, peer_scheme, peer_tls
from node.identity.revoked import RevokedPeers
from node.openapi import TEXT
from node.runtime import NodeRuntime

__all__ = [
    "AUTH_META",
    "CRL_NUMBER_HEADER",
    "CRL_PATH",
    "FILE_CHECK_S",
    "CrlSpread",
    "peer_scheme",
]

log = logging.getLogger(__name__)

CRL_PATH = "/v1/tls/crl"
CRL_NUMBER_HEADER = "X-Shoal-Crl-Number"
FILE_CHECK_S = 1.0
"""How often the TLS files' mtimes are compared with those in use."""
SPREAD_STATES = frozenset({"alive", "suspect", "dead"})
"""Members whose CRL is fetched each round: dead ones too (not those that left), so a node
every peer refused, given a new certificate, calls them and so presents it in a handshake
(the only thing that lifts its refusal: node.identity.revoked)."""


class CrlSpread:
    """Serves this node's CRL, fetches its peers', and watches the TLS files. `start()` spawns
    the loops (and the SIGHUP handler when on the main thread); `close()` ends them."""

    def __init__(
        self,
        runtime: NodeRuntime,
        contexts: TlsContexts,
        interval_s: float,
        revoked: RevokedPeers | None = None,
    ) -> None:
        self._runtime = runtime
        self.revoked = revoked
        self._contexts = contexts
        self._interval_s = interval_s
        self._tasks: list[asyncio.Task[None]] = []
        self._client: PeerClient | None = None
        self._warned: set[str] = set()
        self._sighup = False
        self.fetches = 0
        """CRL fetches made (each peer once per round)."""

    @route(
        "GET",
        CRL_PATH,
        callers=READ,
        answers=((200, "the CRL"), (204, "no CRL newer than `after`")),
        errors=[Refusal(400, "bad_request", "after is not an integer")],
        params=(("after", "query", "the CRL number held (default -1)", {"type": "integer"}),),
        answer=TEXT,
        answer_type="application/pkix-crl",
    )
    async def _handle_crl(self, request: web.Request) -> web.Response:
        """The CRL this node uses (PEM) and its number in X-Shoal-Crl-Number; ?after=N answers
        204 unless it is newer than N (nodes with auth tls or hmac+tls only)"""
        after_text = request.query.get("after", "-1")
        try:
            after = int(after_text)
        except ValueError:
            raise web.HTTPBadRequest(reason=f"after={after_text!r}: an integer") from None
        pem = self._contexts.crl_pem()
        number = self._contexts.material.crl_number
        if pem is None or number <= after:
            return web.Response(status=204, headers={CRL_NUMBER_HEADER: str(number)})
        return web.Response(
            body=pem,
            content_type="application/pkix-crl",
            headers={CRL_NUMBER_HEADER: str(number)},
        )

    def start(self) -> None:
        runtime = self._runtime
        self._client = PeerClient(
            Identity(None, runtime.node_id, runtime.settings.cluster_name),
            timeouts=runtime.settings.timeouts,
            tls=peer_tls(runtime),
            limit_per_peer=2,
        )
        self._tasks = [
            asyncio.create_task(self._watch_files(), name="tls-file-watch"),
            asyncio.create_task(self._spread(), name="tls-crl-spread"),
        ]
        if threading.current_thread() is threading.main_thread():
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self._on_sighup)
                self._sighup = True

    @property
    def handles_sighup(self) -> bool:
        return self._sighup

    def _on_sighup(self) -> None:
        log.info("SIGHUP: reloading the TLS certificate, key, CA and CRL")
        self._contexts.reload("SIGHUP")

    async def close(self) -> None:
        if self._sighup:
            with contextlib.suppress(RuntimeError, ValueError):
                asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
            self._sighup = False
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        peers, self._client = self._client, None
        if peers is not None:
            await peers.close()

    async def _watch_files(self) -> None:
        while True:
            await asyncio.sleep(FILE_CHECK_S)
            self._contexts.reload_if_changed()
            if self.revoked is not None:
                self.revoked.apply(self._runtime.membership)

    async def _spread(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            await self.refresh_once()

    def _peers(self) -> Iterable[Any]:
        membership = self._runtime.membership
        if membership is None:
            return ()
        return [
            member
            for member in membership.members()
            if not getattr(member, "is_self", False)
            and member.node_id != self._runtime.node_id
            and str(getattr(member, "state", "alive")) in SPREAD_STATES
            and member.meta.get(AUTH_META) in (AuthMode.TLS.value, AuthMode.HMAC_TLS.value)
        ]

    async def refresh_once(self) -> int:
        """Fetch the CRL of every TLS member that has not left (alive, suspect or dead) once
        and install the newest; the CRL number in use afterwards."""
        peers = list(self._peers())
        await asyncio.gather(*(self._fetch(peer) for peer in peers))
        return self._contexts.material.crl_number

    def _note(self, peer: str, message: str, *args: object) -> None:
        level = logging.WARNING if peer not in self._warned else logging.DEBUG
        self._warned.add(peer)
        log.log(level, message, *args)

    async def _fetch(self, member: Any) -> None:
        peers = self._client
        if peers is None:
            return
        host = f"[{member.address}]" if ":" in member.address else member.address
        address = f"{host}:{member.port}"
        url = peers.base_url(address) + CRL_PATH
        number = self._contexts.material.crl_number
        self.fetches += 1
        try:
            answer = await peers.request(
                "GET", address, CRL_PATH, params={"after": str(number)}, check=False
            )
        except NetError as exc:
            self._note(member.node_id, "CRL of %s (%s) not fetched: %s", member.node_id, url, exc)
            return
        if answer.status == 204:
            self._warned.discard(member.node_id)
            return
        if answer.status != 200:
            self._note(
                member.node_id,
                "CRL of %s: %s answered %d: %s",
                member.node_id,
                url,
                answer.status,
                answer.body[:200].decode("utf-8", "replace"),
            )
            return
        self._warned.discard(member.node_id)
        self._contexts.install_crl(answer.body, member.node_id)
