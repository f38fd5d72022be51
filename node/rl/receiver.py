"""A generator's side of in-flight weight updates: long-poll the local daemon for the next
offer, say ready on the publisher's store, receive the broadcast with generation paused, verify
the digest, report it applied; catch up from the newest weights file when behind."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

from config import Timeouts
from node.errors import PeerRequestError, WeightsError
from node.rl.broadcast import DEFAULT_BUCKET_BYTES, receive_weights, torch_distributed
from node.rl.client import call, post_digested
from node.rl.digest import Digest, HostStaging, WeightsDigest, hash_pool
from node.rl.files import load_weights_file, weights_files
from node.rl.group import device_of, fetch_weights_rendezvous, new_weights_group, store_key_prefix
from node.rl.offers import WeightsOffer
from node.training.rendezvous import daemon_endpoint

log = logging.getLogger(__name__)

POLL_S = 10.0
FRESH_POLL_S = 0.05


class WeightReceiver:
    """Receives `run`'s weights into a model on one inference/self-play node. Owns its client
    connection to the publisher's store, the weights process group of the current epoch, and
    the digest's thread pool and pinned host buffer (reused by every version)."""

    def __init__(
        self,
        run: str,
        daemon_url: str | None = None,
        *,
        secret_file: str | Path | None = None,
        node_id: str | None = None,
        models_dir: str | Path | None = None,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        timeouts: Timeouts | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.run = run
        self.endpoint = daemon_endpoint(daemon_url, secret_file, node_id, timeouts=timeouts)
        self.models_dir = None if models_dir is None else Path(models_dir)
        self.bucket_bytes = bucket_bytes
        self._clock = clock
        self._lock = threading.Lock()
        self._node: str | None = None
        self._store: Any = None
        self._store_at: tuple[str, int] | None = None
        self._group: Any = None
        self._epoch: int | None = None
        self._backend: str | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._staging = HostStaging()
        self.version = -1
        self._seen = -1
        """The newest offer acted on (received, failed or left out of): never tried twice."""
        self.source: str | None = None

    @property
    def node(self) -> str:
        """This node's id in the weights group (asked from the daemon once)."""
        if self._node is None:
            rendezvous = fetch_weights_rendezvous(self.endpoint, self.run)
            if rendezvous.rank is None:
                raise WeightsError(
                    f"this node is not in run {self.run!r}'s weights group "
                    f"{list(rendezvous.members)}; only inference and selfplay nodes receive"
                )
            self._node = rendezvous.members[rendezvous.rank]
        return self._node

    def catch_up(self, model: Any) -> int | None:
        """Load the newest weights file of the run when it is newer than what `model` holds;
        its version, or None when there is nothing newer. Reports it applied (source "file")."""
        if self.models_dir is None:
            return None
        files = weights_files(self.models_dir, self.run)
        if not files or files[-1][0] <= self.version:
            return None
        with self._lock:
            version, digest = load_weights_file(files[-1][1], model)
        self._applied(model, version, digest, "file", None)
        return version

    def receive_into(
        self,
        model: Any,
        pause: Callable[[], None] | None = None,
        resume: Callable[[], None] | None = None,
        timeout_s: float = POLL_S,
    ) -> int | None:
        """Wait up to `timeout_s` for the next offer and receive it into `model`: `pause` runs
        under this receiver's lock before the broadcast, `resume` in `finally`. The new version,
        or None when no offer came or the publisher left this node out (it then catches up from
        the file). WeightsError when the broadcast fails, the digest does not match, or the
        offer's digest algo is unknown to this release (then before saying ready: the
        publisher leaves this node out and it catches up from the file)."""
        offer = self._next_offer(timeout_s)
        if offer is None:
            return None
        version, group_info = offer.version, dict(offer.group or {})
        self._seen = version
        offered = offer.weights_digest()
        if self._pool is None:
            self._pool = hash_pool()
        # sums (or hashes) each bucket while the next one arrives; refuses an unknown algo
        digest = WeightsDigest(offered.algo, pool=self._pool, staging=self._staging)
        deadline = self._clock() + float(offer.deadline_s)
        store = self._store_for(group_info, float(offer.deadline_s))
        prefix = str(group_info.get("prefix") or store_key_prefix(self.run))
        node = self.node
        store.set(f"{prefix}/v{version}/ready/{node}", device_of(model).to_json())
        members, epoch, backend = self._announced(store, prefix, version, deadline)
        if node not in members:
            log.warning("version %s: left out of the broadcast; catching up later", version)
            self.catch_up(model)
            return None
        with self._lock:
            if pause is not None:
                pause()
            try:
                group = self._group_for(
                    store, prefix, epoch, backend, members.index(node), len(members), deadline
                )
                received = receive_weights(
                    model,
                    group,
                    bucket_bytes=self.bucket_bytes,
                    timeout_s=self._left(deadline),
                    digest=digest,
                )
            except WeightsError:
                self._group, self._epoch = None, None
                raise
            finally:
                if resume is not None:
                    resume()
            found = digest.result()
        if received != version or found != offered:
            raise WeightsError(
                f"version {version}: received version {received} with {found.algo} digest "
                f"{found.value[:12]}, offered {offered.value[:12]}"
            )
        self._applied(model, version, found, "broadcast", offer.sent_at)
        return version

    def _announced(
        self, store: Any, prefix: str, version: int, deadline: float
    ) -> tuple[list[str], int, str]:
        """(members, epoch, backend) of the group the publisher announces for `version`;
        WeightsError when it announces none before `deadline`."""
        try:
            store.wait([f"{prefix}/v{version}/members"], timedelta(seconds=self._left(deadline)))
            announced = json.loads(store.get(f"{prefix}/v{version}/members"))
        except RuntimeError as exc:
            raise WeightsError(
                f"version {version}: the publisher announced no group: {exc}"
            ) from exc
        members, epoch = list(announced["members"]), int(announced["epoch"])
        return members, epoch, str(announced.get("backend", "gloo"))

    def wait_fresh(self, max_lag: int, timeout_s: float = POLL_S) -> int:
        """Block while this node's weights are more than `max_lag` versions behind the newest
        the trainer offered (another thread runs `receive_into`); the lag when fresh.
        WeightsError after `timeout_s`."""
        deadline = self._clock() + timeout_s
        while True:
            offered = self.offered_version()
            lag = max(0, offered - self.version)
            if lag <= max_lag:
                return lag
            if self._clock() >= deadline:
                raise WeightsError(
                    f"weights are {lag} versions behind the trainer (max_lag {max_lag}) "
                    f"after {timeout_s:.1f} s; is the receiver loop running?"
                )
            time.sleep(FRESH_POLL_S)

    def offered_version(self) -> int:
        """The newest version the trainer offered this node (-1: none)."""
        status, offer = call(
            self.endpoint, "GET", f"/v1/weights/next?run={self.run}&after=-1&timeout_s=0"
        )
        return self._read_offer(offer).version if status == 200 and offer else -1

    def close(self) -> None:
        """Drop the group, the store connection and the digest's pool; idempotent."""
        self._drop_group()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def _drop_group(self) -> None:
        self._group, self._epoch, self._store, self._store_at = None, None, None, None

    def __enter__(self) -> WeightReceiver:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _read_offer(self, answer: object) -> WeightsOffer:
        """The daemon's answer read as a WeightsOffer; WeightsError naming what is wrong."""
        try:
            return WeightsOffer.model_validate(answer)
        except ValueError as exc:
            raise WeightsError(
                f"run {self.run}: {self.endpoint} answered an offer this release cannot read: {exc}"
            ) from exc

    def _next_offer(self, timeout_s: float) -> WeightsOffer | None:
        deadline = self._clock() + timeout_s
        while True:
            wait_s = max(0.0, min(POLL_S, deadline - self._clock()))
            after = max(self.version, self._seen)
            path = f"/v1/weights/next?run={self.run}&after={after}&timeout_s={wait_s:.3f}"
            status, offer = call(self.endpoint, "GET", path, timeout_s=wait_s + 5.0)
            if status == 200 and isinstance(offer, dict):
                return self._read_offer(offer)
            if self._clock() >= deadline:
                return None

    def _store_for(self, group_info: dict[str, Any], timeout_s: float) -> Any:
        dist = torch_distributed()
        where = (str(group_info["master_addr"]), int(group_info["master_port"]))
        if self._store is None or self._store_at != where:
            self._drop_group()
            try:
                self._store = dist.TCPStore(
                    where[0], where[1], None, False, timeout=timedelta(seconds=timeout_s)
                )
            except RuntimeError as exc:
                raise WeightsError(f"cannot reach the weights store at {where}: {exc}") from exc
            self._store_at = where
        return self._store

    def _group_for(
        self,
        store: Any,
        prefix: str,
        epoch: int,
        backend: str,
        rank: int,
        size: int,
        deadline: float,
    ) -> Any:
        if self._group is not None and self._epoch == epoch and self._backend == backend:
            return self._group
        dist = torch_distributed()
        scoped = dist.PrefixStore(f"{prefix}/epoch{epoch}", store)
        master_addr = self._store_at[0] if self._store_at is not None else "127.0.0.1"
        timeout = timedelta(seconds=self._left(deadline))
        try:
            group = new_weights_group(backend, scoped, rank, size, timeout, master_addr)
        except RuntimeError as exc:
            raise WeightsError(
                f"epoch {epoch}: the {backend} weights group did not form: {exc}"
            ) from exc
        self._group, self._epoch, self._backend = group, epoch, backend
        return group

    def _applied(
        self, model: Any, version: int, digest: Digest, source: str, sent_at: object
    ) -> None:
        self.version, self.source = version, source
        report = {
            "run": self.run,
            "version": version,
            "bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
            "source": source,
            "sent_at": sent_at,
        }
        try:
            post_digested(self.endpoint, "/v1/weights/applied", report, digest)
        except PeerRequestError as exc:
            raise WeightsError(f"version {version} applied but not reported: {exc}") from exc

    def _left(self, deadline: float) -> float:
        return max(0.1, deadline - self._clock())
