"""The node package's exceptions.

NodeError
 +-- DiscoveryError      mDNS could not start or a discovery source failed
 +-- MembershipError     the membership protocol could not start (socket bind)
 +-- StartupError        the daemon cannot start (bad combination of settings, port in use)
"""

from __future__ import annotations


class NodeError(Exception):
    """Base of every error the node package raises."""


class DiscoveryError(NodeError):
    """A discovery source (zeroconf, seeds) failed."""


class MembershipError(NodeError):
    """The membership protocol could not start or send."""


class StartupError(NodeError):
    """The daemon cannot start; the message says what to fix."""
