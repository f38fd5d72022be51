"""Elastic torch.distributed process groups formed from the local daemon's GET /v1/rendezvous.

torch is imported lazily, on the first join: importing this module never needs torch.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

from config import Timeouts
from config.quietlog import QuietLog
from node.errors import GroupError, MasterUnreachable, RendezvousError
from node.plan import Backend
from node.training.rendezvous import (
    DaemonEndpoint,
    NoRank,
    Rendezvous,
    daemon_endpoint,
    fetch_rendezvous,
    store_prefix,
)
from shoal.errors import GroupError as ShoalGroupError
from shoal.group import gloo_bound_to_route, torch_modules, use_cuda_device, wait_for_master

log = logging.getLogger(__name__)

ENV_LOCAL_RANK = "LOCAL_RANK"
"""The local rank of this process on its node (torchrun's variable); join_group reads it."""


def choose_backend(requested: Backend, cuda_available: bool) -> Backend:
    """NCCL only when asked for and CUDA is available; gloo otherwise."""
    return "nccl" if requested == "nccl" and cuda_available else "gloo"


class ElasticGroup:
    """The torch.distributed default process group of this process, re-formed per generation.

    The process is local rank `local_rank` (None: 0) of its node, and asks the daemon for that
    local rank's rendezvous. Owns the process group and, on rank 0, the TCPStore server. Not
    thread-safe.
    """

    def __init__(
        self,
        endpoint: DaemonEndpoint,
        timeouts: Timeouts | None = None,
        *,
        local_rank: int | None = None,
        changed_interval_s: float = 1.0,
        poll_interval_s: float = 0.2,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.endpoint = endpoint
        self.timeouts = timeouts or Timeouts()
        self.local_rank = 0 if local_rank is None else local_rank
        self._changed_interval_s = changed_interval_s
        self._poll_interval_s = poll_interval_s
        self._clock = clock
        self._rendezvous: Rendezvous | None = None
        self._formed: int | None = None
        self._store: Any = None
        self._last_poll = -float("inf")
        self._changed = False
        self._quiet = QuietLog(log)
        self._closed = False

    @property
    def rendezvous(self) -> Rendezvous:
        """The rendezvous of the group formed now; GroupError between a failure and regroup."""
        if self._rendezvous is None or self._store is None:
            raise GroupError("no process group is formed; call regroup()")
        return self._rendezvous

    @property
    def generation(self) -> int:
        return self.rendezvous.generation

    @property
    def rank(self) -> int:
        rank = self.rendezvous.rank
        assert rank is not None
        return rank

    @property
    def world_size(self) -> int:
        return self.rendezvous.world_size

    @property
    def local_world_size(self) -> int:
        return self.rendezvous.local_world_size

    @property
    def store(self) -> Any:
        """The generation's PrefixStore (keys land under shoal/gen<generation>/)."""
        if self._store is None:
            raise GroupError("no process group is formed; call regroup()")
        return self._store

    def changed(self) -> bool:
        """True once the daemon shows another group for this node (or none); polls at most once
        per `changed_interval_s` (each poll waits at most peer_status_s), else answers from the
        last poll. A failed poll answers False and is logged."""
        now = self._clock()
        if self._changed or now - self._last_poll < self._changed_interval_s:
            return self._changed
        self._last_poll = now
        try:
            answer = fetch_rendezvous(self.endpoint, self.timeouts.peer_status_s, self.local_rank)
        except RendezvousError as exc:
            self._quiet.failed(
                "rendezvous", "generation %s: cannot check the rendezvous: %s", self._formed, exc
            )
            return False
        self._quiet.clear("rendezvous")
        current = answer if isinstance(answer, Rendezvous) and answer.rank is not None else None
        self._changed = self._rendezvous is None or not self._rendezvous.same_group(current)
        return self._changed

    def regroup(self, timeout_s: float | None = None) -> None:
        """Destroy the process group, wait until the daemon shows a generation other than the
        last formed one with a rank for this node, and form it; GroupError after `timeout_s`
        (default quorum_s)."""
        if self._closed:
            raise GroupError("the group is closed")
        deadline = self._clock() + (self.timeouts.quorum_s if timeout_s is None else timeout_s)
        self._destroy()
        rendezvous = self._wait_for_rank(deadline)
        self._store = _form(rendezvous, self.timeouts, deadline, self._clock)
        self._rendezvous, self._formed = rendezvous, rendezvous.generation
        self._changed = False
        self._last_poll = self._clock()
        log.info("generation %s: formed the group: %s", rendezvous.generation, rendezvous)

    def close(self) -> None:
        """Destroy the process group; idempotent and final."""
        self._closed = True
        self._destroy()

    def __enter__(self) -> ElasticGroup:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _wait_for_rank(self, deadline: float) -> Rendezvous:
        problem = "no answer yet"
        while True:
            try:
                answer = fetch_rendezvous(self.endpoint, deadline - self._clock(), self.local_rank)
            except RendezvousError as exc:
                answer, problem = None, str(exc)
            if isinstance(answer, Rendezvous) and answer.local_rank != self.local_rank:
                problem = f"answered local rank {answer.local_rank}, not {self.local_rank}"
            elif isinstance(answer, Rendezvous):
                if answer.rank is not None and answer.generation != self._formed:
                    return answer
                problem = f"generation {answer.generation}, rank {answer.rank}"
            elif isinstance(answer, NoRank):
                problem = f"{answer.status}: {answer.reason}"
            left_s = deadline - self._clock()
            if left_s <= 0:
                raise GroupError(
                    f"{self.endpoint.url} showed no generation but {self._formed} with a rank "
                    f"for this node in time (last answer: {problem})"
                )
            time.sleep(min(self._poll_interval_s, left_s))

    def _destroy(self) -> None:
        if self._store is None:
            return
        self._store = None
        dist = _torch()[1]
        try:
            if dist.is_initialized():
                dist.destroy_process_group()
        except RuntimeError as exc:
            log.warning("generation %s: destroying the process group failed: %s", self._formed, exc)


def join_group(
    timeout_s: float | None = None,
    daemon_url: str | None = None,
    *,
    local_rank: int | None = None,
    secret_file: str | Path | None = None,
    node_id: str | None = None,
    timeouts: Timeouts | None = None,
    changed_interval_s: float = 1.0,
) -> ElasticGroup:
    """Form this process's torch.distributed group from the daemon's rendezvous of its local
    rank (`local_rank`, else the LOCAL_RANK environment variable, else 0): wait up to
    `timeout_s` (default quorum_s) for a rank, then join rank 0's store; GroupError if not.
    With NCCL the process's CUDA device becomes the rendezvous's `cuda_device` first."""
    timeouts = timeouts or Timeouts()
    endpoint = daemon_endpoint(daemon_url, secret_file, node_id, timeouts=timeouts)
    group = ElasticGroup(
        endpoint,
        timeouts,
        local_rank=local_rank_from_env() if local_rank is None else local_rank,
        changed_interval_s=changed_interval_s,
    )
    group.regroup(timeout_s)
    return group


def local_rank_from_env(env: Mapping[str, str] | None = None) -> int:
    """LOCAL_RANK of the environment (0 when unset); GroupError when it is not an integer."""
    text = (os.environ if env is None else env).get(ENV_LOCAL_RANK, "").strip()
    if not text:
        return 0
    if not text.isdigit():
        raise GroupError(f"{ENV_LOCAL_RANK}={text!r} is not an integer >= 0")
    return int(text)


def _form(
    rendezvous: Rendezvous, timeouts: Timeouts, deadline: float, clock: Callable[[], float]
) -> Any:
    """Connect to (rank 0: host) the generation's store and init the default group on it."""
    torch, dist = _torch()
    generation, rank, size = rendezvous.generation, rendezvous.rank, rendezvous.world_size
    address, port = rendezvous.master_addr, rendezvous.master_port
    backend = choose_backend(rendezvous.backend, torch.cuda.is_available())
    if backend != rendezvous.backend:
        log.warning("generation %s: CUDA is unavailable; using gloo, not nccl", generation)
    device_id = _use_cuda_device(torch, rendezvous) if backend == "nccl" else None
    if rank != 0:
        _wait_for_master(rendezvous, deadline, clock)
    join_s = max(1.0, deadline - clock())
    try:
        store = dist.TCPStore(address, port, size, rank == 0, timeout=timedelta(seconds=join_s))
    except RuntimeError as exc:
        if rank != 0:
            raise MasterUnreachable(
                f"generation {generation}: cannot join the store at {address}:{port}: {exc}"
            ) from exc
        raise GroupError(
            f"generation {generation}: rank 0 could not host the store on port {port}, "
            f"or not all {size} ranks joined in {join_s:.1f} s: {exc}"
        ) from exc
    collective = timedelta(seconds=timeouts.collective_s)
    store.set_timeout(collective)
    prefixed = dist.PrefixStore(store_prefix(generation), store)
    try:
        with gloo_bound_to_route(address if backend == "gloo" else None):
            dist.init_process_group(
                backend,
                store=prefixed,
                rank=rank,
                world_size=size,
                timeout=collective,
                **({} if device_id is None else {"device_id": device_id}),
            )
    except RuntimeError as exc:
        raise GroupError(
            f"generation {generation}: {backend} group of {size} at {address}:{port} "
            f"did not form: {exc}"
        ) from exc
    return prefixed


def _use_cuda_device(torch: Any, rendezvous: Rendezvous) -> Any:
    """The rendezvous's CUDA device (its local rank's, else the local rank), made this
    process's current device: the `device_id` of the NCCL group (GroupError if not seen)."""
    try:
        return use_cuda_device(
            torch, rendezvous.generation, rendezvous.local_rank, rendezvous.cuda_device
        )
    except ShoalGroupError as exc:
        raise GroupError(str(exc)) from None


def _wait_for_master(rendezvous: Rendezvous, deadline: float, clock: Callable[[], float]) -> None:
    """Probe rank 0's port until it accepts, so the error names it and the deadline holds."""
    address, port = rendezvous.master_addr, rendezvous.master_port
    try:
        wait_for_master(address, port, rendezvous.generation, deadline, clock)
    except ShoalGroupError as exc:
        raise MasterUnreachable(str(exc)) from exc.__cause__


def _torch() -> tuple[Any, Any]:
    """torch and torch.distributed (shoal.group's import), GroupError without them."""
    try:
        return torch_modules()
    except ShoalGroupError as exc:
        raise GroupError(str(exc)) from exc.__cause__
