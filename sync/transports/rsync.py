"""The rsync-over-SSH transport: the real `rsync` binary moves the bytes (resumable through
`--partial-dir`), its remote shell is `python -m sync.transports.ssh` (asyncssh, host key checked
against a known_hosts file), then the same verify, fsync and rename as HTTP (`install_file`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import hashlib
import logging
import os
import re
import shlex
import signal
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from config import AsyncClosing, Timeouts
from sync.errors import FileSyncError, FileTransferError, SshAuthError, SshHostKeyError
from sync.files.manifest import ManifestEntry
from sync.guards import TEMP_PREFIX, dest_path
from sync.transports.partial import install_file, make_directories
from sync.transports.protocol import PeerRef, TransferResult
from sync.transports.ssh import KIND_AUTH, KIND_HOST_KEY, MARKER
from sync.transports.ssh_relay import SshConnector, SshRelay
from sync.transports.ssh_target import SshTarget

logger = logging.getLogger(__name__)

PARTIAL_DIR = ".shoal-rsync-partial"
DEFAULT_KNOWN_HOSTS = Path("~/.ssh/known_hosts")
_STAT = re.compile(r"^(Literal|Matched) data: ([\d,.]+) bytes", re.MULTILINE)
_TERM_GRACE_S = 5.0
_PR_SET_PDEATHSIG = 1
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[1])


RemoteRoot = Callable[[PeerRef, str], str]
Targets = Mapping[str, SshTarget] | Callable[[PeerRef], SshTarget]


def default_remote_root(target: SshTarget, category: str) -> str:
    """`target.storage_paths[category]`, else `target.data_dir`/`category`; `~/` stripped."""
    root = target.storage_paths.get(category) or f"{target.data_dir.rstrip('/')}/{category}"
    if root == "~":
        return "."
    return root[2:] if root.startswith("~/") else root


def parse_stats(output: str) -> tuple[int, int]:
    """(literal bytes sent, bytes matched from the local basis) from `rsync --stats`."""
    found = {kind: int(re.sub(r"[,.]", "", value)) for kind, value in _STAT.findall(output)}
    return found.get("Literal", 0), found.get("Matched", 0)


def rsync_temp_name(final_name: str) -> str:
    """rsync's destination for `final_name`, one per file name (not per version): its partial
    file in PARTIAL_DIR is the delta basis of the next version and is replaced by it, so a
    superseded version's partial never stays behind."""
    digest = hashlib.sha256(final_name.encode(errors="surrogateescape")).hexdigest()
    return f"{TEMP_PREFIX}rsync-{digest[:40]}"


def classify_failure(where: str, status: int, stderr: str) -> FileTransferError:
    """The error for an rsync that exited `status`, from the helper's marker lines."""
    for line in stderr.splitlines():
        if line.startswith(MARKER):
            kind, _, message = line[len(MARKER) :].strip().partition(": ")
            if kind == KIND_HOST_KEY:
                return SshHostKeyError(message)
            if kind == KIND_AUTH:
                return SshAuthError(message)
            return FileTransferError(f"{where}: ssh: {message}")
    tail = " | ".join(stderr.strip().splitlines()[-5:])
    return FileTransferError(f"{where}: rsync exited {status}: {tail}")


class RsyncTransport(AsyncClosing):
    """Fetches files with `rsync` over SSH (owns the rsync child processes it starts; async
    context manager, close() idempotent and final).

    `targets` maps a peer's node id (or a callable maps a PeerRef) to its SshTarget;
    `remote_root(peer, category)` overrides where a category lives on the peer.
    `known_hosts` is the file the host keys are checked against (default
    ~/.ssh/known_hosts); an unknown or changed key raises SshHostKeyError.
    With `connections` (a connector, typically leasing from the node's SSH pool), rsync's
    remote shell runs its command through an SshRelay on those pooled connections, so every
    transfer from a host reuses one connection; without, each rsync opens its own.
    """

    name = "rsync"

    def __init__(
        self,
        targets: Targets,
        *,
        known_hosts: Path | None = None,
        timeouts: Timeouts | None = None,
        remote_root: RemoteRoot | None = None,
        bandwidth_bytes_per_s: float | None = None,
        rsync_binary: str = "rsync",
        python: str = sys.executable,
        connections: SshConnector | None = None,
    ) -> None:
        self._targets = targets
        self._known_hosts = (known_hosts or DEFAULT_KNOWN_HOSTS).expanduser()
        self._timeouts = timeouts if timeouts is not None else Timeouts()
        self._remote_root = remote_root
        self._bwlimit_kib = (
            max(1, int(bandwidth_bytes_per_s) // 1024) if bandwidth_bytes_per_s else 0
        )
        self._rsync = rsync_binary
        self._python = python
        self._children: set[asyncio.subprocess.Process] = set()
        self._closed = False
        self.relay = SshRelay(connections) if connections is not None else None

    async def close(self) -> None:
        """Stop running transfers (their partial files stay for a resume); idempotent."""
        self._closed = True
        for child in list(self._children):
            await _stop(child)
        if self.relay is not None:
            await self.relay.close()

    def target(self, peer: PeerRef) -> SshTarget:
        targets = self._targets
        if callable(targets):
            target = targets(peer)
        else:
            try:
                target = targets[peer.node_id]
            except KeyError:
                raise FileTransferError(f"{peer.node_id}: no SSH target configured") from None
        return target if target.host else _with_host(target, peer.host)

    def remote_path(self, peer: PeerRef, category: str, rel_path: str) -> str:
        if self._remote_root is not None:
            root = self._remote_root(peer, category)
        else:
            root = default_remote_root(self.target(peer), category)
        return f"{root.rstrip('/')}/{rel_path}"

    def command(self, peer: PeerRef, remote: str, local: Path) -> list[str]:
        """The rsync command line that copies `remote` from `peer` to `local` (through the
        relay once it is started)."""
        target = self.target(peer)
        rsh = [self._python, "-m", "sync.transports.ssh"]
        if self.relay is not None:
            rsh += ["--relay", str(self.relay.socket_path)]
            if target.jump:
                rsh += ["--jump", target.jump]
        else:
            rsh += ["--known-hosts", str(self._known_hosts)]
        rsh += ["--port", str(target.port), "--connect-timeout", str(self._timeouts.ssh_connect_s)]
        if target.key_path:
            rsh += ["--key", str(Path(target.key_path).expanduser())]
        if target.user:
            rsh += ["--user", target.user]
        argv = [self._rsync, "--rsh", shlex.join(rsh), f"--partial-dir={PARTIAL_DIR}"]
        argv += [f"--timeout={max(1, int(self._timeouts.sync_piece_s))}", "--stats"]
        if self._bwlimit_kib:
            argv.append(f"--bwlimit={self._bwlimit_kib}")
        return [*argv, f"{target.host}:{remote}", str(local)]

    async def fetch(
        self, peer: PeerRef, category: str, entry: ManifestEntry, dest_root: Path
    ) -> TransferResult:
        """Install `entry` from `peer` at `dest_root`/`entry.path` (see Transport)."""
        if self._closed:
            raise FileSyncError("rsync transport is closed")
        started = time.monotonic()
        final = dest_path(dest_root, entry.path)
        temp = final.parent / rsync_temp_name(final.name)
        where = f"{peer.node_id}:{category}/{entry.path}"
        try:
            await asyncio.to_thread(make_directories, dest_root, final.parent)
            resumed_before = _partial_size(temp)
            if self.relay is not None:
                await self.relay.start()
            argv = self.command(peer, self.remote_path(peer, category, entry.path), temp)
            output = await self._run(argv, where)
            literal, matched = parse_stats(output)
            await asyncio.to_thread(install_file, temp, final, entry)
            await asyncio.to_thread(_remove_empty_partial_dir, final.parent)
        except OSError as exc:
            raise FileSyncError(f"{where}: local file error: {exc}") from exc
        if matched or resumed_before:
            logger.info("%s: resumed, %d bytes matched locally", where, matched)
        return TransferResult.installed(
            peer, self.name, category, entry, transferred=literal, resumed=matched, started=started
        )

    async def _run(self, argv: list[str], where: str) -> str:
        """Run rsync to its end within `sync_s`; its stdout. Errors as FileTransferError."""
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
        try:
            child = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        except OSError as exc:
            raise FileTransferError(f"{where}: cannot start {argv[0]}: {exc}") from exc
        self._children.add(child)
        try:
            async with asyncio.timeout(self._timeouts.sync_s):
                stdout, stderr = await child.communicate()
        except TimeoutError as exc:
            raise FileTransferError(
                f"{where}: rsync took longer than {self._timeouts.sync_s} s"
            ) from exc
        finally:
            await _stop(child)
            self._children.discard(child)
        out, err = stdout.decode(errors="replace"), stderr.decode(errors="replace")
        if child.returncode != 0:
            raise classify_failure(where, child.returncode or -1, err)
        return out


def _die_with_parent() -> None:
    """In the rsync child before exec: SIGKILL it when this process dies, even by SIGKILL, so
    that no orphan keeps writing the temp file. (On SIGTERM rsync waits for its receiver,
    which finishes the file; killed, its SSH helper dies with it and the receiver, at the
    end of its input, keeps its partial file.)"""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _with_host(target: SshTarget, host: str) -> SshTarget:
    return dataclasses.replace(target, host=host)


def _partial_size(temp: Path) -> int:
    try:
        return (temp.parent / PARTIAL_DIR / temp.name).stat().st_size
    except FileNotFoundError:
        return 0


def _remove_empty_partial_dir(directory: Path) -> None:
    with contextlib.suppress(FileNotFoundError, OSError):
        (directory / PARTIAL_DIR).rmdir()


async def _stop(child: asyncio.subprocess.Process) -> None:
    """End `child` if still running: SIGTERM (rsync keeps its partial file), then SIGKILL.
    Waits through cancellation, then re-raises it."""
    if child.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGTERM)
    waiter = asyncio.ensure_future(child.wait())
    try:
        await asyncio.wait_for(asyncio.shield(waiter), _TERM_GRACE_S)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        await asyncio.shield(waiter)
