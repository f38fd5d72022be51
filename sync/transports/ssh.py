"""A minimal `ssh` for rsync's `-e`: connects with asyncssh (host key checked against a
known_hosts file, client key auth only), runs the remote command and pipes stdin, stdout and
stderr. Failures before the command runs are reported on stderr as one `shoal-ssh: KIND: ...`
line (KIND: host-key, auth, connect) and exit status 255, like ssh.

With `--relay SOCKET` it does not connect itself: the rsync transport's relay
(sync.transports.ssh_relay) runs the command on a pooled connection and streams it back.

Usage: python -m sync.transports.ssh (--known-hosts F | --relay SOCKET) [--key K] [--port P]
       [--user U] [--connect-timeout S] HOST COMMAND...
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import io
import json
import os
import signal
import socket
import struct
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

import asyncssh

MARKER = "shoal-ssh:"
KIND_HOST_KEY = "host-key"
KIND_AUTH = "auth"
KIND_CONNECT = "connect"
EXIT_SSH_FAILED = 255
FRAME = struct.Struct(">cI")
EXIT = struct.Struct(">i")
STDOUT, STDERR, EXIT_STATUS, FAILURE = b"o", b"e", b"x", b"f"
_CHUNK = 1 << 16
_PR_SET_PDEATHSIG = 1


def _report(kind: str, message: str) -> int:
    sys.stderr.write(f"{MARKER} {kind}: {message}\n")
    sys.stderr.flush()
    return EXIT_SSH_FAILED


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m sync.transports.ssh")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--known-hosts", type=Path, default=None)
    source.add_argument("--relay", type=Path, default=None, help="the transport's relay socket")
    parser.add_argument("--key", type=Path, default=None)
    parser.add_argument("--jump", default=None, help="with --relay: the host to jump through")
    parser.add_argument("--port", type=int, default=22)
    parser.add_argument("--user", default=None)
    parser.add_argument("--connect-timeout", type=float, default=10.0)
    parser.add_argument("-l", dest="login", default=None, help="user, as rsync passes it")
    parser.add_argument("host")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    return parser


async def _connect(args: argparse.Namespace) -> asyncssh.SSHClientConnection:
    keys = [str(args.key)] if args.key is not None else None
    async with asyncio.timeout(args.connect_timeout):
        user = args.login or args.user
        return await asyncssh.connect(
            args.host,
            port=args.port,
            username=user if user else (),
            known_hosts=str(args.known_hosts),
            client_keys=keys,
            agent_path=None,
            config=[],
            kbdint_auth=False,
            preferred_auth="publickey",
            connect_timeout=args.connect_timeout,
        )


async def run(argv: Sequence[str]) -> int:
    """Run the remote command of `argv`; its exit status, or 255 when SSH itself failed."""
    args = _parser().parse_args(list(argv))
    if not args.command:
        return _report(KIND_CONNECT, "no remote command given")
    where = f"{args.host}:{args.port}"
    if args.relay is not None:
        return await asyncio.to_thread(relayed, args)
    if not args.known_hosts.is_file():
        return _report(KIND_HOST_KEY, f"{where}: known_hosts file {args.known_hosts} is missing")
    try:
        conn = await _connect(args)
    except asyncssh.HostKeyNotVerifiable as exc:
        return _report(
            KIND_HOST_KEY,
            f"{where}: host key not verifiable against {args.known_hosts}: {exc.reason}",
        )
    except asyncssh.PermissionDenied as exc:
        return _report(KIND_AUTH, f"{where}: key {args.key} refused: {exc.reason}")
    except (OSError, asyncssh.Error, TimeoutError) as exc:
        return _report(KIND_CONNECT, f"{where}: {type(exc).__name__}: {exc}")
    async with conn:
        try:
            process = await conn.create_process(
                " ".join(args.command),
                stdin=os.dup(0),
                stdout=os.dup(1),
                stderr=os.dup(2),
                encoding=None,
            )
            await process.wait_closed()
        except (OSError, asyncssh.Error) as exc:
            return _report(KIND_CONNECT, f"{where}: {type(exc).__name__}: {exc}")
        status = process.exit_status
    return EXIT_SSH_FAILED if status is None or status < 0 else status


def request_line(args: argparse.Namespace) -> bytes:
    """The relay request for the command of `args`: host, port, user, key, jump, command."""
    fields = {
        "host": args.host,
        "port": args.port,
        "user": args.login or args.user,
        "key": str(args.key) if args.key is not None else None,
        "jump": args.jump,
        "command": " ".join(args.command),
    }
    return json.dumps(fields).encode() + b"\n"


def relayed(args: argparse.Namespace) -> int:
    """Run the command through the relay at `args.relay`: stdin to it, its frames to stdout
    and stderr; the command's exit status, or 255 when it did not run."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(args.relay))
    except OSError as exc:
        sock.close()
        return _report(KIND_CONNECT, f"relay {args.relay}: {exc.strerror or exc}")
    with sock:
        try:
            sock.sendall(request_line(args))
            threading.Thread(target=_feed, args=(sock,), daemon=True).start()
            return _drain(sock.makefile("rb"))
        except OSError as exc:
            # The relay's socket failed, or rsync closed the pipes this helper writes to:
            # say which, so that rsync's "connection unexpectedly closed" has a cause.
            return _report(KIND_CONNECT, f"relay {args.relay}: {type(exc).__name__}: {exc}")


def _feed(sock: socket.socket) -> None:
    """Copy stdin to the relay, then half-close (the command sees the end of its input)."""
    try:
        while chunk := os.read(0, _CHUNK):
            sock.sendall(chunk)
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        return


def _drain(frames: io.BufferedReader) -> int:
    while head := frames.read(FRAME.size):
        if len(head) < FRAME.size:
            break
        kind, length = FRAME.unpack(head)
        payload = frames.read(length)
        if len(payload) < length:
            break
        if kind == STDOUT:
            _write_all(1, payload)
        elif kind == STDERR:
            _write_all(2, payload)
        elif kind == EXIT_STATUS:
            (status,) = EXIT.unpack(payload)
            return EXIT_SSH_FAILED if status < 0 else int(status)
        elif kind == FAILURE:
            sys.stderr.write(f"{MARKER} {payload.decode(errors='replace')}\n")
            sys.stderr.flush()
            return EXIT_SSH_FAILED
    return _report(KIND_CONNECT, "the relay closed before the command's exit status")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _exit_with_parent() -> None:
    """Be SIGTERMed when rsync (the parent) dies: rsync's receiver, a sibling process, reads
    this helper's stdout, so without this it would finish the transfer for nobody; with it,
    it sees the end of its input and keeps its partial file for a resume."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:
        sys.exit(EXIT_SSH_FAILED)


def main() -> None:
    _exit_with_parent()
    sys.exit(asyncio.run(run(sys.argv[1:])))


if __name__ == "__main__":
    main()
