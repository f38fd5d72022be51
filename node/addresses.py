"""This host's addresses: which to advertise and listen on for mDNS; which inventory host it is.

Everything here is a pure function of the adapters (ifaddr) it is given, except `local_addresses`.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence

import ifaddr

from config import ConfigError, Inventory

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# Interfaces of containers, VMs and overlay networks: not where peers are, unless configured.
CONTAINER_INTERFACE_PREFIXES = (
    "docker",
    "br-",
    "veth",
    "virbr",
    "cni",
    "flannel",
    "cali",
    "cilium",
    "vxlan",
    "kube-",
    "podman",
    "lxcbr",
    "lxdbr",
    "weave",
)
LOOPBACK_MDNS_INTERFACE = "127.0.0.1"
_WILDCARD_BINDS = frozenset({"", "0.0.0.0", "::", "*"})  # noqa: S104 - names, not a bind


def _ip_text(ip: ifaddr.IP) -> str:
    return ip.ip[0] if isinstance(ip.ip, tuple) else ip.ip


def _parse_ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text.split("%", 1)[0].strip("[]"))
    except ValueError:
        return None


def normalize_address(text: str) -> str:
    """The canonical text of an IP address (no scope, no brackets); other text lowercased."""
    parsed = _parse_ip(text)
    return str(parsed) if parsed is not None else text.strip().lower()


def is_container_interface(name: str) -> bool:
    """True for docker, bridge, veth, libvirt and overlay-network interface names."""
    return name.startswith(CONTAINER_INTERFACE_PREFIXES)


def _usable_by_default(address: str) -> bool:
    parsed = _parse_ip(address)
    return parsed is not None and not (
        parsed.is_loopback or parsed.is_link_local or parsed.is_multicast or parsed.is_unspecified
    )


def _is_loopback_bind(bind: str) -> bool:
    if bind.strip().lower() == "localhost":
        return True
    parsed = _parse_ip(bind)
    return parsed is not None and parsed.is_loopback


def _ipv4_first(addresses: Iterable[str]) -> list[str]:
    unique = list(dict.fromkeys(addresses))
    return [a for a in unique if ":" not in a] + [a for a in unique if ":" in a]


def choose_interfaces(
    adapters: Iterable[ifaddr.Adapter], configured: Sequence[str] | None, bind: str
) -> list[str]:
    """The local addresses to advertise and listen on for mDNS, IPv4 first.

    `configured` entries (addresses, or interface names standing for all their addresses) are
    always kept. Otherwise: a loopback `bind` means dev mode, ["127.0.0.1"]; a specific `bind`
    address means just that one; a wildcard `bind` means every address of every adapter except
    loopback, link-local (169.254/16, fe80::/10) and container/bridge interfaces (docker0, br-*,
    veth*, virbr*, cni*, flannel*, ...). Empty when nothing is usable.
    """
    adapters = list(adapters)
    if configured:
        chosen: list[str] = []
        by_name = {adapter.nice_name: adapter for adapter in adapters}
        by_name.update({adapter.name: adapter for adapter in adapters})
        for entry in configured:
            if _parse_ip(entry) is not None:
                chosen.append(entry)
            elif entry in by_name:
                chosen.extend(_ip_text(ip) for ip in by_name[entry].ips)
        return _ipv4_first(chosen)
    if _is_loopback_bind(bind):
        return [LOOPBACK_MDNS_INTERFACE]
    if bind.strip() not in _WILDCARD_BINDS and _parse_ip(bind) is not None:
        return [bind.strip()]
    return _ipv4_first(
        _ip_text(ip)
        for adapter in adapters
        if not is_container_interface(adapter.nice_name)
        for ip in adapter.ips
        if _usable_by_default(_ip_text(ip))
    )


def local_networks(adapters: Iterable[ifaddr.Adapter]) -> tuple[IPNetwork, ...]:
    """The networks the adapters' addresses are on (e.g. 192.0.2.0/24)."""
    networks: list[IPNetwork] = []
    for adapter in adapters:
        for ip in adapter.ips:
            parsed = _parse_ip(_ip_text(ip))
            if parsed is not None:
                networks.append(ipaddress.ip_interface(f"{parsed}/{ip.network_prefix}").network)
    return tuple(dict.fromkeys(networks))


def preferred_address(advertised: Sequence[str], networks: Sequence[IPNetwork]) -> str | None:
    """Which of a peer's advertised addresses to reach it at.

    The first on one of our own networks, else the first IPv4 address, else the first; None
    when there is none.
    """
    parsed = [(text, _parse_ip(text)) for text in advertised]
    for text, address in parsed:
        if address is not None and any(address in network for network in networks):
            return text
    for text, address in parsed:
        if address is not None and address.version == 4:
            return text
    return advertised[0] if advertised else None


def local_addresses(adapters: Iterable[ifaddr.Adapter] | None = None) -> tuple[str, ...]:
    """Every IP address of this host (IPv4 first), from `adapters` or ifaddr's current ones."""
    current = ifaddr.get_adapters() if adapters is None else adapters
    return tuple(_ipv4_first(_ip_text(ip) for adapter in current for ip in adapter.ips))


def find_self_in_inventory(
    inventory: Inventory, local_addresses: Iterable[str], port: int | None = None
) -> str | None:
    """The node id of the inventory host that is this machine, or None when none is.

    A host is this machine when its `tailscale_ip` or `ssh_host` is one of `local_addresses`
    (and, when `port` is given, its `p2p_port` is `port`). Several matches raise ConfigError
    naming them: the node must then be started with an explicit node id.
    """
    local = {normalize_address(address) for address in local_addresses}
    matches = sorted(
        name
        for name, host in inventory.hosts.items()
        if any(
            normalize_address(address) in local
            for address in (host.tailscale_ip, host.ssh_host)
            if address
        )
        and (port is None or host.p2p_port == port)
    )
    if len(matches) > 1:
        where = f" with p2p_port {port}" if port is not None else ""
        raise ConfigError(
            f"this machine's addresses match several inventory hosts{where}: "
            f"{', '.join(matches)}; start the node with --node-id set to one of them"
        )
    return matches[0] if matches else None
