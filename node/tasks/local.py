"""Local backends of the job context: `sync` (inline, for tests), `thread` (a thread pool) and
`process` (a pool of forked processes; functions travel with cloudpickle, actors live each in
a forked `Worker`)."""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

import cloudpickle

from node.errors import ActorDiedError, ActorExistsError, TaskError
from node.tasks.context import (
    ActorHandle,
    Outcome,
    Ref,
    dump_outcome,
    new_id,
    result_of,
    run_captured,
    settle,
    wait_futures,
)
from node.workers import Worker, WorkerDied, WorkerHandle


def resolve_refs(
    args: Sequence[Any], kwargs: dict[str, object], lookup: Callable[[Ref], Any]
) -> Any:
    """(args, kwargs) with every top-level Ref replaced by its object."""
    return (
        tuple(lookup(a) if isinstance(a, Ref) else a for a in args),
        {k: lookup(v) if isinstance(v, Ref) else v for k, v in kwargs.items()},
    )


class LocalContext:
    """What the local backends share: an object store of this process and named actors."""

    owner = "local"

    def __init__(self) -> None:
        self._objects: dict[str, object] = {}
        self._actors: dict[str, ActorHandle] = {}
        self._lock = threading.Lock()
        self._closed = False

    def put(self, obj: Any) -> Ref:
        ref = Ref(new_id("obj"), self.owner)
        with self._lock:
            self._objects[ref.id] = obj
        return ref

    def _lookup(self, ref: Ref) -> Any:
        with self._lock:
            try:
                return self._objects[ref.id]
            except KeyError:
                raise TaskError(f"object {ref.id} is not held by this context") from None

    def get(self, ref: Any, timeout_s: float | None = None) -> Any:
        """The object of a Ref, or the result of a future (its task's error re-raised)."""
        if isinstance(ref, Ref):
            return self._lookup(ref)
        if isinstance(ref, list):
            return [self.get(r, timeout_s) for r in ref]
        if isinstance(ref, cf.Future):
            return result_of(ref, timeout_s)
        raise TypeError(f"get takes a Ref or a future from this context, not {type(ref)}")

    def wait(
        self, futures: Sequence[Any], num_returns: int = 1, timeout_s: float | None = None
    ) -> tuple[list[Any], list[Any]]:
        return wait_futures(list(futures), num_returns, timeout_s)

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> cf.Future[Any]:
        args, kwargs = resolve_refs(args, kwargs, self._lookup)
        return self._submit(fn, args, kwargs)

    def _submit(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, object]
    ) -> cf.Future[Any]:
        raise NotImplementedError

    def create_actor(
        self,
        cls: type[Any],
        *args: Any,
        name: str | None = None,
        get_if_exists: bool = False,
        **kwargs: Any,
    ) -> ActorHandle:
        """A new actor; with a `name`, the existing one when `get_if_exists` (else
        ActorExistsError)."""
        args, kwargs = resolve_refs(args, kwargs, self._lookup)
        with self._lock:
            existing = None if name is None else self._actors.get(name)
            if existing is not None:
                if not get_if_exists:
                    raise ActorExistsError(f"an actor named {name!r} exists; get_if_exists=True")
                return existing
            handle = self._new_actor(cls, args, kwargs, name)
            self._actors[name or new_id("actor")] = handle
            return handle

    def _new_actor(
        self, cls: type[Any], args: tuple[Any, ...], kwargs: dict[str, object], name: str | None
    ) -> ActorHandle:
        raise NotImplementedError

    def close(self) -> None:
        self._closed = True
        with self._lock:
            actors = list(self._actors.values())
            self._actors.clear()
            self._objects.clear()
        for actor in actors:
            closer = getattr(actor, "close", None)
            if closer is not None:
                closer()

    def __enter__(self) -> LocalContext:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class _InlineActor(ActorHandle):
    """An actor object called in the caller's thread (sync) or on its own thread (thread)."""

    def __init__(self, instance: Any, name: str | None, executor: cf.Executor | None) -> None:
        self._instance = instance
        self.name = name
        self.incarnation = 1
        self._executor = executor

    def _call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, object]) -> Any:
        bound = getattr(self._instance, method)
        if self._executor is None:
            future: cf.Future[Any] = cf.Future()
            settle(future, run_captured(bound, args, kwargs))
            return future
        return self._executor.submit(run_captured, bound, args, kwargs)

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)


class SyncContext(LocalContext):
    """Runs every task inline at `run`; for tests and debugging."""

    def _submit(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, object]
    ) -> cf.Future[Any]:
        future: cf.Future[Any] = cf.Future()
        settle(future, run_captured(fn, args, kwargs))
        return future

    def _new_actor(
        self, cls: type[Any], args: tuple[Any, ...], kwargs: dict[str, object], name: str | None
    ) -> ActorHandle:
        return _InlineActor(cls(*args, **kwargs), name, None)


class ThreadContext(LocalContext):
    """Tasks on a thread pool; each actor on a thread of its own (calls run in order)."""

    def __init__(self, max_workers: int | None = None) -> None:
        super().__init__()
        self._pool = cf.ThreadPoolExecutor(max_workers or min(32, (os.cpu_count() or 1) + 4))

    def _submit(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, object]
    ) -> cf.Future[Any]:
        return self._pool.submit(run_captured, fn, args, kwargs)

    def _new_actor(
        self, cls: type[Any], args: tuple[Any, ...], kwargs: dict[str, object], name: str | None
    ) -> ActorHandle:
        executor = cf.ThreadPoolExecutor(1, thread_name_prefix=f"actor-{name or 'anon'}")
        instance = executor.submit(cls, *args, **kwargs).result()
        return _InlineActor(instance, name, executor)

    def close(self) -> None:
        super().close()
        self._pool.shutdown(wait=True, cancel_futures=True)


def run_pickled(blob: bytes) -> bytes:
    """In a pool process: unpickle (fn, args, kwargs), run it, pickle the outcome."""
    fn, args, kwargs = cloudpickle.loads(blob)
    return dump_outcome(run_captured(fn, args, kwargs))


def actor_loop(handle: WorkerHandle) -> None:
    """A process actor: the first frame builds the instance, each next one calls a method."""
    frame = handle.recv_frame()
    cls, args, kwargs = cloudpickle.loads(frame.payload)
    built = run_captured(cls, args, kwargs)
    handle.send({"ok": built.ok}, dump_outcome(Outcome(True) if built.ok else built))
    while True:
        frame = handle.recv_frame()
        method, args, kwargs = cloudpickle.loads(frame.payload)
        outcome = run_captured(getattr(built.value, method), args, kwargs)
        handle.send({"ok": outcome.ok}, dump_outcome(outcome))


class _ProcessActor(ActorHandle):
    """An actor in a forked worker process; calls are sent in order and answered in order."""

    def __init__(
        self, cls: type[Any], args: tuple[Any, ...], kwargs: dict[str, object], name: str | None
    ) -> None:
        self.name = name
        self.incarnation = 1
        self._lock = threading.Lock()
        self._worker = Worker(actor_loop)
        self._worker.send({"op": "new"}, bytes(cloudpickle.dumps((cls, args, kwargs))))
        built: Outcome = cloudpickle.loads(self._worker.recv_frame().payload)
        if not built.ok:
            self._worker.close()
            result_of(_done(built), None)

    def _call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, object]) -> Any:
        with self._lock:
            try:
                self._worker.send({"op": "call"}, bytes(cloudpickle.dumps((method, args, kwargs))))
                outcome = cloudpickle.loads(self._worker.recv_frame().payload)
            except WorkerDied as exc:
                raise ActorDiedError(f"actor {self.name or ''} died: {exc}") from exc
        return _done(outcome)

    def close(self) -> None:
        self._worker.close()


def _done(outcome: Outcome) -> cf.Future[Any]:
    future: cf.Future[Any] = cf.Future()
    settle(future, outcome)
    return future


class ProcessContext(LocalContext):
    """Tasks on a pool of forked processes; arguments and results travel by cloudpickle."""

    def __init__(self, max_workers: int | None = None) -> None:
        super().__init__()
        self._pool = cf.ProcessPoolExecutor(
            max_workers or os.cpu_count() or 1, mp_context=multiprocessing.get_context("fork")
        )

    def _submit(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, object]
    ) -> cf.Future[Any]:
        blob = bytes(cloudpickle.dumps((fn, args, kwargs)))
        outer: cf.Future[Any] = cf.Future()

        def finish(inner: cf.Future[bytes]) -> None:
            try:
                settle(outer, cloudpickle.loads(inner.result()))
            except BaseException as exc:  # the pool broke: the task's outcome is that error
                settle(outer, Outcome(False, None, exc, repr(exc), type(exc).__qualname__))

        self._pool.submit(run_pickled, blob).add_done_callback(finish)
        return outer

    def _new_actor(
        self, cls: type[Any], args: tuple[Any, ...], kwargs: dict[str, object], name: str | None
    ) -> ActorHandle:
        return _ProcessActor(cls, args, kwargs, name)

    def close(self) -> None:
        super().close()
        self._pool.shutdown(wait=True, cancel_futures=True)
