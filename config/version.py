"""The installed shoal release and the protocol version every node announces on the wire."""

from __future__ import annotations

from collections.abc import Mapping

PROTOCOL_VERSION = 2
"""The version of the wire forms (membership datagrams, mDNS adverts, HTTP routes and bodies).

Raise it by one in the release that changes a form a peer reads: a datagram or envelope field, a
route, a body field that becomes required or changes meaning. A node of protocol N still reads
and answers every form of N-1 (`tests/compat` runs mixed clusters with the previous release); a
node that announces no protocol is a release from before the protocol was announced: 1.
"""

OLDEST_PROTOCOL = PROTOCOL_VERSION - 1
"""The oldest protocol this release reads (N-1)."""

UNANNOUNCED_PROTOCOL = 1
"""The protocol of a peer that announces none (releases before PROTOCOL_VERSION existed)."""

HEADER_VERSION = "X-Shoal-Version"
"""Response header on every answer of a node: `RELEASE; protocol=N` (`version_header`)."""

RELEASE_META = "version"
"""Membership meta key of a node's release (`shoal_version()`)."""

PROTOCOL_META = "protocol"
"""Membership meta key of a node's PROTOCOL_VERSION (an int)."""


def shoal_version() -> str:
    """The distribution's version, or `0+unknown` when run from a tree that is not installed."""
    from importlib import metadata  # here: `shoal --help` (which prints no version) skips it

    try:
        return metadata.version("shoal")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def version_header(release: str, protocol: int = PROTOCOL_VERSION) -> str:
    """The X-Shoal-Version value: `0.1.0; protocol=2`."""
    return f"{release}; protocol={protocol}"


def parse_version_header(value: str | None) -> tuple[str, int] | None:
    """(release, protocol) of an X-Shoal-Version value; None when there is none (a peer of a
    release before the header) or it is not of the form `RELEASE; protocol=N`."""
    if not value:
        return None
    release, sep, rest = value.partition(";")
    key, eq, number = rest.strip().partition("=")
    if not sep or not eq or key != "protocol" or not number.isdigit() or not release.strip():
        return None
    return release.strip(), int(number)


def protocol_of(meta: Mapping[str, object]) -> int:
    """The protocol a member announces in its membership meta; UNANNOUNCED_PROTOCOL when it
    announces none or not an int (a release before the protocol was announced)."""
    value = meta.get(PROTOCOL_META)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return UNANNOUNCED_PROTOCOL
    return value


def protocol_gap(node_id: str, protocol: int) -> str | None:
    """Why a member of `protocol` and this node may not understand each other (it is older than
    OLDEST_PROTOCOL, or newer than this node by more than one), else None."""
    if OLDEST_PROTOCOL <= protocol <= PROTOCOL_VERSION + 1:
        return None
    if protocol < OLDEST_PROTOCOL:
        return (
            f"member {node_id} speaks protocol {protocol}, older than the {OLDEST_PROTOCOL} this "
            f"node (protocol {PROTOCOL_VERSION}) still reads: upgrade {node_id} (nodes work "
            "together only one release apart)"
        )
    return (
        f"member {node_id} speaks protocol {protocol}, more than one step newer than this node "
        f"(protocol {PROTOCOL_VERSION}): upgrade this node (nodes work together only one "
        "release apart)"
    )
