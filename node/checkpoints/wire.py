"""The checkpoint routes' paths, bodies and answers: the training processes'
POST /v1/checkpoints/written|prepare|restored, the nodes' POST /v1/checkpoints/news to the
coordinator, and GET /v1/checkpoints."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AliasChoices, BaseModel, BeforeValidator, ConfigDict, Field

from node.locks.checkpoints import CheckpointLog
from node.openapi import BODY_CONFIG, RECORD_CONFIG, Count, WireRecord

CHECKPOINTS_PATH = "/v1/checkpoints"
WRITTEN_PATH = "/v1/checkpoints/written"
PREPARE_PATH = "/v1/checkpoints/prepare"
RESTORED_PATH = "/v1/checkpoints/restored"
NEWS_PATH = "/v1/checkpoints/news"
MAX_FILES = 4096
"""Files one rank may report for one step (DCP writes one per rank and IO thread)."""
MAX_REPORTS = 1024
MAX_PIECES = 1 << 16
MAX_WORLD = 1 << 20
HEX64 = r"^[0-9a-f]{64}$"
FILE_NAME = r"^[^./\\\u0000-\u001f\u007f][^/\\\u0000-\u001f\u007f]{0,254}$"
"""A file of a step directory: one path component, not beginning with a dot."""
STEP_DIRECTORY = r"^step-[0-9]{8,}-g[0-9]+$"
MAX_DIRECTORY_CHARS = 48
"""A step directory's name: step-, 8 to 19 digits, -g, up to 19 digits."""
NODE_ID = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"

Hash = Annotated[str, Field(pattern=HEX64, description="sha256 hex (sync's content hash)")]
NodeId = Annotated[str, Field(pattern=NODE_ID)]


def _whole(value: object) -> object:
    return int(value) if isinstance(value, float) and value.is_integer() else value


WorldSize = Annotated[int, Field(ge=1, le=MAX_WORLD), BeforeValidator(_whole)]
PieceSize = Annotated[
    int,
    Field(ge=4096, le=1 << 26, description="the piece size of the hashes"),
    BeforeValidator(_whole),
]
Seconds = Annotated[float, Field(ge=0, le=1e9)]
UnixTime = Annotated[float, Field(ge=0, le=1e11, description="unix seconds")]


class WrittenFile(BaseModel):
    """One file a rank wrote, as the daemon's manifest lists it."""

    model_config = BODY_CONFIG

    name: str = Field(pattern=FILE_NAME, description="the file's name in the step directory")
    size: Count
    mtime_ns: Count
    hash: Hash
    pieces: list[Annotated[str, Field(pattern=HEX64)]] = Field(
        default_factory=list, max_length=MAX_PIECES, description="piece hashes (2+ pieces)"
    )


class WrittenBody(BaseModel):
    """Body of `POST /v1/checkpoints/written`: rank `rank` of `world_size` in `generation`
    wrote its files of `step` into `directory` of the node's checkpoint directory."""

    model_config = BODY_CONFIG

    step: Count
    generation: Count
    rank: Count
    world_size: WorldSize
    directory: str = Field(
        pattern=STEP_DIRECTORY, max_length=MAX_DIRECTORY_CHARS, description="step-00000040-g2"
    )
    piece_size: PieceSize
    files: list[WrittenFile] = Field(max_length=MAX_FILES)


class Accepted(WireRecord):
    """The answer of a written report: taken; `committed` is the newest committed step known."""

    step: int
    rank: int
    committed: int | None


class ReportedFile(BaseModel):
    """A file of a rank's report as it travels to the coordinator (path in the directory)."""

    model_config = BODY_CONFIG

    path: str = Field(
        max_length=MAX_DIRECTORY_CHARS + 256, description="step-00000040-g2/__3_0.distcp"
    )
    size: Count
    hash: Hash


class ReportedRank(BaseModel):
    """One rank's written report, forwarded by its node."""

    model_config = BODY_CONFIG

    rank: Count
    step: Count
    generation: Count
    world_size: WorldSize
    files: list[ReportedFile] = Field(max_length=MAX_FILES)


class HeldCopy(BaseModel):
    """The sender now holds `owner`'s files of committed `step` (of `generation`)."""

    model_config = BODY_CONFIG

    step: Count
    generation: Count
    owner: NodeId


class RestoreNews(BaseModel):
    """The sender's last restore."""

    model_config = BODY_CONFIG

    step: Count
    source: Literal["local", "peers"]
    size_bytes: Count
    fetched_bytes: Count
    seconds: Seconds
    at: UnixTime


class NewsBody(BaseModel):
    """Body of `POST /v1/checkpoints/news`: what a node tells the coordinator (its ranks'
    reports not yet committed, the copies it now holds, its last restore; each may be empty)."""

    model_config = BODY_CONFIG

    node: NodeId
    written: list[ReportedRank] = Field(default_factory=list, max_length=MAX_REPORTS)
    held: list[HeldCopy] = Field(default_factory=list, max_length=MAX_REPORTS)
    restore: RestoreNews | None = None


class LogAnswer(WireRecord):
    """The coordinator's answer to news: its checkpoint log after taking them."""

    coordinator: str
    log: CheckpointLog


class RestoreStepBody(BaseModel):
    """Body of `POST /v1/checkpoints/prepare`: the committed step a rank is about to load."""

    model_config = BODY_CONFIG

    step: Count
    generation: Count


_ALIASED = ConfigDict(**RECORD_CONFIG, serialize_by_alias=True)


def _named(wire: str, name: str) -> AliasChoices:
    """Read a field as its wire name or its Python name."""
    return AliasChoices(wire, name)


FromField = Annotated[
    Literal["local", "peers"],
    Field(serialization_alias="from", validation_alias=_named("from", "source")),
]
"""Where a restore's files were: all on the node (`local`), or some fetched (`peers`)."""
BytesField = Annotated[
    int, Field(serialization_alias="bytes", validation_alias=_named("bytes", "size_bytes"))
]


class RestoreFigures(WireRecord):
    """A restore of `step`: where its `bytes` were (`from`), what was fetched, how long."""

    model_config = _ALIASED

    step: int
    source: FromField
    size_bytes: BytesField
    fetched_bytes: int
    seconds: float


class RestorePlan(RestoreFigures):
    """The answer of a prepare: every file of the step is in `directory` on this node, found
    there (`from: local`) or fetched from peers (`peers`: `fetched_bytes` of `bytes`)."""

    generation: int
    directory: str


class RestoredBody(BaseModel):
    """Body of `POST /v1/checkpoints/restored`: rank `rank` loaded `step`, `seconds` after it
    asked for it (the fetch and the load)."""

    model_config = BODY_CONFIG

    step: Count
    rank: Count
    seconds: Seconds


class RestoreRecorded(WireRecord):
    """The answer of a restored report: the node's last restore as recorded."""

    step: int
    seconds: float


class CommittedView(WireRecord):
    """A committed step as /v1/training and /v1/checkpoints show it: `holders` maps each node
    to the nodes that hold its files (itself first while it does)."""

    model_config = _ALIASED

    step: int
    generation: int
    world_size: int
    at: float
    size_bytes: BytesField
    holders: dict[str, list[str]]


class LastRestoreView(RestoreFigures):
    """A node's last restore as /v1/training shows it, finished at `at`."""

    at: float


class NodeCheckpoints(WireRecord):
    """What /v1/checkpoints shows of one node."""

    last_restore: LastRestoreView | None


class CheckpointsView(WireRecord):
    """The answer of `GET /v1/checkpoints` (from the coordinator): the newest committed step,
    every kept one (oldest first), each node's last restore and the settings that shape them."""

    coordinator: str
    replicas: int
    keep: int
    committed: CommittedView | None
    steps: list[CommittedView]
    nodes: dict[str, NodeCheckpoints]
