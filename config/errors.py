"""The config package's exceptions: every one is bad input the operator must fix (exit code 2)."""

from __future__ import annotations


class ConfigError(Exception):
    """Bad configuration, inventory or secret. `problems` holds one line per thing to fix."""

    exit_code = 2

    def __init__(self, problems: list[str] | str) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))


class InventoryError(ConfigError):
    """The YAML host inventory is unreadable, malformed or inconsistent."""


class AuthError(Exception):
    """A signed request was refused; `reason` is the JSON reason sent back with 401."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)
