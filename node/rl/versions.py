"""Policy versions on samples: explicit version state, stamping, and the staleness rule.

A version counts optimizer steps of the trainer's policy; `max_lag` counts versions, so a sample
generated with version v is fresh while `current - v <= max_lag`.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Mapping
from typing import Any, TypedDict

from node.errors import WeightsError


class VersionState(TypedDict):
    """A generator's version state: its weights' version, its node id, and when the version
    last changed (None: never)."""

    version: int
    node: str
    updated_at: float | None


def make_version_state(node: str | None = None, version: int = 0) -> VersionState:
    """The state a generator threads through stamping: its weights' version and its node id."""
    return VersionState(
        version=_check_version(version), node=node or socket.gethostname(), updated_at=None
    )


def set_version(
    version_state: VersionState, version: int, now: float | None = None
) -> VersionState:
    """Record that the generator now runs weights of `version` (never lower); returns the state."""
    version = _check_version(version)
    if version < version_state["version"]:
        raise WeightsError(
            f"version {version} is older than the weights in use ({version_state['version']})"
        )
    version_state["version"] = version
    version_state["updated_at"] = time.time() if now is None else now
    return version_state


def stamp_sample(
    sample: Mapping[str, Any],
    version_state: VersionState,
    clock: Callable[[], float] = time.time,
) -> dict[str, Any]:
    """A copy of `sample` with `model_version`, `generated_at` (seconds since the epoch) and
    `node` of the weights that generated it."""
    return {
        **sample,
        "model_version": int(version_state["version"]),
        "generated_at": clock(),
        "node": str(version_state["node"]),
    }


def check_staleness(sample: Mapping[str, Any], current_version: int, max_lag: int) -> bool:
    """True when `sample` is fresh: its `model_version` is at most `max_lag` versions behind
    `current_version`. A sample without an integer `model_version` is never fresh."""
    if isinstance(max_lag, bool) or not isinstance(max_lag, int) or max_lag < 0:
        raise WeightsError(f"max_lag {max_lag!r} must be an integer >= 0 (policy versions)")
    version = sample.get("model_version")
    if isinstance(version, bool) or not isinstance(version, int):
        return False
    return current_version - version <= max_lag


def _check_version(version: object) -> int:
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise WeightsError(f"weights version {version!r} must be an integer >= 0")
    return version
