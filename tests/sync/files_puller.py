"""A puller node for the crash tests: recovers its WAL, then syncs one category from one peer.

Usage: python tests/sync/files_puller.py DATA_DIR PEER_URL [--transport http]
       [--category models] [--piece-size N] [--bandwidth BYTES_PER_S]
Prints `READY` once its WAL is open (tests SIGKILL it from then on), with rsync `FLOWING`
once rsync's receiver has created its working file (SSH is up, bytes are arriving), then
`DONE <files> <bytes> <recovered>` when the sync finished.

With `--zygote` it imports everything once, then forks one puller per `RUN <args>` line read
from stdin (printing `PID <pid>`, and `EXIT <pid> <status>` once it ended), so that twenty
crash rounds do not pay twenty interpreter starts.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from config import Timeouts  # noqa: E402
from sync import (  # noqa: E402
    FileCatalog,
    HttpTransport,
    MountInfo,
    PeerRef,
    PieceBook,
    SwarmOptions,
    SwarmTransport,
    SyncCoordinator,
    SyncOptions,
    Transport,
)
from sync.guards import TEMP_PREFIX, SpaceReserve  # noqa: E402
from wal import WalConfig, WriteAheadLog  # noqa: E402

TIMEOUTS = Timeouts(http_request_s=2.0, sync_s=20.0, sync_piece_s=5.0)


BYSTANDER = PeerRef("bystander", "http://127.0.0.1:9")
"""A member that holds nothing (nothing listens there): it puts the swarm transport in swarm
mode, so every piece comes from the origin through its piece scheduling."""


def swarm_for(http: HttpTransport) -> SwarmTransport:
    """The swarm transport of the contract suite: the origin and one bystander member."""
    return SwarmTransport(
        http,
        PieceBook(),
        lambda: [BYSTANDER],
        node_id="puller",
        timeouts=TIMEOUTS,
        options=SwarmOptions(poll_s=0.05),
    )


def peer_transport(name: str) -> str:
    """The transport name a peer is reached by for the puller's `--transport` NAME."""
    return "http" if name == "swarm" else name


def transports_for(
    name: str, http: HttpTransport, bandwidth: float | None = None
) -> dict[str, Transport]:
    """The transports of this puller; a new transport adds its name here."""
    if name == "http":
        return {"http": http}
    if name == "swarm":
        return {"http": swarm_for(http)}
    if name == "rsync":
        from tests.sync.ssh_server import rsync_from_env

        return {"rsync": rsync_from_env(TIMEOUTS, bandwidth)}
    raise SystemExit(f"unknown transport {name!r}")


POLL_S = 0.005


def is_rsync_working_file(name: str) -> bool:
    """rsync's working file of the transport's temp file: `<temp name>.XXXXXX`."""
    return name.startswith(f"{TEMP_PREFIX}rsync-") and "." in name[len(TEMP_PREFIX) :]


async def report_when_rsync_receives(root: Path) -> None:
    """Print `FLOWING` once an rsync working file exists under `root` (its receiver has
    started writing: SSH start-up is over)."""
    while True:
        for _, _, names in os.walk(root):
            if any(is_rsync_working_file(name) for name in names):
                sys.stdout.write("FLOWING\n")
                sys.stdout.flush()
                return
        await asyncio.sleep(POLL_S)


async def pull(args: argparse.Namespace) -> None:
    data: Path = args.data_dir
    catalog = FileCatalog(
        {args.category: data / args.category},
        data / "cache",
        piece_size=args.piece_size,
        mounts=[MountInfo("/dev/test", "/", "ext4")],
        listing_fresh_s=0.0,
    )
    wal = WriteAheadLog(data / "wal.db", config=WalConfig(quick_check_on_open=False))
    http = HttpTransport(node_id="puller", timeouts=TIMEOUTS, bandwidth_bytes_per_s=args.bandwidth)
    async with wal, catalog, http:
        coordinator = SyncCoordinator(
            catalog,
            http,
            self_peer=PeerRef("puller", "http://127.0.0.1:9"),
            wal=wal,
            transports=transports_for(args.transport, http, args.bandwidth),
            options=SyncOptions(
                timeouts=TIMEOUTS,
                retry_delay_s=0.01,
                reserve=SpaceReserve(0, 0.0),
                partial_max_age_s=0.0,
            ),
        )
        async with coordinator:
            sys.stdout.write("READY\n")
            sys.stdout.flush()
            watcher = None
            if args.transport == "rsync":
                root = catalog.root(args.category)
                watcher = asyncio.create_task(report_when_rsync_receives(root))
            try:
                recovered = await wal.recover(coordinator.recovery_handlers())
                peer = PeerRef("server", args.peer_url, (peer_transport(args.transport),))
                stats = await coordinator.sync(args.category, [peer])
            finally:
                if watcher is not None:
                    watcher.cancel()
            if stats.errors:
                sys.stdout.write(f"ERRORS {stats.errors}\n")
            sys.stdout.write(
                f"DONE {stats.files_transferred} {stats.bytes_transferred} {recovered.recovered}\n"
            )
            sys.stdout.flush()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("peer_url")
    parser.add_argument("--transport", default="http")
    parser.add_argument("--category", default="models")
    parser.add_argument("--piece-size", type=int, default=16 << 10)
    parser.add_argument("--bandwidth", type=float, default=None)
    return parser


def zygote() -> None:
    """Fork one puller per RUN line; report its pid and, once reaped, its exit status."""
    for line in sys.stdin:
        command, _, rest = line.strip().partition(" ")
        if command != "RUN":
            break
        args = _parser().parse_args(shlex.split(rest))
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                asyncio.run(pull(args))
            except BaseException as exc:
                sys.stdout.write(f"FAILED {type(exc).__name__}: {exc}\n")
                code = 1
            finally:
                sys.stdout.flush()
                os._exit(code)
        sys.stdout.write(f"PID {pid}\n")
        sys.stdout.flush()
        _, status = os.waitpid(pid, 0)
        sys.stdout.write(f"EXIT {pid} {status}\n")
        sys.stdout.flush()


def main() -> None:
    if sys.argv[1:] == ["--zygote"]:
        zygote()
        return
    asyncio.run(pull(_parser().parse_args()))


if __name__ == "__main__":
    main()
