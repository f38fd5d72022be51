"""Checkpoints of a training group: every rank writes its part of the state with
torch.distributed.checkpoint (DCP; `async_save`, so the loop goes on while the files are
written) into its node's checkpoint directory, one directory per step, and reports the files
it wrote to its daemon; the cluster commits a step once every rank reported it. `restore`
loads the newest committed step (DCP reshards to the current world size), after the daemon
fetched what this node lacks from the peers that hold it.

Without a daemon (plain torchrun: no client, or none answers) both work on a directory the
ranks share (SHOAL_CHECKPOINT_DIR, else ./checkpoints): restore takes the newest step DCP
finished. `session.save` and `session.restore` delegate here.
"""

from __future__ import annotations

import datetime
import logging
import os
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import async_save as dcp_async_save
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from shoal._checkpoint_files import (
    METADATA,
    METADATA_COPY,
    PIECE_BYTES,
    checkpoint_root,
    finished_steps,
    link_metadata,
    report_entry,
    step_directory,
)
from shoal._daemon import DaemonClient
from shoal.errors import CheckpointError, DaemonAnswerError, DaemonUnreachableError, ShoalError
from shoal.group import gloo_bound_to_route
from shoal.live import TrainingState
from shoal.place import RankPlace

__all__ = ["CHECKPOINTS_PATH", "Checkpointer"]

log = logging.getLogger(__name__)

CHECKPOINTS_PATH = "/v1/checkpoints"
WRITTEN_PATH = "/v1/checkpoints/written"
PREPARE_PATH = "/v1/checkpoints/prepare"
RESTORED_PATH = "/v1/checkpoints/restored"
ENV_TIMEOUT = "SHOAL_CHECKPOINT_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 600.0
"""Bound of one checkpoint collective (the save's gather of every rank's write, the restore's
load) and of the daemon's fetch of a step from peers; SHOAL_CHECKPOINT_TIMEOUT_S overrides."""
DCP_ERRORS = (Exception, CheckpointException)
"""What a DCP call raises (its CheckpointException, naming every rank's error, is a
BaseException)."""
RETRY_S = 60.0
"""How long a restore asks its daemon again while it answers 503 (no coordinator yet)."""
FALLBACK_AFTER_S = 15.0
"""How long a restore waits for the files of a committed step that some node cannot have (its
only holders are down, for example in the second between a commit and its copies) before every
rank falls back to the next older kept step (the oldest one waits RETRY_S)."""
RETRY_PAUSE_S = 1.0
REPORT_TRIES = 3
REPORT_RETRY_S = 1.0

Choice = tuple[int, int, bool]


@dataclass
class _Write:
    """A write in flight: DCP's future, the step, its directory; `failed` once recorded."""

    future: Future[Any]
    step: int
    directory: Path
    failed: bool = False


"""(step, generation, through the daemon) of the step a restore loads."""


class Checkpointer:
    """Saves and restores one rank's part of the training state (module docstring). Not
    thread-safe: call it from the training loop. A background write's failure is recorded and
    raised by the next `save` (or taken by `failure()`), never only logged."""

    def __init__(
        self, place: RankPlace, client: DaemonClient | None, *, master_addr: str | None = None
    ) -> None:
        self.place = place
        self.master_addr = master_addr or os.environ.get("MASTER_ADDR")
        """The training group's master: the checkpoint group advertises the address that
        reaches it (a process that joined through the daemon has no MASTER_ADDR)."""
        self.root = checkpoint_root(os.environ)
        self.timeout_s = float(os.environ.get(ENV_TIMEOUT) or DEFAULT_TIMEOUT_S)
        self._client = client
        self._group: Any = None
        self._grouped = False
        self._writing: _Write | None = None
        self._stager: DefaultStager | None = None
        self._reports = ThreadPoolExecutor(1, thread_name_prefix="shoal-checkpoint")
        self._lock = threading.Lock()
        self._failure: BaseException | None = None
        self._restored: int | None = None
        self._closed = False
        self.last_save_stall_s: float | None = None
        """How long the last `save` held the loop (staging, or the whole write when blocking)."""

    # saving

    def save(self, state: Mapping[str, Any], step: int, *, blocking: bool = False) -> None:
        """Write `state` as step `step` (every rank calls it with the same step). Returns once
        the state is staged (copied) unless `blocking`; a save still writing is waited for
        first. A step not above the one restored is skipped (its files are committed)."""
        self._check_open()
        started = time.monotonic()
        self._wait_writing()
        self._raise_failure()
        if self._restored is not None and step <= self._restored:
            log.info("checkpoint: step %d is not above the restored step %d", step, self._restored)
            return
        directory = self.root / step_directory(step, self.place.generation)
        group = self._checkpoint_group()
        alone = group is None
        try:
            if blocking:
                metadata = dcp_save(
                    dict(state), checkpoint_id=directory, process_group=group, no_dist=alone
                )
                self._reports.submit(self._report, step, directory, metadata)
            else:
                writing: Future[Any] = dcp_async_save(  # type: ignore[assignment]
                    dict(state),
                    checkpoint_id=directory,
                    process_group=group,
                    no_dist=alone,
                    async_stager=self._staging(),
                )
                write = _Write(writing, step, directory)
                self._writing = write
                writing.add_done_callback(lambda _: self._written(write))
        except DCP_ERRORS as exc:
            raise CheckpointError(f"step {step}: saving into {directory} failed: {exc}") from exc
        self.last_save_stall_s = time.monotonic() - started

    def _staging(self) -> DefaultStager:
        """One stager for every save, so the host copies reuse their buffers (pinned ones on
        CUDA). Staging stays synchronous: the loop may change the state once `save` returns."""
        if self._stager is None:
            cuda = torch.cuda.is_available()
            options = StagingOptions(
                use_pinned_memory=cuda,
                use_shared_memory=False,
                use_async_staging=False,
                use_non_blocking_copy=cuda,
            )
            self._stager = DefaultStager(options)
        return self._stager

    def _written(self, write: _Write) -> None:
        """DCP's thread: the write of a step ended; report it (or record its failure)."""
        error = write.future.exception()
        if error is not None:
            self._write_failed(write, error)
            return
        self._reports.submit(self._report, write.step, write.directory, write.future.result())

    def _write_failed(self, write: _Write, error: BaseException) -> None:
        """Record the failure of `write` once (its callback or a wait, whichever sees it first;
        stored before either returns, so the next save raises it)."""
        failure = CheckpointError(f"step {write.step}: writing {write.directory} failed: {error}")
        with self._lock:
            if write.failed:
                return
            write.failed = True
            if self._failure is None:
                self._failure = failure
        log.error("checkpoint: %s", failure)

    def _report(self, step: int, directory: Path, metadata: Any) -> None:
        """The report thread: tell the daemon which files this rank wrote (and their hashes)."""
        try:
            names = own_files(metadata, self.place.rank)
            if self.place.rank == 0:
                link_metadata(directory, source=METADATA, target=METADATA_COPY)
                names.append(METADATA_COPY)
            if self._client is None:
                return
            files = [report_entry(directory, name) for name in names]
        except OSError as exc:
            self._record(CheckpointError(f"step {step}: reading {directory} failed: {exc}"))
            return
        body = {
            "step": step,
            "generation": self.place.generation,
            "rank": self.place.rank,
            "world_size": self.place.world_size,
            "directory": directory.name,
            "piece_size": PIECE_BYTES,
            "files": files,
        }
        self._post_report(body)

    def _post_report(self, body: dict[str, Any]) -> None:
        assert self._client is not None
        for attempt in range(REPORT_TRIES):
            try:
                self._client.request("POST", WRITTEN_PATH, body)
                return
            except DaemonUnreachableError as exc:
                if attempt + 1 == REPORT_TRIES:
                    # The step stays uncommitted (never restored): no failure of the training.
                    log.warning("checkpoint: step %s not reported: %s", body["step"], exc)
                    return
                time.sleep(REPORT_RETRY_S * (attempt + 1))
            except DaemonAnswerError as exc:
                self._record(CheckpointError(f"step {body['step']}: the daemon refused: {exc}"))
                return

    # restoring

    def restore(self, state: TrainingState) -> int | None:
        """Load the newest committed step into `state` (every rank calls it); its step, or None
        when there is none. The daemon first fetches the files this node lacks from peers;
        when some node cannot have them within FALLBACK_AFTER_S (their only holders are down),
        every rank falls back to the next older kept committed step."""
        self._check_open()
        self._wait_writing()
        self._raise_failure()
        group = self._checkpoint_group()
        candidates = broadcast_candidates(self._candidates() if self.place.rank == 0 else [], group)
        for index, (step, generation, through_daemon) in enumerate(candidates):
            older = candidates[index + 1 :]
            directory = self.root / step_directory(step, generation)
            failure: CheckpointError | None = None
            if through_daemon:
                wait_s = FALLBACK_AFTER_S if older else RETRY_S
                try:
                    directory = self._prepare(step, generation, directory, wait_s)
                except CheckpointError as exc:
                    failure = exc
            if every_rank_ready(failure is None, group):
                return self._load(state, step, directory, through_daemon)
            if not older:
                raise failure or CheckpointError(
                    f"step {step}: another node cannot have its files; no older kept step"
                )
            log.warning(
                "checkpoint: rank %d: step %d cannot be had on every node (%s); falling back "
                "to step %d",
                self.place.rank,
                step,
                failure or "another node's files are missing",
                older[0][0],
            )
        return None

    def _load(self, state: TrainingState, step: int, directory: Path, through_daemon: bool) -> int:
        started = time.monotonic()
        group = self._checkpoint_group()
        try:
            dcp_load(state, checkpoint_id=directory, process_group=group, no_dist=group is None)
        except DCP_ERRORS as exc:
            raise CheckpointError(f"step {step}: loading {directory} failed: {exc}") from exc
        self._restored = step
        if through_daemon and self._client is not None:
            body = {"step": step, "rank": self.place.rank, "seconds": time.monotonic() - started}
            try:
                self._client.request("POST", RESTORED_PATH, body)
            except ShoalError as exc:
                log.warning("checkpoint: restore of step %d not recorded: %s", step, exc)
        log.info("checkpoint: rank %d restored step %d from %s", self.place.rank, step, directory)
        return step

    def _candidates(self) -> list[Choice]:
        """Rank 0: the daemon's kept committed steps, newest first (the newest committed one
        leads), else the newest step DCP finished in the shared directory (no daemon
        answers); empty when there is none."""
        if self._client is not None:
            try:
                answer = self._ask("GET", CHECKPOINTS_PATH, None, RETRY_S)
            except DaemonUnreachableError as exc:
                log.warning("checkpoint: no daemon (%s); restoring from %s", exc, self.root)
            except DaemonAnswerError as exc:
                raise CheckpointError(f"cannot read the committed checkpoint: {exc}") from exc
            else:
                return committed_candidates(answer)
        finished = finished_steps(self.root)
        if not finished:
            return []
        step, generation = finished[-1]
        return [(step, generation, False)]

    def _prepare(self, step: int, generation: int, directory: Path, wait_s: float) -> Path:
        """Ask the daemon to have every file of the step here (asking again for `wait_s` while
        it cannot); the directory to load."""
        assert self._client is not None
        body = {"step": step, "generation": generation}
        try:
            answer = self._ask("POST", PREPARE_PATH, body, wait_s)
        except DaemonUnreachableError as exc:
            log.warning(
                "checkpoint: no daemon to fetch step %d (%s); loading %s", step, exc, directory
            )
            return directory
        except DaemonAnswerError as exc:
            raise CheckpointError(f"step {step}: the daemon cannot restore it: {exc}") from exc
        return Path(answer["directory"])

    def _ask(self, method: str, path: str, body: dict[str, Any] | None, wait_s: float) -> Any:
        """The daemon's answer, asked again while it answers 503 (no coordinator yet, a
        failover, holders not reachable) for up to `wait_s`."""
        assert self._client is not None
        deadline = time.monotonic() + wait_s
        while True:
            try:
                return self._client.request(method, path, body, timeout_s=self.timeout_s)
            except DaemonAnswerError as exc:
                if exc.status != 503 or time.monotonic() > deadline:
                    raise
                log.info("checkpoint: %s %s: %s; asking again", method, path, exc.reason)
                time.sleep(RETRY_PAUSE_S)

    # failures and closing

    def failure(self) -> BaseException | None:
        """The failure of a background save since the last call (taken once), or None."""
        with self._lock:
            failure, self._failure = self._failure, None
        return failure

    def close(self) -> None:
        """Wait for a save in flight and its report; idempotent. A failure it had is left for
        `failure()`."""
        if self._closed:
            return
        self._closed = True
        try:
            self._wait_writing()
        finally:
            self._reports.shutdown(wait=True)
            if self._stager is not None:
                self._stager.close()

    def abandon(self) -> None:
        """Close without waiting: the group re-formed in place and a save in flight may wait on
        a rank that is gone. Its step was written by a generation that did not finish it, so it
        is never committed; its failure is only logged. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._writing = None
        self._reports.shutdown(wait=False)

    def _record(self, failure: BaseException) -> None:
        log.error("checkpoint: %s", failure)
        with self._lock:
            if self._failure is None:
                self._failure = failure

    def _raise_failure(self) -> None:
        failure = self.failure()
        if failure is not None:
            raise failure

    def _check_open(self) -> None:
        if self._closed:
            raise CheckpointError("the checkpointer is closed")

    def _wait_writing(self) -> None:
        """Wait for the write in flight (its failure recorded, to be raised by the caller)."""
        write, self._writing = self._writing, None
        if write is None:
            return
        try:
            write.future.result(timeout=self.timeout_s)
        except DCP_ERRORS as exc:
            self._write_failed(write, exc)

    def _checkpoint_group(self) -> Any:
        """A gloo group of every rank for DCP's collectives (made once, by every rank at the same
        call): the async write runs them in a thread, which must never interleave with the
        training loop's collectives on its own group. None without torch.distributed."""
        if not self._grouped:
            self._grouped = True
            if dist.is_available() and dist.is_initialized():
                timeout = datetime.timedelta(seconds=self.timeout_s)
                # advertise the address that reaches the master (not the hostname's, often
                # 127.0.x.1: peers on other hosts could not connect), as the training group does
                with gloo_bound_to_route(self.master_addr):
                    self._group = dist.new_group(backend="gloo", timeout=timeout)
        return self._group


def own_files(metadata: Any, rank: int) -> list[str]:
    """The names of the files rank `rank` wrote, from DCP's metadata of the save (its
    `storage_data` names every item's file; rank r's files begin `__r_`)."""
    prefix = f"__{rank}_"
    storage = getattr(metadata, "storage_data", None) or {}
    names = {getattr(info, "relative_path", "") for info in storage.values()}
    return sorted(name for name in names if name.startswith(prefix))


def committed_candidates(answer: Any) -> list[Choice]:
    """The steps of a `GET /v1/checkpoints` answer a restore may load, newest first: the
    committed one, then the older kept ones."""
    if not isinstance(answer, dict) or not answer.get("committed"):
        return []
    committed = answer["committed"]
    newest = (int(committed["step"]), int(committed["generation"]))
    kept = [(int(item["step"]), int(item["generation"])) for item in answer.get("steps") or []]
    older = sorted((item for item in kept if item < newest), reverse=True)
    return [(step, generation, True) for step, generation in [newest, *older]]


def broadcast_candidates(candidates: list[Choice], group: Any) -> list[Choice]:
    """Rank 0's candidates, on every rank of `group` (itself without torch.distributed)."""
    if group is None:
        return candidates
    box: list[Any] = [candidates]
    dist.broadcast_object_list(box, src=0, group=group)
    return [(int(step), int(gen), bool(daemon)) for step, gen, daemon in box[0]]


def every_rank_ready(ready: bool, group: Any) -> bool:
    """Whether every rank of `group` is `ready` (this rank's answer without one)."""
    if group is None:
        return ready
    answers: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(answers, ready, group=group)
    return all(bool(answer) for answer in answers)
