"""What a job is on the wire: the start request (validated), its states, and its record
(JobRecord, with a gang job's GangRecord and GangMember rows).

Pure functions and frozen data only; the job service owns processes and files.
"""

from __future__ import annotations

import enum
import re
import secrets
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Annotated, Any, Literal, cast, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    Field,
    SerializerFunctionWrapHandler,
    WithJsonSchema,
    model_serializer,
)
from pydantic.json_schema import SkipJsonSchema

from config.declare import unset
from node.errors import BodyError, JobError
from node.jobs.documents import JobRequestJson, JobSpecJson, Role
from node.openapi import BODY_CONFIG, Number, WireRecord, check_body

if TYPE_CHECKING:
    from node.jobs.filetypes import JobResultJson, StartedJson

MAX_JOB_ID_CHARS = 128
JOB_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
ROLES: tuple[str, ...] = get_args(Role)
MAX_TIMEOUT_S = 365 * 86400.0
SIGNALS = frozenset(s.name for s in signal.Signals if not s.name.startswith("SIGRT"))


class JobState(enum.StrEnum):
    """A job's state; the wire carries the value ("timed_out")."""

    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    KILLED = "killed"
    TIMED_OUT = "timed_out"
    LOST = "lost"

    @property
    def ended(self) -> bool:
        return self not in (JobState.PENDING, JobState.RUNNING)


def invalid(reason: str) -> JobError:
    return JobError(400, "invalid_job", reason)


class GangSpec(WireRecord):
    """The `gang` field of a gang member's start (only nodes send it): the gang's job id, this
    member's rank of `nodes`, member 0's address and MASTER_PORT, and the node that owns the
    gang."""

    job_id: str
    rank: int
    nodes: int
    master_addr: str
    master_port: int
    owner: str | None


@dataclass(frozen=True)
class JobRequest:
    """A validated `POST /v1/jobs` body."""

    job_id: str | None
    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    timeout_s: float | None = None
    nodes: int = 1
    role: Role = "any"
    env_from: str | None = None
    gang: GangSpec | None = None
    """Set on a member of a gang job (by the node that started the gang)."""

    def spec(self) -> JobSpecJson:
        """Everything but the id: two requests with one id must have equal specs."""
        return {
            "name": self.name,
            "argv": list(self.argv),
            "env": dict(sorted(self.env.items())),
            "cwd": self.cwd,
            "timeout_s": self.timeout_s,
            "nodes": self.nodes,
            "role": self.role,
            "env_from": self.env_from,
            "gang": None if self.gang is None else self.gang.to_json(),
        }

    def to_dict(self) -> JobRequestJson:
        return {"job_id": self.job_id, **self.spec()}

    def with_id(self, job_id: str) -> JobRequest:
        """The same request under `job_id` (its env sorted by name, as its spec)."""
        return replace(self, job_id=job_id, env=dict(sorted(self.env.items())))


def new_job_id(now: float | None = None) -> str:
    """A fresh id that sorts by creation time: `j-<ms since epoch, base 36>-<random>`."""
    millis = int((time.time() if now is None else now) * 1000)
    digits = ""
    while True:
        millis, rest = divmod(millis, 36)
        digits = "0123456789abcdefghijklmnopqrstuvwxyz"[rest] + digits
        if not millis:
            break
    return f"j-{digits}-{secrets.token_hex(4)}"


_NO_NUL = "^[^\\u0000]*$"
_SEGMENT = "(?:[^./\\u0000][^/\\u0000]*|\\.(?:[^./\\u0000][^/\\u0000]*)?|\\.\\.[^/\\u0000]+)?"
CWD_PATTERN = f"^(?:{_SEGMENT}/)*{_SEGMENT}$"
"""A cwd: no NUL, and no `..` segment (a relative cwd stays inside the job's work directory)."""
_ARGV = {
    "type": "array",
    "minItems": 1,
    "prefixItems": [{"type": "string", "minLength": 1, "pattern": _NO_NUL}],
    "items": {"type": "string", "pattern": _NO_NUL},
}
EnvName = Annotated[str, Field(min_length=1, pattern="^[^=\\u0000]*$")]


class JobStartBody(BaseModel):
    """A job start; parse_job_request applies the same rules (and the gang field of a member
    start, which only nodes send)."""

    model_config = BODY_CONFIG

    job_id: Annotated[str, Field(pattern=JOB_ID_PATTERN.pattern)] | SkipJsonSchema[None] = unset()
    name: Annotated[str, Field(min_length=1, max_length=256)] | SkipJsonSchema[None] = unset()
    argv: Annotated[list[str], WithJsonSchema(_ARGV)]
    env: dict[EnvName, Annotated[str, Field(pattern=_NO_NUL)]] = Field(default_factory=dict)
    cwd: Annotated[str, Field(min_length=1, pattern=CWD_PATTERN)] | SkipJsonSchema[None] = unset()
    timeout_s: Annotated[float, Field(gt=0, le=MAX_TIMEOUT_S)] | SkipJsonSchema[None] = unset()
    nodes: Annotated[int, Field(ge=1, le=1024)] | SkipJsonSchema[None] = unset()
    role: Role | SkipJsonSchema[None] = unset()
    env_from: Literal["rendezvous"] | SkipJsonSchema[None] = unset()


def _parse_argv(argv: object) -> list[str]:
    """A start request's argv: a non-empty list of strings, the program not empty, no NUL."""
    if isinstance(argv, str):
        raise invalid('argv must be a list of strings, not a shell string; e.g. ["sh", "-c", ...]')
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise invalid("argv must be a non-empty list of strings")
    if not argv[0] or any("\x00" in a for a in argv):
        raise invalid("argv: the program is empty or an argument contains NUL")
    return argv


def _parse_timeout(timeout_s: object) -> float | None:
    """A start request's timeout_s: absent, or seconds above 0 and at most MAX_TIMEOUT_S."""
    if timeout_s is None:
        return None
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float):
        raise invalid("timeout_s must be a number of seconds")
    if not 0 < timeout_s <= MAX_TIMEOUT_S:
        raise invalid(f"timeout_s must be > 0 and at most {MAX_TIMEOUT_S:g}")
    return float(timeout_s)


def _parse_cwd(cwd: object) -> str | None:
    """A start request's cwd: absent, or a path without NUL and without a `..` segment (a
    relative cwd is made inside the job's work directory and given to its user: `..` would
    reach any directory of the host)."""
    if cwd is None:
        return None
    if not isinstance(cwd, str) or not cwd or "\x00" in cwd:
        raise invalid("cwd must be a path string")
    if ".." in cwd.split("/"):
        raise invalid(
            f"cwd {cwd[:200]!r} has a '..' segment: a relative cwd stays inside the job's work "
            "directory; name another directory by its absolute path (it is neither made nor "
            "given to the job's user)"
        )
    return cwd


def parse_job_request(body: object) -> JobRequest:
    """Validate a start request; JobError(400) names the field and what is expected."""
    if not isinstance(body, Mapping):
        raise invalid("expected a JSON object with argv (a list of strings)")
    known = {"job_id", "name", "argv", "env", "cwd", "timeout_s", "nodes", "role", "env_from"}
    known.add("gang")
    unknown = sorted(set(body) - known)
    if unknown:
        raise invalid(f"unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    argv = _parse_argv(body.get("argv"))
    job_id = body.get("job_id")
    if job_id is not None and (not isinstance(job_id, str) or not JOB_ID_PATTERN.match(job_id)):
        raise invalid("job_id must be 1-128 characters of letters, digits, '.', '_', '-'")
    name = body.get("name", argv[0].rsplit("/", 1)[-1])
    if not isinstance(name, str) or not name or len(name) > 256:
        raise invalid("name must be a non-empty string of at most 256 characters")
    env = body.get("env") or {}
    if not isinstance(env, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) and k and "=" not in k and "\x00" not in k + v
        for k, v in env.items()
    ):
        raise invalid("env must be an object of string names (no '=') to string values")
    cwd = _parse_cwd(body.get("cwd"))
    timeout_s = _parse_timeout(body.get("timeout_s"))
    nodes = body.get("nodes", 1)
    if isinstance(nodes, bool) or not isinstance(nodes, int) or not 1 <= nodes <= 1024:
        raise invalid("nodes must be an integer from 1 to 1024")
    role = body.get("role", "any")
    if role not in ROLES:
        raise invalid(f"role must be one of {', '.join(ROLES)}")
    env_from = body.get("env_from")
    if env_from not in (None, "rendezvous"):
        raise invalid('env_from must be "rendezvous" or absent')
    gang = body.get("gang")
    if gang is not None:
        gang = parse_gang_member(gang)
    return JobRequest(
        job_id=job_id,
        name=name,
        argv=tuple(argv),
        env=dict(env),
        cwd=cwd,
        timeout_s=timeout_s,
        nodes=nodes,
        role=cast(Role, role),
        env_from=env_from,
        gang=gang,
    )


GANG_FIELDS = {"job_id": str, "rank": int, "nodes": int, "master_addr": str, "master_port": int}


def parse_gang_member(gang: object) -> GangSpec:
    """The `gang` part of a member start (sent by the node that runs the gang)."""
    if not isinstance(gang, Mapping):
        raise invalid("gang must be an object")
    for name, kind in GANG_FIELDS.items():
        value = gang.get(name)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise invalid(f"gang.{name} must be a {kind.__name__}")
    if not 0 <= gang["rank"] < gang["nodes"]:
        raise invalid("gang.rank must be from 0 to nodes - 1")
    owner = gang.get("owner")
    if owner is not None and not isinstance(owner, str):
        raise invalid("gang.owner must be a node id")
    return GangSpec(**{name: gang[name] for name in GANG_FIELDS}, owner=owner)


def gang_env(gang: GangSpec | None) -> dict[str, str]:
    """The variables a gang member's job gets (empty for a single-node job): what
    `torchrun --nnodes $NNODES --node-rank $NODE_RANK --master-addr $MASTER_ADDR
    --master-port $MASTER_PORT` needs to form one group across the members (member 0's
    address as its peers reach it, the gang's port), and shoal's own names for them."""
    if gang is None:
        return {}
    return {
        "SHOAL_JOB_ID": gang.job_id,
        "SHOAL_NODE_RANK": str(gang.rank),
        "SHOAL_NODES_NUM": str(gang.nodes),
        "NODE_RANK": str(gang.rank),
        "NNODES": str(gang.nodes),
        "MASTER_ADDR": gang.master_addr,
        "MASTER_PORT": str(gang.master_port),
    }


def request_from_dict(data: Mapping[str, object]) -> JobRequest:
    """A request stored by `JobRequest.to_dict` (trusted: it was validated before storing)."""
    return parse_job_request(dict(data))


def _signal_pattern() -> re.Pattern[str]:
    """Any signal name of SIGNALS in any letter case, with or without SIG (ASCII letters only:
    JSON Schema's pattern and the check below must agree)."""

    def any_case(text: str) -> str:
        return "".join(f"[{c.upper()}{c.lower()}]" if c.isalpha() else re.escape(c) for c in text)

    names = "|".join(any_case(name.removeprefix("SIG")) for name in sorted(SIGNALS))
    return re.compile(f"^(?:{any_case('SIG')})?(?:{names})$")


SIGNAL_PATTERN = _signal_pattern()


def _signal_name(value: str) -> str:
    if not SIGNAL_PATTERN.fullmatch(value):
        raise ValueError(f"signal {value!r} is not a signal name (TERM, INT, KILL, ...)")
    name = value.upper()
    return name if name.startswith("SIG") else f"SIG{name}"


class KillBody(BaseModel):
    """Body of `POST /v1/jobs/{job_id}/kill` (optional): which signal, how long until SIGKILL."""

    model_config = BODY_CONFIG

    signal: Annotated[
        str,
        AfterValidator(_signal_name),
        Field(description="TERM, INT, KILL, ... (any case, SIG optional)"),
        WithJsonSchema({"type": "string", "pattern": SIGNAL_PATTERN.pattern}),
    ] = "SIGTERM"
    grace_s: float | None = Field(
        default=None, ge=0, le=3600, description="seconds from 0 to 3600 before SIGKILL"
    )


def parse_kill(body: object, default_grace_s: float) -> tuple[str, float]:
    """(signal name, grace seconds) of a kill request body (None: the defaults), checked by
    KillBody; JobError 400 names the field otherwise."""
    try:
        kill = check_body(KillBody, {} if body is None else body)
    except BodyError as exc:
        raise invalid(exc.reason) from None
    return kill.signal, default_grace_s if kill.grace_s is None else kill.grace_s


def state_of(result: JobResultJson | None, started: StartedJson | None) -> JobState:
    """The state a job's files say: result.json decides; else running once it has a pid."""
    if result is not None:
        try:
            return JobState(result["state"])
        except ValueError:
            return JobState.LOST
    return JobState.RUNNING if started is not None else JobState.PENDING


class StreamBytes(WireRecord):
    """Bytes of each log stream of a job."""

    stdout: int
    stderr: int


class StreamFlags(WireRecord):
    """Per log stream of a job: True once it reached max_log_bytes (later output dropped)."""

    stdout: bool
    stderr: bool


class GangMember(WireRecord):
    """One member of a gang job: where it runs, its job there, and how it ended."""

    rank: int
    node: str
    url: str
    job_id: str
    state: JobState
    exit_code: int | None
    signal: str | None
    reason: str | None
    ended_at: Number | None


class GangRecord(WireRecord):
    """A gang job's own record on the node that received it (`gang.json`, and the job
    record's `gang`): its members in rank order, the plan fence they were started under, when
    every member ran, member 0's MASTER_PORT, and the start attempt the members belong to (0, or
    later ones after a member refused a stale fence). A field not yet given is left out of the
    JSON (a gang reserved but not yet picked has only `members` and `started_at`)."""

    members: tuple[GangMember, ...] = ()
    fence: str | None = None
    started_at: Number | None = None
    master_port: int | None = None
    attempt: int | None = None

    @model_serializer(mode="wrap")
    def _given_only(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        dumped: dict[str, Any] = handler(self)
        return {key: value for key, value in dumped.items() if key in self.model_fields_set}


class JobRecord(WireRecord):
    """A job's record: what every job route answers (`JobEntry.record`), what the client and
    a gang's owner read, and what a run stores as its job."""

    job_id: str
    name: str
    node: str
    argv: tuple[str, ...]
    state: JobState
    exit_code: int | None
    signal: str | None = Field(description="the signal that ended the job (SIGTERM), if any")
    reason: str | None
    created_at: Number
    started_at: Number | None
    ended_at: Number | None
    pid: int | None
    log_bytes: StreamBytes
    log_capped: StreamFlags
    max_log_bytes: int
    cwd: str | None
    timeout_s: Number | None
    nodes: int
    role: Role
    gang: GangRecord | None = Field(
        default=None, exclude_if=lambda gang: gang is None, description="gang jobs only"
    )


class PickedNode(WireRecord):
    """A node the coordinator picked for a gang, with the address its peers reach it at."""

    node_id: str
    address: str
    port: int


class PickAnswer(WireRecord):
    """The coordinator's answer to a gang pick: the plan fence it picked under
    (X-Shoal-Fence) and the members in rank order."""

    fence: str = Field(description="the plan fence (X-Shoal-Fence) picked under")
    members: tuple[PickedNode, ...]
