"""The trainer's side of in-flight weight updates: handshake through the daemons, a bucketed
broadcast on the run's weights group, acknowledgements, and the WAL record of success.

A publish never waits past its deadline: receivers that do not say ready in the join window are
left out (they catch up from the weights file), a broadcast that does not finish in time is
abandoned with its group, and receivers that do not acknowledge are named in PublishTimeout.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from datetime import timedelta
from pathlib import Path
from typing import Any

from config import Timeouts
from node.errors import PeerRequestError, PublishTimeout, WeightsError
from node.plan import FENCE_HEADER
from node.rl.broadcast import (
    DEFAULT_BUCKET_BYTES,
    broadcast_weights,
    describe_params,
    torch_distributed,
)
from node.rl.client import call, post_digested
from node.rl.digest import (
    ALGOS,
    PWS_ALGO,
    SHA256_ALGO,
    Digest,
    HostStaging,
    digest_named,
    hash_pool,
)
from node.rl.files import write_weights_file
from node.rl.group import (
    TensorDevice,
    WeightsRendezvous,
    device_of,
    fetch_weights_rendezvous,
    new_weights_group,
    store_key_prefix,
    weights_backend,
)
from node.rl.published import PublishResult, phases_of, published_report
from node.training.rendezvous import daemon_endpoint

log = logging.getLogger(__name__)

FILE_GRACE_S = 0.5  # the weights file may finish this long after the deadline
ACK_POLL_S = 0.005
AUTO_ALGO = "auto"
"""The publisher's default digest algo: shoal-pws64-v1 when the weights are on CUDA (summed on
the device), sha256 on the CPU (what receivers of the previous release verify)."""


class WeightPublisher:
    """Publishes a model's weights for `run` from the trainer (weights rank 0). Owns the run's
    TCPStore server, the weights process group, the digest's thread pool and its pinned host
    buffer; `close()` releases them. `digest_algo` is "auto" (AUTO_ALGO) or one of ALGOS."""

    def __init__(
        self,
        run: str,
        daemon_url: str | None = None,
        *,
        secret_file: str | Path | None = None,
        node_id: str | None = None,
        models_dir: str | Path | None = None,
        deadline_s: float = 30.0,
        join_s: float | None = None,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        keep_files: int = 2,
        digest_algo: str = AUTO_ALGO,
        timeouts: Timeouts | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if digest_algo != AUTO_ALGO and digest_algo not in ALGOS:
            raise WeightsError(
                f"digest_algo {digest_algo!r} is not one of {AUTO_ALGO}, {', '.join(ALGOS)}"
            )
        self.run = run
        self.digest_algo = digest_algo
        self.endpoint = daemon_endpoint(daemon_url, secret_file, node_id, timeouts=timeouts)
        self.models_dir = None if models_dir is None else Path(models_dir)
        self.deadline_s = deadline_s
        self.join_s = deadline_s / 3 if join_s is None else join_s
        self.bucket_bytes = bucket_bytes
        self.keep_files = keep_files
        self._clock = clock
        self._store: Any = None
        self._store_at: tuple[str, int] | None = None
        self._group: Any = None
        self._members: tuple[str, ...] = ()
        self._backend = "gloo"
        self._epoch = 0
        self._pool: ThreadPoolExecutor | None = None
        self._staging = HostStaging()
        self.version = -1

    def publish(self, model: Any, version: int) -> PublishResult:
        """Send `model` as `version` (> every earlier one) to the run's receivers; return within
        `deadline_s` + 1 s. PublishTimeout names the receivers that joined but did not
        acknowledge; the WAL records success only when every one that joined acknowledged."""
        started = self._clock()
        deadline = started + self.deadline_s
        rendezvous = self._rendezvous(version, deadline)
        digest = self._digest(model)
        params = describe_params(model)
        sent_at = time.time()
        # the file is written while the update is offered, broadcast, verified and acknowledged
        # (the model does not change before publish returns): a stalled receiver that holds the
        # broadcast to the deadline cannot starve it; a receiver left out catches up from it
        writer = self._write_file(model, version, digest)
        marks = [self._clock()]
        offered = self._offer(rendezvous, version, digest, params, sent_at, deadline)
        marks.append(self._clock())
        store = self._store_for(rendezvous)
        devices = self._wait_ready(store, version, offered, min(deadline, started + self.join_s))
        ready = tuple(devices)
        marks.append(self._clock())
        broadcast_s = 0.0
        if ready:
            dist = torch_distributed()
            backend = weights_backend(
                device_of(model), list(devices.values()), bool(dist.is_nccl_available())
            )
            broadcast_s = self._broadcast(
                store, model, version, (rendezvous.members[0], *ready), backend, deadline
            )
        marks.append(self._clock())
        acknowledged = self._wait_acks(rendezvous, version, digest, ready, deadline)
        marks.append(self._clock())
        path = self._file_written(writer, version, deadline)
        marks.append(self._clock())
        unacked = tuple(node for node in ready if node not in acknowledged)
        self.version = version
        if unacked:
            raise PublishTimeout(
                f"run {self.run!r} version {version}: receiver(s) {', '.join(unacked)} joined "
                f"but did not acknowledge within {self.deadline_s:.1f} s; they are left out of "
                "the next publish and catch up from the weights file",
                unacked,
            )
        report = published_report(self.run, version, params, acknowledged, sent_at)
        post_digested(
            self.endpoint, "/v1/weights/applied", report, digest, timeout_s=self._left(deadline)
        )
        marks.append(self._clock())
        phases = phases_of(started, marks)
        missing = tuple(node for node in rendezvous.receivers if node not in acknowledged)
        return PublishResult(
            version,
            digest,
            acknowledged,
            missing,
            broadcast_s,
            self._clock() - started,
            path,
            phases,
        )

    def _rendezvous(self, version: int, deadline: float) -> WeightsRendezvous:
        """The run's weights group, this node its publisher (rank 0); WeightsError when
        `version` is not above the last published or another node publishes."""
        if version <= self.version:
            raise WeightsError(f"version {version} is not above the last published {self.version}")
        rendezvous = fetch_weights_rendezvous(self.endpoint, self.run, self._left(deadline))
        if rendezvous.rank != 0:
            raise WeightsError(
                f"this node is not the publisher of run {self.run!r}: the weights group is "
                f"{list(rendezvous.members)} (rank 0 publishes)"
            )
        return rendezvous

    def _file_written(
        self, writer: Future[Path] | None, version: int, deadline: float
    ) -> Path | None:
        """The path of the weights file `writer` writes (None without one), once written;
        WeightsError when it is not written by `deadline` + FILE_GRACE_S (inside publish's
        deadline + 1 s)."""
        if writer is None:
            return None
        try:
            return writer.result(self._left(deadline + FILE_GRACE_S))
        except FutureTimeout as exc:
            raise WeightsError(
                f"run {self.run!r} version {version}: the weights file was not written "
                f"within the deadline ({self.deadline_s:.1f} s); is {self.models_dir} slow?"
            ) from exc

    def close(self) -> None:
        """Drop the process group, the store server and the digest's pool; idempotent."""
        self._drop_group()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def _drop_group(self) -> None:
        self._group, self._members, self._store, self._store_at = None, (), None, None

    def algo_for(self, model: Any) -> str:
        """The digest algo of a publish of `model`: `digest_algo`, or for "auto" shoal-pws64-v1
        when any parameter is on CUDA and sha256 otherwise."""
        if self.digest_algo != AUTO_ALGO:
            return self.digest_algo
        on_cuda = any(p.device.type == "cuda" for p in model.parameters())
        return PWS_ALGO if on_cuda else SHA256_ALGO

    def _digest(self, model: Any) -> Digest:
        if self._pool is None:
            self._pool = hash_pool()
        return digest_named(
            model.named_parameters(), self.algo_for(model), pool=self._pool, staging=self._staging
        )

    def __enter__(self) -> WeightPublisher:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _write_file(self, model: Any, version: int, digest: Digest) -> Future[Path] | None:
        """The weights file of `version`, written in a thread (None without models_dir)."""
        if self.models_dir is None:
            return None
        future: Future[Path] = Future()
        models_dir = self.models_dir

        def write() -> None:
            try:
                path = write_weights_file(
                    models_dir, self.run, version, model, self.keep_files, digest
                )
            except BaseException as exc:
                future.set_exception(exc)
            else:
                future.set_result(path)

        threading.Thread(target=write, name=f"weights-file-{self.run}-v{version}").start()
        return future

    def _left(self, deadline: float) -> float:
        return max(0.05, deadline - self._clock())

    def _offer(
        self,
        rendezvous: WeightsRendezvous,
        version: int,
        digest: Digest,
        params: list[Any],
        sent_at: float,
        deadline: float,
    ) -> list[str]:
        """POST the update to every receiver's daemon; the receivers whose daemon accepted."""
        body = {
            "run": self.run,
            "version": version,
            "params": [p.to_dict() for p in params],
            "total_bytes": sum(p.nbytes for p in params),
            "deadline_s": self.deadline_s,
            "sent_at": sent_at,
            "group": {
                "master_addr": rendezvous.master_addr,
                "master_port": rendezvous.master_port,
                "prefix": store_key_prefix(self.run),
            },
        }
        fence = {FENCE_HEADER: f"{rendezvous.term}.{rendezvous.plan_version}"}
        accepted = []
        for node in rendezvous.receivers:
            try:
                post_digested(
                    self.endpoint,
                    "/v1/weights/update",
                    body,
                    digest,
                    url=rendezvous.urls[node],
                    timeout_s=min(self.endpoint.timeout_s, self._left(deadline)),
                    headers=fence,
                )
            except PeerRequestError as exc:
                log.warning(
                    "run %s version %s: %s refused the offer: %s", self.run, version, node, exc
                )
                continue
            accepted.append(node)
        return accepted

    def _store_for(self, rendezvous: WeightsRendezvous) -> Any:
        dist = torch_distributed()
        where = (rendezvous.master_addr, rendezvous.master_port)
        if self._store is None or self._store_at != where:
            self._drop_group()
            try:
                self._store = dist.TCPStore(
                    "0.0.0.0",  # noqa: S104 - receivers on every interface reach the store
                    where[1],
                    None,
                    True,
                    timeout=timedelta(seconds=self.deadline_s),
                    wait_for_workers=False,
                )
            except RuntimeError as exc:
                raise WeightsError(
                    f"cannot host the weights store on port {where[1]}: {exc}"
                ) from exc
            self._store_at = where
        return self._store

    def _wait_ready(
        self, store: Any, version: int, offered: list[str], until: float
    ) -> dict[str, TensorDevice | None]:
        """The offered receivers whose process said ready for `version` before `until`, sorted,
        each with the device it reported (None: the previous release's ready, or malformed)."""
        prefix = store_key_prefix(self.run)
        keys = {node: f"{prefix}/v{version}/ready/{node}" for node in offered}
        while True:
            ready = sorted(n for n, key in keys.items() if store.check([key]))
            if len(ready) == len(keys) or self._clock() >= until:
                return {node: TensorDevice.from_ready(store.get(keys[node])) for node in ready}
            time.sleep(ACK_POLL_S)

    def _broadcast(
        self,
        store: Any,
        model: Any,
        version: int,
        members: tuple[str, ...],
        backend: str,
        deadline: float,
    ) -> float:
        """Announce the members and the backend, (re)form the group if they changed, broadcast
        in a thread that is abandoned at the deadline. Seconds the broadcast took; WeightsError
        stays inside."""
        dist = torch_distributed()
        prefix = store_key_prefix(self.run)
        if members != self._members or backend != self._backend or self._group is None:
            self._epoch += 1
            self._group, self._members, self._backend = None, members, backend
        epoch = self._epoch
        announced = {"epoch": epoch, "members": list(members), "backend": backend}
        store.set(f"{prefix}/v{version}/members", json.dumps(announced))
        outcome: dict[str, object] = {}
        group = self._group
        master_addr = self._store_at[0] if self._store_at is not None else "127.0.0.1"

        def run() -> None:
            nonlocal group
            try:
                if group is None:
                    scoped = dist.PrefixStore(f"{prefix}/epoch{epoch}", store)
                    timeout = timedelta(seconds=max(0.1, deadline - self._clock()))
                    group = new_weights_group(
                        backend, scoped, 0, len(members), timeout, master_addr
                    )
                broadcast_weights(
                    model,
                    group,
                    version,
                    bucket_bytes=self.bucket_bytes,
                    timeout_s=max(0.1, deadline - self._clock()),
                )
                outcome["group"] = group
            except (WeightsError, RuntimeError) as exc:
                outcome["error"] = exc

        started = self._clock()
        worker = threading.Thread(target=run, name=f"publish-{self.run}-v{version}", daemon=True)
        worker.start()
        worker.join(self._left(deadline))
        elapsed = self._clock() - started
        if "group" in outcome:
            self._group = outcome["group"]
            return elapsed
        reason = outcome.get("error", "still running at the deadline")
        log.warning("run %s version %s: broadcast failed: %s", self.run, version, reason)
        self._group, self._members = None, ()
        return elapsed

    def _wait_acks(
        self,
        rendezvous: WeightsRendezvous,
        version: int,
        digest: Digest,
        ready: tuple[str, ...],
        deadline: float,
    ) -> tuple[str, ...]:
        """The ready receivers whose daemon shows `version` with `digest` applied (or a newer
        version) by the deadline."""
        acked: set[str] = set()
        path = f"/v1/weights/status?run={self.run}"
        while True:
            for node in ready:
                if node in acked:
                    continue
                try:
                    _, status = call(
                        self.endpoint,
                        "GET",
                        path,
                        url=rendezvous.urls[node],
                        timeout_s=min(1.0, self._left(deadline)),
                    )
                except PeerRequestError:
                    continue
                if status.get("version", -1) >= version and (
                    status.get("version") != version or Digest.of_message(status) == digest
                ):
                    acked.add(node)
            if len(acked) == len(ready) or self._clock() >= deadline:
                return tuple(sorted(acked))
            time.sleep(ACK_POLL_S)
