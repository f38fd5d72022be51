"""Wire format of membership datagram bodies: compact JSON, specified on `Message`; the
envelope around them is node.membership.envelope's.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

import orjson

from node.errors import MembershipError, WireError
from node.membership.types import (
    MAX_NODE_ID_CHARS,
    Member,
    MemberState,
    Update,
    freeze_meta,
)

_MAX_ADDRESS_CHARS = 255
_MAX_SEQ = 2**63
_STATE_CODE = {
    MemberState.ALIVE: "a",
    MemberState.SUSPECT: "s",
    MemberState.DEAD: "d",
    MemberState.LEFT: "l",
}
_CODE_STATE = {code: state for state, code in _STATE_CODE.items()}


class MessageKind(enum.StrEnum):
    PING = "ping"
    ACK = "ack"
    NACK = "nack"
    PING_REQ = "preq"
    SYNC = "sync"
    STATE = "state"
    GOSSIP = "gsp"


@dataclass(frozen=True, slots=True)
class Message:
    """One body: UTF-8 JSON, keys of one or two letters, per kind:

        ping   {"t":"ping","f":FROM,"s":SEQ,"to":TARGET|null,"u":[UPDATE...]}  null: join probe
        ack    {"t":"ack","f":FROM,"s":SEQ,"u":[...]}      answers a ping (or a relayed ping-req)
        nack   {"t":"nack","f":FROM,"s":SEQ}               relay: the target did not answer
        preq   {"t":"preq","f":FROM,"s":SEQ,"to":TARGET,"a":ADDR,"p":PORT,"u":[...]}  ping-req
        sync   {"t":"sync","f":FROM,"s":SEQ,"d":DIGEST}    push-pull: my view's digest
        state  {"t":"state","f":FROM,"s":SEQ,"i":CHUNK,"c":CHUNKS,"r":0|1,"u":[RECORD...]}
               one chunk of a full view; r=1 (first chunk only) asks for the receiver's view back
        gsp    {"t":"gsp","f":FROM,"s":0,"u":[...]}        eager gossip of fresh updates, no reply

    UPDATE and RECORD: {"n":ID,"k":"a"|"s"|"d"|"l","i":INCARNATION,"a":ADDR,"p":PORT,"m":{META},
    "b":BY}: state alive/suspect/dead/left; a, p and m on alive updates and full-state records,
    b (who suspects or declared dead) on suspect and dead. "u" is omitted when empty.
    """

    kind: MessageKind
    sender: str
    seq: int
    target: str | None = None
    target_address: str | None = None
    target_port: int | None = None
    digest: str | None = None
    chunk: int = 0
    chunks: int = 1
    reply: bool = False
    updates: tuple[Update, ...] = ()


def _dumps(obj: object) -> bytes:
    """Compact UTF-8 JSON (what json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
    writes, a tenth of its CPU: every datagram is encoded and decoded once)."""
    return orjson.dumps(obj)


def encode_update(update: Update) -> bytes:
    obj: dict[str, object] = {
        "n": update.node_id,
        "k": _STATE_CODE[update.state],
        "i": update.incarnation,
    }
    if update.address is not None and update.port is not None:
        obj["a"] = update.address
        obj["p"] = update.port
    if update.meta is not None:
        obj["m"] = dict(update.meta)
    if update.by is not None:
        obj["b"] = update.by
    return _dumps(obj)


def member_record(member: Member) -> Update:
    """A member as a full-state record (meta only for members that are up)."""
    up = member.state in (MemberState.ALIVE, MemberState.SUSPECT)
    return Update(
        member.node_id,
        member.state,
        member.incarnation,
        member.address,
        member.port,
        member.meta if up else None,
    )


def encode_header(message: Message) -> bytes:
    """The body of `message` without its updates (they are spliced in by `assemble`)."""
    obj: dict[str, object] = {"t": message.kind.value, "f": message.sender, "s": message.seq}
    kind = message.kind
    if kind in (MessageKind.PING, MessageKind.PING_REQ):
        obj["to"] = message.target
    if kind == MessageKind.PING_REQ:
        obj["a"] = message.target_address
        obj["p"] = message.target_port
    elif kind == MessageKind.SYNC:
        obj["d"] = message.digest
    elif kind == MessageKind.STATE:
        obj["i"] = message.chunk
        obj["c"] = message.chunks
        obj["r"] = 1 if message.reply else 0
    return _dumps(obj)


def assemble(header: bytes, blobs: Sequence[bytes]) -> bytes:
    """A body from an encoded header and encoded updates."""
    if not blobs:
        return header
    return header[:-1] + b',"u":[' + b",".join(blobs) + b"]}"


def added_size(blob_count: int, blob_bytes: int) -> int:
    """Bytes that `blob_count` updates of `blob_bytes` in all add to a header."""
    return 0 if blob_count == 0 else 6 + blob_bytes + blob_count


def encode_message(message: Message) -> bytes:
    return assemble(encode_header(message), [encode_update(u) for u in message.updates])


def state_chunks(
    sender: str, seq: int, reply: bool, blobs: Sequence[bytes], budget: int
) -> list[bytes]:
    """A full view as `state` bodies of at most `budget` bytes each (oversized records dropped)."""
    probe = Message(MessageKind.STATE, sender, seq, chunk=99999, chunks=99999, reply=reply)
    room = budget - len(encode_header(probe)) - 7
    groups: list[list[bytes]] = [[]]
    used = 0
    for blob in blobs:
        if len(blob) + 1 > room:
            continue
        if used + len(blob) + 1 > room:
            groups.append([])
            used = 0
        groups[-1].append(blob)
        used += len(blob) + 1
    return [
        assemble(
            encode_header(
                Message(
                    MessageKind.STATE,
                    sender,
                    seq,
                    chunk=i,
                    chunks=len(groups),
                    reply=reply and i == 0,
                )
            ),
            group,
        )
        for i, group in enumerate(groups)
    ]


# --- decoding -----------------------------------------------------------------------------


def _text(obj: dict[str, object], key: str, max_chars: int) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or not 0 < len(value) <= max_chars:
        raise WireError(f"field {key!r} must be a string of 1..{max_chars} chars")
    return value


def _opt_text(obj: dict[str, object], key: str, max_chars: int) -> str | None:
    return None if obj.get(key) is None else _text(obj, key, max_chars)


def _int(obj: dict[str, object], key: str, low: int, high: int) -> int:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value < high:
        raise WireError(f"field {key!r} must be an integer in {low}..{high - 1}")
    return value


def decode_update(raw: object) -> Update:
    """The update in `raw` (a decoded JSON object); WireError naming the field that is wrong."""
    if type(raw) is dict:  # every datagram but a few carries updates: check the usual inline
        get = raw.get
        node_id, code, incarnation = get("n"), get("k"), get("i")
        address, port, meta, by = get("a"), get("p"), get("m"), get("b")
        if (
            type(node_id) is str
            and 0 < len(node_id) <= MAX_NODE_ID_CHARS
            and type(code) is str
            and code in _CODE_STATE
            and type(incarnation) is int
            and 0 <= incarnation < _MAX_SEQ
            and (
                (address is None and port is None)
                or (
                    type(address) is str
                    and 0 < len(address) <= _MAX_ADDRESS_CHARS
                    and type(port) is int
                    and 0 < port < 65536
                )
            )
            and (by is None or (type(by) is str and 0 < len(by) <= MAX_NODE_ID_CHARS))
            and (meta is None or type(meta) is dict)
        ):
            try:
                frozen = None if meta is None else freeze_meta(meta)
            except MembershipError as exc:
                raise WireError(str(exc)) from exc
            return Update(node_id, _CODE_STATE[code], incarnation, address, port, frozen, by)
    return _checked_update(raw)


def _checked_update(raw: object) -> Update:
    if not isinstance(raw, dict):
        raise WireError("an update must be an object")
    state = _CODE_STATE.get(str(raw.get("k")))
    if state is None:
        raise WireError(f"unknown member state {raw.get('k')!r}")
    address = _opt_text(raw, "a", _MAX_ADDRESS_CHARS)
    port = None if raw.get("p") is None else _int(raw, "p", 1, 65536)
    if (address is None) != (port is None):
        raise WireError("address and port travel together")
    meta_raw = raw.get("m")
    if meta_raw is not None and not isinstance(meta_raw, dict):
        raise WireError("meta must be an object")
    try:
        meta = None if meta_raw is None else freeze_meta(meta_raw)
    except MembershipError as exc:
        raise WireError(str(exc)) from exc
    return Update(
        node_id=_text(raw, "n", MAX_NODE_ID_CHARS),
        state=state,
        incarnation=_int(raw, "i", 0, _MAX_SEQ),
        address=address,
        port=port,
        meta=meta,
        by=_opt_text(raw, "b", MAX_NODE_ID_CHARS),
    )


def decode_message(body: bytes) -> Message:
    """The message in `body`; WireError when it is not one."""
    try:
        raw = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise WireError(f"body is not JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise WireError("body must be an object")
    try:
        kind = MessageKind(str(raw.get("t")))
    except ValueError as exc:
        raise WireError(f"unknown message type {raw.get('t')!r}") from exc
    updates_raw = raw.get("u", [])
    if not isinstance(updates_raw, list):
        raise WireError("updates must be a list")
    target_port = None
    if kind == MessageKind.PING_REQ:
        target_port = _int(raw, "p", 1, 65536)
    return Message(
        kind=kind,
        sender=_text(raw, "f", MAX_NODE_ID_CHARS),
        seq=_int(raw, "s", 0, _MAX_SEQ),
        target=_opt_text(raw, "to", MAX_NODE_ID_CHARS),
        target_address=_text(raw, "a", _MAX_ADDRESS_CHARS) if target_port else None,
        target_port=target_port,
        digest=_opt_text(raw, "d", 64) if kind == MessageKind.SYNC else None,
        chunk=_int(raw, "i", 0, 1 << 20) if kind == MessageKind.STATE else 0,
        chunks=_int(raw, "c", 1, 1 << 20) if kind == MessageKind.STATE else 1,
        reply=raw.get("r") == 1,
        updates=tuple(decode_update(u) for u in updates_raw),
    )
