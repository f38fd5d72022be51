"""The shoal node daemon: HTTP API, peer authentication, discovery, membership, the CLI."""

from __future__ import annotations

from typing import TYPE_CHECKING

from config.lazy import lazy_exports

if TYPE_CHECKING:
    from node.addresses import choose_interfaces, find_self_in_inventory, local_addresses
    from node.boot import load_secrets, resolve_node_id
    from node.daemon import NodeDaemon
    from node.discovery.candidates import Advert, Candidate, CandidateSource
    from node.discovery.feed import Discovery
    from node.election.adoption import AdoptionLog, check_adoption_logs, read_adoption_log
    from node.election.elector import Elector
    from node.election.roles import NodeCapabilities, RolePolicy, compute_plan
    from node.election.routes import ElectionRoutes, HttpElectionTransport
    from node.election.seams import WalDurableState
    from node.election.service import ElectionService, VoterSet, resolve_voters
    from node.election.state import ElectionConfig, ElectionEvent, ElectionEventKind, ElectionStatus
    from node.errors import (
        ActorDiedError,
        ActorExistsError,
        AnsweredError,
        ArchiveError,
        BackupError,
        BodyError,
        BodyRefused,
        CheckpointsError,
        DeployError,
        DiscoveryError,
        DownloadHashError,
        ElectionError,
        FrameError,
        JobClientError,
        JobEndedError,
        JobError,
        JobFailedError,
        JobRequestError,
        JobUnreachableError,
        JobWaitTimeoutError,
        KeyringError,
        KeyringRefused,
        LauncherError,
        LockError,
        LockLostError,
        LockUnavailableError,
        MasterUnreachable,
        MembershipError,
        NodeError,
        PeerRequestError,
        PeerTimeoutError,
        PlanError,
        ProviderError,
        PublishTimeout,
        RegistryError,
        RemoteTaskError,
        RemoteTraceback,
        RendezvousError,
        ResultsStoreError,
        RetryLater,
        RLError,
        RunError,
        SkewError,
        SshAuthError,
        SSHConnectError,
        SSHError,
        SshHostKeyError,
        SSHTimeoutError,
        StartupError,
        TargetError,
        TaskError,
        TaskTimeout,
        WeightsError,
        WireError,
        WorkerAuthError,
        WorkerClosed,
        WorkerDied,
        WorkerError,
        WorkerTimeout,
    )
    from node.locks.client import cluster_lock
    from node.locks.table import LockFence
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
    from node.openapi import openapi_document
    from node.plan import FENCE_HEADER, PlanFence, RolePlan, check_fence, should_apply
    from node.providers import (
        AutoStop,
        LocalProvider,
        NodeHandle,
        Provider,
        StaticProvider,
        acquire_node,
        ready_node,
    )
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
    from node.routes import build_app, status_document
    from node.runtime import NodeRuntime
    from node.security import AuthPolicy, auth_middleware, error_middleware
    from node.ssh import HostMemory, SSHExecutor, SSHResult, detect_host_memory
    from node.ssh.deploy import DeployResult, deploy
    from node.sync_service import SyncService
    from node.systemd import SystemdNotifier
    from node.training.groups import ElasticGroup, join_group
    from node.training.launcher import TrainingLauncher
    from node.training.rendezvous import GroupError, Rendezvous, rendezvous_for
    from node.training.torchrun import torchrun_env, training_env
else:
    __getattr__, __dir__ = lazy_exports(
        __name__,
        {
            "node.addresses": "choose_interfaces find_self_in_inventory local_addresses",
            "node.routes": "build_app status_document",
            "node.boot": "load_secrets resolve_node_id",
            "node.daemon": "NodeDaemon",
            "node.discovery.candidates": "Advert Candidate CandidateSource",
            "node.discovery.feed": "Discovery",
            "node.election.adoption": "AdoptionLog check_adoption_logs read_adoption_log",
            "node.election.elector": "Elector",
            "node.election.routes": "ElectionRoutes HttpElectionTransport",
            "node.plan": "FENCE_HEADER PlanFence RolePlan check_fence should_apply",
            "node.election.roles": "NodeCapabilities RolePolicy compute_plan",
            "node.election.seams": "WalDurableState",
            "node.election.service": "ElectionService VoterSet resolve_voters",
            "node.election.state": "ElectionConfig ElectionEvent ElectionEventKind ElectionStatus",
            "node.errors": (
                "ActorDiedError ActorExistsError AnsweredError ArchiveError BackupError BodyError "
                "CheckpointsError DeployError DiscoveryError DownloadHashError ElectionError "
                "FrameError "
                "JobClientError JobEndedError JobError JobFailedError JobRequestError "
                "JobUnreachableError JobWaitTimeoutError KeyringError KeyringRefused LauncherError "
                "LockError LockLostError "
                "LockUnavailableError MasterUnreachable MembershipError NodeError "
                "PeerRequestError PeerTimeoutError PlanError ProviderError PublishTimeout "
                "RegistryError RemoteTaskError RemoteTraceback RendezvousError ResultsStoreError "
                "RetryLater RLError RunError SkewError SshAuthError SSHConnectError SSHError "
                "SshHostKeyError SSHTimeoutError StartupError TargetError TaskError TaskTimeout "
                "WeightsError BodyRefused "
                "WireError WorkerAuthError WorkerClosed WorkerDied WorkerError WorkerTimeout"
            ),
            "node.membership.service": (
                "EventKind InMemoryNetwork Listener Member MemberEvent Membership "
                "MembershipTransport MemberState MemberView MetaValue SwimTuning TransportStats "
                "UdpMembershipTransport"
            ),
            "node.openapi": "openapi_document",
            "node.providers": (
                "AutoStop LocalProvider NodeHandle Provider StaticProvider acquire_node ready_node"
            ),
            "node.rl": (
                "RolloutStream WeightPublisher WeightReceiver broadcast_weights check_staleness "
                "make_version_state receive_weights stamp_sample"
            ),
            "node.locks.client": "cluster_lock",
            "node.locks.table": "LockFence",
            "node.runtime": "NodeRuntime",
            "node.security": "AuthPolicy auth_middleware error_middleware",
            "node.ssh": "HostMemory SSHExecutor SSHResult detect_host_memory",
            "node.ssh.deploy": "DeployResult deploy",
            "node.sync_service": "SyncService",
            "node.systemd": "SystemdNotifier",
            "node.training.groups": "ElasticGroup join_group",
            "node.training.launcher": "TrainingLauncher",
            "node.training.rendezvous": "GroupError Rendezvous rendezvous_for",
            "node.training.torchrun": "torchrun_env training_env",
        },
    )

__all__ = [
    "FENCE_HEADER",
    "ActorDiedError",
    "ActorExistsError",
    "AdoptionLog",
    "Advert",
    "AnsweredError",
    "ArchiveError",
    "AuthPolicy",
    "AutoStop",
    "BackupError",
    "BodyError",
    "BodyRefused",
    "Candidate",
    "CandidateSource",
    "CheckpointsError",
    "DeployError",
    "DeployResult",
    "Discovery",
    "DiscoveryError",
    "DownloadHashError",
    "ElasticGroup",
    "ElectionConfig",
    "ElectionError",
    "ElectionEvent",
    "ElectionEventKind",
    "ElectionRoutes",
    "ElectionService",
    "ElectionStatus",
    "Elector",
    "EventKind",
    "FrameError",
    "GroupError",
    "HostMemory",
    "HttpElectionTransport",
    "InMemoryNetwork",
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
    "Listener",
    "LocalProvider",
    "LockError",
    "LockFence",
    "LockLostError",
    "LockUnavailableError",
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
    "NodeHandle",
    "NodeRuntime",
    "PeerRequestError",
    "PeerTimeoutError",
    "PlanError",
    "PlanFence",
    "Provider",
    "ProviderError",
    "PublishTimeout",
    "RLError",
    "RegistryError",
    "RemoteTaskError",
    "RemoteTraceback",
    "Rendezvous",
    "RendezvousError",
    "ResultsStoreError",
    "RetryLater",
    "RolePlan",
    "RolePolicy",
    "RolloutStream",
    "RunError",
    "SSHConnectError",
    "SSHError",
    "SSHExecutor",
    "SSHResult",
    "SSHTimeoutError",
    "SkewError",
    "SshAuthError",
    "SshHostKeyError",
    "StartupError",
    "StaticProvider",
    "SwimTuning",
    "SyncService",
    "SystemdNotifier",
    "TargetError",
    "TaskError",
    "TaskTimeout",
    "TrainingLauncher",
    "TransportStats",
    "UdpMembershipTransport",
    "VoterSet",
    "WalDurableState",
    "WeightPublisher",
    "WeightReceiver",
    "WeightsError",
    "WireError",
    "WorkerAuthError",
    "WorkerClosed",
    "WorkerDied",
    "WorkerError",
    "WorkerTimeout",
    "acquire_node",
    "auth_middleware",
    "broadcast_weights",
    "build_app",
    "check_adoption_logs",
    "check_fence",
    "check_staleness",
    "choose_interfaces",
    "cluster_lock",
    "compute_plan",
    "deploy",
    "detect_host_memory",
    "error_middleware",
    "find_self_in_inventory",
    "join_group",
    "load_secrets",
    "local_addresses",
    "make_version_state",
    "openapi_document",
    "read_adoption_log",
    "ready_node",
    "receive_weights",
    "rendezvous_for",
    "resolve_node_id",
    "resolve_voters",
    "should_apply",
    "stamp_sample",
    "status_document",
    "torchrun_env",
    "training_env",
]
