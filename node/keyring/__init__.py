"""The cluster's gossip keyring from the API: list, install, use and remove keys on every alive
member through the coordinator (`shoal keyring`); the keyring itself is node.membership.keyring.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from config.lazy import lazy_exports

if TYPE_CHECKING:
    from node.errors import KeyringRefused
    from node.keyring.routes import KeyringRoutes
    from node.keyring.wire import KEYRING_PATH, LOCAL_PATH
else:
    __getattr__, __dir__, __all__ = lazy_exports(__name__, __file__)
