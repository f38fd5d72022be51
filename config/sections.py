"""The sections of a node's settings that stand alone: `results:`, `jobs:`, `autostop:`, the
log format, the deletion policies of the synced categories, and the top-level settings of the
training loop's fault handling (config.settings uses them)."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from config.fields import Category


class LogFormat(StrEnum):
    TEXT = "text"
    JSON = "json"


class ResultsSettings(BaseModel):
    """The `results:` section: where runs put the files they collect."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    backend: Literal["local", "s3"] = Field(
        "local",
        description="`local`: a directory on the coordinator's host; `s3`: an S3-compatible store.",
    )
    path: Path | None = Field(None, description="local: the directory (default DATA_DIR/results).")
    node: str | None = Field(
        None,
        description="local: the node whose directory holds the results (the coordinator asks it "
        "to fetch each file from its member); unset: the coordinator's host.",
    )
    endpoint_url: str | None = Field(None, description="s3: the store's URL (None: AWS).")
    bucket: str | None = Field(None, description="s3: the bucket (required for s3).")
    prefix: str = Field("", description="s3: a key prefix before runs/<run_id>/<node>/.")
    credentials_file: Path | None = Field(
        None, description="s3: AWS-style credentials file ([default] aws_access_key_id, ...)."
    )
    region: str = Field("us-east-1", description="s3: the region name.")

    @model_validator(mode="after")
    def _s3_needs_bucket(self) -> ResultsSettings:
        if self.backend == "s3" and (not self.bucket or self.credentials_file is None):
            raise ValueError("results.backend s3 needs results.bucket and results.credentials_file")
        if self.backend != "local" and self.node is not None:
            raise ValueError("results.node names where a `local` store lives; drop it for s3")
        return self


class JobSettings(BaseModel):
    """The `jobs:` section: limits and identity of commands run through the job API."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_log_bytes: int = Field(
        1 << 30,
        gt=0,
        description="Per job and stream: output beyond this is dropped (said in the record).",
    )
    allowed_programs: tuple[str, ...] | None = Field(
        None,
        description="Programs (argv[0], a name or an absolute path) jobs may run; others 403. "
        "Unset: any.",
    )
    run_as: str | None = Field(None, description="User that runs jobs when the daemon is root.")
    gang_failure: Literal["kill", "keep"] = Field(
        "kill", description="When one member of a gang job fails: kill the others, or keep them."
    )
    kill_grace_s: float = Field(
        10.0, ge=0, description="Default grace between TERM and KILL (kill and timeout_s)."
    )


class AutostopSettings(BaseModel):
    """The `autostop:` section: stop (or release) this node through its provider once idle for
    `idle_minutes` (no job, no run lock, every GPU below `gpu_util_threshold`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    idle_minutes: float = Field(
        ..., gt=0, description="Idle window in minutes (fractions allowed: 0.5 is 30 s)."
    )
    action: Literal["stop", "release"] = Field(
        "stop",
        description="`stop` keeps the node acquired (its disk stays); `release` gives it up.",
    )
    gpu_util_threshold: float = Field(
        5.0, ge=0, le=100, description="A GPU at or above this utilisation (percent) is busy."
    )
    dry_run: bool = Field(False, description="Only log and audit what it would do.")
    check_interval_s: float | None = Field(
        None,
        gt=0,
        description="Seconds between idle checks (default: a tenth of the window, at most 30).",
    )


class TrainingWatchSettings(BaseModel):
    """How the cluster judges its training group and restarts its workers
    (docs/fault-tolerance.md): top-level settings of a node (NodeSettings inherits them); the
    coordinator's apply (training_spares: each node's)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    training_hang_s: float = Field(
        60.0,
        gt=0,
        description="The group is hung when no rank advanced for this long, or for 20 median "
        "step times when that is longer: every worker is stopped and the group restarts.",
    )
    straggler_factor: float = Field(
        1.5,
        gt=1,
        description="A rank whose compute time stays above this times the group's median "
        "straggles.",
    )
    straggler_window: int = Field(
        20, ge=1, le=10_000, description="...for this many reported steps in a row."
    )
    straggler_action: Literal["report", "drain"] = Field(
        "report",
        description="`report`: flag it (/v1/training, a metric, an event); `drain`: also drain "
        "its node, so its rank moves to another node.",
    )
    training_spares: int = Field(
        0,
        ge=0,
        le=8,
        description="Warm spare processes of a Python training command (torch imported, "
        "waiting): a restarted worker takes one and starts in its script's own time, not the "
        "interpreter's and torch's.",
    )
    training_reform: Literal["restart", "in_place"] = Field(
        "restart",
        description="`restart`: every change of the group starts every worker again, which "
        "restores the newest committed checkpoint. `in_place`: workers that are still running "
        "stay; the script catches `shoal.GroupChanged` and calls `session.reform(state, step)`, "
        "which joins the next generation and takes the newest state a live rank holds "
        "(docs/fault-tolerance.md); only a worker that exited, or one stopped (a hang), starts "
        "again.",
    )


DeletionPolicy = Literal["keep", "propagate"]
DEFAULT_DELETIONS: dict[Category, DeletionPolicy] = {
    Category.MODELS: "keep",
    Category.TRAINING: "keep",
    Category.CONFIGS: "propagate",
    Category.GAMES: "keep",
    Category.ROLLOUTS: "keep",
}
"""The deletion policy of each category when `sync_categories` does not name it."""
RECORD_CATEGORIES = (Category.GAMES, Category.ROLLOUTS)
DEFAULT_TOMBSTONE_TTL_S = 7 * 86400.0


class CheckpointSettings(BaseModel):
    """Where committed training checkpoints are kept (docs/checkpoints.md): top-level settings
    of a node (NodeSettings inherits them)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    checkpoint_replicas: int = Field(
        2,
        ge=0,
        le=16,
        description="Other nodes that keep a copy of each node's files of a committed training "
        "checkpoint, chosen across the inventory's `zone` and `rack` labels (docs/checkpoints.md).",
    )
    checkpoint_keep: int = Field(
        3,
        ge=1,
        le=1000,
        description="Committed checkpoint steps every node keeps (the newest is never deleted); "
        "older steps and steps some rank never finished are deleted.",
    )
    checkpoint_copy_after_s: float = Field(
        60.0,
        ge=0,
        le=86400,
        description="A node is asked for copies of checkpoint files once it has been alive this "
        "long (a node that just joined restores and fetches what it needs itself).",
    )
