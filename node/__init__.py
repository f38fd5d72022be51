"""The shoal node daemon: HTTP API, peer authentication, discovery, membership, the CLI."""

from __future__ import annotations

from node.addresses import choose_interfaces, find_self_in_inventory, local_addresses
from node.api import build_app, status_document
from node.coordination import Coordination, VoterSet, rendezvous_document, resolve_voters
from node.daemon import NodeDaemon, load_secrets, resolve_node_id
from node.discovery import Discovery
from node.discovery_candidates import Advert, Candidate, CandidateSource
from node.election import Elector
from node.election_http import ELECTION_DOCS, HttpElectionTransport, election_routes
from node.election_io import WalDurableState
from node.election_state import ElectionConfig, ElectionEvent, ElectionEventKind, ElectionStatus
from node.errors import DiscoveryError, MembershipError, NodeError, StartupError
from node.groups import ElasticGroup, GroupError, join_group
from node.groups import Rendezvous as TrainingRendezvous
from node.launcher import TrainingLauncher, training_env
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
from node.plan import FENCE_HEADER, PlanFence, RolePlan, check_fence, should_apply
from node.plan_log import AdoptionLog, check_adoption_logs, read_adoption_log
from node.roles import NodeCapabilities, RolePolicy, compute_plan
from node.runtime import NodeRuntime
from node.security import AuthPolicy, auth_middleware, error_middleware
from node.sync_service import SyncService
from node.systemd import SystemdNotifier

__all__ = [
    "ELECTION_DOCS",
    "FENCE_HEADER",
    "AdoptionLog",
    "Advert",
    "AuthPolicy",
    "Candidate",
    "CandidateSource",
    "Coordination",
    "Discovery",
    "DiscoveryError",
    "ElasticGroup",
    "ElectionConfig",
    "ElectionEvent",
    "ElectionEventKind",
    "ElectionStatus",
    "Elector",
    "EventKind",
    "GroupError",
    "HttpElectionTransport",
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
    "NodeCapabilities",
    "NodeDaemon",
    "NodeError",
    "NodeRuntime",
    "PlanFence",
    "RolePlan",
    "RolePolicy",
    "RouteDoc",
    "StartupError",
    "SwimTuning",
    "SyncService",
    "SystemdNotifier",
    "TrainingLauncher",
    "TrainingRendezvous",
    "TransportStats",
    "UdpMembershipTransport",
    "VoterSet",
    "WalDurableState",
    "auth_middleware",
    "build_app",
    "check_adoption_logs",
    "check_fence",
    "choose_interfaces",
    "compute_plan",
    "election_routes",
    "error_middleware",
    "find_self_in_inventory",
    "join_group",
    "load_secrets",
    "local_addresses",
    "openapi_document",
    "read_adoption_log",
    "rendezvous_document",
    "resolve_node_id",
    "resolve_voters",
    "should_apply",
    "status_document",
    "training_env",
]
