"""Length-prefixed frames between a caller and a worker: a JSON message plus an optional raw
payload (for arrays), never pickle; and the errors of the workers package."""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import time
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import orjson

from node.errors import (
    FrameError,
    WorkerClosed,
    WorkerTimeout,
)

HEADER = struct.Struct(">BIQ")
"""kind (1 byte), JSON length (4 bytes), payload length (8 bytes), then both bodies."""
MAX_JSON_BYTES = 64 * 1024 * 1024
MAX_PAYLOAD_BYTES = 16 * 1024 * 1024 * 1024
POLL_SLICE_S = 0.05
"""How often a blocked `recv` looks whether the peer died (a socket EOF is seen at once)."""


class FrameKind(IntEnum):
    MESSAGE = 0
    READY = 1
    DIED = 2
    CHALLENGE = 3
    AUTH = 4
    REFUSED = 5


@dataclass(frozen=True)
class Frame:
    """One decoded frame: its kind, its JSON message and its raw payload (b"" when none)."""

    kind: FrameKind
    message: Any
    payload: bytes = b""


def encode_frame(kind: FrameKind, message: Any, payload: bytes | None = None) -> bytes:
    """The bytes of one frame; TypeError for a message JSON cannot carry."""
    body = orjson.dumps(message, option=orjson.OPT_SERIALIZE_NUMPY)
    data = payload or b""
    return HEADER.pack(int(kind), len(body), len(data)) + body + data


def parse_header(header: bytes) -> tuple[FrameKind, int, int]:
    kind, json_len, payload_len = HEADER.unpack(header)
    if json_len > MAX_JSON_BYTES or payload_len > MAX_PAYLOAD_BYTES:
        raise FrameError(f"frame of {json_len}+{payload_len} bytes is over the limit")
    try:
        return FrameKind(kind), json_len, payload_len
    except ValueError as exc:
        raise FrameError(f"unknown frame kind {kind}; is the peer a shoal worker?") from exc


def decode_body(kind: FrameKind, body: bytes, json_len: int) -> Frame:
    try:
        message = orjson.loads(body[:json_len])
    except orjson.JSONDecodeError as exc:
        raise FrameError(f"frame of kind {kind.name} holds no JSON: {exc}") from exc
    return Frame(kind, message, bytes(body[json_len:]))


def split_frames(buffer: bytearray) -> list[bytes]:
    """Remove every complete frame from the front of `buffer` and return their raw bytes."""
    frames: list[bytes] = []
    while len(buffer) >= HEADER.size:
        _, json_len, payload_len = parse_header(bytes(buffer[: HEADER.size]))
        end = HEADER.size + json_len + payload_len
        if len(buffer) < end:
            break
        frames.append(bytes(buffer[:end]))
        del buffer[:end]
    return frames


class Channel:
    """One end of a frame stream over a connected socket. `recv` waits at most its timeout;
    `alive` is asked between slices of the wait so a dead peer is reported, never waited on."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(True)
        self.sock = sock
        self._closed = False

    def fileno(self) -> int:
        return self.sock.fileno()

    @property
    def closed(self) -> bool:
        return self._closed

    def send_frame(self, kind: FrameKind, message: Any, payload: bytes | None = None) -> None:
        if self._closed:
            raise WorkerClosed("the channel is closed")
        self.sock.sendall(encode_frame(kind, message, payload))

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def readable(self, timeout_s: float | None) -> bool:
        if self._closed:
            raise WorkerClosed("the channel is closed")
        ready, _, _ = select.select([self.sock], [], [], timeout_s)
        return bool(ready)

    def recv_frame(self, deadline: float | None) -> Frame | None:
        """The next frame, or None at a clean end of stream; WorkerTimeout past `deadline`
        (time.monotonic) before the frame started; a started frame is always read whole."""
        header = self._read(HEADER.size, deadline, allow_eof=True)
        if header is None:
            return None
        kind, json_len, payload_len = parse_header(header)
        body = self._read(json_len + payload_len, None, allow_eof=False)
        assert body is not None
        return decode_body(kind, body, json_len)

    def _read(self, size: int, deadline: float | None, allow_eof: bool) -> bytes | None:
        view = bytearray(size)
        got = 0
        while got < size:
            if deadline is not None and got == 0:
                left = deadline - time.monotonic()
                if left <= 0 or not self.readable(left):
                    raise WorkerTimeout("no message within the timeout")
            try:
                n = self.sock.recv_into(memoryview(view)[got:], size - got)
            except ConnectionResetError:
                n = 0
            if n == 0:
                if got == 0 and allow_eof:
                    return None
                raise EOFError(f"stream ended inside a frame ({got} of {size} bytes)")
            got += n
        return bytes(view)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
