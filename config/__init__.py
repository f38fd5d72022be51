"""Settings of a node, the YAML host inventory, the timeout table, and request signing."""

from __future__ import annotations

from typing import TYPE_CHECKING

from config.lazy import lazy_exports

if TYPE_CHECKING:
    from config.auth import (
        BOUND_HEADERS,
        CLOCK_SKEWS,
        HEADER_CLOCK_SKEW,
        HEADER_CLUSTER,
        HEADER_FENCE,
        HEADER_FORWARDED,
        HEADER_NODE,
        HEADER_NONCE,
        HEADER_RECEIVER,
        HEADER_SIGNATURE,
        HEADER_TARGET,
        HEADER_TIMESTAMP,
        MIN_NONCE_CHARS,
        ClockSkews,
        NonceCache,
        SigningTargets,
        cluster_middleware,
        peer_middlewares,
        read_secret_file,
        sign_request,
        signed_headers,
        signing_middleware,
        verify_request,
    )
    from config.closing import AsyncClosing
    from config.durable import fsync_directory
    from config.errors import (
        AuthError,
        CaError,
        CertificateError,
        ConfigError,
        ConfigPackageError,
        InventoryError,
    )
    from config.fields import Category, HostStatus, Role, is_valid_node_id
    from config.gpus import (
        ENV_CUDA_DEVICE_ORDER,
        ENV_CUDA_VISIBLE_DEVICES,
        GpuSelection,
        NprocSetting,
        cuda_env,
        cuda_visible_devices,
        gpu_share,
        owned_gpus,
        restricts_gpus,
        training_nproc_for,
    )
    from config.inventory import (
        BreakerSection,
        ClusterSection,
        HostEntry,
        Inventory,
        StackEntry,
        SyncSection,
        eligible_hosts,
        load_inventory,
        parse_inventory,
    )
    from config.nodeid import load_or_create_node_id
    from config.sections import (
        DEFAULT_DELETIONS,
        AutostopSettings,
        DeletionPolicy,
        JobSettings,
        LogFormat,
        ResultsSettings,
    )
    from config.settings import (
        ENV_VARS,
        AuthMode,
        CategorySyncSettings,
        LoadedSettings,
        NodeSettings,
        describe_settings,
        load_settings,
    )
    from config.timeouts import Timeouts
    from config.tls.section import TlsSettings
    from config.version import (
        HEADER_VERSION,
        OLDEST_PROTOCOL,
        PROTOCOL_META,
        PROTOCOL_VERSION,
        RELEASE_META,
        UNANNOUNCED_PROTOCOL,
        parse_version_header,
        protocol_gap,
        protocol_of,
        shoal_version,
        version_header,
    )
    from config.wire import ErrorAnswer, error_body, error_exception, error_response, read_error
else:
    __getattr__, __dir__, __all__ = lazy_exports(__name__, __file__)
