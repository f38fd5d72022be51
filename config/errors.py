"""Exceptions of the config package.

ConfigPackageError -- base of every error the config package raises
 +-- ConfigError -- bad configuration, inventory or secret the operator must fix (exit code 2)
 |    +-- InventoryError -- the YAML host inventory is unreadable, malformed or inconsistent
 +-- AuthError -- a signed request was refused; `reason` is sent back with 401
"""

from __future__ import annotations

__all__ = ["AuthError", "ConfigError", "ConfigPackageError", "InventoryError"]


class ConfigPackageError(Exception):
    """Base of every error the config package raises."""


class ConfigError(ConfigPackageError):
    """Bad configuration, inventory or secret. `problems` holds one line per thing to fix."""

    exit_code = 2

    def __init__(self, problems: list[str] | str) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))


class InventoryError(ConfigError):
    """The YAML host inventory is unreadable, malformed or inconsistent."""


class AuthError(ConfigPackageError):
    """A signed request was refused; `reason` is the JSON reason sent back with 401."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)
