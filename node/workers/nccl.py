"""NCCL (or gloo) process-group settings for workers: one rank per worker, numbered node by
node, and the environment torch.distributed reads them from."""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

DEFAULT_MASTER_PORT = 29500


class NCCLMessage(TypedDict):
    """An NCCLConfig as the JSON message its worker is sent."""

    master_addr: str
    master_port: int
    world_size: int
    rank: int
    local_rank: int


@dataclass(frozen=True)
class NCCLConfig:
    master_addr: str
    master_port: int
    world_size: int
    rank: int
    local_rank: int

    def to_message(self) -> NCCLMessage:
        """The config as a JSON message, to send to its worker."""
        return NCCLMessage(
            master_addr=self.master_addr,
            master_port=self.master_port,
            world_size=self.world_size,
            rank=self.rank,
            local_rank=self.local_rank,
        )

    @classmethod
    def from_message(cls, message: Mapping[str, Any]) -> NCCLConfig:
        return cls(
            str(message["master_addr"]),
            int(message["master_port"]),
            int(message["world_size"]),
            int(message["rank"]),
            int(message["local_rank"]),
        )


def create_nccl_configs(
    master_addr: str,
    nodes: Sequence[int | tuple[str, int]],
    master_port: int = DEFAULT_MASTER_PORT,
) -> list[NCCLConfig]:
    """One config per worker: node i has `nodes[i]` workers (a count, or a (name, count) pair
    as miniray writes it), ranks in node order, local ranks from 0 on each node."""
    counts = [n if isinstance(n, int) else n[1] for n in nodes]
    if any(n < 1 for n in counts):
        raise ValueError(f"every node needs at least one worker, got {list(nodes)}")
    world_size = sum(counts)
    configs: list[NCCLConfig] = []
    for count in counts:
        for local_rank in range(count):
            configs.append(
                NCCLConfig(master_addr, master_port, world_size, len(configs), local_rank)
            )
    return configs


def setup_nccl_env(
    config: NCCLConfig, environ: MutableMapping[str, str] | None = None
) -> dict[str, str]:
    """Set MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK, LOCAL_RANK (in `environ`, default
    os.environ) for `torch.distributed.init_process_group(init_method="env://")`."""
    values = {
        "MASTER_ADDR": config.master_addr,
        "MASTER_PORT": str(config.master_port),
        "WORLD_SIZE": str(config.world_size),
        "RANK": str(config.rank),
        "LOCAL_RANK": str(config.local_rank),
    }
    target = os.environ if environ is None else environ
    target.update(values)
    return values
