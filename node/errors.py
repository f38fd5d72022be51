"""Exceptions of the node package, and its tables translating the errors underneath.

NodeError -- base of every error the node package raises; exit code 1 from a command
 +-- StartupError -- the daemon cannot start and the operator can fix it (exit code 2): a port
 |                   in use, a data dir that is a file, not writable, read-only or full, a record
 |                   store locked by another process
 +-- DiscoveryError -- mDNS could not start or a discovery source failed
 +-- MembershipError -- the membership protocol could not start (socket bind) or send
 |    +-- WireError -- a body that is not a valid membership message
 +-- ElectionError -- a malformed election message, or an elector used outside its lifecycle
 +-- PlanError -- a plan, fence or policy is malformed
 +-- GroupError -- a training process group could not be formed or re-formed
 |    +-- RendezvousError -- the daemon's /v1/rendezvous is unreachable, refused, or malformed
 |    +-- MasterUnreachable -- rank 0's store of a generation did not answer in time
 +-- LauncherError -- the training launcher was misused or given a rendezvous without a rank
 +-- PeerRequestError -- an HTTP request to a node failed; carries status (None: no answer)
 |    +-- PeerTimeoutError (also TimeoutError) -- no answer in time
 +-- RLError -- pipeline RL (node.rl)
      +-- WeightsError -- weights not sent, received or stored (collective, model mismatch,
      |                   version not increasing, digest mismatch)
      +-- PublishTimeout (also TimeoutError) -- a publish missed its deadline; names receivers

`peer_error` translates aiohttp and OS errors of a request. node.startup.startup_error is the
table of what stops a start (OSError, sqlite3, the WAL's and the record stores' errors): it lives
there so that importing node.errors (as training processes do) stays light.
"""

from __future__ import annotations

import aiohttp

from config import ErrorAnswer

__all__ = [
    "DiscoveryError",
    "ElectionError",
    "GroupError",
    "LauncherError",
    "MasterUnreachable",
    "MembershipError",
    "NodeError",
    "PeerRequestError",
    "PeerTimeoutError",
    "PlanError",
    "PublishTimeout",
    "RLError",
    "RendezvousError",
    "StartupError",
    "WeightsError",
    "WireError",
    "peer_error",
]


class NodeError(Exception):
    """Base of every error the node package raises."""

    exit_code = 1


class StartupError(NodeError):
    """The daemon cannot start; the message names the thing and says what to fix."""

    exit_code = 2


class DiscoveryError(NodeError):
    """A discovery source (zeroconf, seeds) failed."""


class MembershipError(NodeError):
    """The membership protocol could not start or send."""


class WireError(MembershipError):
    """A body that is not a valid membership message."""


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


class PeerRequestError(NodeError):
    """A request to `url` failed: no answer (`status` None) or an error answer, whose `reason`
    is the node's own words."""

    def __init__(self, url: str, reason: str, status: int | None = None) -> None:
        self.url = url
        self.reason = reason
        self.status = status
        where = url if status is None else f"{url}: HTTP {status}"
        super().__init__(f"{where}: {reason}")

    @classmethod
    def from_answer(cls, url: str, answer: ErrorAnswer) -> PeerRequestError:
        """The error of a node's error answer (config.read_error)."""
        return cls(url, f"{answer.reason} ({answer.code})", answer.status)


class PeerTimeoutError(PeerRequestError, TimeoutError):
    """A request to `url` got no answer in time."""


# --- the table of requests ------------------------------------------------------------------------


def peer_error(exc: BaseException, url: str) -> NodeError:
    """The NodeError for an error of aiohttp or the OS while requesting `url` (chain it)."""
    if isinstance(exc, NodeError):
        return exc
    if isinstance(exc, TimeoutError):
        return PeerTimeoutError(url, "no answer in time (timed out)")
    if isinstance(exc, aiohttp.ClientResponseError):
        return PeerRequestError(url, exc.message, exc.status)
    if isinstance(exc, aiohttp.ClientConnectorError) and exc.os_error.strerror:
        return PeerRequestError(url, f"unreachable: {exc.os_error.strerror}")
    if isinstance(exc, aiohttp.ClientError | OSError):
        return PeerRequestError(url, f"unreachable: {exc or type(exc).__name__}")
    if isinstance(exc, ValueError):
        return PeerRequestError(url, f"not a JSON answer: {exc}")
    return PeerRequestError(url, f"{type(exc).__name__}: {exc}")


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
