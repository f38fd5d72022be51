"""The gossip keyring: AES-256-GCM keys that seal membership datagrams, kept in the data dir
(`keyring.json`, mode 600). One key is in use for sending; every key is accepted on receipt.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
import os
import secrets
import stat
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.hashes import SHA256
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from node.errors import KeyringError

log = logging.getLogger(__name__)

KEYRING_FILE = "keyring.json"
"""The keyring's name in the data dir."""
KEY_BYTES = 32
KEY_ID_CHARS = 16
NONCE_BYTES = 12
_WRAP_INFO = b"shoal keyring transfer v1\n"
_DERIVE_INFO = b"shoal gossip key v1\n"


def key_id(key: bytes) -> str:
    """The public name of `key`: 16 hex characters of a SHA-256 of it (its bytes never leave
    in the clear; the id names it in datagram headers, commands and logs)."""
    return hashlib.sha256(b"shoal gossip key id\n" + key).hexdigest()[:KEY_ID_CHARS]


def valid_key_id(text: str) -> bool:
    return len(text) == KEY_ID_CHARS and all(c in "0123456789abcdef" for c in text)


def new_key() -> bytes:
    return secrets.token_bytes(KEY_BYTES)


def derived_key(secret: bytes, cluster: str) -> bytes:
    """The first key of a cluster whose nodes share `secret`: every node derives the same one,
    so a cluster encrypts its gossip from its first start without any step of the operator."""
    hkdf = HKDF(SHA256(), KEY_BYTES, salt=None, info=_DERIVE_INFO + cluster.encode())
    return hkdf.derive(secret)


def encode_key(key: bytes) -> str:
    return base64.b64encode(key).decode()


def decode_key(text: str, where: str) -> bytes:
    """The key in base64 `text`; KeyringError `bad_key` naming `where` otherwise."""
    try:
        key = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise KeyringError("bad_key", f"{where}: not a base64 key ({exc})") from exc
    if len(key) != KEY_BYTES:
        raise KeyringError(
            "bad_key", f"{where}: a gossip key is {KEY_BYTES} bytes, this one is {len(key)}"
        )
    return key


def _check_private(path: Path, what: str) -> None:
    mode = path.stat().st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise KeyringError(
            "keyring_file",
            f"{path}: {what} is readable by group or others (mode {stat.S_IMODE(mode):o}); "
            f"run: chmod 600 {path}",
        )


def write_private(path: Path, data: bytes) -> None:
    """Write `data` to `path` with mode 600: a temp file, fsync, rename, fsync of the dir."""
    temp = path.with_name(f".{path.name}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def read_key_file(path: Path) -> bytes:
    """The key in a key file (`shoal keyring generate`): one base64 line, mode 600."""
    path = Path(path).expanduser()
    try:
        _check_private(path, "key file")
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise KeyringError("bad_key", f"{path}: key file not found") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise KeyringError("bad_key", f"{path}: cannot read the key file: {exc}") from exc
    return decode_key(text, str(path))


def write_key_file(path: Path, key: bytes) -> None:
    write_private(Path(path).expanduser(), (encode_key(key) + "\n").encode())


def wrap_key(key: bytes, secret: bytes | None, cluster: str) -> str:
    """`key` for a request body: sealed with a key derived from the cluster secret (a key
    never crosses plain HTTP readable), or plain base64 without a secret (dev mode)."""
    if secret is None:
        return encode_key(key)
    nonce = secrets.token_bytes(NONCE_BYTES)
    sealed = AESGCM(_wrapping_key(secret)).encrypt(nonce, key, _WRAP_INFO + cluster.encode())
    return base64.b64encode(nonce + sealed).decode()


def unwrap_key(text: str, secret: bytes | None, cluster: str) -> bytes:
    """The key `wrap_key` made; KeyringError `bad_key` when it does not open."""
    if secret is None:
        return decode_key(text, "the request's key")
    try:
        raw = base64.b64decode(text, validate=True)
        key = AESGCM(_wrapping_key(secret)).decrypt(
            raw[:NONCE_BYTES], raw[NONCE_BYTES:], _WRAP_INFO + cluster.encode()
        )
    except (binascii.Error, ValueError, InvalidTag) as exc:
        raise KeyringError(
            "bad_key", "the key does not open with this cluster's secret and id"
        ) from exc
    if len(key) != KEY_BYTES:
        raise KeyringError("bad_key", f"a gossip key is {KEY_BYTES} bytes, not {len(key)}")
    return key


def _wrapping_key(secret: bytes) -> bytes:
    return HKDF(SHA256(), KEY_BYTES, salt=None, info=_WRAP_INFO).derive(secret)


@dataclass(frozen=True)
class Keyring:
    """The keys of one node by id, and `primary`, the id of the key it seals with."""

    keys: Mapping[str, bytes]
    primary: str
    _ciphers: dict[str, AESGCM] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.primary not in self.keys:
            raise KeyringError("keyring_file", f"the key in use {self.primary} is not in the ring")

    @classmethod
    def of(cls, keys: list[bytes], primary: bytes) -> Keyring:
        return cls({key_id(key): key for key in [primary, *keys]}, key_id(primary))

    def cipher(self, kid: str) -> AESGCM | None:
        """The AEAD of key `kid`, None when the ring lacks it."""
        made = self._ciphers.get(kid)
        if made is None:
            key = self.keys.get(kid)
            if key is None:
                return None
            made = self._ciphers[kid] = AESGCM(key)
        return made

    @property
    def ids(self) -> list[str]:
        return sorted(self.keys)

    def to_json(self) -> bytes:
        doc = {"primary": self.primary, "keys": [encode_key(self.keys[k]) for k in self.ids]}
        return (json.dumps(doc, indent=2) + "\n").encode()

    @classmethod
    def from_json(cls, raw: bytes, where: str) -> Keyring:
        try:
            doc = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise KeyringError("keyring_file", f"{where}: not JSON: {exc}") from exc
        if not isinstance(doc, dict) or not isinstance(doc.get("keys"), list):
            raise KeyringError("keyring_file", f'{where}: expected {{"primary", "keys": [...]}}')
        keys = [decode_key(str(text), f"{where}: keys[{i}]") for i, text in enumerate(doc["keys"])]
        if not keys:
            raise KeyringError("keyring_file", f"{where}: holds no key")
        ring = {key_id(key): key for key in keys}
        primary = doc.get("primary")
        if primary not in ring:
            raise KeyringError(
                "keyring_file", f"{where}: primary {primary!r} is none of its keys {sorted(ring)}"
            )
        return cls(ring, str(primary))


class GossipKeys:
    """The keyring file of one node and the ring read from it; owns the file from `open`.

    `ring` is what the envelope seals and opens with now; `install`, `use` and `remove` write
    the file (mode 600, atomically) before the ring changes, so an acknowledged change
    survives a crash. `reload` rereads the file when it changed on disk (an operator copied a
    keyring in), at most once per `reload_interval_s`. Thread-safe.
    """

    def __init__(self, path: Path, ring: Keyring) -> None:
        self.path = path
        self._ring = ring
        self._lock = threading.Lock()
        self._stamp = self._file_stamp()

    @classmethod
    def open(cls, data_dir: Path, *, secret: bytes | None, cluster: str) -> GossipKeys | None:
        """The keyring of `data_dir`. Where none exists: with a cluster secret, one holding the
        key derived from it (written now); without one, None (datagrams stay unencrypted, as
        in dev mode). KeyringError naming the file when it is unreadable or not private."""
        path = Path(data_dir) / KEYRING_FILE
        if path.exists():
            return cls(path, load_keyring(path))
        if secret is None:
            return None
        ring = Keyring.of([], derived_key(secret, cluster))
        write_private(path, ring.to_json())
        log.info(
            "gossip keyring %s made with key %s (derived from the cluster secret)",
            path,
            ring.primary,
        )
        return cls(path, ring)

    @property
    def ring(self) -> Keyring:
        return self._ring

    def _file_stamp(self) -> tuple[int, int] | None:
        try:
            st = self.path.stat()
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size)

    def reload(self) -> bool:
        """Reread the file if it changed on disk; True when the ring changed. A file that does
        not load is logged and the ring kept."""
        with self._lock:
            stamp = self._file_stamp()
            if stamp is None or stamp == self._stamp:
                return False
            self._stamp = stamp
            try:
                ring = load_keyring(self.path)
            except KeyringError as exc:
                log.error("gossip keyring not reloaded: %s", exc)
                return False
            changed = ring.keys != self._ring.keys or ring.primary != self._ring.primary
            self._ring = ring
        if changed:
            log.warning(
                "gossip keyring %s reloaded: keys %s, in use %s", self.path, ring.ids, ring.primary
            )
        return changed

    def _store(self, ring: Keyring) -> None:
        write_private(self.path, ring.to_json())
        self._ring = ring
        self._stamp = self._file_stamp()

    def install(self, key: bytes) -> str:
        """Add `key` (accepted on receipt from now on); its id. Installing a key again is a
        no-op."""
        with self._lock:
            kid = key_id(key)
            if kid not in self._ring.keys:
                self._store(Keyring({**self._ring.keys, kid: key}, self._ring.primary))
            return kid

    def use(self, kid: str) -> None:
        """Seal with key `kid` from now on; KeyringError `unknown_key` when not installed."""
        with self._lock:
            if kid not in self._ring.keys:
                raise KeyringError(
                    "unknown_key", f"key {kid} is not installed here; install it first"
                )
            if kid != self._ring.primary:
                self._store(Keyring(self._ring.keys, kid))

    def remove(self, kid: str) -> None:
        """Stop accepting key `kid`; KeyringError `key_in_use` for the key in use,
        `unknown_key` when not installed."""
        with self._lock:
            if kid == self._ring.primary:
                raise KeyringError(
                    "key_in_use",
                    f"key {kid} is the key in use; `shoal keyring use` another key first",
                )
            if kid not in self._ring.keys:
                raise KeyringError("unknown_key", f"key {kid} is not installed here")
            keys = {k: v for k, v in self._ring.keys.items() if k != kid}
            self._store(Keyring(keys, self._ring.primary))


def load_keyring(path: Path) -> Keyring:
    """The keyring in `path`; KeyringError naming the file when it is missing, unreadable,
    malformed, or readable by group or others."""
    try:
        _check_private(path, "gossip keyring")
        raw = path.read_bytes()
    except FileNotFoundError as exc:
        raise KeyringError("keyring_file", f"{path}: gossip keyring not found") from exc
    except OSError as exc:
        raise KeyringError(
            "keyring_file", f"{path}: cannot read the gossip keyring: {exc}"
        ) from exc
    return Keyring.from_json(raw, str(path))
