"""Training state that travels between live ranks. After a group re-forms in place, its ranks
agree on the newest step any of them holds in memory (`agree`), and the lowest rank holding it
sends its state to the ranks that lack it (`share_state`), as torchft recovers a replica from a
live peer: only when no rank holds live state does the group read a checkpoint.

Live state is replicated state (data parallel: every rank holds the whole model and optimizer);
sharded state (DTensor, FSDP) cannot travel this way and is restored from the committed
checkpoint instead (LiveStateError says so).
"""

from __future__ import annotations

import ctypes
import io
import time
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

from shoal.errors import ShoalError

__all__ = ["Holding", "LiveStateError", "TrainingState", "Transfer", "agree", "share_state"]

TrainingState = MutableMapping[str, Any]
"""A training script's state, by name: modules, optimizers, tensors, anything DCP's Stateful
protocol or torch.save takes (the user's own objects, so its values are Any)."""

NO_STEP = -1
"""What a rank that holds no live state contributes to `agree`."""


class LiveStateError(ShoalError):
    """The state cannot travel between live ranks (sharded tensors, an object torch cannot
    serialize), or what arrived does not fit the state it should load into."""


@dataclass(frozen=True, slots=True)
class Holding:
    """What the ranks of a group hold in memory: each rank's step (None: nothing live, a new
    or restarted process), the newest of them and the lowest rank holding it."""

    steps: tuple[int | None, ...]

    @property
    def newest(self) -> int | None:
        held = [step for step in self.steps if step is not None]
        return max(held) if held else None

    @property
    def source(self) -> int | None:
        newest = self.newest
        return None if newest is None else self.steps.index(newest)

    @property
    def lacking(self) -> tuple[int, ...]:
        """The ranks whose state is older than the newest (or absent)."""
        newest = self.newest
        if newest is None:
            return ()
        return tuple(rank for rank, step in enumerate(self.steps) if step != newest)


@dataclass(frozen=True, slots=True)
class Transfer:
    """One state transfer: the step sent, by which rank, to which ranks, its size and how long
    it took on this rank (serializing, sending, loading)."""

    step: int
    source: int
    receivers: tuple[int, ...]
    size_bytes: int
    seconds: float

    @property
    def bytes_per_s(self) -> float:
        return self.size_bytes / self.seconds if self.seconds > 0 else 0.0


def _torch() -> tuple[Any, Any]:
    import torch
    import torch.distributed as dist

    return torch, dist


def agree(step: int | None, group: Any = None) -> Holding:
    """Every rank's live step (`step`; None when this rank holds nothing live), on every rank
    of `group` (None: the default group): one all_gather of one integer per rank."""
    torch, dist = _torch()
    size = dist.get_world_size(group)
    mine = torch.tensor([NO_STEP if step is None else int(step)], dtype=torch.int64)
    gathered = [torch.zeros(1, dtype=torch.int64) for _ in range(size)]
    dist.all_gather(gathered, mine, group=group)
    return Holding(tuple(None if int(t.item()) < 0 else int(t.item()) for t in gathered))


def _is_sharded(value: Any) -> bool:
    return type(value).__name__ in ("DTensor", "ShardedTensor")


def _payload(state: Mapping[str, Any]) -> dict[str, Any]:
    """What `state` sends: each entry's state_dict() where it has one (a module, an optimizer,
    anything DCP calls Stateful), else the value itself."""
    payload: dict[str, Any] = {}
    for key, value in state.items():
        content = value.state_dict() if hasattr(value, "state_dict") else value
        entries = content.values() if isinstance(content, Mapping) else (content,)
        if any(_is_sharded(entry) for entry in entries):
            raise LiveStateError(
                f"state[{key!r}] holds sharded tensors, which do not travel between live "
                "ranks; restore them from the committed checkpoint"
            )
        payload[key] = content
    return payload


def _apply(state: TrainingState, payload: Mapping[str, Any]) -> None:
    """Load `payload` into `state` as `_payload` made it: load_state_dict where the entry has
    one, a tensor of the same shape copied in place, anything else replaced."""
    torch, _ = _torch()
    missing = sorted(set(state) - set(payload))
    if missing:
        raise LiveStateError(f"the state sent lacks {missing}: do all ranks hold the same keys?")
    for key, value in state.items():
        content = payload[key]
        if hasattr(value, "load_state_dict"):
            value.load_state_dict(content)
        elif (
            isinstance(value, torch.Tensor)
            and isinstance(content, torch.Tensor)
            and value.shape == content.shape
        ):
            with torch.no_grad():
                value.copy_(content)
        else:
            state[key] = content


def _encode(state: Mapping[str, Any]) -> bytes:
    torch, _ = _torch()
    buffer = io.BytesIO()
    try:
        torch.save(_payload(state), buffer)
    except (TypeError, AttributeError, RuntimeError) as exc:
        raise LiveStateError(f"the state cannot be serialized to send it: {exc}") from exc
    return buffer.getvalue()


def _decode(data: bytes) -> Any:
    torch, _ = _torch()
    try:
        return torch.load(io.BytesIO(data), weights_only=True)
    except Exception as exc:  # torch's unpickler raises many kinds; name what failed
        raise LiveStateError(
            f"the state received ({len(data)} bytes) cannot be read: {exc}"
        ) from exc


def share_state(
    state: TrainingState,
    holding: Holding,
    rank: int,
    group: Any = None,
    *,
    clock: Callable[[], float] = time.monotonic,
) -> Transfer | None:
    """Bring `state` to every rank lacking the newest step, from `holding.source` (every rank
    of `group` calls it with the same `holding`; `rank` is this process's rank in `group`).
    None when there is nothing to send (nobody holds live state, or everyone holds the newest).
    Two broadcasts: the size, then the bytes of torch.save of the source's state."""
    source, newest = holding.source, holding.newest
    receivers = holding.lacking
    if source is None or newest is None or not receivers:
        return None
    torch, dist = _torch()
    started = clock()
    data = _encode(state) if rank == source else b""
    size = torch.tensor([len(data)], dtype=torch.int64)
    dist.broadcast(size, src=_global(source, group, dist), group=group)
    length = int(size.item())
    if rank == source:
        buffer = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    else:
        buffer = torch.empty(length, dtype=torch.uint8)
    dist.broadcast(buffer, src=_global(source, group, dist), group=group)
    if rank in receivers:
        _apply(state, _decode(ctypes.string_at(buffer.data_ptr(), length)))
    return Transfer(newest, source, receivers, length, clock() - started)


def _global(rank: int, group: Any, dist: Any) -> int:
    """The global rank of `rank` of `group` (broadcast's `src` is a global rank)."""
    if group is None:
        return rank
    return int(dist.get_global_rank(group, rank))
