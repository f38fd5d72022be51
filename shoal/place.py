"""Where one training process stands: its ranks, the group's size and generation, its node."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from shoal.errors import ShoalError

__all__ = ["RankPlace", "place_from_env"]


@dataclass(frozen=True, slots=True)
class RankPlace:
    """One process of a training group: global `rank` of `world_size`, `local_rank` of the
    `local_world_size` processes of node `node_id` (None when no daemon named it), in group
    `generation` (0 when the environment names none, as under plain torchrun)."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    generation: int
    node_id: str | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise ShoalError(f"rank {self.rank} is not in 0..{self.world_size - 1}")
        if not 0 <= self.local_rank < self.local_world_size:
            raise ShoalError(
                f"local_rank {self.local_rank} is not in 0..{self.local_world_size - 1}"
            )


def _integer(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    text = env.get(name)
    if text is None or text == "":
        if default is None:
            raise ShoalError(f"{name} is not set: start the script with torchrun or shoal")
        return default
    try:
        return int(text)
    except ValueError:
        raise ShoalError(f"{name}={text!r} is not an integer") from None


def place_from_env(env: Mapping[str, str]) -> RankPlace:
    """The place torchrun's (or the shoal launcher's) variables give: RANK, LOCAL_RANK,
    WORLD_SIZE, LOCAL_WORLD_SIZE, SHOAL_GENERATION, SHOAL_NODE_ID."""
    world_size = _integer(env, "WORLD_SIZE")
    return RankPlace(
        rank=_integer(env, "RANK"),
        local_rank=_integer(env, "LOCAL_RANK", 0),
        world_size=world_size,
        local_world_size=_integer(env, "LOCAL_WORLD_SIZE", 1),
        generation=_integer(env, "SHOAL_GENERATION", 0),
        node_id=env.get("SHOAL_NODE_ID") or None,
    )
