"""An auto-stop decision (node.providers.autostop): what was decided, on which idle window, and
how it ended; its JSON is the `node.autostop` WAL payload, the kept last decision and the
`last_decision` of the status object."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeVar

from node.runtime import AutostopDecisionJson

Action = Literal["stop", "release"]
T = TypeVar("T")


@dataclass(frozen=True)
class AutostopDecision:
    """`action` of `provider`/`node` decided at `decided_at` (wall clock) after `idle_s` idle
    seconds of a `window_s` window; `entry` its WAL entry (None without a WAL), `outcome` how
    it ended (None: not yet, the WAL payload). None elsewhere: unknown (left out of the JSON)."""

    provider: str | None
    node: str | None
    action: Action | None
    idle_s: float | None
    window_s: float | None
    dry_run: bool | None
    decided_at: float | None
    entry: int | None = None
    outcome: str | None = None
    recovered: bool = False

    def payload(self) -> AutostopDecisionJson:
        """The decision before it is acted on: the `node.autostop` WAL payload."""
        data: AutostopDecisionJson = {}
        if self.provider is not None:
            data["provider"] = self.provider
        if self.node is not None:
            data["node"] = self.node
        if self.action is not None:
            data["action"] = self.action
        if self.idle_s is not None:
            data["idle_s"] = self.idle_s
        if self.window_s is not None:
            data["window_s"] = self.window_s
        if self.dry_run is not None:
            data["dry_run"] = self.dry_run
        if self.decided_at is not None:
            data["decided_at"] = self.decided_at
        return data

    def to_json(self) -> AutostopDecisionJson:
        """The decision with its WAL entry, whether it was recovered and its outcome."""
        data = self.payload()
        data["entry"] = self.entry
        if self.recovered:
            data["recovered"] = True
        data["outcome"] = "in progress" if self.outcome is None else self.outcome
        return data

    @classmethod
    def from_json(cls, data: object) -> AutostopDecision:
        """A decision from its JSON (a WAL payload, or a kept decision); ValueError names the
        field of the wrong type."""
        if not isinstance(data, dict):
            raise ValueError(f"an auto-stop decision is a JSON object, not {data!r}")
        action = data.get("action")
        if action not in (None, "stop", "release"):
            raise ValueError(f"auto-stop decision field 'action' is {action!r}")
        recovered = data.get("recovered", False)
        if not isinstance(recovered, bool):
            raise ValueError(f"auto-stop decision field 'recovered' is {recovered!r}")
        return cls(
            provider=_of(data, "provider", str),
            node=_of(data, "node", str),
            action=action,
            idle_s=_number(data, "idle_s"),
            window_s=_number(data, "window_s"),
            dry_run=_of(data, "dry_run", bool),
            decided_at=_number(data, "decided_at"),
            entry=_of(data, "entry", int),
            outcome=_of(data, "outcome", str),
            recovered=recovered,
        )


def _of(data: dict[str, object], name: str, kind: type[T]) -> T | None:
    value = data.get(name)
    if value is None:
        return None
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise ValueError(f"auto-stop decision field {name!r} is {value!r}")
    return value


def _number(data: dict[str, object], name: str) -> float | None:
    value = data.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"auto-stop decision field {name!r} is {value!r}, not a number")
    return value
