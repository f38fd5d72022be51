"""Both ends of one transport's datagrams: a boot id and a sequence number on what it seals, and
per-sender replay windows on what it opens, so a captured datagram cannot be delivered twice.
"""

from __future__ import annotations

import logging
import secrets
from collections import OrderedDict
from dataclasses import dataclass

from node.membership.wire import Drop, Envelope, Opened

REPLAY_WINDOW_SEQS = 1024
"""How far behind a sender's newest sequence number a late datagram is still accepted."""
MAX_SENDER_BOOTS = 4096
"""Senders (boot ids) remembered at once; the least recently heard is forgotten beyond this."""
MAX_NOTED = 1024
"""Foreign cluster ids and unlabelled senders logged once each; beyond this, at DEBUG only."""

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Window:
    highest: int
    seen: int  # bit i set: sequence number highest - i was accepted
    newest_ts: int


class ReplayWindows:
    """Sequence numbers accepted per sender boot id, in a sliding window of `width_seqs`.

    A datagram is a replay when its (boot, seq) was accepted before; one further than
    `width_seqs` behind the newest of its boot is refused too (it cannot be told apart). A boot
    is forgotten once its newest timestamp is more than `max_skew_s` old: with a secret, every
    datagram of it is then refused as stale by the envelope, so forgetting it reopens nothing.
    A restarted sender has a new random boot id and starts a window of its own. Memory is
    bounded by `max_boots` windows of `width_seqs` bits.
    """

    def __init__(
        self,
        max_skew_s: float,
        *,
        width_seqs: int = REPLAY_WINDOW_SEQS,
        max_boots: int = MAX_SENDER_BOOTS,
    ) -> None:
        self._max_skew_s = max_skew_s
        self._width = width_seqs
        self._mask = (1 << width_seqs) - 1
        self._max_boots = max_boots
        self._boots: OrderedDict[int, _Window] = OrderedDict()
        self.evicted = 0
        """Boots forgotten before they expired because `max_boots` were remembered."""

    def __len__(self) -> int:
        return len(self._boots)

    def admit(self, boot: int, seq: int, timestamp: int, now_s: float) -> Drop | None:
        """None when (boot, seq) is new (and now remembered), else why it is refused."""
        self._expire(now_s)
        window = self._boots.get(boot)
        if window is None:
            if len(self._boots) >= self._max_boots:
                self._boots.popitem(last=False)
                self.evicted += 1
            self._boots[boot] = _Window(seq, 1, timestamp)
            return None
        if seq > window.highest:
            shift = seq - window.highest
            window.seen = 1 if shift >= self._width else ((window.seen << shift) | 1) & self._mask
            window.highest = seq
        else:
            behind = window.highest - seq
            if behind >= self._width:
                return Drop.OUT_OF_WINDOW
            if window.seen >> behind & 1:
                return Drop.REPLAYED
            window.seen |= 1 << behind
        window.newest_ts = max(window.newest_ts, timestamp)
        self._boots.move_to_end(boot)
        return None

    def _expire(self, now_s: float) -> None:
        while self._boots:
            boot, window = next(iter(self._boots.items()))
            if now_s - window.newest_ts <= self._max_skew_s:
                return
            del self._boots[boot]


class SealedChannel:
    """The envelope of one transport with its state: `seal` stamps this transport's boot id
    (random, new for every channel) and the next sequence number; `open` refuses replays."""

    def __init__(self, envelope: Envelope, *, boot: int | None = None) -> None:
        self.envelope = envelope
        self.boot = secrets.randbits(62) if boot is None else boot
        self._seq = 0
        self._windows = ReplayWindows(envelope.max_skew_s)
        self._noted: set[str] = set()

    @property
    def cluster(self) -> str:
        return self.envelope.cluster

    @property
    def body_budget(self) -> int:
        return self.envelope.body_budget

    @property
    def senders(self) -> int:
        """Sender boots whose replay windows are held."""
        return len(self._windows)

    def seal(self, body: bytes, now_s: float) -> bytes:
        self._seq += 1
        return self.envelope.seal(body, now_s, boot=self.boot, seq=self._seq)

    def open(self, datagram: bytes, now_s: float) -> Opened:
        """The body of `datagram` if the envelope accepts it and it was not delivered before."""
        opened = self.envelope.open(datagram, now_s)
        if opened.body is None:
            return opened
        drop = self._windows.admit(opened.boot, opened.seq, opened.timestamp, now_s)
        return opened if drop is None else Opened(None, drop)

    def note(self, opened: Opened, source: str) -> None:
        """Log what `open` decided about a datagram from `source`: a foreign cluster at WARNING
        once per cluster id (naming both ids), then at DEBUG; a sender that named no cluster at
        DEBUG once per source; any other drop at DEBUG."""
        if opened.drop == Drop.CLUSTER:
            key = f"cluster:{opened.cluster}"
            first = key not in self._noted and len(self._noted) < MAX_NOTED
            self._noted.add(key)
            log.log(
                logging.WARNING if first else logging.DEBUG,
                "dropped membership datagrams from %s of cluster %r: this node is of cluster %r "
                "(a node of another cluster is never a member)",
                source,
                opened.cluster,
                self.cluster,
            )
        elif opened.drop is not None:
            log.debug("dropped a membership datagram from %s: %s", source, opened.drop)
        elif opened.cluster is None and f"none:{source}" not in self._noted:
            if len(self._noted) < MAX_NOTED:
                self._noted.add(f"none:{source}")
            log.debug("membership datagrams from %s name no cluster id; taken as ours", source)
