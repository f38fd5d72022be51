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
    from node.election.routes import ElectionRoutes
    from node.election.seams import WalDurableState
    from node.election.service import ElectionService, VoterSet, resolve_voters
    from node.election.state import ElectionConfig, ElectionEvent, ElectionEventKind, ElectionStatus
    from node.election.transport import HttpElectionTransport
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
        GroupError,
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
    from node.training.rendezvous import Rendezvous, rendezvous_for
    from node.training.torchrun import torchrun_env, training_env
else:
    __getattr__, __dir__, __all__ = lazy_exports(__name__, __file__)
