"""The gossip keyring's API: each node's own keyring (`/v1/keyring/local...`), and the cluster's
(`/v1/keyring...`), served by the coordinator, which asks every alive member over signed peer
HTTP; any other node forwards to it.

Routes: GET /v1/keyring, POST /v1/keyring/install|use|remove, and the same under
/v1/keyring/local for this node alone, each declared on its handler. Changes are an operator's;
a node relays them (to the coordinator, and from it to every member).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping

from aiohttp import web

from config.declare import READ, Caller, Refusal, route
from net import Identity, PeerClient, PeerRequestError
from node.access import FORWARDED_HEADER
from node.audit.entries import record_audit
from node.component import Check, Endpoint, endpoints
from node.errors import BodyError, KeyringError, KeyringRefused
from node.forwarding import forward_headers
from node.identity.peers import peer_tls
from node.keyring.wire import (
    KEYRING_PATH,
    LOCAL_PATH,
    OPERATIONS,
    ChangeAnswer,
    ClusterAnswer,
    InstallBody,
    KeyIdBody,
    LocalAnswer,
    summarize,
)
from node.membership.keyring import (
    GossipKeys,
    decode_key,
    key_id,
    unwrap_key,
    valid_key_id,
    wrap_key,
)
from node.openapi import check_body, parse_body
from node.runtime import NodeRuntime
from node.security import request_sender

log = logging.getLogger(__name__)

JSON = "application/json"
AUDIT_TYPES = {op: f"keyring.{op}" for op in OPERATIONS}
"""The WAL entry type each change of a node's keyring is recorded under (audit kind keyring)."""
_UP = ("alive", "suspect")
_STATUS = {"bad_key": 400, "unknown_key": 404, "key_in_use": 409, "keyring_file": 500}


def _checked(model: type[InstallBody] | type[KeyIdBody], raw: bytes) -> InstallBody | KeyIdBody:
    try:
        body = parse_body(model, raw)
    except BodyError as exc:
        raise KeyringRefused(400, "bad_key", exc.reason) from None
    if isinstance(body, KeyIdBody) and not valid_key_id(body.key_id):
        raise KeyringRefused(400, "bad_key", f"{body.key_id!r} is not a key id (16 hex chars)")
    return body


@contextlib.contextmanager
def keyring_errors() -> Iterator[None]:
    """A KeyringError of the keyring underneath, raised as the answer it gets."""
    try:
        yield
    except KeyringError as exc:
        raise KeyringRefused(_STATUS.get(exc.code, 500), exc.code, str(exc)) from exc


def _over_tls(request: web.Request) -> bool:
    transport = request.transport
    return transport is not None and transport.get_extra_info("ssl_object") is not None


CLUSTER_ERRORS = (
    Refusal(400, "bad_key", "bad request"),
    Refusal(404, "unknown_key", "no member holds the key"),
    Refusal(409, "key_in_use", "refused: key_in_use or key_missing, nothing changed"),
    Refusal(503, "not_coordinator", "no coordinator, or the coordinator is unreachable"),
)
LOCAL_ERRORS = (
    Refusal(400, "bad_key", "bad request"),
    Refusal(404, "unknown_key", "the key is not installed here"),
    Refusal(409, "key_in_use", "the key is in use, or this node has no keyring"),
)


Handler = Callable[["KeyringRoutes", web.Request], Awaitable[web.Response]]


def _change(
    path: str, body: type[InstallBody] | type[KeyIdBody], *, local: bool
) -> Callable[[Handler], Handler]:
    """The declaration of a change: of this node's keyring (`local`), or on every alive
    member."""
    return route(
        "POST",
        path,
        callers=[Caller.OPERATOR],
        forwarded=True,
        answers=(
            (200, "this node's keyring after the change")
            if local
            else (200, "done on the members in acked; failed names the others"),
        ),
        errors=LOCAL_ERRORS if local else CLUSTER_ERRORS,
        body=body,
        answer=LocalAnswer if local else ChangeAnswer,
    )


class KeyringRoutes:
    """The keyring routes of one node; `keys` None: a node without a keyring (no cluster
    secret and no keyring.json), whose local routes answer 409 no_keyring."""

    def __init__(self, runtime: NodeRuntime, keys: GossipKeys | None, secret: bytes | None):
        self.runtime = runtime
        self.keys = keys
        self._secret = secret
        self._client: PeerClient | None = None

    async def open(self) -> None:
        settings = self.runtime.settings
        identity = Identity(self._secret, self.runtime.node_id, settings.cluster_name)
        self._client = PeerClient(identity, timeouts=settings.timeouts, tls=peer_tls(self.runtime))

    async def close(self) -> None:
        """Close the peer client. Idempotent."""
        if self._client is not None:
            await self._client.close()
            self._client = None

    def routes(self) -> list[Endpoint]:
        return endpoints(self)

    def checks(self) -> Mapping[str, Check]:
        return {}

    # this node

    def _ring(self) -> GossipKeys:
        if self.keys is None:
            raise KeyringRefused(
                409,
                "no_keyring",
                f"node {self.runtime.node_id} has no gossip keyring (it runs without a cluster "
                "secret and no keyring.json in its data dir)",
            )
        return self.keys

    def local_state(self) -> LocalAnswer:
        keys = self._ring()
        ring = keys.ring
        return LocalAnswer(
            node=self.runtime.node_id, primary=ring.primary, keys=ring.ids, file=str(keys.path)
        )

    @route(
        "GET",
        LOCAL_PATH,
        callers=READ,
        answers=((200, "this node's keyring"),),
        errors=[Refusal(409, "no_keyring", "this node has no keyring")],
        answer=LocalAnswer,
    )
    async def _handle_local_list(self, request: web.Request) -> web.Response:
        """This node's gossip keyring: its key ids and the one it seals with"""
        return web.json_response(self.local_state().to_json())

    @_change(f"{LOCAL_PATH}/install", InstallBody, local=True)
    async def _local_install(self, request: web.Request) -> web.Response:
        """This node only: install a key {"key"}; recorded in the WAL (audit kind keyring)"""
        return await self._local("install", request)

    @_change(f"{LOCAL_PATH}/use", KeyIdBody, local=True)
    async def _local_use(self, request: web.Request) -> web.Response:
        """This node only: seal with key {"key_id"} (404 when not installed); recorded in the
        WAL (audit kind keyring)"""
        return await self._local("use", request)

    @_change(f"{LOCAL_PATH}/remove", KeyIdBody, local=True)
    async def _local_remove(self, request: web.Request) -> web.Response:
        """This node only: remove key {"key_id"} (409 when in use); recorded in the WAL (audit
        kind keyring)"""
        return await self._local("remove", request)

    def _open_key(self, body: InstallBody, over_tls: bool) -> bytes:
        """The key of an install: unsealed with the cluster secret, or taken plain when it came
        inside TLS (or this node has no secret: dev mode); KeyringRefused 400 `bad_key` for a
        plain key over plain HTTP (it crossed the network readable)."""
        if body.sealed == "secret":
            return unwrap_key(body.key, self._secret, self.runtime.settings.cluster_name)
        if not over_tls and self._secret is not None:
            raise KeyringRefused(
                400,
                "bad_key",
                "a key not sealed with the cluster secret is taken only over TLS: call https "
                "with an operator certificate (SHOAL_TLS_*), or seal it with the secret",
            )
        return decode_key(body.key, "the request's key")

    async def apply_local(
        self, op: str, body: InstallBody | KeyIdBody, key: bytes | None = None
    ) -> LocalAnswer:
        """Change this node's keyring (written before the answer), recorded in the WAL; `key`
        is an install's key when already opened (else opened from `body`, sealed)."""
        keys = self._ring()
        if isinstance(body, InstallBody):
            kid = keys.install(key if key is not None else self._open_key(body, over_tls=False))
        elif op == "use":
            kid = body.key_id
            keys.use(kid)
        else:
            kid = body.key_id
            keys.remove(kid)
        log.warning("gossip keyring: %s key %s (now in use: %s)", op, kid, keys.ring.primary)
        payload = {"name": kid, "in_use": keys.ring.primary}
        if body.requested_by:
            payload["requested_by"] = body.requested_by
        await record_audit(self.runtime.wal, AUDIT_TYPES[op], payload, self.runtime.node_id)
        return self.local_state()

    async def _local(self, op: str, request: web.Request) -> web.Response:
        body = _checked(InstallBody if op == "install" else KeyIdBody, await request.read())
        with keyring_errors():
            key = None
            if isinstance(body, InstallBody):
                key = self._open_key(body, _over_tls(request))
            return web.json_response((await self.apply_local(op, body, key)).to_json())

    # the cluster, from the coordinator

    def _peers(self) -> dict[str, str]:
        """Every other member that is up: node id -> its API URL."""
        membership = self.runtime.membership
        found: dict[str, str] = {}
        for member in membership.members() if membership is not None else []:
            if member.node_id != self.runtime.node_id and str(member.state) in _UP:
                found[member.node_id] = f"{member.address}:{member.port}"
        return found

    async def _call(
        self, node: str, url: str, method: str, path: str, body: InstallBody | KeyIdBody | None
    ) -> LocalAnswer:
        """A member's keyring as its local route answers (KeyringRefused naming the field of
        an answer that is not one)."""
        if self._client is None:
            raise KeyringRefused(503, "keyring_closed", "the keyring service is not running")
        # a change is the operator's, relayed by the coordinator to each member
        headers = {FORWARDED_HEADER: self.runtime.node_id} if method == "POST" else None
        try:
            sent = None if body is None else body.model_dump()
            status, answer = await self._client.call_json(method, url, path, sent, headers=headers)
        except PeerRequestError as exc:
            raise KeyringRefused(503, "unreachable", f"unreachable: {exc.reason}") from exc
        if status != 200 or not isinstance(answer, dict):
            reason = answer.get("reason") if isinstance(answer, dict) else answer
            raise KeyringRefused(status, "refused", f"{status}: {reason}")
        try:
            return check_body(LocalAnswer, answer)
        except BodyError as exc:
            raise KeyringRefused(502, "malformed_answer", f"malformed answer: {exc}") from None

    async def _everyone(
        self,
        method: str,
        path: str,
        body: InstallBody | KeyIdBody | None,
        local: Callable[[], Awaitable[LocalAnswer]],
    ) -> tuple[dict[str, LocalAnswer], dict[str, str]]:
        """Ask this node (`local`) and every other member that is up; (answers, failures)."""
        peers = self._peers()

        async def one(node: str, url: str | None) -> tuple[str, LocalAnswer | str]:
            try:
                return node, await (
                    local() if url is None else self._call(node, url, method, path, body)
                )
            except (KeyringRefused, KeyringError) as exc:
                return node, str(exc)

        results = await asyncio.gather(
            one(self.runtime.node_id, None), *(one(node, url) for node, url in peers.items())
        )
        answers = {node: r for node, r in results if isinstance(r, LocalAnswer)}
        failed = {node: r for node, r in results if isinstance(r, str)}
        return answers, failed

    async def _forward(self, request: web.Request) -> web.Response | None:
        """None when this node coordinates; otherwise the coordinator's answer to the request."""
        runtime = self.runtime
        runtime.refresh()
        coordinator = runtime.coordinator
        if coordinator == runtime.node_id and runtime.term is not None:
            return None
        if request.headers.get(FORWARDED_HEADER) or coordinator is None:
            who = "no coordinator yet" if coordinator is None else f"{coordinator} coordinates"
            raise KeyringRefused(503, "not_coordinator", f"node {runtime.node_id}: {who}; retry")
        url = self._peers().get(coordinator)
        if url is None:
            raise KeyringRefused(
                503, "coordinator_unknown", f"coordinator {coordinator} not in view"
            )
        if self._client is None:
            raise KeyringRefused(503, "keyring_closed", "the keyring service is not running")
        headers = {**forward_headers(request, runtime.node_id), "Content-Type": JSON}
        try:  # the operator's request as it came, with its proof (node.forwarding)
            answer = await self._client.request(
                request.method,
                url,
                request.raw_path,
                data=await request.read(),
                headers=headers,
                timeout_s=3 * runtime.settings.timeouts.http_request_s,
                check=False,
            )
            data = answer.json() if answer.body else None
        except (PeerRequestError, ValueError) as exc:
            reason = exc.reason if isinstance(exc, PeerRequestError) else "not JSON"
            raise KeyringRefused(
                503, "coordinator_unreachable", f"{coordinator}: {reason}"
            ) from exc
        return web.json_response(data, status=answer.status)

    async def _local_answer(self) -> LocalAnswer:
        return self.local_state()

    @route(
        "GET",
        KEYRING_PATH,
        callers=READ,
        answers=((200, "the keys of every member"),),
        errors=[CLUSTER_ERRORS[-1]],
        answer=ClusterAnswer,
    )
    async def _handle_list(self, request: web.Request) -> web.Response:
        """The cluster's gossip keys (from the coordinator, which asks every alive member):
        each key id, how many members hold it, which members seal with it; never a key's
        bytes"""
        forwarded = await self._forward(request)
        if forwarded is not None:
            return forwarded
        members, failed = await self._everyone("GET", LOCAL_PATH, None, self._local_answer)
        answer = ClusterAnswer(
            coordinator=self.runtime.node_id,
            members=members,
            keys=summarize(members),
            failed=failed,
        )
        return web.json_response(answer.to_json())

    @_change(f"{KEYRING_PATH}/install", InstallBody, local=False)
    async def _install(self, request: web.Request) -> web.Response:
        """Install a key {"key"} on every alive member: accepted on receipt there; answers which
        members acknowledged and which did not"""
        return await self._changed("install", request)

    @_change(f"{KEYRING_PATH}/use", KeyIdBody, local=False)
    async def _use(self, request: web.Request) -> web.Response:
        """Seal with key {"key_id"} on every alive member (each must hold it: else 409
        key_missing naming them); answers which members acknowledged and which did not"""
        return await self._changed("use", request)

    @_change(f"{KEYRING_PATH}/remove", KeyIdBody, local=False)
    async def _remove(self, request: web.Request) -> web.Response:
        """Remove key {"key_id"} from every alive member; 409 key_in_use while any member seals
        with it; answers which members acknowledged and which did not"""
        return await self._changed("remove", request)

    async def _changed(self, op: str, request: web.Request) -> web.Response:
        body = _checked(InstallBody if op == "install" else KeyIdBody, await request.read())
        if body.requested_by is None:  # who asked, kept across the forward (audit)
            body = body.model_copy(update={"requested_by": request_sender()})
        forwarded = await self._forward(request)
        if forwarded is not None:
            return forwarded
        with keyring_errors():
            answer = await self.change(op, body, _over_tls(request))
            return web.json_response(answer.to_json())

    async def change(
        self, op: str, body: InstallBody | KeyIdBody, over_tls: bool = False
    ) -> ChangeAnswer:
        """On the coordinator: check the change against every member's keyring, then make it
        on each (this node too); KeyringRefused when it would strand a member. An install's
        key goes on sealed with the secret, or plain (`tls`) from a node without one, which
        calls its peers over TLS."""
        requested_by = body.requested_by
        cluster = self.runtime.settings.cluster_name
        key = None
        sent: InstallBody | KeyIdBody
        if isinstance(body, InstallBody):
            key = self._open_key(body, over_tls)
            kid = key_id(key)
            sent = InstallBody(
                key=wrap_key(key, self._secret, cluster),
                sealed="secret" if self._secret is not None else "tls",
                requested_by=requested_by,
            )
        else:
            kid = body.key_id
            sent = KeyIdBody(key_id=kid, requested_by=requested_by)
            members, _ = await self._everyone("GET", LOCAL_PATH, None, self._local_answer)
            self._precheck(op, kid, members)
        answers, failed = await self._everyone(
            "POST", f"{LOCAL_PATH}/{op}", sent, lambda: self.apply_local(op, sent, key)
        )
        if failed:
            log.warning("gossip keyring %s %s: not acknowledged by %s", op, kid, failed)
        return ChangeAnswer(
            op=op,
            key_id=kid,
            coordinator=self.runtime.node_id,
            acked=sorted(answers),
            failed=failed,
        )

    @staticmethod
    def _precheck(op: str, kid: str, members: dict[str, LocalAnswer]) -> None:
        holders = sorted(n for n, state in members.items() if kid in state.keys)
        if not holders:
            raise KeyringRefused(404, "unknown_key", f"no member holds key {kid}")
        if op == "use":
            lacking = sorted(set(members) - set(holders))
            if lacking:
                raise KeyringRefused(
                    409,
                    "key_missing",
                    f"members {', '.join(lacking)} lack key {kid}: they would refuse every "
                    "datagram sealed with it; install it there first (nothing changed)",
                )
        elif op == "remove":
            users = sorted(n for n, state in members.items() if state.primary == kid)
            if users:
                raise KeyringRefused(
                    409,
                    "key_in_use",
                    f"key {kid} is in use on {', '.join(users)}; `shoal keyring use` another "
                    "key first (nothing changed)",
                )
