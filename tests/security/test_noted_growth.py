"""Finding 6: membership datagrams naming unknown key ids or foreign cluster ids are logged
once each, and what is remembered to do so stays within MAX_NOTED, however many are forged."""

from __future__ import annotations

import json
import logging
import secrets
from pathlib import Path

import pytest

from node.membership.channel import MAX_NOTED, SealedChannel
from node.membership.envelope import SEALED_VERSION, Drop, Envelope
from node.membership.keyring import KEYRING_FILE, GossipKeys, Keyring, new_key

SECRET = b"s" * 32
NOW = 1_700_000_000.0
FORGED = 3 * MAX_NOTED


def _forged(cluster: str, kid: str) -> bytes:
    header = json.dumps({"v": SEALED_VERSION, "c": cluster, "k": kid}).encode()
    return header + b"\n" + secrets.token_bytes(60)


def test_noted_growth_stays_within_max_noted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ring = Keyring.of([], new_key())
    path = tmp_path / KEYRING_FILE
    path.write_bytes(ring.to_json())
    path.chmod(0o600)
    channel = SealedChannel(Envelope("lab", SECRET, keys=GossipKeys(path, ring)))
    warnings = 0
    with caplog.at_level(logging.WARNING, "node.membership.channel"):
        for i in range(FORGED):
            for datagram in (
                _forged("lab", secrets.token_hex(8)),
                _forged(f"other-{i}", secrets.token_hex(8)),
            ):
                opened = channel.open(datagram, NOW, "10.0.0.9:7000")
                assert opened.drop in (Drop.UNKNOWN_KEY, Drop.CLUSTER)
                channel.note(opened, f"10.0.0.9:{i}")
        warnings = len(caplog.records)
    assert len(channel._noted) <= MAX_NOTED
    assert warnings <= MAX_NOTED
    assert warnings > 0
