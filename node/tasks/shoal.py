"""The `shoal` backend: tasks run on workers across the cluster's nodes (worker servers started
as shoal jobs on the nodes of a role), objects stay with the process that put them and are
fetched by a worker when a task needs one; actors each run in a job of their own, named ones
through the coordinator's registry."""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import itertools
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import cloudpickle

from node.errors import ActorDiedError, ActorExistsError, JobClientError, JobRequestError, TaskError
from node.jobs.client import local_endpoint, local_settings, start_job, terminate
from node.jobs.specs import DeploySpec, JobSpec, make_job_state
from node.jobs.transport import JobClientState, request_json, run_sync
from node.tasks.context import ActorHandle, Ref, new_id, result_of, settle, wait_futures
from node.workers import (
    Cluster,
    NodeConfig,
    RemoteWorker,
    WorkerError,
    listening_port,
)

EXECUTOR_WORK_FN = "node.tasks.executor:serve"
ACTOR_READY_TIMEOUT_S = 60.0


class Connection:
    """One worker (or actor host) connection: calls are sent under a lock and answered by id on
    a reader thread, which also serves the worker's requests for objects."""

    def __init__(
        self,
        worker: RemoteWorker,
        objects: Callable[[str], bytes | None],
        on_loss: Callable[[Exception], Exception],
    ) -> None:
        self.worker = worker
        self._objects = objects
        self._on_loss = on_loss
        self._send_lock = threading.Lock()
        self._futures: dict[str, cf.Future[Any]] = {}
        self._ids = itertools.count()
        self.lost: Exception | None = None
        self._closing = False
        self._reader = threading.Thread(target=self._read, daemon=True, name=f"tasks-{worker.what}")
        self._reader.start()

    @property
    def inflight(self) -> int:
        return len(self._futures)

    def call(self, op: str, payload: bytes, **fields: Any) -> cf.Future[Any]:
        future: cf.Future[Any] = cf.Future()
        with self._send_lock:
            if self.lost is not None:
                raise self.lost
            call_id = str(next(self._ids))
            self._futures[call_id] = future
            try:
                self.worker.send({"op": op, "id": call_id, **fields}, payload)
            except (WorkerError, OSError) as exc:
                self._futures.pop(call_id, None)
                raise self._on_loss(exc) from exc
        return future

    def _read(self) -> None:
        try:
            while True:
                frame = self.worker.recv_frame(None)
                message = frame.message
                if message.get("op") == "done":
                    future = self._futures.pop(str(message["id"]), None)
                    if future is not None:
                        settle(future, cloudpickle.loads(frame.payload))
                elif message.get("op") == "fetch":
                    blob = self._objects(str(message["ref"]))
                    with self._send_lock:
                        self.worker.send(
                            {"op": "object", "ref": message["ref"], "found": blob is not None},
                            blob,
                        )
        except (WorkerError, OSError, ValueError, EOFError) as exc:
            closing = self._closing
            error = TaskError(f"{self.worker.what}: closed") if closing else self._on_loss(exc)
            with self._send_lock:
                self.lost = error
                futures, self._futures = self._futures, {}
            for future in futures.values():
                if not future.done():
                    future.set_exception(error)

    def close(self) -> None:
        """Close the connection; unlike a loss, this reports nobody dead."""
        self._closing = True
        self.worker.close()
        self._reader.join(timeout=5)


class ShoalActor(ActorHandle):
    """A handle on one incarnation of an actor; it pickles as (name, incarnation) and where the
    registry is, and never rebinds to another incarnation."""

    def __init__(
        self,
        context: ShoalContext,
        name: str | None,
        incarnation: int,
        address: str,
        connection: Connection | None = None,
    ) -> None:
        self._context = context
        self.name = name
        self.incarnation = incarnation
        self.address = address
        self._connection = connection
        self._lock = threading.Lock()

    def __reduce__(self) -> tuple[Any, ...]:
        context = self._context
        return (
            _rebuild_actor,
            (self.name, self.incarnation, self.address, context.daemon_url, context.config_file),
        )

    def _died(self, cause: object) -> ActorDiedError:
        what = f"actor {self.name!r}" if self.name else f"actor at {self.address}"
        return ActorDiedError(
            f"{what} incarnation {self.incarnation} died ({cause}); a new incarnation needs "
            "create_actor(..., get_if_exists=True)"
        )

    def _lost(self, cause: object) -> ActorDiedError:
        """The connection broke: tell the registry (so a new incarnation may be made)."""
        self._context.report_dead(self.name, self.incarnation)
        return self._died(cause)

    def _connect(self) -> Connection:
        with self._lock:
            if self._connection is not None:
                return self._connection
            if self.name is not None:
                record = self._context.registry("GET", self.name)
                if record.get("incarnation") != self.incarnation or record["state"] != "ready":
                    raise self._died(f"the registry holds incarnation {record.get('incarnation')}")
            try:
                self._connection = self._context.connect_actor(self.address, self._lost)
            except WorkerError as exc:
                self._context.report_dead(self.name, self.incarnation)
                raise self._died(exc) from exc
            return self._connection

    def _call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, object]) -> Any:
        connection = self._connect()
        if connection.lost is not None:
            raise connection.lost
        blob = bytes(cloudpickle.dumps((method, args, kwargs)))
        return connection.call("actor_call", blob, actor="a")

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()


def _rebuild_actor(
    name: str | None, incarnation: int, address: str, daemon_url: str, config_file: str | None
) -> ShoalActor:
    context = ShoalContext.attach(daemon_url, config_file)
    return ShoalActor(context, name, incarnation, address)


class ShoalContext:
    """The job context over the cluster a daemon belongs to: `workers_per_node` task workers
    on each node of `role` ("any": every node of the plan) that has `gpus_per_node` GPUs."""

    _attached: dict[tuple[str, str | None], ShoalContext] = {}

    def __init__(
        self,
        daemon_url: str | None = None,
        *,
        role: str = "any",
        workers_per_node: int = 2,
        gpus_per_node: int = 0,
        config_file: str | None = None,
        env: Mapping[str, str] | None = None,
        start_workers: bool = True,
    ) -> None:
        settings = local_settings(config_file)
        self.config_file = config_file
        self.endpoint = local_endpoint(settings, daemon_url or os.environ.get("SHOAL_DAEMON_URL"))
        self.daemon_url = self.endpoint.url
        self.secret_file = str(settings.secret_file) if settings.secret_file else None
        self.env = dict(env or {})
        self.owner = f"{socket.gethostname()}:{os.getpid()}"
        self._objects: dict[str, bytes] = {}
        self._lock = threading.Lock()
        self._connections: list[Connection] = []
        self._actor_jobs: list[JobClientState] = []
        self._actors: list[ShoalActor] = []
        self._next_node = itertools.count()
        self.cluster = Cluster.from_plan(
            self.daemon_url,
            role,
            num_workers=workers_per_node,
            config_file=config_file,
            gpus=gpus_per_node,
        )
        if start_workers:
            try:
                workers = self.cluster.start(EXECUTOR_WORK_FN, env=self.env, name="tasks")
                self._connections = [
                    Connection(w, self._object_bytes, self._worker_lost) for w in workers
                ]
            except BaseException:
                self.close()
                raise

    @classmethod
    def attach(cls, daemon_url: str, config_file: str | None) -> ShoalContext:
        """A context of this process for handles unpickled here (actors only, no workers)."""
        key = (daemon_url, config_file)
        found = cls._attached.get(key)
        if found is None:
            found = cls(daemon_url, config_file=config_file, start_workers=False)
            cls._attached[key] = found
        return found

    @staticmethod
    def _worker_lost(exc: Exception) -> Exception:
        return TaskError(f"the worker running this task was lost: {exc}")

    # objects

    def put(self, obj: Any) -> Ref:
        ref = Ref(new_id("obj"), self.owner)
        blob = bytes(cloudpickle.dumps(obj))
        with self._lock:
            self._objects[ref.id] = blob
        return ref

    def _object_bytes(self, ref_id: str) -> bytes | None:
        with self._lock:
            return self._objects.get(ref_id)

    def get(self, ref: Any, timeout_s: float | None = None) -> Any:
        if isinstance(ref, Ref):
            blob = self._object_bytes(ref.id)
            if blob is None:
                raise TaskError(f"object {ref.id} is held by {ref.owner}, not by {self.owner}")
            return cloudpickle.loads(blob)
        if isinstance(ref, list):
            return [self.get(r, timeout_s) for r in ref]
        if isinstance(ref, cf.Future):
            return result_of(ref, timeout_s)
        raise TypeError(f"get takes a Ref or a future of this context, not {type(ref)}")

    def wait(
        self, futures: Sequence[Any], num_returns: int = 1, timeout_s: float | None = None
    ) -> tuple[list[Any], list[Any]]:
        return wait_futures(list(futures), num_returns, timeout_s)

    # tasks

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> cf.Future[Any]:
        """Run fn on the least busy live worker; Refs among the arguments are fetched there."""
        live = [c for c in self._connections if c.lost is None]
        if not live:
            raise TaskError("no live worker is left in this context; make a new one")
        connection = min(live, key=lambda c: c.inflight)
        blob = bytes(cloudpickle.dumps((fn, args, kwargs)))
        return connection.call("task", blob)

    # actors

    def registry(self, method: str, name: str, action: str = "", **body: Any) -> dict[str, Any]:
        path = f"/v1/actors/{name}" + (f"/{action}" if action else "")
        try:
            answer = run_sync(request_json(self.endpoint, method, path, body or None))
        except JobRequestError as exc:
            if exc.status == 409 and action == "claim":
                raise ActorExistsError(f"{exc.reason}; pass get_if_exists=True") from exc
            raise TaskError(f"actor registry: {exc}") from exc
        except JobClientError as exc:
            raise TaskError(f"actor registry: {exc}") from exc
        return dict(answer)

    def report_dead(self, name: str | None, incarnation: int) -> None:
        if name is not None:
            # someone else may have reported it already, or a newer incarnation exists
            with contextlib.suppress(TaskError):
                self.registry("POST", name, "dead", incarnation=incarnation)

    def connect_actor(self, address: str, on_loss: Callable[[object], Exception]) -> Connection:
        host, _, port = address.rpartition(":")
        worker = RemoteWorker(host, int(port), self.secret_file)
        return Connection(worker, self._object_bytes, on_loss)

    def create_actor(
        self,
        cls: type[Any],
        *args: Any,
        name: str | None = None,
        get_if_exists: bool = False,
        **kwargs: Any,
    ) -> ShoalActor:
        """An actor in a job of its own on a node of this context; a named one is claimed in
        the coordinator's registry first (one instance however many callers race)."""
        init = bytes(cloudpickle.dumps((cls, args, kwargs)))
        if name is None:
            return self._start_actor(None, 1, init)
        deadline = time.monotonic() + ACTOR_READY_TIMEOUT_S
        while time.monotonic() < deadline:
            record = self.registry("POST", name, "claim", get_if_exists=get_if_exists)
            incarnation = int(record["incarnation"])
            if record.get("created"):
                try:
                    return self._start_actor(name, incarnation, init)
                except BaseException:
                    self.report_dead(name, incarnation)
                    raise
            while record["state"] == "pending" and time.monotonic() < deadline:
                time.sleep(0.05)
                record = self.registry("GET", name)
            if record["state"] == "ready" and record["incarnation"] == incarnation:
                handle = ShoalActor(self, name, incarnation, str(record["address"]))
                self._actors.append(handle)
                return handle
        raise TaskError(f"actor {name!r} was not ready within {ACTOR_READY_TIMEOUT_S} s")

    def _start_actor(self, name: str | None, incarnation: int, init: bytes) -> ShoalActor:
        nodes = self.cluster.nodes
        node: NodeConfig = nodes[next(self._next_node) % len(nodes)]
        argv = [sys.executable, "-m", "node.tasks.actorhost", "--host", node.host]
        if self.secret_file:
            argv += ["--secret-file", self.secret_file]
        state = make_job_state()
        label = name or "anonymous"
        deploy = DeploySpec(node_url=node.url, config_file=self.config_file)
        start_job(deploy, JobSpec(tuple(argv), env=self.env, name=f"actor-{label}"), state)
        if name is None:
            self._actor_jobs.append(state)
        address = f"{node.host}:{listening_port(state, ACTOR_READY_TIMEOUT_S, node.url)}"
        handle = ShoalActor(self, name, incarnation, address)
        connection = self.connect_actor(address, handle._lost)
        handle._connection = connection
        result_of(connection.call("actor_new", init, actor="a"), ACTOR_READY_TIMEOUT_S)
        if name is not None:
            self.registry(
                "POST", name, "ready", incarnation=incarnation, address=address, job=state["job_id"]
            )
        self._actors.append(handle)
        return handle

    def close(self) -> None:
        """Close workers and connections; end the task workers and unnamed actors' jobs (named
        actors outlive their creator until their job is killed)."""
        for connection in self._connections:
            connection.close()
        self._connections = []
        for actor in self._actors:
            actor.close()
        self._actors = []
        self.cluster.stop()
        for state in self._actor_jobs:
            if state.get("status") not in ("succeeded", "failed", "killed", "lost"):
                with contextlib.suppress(JobClientError):
                    terminate(state, grace_s=2.0)

    def __enter__(self) -> ShoalContext:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
