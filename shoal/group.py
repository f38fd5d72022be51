"""The training group of one process, in torchft's shape: one long-lived object configured per
generation (`configure(rendezvous)`: a new process group under the generation's store prefix),
`abort()` for a hung communicator, and errors of background threads recorded (`report_error`)
and read with `errored()`, never only logged.

torch is imported on the first `configure`, so `import shoal` never needs it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

from shoal.errors import GroupError
from shoal.rendezvous import Backend, Rendezvous

__all__ = ["TrainingGroup", "choose_backend", "interface_towards", "torch_modules"]

log = logging.getLogger(__name__)


RELEASE_MARGIN_S = 5.0
"""A left group is released this long after its collective timeout (shoal.group.release_later)."""


def release_later(objects: list[Any], after_s: float) -> threading.Thread:
    """Drop the last references to `objects` (left process groups) after `after_s`, in a daemon
    thread: their destructors then run there, never in the training thread."""

    def hold() -> None:
        time.sleep(after_s)
        objects.clear()

    thread = threading.Thread(target=hold, name="shoal-release-groups", daemon=True)
    thread.start()
    return thread


def torch_modules() -> tuple[Any, Any]:
    """torch and torch.distributed, imported on first use without NumPy's import warning;
    GroupError when torch or torch.distributed is missing."""
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Failed to initialize NumPy", UserWarning)
            import torch
            import torch.distributed as dist
    except ImportError as exc:
        raise GroupError(f"torch is not installed ({exc}); install shoal[torch]") from exc
    if not dist.is_available():
        raise GroupError("this torch build has no torch.distributed")
    return torch, dist


def choose_backend(requested: Backend | None, cuda_available: bool) -> Backend:
    """NCCL when asked for (or nothing was asked) and CUDA is available; gloo otherwise."""
    return "nccl" if requested in ("nccl", None) and cuda_available else "gloo"


def interface_towards(address: str) -> str | None:
    """The name of the local interface whose address routes to `address`, or None."""
    try:
        import ifaddr  # zeroconf's dependency; absent in a bare training environment
    except ImportError:
        return None
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((address, 9))  # no packet is sent: this only asks the routing table
            local = str(probe.getsockname()[0])
    except OSError:
        return None
    for adapter in ifaddr.get_adapters():
        if any(ip.ip == local for ip in adapter.ips):
            return str(adapter.nice_name)
    return None


@contextlib.contextmanager
def gloo_bound_to_route(master_addr: str | None) -> Iterator[None]:
    """While a gloo group forms, make it advertise the address that reaches the master, not
    the hostname's (often 127.0.x.1 in /etc/hosts). An operator's GLOO_SOCKET_IFNAME wins; the
    environment is restored afterwards so nothing leaks into child processes."""
    name = None
    if master_addr is not None and not os.environ.get("GLOO_SOCKET_IFNAME"):
        name = interface_towards(master_addr)
    if name is None:
        yield
        return
    os.environ["GLOO_SOCKET_IFNAME"] = name
    try:
        yield
    finally:
        os.environ.pop("GLOO_SOCKET_IFNAME", None)


def wait_for_master(
    address: str, port: int, generation: int, deadline: float, clock: Callable[[], float]
) -> None:
    """Probe rank 0's store port until it accepts, so the error names it and the deadline
    holds; MasterUnreachable-like GroupError when it never does."""
    started = clock()
    while True:
        try:
            wait_s = max(0.05, min(1.0, deadline - clock()))
            with socket.create_connection((address, port), timeout=wait_s):
                return
        except OSError as exc:
            if clock() + 0.1 >= deadline:
                raise GroupError(
                    f"generation {generation}: master {address}:{port} unreachable for "
                    f"{clock() - started:.1f} s ({exc})"
                ) from exc
        time.sleep(0.1)


def use_cuda_device(torch: Any, generation: int, local_rank: int, cuda_device: int | None) -> Any:
    """Make `cuda_device` (None: the local rank's) this process's CUDA device and return it as
    the `device_id` of an NCCL group; GroupError naming CUDA_VISIBLE_DEVICES when this process
    does not see it (node.training.groups forms its groups with it too)."""
    index = local_rank if cuda_device is None else cuda_device
    count = int(torch.cuda.device_count())
    if index >= count:
        raise GroupError(
            f"generation {generation}: local rank {local_rank} needs CUDA device "
            f"{index} but this process sees {count} (CUDA_VISIBLE_DEVICES="
            f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')!r})"
        )
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


JOINED_KEY = "shoal/joined"
"""The store key each rank adds 1 to when it joined (form_group's barrier with `give_way`)."""
JOIN_POLL_S = 0.05


def join_barrier(
    store: Any,
    size: int,
    generation: int,
    deadline: float,
    give_way: Callable[[], str | None],
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Wait until all `size` ranks joined `store` (each adds 1 to JOINED_KEY), asking
    `give_way` every JOIN_POLL_S: GroupError when it names a reason (a newer generation) or at
    `deadline`, naming how many joined."""
    try:
        joined = int(store.add(JOINED_KEY, 1))
        while joined < size:
            reason = give_way()
            if reason is not None:
                raise GroupError(
                    f"generation {generation}: {reason} ({joined}/{size} ranks joined)"
                )
            if clock() >= deadline:
                raise GroupError(
                    f"generation {generation}: {joined} of {size} ranks joined before the deadline"
                )
            time.sleep(JOIN_POLL_S)
            joined = int(store.add(JOINED_KEY, 0))
    except RuntimeError as exc:  # DistNetworkError: rank 0 left (its store is gone)
        raise GroupError(f"generation {generation}: the store went away: {exc}") from exc


def form_group(
    rendezvous: Rendezvous,
    collective_s: float,
    deadline: float,
    clock: Callable[[], float] = time.monotonic,
    give_way: Callable[[], str | None] | None = None,
) -> tuple[Any, Backend]:
    """Connect to the generation's store (rank 0 hosts it, unless torchrun's agent does) and
    init the default process group on it under the generation's prefix: (the prefixed store,
    the backend used). GroupError names the generation, the master and why. With `give_way`
    (a session re-forming in place) the ranks meet at a barrier of their own that gives up as
    soon as `give_way` names a reason (a newer generation), instead of rank 0's store waiting
    for every rank until the deadline."""
    torch, dist = torch_modules()
    place, address, port = rendezvous.place, rendezvous.master_addr, rendezvous.master_port
    generation, rank, size = place.generation, place.rank, place.world_size
    backend = choose_backend(rendezvous.backend, bool(torch.cuda.is_available()))
    if rendezvous.backend == "nccl" and backend != "nccl":
        log.warning("generation %s: CUDA is unavailable; using gloo, not nccl", generation)
    device_id = (
        use_cuda_device(torch, generation, rendezvous.place.local_rank, rendezvous.cuda_device)
        if backend == "nccl"
        else None
    )
    hosts = rendezvous.host_store and rank == 0
    if not hosts:
        wait_for_master(address, port, generation, deadline, clock)
    join_s = max(1.0, deadline - clock())
    try:
        store = dist.TCPStore(
            address,
            port,
            size,
            hosts,
            timeout=timedelta(seconds=join_s),
            wait_for_workers=give_way is None,
        )
    except RuntimeError as exc:
        what = "host the store on" if hosts else "join the store at"
        raise GroupError(
            f"generation {generation}: rank {rank} could not {what} {address}:{port} "
            f"within {join_s:.1f} s: {exc}"
        ) from exc
    collective = timedelta(seconds=collective_s)
    store.set_timeout(collective)
    prefixed = dist.PrefixStore(rendezvous.store_prefix, store)
    if give_way is not None:
        join_barrier(prefixed, size, generation, deadline, give_way, clock)
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
    except (RuntimeError, ValueError) as exc:
        raise GroupError(
            f"generation {generation}: {backend} group of {size} at {address}:{port} "
            f"did not form: {exc}"
        ) from exc
    return prefixed, backend


class TrainingGroup:
    """This process's torch.distributed default group, re-formed per generation (torchft's
    ProcessGroup shape). Thread-safe for `abort`, `report_error` and `errored`; `configure`
    and `close` belong to the training thread."""

    def __init__(
        self,
        *,
        collective_timeout_s: float,
        join_timeout_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.collective_timeout_s = collective_timeout_s
        self.join_timeout_s = join_timeout_s
        self._clock = clock
        self._lock = threading.Lock()
        self._rendezvous: Rendezvous | None = None
        self._store: Any = None
        self._backend: Backend | None = None
        self._error: BaseException | None = None
        self._owned = False
        self._closed = False

    @property
    def rendezvous(self) -> Rendezvous | None:
        """The generation's rendezvous this group was configured with, or None."""
        return self._rendezvous

    @property
    def backend(self) -> Backend | None:
        return self._backend

    @property
    def store(self) -> Any:
        """The generation's PrefixStore (None before `configure`, or for an adopted group)."""
        return self._store

    def configure(
        self,
        rendezvous: Rendezvous,
        *,
        join_s: float | None = None,
        give_way: Callable[[], str | None] | None = None,
    ) -> None:
        """Leave the current group (its communicator aborted: a survivor of a failed generation
        must not wait on it) and form `rendezvous`'s within `join_s` (default join_timeout_s),
        giving up early when `give_way` names a reason (form_group); GroupError if it does not
        form. Clears the recorded error: a new generation starts clean."""
        if self._closed:
            raise GroupError("the training group is closed")
        if self._rendezvous is not None:
            self.abort()
            self._leave()
        deadline = self._clock() + (self.join_timeout_s if join_s is None else join_s)
        store, backend = form_group(
            rendezvous, self.collective_timeout_s, deadline, self._clock, give_way
        )
        with self._lock:
            self._rendezvous, self._store, self._backend = rendezvous, store, backend
            self._owned, self._error = True, None
        log.info(
            "generation %s: rank %s of %s formed a %s group",
            rendezvous.generation,
            rendezvous.place.rank,
            rendezvous.place.world_size,
            backend,
        )

    def adopt(self, rendezvous: Rendezvous) -> None:
        """Use the default group the script formed itself (it stays the script's to destroy)."""
        _, dist = torch_modules()
        with self._lock:
            self._rendezvous, self._owned = rendezvous, False
            self._backend = dist.get_backend()

    def abort(self) -> None:
        """Abort the communicator of a group this object formed, from any thread: with NCCL a
        collective blocked on a dead or stopped peer fails at once (gloo has nothing to abort;
        its collectives end at their timeout). The group itself is left by `configure` or
        `close`, in the training thread. Idempotent."""
        if not self._owned or self._backend != "nccl":
            return
        _, dist = torch_modules()
        with contextlib.suppress(RuntimeError, AttributeError, ValueError):
            dist.distributed_c10d._get_default_group().abort()

    def _leave(self) -> None:
        """Destroy the default group, if this object formed it."""
        with self._lock:
            owned, self._owned, self._store = self._owned, False, None
        if not owned:
            return
        _, dist = torch_modules()
        if not dist.is_initialized():
            return
        # A gloo group's destructor joins its worker thread, which waits out an operation given
        # up on (a peer stopped) until the collective timeout: keep every group alive past it,
        # off the training thread, so leaving is immediate.
        world = getattr(dist.distributed_c10d, "_world", None)
        groups = list(getattr(world, "pg_map", {}) or {})
        try:
            dist.destroy_process_group()
        except (RuntimeError, ValueError) as exc:
            log.warning("destroying the process group failed: %s", exc)
        if groups:
            release_later(groups, self.collective_timeout_s + RELEASE_MARGIN_S)

    def report_error(self, exc: BaseException) -> None:
        """Record a background thread's failure (the first one stays until taken)."""
        with self._lock:
            if self._error is None:
                self._error = exc

    def errored(self) -> BaseException | None:
        """The recorded failure, if any (it stays recorded)."""
        return self._error

    def take_error(self) -> BaseException | None:
        """The recorded failure, cleared: each failure is raised once."""
        with self._lock:
            error, self._error = self._error, None
        return error

    def close(self) -> None:
        """Destroy the group this object formed; idempotent and final."""
        self._closed = True
        self._leave()
