"""The shoal node daemon: HTTP API, peer authentication, discovery, membership, the CLI."""

from __future__ import annotations

from node.addresses import choose_interfaces, find_self_in_inventory, local_addresses
from node.api import build_app, status_document
from node.daemon import NodeDaemon, load_secrets, resolve_node_id
from node.discovery import Discovery
from node.discovery_candidates import Advert, Candidate, CandidateSource
from node.errors import DiscoveryError, MembershipError, NodeError, StartupError
from node.membership import (
    EventKind,
    InMemoryNetwork,
    Listener,
    Member,
    MemberEvent,
    Membership,
    MembershipTransport,
    MemberState,
    MemberView,
    MetaValue,
    SwimTuning,
    TransportStats,
    UdpMembershipTransport,
)
from node.openapi import RouteDoc, openapi_document
from node.runtime import NodeRuntime
from node.security import AuthPolicy, auth_middleware, error_middleware
from node.systemd import SystemdNotifier

__all__ = [
    "Advert",
    "AuthPolicy",
    "Candidate",
    "CandidateSource",
    "Discovery",
    "DiscoveryError",
    "EventKind",
    "InMemoryNetwork",
    "Listener",
    "Member",
    "MemberEvent",
    "MemberState",
    "MemberView",
    "Membership",
    "MembershipError",
    "MembershipTransport",
    "MetaValue",
    "NodeDaemon",
    "NodeError",
    "NodeRuntime",
    "RouteDoc",
    "StartupError",
    "SwimTuning",
    "SystemdNotifier",
    "TransportStats",
    "UdpMembershipTransport",
    "auth_middleware",
    "build_app",
    "choose_interfaces",
    "error_middleware",
    "find_self_in_inventory",
    "load_secrets",
    "local_addresses",
    "openapi_document",
    "resolve_node_id",
    "status_document",
]
