"""Choosing a backend: `current_context(spec)` or $SHOAL_CONTEXT, e.g. `thread`, `process`,
`shoal?daemon=http://10.0.0.5:8770&role=training&workers=4`, `ray`, `ray?address=auto`."""

from __future__ import annotations

import os
import threading
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

from node.errors import TaskError
from node.tasks.context import JobContext

BACKENDS = ("sync", "thread", "process", "shoal", "ray")
DEFAULT_SPEC = "thread"
ENV_VAR = "SHOAL_CONTEXT"


@dataclass(frozen=True)
class ContextSpec:
    """A parsed backend spec: its name and its query options."""

    backend: str
    options: dict[str, str] = field(default_factory=dict)


def parse_spec(spec: str) -> ContextSpec:
    """`name` or `name?key=value&...`; TaskError naming the known backends otherwise."""
    name, _, query = spec.strip().partition("?")
    if name not in BACKENDS:
        raise TaskError(
            f"{ENV_VAR}={spec!r}: unknown backend {name!r}; use one of {', '.join(BACKENDS)}"
        )
    options = dict(urllib.parse.parse_qsl(query, keep_blank_values=True, strict_parsing=False))
    allowed = {
        "sync": set(),
        "thread": {"workers"},
        "process": {"workers"},
        "shoal": {"daemon", "role", "workers", "gpus", "config"},
        "ray": {"address"},
    }[name]
    unknown = set(options) - allowed
    if unknown:
        raise TaskError(
            f"{ENV_VAR}={spec!r}: {name} takes {sorted(allowed) or 'no options'}, "
            f"not {sorted(unknown)}"
        )
    return ContextSpec(name, options)


def make_context(spec: ContextSpec) -> Any:
    """A new context of the backend `spec` names."""
    options = spec.options
    workers = int(options["workers"]) if "workers" in options else None
    if spec.backend == "sync":
        from node.tasks.local import SyncContext

        return SyncContext()
    if spec.backend == "thread":
        from node.tasks.local import ThreadContext

        return ThreadContext(workers)
    if spec.backend == "process":
        from node.tasks.local import ProcessContext

        return ProcessContext(workers)
    if spec.backend == "shoal":
        from node.tasks.shoal import ShoalContext

        return ShoalContext(
            options.get("daemon"),
            role=options.get("role", "any"),
            workers_per_node=workers or 2,
            gpus_per_node=int(options.get("gpus", "0")),
            config_file=options.get("config"),
        )
    from node.tasks.ray_backend import RayContext

    return RayContext(options.get("address"))


_current: dict[str, JobContext] = {}
_lock = threading.Lock()


def current_context(spec: str | None = None) -> JobContext:
    """The context of this process for `spec` (default $SHOAL_CONTEXT, else "thread"),
    made on first use and shared afterwards."""
    text = spec or os.environ.get(ENV_VAR) or DEFAULT_SPEC
    parsed = parse_spec(text)
    with _lock:
        context = _current.get(text)
        if context is None:
            context = make_context(parsed)
            _current[text] = context
    return context
