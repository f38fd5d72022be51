"""The envelope of membership datagrams: bodies (node.membership.wire) sealed with AES-256-GCM
by a gossip keyring (v3) or signed with the cluster secret (v2, the previous release's). The
format is specified on `Envelope`.
"""

from __future__ import annotations

import base64
import enum
import functools
import hashlib
import hmac
import json
import secrets
import struct
from dataclasses import dataclass
from typing import TypeGuard

from cryptography.exceptions import InvalidTag

from node.membership.keyring import KEY_ID_CHARS, NONCE_BYTES, GossipKeys

MAX_DATAGRAM_BYTES = 1400
ENVELOPE_VERSION = 2
"""The signed envelope of the previous release (HMAC, body in clear)."""
SEALED_VERSION = 3
"""The envelope sealed by a gossip key (AES-256-GCM)."""
_SEALED_FIELDS = struct.Struct(">qQQ")  # timestamp, boot, seq: the first bytes sealed
_TAG_BYTES = 16
_MAC_CHARS = 43
_MAX_ENVELOPE_BYTES = 512
_MAX_SEQ = 2**63
_MAX_CLUSTER_SHOWN = 80


class Drop(enum.StrEnum):
    """Why a datagram was refused."""

    MALFORMED = "malformed"
    CLUSTER = "cluster"
    UNSIGNED = "unsigned"
    BAD_MAC = "bad_mac"
    STALE = "stale"
    REPLAYED = "replayed"
    OUT_OF_WINDOW = "out_of_window"
    UNKNOWN_KEY = "unknown_key"


@dataclass(frozen=True, slots=True)
class Opened:
    """A received datagram: its body and sealed header fields, or why it was dropped.
    `cluster` is the cluster id the sender named: None when it named none (a sender of a
    release before cluster ids, accepted as ours), another id when dropped for Drop.CLUSTER.
    `version` is the envelope's (ENVELOPE_VERSION or SEALED_VERSION, 0 when unreadable);
    `key_id` the gossip key a sealed one names (with Drop.UNKNOWN_KEY: the key this node
    lacks)."""

    body: bytes | None
    drop: Drop | None = None
    timestamp: int = 0
    boot: int = 0
    seq: int = 0
    cluster: str | None = None
    version: int = 0
    key_id: str | None = None


def _mac(secret: bytes, cluster: str, timestamp: int, boot: int, seq: int, body: bytes) -> str:
    fields = b"%d\n%d\n%d\n" % (timestamp, boot, seq)
    signed = b"SW2\n" + cluster.encode() + b"\n" + fields + body
    raw = hmac.digest(secret, signed, hashlib.sha256)
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


@functools.lru_cache(maxsize=16)
def _cluster_json(cluster: str) -> bytes:
    return json.dumps(cluster, separators=(",", ":"), ensure_ascii=False).encode()


def _sealed_ad(cluster: str, kid: str) -> bytes:
    return b"SW3\n" + cluster.encode() + b"\n" + kid.encode()


@dataclass(frozen=True, slots=True)
class Envelope:
    """Sealing and opening datagrams of one cluster: with `keys` (a gossip keyring) sealed by
    its key in use (v3); else signed with `secret` (v2); neither is unauthenticated dev mode.

    v3: `{"v":3,"c":CLUSTER,"k":KEY_ID}`, a newline, a random 96-bit NONCE, then
    AES-256-GCM(key KEY_ID, NONCE, TS BOOT SEQ BODY, associated data "SW3\n" CLUSTER "\n"
    KEY_ID) where TS (int64), BOOT and SEQ (uint64) are big-endian. Only the cluster id and the
    key id travel in clear: a receiver picks the key by its id among every key of its ring and
    refuses a datagram naming a key it lacks (Drop.UNKNOWN_KEY, naming the key id), a tampered
    one (Drop.BAD_MAC) and a stale or replayed one as v2 does.

    v2: `{"v":2,"c":CLUSTER,"ts":UNIX_S,"b":BOOT,"n":SEQ,"mac":MAC}`, a newline, then
    the body; at most MAX_DATAGRAM_BYTES in all. BOOT is a random id of the sender's transport
    (new at every start) and SEQ counts its datagrams, so a receiver tells a replay from a new
    datagram (`node.membership.channel`). MAC = base64url(HMAC-SHA256(secret, "SW2\\n" CLUSTER
    "\\n" TS "\\n" BOOT "\\n" SEQ "\\n" BODY)) without padding, or "" without a secret.
    """

    cluster: str
    secret: bytes | None = None
    max_skew_s: float = 300.0
    keys: GossipKeys | None = None

    @property
    def overhead_bytes(self) -> int:
        """The widest envelope around a body, v2 or v3 (a v3 node answers v2 peers in v2)."""
        widest = self.seal(b"", 9_999_999_999.0, boot=_MAX_SEQ - 1, seq=_MAX_SEQ - 1, legacy=True)
        signed = len(widest) + (0 if self.secret else _MAC_CHARS)
        sealed = len(self._sealed_header("0" * KEY_ID_CHARS))
        sealed += NONCE_BYTES + _SEALED_FIELDS.size + _TAG_BYTES
        return max(signed, sealed)

    @property
    def body_budget(self) -> int:
        """Largest body that fits in one datagram."""
        return MAX_DATAGRAM_BYTES - self.overhead_bytes

    @property
    def sealing(self) -> bool:
        """Whether datagrams go out sealed by a gossip key (v3)."""
        return self.keys is not None

    def _sealed_header(self, kid: str) -> bytes:
        return b'{"v":%d,"c":%s,"k":"%s"}\n' % (
            SEALED_VERSION,
            _cluster_json(self.cluster),
            kid.encode(),
        )

    def seal(
        self, body: bytes, now_s: float, *, boot: int, seq: int, legacy: bool = False
    ) -> bytes:
        """`body` in an envelope stamped `now_s`, from transport `boot`, its datagram `seq`:
        sealed by the keyring's key in use, or the v2 envelope without a keyring or when
        `legacy` (a peer of the previous release, which reads only v2)."""
        timestamp = int(now_s)
        if self.keys is not None and not legacy:
            ring = self.keys.ring
            kid = ring.primary
            cipher = ring.cipher(kid)
            assert cipher is not None  # the key in use is always in the ring
            nonce = secrets.token_bytes(NONCE_BYTES)
            plain = _SEALED_FIELDS.pack(timestamp, boot, seq) + body
            sealed = cipher.encrypt(nonce, plain, _sealed_ad(self.cluster, kid))
            return b"".join((self._sealed_header(kid), nonce, sealed))
        mac = _mac(self.secret, self.cluster, timestamp, boot, seq, body) if self.secret else ""
        return b"".join(
            (
                b'{"v":%d,"c":' % ENVELOPE_VERSION,
                _cluster_json(self.cluster),
                b',"ts":%d,"b":%d,"n":%d,"mac":"%s"}\n' % (timestamp, boot, seq, mac.encode()),
                body,
            )
        )

    def open(self, datagram: bytes, now_s: float) -> Opened:
        """The body of `datagram` if it is ours and, with a secret, signed within max_skew_s.

        A datagram naming another cluster is dropped; one naming none is taken as ours (its MAC
        is checked over our cluster id), so a peer that sends no cluster id still joins."""
        newline = datagram.find(b"\n", 0, _MAX_ENVELOPE_BYTES)
        if newline < 0:
            return Opened(None, Drop.MALFORMED)
        try:
            header = json.loads(datagram[:newline])
        except (ValueError, UnicodeDecodeError):
            return Opened(None, Drop.MALFORMED)
        if not isinstance(header, dict):
            return Opened(None, Drop.MALFORMED)
        if header.get("v") == SEALED_VERSION:
            return self._open_sealed(header, datagram[newline + 1 :], now_s)
        if header.get("v") != ENVELOPE_VERSION:
            return Opened(None, Drop.MALFORMED)
        timestamp, mac = header.get("ts"), header.get("mac")
        boot, seq = header.get("b"), header.get("n")
        if not isinstance(timestamp, int) or not isinstance(mac, str):
            return Opened(None, Drop.MALFORMED)
        if not (_is_seq(boot) and _is_seq(seq)):
            return Opened(None, Drop.MALFORMED)
        cluster = header.get("c")
        if cluster is not None and cluster != self.cluster:
            return Opened(None, Drop.CLUSTER, cluster=str(cluster)[:_MAX_CLUSTER_SHOWN])
        body = datagram[newline + 1 :]
        version = ENVELOPE_VERSION
        if self.secret is None:
            if self.keys is not None:
                return Opened(None, Drop.UNSIGNED, version=version)
            return Opened(body, None, timestamp, boot, seq, cluster, version)
        if not mac:
            return Opened(None, Drop.UNSIGNED, version=version)
        expected = _mac(self.secret, self.cluster, timestamp, boot, seq, body)
        if not hmac.compare_digest(mac, expected):
            return Opened(None, Drop.BAD_MAC, version=version)
        if abs(now_s - timestamp) > self.max_skew_s:
            return Opened(None, Drop.STALE, version=version)
        return Opened(body, None, timestamp, boot, seq, cluster, version)

    def _open_sealed(self, header: dict[str, object], sealed: bytes, now_s: float) -> Opened:
        version = SEALED_VERSION
        cluster, kid = header.get("c"), header.get("k")
        if not isinstance(kid, str) or not 0 < len(kid) <= 2 * KEY_ID_CHARS:
            return Opened(None, Drop.MALFORMED, version=version)
        if cluster != self.cluster:
            shown = str(cluster)[:_MAX_CLUSTER_SHOWN]
            return Opened(None, Drop.CLUSTER, cluster=shown, version=version)
        cipher = None if self.keys is None else self.keys.ring.cipher(kid)
        if cipher is None:
            return Opened(None, Drop.UNKNOWN_KEY, cluster=self.cluster, version=version, key_id=kid)
        if len(sealed) < NONCE_BYTES + _SEALED_FIELDS.size + _TAG_BYTES:
            return Opened(None, Drop.MALFORMED, version=version, key_id=kid)
        try:
            plain = cipher.decrypt(
                sealed[:NONCE_BYTES], sealed[NONCE_BYTES:], _sealed_ad(self.cluster, kid)
            )
        except InvalidTag:
            return Opened(None, Drop.BAD_MAC, version=version, key_id=kid)
        timestamp, boot, seq = _SEALED_FIELDS.unpack_from(plain)
        if not (_is_seq(boot) and _is_seq(seq)):
            return Opened(None, Drop.MALFORMED, version=version, key_id=kid)
        if abs(now_s - timestamp) > self.max_skew_s:
            return Opened(None, Drop.STALE, version=version, key_id=kid)
        body = plain[_SEALED_FIELDS.size :]
        return Opened(body, None, timestamp, boot, seq, self.cluster, version, kid)


def _is_seq(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < _MAX_SEQ
