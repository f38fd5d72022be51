"""SSH to inventory hosts: the executor (pooled connections, parallel runs), host checks and
host-key trust, and `shoal deploy`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from config.lazy import lazy_exports

if TYPE_CHECKING:
    from node.ssh.check import HostCheck, HostMemory, check_hosts, detect_host_memory, parse_probe
    from node.ssh.executor import (
        DEFAULT_KNOWN_HOSTS,
        SSHEndpoint,
        SSHExecutor,
        SSHPool,
        SSHResult,
        endpoint_of,
        parse_ssh_spec,
    )
    from node.ssh.relay import pooled_connector, target_endpoint
    from node.ssh.trust import HostKeyInfo, add_host_key, fetch_host_key, key_status
else:
    __getattr__, __dir__, __all__ = lazy_exports(__name__, __file__)
