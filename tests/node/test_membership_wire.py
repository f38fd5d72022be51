"""The wire format, the envelope, datagram budgets and the event log policy."""

from __future__ import annotations

import asyncio
import json
import logging
import random

import pytest

from config.timeouts import Timeouts
from node.errors import MembershipError, WireError
from node.membership import types, wire
from node.membership.envelope import MAX_DATAGRAM_BYTES, Drop, Envelope
from node.membership.events import EventHub
from node.membership.service import Membership
from node.membership.transport import DatagramHandler, TransportStats
from node.membership.types import (
    EventKind,
    Member,
    MemberState,
    MemberView,
    Update,
    freeze_meta,
)
from node.membership.wire import (
    Message,
    MessageKind,
    decode_message,
    decode_update,
    encode_message,
    encode_update,
    state_chunks,
)

META = freeze_meta(
    {
        "version": "0.1.0",
        "role": "training",
        "cluster": "lab",
        "gpu_count": 8,
        "gpu_vram_gb": 80.0,
        "gpu": "NVIDIA H100 80GB HBM3",
        "config_hash": "3f9a1c27be0d",
        "spare": None,
        "ready": True,
    }
)
ALIVE = Update("n7", MemberState.ALIVE, 4, "10.0.0.7", 8770, META)
SUSPECT = Update("n8", MemberState.SUSPECT, 2, by="n1")


@pytest.mark.parametrize(
    "message",
    [
        Message(MessageKind.PING, "n1", 17, target="n2", updates=(ALIVE, SUSPECT)),
        Message(MessageKind.PING, "n1", 18, target=None),
        Message(MessageKind.ACK, "n2", 17, updates=(Update("n9", MemberState.LEFT, 0),)),
        Message(MessageKind.NACK, "n3", 17),
        Message(MessageKind.PING_REQ, "n1", 19, "n2", "10.0.0.2", 8770, updates=(SUSPECT,)),
        Message(MessageKind.SYNC, "n1", 20, digest="00ff00ff00ff00ff"),
        Message(MessageKind.STATE, "n1", 21, chunk=2, chunks=3, reply=True, updates=(ALIVE,)),
        Message(MessageKind.GOSSIP, "n1", 0, updates=(Update("n9", MemberState.DEAD, 5, by="n3"),)),
    ],
)
def test_messages_round_trip(message: Message) -> None:
    body = encode_message(message)
    assert decode_message(body) == message
    assert json.loads(body)["t"] == message.kind.value


def test_bodies_are_compact() -> None:
    ping = encode_message(Message(MessageKind.PING, "node-0017", 123456789, target="node-0042"))
    assert ping == b'{"t":"ping","f":"node-0017","s":123456789,"to":"node-0042"}'
    assert len(encode_update(ALIVE)) < 250


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[1, 2]",
        b'{"t":"hello","f":"n1","s":1}',
        b'{"t":"ping","f":"","s":1}',
        b'{"t":"ping","f":"n1","s":-1}',
        b'{"t":"ping","f":"n1","s":true}',
        b'{"t":"preq","f":"n1","s":1,"to":"n2","a":"10.0.0.2","p":70000}',
        b'{"t":"ack","f":"n1","s":1,"u":{"n":"x"}}',
        b'{"t":"ack","f":"n1","s":1,"u":[{"n":"x","k":"z","i":0}]}',
        b'{"t":"ack","f":"n1","s":1,"u":[{"n":"x","k":"a","i":0,"a":"10.0.0.1"}]}',
        b'{"t":"ack","f":"n1","s":1,"u":[{"n":"x","k":"a","i":0,"m":{"k":[1]}}]}',
        b'{"t":"ack","f":"' + b"x" * 200 + b'","s":1}',
    ],
)
def test_malformed_bodies_are_refused(body: bytes) -> None:
    with pytest.raises(WireError):
        decode_message(body)


def _variants() -> list[object]:
    """Updates as decoded JSON: well formed, and each field wrong in each way a body can be."""
    good: dict[str, object] = {
        "n": "n7",
        "k": "a",
        "i": 4,
        "a": "10.0.0.7",
        "p": 8770,
        "m": dict(META),
        "b": "n1",
    }
    wrong: dict[str, list[object]] = {
        "n": [None, "", "x" * 129, 7, ["n7"]],
        "k": [None, "z", "", 1, ["a"], {"a": 1}],
        "i": [None, -1, 2**63, True, 1.0, "4"],
        "a": [None, "", "x" * 256, 10],
        "p": [None, 0, 65536, True, "8770", 80.0],
        "m": [None, [], "m", {"k": [1]}, {"": 1}, {"k": "x" * 257}, {"k": float("nan")}],
        "b": [None, "", "x" * 129, 3],
    }
    variants: list[object] = [good, {}, [good], "n7", None]
    for key, values in wrong.items():
        variants.append({k: v for k, v in good.items() if k != key})
        variants += [{**good, key: value} for value in values]
    variants.append({**good, "m": {f"k{i}": i for i in range(33)}})
    variants.append({**good, "a": None, "p": None, "m": None})
    return variants


@pytest.mark.parametrize("raw", _variants())
def test_an_update_decodes_inline_as_the_field_by_field_checks_decode_it(raw: object) -> None:
    """decode_update checks the usual update inline and hands anything else to the checks that
    name the wrong field: both must accept and refuse the same updates, alike."""
    try:
        expected: object = wire._checked_update(raw)
    except WireError as exc:
        expected = str(exc)
    try:
        decoded: object = decode_update(raw)
    except WireError as exc:
        decoded = str(exc)
    assert decoded == expected


class _Text(str):
    pass


@pytest.mark.parametrize(
    "meta",
    [
        dict(META),
        {},
        {"k": float("nan")},
        {"k": float("inf")},
        {"k": -2.5},
        {"k": "x" * 256},
        {"k": "x" * 257},
        {"k": [1]},
        {"k": {"a": 1}},
        {"k": b"x"},
        {"": 1},
        {"k" * 65: 1},
        {7: 1},
        {"k": _Text("a subclass of str")},
        {"k": True, "j": None, "i": -(2**70)},
    ],
)
def test_meta_is_frozen_inline_as_the_key_by_key_checks_freeze_it(
    meta: dict[object, object],
) -> None:
    """freeze_meta copies the usual meta in one call and hands anything else to the checks that
    name the wrong key: both must accept and refuse the same meta, alike."""
    results = []
    for freeze in (types.freeze_meta, types._checked_meta):
        try:
            results.append(dict(freeze(meta)))  # type: ignore[arg-type]
        except MembershipError as exc:
            results.append(str(exc))
    assert results[0] == results[1]


def test_envelope_signs_and_refuses_forgeries() -> None:
    signed = Envelope("lab", b"secret")
    now = 1_700_000_000.0
    datagram = signed.seal(b'{"t":"ping"}', now, boot=7, seq=1)
    assert signed.open(datagram, now + 299).body == b'{"t":"ping"}'
    assert signed.open(datagram.replace(b"ping", b"pong"), now).drop == Drop.BAD_MAC
    assert signed.open(datagram, now + 301).drop == Drop.STALE
    assert Envelope("lab", b"other").open(datagram, now).drop == Drop.BAD_MAC
    foreign = Envelope("prod", b"secret").open(datagram, now)
    assert (foreign.drop, foreign.cluster) == (Drop.CLUSTER, "lab")
    unlabelled = datagram.replace(b'"c":"lab",', b"", 1)
    assert signed.open(unlabelled, now).body == b'{"t":"ping"}'  # a sender naming no cluster
    assert signed.open(unlabelled, now).cluster is None
    assert Envelope("prod", b"secret").open(unlabelled, now).drop == Drop.BAD_MAC
    unsigned = Envelope("lab").seal(b"{}", now, boot=7, seq=2)
    assert signed.open(unsigned, now).drop == Drop.UNSIGNED
    assert Envelope("lab").open(unsigned, now).body == b"{}"
    assert Envelope("lab").open(datagram, now).body == b'{"t":"ping"}'
    assert signed.open(b"garbage", now).drop == Drop.MALFORMED
    assert signed.open(b'{"v":1}\n{}', now).drop == Drop.MALFORMED
    header = json.loads(datagram.split(b"\n", 1)[0])
    assert set(header) == {"v", "c", "ts", "b", "n", "mac"}
    assert (header["c"], header["b"], header["n"]) == ("lab", 7, 1)
    opened = signed.open(datagram, now)
    assert (opened.timestamp, opened.boot, opened.seq) == (int(now), 7, 1)
    for field, value in (("n", 2), ("b", 8)):  # boot and sequence are signed
        forged = datagram.replace(
            f'"{field}":{header[field]},'.encode(), f'"{field}":{value},'.encode()
        )
        assert forged != datagram
        assert signed.open(forged, now).drop == Drop.BAD_MAC
    for bad in (b'"n":-1', b'"n":true', b'"n":"1"'):
        assert signed.open(datagram.replace(b'"n":1', bad), now).drop == Drop.MALFORMED


def test_a_full_budget_body_fits_one_datagram() -> None:
    for envelope in (Envelope("lab", b"s"), Envelope("a-long-cluster-name " * 3), Envelope("é")):
        body = b"x" * envelope.body_budget
        widest = envelope.seal(body, 1_700_000_000, boot=2**63 - 1, seq=2**63 - 1)
        assert len(widest) <= MAX_DATAGRAM_BYTES


def test_full_state_is_split_into_chunks_that_fit() -> None:
    records = [
        encode_update(Update(f"node-{i:04d}", MemberState.ALIVE, i, "10.0.0.1", 8770, META))
        for i in range(300)
    ]
    budget = Envelope("lab", b"s").body_budget
    chunks = state_chunks("n1", 5, True, records, budget)
    assert len(chunks) > 40
    decoded = [decode_message(chunk) for chunk in chunks]
    assert all(len(chunk) <= budget for chunk in chunks)
    assert [m.chunk for m in decoded] == list(range(len(chunks)))
    assert {m.chunks for m in decoded} == {len(chunks)}
    assert [m.reply for m in decoded] == [True] + [False] * (len(chunks) - 1)
    assert sum(len(m.updates) for m in decoded) == 300


class RecordingTransport:
    """A transport seam that keeps what it is asked to send and checks it fits a datagram."""

    def __init__(self) -> None:
        self.envelope = Envelope("lab", b"secret")
        self.sent: list[bytes] = []
        self.handler: DatagramHandler | None = None

    @property
    def cluster(self) -> str:
        return "lab"

    @property
    def body_budget(self) -> int:
        return self.envelope.body_budget

    async def start(self, handler: DatagramHandler) -> None:
        self.handler = handler

    def send(self, body: bytes, address: tuple[str, int]) -> None:
        sealed = self.envelope.seal(body, 1_700_000_000, boot=2**62, seq=2**62)
        assert len(sealed) <= MAX_DATAGRAM_BYTES
        self.sent.append(body)

    def stats(self) -> TransportStats:
        return TransportStats()

    async def close(self) -> None:
        self.handler = None


async def test_piggyback_lists_are_trimmed_to_fit_a_datagram() -> None:
    transport = RecordingTransport()
    timeouts = Timeouts(probe_interval_s=0.02, probe_timeout_s=0.01, indirect_probe_timeout_s=0.02)
    node = Membership(
        "n0", "10.0.0.1", 8770, {}, transport, timeouts, cluster="lab", rng=random.Random(1)
    )
    known = [
        Member(f"node-{i:03d}", f"10.0.1.{i}", 8770, MemberState.ALIVE, 0, META, 0.0)
        for i in range(1, 200)
    ]
    node.preload(known)
    async with node:
        assert transport.handler is not None
        for start in range(0, 199, 10):
            news = tuple(
                Update(m.node_id, MemberState.ALIVE, 1, m.address, m.port, META)
                for m in known[start : start + 10]
            )
            gossip = Message(MessageKind.GOSSIP, known[start].node_id, 0, updates=news)
            transport.handler(encode_message(gossip), (known[start].address, 8770))
        await asyncio.sleep(0.1)
    carried = [len(decode_message(body).updates) for body in transport.sent]
    assert 4 <= max(carried) < 16  # ~220-byte updates: the byte budget, not the count, binds


def test_peer_failures_are_logged_once_at_warning_then_at_debug(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="node.membership.service")
    hub = EventHub("me", clock=lambda: 100.0)
    seen: list[EventKind] = []
    hub.add(lambda event: seen.append(event.kind))
    remove = hub.add(lambda event: 1 / 0)  # a broken listener is logged, not raised
    view = MemberView("n1", "10.0.0.1", 8770, MemberState.DEAD, 0, 1.0, META)
    hub.emit(EventKind.DEAD, view, MemberState.SUSPECT)
    hub.emit(EventKind.DEAD, view, MemberState.SUSPECT)
    remove()
    hub.emit(EventKind.DEAD, view, MemberState.SUSPECT)
    deaths = [r.levelno for r in caplog.records if "is dead" in r.getMessage()]
    assert deaths == [logging.WARNING, logging.DEBUG, logging.DEBUG]
    assert seen == [EventKind.DEAD] * 3
    assert sum("listener failed" in r.getMessage() for r in caplog.records) == 2
    assert hub.conflict(view, ("10.0.0.9", 8770))
    assert not hub.conflict(view, ("10.0.0.9", 8770))
    errors = [r for r in caplog.records if "claimed by two live nodes" in r.getMessage()]
    assert [r.levelno for r in errors] == [logging.ERROR]
