"""The contract every file transport keeps, run against each one (http and rsync, in CASES):
a complete verified file, resume after the puller is SIGKILLed, bytes corrupted in transit
detected and retried, a peer dying mid-transfer served by a fallback."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import random
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Protocol

import pytest

from health import BreakerConfig, BreakerRegistry, CircuitState
from sync.errors import ContentMismatchError
from sync.files.manifest import ManifestEntry
from sync.files.plan import FallbackSources
from sync.transports.http import HttpTransport
from sync.transports.protocol import PeerRef, Transport
from tests.sync.files_fixtures import PIECE, FileNode, content_hash_of, internal_files
from tests.sync.files_proxy import FaultProxy
from tests.sync.files_puller import is_rsync_working_file, swarm_for
from tests.sync.ssh_server import RsyncCase
from wal import SYNC_STARTED

PULLER = Path(__file__).with_name("files_puller.py")
ROOT = PULLER.parents[2]
KILL_ROUNDS = 20


class TransportCase(Protocol):
    """How the contract suite drives one transport."""

    name: str
    puller: str  # the --transport of tests/sync/files_puller.py
    keeps_verified_pieces: bool  # after a mismatch, the pieces that verified are reused

    def transports(self, http: HttpTransport) -> dict[str, Transport]: ...

    def peer(self, node: FileNode) -> PeerRef: ...

    def faulty_peer(
        self, node: FileNode, corrupt_after: int | None = None, die_after: int | None = None
    ) -> contextlib.AbstractAsyncContextManager[PeerRef]:
        """`node` reached through a fault: one flipped byte, or death after some bytes."""
        ...


class HttpCase:
    name = "http"
    puller = "http"
    keeps_verified_pieces = True

    def transports(self, http: HttpTransport) -> dict[str, Transport]:
        return {"http": http}

    def peer(self, node: FileNode) -> PeerRef:
        return PeerRef(node.node_id, node.peer.url, (self.name,))

    @contextlib.asynccontextmanager
    async def faulty_peer(
        self, node: FileNode, corrupt_after: int | None = None, die_after: int | None = None
    ) -> AsyncIterator[PeerRef]:
        async with FaultProxy(node.port, corrupt_after=corrupt_after, die_after=die_after) as proxy:
            yield PeerRef(node.node_id, proxy.url, (self.name,))


class SwarmCase(HttpCase):
    """The swarm transport (named http: it stands in for it) with a bystander member, so the
    contract holds for pieces scheduled by the swarm."""

    puller = "swarm"

    def transports(self, http: HttpTransport) -> dict[str, Transport]:
        return {"http": swarm_for(http)}


CASES: dict[str, TransportCase] = {
    "http": HttpCase(),
    "rsync": RsyncCase(),
    "swarm": SwarmCase(),
}


@pytest.fixture(params=sorted(CASES))
def case(request: pytest.FixtureRequest) -> TransportCase:
    return CASES[request.param]


def _node(case: TransportCase, base: Path, node_id: str, **kw: object) -> FileNode:
    return FileNode(base, node_id, transports=case.transports, **kw)  # type: ignore[arg-type]


async def _entry(node: FileNode, rel: str) -> ManifestEntry:
    listing = await node.catalog.listing("models")
    return next(e for e in listing.entries if e.path == rel)


async def test_complete_file_is_verified_and_logged(case: TransportCase, tmp_path: Path) -> None:
    data = os.urandom(7 * PIECE + 99)
    async with (
        _node(case, tmp_path / "a", "a") as a,
        _node(case, tmp_path / "b", "b", with_wal=True) as b,
    ):
        a.write("ckpt/step-100.pt", data, mtime_ns=1_700_000_000_000_000_001)
        entry = await _entry(a, "ckpt/step-100.pt")
        result = await b.sync.fetch("models", entry, FallbackSources(case.peer(a)))
        final = b.root() / "ckpt" / "step-100.pt"
        assert final.read_bytes() == data
        assert final.stat().st_mtime_ns == entry.mtime_ns
        assert (result.transport, result.hash, result.size_bytes) == (
            case.name,
            entry.hash,
            len(data),
        )
        assert internal_files(b.root()) == []
        assert await b.wal.pending(SYNC_STARTED) == []
        assert b.catalog.cache("models").lookup("ckpt/step-100.pt") == entry


class Zygote:
    """tests/sync/files_puller.py --zygote: forks one puller process per round."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    async def line(self) -> str:
        assert self.process.stdout is not None
        async with asyncio.timeout(30):
            raw = await self.process.stdout.readline()
        assert raw, "the puller zygote exited"
        return raw.decode().strip()

    async def round(
        self, args: list[str], kill_after_s: float | None, kill_from: str = "READY"
    ) -> tuple[bool, list[str]]:
        """Run one puller; SIGKILL it `kill_after_s` after it printed `kill_from` (READY, or
        FLOWING for rsync), unless it ended before that line. (finished, its lines)."""
        assert self.process.stdin is not None
        self.process.stdin.write(("RUN " + " ".join(args) + "\n").encode())
        await self.process.stdin.drain()
        lines: list[str] = []
        pid = None
        ready = False
        while pid is None or not ready:
            line = await self.line()
            lines.append(line)
            if line.startswith("PID "):
                pid = int(line.split()[1])
            elif line == "READY":
                ready = True
            elif line.startswith(("EXIT", "FAILED")):
                raise AssertionError(f"puller ended before READY: {lines}")
        ended = False
        while kill_from not in lines and not ended:
            line = await self.line()
            ended = line.startswith("EXIT")
            if not ended:
                lines.append(line)
        if kill_after_s is not None and not ended:
            await asyncio.sleep(kill_after_s)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        while not ended and not (line := await self.line()).startswith("EXIT"):
            lines.append(line)
        return any(item.startswith("DONE") for item in lines), lines


@contextlib.asynccontextmanager
async def zygote() -> AsyncIterator[Zygote]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(PULLER),
        "--zygote",
        cwd=ROOT,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        yield Zygote(process)
    finally:
        assert process.stdin is not None
        process.stdin.close()
        try:
            async with asyncio.timeout(10):
                await process.wait()
        except TimeoutError:
            process.kill()
            await process.wait()


@dataclasses.dataclass(frozen=True)
class KillRounds:
    """How the SIGKILL rounds of one transport are paced: the file size, the puller's
    bandwidth, the line the kill delay starts from and that delay's upper bound."""

    size_bytes: int
    bandwidth_bytes_per_s: int
    kill_from: str
    kill_window_s: float


# http: READY is moments before the first bytes; about 0.375 s per transfer at 512 KiB/s.
# rsync: SSH start-up (~1 s) is left out by starting the delay at FLOWING (rsync's receiver
# writes its working file); about 0.3 s per transfer at 320 KiB/s (--bwlimit=320).
PACING = {
    "http": KillRounds(12 * PIECE, 512 << 10, "READY", 0.45),
    "rsync": KillRounds(6 * PIECE, 320 << 10, "FLOWING", 0.35),
}


async def test_resume_after_sigkill_never_leaves_a_wrong_file(
    case: TransportCase, tmp_path: Path
) -> None:
    rng = random.Random(1234)
    pacing = PACING[case.name]
    size = pacing.size_bytes
    puller_dir = tmp_path / "puller"
    final = puller_dir / "models" / "ckpt.pt"
    async with _node(case, tmp_path / "server", "server") as server:
        versions: set[str] = set()

        def new_version() -> str:
            path = server.write("ckpt.pt", os.urandom(size))
            digest = content_hash_of(path)
            versions.add(digest)
            return digest

        current = new_version()
        args = [
            str(puller_dir),
            case.peer(server).url,
            "--transport",
            case.puller,
            "--piece-size",
            str(PIECE),
            "--bandwidth",
            str(pacing.bandwidth_bytes_per_s),
        ]
        interrupted = finished = 0
        async with zygote() as pullers:
            for round_no in range(KILL_ROUNDS):
                kill_after_s = rng.uniform(0.0, pacing.kill_window_s)
                done, lines = await pullers.round(args, kill_after_s, pacing.kill_from)
                assert not any(line.startswith("FAILED") for line in lines), lines
                if final.exists():
                    got = content_hash_of(final)
                    assert got in versions, f"round {round_no}: final path holds a wrong file"
                    assert final.stat().st_size == size
                partials = await _settled_partials(final.parent)
                interrupted += bool(partials)
                finished += done
                if (final.exists() and content_hash_of(final) == current) or round_no % 5 == 4:
                    current = new_version()  # keep transfers (and version changes) coming
            done, lines = await pullers.round(args, None)
        assert done, lines
        assert content_hash_of(final) == current
        assert sorted(os.listdir(final.parent)) == ["ckpt.pt"]  # no partial, temp or dir left
        assert interrupted >= 3, f"only {interrupted} kills landed mid-transfer ({finished} done)"


async def _settled_partials(directory: Path) -> list[str]:
    """The partial files in `directory` once no killed transfer is still writing: rsync's
    receiver, cut off when its puller (and so its SSH helper) died, moves its working file
    (`<temp name>.XXXXXX`) into its partial dir as it exits."""
    async with asyncio.timeout(10):
        while any(
            is_rsync_working_file(name) for _, _, names in os.walk(directory) for name in names
        ):
            await asyncio.sleep(0.01)
    return [p for p in internal_files(directory) if "partial" in p]


async def test_corrupted_bytes_are_detected_and_retried(
    case: TransportCase, tmp_path: Path
) -> None:
    data = os.urandom(6 * PIECE)
    breakers = BreakerRegistry(BreakerConfig(failure_threshold=5))
    async with (
        _node(case, tmp_path / "a", "a") as a,
        _node(case, tmp_path / "b", "b", with_wal=True, breakers=breakers) as b,
    ):
        a.write("m.bin", data)
        entry = await _entry(a, "m.bin")
        async with case.faulty_peer(a, corrupt_after=2 * PIECE + 500) as bad:
            transport = case.transports(b.http)[case.name]
            with pytest.raises(ContentMismatchError):
                await transport.fetch(bad, "models", entry, b.root())
            assert not (b.root() / "m.bin").exists()
        async with case.faulty_peer(a, corrupt_after=PIECE // 2) as bad:
            result = await b.sync.fetch("models", entry, FallbackSources(bad))
        assert (b.root() / "m.bin").read_bytes() == data
        snapshot = breakers.breaker_for("a", case.name).snapshot()
        assert snapshot.total_failures == 1
        assert snapshot.state is CircuitState.CLOSED
        if case.keeps_verified_pieces:
            assert result.resumed_bytes > 0  # pieces verified before the bad one were kept
        assert internal_files(b.root()) == []


async def test_dead_peer_trips_its_breaker_and_the_fallback_serves(
    case: TransportCase, tmp_path: Path
) -> None:
    data = os.urandom(10 * PIECE)
    breakers = BreakerRegistry(BreakerConfig(failure_threshold=1))
    async with (
        _node(case, tmp_path / "a", "a") as a,
        _node(case, tmp_path / "c", "c") as c,
        _node(case, tmp_path / "b", "b", with_wal=True, breakers=breakers) as b,
    ):
        a.write("m.bin", data, mtime_ns=1_000)
        c.write("m.bin", data, mtime_ns=1_000)
        entry = await _entry(a, "m.bin")
        assert entry == await _entry(c, "m.bin")
        async with case.faulty_peer(a, die_after=4 * PIECE) as dying:
            plan = FallbackSources(dying, (case.peer(c),), timeout_s=20.0)
            result = await b.sync.fetch("models", entry, plan)
        assert result.peer == "c"
        assert result.resumed_bytes > 0  # pieces from the dead peer were verified and kept
        assert breakers.breaker_for("a", case.name).state is CircuitState.OPEN
        assert (b.root() / "m.bin").read_bytes() == data
        assert await b.wal.pending(SYNC_STARTED) == []
