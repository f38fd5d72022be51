"""The audit trail read from a node's WAL: which entry types make up each kind, and one readable
entry (who, what, on which node, when) per WAL entry. Recording an audit-only entry is here too.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

from pydantic import JsonValue

from node.forwarding import REQUEST_FORWARDER
from node.security import request_sender
from wal import WalEntry, WalError, WriteAheadLog

log = logging.getLogger(__name__)

LOCK_GRANT = "lock.grant"
LOCK_RELEASE = "lock.release"
RUN_STEP = "run.step"
DEPLOY_HOST = "deploy.host"
DEPLOY_CERTIFICATE = "deploy.certificate"
KEYRING_INSTALL = "keyring.install"
KEYRING_USE = "keyring.use"
KEYRING_REMOVE = "keyring.remove"
NODE_DRAIN = "node.drain"
NODE_UNDRAIN = "node.undrain"
NODE_LEAVE = "node.leave"
GPU_QUARANTINE = "gpu.quarantine"
GPU_READMIT = "gpu.readmit"
TRAINING_RESTART = "training.restart"

KIND_TYPES: Mapping[str, tuple[str, ...]] = {
    "job": ("job.start", "job.kill", "job.gang"),
    "lock": (LOCK_GRANT, LOCK_RELEASE),
    "run": (RUN_STEP,),
    "deploy": (DEPLOY_HOST, DEPLOY_CERTIFICATE),
    "drain": (NODE_DRAIN, NODE_UNDRAIN, NODE_LEAVE),
    "keyring": (KEYRING_INSTALL, KEYRING_USE, KEYRING_REMOVE),
    "gpu": (GPU_QUARANTINE, GPU_READMIT),
    "training": (TRAINING_RESTART,),
    "certificate": (),
}
"""Audit kind -> the WAL entry types it lists. A deploy runs from the operator's machine over SSH;
once a host answers, `shoal deploy` records it (and the node certificate it issued) in that
host's WAL through POST /v1/audit/deploys. A keyring entry is one change of one node's gossip
keyring. Drains, undrains and leaves are recorded by the node the operator asked and by the node
that acts on a forwarded call (the coordinator, the node leaving), as the operator the call's
proof names, with `forwarded_by` (node.forwarding); the subject is the node drained or
leaving. A GPU quarantine and re-admission are recorded by the node whose GPU it is, once the
coordinator made the change. A training restart is recorded by the coordinator that adopted the
plan of the new generation (the subject names the generation). Certificates do not exist yet:
that kind is accepted and lists nothing."""

ACTIONS: Mapping[str, str] = {
    "job.start": "start",
    "job.kill": "kill",
    "job.gang": "gang start",
    LOCK_GRANT: "grant",
    LOCK_RELEASE: "release",
    RUN_STEP: "step",
    DEPLOY_HOST: "deploy",
    DEPLOY_CERTIFICATE: "certificate issue",
    KEYRING_INSTALL: "install",
    KEYRING_USE: "use",
    KEYRING_REMOVE: "remove",
    NODE_DRAIN: "drain",
    NODE_UNDRAIN: "undrain",
    NODE_LEAVE: "leave",
    GPU_QUARANTINE: "quarantine",
    GPU_READMIT: "readmit",
    TRAINING_RESTART: "restart",
}
KIND_OF = {entry_type: kind for kind, types in KIND_TYPES.items() for entry_type in types}


class AuditEntryJson(TypedDict):
    """One audit entry as GET /v1/audit lists it (AuditEntry.to_json)."""

    id: int
    at: float
    node: str
    kind: str
    action: str
    subject: str
    sender: str | None
    outcome: str
    detail: dict[str, object]


@dataclass(frozen=True)
class AuditEntry:
    """One thing done: `sender` (the signed identity that asked; the node itself when it acted
    on its own), `kind` and `action`, `subject` (a job, lock or run), on `node`, `at` (unix s)."""

    id: int
    at: float
    node: str
    kind: str
    action: str
    subject: str
    sender: str | None
    outcome: str
    detail: Mapping[str, object]

    def to_json(self) -> AuditEntryJson:
        return {
            "id": self.id,
            "at": self.at,
            "node": self.node,
            "kind": self.kind,
            "action": self.action,
            "subject": self.subject,
            "sender": self.sender,
            "outcome": self.outcome,
            "detail": dict(self.detail),
        }


def _detail(entry: WalEntry) -> dict[str, object]:
    """What the entry says beyond its subject, without a job's environment (it may hold
    secrets): the argv and node count of a start, the signal of a kill, a lock's holder."""
    payload = entry.payload if isinstance(entry.payload, dict) else {}
    request = payload.get("request")
    if isinstance(request, dict):
        return {"argv": request.get("argv"), "nodes": request.get("nodes", 1)}
    return {
        key: value
        for key, value in payload.items()
        if key not in ("job_id", "name", "run_id", "sender", "node", "request")
    }


def audit_entry(entry: WalEntry, node_id: str) -> AuditEntry:
    """The readable form of one WAL entry of an audited type."""
    payload = entry.payload if isinstance(entry.payload, dict) else {}
    subject = payload.get("job_id") or payload.get("name") or payload.get("run_id") or ""
    outcome = {"committed": "done", "pending": "in progress"}.get(
        entry.state.value, entry.state.value
    )
    return AuditEntry(
        id=entry.id,
        at=entry.created_at,
        node=str(payload.get("node") or node_id),
        kind=KIND_OF.get(entry.entry_type, "other"),
        action=ACTIONS.get(entry.entry_type, entry.entry_type),
        subject=str(subject),
        sender=payload.get("sender"),
        outcome=outcome if entry.error is None else f"{outcome}: {entry.error}",
        detail=_detail(entry),
    )


async def read_audit(
    wal: WriteAheadLog,
    node_id: str,
    *,
    kind: str | None,
    since: float,
    after_id: int,
    limit: int,
) -> list[AuditEntry]:
    """The audit entries of this node's WAL, oldest first; `kind` None lists every kind."""
    types = KIND_TYPES[kind] if kind is not None else tuple(KIND_OF)
    entries = await wal.entries_of(types, since=since, after_id=after_id, limit=limit)
    return [audit_entry(entry, node_id) for entry in entries]


async def record_audit(
    wal: WriteAheadLog | None, entry_type: str, payload: Mapping[str, Any], node_id: str
) -> None:
    """Append a finished audit-only entry: `payload` plus the sender of the request being
    handled (this node's id when it acts on its own). A WAL failure is logged, never raised:
    what it records has already happened."""
    if wal is None:
        return
    body = {**payload, "sender": request_sender() or node_id, "node": node_id}
    forwarder = REQUEST_FORWARDER.get()
    if forwarder is not None:  # acting for an operator whose proof a node forwarded
        body["forwarded_by"] = forwarder
    try:
        await wal.commit(await wal.append(entry_type, body))
    except WalError as exc:
        log.error("audit: %s of %s not recorded: %s", entry_type, payload, exc)


def run_steps(
    before: Mapping[str, Mapping[str, JsonValue]], after: Mapping[str, Mapping[str, JsonValue]]
) -> list[dict[str, JsonValue]]:
    """The RUN_STEP payloads of every run whose step or state differs from `before` to
    `after` (a new run included), by run id."""
    steps = []
    for run_id, record in sorted(after.items()):
        old = before.get(run_id)
        if old is not None and (old.get("step"), old.get("state")) == (
            record.get("step"),
            record.get("state"),
        ):
            continue
        steps.append(
            {
                "run_id": run_id,
                "step": record.get("step"),
                "state": record.get("state"),
                "note": record.get("note"),
            }
        )
    return steps
