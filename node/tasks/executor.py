"""The worker side of the `shoal` backend: `serve` (a work_fn for `shoal workers serve`) runs
cloudpickled tasks and fetches the objects their arguments name from the context that holds
them; `serve_actor` hosts one actor."""

from __future__ import annotations

import collections
from typing import Any

import cloudpickle

from node.tasks.context import Ref, dump_outcome, run_captured
from node.workers import Frame, WorkerHandle

CACHE_BYTES = 512 * 1024 * 1024
"""Objects fetched from the driver are kept (most recent first) up to this many bytes."""


class ObjectCache:
    """Objects this worker has fetched, dropped oldest first past `limit_bytes`."""

    def __init__(self, limit_bytes: int = CACHE_BYTES) -> None:
        self._items: collections.OrderedDict[str, tuple[Any, int]] = collections.OrderedDict()
        self._bytes = 0
        self._limit = limit_bytes

    def get(self, ref_id: str) -> tuple[bool, Any]:
        item = self._items.get(ref_id)
        if item is None:
            return False, None
        self._items.move_to_end(ref_id)
        return True, item[0]

    def add(self, ref_id: str, obj: Any, size: int) -> None:
        self._items[ref_id] = (obj, size)
        self._bytes += size
        while self._bytes > self._limit and len(self._items) > 1:
            _, (_, dropped) = self._items.popitem(last=False)
            self._bytes -= dropped


class TaskLoop:
    """Reads frames from the driver, runs tasks in order, answers `done` frames."""

    def __init__(self, handle: WorkerHandle) -> None:
        self.handle = handle
        self.cache = ObjectCache()
        self.backlog: collections.deque[Frame] = collections.deque()
        self.actors: dict[str, object] = {}

    def next_frame(self) -> Frame:
        return self.backlog.popleft() if self.backlog else self.handle.recv_frame()

    def fetch(self, ref: Ref) -> Any:
        """The object of `ref`: cached, else asked of the driver (frames that arrive meanwhile
        are kept for later, in order)."""
        found, obj = self.cache.get(ref.id)
        if found:
            return obj
        self.handle.send({"op": "fetch", "ref": ref.id})
        while True:
            frame = self.handle.recv_frame()
            message = frame.message
            if message.get("op") == "object" and message.get("ref") == ref.id:
                if not message.get("found"):
                    raise LookupError(f"object {ref.id} is no longer held by {ref.owner}")
                obj = cloudpickle.loads(frame.payload)
                self.cache.add(ref.id, obj, len(frame.payload))
                return obj
            self.backlog.append(frame)

    def resolve(self, args: tuple[Any, ...], kwargs: dict[str, object]) -> Any:
        return (
            tuple(self.fetch(a) if isinstance(a, Ref) else a for a in args),
            {k: self.fetch(v) if isinstance(v, Ref) else v for k, v in kwargs.items()},
        )

    def run_one(self, frame: Frame) -> None:
        """Run one task, actor creation or actor call and answer its outcome (a payload that
        cannot be loaded here, e.g. code not importable on this node, is the task's error)."""
        message = frame.message
        outcome = run_captured(self._perform, (message, frame.payload), {})
        self.handle.send({"op": "done", "id": message["id"]}, dump_outcome(outcome))

    def _perform(self, message: dict[str, object], payload: bytes) -> Any:
        op = message.get("op")
        if op == "task":
            fn, args, kwargs = cloudpickle.loads(payload)
            args, kwargs = self.resolve(args, kwargs)
            return fn(*args, **kwargs)
        if op == "actor_new":
            cls, args, kwargs = cloudpickle.loads(payload)
            args, kwargs = self.resolve(args, kwargs)
            self.actors[str(message["actor"])] = cls(*args, **kwargs)
            return None
        if op == "actor_call":
            method, args, kwargs = cloudpickle.loads(payload)
            args, kwargs = self.resolve(args, kwargs)
            return getattr(self.actors[str(message["actor"])], method)(*args, **kwargs)
        raise ValueError(f"unknown operation {op!r}")

    def run_forever(self) -> None:
        while True:
            self.run_one(self.next_frame())


def serve(handle: WorkerHandle) -> None:
    """The work_fn of the `shoal` backend's workers."""
    TaskLoop(handle).run_forever()
