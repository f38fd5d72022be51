"""A minimal `ssh` for rsync's `-e`: connects with asyncssh (host key checked against a
known_hosts file, client key auth only), runs the remote command and pipes stdin, stdout and
stderr. Failures before the command runs are reported on stderr as one `shoal-ssh: KIND: ...`
line (KIND: host-key, auth, connect) and exit status 255, like ssh.

Usage: python -m sync.transports.ssh --known-hosts F [--key K] [--port P] [--user U]
       [--connect-timeout S] HOST COMMAND...
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import asyncssh

MARKER = "shoal-ssh:"
KIND_HOST_KEY = "host-key"
KIND_AUTH = "auth"
KIND_CONNECT = "connect"
EXIT_SSH_FAILED = 255
_PR_SET_PDEATHSIG = 1


def _report(kind: str, message: str) -> int:
    sys.stderr.write(f"{MARKER} {kind}: {message}\n")
    sys.stderr.flush()
    return EXIT_SSH_FAILED


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m sync.transports.ssh")
    parser.add_argument("--known-hosts", type=Path, required=True)
    parser.add_argument("--key", type=Path, default=None)
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
