"""The environment torchrun gives its workers, built from this node's rendezvous: what the
training launcher's workers and `env_from: rendezvous` jobs get, so a script written for
`torchrun --nnodes N --nproc-per-node G` runs under shoal unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from config import Timeouts
from node.errors import LauncherError
from node.training.rendezvous import ENV_DAEMON_URL, Rendezvous

ENV_CHECKPOINT_DIR = "SHOAL_CHECKPOINT_DIR"
"""Where the training workers write their checkpoints (shoal.checkpoint reads it)."""
ENV_REFORM = "SHOAL_REFORM"
"""The node's `training_reform` (shoal.session reads it: `in_place` re-forms in place)."""
ENV_AFTER_GENERATION = "SHOAL_AFTER_GENERATION"
"""In place, a worker started again before the next generation exists: shoal.session asks the
daemon for a rendezvous of a generation above this one instead of reading RANK."""
ROLE_NAME = "default"
"""torchrun's role name when none is given (`--role`)."""

TORCHRUN_VARIABLES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_NAME",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "SHOAL_GENERATION",
    "SHOAL_BACKEND",
)
"""Every variable `torchrun_env` sets (OMP_NUM_THREADS aside, which it only defaults)."""


@dataclass(frozen=True, slots=True)
class NodePlace:
    """Where this node's workers sit in the node-major group: global rank of its local rank 0,
    how many local ranks it runs, its node rank (torchrun's GROUP_RANK) and the node count."""

    first_rank: int
    local_world_size: int
    node_rank: int
    nnodes: int

    def rank_of(self, local_rank: int) -> int:
        """The global rank of `local_rank`; LauncherError when this node has no such local rank."""
        if not 0 <= local_rank < self.local_world_size:
            raise LauncherError(
                f"local rank {local_rank} is not below this node's local world size "
                f"{self.local_world_size}"
            )
        return self.first_rank + local_rank


def node_place(rendezvous: Rendezvous) -> NodePlace:
    """This node's place in the group of `rendezvous` (any of its local ranks' answers); an
    answer without `node_rank` (an older daemon's) places one process per node. LauncherError
    when it has no rank."""
    if rendezvous.rank is None:
        raise LauncherError(f"generation {rendezvous.generation} gives this node no rank")
    first_rank = rendezvous.rank - rendezvous.local_rank
    if rendezvous.node_rank is None:
        if rendezvous.local_world_size != 1:
            raise LauncherError(
                f"generation {rendezvous.generation}: a rendezvous of "
                f"{rendezvous.local_world_size} local ranks lacks node_rank"
            )
        return NodePlace(first_rank, 1, rendezvous.rank, rendezvous.world_size)
    return NodePlace(
        first_rank=first_rank,
        local_world_size=rendezvous.local_world_size,
        node_rank=rendezvous.node_rank,
        nnodes=rendezvous.nnodes,
    )


def run_id(generation: int) -> str:
    """TORCHELASTIC_RUN_ID of a generation's workers."""
    return f"shoal-gen{generation}"


def torchrun_env(
    rendezvous: Rendezvous,
    *,
    local_rank: int = 0,
    restart_count: int = 0,
    max_restarts: int = 0,
    inherited: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The variables torchrun sets for worker `local_rank` of this node, plus SHOAL_GENERATION
    and SHOAL_BACKEND (the plan's backend, which shoal.training_session uses).

    As torchrun does, TORCH_NCCL_ASYNC_ERROR_HANDLING keeps its `inherited` value (else "1"),
    and OMP_NUM_THREADS is set to "1" when the node runs more than one worker and `inherited`
    does not set it. The master is the group's rank 0, which hosts the TCPStore itself
    (TORCHELASTIC_USE_AGENT_STORE=False: there is no torchrun agent holding one).
    LauncherError when this node has no rank or no such local rank.
    """
    inherited = {} if inherited is None else inherited
    place = node_place(rendezvous)
    rank = place.rank_of(local_rank)
    env = {
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(rendezvous.world_size),
        "LOCAL_WORLD_SIZE": str(place.local_world_size),
        "GROUP_RANK": str(place.node_rank),
        "GROUP_WORLD_SIZE": str(place.nnodes),
        "ROLE_RANK": str(rank),
        "ROLE_NAME": ROLE_NAME,
        "ROLE_WORLD_SIZE": str(rendezvous.world_size),
        "MASTER_ADDR": rendezvous.master_addr,
        "MASTER_PORT": str(rendezvous.master_port),
        "TORCHELASTIC_RESTART_COUNT": str(restart_count),
        "TORCHELASTIC_MAX_RESTARTS": str(max_restarts),
        "TORCHELASTIC_RUN_ID": run_id(rendezvous.generation),
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": inherited.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
        "SHOAL_GENERATION": str(rendezvous.generation),
        "SHOAL_BACKEND": rendezvous.backend,
    }
    if place.local_world_size > 1 and "OMP_NUM_THREADS" not in inherited:
        env["OMP_NUM_THREADS"] = "1"
    return env


def training_env(
    rendezvous: Rendezvous,
    base_env: Mapping[str, str],
    *,
    local_rank: int = 0,
    restart_count: int = 0,
    max_restarts: int = 0,
) -> dict[str, str]:
    """`base_env` with the torchrun variables of worker `local_rank` (`torchrun_env`) over it."""
    return {
        **base_env,
        **torchrun_env(
            rendezvous,
            local_rank=local_rank,
            restart_count=restart_count,
            max_restarts=max_restarts,
            inherited=base_env,
        ),
    }


def training_base_env(
    inherited: Mapping[str, str],
    training_env: Mapping[str, str],
    daemon_url: str,
    gpu_env: Mapping[str, str],
    timeouts: Timeouts | None = None,
    *,
    checkpoint_dir: Path | None = None,
    reform: str = "restart",
) -> dict[str, str]:
    """What every training worker of the daemon starts from (the launcher adds the torchrun
    variables): the daemon's environment, then `gpu_env` (config.cuda_env of the GPUs the node
    owns, when `gpus` lists them), then SHOAL_COLLECTIVE_S and SHOAL_QUORUM_S (the node's
    `timeouts`, which shoal.training_session forms its group with), then the `training_env`
    setting (an operator's own CUDA_VISIBLE_DEVICES wins, as a job's does), then
    SHOAL_DAEMON_URL and, when given, SHOAL_CHECKPOINT_DIR (the node's checkpoint directory:
    the daemon's, never overridden), and SHOAL_REFORM (the node's `training_reform`)."""
    timing = (
        {}
        if timeouts is None
        else {
            "SHOAL_COLLECTIVE_S": f"{timeouts.collective_s:g}",
            "SHOAL_QUORUM_S": f"{timeouts.quorum_s:g}",
        }
    )
    env = {**inherited, **gpu_env, **timing, **training_env, ENV_DAEMON_URL: daemon_url}
    env[ENV_REFORM] = reform
    if checkpoint_dir is not None:
        env[ENV_CHECKPOINT_DIR] = str(checkpoint_dir)
    return env
