"""The cluster's gossip keyring from the API: list, install, use and remove keys on every alive
member through the coordinator (`shoal keyring`); the keyring itself is node.membership.keyring.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from config.lazy import lazy_exports

if TYPE_CHECKING:
    from node.keyring.routes import KeyringRefused, KeyringRoutes
    from node.keyring.wire import KEYRING_PATH, LOCAL_PATH
else:
    __getattr__, __dir__ = lazy_exports(
        __name__,
        {
            "node.keyring.wire": "KEYRING_PATH LOCAL_PATH",
            "node.keyring.routes": "KeyringRefused KeyringRoutes",
        },
    )

__all__ = ["KEYRING_PATH", "LOCAL_PATH", "KeyringRefused", "KeyringRoutes"]
