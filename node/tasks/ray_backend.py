"""The `ray` backend (the optional extra `shoal[ray]`): the job context over `ray.put/get/
remote/wait` and Ray's named actors, for users who outgrow shoal's own dispatch. Remote errors
re-raise as the task's own exception with the remote traceback, as on the other backends."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Any

from node.errors import ActorDiedError, ActorExistsError, TaskError, TaskTimeout
from node.tasks.context import ActorHandle, Outcome, run_captured, unwrap


def _ray() -> Any:
    try:
        return importlib.import_module("ray")
    except ImportError as exc:
        raise TaskError(
            "the ray backend needs Ray: pip install 'shoal[ray]' (or SHOAL_CONTEXT=process)"
        ) from exc


def _call_captured(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Outcome:
    """Runs inside a Ray worker: the outcome, so a failure keeps its own type and traceback."""
    return run_captured(fn, args, kwargs)


class _Hosted:
    """The Ray actor class: it builds the user's instance and calls its methods captured."""

    def __init__(self, cls: type[Any], args: tuple[Any, ...], kwargs: dict[str, object]) -> None:
        self.instance = cls(*args, **kwargs)

    def call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, object]) -> Outcome:
        return run_captured(getattr(self.instance, method), args, kwargs)


class RayActor(ActorHandle):
    def __init__(self, actor: Any, name: str | None) -> None:
        self._actor = actor
        self.name = name
        self.incarnation = 1

    def _call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, object]) -> Any:
        return self._actor.call.remote(method, args, kwargs)


class RayContext:
    """put/get/run/wait/create_actor through Ray. `address` joins a running Ray cluster
    ("auto", "ray://host:10001"); without it a local Ray is started with `init_kwargs`."""

    def __init__(self, address: str | None = None, init_kwargs: dict[str, object] | None = None):
        self.ray = _ray()
        self._started = False
        if not self.ray.is_initialized():
            self.ray.init(address=address, **(init_kwargs or {}))
            self._started = True
        self._task = self.ray.remote(_call_captured)
        self._actor_class = self.ray.remote(_Hosted)

    def put(self, obj: Any) -> Any:
        return self.ray.put(obj)

    def get(self, ref: Any, timeout_s: float | None = None) -> Any:
        """The object or the task's result; the task's own exception with its remote
        traceback when it failed."""
        if isinstance(ref, list):
            return [self.get(r, timeout_s) for r in ref]
        try:
            value = self.ray.get(ref, timeout=timeout_s)
        except self.ray.exceptions.GetTimeoutError as exc:
            raise TaskTimeout(f"the task did not finish within {timeout_s} s") from exc
        except self.ray.exceptions.ActorDiedError as exc:
            raise ActorDiedError(str(exc)) from exc
        if isinstance(value, Outcome):
            return unwrap(value)
        return value

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self._task.remote(fn, *args, **kwargs)

    def wait(
        self, futures: Sequence[Any], num_returns: int = 1, timeout_s: float | None = None
    ) -> tuple[list[Any], list[Any]]:
        if num_returns < 0 or num_returns > len(futures):
            raise ValueError(f"num_returns {num_returns} is not within 0..{len(futures)}")
        ready, pending = self.ray.wait(
            list(futures), num_returns=num_returns, timeout=timeout_s, fetch_local=False
        )
        return list(ready), list(pending)

    def create_actor(
        self,
        cls: type[Any],
        *args: Any,
        name: str | None = None,
        get_if_exists: bool = False,
        **kwargs: Any,
    ) -> RayActor:
        options: dict[str, object] = {"max_concurrency": 1}
        if name is not None:
            options.update(name=name, get_if_exists=get_if_exists)
        try:
            actor = self._actor_class.options(**options).remote(cls, args, kwargs)
        except ValueError as exc:
            raise ActorExistsError(f"{exc}; pass get_if_exists=True") from exc
        return RayActor(actor, name)

    def close(self) -> None:
        if self._started:
            self.ray.shutdown()
            self._started = False

    def __enter__(self) -> RayContext:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
