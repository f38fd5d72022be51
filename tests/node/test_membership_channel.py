"""Replay windows and the sealed channel: every datagram is delivered at most once per sender."""

from __future__ import annotations

import pytest

from node.membership.channel import ReplayWindows, SealedChannel
from node.membership.envelope import Drop, Envelope

NOW = 1_700_000_000.0
TS = int(NOW)


def test_each_sequence_number_of_a_boot_is_admitted_once() -> None:
    windows = ReplayWindows(300.0, width_seqs=64)
    assert windows.admit(1, 10, TS, NOW) is None
    assert windows.admit(1, 10, TS, NOW) == Drop.REPLAYED
    assert windows.admit(1, 12, TS, NOW) is None
    assert windows.admit(1, 11, TS, NOW) is None  # late but within the window: delivered once
    assert windows.admit(1, 11, TS, NOW) == Drop.REPLAYED
    assert windows.admit(1, 12, TS, NOW) == Drop.REPLAYED
    assert windows.admit(1, 12 + 63, TS, NOW) is None
    assert windows.admit(1, 12, TS, NOW) == Drop.REPLAYED  # 63 behind: still remembered
    assert windows.admit(1, 11, TS, NOW) == Drop.OUT_OF_WINDOW  # 64 behind: cannot tell
    assert windows.admit(1, 2**61, TS, NOW) is None  # a far jump forgets the old bits
    assert windows.admit(1, 2**61, TS, NOW) == Drop.REPLAYED
    assert windows.admit(1, 2**61 - 1, TS, NOW) is None
    assert len(windows) == 1


def test_a_new_boot_id_starts_a_window_of_its_own() -> None:
    windows = ReplayWindows(300.0)
    for seq in range(1, 100):
        assert windows.admit(1, seq, TS, NOW) is None
    assert windows.admit(2, 1, TS, NOW) is None  # the sender restarted: its count starts over
    assert windows.admit(2, 1, TS, NOW) == Drop.REPLAYED
    assert windows.admit(1, 5, TS, NOW) == Drop.REPLAYED
    assert len(windows) == 2


def test_a_boot_is_forgotten_only_when_all_its_datagrams_are_stale() -> None:
    windows = ReplayWindows(300.0)
    assert windows.admit(1, 1, TS, NOW) is None
    assert windows.admit(1, 2, TS + 100, NOW + 100) is None
    assert windows.admit(2, 1, TS + 350, NOW + 350) is None  # boot 1's newest is 250 s old
    assert len(windows) == 2
    assert windows.admit(1, 2, TS + 100, NOW + 400) == Drop.REPLAYED  # 300 s: not yet stale
    assert windows.admit(2, 2, TS + 401, NOW + 401) is None
    assert len(windows) == 1  # boot 1's newest is 301 s old: the envelope refuses it as stale


def test_memory_is_bounded_by_the_number_of_boots() -> None:
    windows = ReplayWindows(300.0, max_boots=3)
    for boot in (1, 2, 3):
        assert windows.admit(boot, 1, TS, NOW) is None
    assert windows.admit(1, 2, TS, NOW) is None  # boot 1 heard most recently, boot 2 least
    assert windows.admit(4, 1, TS, NOW) is None
    assert len(windows) == 3
    assert windows.evicted == 1
    assert windows.admit(1, 2, TS, NOW) == Drop.REPLAYED
    assert windows.admit(3, 1, TS, NOW) == Drop.REPLAYED
    assert windows.admit(2, 1, TS, NOW) is None  # forgotten: admitted as new


@pytest.mark.parametrize("secret", [b"secret", None], ids=["signed", "dev-mode"])
def test_sealed_channel_refuses_a_replay_and_accepts_a_restarted_sender(
    secret: bytes | None,
) -> None:
    envelope = Envelope("lab", secret)
    sender, receiver, restarted = SealedChannel(envelope), SealedChannel(envelope), None
    first = sender.seal(b"one", NOW)
    second = sender.seal(b"two", NOW)
    assert receiver.open(second, NOW).body == b"two"
    assert receiver.open(first, NOW).body == b"one"  # reordered, not replayed
    assert receiver.open(first, NOW + 1).drop == Drop.REPLAYED
    assert receiver.open(second, NOW + 1).drop == Drop.REPLAYED
    restarted = SealedChannel(envelope)
    assert restarted.boot != sender.boot
    assert receiver.open(restarted.seal(b"one", NOW + 2), NOW + 2).body == b"one"
    assert receiver.senders == 2
    assert SealedChannel(envelope, boot=5).boot == 5
