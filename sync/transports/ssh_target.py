"""How to reach one peer over SSH (the rsync transport's target)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from config import HostEntry


@dataclass(frozen=True)
class SshTarget:
    """How to reach one peer over SSH, and where its category roots are: `storage_paths`
    (category -> path) first, else `data_dir`/<category>. A leading `~/` means the login
    user's home (paths are relative to it). `host` empty: the host of the peer's URL. `jump`: the
    inventory host (or `[user@]host[:port]`) to reach it through, used on pooled connections."""

    host: str = ""
    port: int = 22
    user: str | None = None
    key_path: str | None = None
    data_dir: str = "~/shoal"
    storage_paths: Mapping[str, str] = field(default_factory=dict)
    jump: str | None = None

    @classmethod
    def from_host(cls, entry: HostEntry) -> SshTarget:
        """The target of an inventory host (ssh_host or tailscale_ip, port, user, key, path)."""
        return cls(
            host=entry.address,
            port=entry.ssh_port,
            user=entry.ssh_user,
            key_path=entry.ssh_key,
            data_dir=entry.path,
            storage_paths={str(k): v for k, v in entry.storage_paths.items()},
            jump=entry.proxy_jump,
        )
