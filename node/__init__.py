"""The shoal node daemon: HTTP API, peer authentication, discovery, membership, the CLI."""

from __future__ import annotations

from node.addresses import choose_interfaces, find_self_in_inventory, local_addresses
from node.api import build_app, status_document
from node.daemon import NodeDaemon, load_secrets, resolve_node_id
from node.discovery.candidates import Advert, Candidate, CandidateSource
from node.discovery.feed import Discovery
from node.election.adoption import AdoptionLog, check_adoption_logs, read_adoption_log
from node.election.elector import Elector
from node.election.http import ELECTION_DOCS, HttpElectionTransport, election_routes
from node.election.plan import FENCE_HEADER, PlanFence, RolePlan, check_fence, should_apply
from node.election.roles import NodeCapabilities, RolePolicy, compute_plan
from node.election.seams import WalDurableState
from node.election.service import ElectionService, VoterSet, resolve_voters
from node.election.state import ElectionConfig, ElectionEvent, ElectionEventKind, ElectionStatus
from node.errors import (
    DiscoveryError,
    ElectionError,
    LauncherError,
    MasterUnreachable,
    MembershipError,
    NodeError,
    PeerRequestError,
    PeerTimeoutError,
    PlanError,
    PublishTimeout,
    RendezvousError,
    RLError,
    StartupError,
    WeightsError,
    WireError,
)
from node.membership.service import (
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
from node.rl import (
    RolloutStream,
    WeightPublisher,
    WeightReceiver,
    broadcast_weights,
    check_staleness,
    make_version_state,
    receive_weights,
    stamp_sample,
)
from node.runtime import NodeRuntime
from node.security import AuthPolicy, auth_middleware, error_middleware
from node.sync_service import SyncService
from node.systemd import SystemdNotifier
from node.training.groups import ElasticGroup, join_group
from node.training.launcher import TrainingLauncher, training_env
from node.training.rendezvous import GroupError, Rendezvous, rendezvous_for

__all__ = [
    "ELECTION_DOCS",
    "FENCE_HEADER",
    "AdoptionLog",
    "Advert",
    "AuthPolicy",
    "Candidate",
    "CandidateSource",
    "Discovery",
    "DiscoveryError",
    "ElasticGroup",
    "ElectionConfig",
    "ElectionError",
    "ElectionEvent",
    "ElectionEventKind",
    "ElectionService",
    "ElectionStatus",
    "Elector",
    "EventKind",
    "GroupError",
    "HttpElectionTransport",
    "InMemoryNetwork",
    "LauncherError",
    "Listener",
    "MasterUnreachable",
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
    "PeerRequestError",
    "PeerTimeoutError",
    "PlanError",
    "PlanFence",
    "PublishTimeout",
    "RLError",
    "Rendezvous",
    "RendezvousError",
    "RolePlan",
    "RolePolicy",
    "RolloutStream",
    "RouteDoc",
    "StartupError",
    "SwimTuning",
    "SyncService",
    "SystemdNotifier",
    "TrainingLauncher",
    "TransportStats",
    "UdpMembershipTransport",
    "VoterSet",
    "WalDurableState",
    "WeightPublisher",
    "WeightReceiver",
    "WeightsError",
    "WireError",
    "auth_middleware",
    "broadcast_weights",
    "build_app",
    "check_adoption_logs",
    "check_fence",
    "check_staleness",
    "choose_interfaces",
    "compute_plan",
    "election_routes",
    "error_middleware",
    "find_self_in_inventory",
    "join_group",
    "load_secrets",
    "local_addresses",
    "make_version_state",
    "openapi_document",
    "read_adoption_log",
    "receive_weights",
    "rendezvous_for",
    "resolve_node_id",
    "resolve_voters",
    "should_apply",
    "stamp_sample",
    "status_document",
    "training_env",
]
