"""The audit trail of a node: who did what, on which node and when, read from its WAL
(`GET /v1/audit`, `shoal audit`); append-only, no route changes or deletes an entry."""

from __future__ import annotations

from typing import TYPE_CHECKING

from config.lazy import lazy_exports

if TYPE_CHECKING:
    from node.audit.entries import (
        DEPLOY_CERTIFICATE,
        DEPLOY_HOST,
        KIND_TYPES,
        LOCK_GRANT,
        LOCK_RELEASE,
        NODE_DRAIN,
        NODE_LEAVE,
        NODE_UNDRAIN,
        RUN_STEP,
        AuditEntry,
        read_audit,
        record_audit,
    )
    from node.audit.routes import AUDIT_PATH, DEPLOYS_PATH, AuditRoutes, DeployRecordBody
else:
    __getattr__, __dir__, __all__ = lazy_exports(__name__, __file__)
