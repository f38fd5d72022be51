"""A node's settings: defaults < config file < environment < CLI flags, and their sources."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from config.errors import ConfigError
from config.fields import Category, ListenPort, NodeId, Port, Role
from config.gpus import GpuSelection, NprocSetting
from config.sections import (
    DEFAULT_DELETIONS,
    DEFAULT_TOMBSTONE_TTL_S,
    RECORD_CATEGORIES,
    AutostopSettings,
    CheckpointSettings,
    DeletionPolicy,
    JobSettings,
    LogFormat,
    ResultsSettings,
    TrainingWatchSettings,
)
from config.sources import flatten_settings, put_setting, source_of
from config.timeouts import Timeouts
from config.tls.section import TlsSettings
from config.yamlfile import YamlDocument, describe_error, load_yaml_mapping


class AuthMode(StrEnum):
    """How peers and clients prove who they are: `hmac` (the cluster secret signs every request,
    in clear), `tls` (mutual TLS 1.3, the certificate is the identity and its role decides what
    it may call), `hmac+tls` (both accepted: the rolling migration between them)."""

    HMAC = "hmac"
    TLS = "tls"
    HMAC_TLS = "hmac+tls"

    @property
    def uses_tls(self) -> bool:
        return self is not AuthMode.HMAC

    @property
    def accepts_hmac(self) -> bool:
        return self is not AuthMode.TLS


class CategorySyncSettings(BaseModel):
    """One entry of `sync_categories:`: how a category is synced."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    deletions: DeletionPolicy = Field(
        description="`keep`: a file deleted on one node stays on the others; `propagate`: the "
        "deletion reaches every node (by tombstones kept tombstone_ttl_s)."
    )


class NodeSettings(TrainingWatchSettings, CheckpointSettings):
    """Everything one node is configured with (TrainingWatchSettings' and CheckpointSettings'
    fields too). Frozen: a change means a new object."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    node_id: NodeId | None = Field(None, description="Stable id; generated once into the data dir.")
    data_dir: Path = Field(Path(".shoal"), description="Where the node keeps its state and data.")
    wal_dir: Path | None = Field(None, description="Directory of the WAL database (data_dir/wal).")
    bind: str = Field("127.0.0.1", min_length=1, description="Address the HTTP API listens on.")
    port: ListenPort = Field(8770, description="HTTP API port; membership uses the same UDP port.")
    advertise_address: str | None = Field(None, description="Address peers reach this node at.")
    mdns: bool = Field(True, description="Advertise and discover peers with mDNS.")
    cluster_name: str = Field(
        "shoal", min_length=1, description="Peers of other clusters are ignored."
    )
    secret_file: Path | None = Field(None, description="Cluster secret (chmod 600) for signing.")
    metrics_token_file: Path | None = Field(None, description="Bearer token file for /metrics.")
    ui_token_file: Path | None = Field(
        None,
        description="Read token of the web dashboard at /ui/ (chmod 600); exchanged once for "
        "a session cookie. Unset: the dashboard needs no login only when the node has no "
        "cluster secret (loopback dev mode), else it is off.",
    )
    inventory: Path | None = Field(None, description="YAML host inventory.")
    role: Role = Field(
        Role.AUTO, description="Role preference: auto, training, inference, selfplay."
    )
    storage_paths: dict[Category, Path] = Field(
        default_factory=dict, description="Per-category directories (default data_dir/<category>)."
    )
    record_stores: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="Extra record stores: name -> {key, time_column, fields: {name: kind}}.",
    )
    seeds: tuple[str, ...] = Field((), description="HOST:PORT of peers to join through.")
    voters: tuple[NodeId, ...] | None = Field(None, description="Voter ids when no inventory.")
    min_training: int = Field(1, ge=0, description="Fewer possible training nodes: none trains.")
    max_training: int = Field(64, ge=0, description="At most this many training nodes.")
    master_port: Port = Field(29500, description="Base port of the training rendezvous (rank 0).")
    backend: Literal["auto", "nccl", "gloo"] = Field(
        "auto", description="torch.distributed backend: auto (nccl when all trainers have GPUs)."
    )
    adoption_log: Path | None = Field(
        None, description="Append every adopted (term, coordinator, plan) here (JSON lines)."
    )
    training_command: tuple[str, ...] | None = Field(
        None,
        description="A training program the daemon runs while this node trains as torchrun "
        "runs its workers: one process per local rank with RANK, LOCAL_RANK, WORLD_SIZE, "
        "LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT, "
        "SHOAL_GENERATION (docs/gpus.md); all restarted when one fails or the plan changes.",
    )
    training_env: dict[str, str] = Field(
        default_factory=dict, description="Extra environment of the training program."
    )
    gpus: GpuSelection = Field(
        "auto",
        description="The host's GPUs this node owns (NVML indices): auto (every GPU NVML sees), "
        "none, or a list such as [0, 1]. With a list, jobs get CUDA_VISIBLE_DEVICES for them.",
    )
    training_nproc: NprocSetting = Field(
        "auto",
        description="Processes this node runs in the training group: auto (one per owned GPU, "
        "1 without GPUs) or a count (at most the owned GPUs).",
    )
    training_max_failures: int = Field(
        5,
        ge=1,
        description="Failed starts of the training program within training_failure_window_s "
        "after which this node reports itself unable to train (its rank goes to another node).",
    )
    training_failure_window_s: float = Field(
        300.0,
        gt=0,
        description="Window of training_max_failures; also how long the node stays unable to "
        "train before it offers itself again.",
    )
    gpu_fault_check_s: float = Field(
        1.0,
        ge=0.05,
        le=2.0,
        description="How often the owned GPUs' fault sources (Xid events, ECC, row remapping, "
        "readability) are read; a fault takes the node out of training within about this plus "
        "one plan (docs/fault-tolerance.md).",
    )
    gpu_readmit_settle_s: float = Field(
        10.0,
        ge=0,
        description="How long a quarantined node's GPUs stay fault-free before their self-test "
        "runs and the node asks to train again.",
    )
    gpu_quarantine_limit: int = Field(
        3, ge=1, description="Quarantines within an hour after which only an undrain lifts one."
    )
    insecure: bool = Field(False, description="Allow a non-loopback bind without a secret.")
    tls: TlsSettings | None = Field(
        None, description="{ca, cert, key, crl?, crl_refresh_s?}: mutual TLS (docs/security.md)."
    )
    auth: AuthMode | None = Field(
        None,
        description="hmac, tls or hmac+tls (default hmac without a tls section, tls with one).",
    )
    log_format: LogFormat = Field(LogFormat.TEXT, description="text or json log lines.")
    circuit_threshold: int = Field(5, ge=1, description="Failures in a row that open a breaker.")
    sync_transports: tuple[Literal["http", "rsync"], ...] = Field(
        ("http",),
        min_length=1,
        description="Transports tried for each file, in order (rsync needs the inventory's ssh_*).",
    )
    ssh_known_hosts: Path | None = Field(
        None, description="known_hosts for rsync over SSH (default ~/.ssh/known_hosts)."
    )
    sync_interval_s: float = Field(
        60.0, ge=0, description="Background pull of files and records from alive peers (0: off)."
    )
    sync_upload_limit_bytes_s: float | None = Field(
        None,
        gt=0,
        description="Cap on the file bytes this node serves to peers, all transfers together, "
        "in bytes per second (none: unlimited).",
    )
    rollouts_max_pending: int = Field(
        100_000,
        ge=1,
        le=100_000_000,
        description="Unconsumed samples of one run the rollouts store keeps; beyond it a POST "
        "answers 429 with Retry-After until the trainer's RolloutStream has read some.",
    )
    sync_categories: dict[Category, CategorySyncSettings] = Field(
        default_factory=dict,
        description="Per category: {deletions: keep | propagate} (default propagate for "
        "configs, keep for the others).",
    )
    tombstone_ttl_s: float = Field(
        DEFAULT_TOMBSTONE_TTL_S,
        gt=0,
        description="How long a deletion of a `propagate` category is remembered and served; "
        "a node away longer says so in its sync stats.",
    )
    jobs: JobSettings = Field(default_factory=JobSettings)
    provider: Literal["static", "local"] = Field(
        "static",
        description="What this node is to its provider: `static` (an inventory host; stopping it "
        "is a reported no-op) or `local` (a daemon of the local provider; stopping ends it).",
    )
    autostop: AutostopSettings | None = Field(
        None,
        description="Stop this node when idle (default: the inventory host's `autostop:`; "
        "unset there too: never).",
    )
    results: ResultsSettings = Field(default_factory=ResultsSettings)
    timeouts: Timeouts = Field(default_factory=Timeouts)

    @model_validator(mode="after")
    def _auth_needs_tls(self) -> NodeSettings:
        if self.auth is not None and self.auth.uses_tls and self.tls is None:
            raise ValueError(
                f"auth {self.auth.value} needs a tls section {{ca, cert, key}}: issue this "
                "node's certificate with `shoal ca issue NAME --role node`"
            )
        if self.auth is AuthMode.HMAC_TLS and self.secret_file is None:
            raise ValueError(
                "auth hmac+tls accepts requests signed with the cluster secret: set secret_file"
            )
        return self

    @property
    def auth_mode(self) -> AuthMode:
        """`auth`, or its default: hmac without a `tls` section, tls with one."""
        if self.auth is not None:
            return self.auth
        return AuthMode.HMAC if self.tls is None else AuthMode.TLS

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, seeds: tuple[str, ...]) -> tuple[str, ...]:
        for seed in seeds:
            host, sep, port = seed.rpartition(":")
            if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
                raise ValueError(f"each seed must be HOST:PORT, got {seed!r}")
        return seeds

    @field_validator("gpus", mode="before")
    @classmethod
    def _gpus(cls, value: Any) -> Any:
        if isinstance(value, str) and value.strip() not in ("auto", "none"):
            value = [part.strip() for part in value.split(",") if part.strip()]
        if isinstance(value, list | tuple):
            indices = []
            for item in value:
                text = item.strip() if isinstance(item, str) else item
                if isinstance(text, str) and text.isdigit():
                    text = int(text)
                if isinstance(text, bool) or not isinstance(text, int) or text < 0:
                    raise ValueError(
                        f"must be auto, none or a list of GPU indices >= 0, got {item!r}"
                    )
                indices.append(text)
            if len(set(indices)) != len(indices):
                raise ValueError(f"lists a GPU twice: {list(value)!r}")
            return tuple(indices)
        return value.strip() if isinstance(value, str) else value

    @field_validator("training_nproc", mode="before")
    @classmethod
    def _training_nproc(cls, value: Any) -> Any:
        text = value.strip() if isinstance(value, str) else value
        if isinstance(text, str) and text.isdigit():
            text = int(text)
        if text == "auto":
            return text
        if isinstance(text, bool) or not isinstance(text, int) or text < 1:
            raise ValueError(f"must be auto or an integer >= 1, got {value!r}")
        return text

    @field_validator("sync_categories")
    @classmethod
    def _record_deletions(
        cls, categories: dict[Category, CategorySyncSettings]
    ) -> dict[Category, CategorySyncSettings]:
        for category in RECORD_CATEGORIES:
            entry = categories.get(category)
            if entry is not None and entry.deletions == "propagate":
                raise ValueError(
                    f"{category.value}.deletions: records are never deleted by sync; only the "
                    "file categories (models, training, configs) can propagate deletions"
                )
        return categories

    def deletion_policy(self, category: Category | str) -> DeletionPolicy:
        """`keep` or `propagate` for `category` (sync_categories, else DEFAULT_DELETIONS)."""
        category = Category(category)
        entry = self.sync_categories.get(category)
        return entry.deletions if entry is not None else DEFAULT_DELETIONS[category]

    @property
    def wal_path(self) -> Path:
        """The WAL database file."""
        return (self.wal_dir or self.data_dir / "wal") / "wal.db"

    @property
    def local_url(self) -> str:
        """The URL a process on this host reaches this node's API at (a wildcard bind is
        reached on loopback)."""
        host = self.bind
        if host in ("0.0.0.0", "", "*"):  # noqa: S104 - a wildcard bind is reached on loopback
            host = "127.0.0.1"
        elif host == "::":
            host = "::1"
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    @property
    def checkpoint_dir(self) -> Path:
        """Where the training ranks of this node write their checkpoints (SHOAL_CHECKPOINT_DIR of
        the training command), one directory per step, and where copies of peers' land."""
        return self.data_dir / "checkpoints"

    def category_path(self, category: Category | str) -> Path:
        """The directory of a data category."""
        category = Category(category)
        return self.storage_paths.get(category, self.data_dir / category.value)

    def config_hash(self) -> str:
        """Hash of the settings that must agree across the cluster (drift shows in the monitor)."""
        shared = {
            "cluster_name": self.cluster_name,
            "timeouts": self.timeouts.model_dump(),
            "circuit_threshold": self.circuit_threshold,
            "voters": self.voters,
        }
        blob = json.dumps(shared, sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:12]


ENV_VARS: dict[str, str] = {
    "SHOAL_CLUSTER_CONFIG": "inventory",
    "SHOAL_DATA_DIR": "data_dir",
    "SHOAL_NODE_ID": "node_id",
    "SHOAL_P2P_PORT": "port",
    "SHOAL_SYNC_TIMEOUT": "timeouts.sync_s",
    "SHOAL_WAL_DIR": "wal_dir",
    "SHOAL_CIRCUIT_THRESHOLD": "circuit_threshold",
    "SHOAL_BIND": "bind",
    "SHOAL_SECRET_FILE": "secret_file",
}
"""Environment variable -> setting (dotted for nested). SHOAL_CONFIG names the config file."""


@dataclass(frozen=True)
class LoadedSettings:
    """Effective settings, the source of each (`default`, `file:PATH:LINE`, `env:VAR`, `flag`)."""

    settings: NodeSettings
    sources: Mapping[str, str]
    config_file: Path | None


def load_settings(
    config_file: Path | str | None = None,
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
) -> LoadedSettings:
    """Merge defaults < config file < environment < flags and validate once.

    `config_file` (or SHOAL_CONFIG) is a YAML mapping of NodeSettings fields. `flags` holds
    only the flags the user gave, by setting name. Errors name the file and line, the
    variable or the flag, and the field.
    """
    env = os.environ if env is None else env
    flags = flags or {}
    path_text = config_file if config_file is not None else env.get("SHOAL_CONFIG")
    path = Path(path_text).expanduser() if path_text else None
    merged: dict[str, Any] = {}
    sources: dict[str, str] = {}
    doc: YamlDocument | None = None
    if path is not None:
        doc = load_yaml_mapping(path, "config file")
        for name, value in flatten_settings(doc.data).items():
            put_setting(merged, name, value)
            sources[name] = f"file:{doc.where(name.split('.'))}"
    for var, name in ENV_VARS.items():
        if var in env and env[var] != "":
            put_setting(merged, name, env[var])
            sources[name] = f"env:{var}"
    for name, value in flags.items():
        if value is None:
            continue
        put_setting(merged, name, value)
        sources[name] = "flag"
    try:
        settings = NodeSettings.model_validate(merged)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            loc = tuple(str(part) for part in error.get("loc", ()))
            source = source_of(loc, sources, str(error.get("msg", "")))
            where = {"default": "settings", "flag": "command line"}.get(source, source)
            where = where.removeprefix("file:").replace("env:", "environment variable ")
            problems.append(f"{where}: {describe_error(NodeSettings, error)}")
        raise ConfigError(problems) from exc
    settings = settings.model_copy(
        update={
            "data_dir": settings.data_dir.expanduser().resolve(),
            "wal_dir": settings.wal_dir.expanduser().resolve() if settings.wal_dir else None,
        }
    )
    return LoadedSettings(settings=settings, sources=sources, config_file=path)


def describe_settings(loaded: LoadedSettings) -> list[tuple[str, Any, str]]:
    """(setting, value, source) rows for `shoal config show`; nested timeouts flattened."""
    rows: list[tuple[str, Any, str]] = []
    dumped = loaded.settings.model_dump(mode="json")
    for name, value in flatten_settings(dumped).items():
        rows.append((name, value, loaded.sources.get(name, "default")))
    return rows
