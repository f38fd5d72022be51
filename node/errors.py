"""Exceptions of the node package, and its tables translating the errors underneath.

NodeError -- base of every error the node package raises; exit code 1 from a command
 +-- StartupError -- the daemon cannot start and the operator can fix it (exit code 2): a port
 |                   in use, a data dir that is a file, not writable, read-only or full, a record
 |                   store locked by another process
 +-- DiscoveryError -- mDNS could not start or a discovery source failed
 +-- MembershipError -- the membership protocol could not start (socket bind) or send
 |    +-- WireError -- a body that is not a valid membership message
 |    +-- KeyringError -- a gossip keyring or key file that cannot be used, or a refused change
 +-- BodyError -- a request body its route's model (the OpenAPI document's schema) refuses
 +-- BodyRefused -- a body not read (too slow, too large, encoded, no permit): carries the answer
 +-- TargetError (also config's AuthError) -- a request signed for another node, for none, or
 |                  by the previous release where that is not served (node.signers)
 +-- ElectionError -- a malformed election message, or an elector used outside its lifecycle
 +-- PlanError -- a plan, fence or policy is malformed
 +-- GroupError -- a training process group could not be formed or re-formed
 |    +-- RendezvousError -- the daemon's /v1/rendezvous is unreachable, refused, or malformed
 |    +-- MasterUnreachable -- rank 0's store of a generation did not answer in time
 +-- LauncherError -- the training launcher was misused or given a rendezvous without a rank
 +-- AnsweredError -- an API refusal that carries its HTTP status, code and reason
 |    +-- JobError -- a job request or operation refused
 |    +-- KeyringRefused -- a keyring request refused (bad key, unknown key, key in use)
 |    +-- LockError -- a lock request refused (its HTTP status and code: a stale fence is 409)
 |    |    +-- LockLostError -- a holder lost its lock (lease ran out, or a newer grant)
 |    |    +-- LockUnavailableError -- no node answered a lock request in time
 |    +-- RunError -- a run request refused, or a step of a run that failed
 |    |    +-- ResultsStoreError -- the results store refused or lost an upload
 |    +-- CheckpointsError -- a checkpoint report, restore or fetch refused or failed
 +-- JobClientError -- the job client's errors
 |    +-- JobRequestError -- the node answered a job request with an error (status, reason)
 |    +-- JobUnreachableError -- the node could not be reached or the connection broke
 |    +-- JobEndedError -- the job ended killed, timed_out or lost: no exit code
 |    +-- JobWaitTimeoutError (also TimeoutError) -- still running when the wait ran out
 |    +-- DownloadHashError -- a download did not match its X-Shoal-Content-Hash
 +-- SSHError -- an SSH connection or command to an inventory host failed (node.ssh)
 |    +-- SshHostKeyError -- the host's key is unknown or changed (see `shoal ssh trust`)
 |    +-- SshAuthError -- the host refused our key
 |    +-- SSHConnectError -- the host (or its proxy_jump) is unreachable
 |    +-- SSHTimeoutError (also TimeoutError) -- connecting or the command took too long
 +-- DeployError -- `shoal deploy` could not build, push, install or start shoal on a host
 +-- ProviderError -- a node provider could not acquire, start, stop or release a node
 +-- BackupError -- a backup could not be taken, or a restore could not write (node.backup)
 |    +-- ArchiveError -- an archive refused: damaged, foreign, or not a shoal backup (exit
 |                        code 2); `member` names the archive member at fault
 +-- RLError -- pipeline RL (node.rl)
      +-- WeightsError -- weights not sent, received or stored (collective, model mismatch,
      |                   version not increasing, digest mismatch)
      +-- PublishTimeout (also TimeoutError) -- a publish missed its deadline; names receivers

PeerRequestError, its RetryLater and PeerTimeoutError, and `peer_error` (the table of a request's
failures) are net's (net.errors, under net.NetError); they are importable from here as before.
node.startup.startup_error is the table of what stops a start (OSError, sqlite3, the WAL's and the
record stores' errors): it lives there so that importing node.errors (as training processes do)
stays light.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from config import AuthError
from net.errors import PeerRequestError, PeerTimeoutError, RetryLater, peer_error

if TYPE_CHECKING:
    from aiohttp import web

__all__ = [
    "ActorDiedError",
    "ActorExistsError",
    "AnsweredError",
    "ArchiveError",
    "BackupError",
    "BodyError",
    "CheckpointsError",
    "DeployError",
    "DiscoveryError",
    "DownloadHashError",
    "ElectionError",
    "FrameError",
    "GroupError",
    "JobClientError",
    "JobEndedError",
    "JobError",
    "JobFailedError",
    "JobRequestError",
    "JobUnreachableError",
    "JobWaitTimeoutError",
    "KeyringError",
    "KeyringRefused",
    "LauncherError",
    "LockError",
    "LockLostError",
    "LockUnavailableError",
    "MasterUnreachable",
    "MembershipError",
    "NodeError",
    "PeerRequestError",
    "PeerTimeoutError",
    "PlanError",
    "ProviderError",
    "PublishTimeout",
    "RLError",
    "RegistryError",
    "RemoteTaskError",
    "RemoteTraceback",
    "RendezvousError",
    "ResultsStoreError",
    "RetryLater",
    "RunError",
    "SSHConnectError",
    "SSHError",
    "SSHTimeoutError",
    "SkewError",
    "SshAuthError",
    "SshHostKeyError",
    "StartupError",
    "TaskError",
    "TaskTimeout",
    "WeightsError",
    "WireError",
    "WorkerAuthError",
    "WorkerClosed",
    "WorkerDied",
    "WorkerError",
    "WorkerTimeout",
    "peer_error",
]


class NodeError(Exception):
    """Base of every error the node package raises."""

    command_exit_code = 1
    """What a `shoal` command exits with when this error stops it."""


class StartupError(NodeError):
    """The daemon cannot start; the message names the thing and says what to fix."""

    command_exit_code = 2


class DiscoveryError(NodeError):
    """A discovery source (zeroconf, seeds) failed."""


class MembershipError(NodeError):
    """The membership protocol could not start or send."""


class KeyringError(MembershipError):
    """A keyring or key file that cannot be used, or a change the keyring refuses; `code` is
    the wire error code (`bad_key`, `unknown_key`, `key_in_use`, `keyring_file`)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class WireError(MembershipError):
    """A body that is not a valid membership message."""


class BodyError(NodeError):
    """A request body its route's model refuses: `field` (dotted, "body" for the whole) and
    `reason` ("FIELD: what is wrong (what it is)"); each route answers it as its own 400."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(reason)
        self.field = field
        self.reason = reason


class ElectionError(NodeError):
    """A malformed election message, or an elector used outside its lifecycle."""


class PlanError(NodeError):
    """A plan, fence or policy is malformed (bad JSON from a peer, impossible bounds)."""


class GroupError(NodeError):
    """A process group could not be formed or re-formed; the message says which generation."""


class RendezvousError(GroupError):
    """The daemon's /v1/rendezvous is unreachable, refused, or malformed."""


class MasterUnreachable(GroupError):
    """Rank 0's store (master_addr:master_port) of a generation did not answer in time."""


class LauncherError(NodeError):
    """The launcher was misused (closed, no command) or given a rendezvous without a rank."""


class SSHError(NodeError):
    """An SSH connection or command to a host failed; the message names the host."""


class SshHostKeyError(SSHError):
    """The host's key is not in known_hosts, or differs from it; says how to trust it."""


class SshAuthError(SSHError):
    """The host refused the client key."""


class SSHConnectError(SSHError):
    """The host, or its proxy_jump, did not accept a connection."""


class SSHTimeoutError(SSHError, TimeoutError):
    """Connecting to the host, or its command, took longer than allowed."""


class DeployError(NodeError):
    """`shoal deploy` could not build, push, install or start shoal on a host."""


class ProviderError(NodeError):
    """A node provider could not acquire, start, stop or release a node."""


class AnsweredError(NodeError):
    """An API refusal that knows its answer: HTTP `status`, error `code` and `reason`; the
    node's error middleware answers it in the one error shape, a 503 with `Retry-After:
    retry_after_s` when the kind sets one."""

    retry_after_s: float | None = None

    def __init__(self, status: int, code: str, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.code = code
        self.reason = reason

    def to_dict(self) -> dict[str, str | int]:
        return {"error": self.code, "reason": self.reason, "status": self.status}


class BackupError(NodeError):
    """A backup could not be taken, or a restore could not write; the message says why."""


class ArchiveError(BackupError):
    """An archive refused before anything is written: `member` names the member at fault."""

    command_exit_code = 2

    def __init__(self, member: str, reason: str) -> None:
        super().__init__(f"{member}: {reason}")
        self.member = member
        self.reason = reason


class JobError(AnsweredError):
    """A job request or operation refused; `code` and `status` are what the API answers."""


class JobClientError(NodeError):
    """Base of the job client's errors; the message names the node and what to do."""


class JobRequestError(JobClientError):
    """The node answered with an error: `status` and the server's `reason`."""

    def __init__(self, url: str, status: int, reason: str) -> None:
        super().__init__(f"{url}: {status}: {reason}")
        self.url = url
        self.status = status
        self.reason = reason


class JobUnreachableError(JobClientError):
    """The node could not be reached or the connection broke."""


class JobEndedError(JobClientError):
    """The job ended killed, timed_out or lost: there is no exit code to report."""

    def __init__(self, record: Mapping[str, Any]) -> None:
        reason = record.get("reason") or "no reason given"
        super().__init__(f"job {record.get('job_id')} ended {record.get('state')}: {reason}")
        self.record = dict(record)


class JobWaitTimeoutError(JobClientError, TimeoutError):
    """The job was still running when the caller's wait ran out."""


class DownloadHashError(JobClientError):
    """A downloaded file did not match the X-Shoal-Content-Hash the node announced."""


class KeyringRefused(AnsweredError):
    """A keyring request refused: 400 bad_key, 404 unknown_key, 409 key_in_use, key_missing
    or no_keyring, 503 when there is no coordinator to ask."""

    retry_after_s = 1.0


class LockError(AnsweredError):
    """A lock request or operation refused; `code` and `status` are what the API answers."""

    retry_after_s = 1.0


class LockLostError(LockError):
    """The holder lost its lock while holding it (lease ran out or a newer grant exists)."""


class LockUnavailableError(LockError):
    """No node answered a lock request in time (no coordinator, or every node unreachable)."""


class RunError(AnsweredError):
    """A run request refused, or a step of a run that failed; `code` and `status` are what
    the API answers."""


class ResultsStoreError(RunError):
    """The results store refused an upload, or what it stored does not match its hash."""


class CheckpointsError(AnsweredError):
    """A checkpoint report refused, or a committed step that could not be had on this node
    (node.checkpoints); `code` and `status` are what the API answers."""


# --- pipeline RL ----------------------------------------------------------------------------------


class RLError(NodeError):
    """Base of the pipeline-RL errors (node.rl)."""


class WeightsError(RLError):
    """Weights could not be sent, received or stored: a failed collective, models that differ,
    a version that does not increase, a weights file that does not match its digest."""


class PublishTimeout(RLError, TimeoutError):
    """A publish did not finish within its deadline; `receivers` names the ones that did not
    acknowledge."""

    def __init__(self, message: str, receivers: tuple[str, ...]) -> None:
        self.receivers = receivers
        super().__init__(message)


# --- tasks and workers -------------------------------------------------------------------------


class TargetError(NodeError, AuthError):
    """A request signed for another node than this one, for none, or for no node at all (the
    previous release's signature) where that is not served: 401 naming this node."""


class BodyRefused(NodeError):
    """A body not read: `answer` says why (408, 413, 415, 503); `close`: the connection is
    closed once the answer is sent, the rest of the body unread (node.limits)."""

    def __init__(self, answer: web.Response, *, close: bool) -> None:
        super().__init__(answer.text or "")
        self.answer = answer
        self.close = close


class SkewError(NodeError, AuthError):
    """The timestamp is outside the clock window: the sender's clock is `skew_s` ahead."""

    def __init__(self, skew_s: float, window_s: float) -> None:
        super().__init__(f"timestamp is {-skew_s:+.0f} s off (limit {window_s:.0f} s)")
        self.skew_s = skew_s


class TaskError(NodeError):
    """Base of every error of `node.tasks`."""


class TaskTimeout(TaskError, TimeoutError):
    """`get` or `wait` ran out of time; the task may still finish."""


class ActorDiedError(TaskError):
    """The actor incarnation a handle names has died; a handle never rebinds to a new one."""


class ActorExistsError(TaskError):
    """`create_actor(name=...)` of a taken name without `get_if_exists=True`."""


class RemoteTraceback(TaskError):
    """The traceback of a task that failed elsewhere, set as the re-raised error's cause."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return f"\n\nremote traceback:\n{self.text}"


class RemoteTaskError(TaskError):
    """A remote failure whose exception could not be carried back as itself."""


class JobFailedError(TaskError):
    """The job ended in another state than succeeded (`wait(raise_on_failure=True)`)."""


class RegistryError(AnsweredError, TaskError):
    """A refused registry request, answered as {"error": code, "reason": text, "status": N}."""


class WorkerError(NodeError):
    """Base of every error of `node.workers`."""


class FrameError(WorkerError):
    """A frame that cannot be decoded (a peer that speaks another protocol)."""


class WorkerTimeout(WorkerError, TimeoutError):
    """No message arrived within the timeout; the worker is still alive."""


class WorkerClosed(WorkerError):
    """The channel was closed by this side."""


class WorkerAuthError(WorkerError):
    """The worker server refused this connection (wrong or missing secret, not loopback)."""


class WorkerDied(WorkerError):
    """The worker process ended: its exit code (negative: killed by that signal; None: unknown,
    the connection was lost) and the last lines of its stderr."""

    def __init__(self, what: str, exit_code: int | None, stderr_tail: str = "") -> None:
        self.exit_code = exit_code
        self.stderr_tail = stderr_tail
        how = "lost" if exit_code is None else f"ended with exit code {exit_code}"
        tail = f"; last stderr lines:\n{stderr_tail}" if stderr_tail else ""
        super().__init__(f"worker {what} {how}{tail}")
