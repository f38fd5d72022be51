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
    from config.settings import (
        DEFAULT_DELETIONS,
        ENV_VARS,
        AuthMode,
        AutostopSettings,
        CategorySyncSettings,
        DeletionPolicy,
        JobSettings,
        LoadedSettings,
        LogFormat,
        NodeSettings,
        ResultsSettings,
        TlsSettings,
        describe_settings,
        load_settings,
    )
    from config.timeouts import Timeouts
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
    __getattr__, __dir__ = lazy_exports(
        __name__,
        {
            "config.auth": (
                "BOUND_HEADERS CLOCK_SKEWS HEADER_CLOCK_SKEW HEADER_CLUSTER HEADER_FENCE "
                "HEADER_FORWARDED "
                "HEADER_NODE HEADER_NONCE HEADER_RECEIVER HEADER_SIGNATURE HEADER_TARGET "
                "HEADER_TIMESTAMP MIN_NONCE_CHARS ClockSkews NonceCache SigningTargets "
                "cluster_middleware peer_middlewares read_secret_file sign_request signed_headers "
                "signing_middleware verify_request"
            ),
            "config.closing": "AsyncClosing",
            "config.durable": "fsync_directory",
            "config.errors": (
                "AuthError CaError CertificateError ConfigError ConfigPackageError InventoryError"
            ),
            "config.fields": "Category HostStatus Role is_valid_node_id",
            "config.gpus": (
                "ENV_CUDA_DEVICE_ORDER ENV_CUDA_VISIBLE_DEVICES GpuSelection NprocSetting "
                "cuda_env cuda_visible_devices gpu_share owned_gpus restricts_gpus "
                "training_nproc_for"
            ),
            "config.inventory": (
                "BreakerSection ClusterSection HostEntry Inventory StackEntry SyncSection "
                "eligible_hosts load_inventory parse_inventory"
            ),
            "config.nodeid": "load_or_create_node_id",
            "config.settings": (
                "DEFAULT_DELETIONS ENV_VARS AuthMode AutostopSettings CategorySyncSettings "
                "DeletionPolicy JobSettings LoadedSettings LogFormat NodeSettings ResultsSettings "
                "TlsSettings "
                "describe_settings load_settings"
            ),
            "config.timeouts": "Timeouts",
            "config.version": (
                "HEADER_VERSION OLDEST_PROTOCOL PROTOCOL_META PROTOCOL_VERSION RELEASE_META "
                "UNANNOUNCED_PROTOCOL parse_version_header protocol_gap protocol_of "
                "shoal_version version_header"
            ),
            "config.wire": "ErrorAnswer error_body error_exception error_response read_error",
        },
    )

__all__ = [
    "BOUND_HEADERS",
    "CLOCK_SKEWS",
    "DEFAULT_DELETIONS",
    "ENV_CUDA_DEVICE_ORDER",
    "ENV_CUDA_VISIBLE_DEVICES",
    "ENV_VARS",
    "HEADER_CLOCK_SKEW",
    "HEADER_CLUSTER",
    "HEADER_FENCE",
    "HEADER_FORWARDED",
    "HEADER_NODE",
    "HEADER_NONCE",
    "HEADER_RECEIVER",
    "HEADER_SIGNATURE",
    "HEADER_TARGET",
    "HEADER_TIMESTAMP",
    "HEADER_VERSION",
    "MIN_NONCE_CHARS",
    "OLDEST_PROTOCOL",
    "PROTOCOL_META",
    "PROTOCOL_VERSION",
    "RELEASE_META",
    "UNANNOUNCED_PROTOCOL",
    "AsyncClosing",
    "AuthError",
    "AuthMode",
    "AutostopSettings",
    "BreakerSection",
    "CaError",
    "Category",
    "CategorySyncSettings",
    "CertificateError",
    "ClockSkews",
    "ClusterSection",
    "ConfigError",
    "ConfigPackageError",
    "DeletionPolicy",
    "ErrorAnswer",
    "GpuSelection",
    "HostEntry",
    "HostStatus",
    "Inventory",
    "InventoryError",
    "JobSettings",
    "LoadedSettings",
    "LogFormat",
    "NodeSettings",
    "NonceCache",
    "NprocSetting",
    "ResultsSettings",
    "Role",
    "SigningTargets",
    "StackEntry",
    "SyncSection",
    "Timeouts",
    "TlsSettings",
    "cluster_middleware",
    "cuda_env",
    "cuda_visible_devices",
    "describe_settings",
    "eligible_hosts",
    "error_body",
    "error_exception",
    "error_response",
    "fsync_directory",
    "gpu_share",
    "is_valid_node_id",
    "load_inventory",
    "load_or_create_node_id",
    "load_settings",
    "owned_gpus",
    "parse_inventory",
    "parse_version_header",
    "peer_middlewares",
    "protocol_gap",
    "protocol_of",
    "read_error",
    "read_secret_file",
    "restricts_gpus",
    "shoal_version",
    "sign_request",
    "signed_headers",
    "signing_middleware",
    "training_nproc_for",
    "verify_request",
    "version_header",
]
