"""Both ends of one transport's datagrams: a boot id and a sequence number on what it seals, and
per-sender replay windows on what it opens, so a captured datagram cannot be delivered twice.
"""

from __future__ import annotations

import logging
import secrets
from collections import OrderedDict
from dataclasses import dataclass

from node.membership.envelope import ENVELOPE_VERSION, Drop, Envelope, Opened

REPLAY_WINDOW_SEQS = 1024
"""How far behind a sender's newest sequence number a late datagram is still accepted."""
MAX_SENDER_BOOTS = 4096
"""Senders (boot ids) remembered at once; the least recently heard is forgotten beyond this."""
MAX_NOTED = 1024
"""Foreign cluster ids and unlabelled senders logged once each; beyond this, at DEBUG only."""
MAX_LEGACY_PEERS = 4096
"""Peers of the previous release (v2 envelope) answered in v2 at once; beyond this, the least
recently heard is forgotten (and answered in v3 until it speaks again)."""
KEYRING_RELOAD_S = 1.0
"""At most this often a datagram naming an unknown key makes the keyring file be reread."""

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
    (random, new for every channel) and the next sequence number; `open` refuses replays.

    With a gossip keyring, a peer whose last accepted datagram came in the previous release's
    signed envelope (v2) is answered in v2 (it cannot read v3) until it sends v3; a datagram
    naming a key this node lacks makes the keyring file be reread (at most once per
    KEYRING_RELOAD_S), so a keyring copied into the data dir is taken without a restart."""

    def __init__(self, envelope: Envelope, *, boot: int | None = None) -> None:
        self.envelope = envelope
        self.boot = secrets.randbits(62) if boot is None else boot
        self._seq = 0
        self._windows = ReplayWindows(envelope.max_skew_s)
        self._noted: set[str] = set()
        self._legacy: OrderedDict[str, None] = OrderedDict()
        self._reloaded_at = float("-inf")

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

    def seal(self, body: bytes, now_s: float, to: str | None = None) -> bytes:
        """`body` sealed for peer `to` ("host:port"; v2 when it speaks only v2)."""
        self._seq += 1
        legacy = to is not None and to in self._legacy
        return self.envelope.seal(body, now_s, boot=self.boot, seq=self._seq, legacy=legacy)

    def open(self, datagram: bytes, now_s: float, source: str | None = None) -> Opened:
        """The body of `datagram` if the envelope accepts it and it was not delivered before;
        `source` ("host:port") is remembered as a v2 peer when it sent a v2 envelope."""
        opened = self.envelope.open(datagram, now_s)
        if opened.drop == Drop.UNKNOWN_KEY and self._reload_keys(now_s):
            opened = self.envelope.open(datagram, now_s)
        if opened.body is None:
            return opened
        drop = self._windows.admit(opened.boot, opened.seq, opened.timestamp, now_s)
        if drop is not None:
            return Opened(None, drop)
        if source is not None and self.envelope.sealing:
            self._note_version(source, opened.version)
        return opened

    def _reload_keys(self, now_s: float) -> bool:
        keys = self.envelope.keys
        if keys is None or now_s - self._reloaded_at < KEYRING_RELOAD_S:
            return False
        self._reloaded_at = now_s
        return keys.reload()

    def _note_version(self, source: str, version: int) -> None:
        if version != ENVELOPE_VERSION:
            self._legacy.pop(source, None)
            return
        if source not in self._legacy:
            log.warning(
                "membership datagrams from %s come in the previous release's envelope (v2: "
                "signed, not encrypted); answering it in v2 until it is upgraded",
                source,
            )
            if len(self._legacy) >= MAX_LEGACY_PEERS:
                self._legacy.popitem(last=False)
        self._legacy[source] = None
        self._legacy.move_to_end(source)

    def note(self, opened: Opened, source: str) -> None:
        """Log what `open` decided about a datagram from `source`: a foreign cluster at WARNING
        once per cluster id (naming both ids), then at DEBUG; a sender that named no cluster at
        DEBUG once per source; any other drop at DEBUG."""
        if opened.drop == Drop.CLUSTER:
            first = self._first(f"cluster:{opened.cluster}")
            log.log(
                logging.WARNING if first else logging.DEBUG,
                "dropped membership datagrams from %s of cluster %r: this node is of cluster %r "
                "(a node of another cluster is never a member)",
                source,
                opened.cluster,
                self.cluster,
            )
        elif opened.drop == Drop.UNKNOWN_KEY:
            first = self._first(f"key:{opened.key_id}")
            keys = self.envelope.keys
            where = "no gossip keyring" if keys is None else f"keyring {keys.path}"
            log.log(
                logging.WARNING if first else logging.DEBUG,
                "refused membership datagrams from %s sealed with gossip key %s, which this "
                "node lacks (%s; keys %s); give it the cluster's keyring: `shoal keyring "
                "install --local KEYFILE` then `shoal keyring use --local KEYID`, or copy "
                "keyring.json of a member into the data dir",
                source,
                opened.key_id,
                where,
                [] if keys is None else keys.ring.ids,
            )
        elif opened.drop is not None:
            log.debug("dropped a membership datagram from %s: %s", source, opened.drop)
        elif opened.cluster is None and self._first(f"none:{source}"):
            log.debug("membership datagrams from %s name no cluster id; taken as ours", source)

    def _first(self, key: str) -> bool:
        """Whether `key` is noted for the first time; at most MAX_NOTED keys are remembered
        (beyond, every one is "not first": logged at DEBUG only, memory bounded)."""
        if key in self._noted or len(self._noted) >= MAX_NOTED:
            return False
        self._noted.add(key)
        return True
