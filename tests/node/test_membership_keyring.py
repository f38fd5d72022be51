"""The gossip keyring: the AES-256-GCM envelope (v3), the keyring file, the v2 peers of the
previous release, and a live rotation under SWIM on the in-memory network."""

from __future__ import annotations

import json
import logging
import os
import random
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from node.errors import KeyringError
from node.membership.channel import SealedChannel
from node.membership.envelope import (
    ENVELOPE_VERSION,
    MAX_DATAGRAM_BYTES,
    SEALED_VERSION,
    Drop,
    Envelope,
)
from node.membership.keyring import (
    KEYRING_FILE,
    GossipKeys,
    Keyring,
    derived_key,
    key_id,
    new_key,
    read_key_file,
    unwrap_key,
    wrap_key,
    write_key_file,
)
from node.membership.service import InMemoryNetwork, Membership
from node.membership.types import EventKind, MemberState
from tests.node.membership_sim import FAST, PORT, host, wait_for

SECRET = b"s" * 32
NOW = 1_700_000_000.0
MARKER = b"MARKER-0123456789abcdef-payload-that-must-never-travel-in-clear"


def _keys(tmp_path: Path, name: str, *keys: bytes, primary: bytes | None = None) -> GossipKeys:
    folder = tmp_path / name
    folder.mkdir(parents=True, exist_ok=True)
    ring = Keyring.of(list(keys), primary if primary is not None else keys[0])
    path = folder / KEYRING_FILE
    path.write_bytes(ring.to_json())
    path.chmod(0o600)
    return GossipKeys(path, ring)


def _header(datagram: bytes) -> dict[str, object]:
    head: dict[str, object] = json.loads(datagram[: datagram.index(b"\n")])
    return head


# --- the envelope ---------------------------------------------------------------------------


def test_sealed_datagram_hides_the_body_and_names_its_key(tmp_path: Path) -> None:
    k1 = new_key()
    envelope = Envelope("lab", SECRET, keys=_keys(tmp_path, "a", k1))
    datagram = envelope.seal(MARKER, NOW, boot=5, seq=9)
    assert MARKER not in datagram
    assert b'"ts"' not in datagram
    assert b'"mac"' not in datagram
    assert _header(datagram) == {"v": SEALED_VERSION, "c": "lab", "k": key_id(k1)}
    opened = envelope.open(datagram, NOW + 1)
    assert (opened.body, opened.drop, opened.boot, opened.seq) == (MARKER, None, 5, 9)
    assert (opened.version, opened.key_id, opened.timestamp) == (SEALED_VERSION, key_id(k1), NOW)
    assert len(envelope.seal(b"x" * envelope.body_budget, NOW, boot=2**62, seq=2**62)) <= (
        MAX_DATAGRAM_BYTES
    )


def test_any_byte_tampered_is_refused(tmp_path: Path) -> None:
    k1, k2 = new_key(), new_key()
    envelope = Envelope("lab", SECRET, keys=_keys(tmp_path, "a", k1, k2))
    datagram = envelope.seal(MARKER, NOW, boot=1, seq=1)
    newline = datagram.index(b"\n")
    for index in range(newline + 1, len(datagram)):
        tampered = bytearray(datagram)
        tampered[index] ^= 0x01
        assert envelope.open(bytes(tampered), NOW).drop == Drop.BAD_MAC, index
    # the key id is bound too: naming the other installed key does not open it
    swapped = datagram.replace(key_id(k1).encode(), key_id(k2).encode(), 1)
    assert envelope.open(swapped, NOW).drop == Drop.BAD_MAC
    # so is the cluster id: a datagram moved to another cluster's header fails
    other = Envelope("lab2", SECRET, keys=_keys(tmp_path, "b", k1, k2))
    moved = datagram.replace(b'"c":"lab"', b'"c":"lab2"', 1)
    assert other.open(moved, NOW).drop == Drop.BAD_MAC
    assert envelope.open(datagram[: newline + 20], NOW).drop == Drop.MALFORMED


def test_unknown_key_is_refused_with_its_id_named(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    k1, k2 = new_key(), new_key()
    sender = Envelope("lab", SECRET, keys=_keys(tmp_path, "a", k2))
    receiver = SealedChannel(Envelope("lab", SECRET, keys=_keys(tmp_path, "b", k1)))
    datagram = sender.seal(MARKER, NOW, boot=1, seq=1)
    opened = receiver.open(datagram, NOW, "10.0.0.2:7000")
    assert (opened.body, opened.drop, opened.key_id) == (None, Drop.UNKNOWN_KEY, key_id(k2))
    with caplog.at_level(logging.DEBUG, "node.membership.channel"):
        receiver.note(opened, "10.0.0.2:7000")
        receiver.note(opened, "10.0.0.2:7000")
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, "once per key id at WARNING, then DEBUG"
    assert key_id(k2) in warnings[0].getMessage()
    assert "10.0.0.2:7000" in warnings[0].getMessage()
    plain = Envelope("lab")  # a node with no keyring names the key too
    assert plain.open(datagram, NOW).key_id == key_id(k2)


def test_every_installed_key_opens_and_the_key_in_use_seals(tmp_path: Path) -> None:
    k1, k2 = new_key(), new_key()
    old = Envelope("lab", SECRET, keys=_keys(tmp_path, "a", k1))
    new = Envelope("lab", SECRET, keys=_keys(tmp_path, "b", k2))
    both = Envelope("lab", SECRET, keys=_keys(tmp_path, "c", k1, k2, primary=k2))
    assert both.open(old.seal(b"{}", NOW, boot=1, seq=1), NOW).body == b"{}"
    assert both.open(new.seal(b"{}", NOW, boot=1, seq=2), NOW).body == b"{}"
    assert _header(both.seal(b"{}", NOW, boot=1, seq=1))["k"] == key_id(k2)


def test_nonces_never_repeat(tmp_path: Path) -> None:
    envelope = Envelope("lab", SECRET, keys=_keys(tmp_path, "a", new_key()))
    nonces = set()
    for _ in range(20_000):
        datagram = envelope.seal(b"{}", NOW, boot=1, seq=1)  # the same plaintext every time
        nonce = datagram[datagram.index(b"\n") + 1 :][:12]
        nonces.add(nonce)
    assert len(nonces) == 20_000


def test_stale_sealed_datagram_is_refused(tmp_path: Path) -> None:
    envelope = Envelope("lab", SECRET, max_skew_s=30, keys=_keys(tmp_path, "a", new_key()))
    datagram = envelope.seal(b"{}", NOW, boot=1, seq=1)
    assert envelope.open(datagram, NOW + 31).drop == Drop.STALE
    assert envelope.open(datagram, NOW + 29).drop is None


def test_previous_release_peer_is_accepted_and_answered_in_v2(tmp_path: Path) -> None:
    """A node of the previous release seals v2 with the cluster secret: a keyring node takes
    it and answers that peer in v2 (all it reads) until the peer sends v3."""
    old = Envelope("lab", SECRET)
    channel = SealedChannel(Envelope("lab", SECRET, keys=_keys(tmp_path, "a", new_key())))
    peer = "10.0.0.9:7000"
    assert _header(channel.seal(b"{}", NOW, peer))["v"] == SEALED_VERSION
    assert channel.open(old.seal(b"{}", NOW, boot=3, seq=1), NOW, peer).body == b"{}"
    answer = channel.seal(b"{}", NOW, peer)
    assert _header(answer)["v"] == ENVELOPE_VERSION
    assert old.open(answer, NOW).body == b"{}"
    assert _header(channel.seal(b"{}", NOW, "10.0.0.8:7000"))["v"] == SEALED_VERSION
    upgraded = Envelope("lab", SECRET, keys=channel.envelope.keys)
    assert channel.open(upgraded.seal(b"{}", NOW, boot=4, seq=1), NOW, peer).body == b"{}"
    assert _header(channel.seal(b"{}", NOW, peer))["v"] == SEALED_VERSION
    # a forged v2 (wrong secret) is not a way in, nor one unsigned when the node has a keyring
    forged = Envelope("lab", b"x" * 32).seal(b"{}", NOW, boot=5, seq=1)
    assert channel.open(forged, NOW, peer).drop == Drop.BAD_MAC
    keyring_only = Envelope("lab", None, keys=channel.envelope.keys)
    assert keyring_only.open(Envelope("lab").seal(b"{}", NOW, boot=6, seq=1), NOW).drop == (
        Drop.UNSIGNED
    )


def test_a_keyring_copied_in_is_taken_on_the_next_unknown_key(tmp_path: Path) -> None:
    k1, k2 = new_key(), new_key()
    keys = _keys(tmp_path, "a", k1)
    channel = SealedChannel(Envelope("lab", SECRET, keys=keys))
    datagram = Envelope("lab", SECRET, keys=_keys(tmp_path, "b", k2)).seal(
        b"{}", NOW, boot=1, seq=1
    )
    assert channel.open(datagram, NOW).drop == Drop.UNKNOWN_KEY
    copied = Keyring.of([k1], k2).to_json()
    keys.path.write_bytes(copied)
    os.utime(keys.path, ns=(1, 1))  # a stamp surely unlike the one seen at open
    assert channel.open(datagram, NOW + 0.1).drop == Drop.UNKNOWN_KEY, "rate limited"
    assert channel.open(datagram, NOW + 2).body == b"{}"
    assert keys.ring.primary == key_id(k2)


# --- the keyring file -----------------------------------------------------------------------


def test_first_start_derives_the_same_key_on_every_node(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = GossipKeys.open(tmp_path / "a", secret=SECRET, cluster="lab")
    b = GossipKeys.open(tmp_path / "b", secret=SECRET, cluster="lab")
    assert a is not None
    assert b is not None
    assert a.ring.primary == b.ring.primary == key_id(derived_key(SECRET, "lab"))
    assert stat.S_IMODE(a.path.stat().st_mode) == 0o600
    other = derived_key(SECRET, "lab2")
    assert key_id(other) != a.ring.primary, "another cluster derives another key"
    assert GossipKeys.open(tmp_path / "none", secret=None, cluster="lab") is None


def test_changes_are_written_and_survive_a_reopen(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    keys = GossipKeys.open(tmp_path / "a", secret=SECRET, cluster="lab")
    assert keys is not None
    first = keys.ring.primary
    k2 = new_key()
    assert keys.install(k2) == key_id(k2)
    assert keys.install(k2) == key_id(k2), "installing again is a no-op"
    keys.use(key_id(k2))
    with pytest.raises(KeyringError, match="key in use") as refused:
        keys.remove(key_id(k2))
    assert refused.value.code == "key_in_use"
    with pytest.raises(KeyringError) as unknown:
        keys.use("0" * 16)
    assert unknown.value.code == "unknown_key"
    keys.remove(first)
    again = GossipKeys.open(tmp_path / "a", secret=SECRET, cluster="lab")
    assert again is not None
    assert (again.ring.ids, again.ring.primary) == ([key_id(k2)], key_id(k2))
    assert stat.S_IMODE(keys.path.stat().st_mode) == 0o600


def test_keyring_readable_by_others_is_refused_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    keys = GossipKeys.open(tmp_path / "a", secret=SECRET, cluster="lab")
    assert keys is not None
    keys.path.chmod(0o640)
    with pytest.raises(KeyringError, match=r"keyring\.json.*readable by group or others.*chmod"):
        GossipKeys.open(tmp_path / "a", secret=SECRET, cluster="lab")
    keys.path.chmod(0o600)
    keys.path.write_text('{"primary": "nope", "keys": []}')
    with pytest.raises(KeyringError, match="holds no key"):
        GossipKeys.open(tmp_path / "a", secret=SECRET, cluster="lab")


def test_key_files_and_the_wrapped_transfer(tmp_path: Path) -> None:
    key = new_key()
    path = tmp_path / "k.key"
    write_key_file(path, key)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_key_file(path) == key
    path.chmod(0o644)
    with pytest.raises(KeyringError, match=r"k\.key: key file is readable"):
        read_key_file(path)
    path.chmod(0o600)
    path.write_text("c2hvcnQ=\n")
    with pytest.raises(KeyringError, match="32 bytes"):
        read_key_file(path)
    wrapped = wrap_key(key, SECRET, "lab")
    assert key.hex() not in wrapped
    assert key not in wrapped.encode()
    assert unwrap_key(wrapped, SECRET, "lab") == key
    with pytest.raises(KeyringError, match="does not open"):
        unwrap_key(wrapped, b"t" * 32, "lab")
    with pytest.raises(KeyringError, match="does not open"):
        unwrap_key(wrapped, SECRET, "lab2")


# --- a rotation under SWIM ------------------------------------------------------------------


async def test_rotation_under_swim_suspects_no_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Five members on the in-memory network rotate k1 -> k2 (install everywhere, use one by
    one, remove everywhere) while probing: no suspect, no dead. A sixth, down during the
    rotation, comes back with k1 only: refused both ways, it names k2 as the key it lacks, and
    rejoins once given k2."""
    network = InMemoryNetwork(random.Random(3), delay_s=0.0005, jitter_s=0.0005)
    k1, k2 = new_key(), new_key()
    keys = {f"n{i}": _keys(tmp_path, f"n{i}", k1) for i in range(6)}
    nodes: dict[str, Membership] = {}
    failed: list[tuple[str, str, EventKind]] = []

    async def start(index: int) -> Membership:
        name = f"n{index}"
        endpoint = network.endpoint(host(index), PORT, secret=SECRET, keys=keys[name])
        member = Membership(name, host(index), PORT, {}, endpoint, FAST, rng=random.Random(index))
        member.add_listener(
            lambda event: (
                failed.append((name, event.member.node_id, event.kind))
                if event.kind in (EventKind.SUSPECT, EventKind.DEAD)
                else None
            )
        )
        await member.start()
        if index:
            member.add_candidate(host(0), PORT)
        nodes[name] = member
        return member

    def all_alive() -> bool:
        return all(node.counts()["alive"] == len(nodes) for node in nodes.values())

    def received() -> int:
        return sum(node.transport_stats().received_datagrams for node in nodes.values())

    try:
        for index in range(6):
            await start(index)
        await wait_for(all_alive, what="six alive")
        network.isolate(host(5))
        await nodes.pop("n5").close()
        await wait_for(lambda: all(n.counts()["dead"] == 1 for n in nodes.values()), what="n5 dead")
        failed.clear()
        steps: list[Callable[[str], object]] = [
            lambda name: keys[name].install(k2),
            lambda name: keys[name].use(key_id(k2)),
            lambda name: keys[name].remove(key_id(k1)),
        ]
        for step in steps:
            for name in nodes:
                step(name)
                mark = received()
                await wait_for(lambda: received() > mark + 40, what="traffic")  # noqa: B023
        assert failed == [], f"suspected or declared dead during the rotation: {failed}"
        assert all(keys[name].ring.ids == [key_id(k2)] for name in nodes)

        network.rejoin(host(5))
        late = await start(5)
        await wait_for(
            lambda: late.transport_stats().dropped.get("unknown_key", 0) > 0,
            timeout_s=15,
            what="n5 to refuse datagrams sealed with k2 (a dead member is still synced with)",
        )
        lacked = f"sealed with gossip key {key_id(k2)}, which this node lacks"
        assert any(
            lacked in r.getMessage() and str(keys["n5"].path) in r.getMessage()
            for r in caplog.records
        )
        assert nodes["n0"].member("n5").state == MemberState.DEAD  # type: ignore[union-attr]
        keys["n5"].install(k2)
        keys["n5"].use(key_id(k2))
        await wait_for(all_alive, timeout_s=15, what="n5 to rejoin once given k2")
    finally:
        for node in nodes.values():
            await node.close()
        network.close()
