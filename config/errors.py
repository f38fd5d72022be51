"""Exceptions of the config package.

ConfigPackageError -- base of every error the config package raises
 +-- ConfigError -- bad configuration, inventory or secret the operator must fix (exit code 2)
 |    +-- InventoryError -- the YAML host inventory is unreadable, malformed or inconsistent
 |    +-- CaError -- a cluster CA command cannot go on (no CA, bad dir, name, role, days, SAN)
 +-- AuthError -- a signed request was refused; `reason` is sent back with 401
 +-- CertificateError -- a peer certificate was refused; names its `identity` and `reason`
"""

from __future__ import annotations

__all__ = [
    "AuthError",
    "CaError",
    "CertificateError",
    "ConfigError",
    "ConfigPackageError",
    "InventoryError",
]


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


class CaError(ConfigError):
    """A cluster CA command cannot go on: no CA in the dir, a bad dir, name, role, days or SAN,
    or a file it would overwrite. Each problem line says what to do."""


class AuthError(ConfigPackageError):
    """A signed request was refused; `reason` is the JSON reason sent back with 401."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class CertificateError(ConfigPackageError):
    """A peer certificate was refused. `identity` is the name the certificate claims (its CN,
    or `<no CN>`), `reason` one of `config.tls.RefusalReason`'s values (expired, not_yet_valid,
    other_ca, revoked, bad_identity), `detail` the sentence that explains it, `serial` the
    certificate's serial number when it was read."""

    def __init__(self, identity: str, reason: str, detail: str, serial: int | None = None) -> None:
        self.identity = identity
        self.reason = reason
        self.detail = detail
        self.serial = serial
        super().__init__(f"certificate {identity!r} refused ({reason}): {detail}")
