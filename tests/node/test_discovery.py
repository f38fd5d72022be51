"""Discovery without mDNS: interface choice, self in inventory, inventory and seed candidates."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import ifaddr
import pytest

from config import ConfigError, Inventory, Timeouts
from health import HealthChecker, HealthStatus
from node.addresses import (
    choose_interfaces,
    find_self_in_inventory,
    local_addresses,
    local_networks,
    preferred_address,
)
from node.discovery.candidates import Advert, Candidate, inventory_candidates, parse_seed
from node.discovery.feed import Discovery
from node.discovery.mdns import advert_from_txt, advert_properties, candidate_for
from node.errors import DiscoveryError

FAST = Timeouts(mdns_s=1.0)
ADVERT = Advert("gpu-a", "lab", "0.1.0", 8770, ("10.0.0.5",))


def _adapter(name: str, *ips: str | tuple[str, int, int], prefix: int = 24) -> ifaddr.Adapter:
    return ifaddr.Adapter(name, name, [ifaddr.IP(ip, prefix, name) for ip in ips], index=1)


ADAPTERS = [
    _adapter("lo", "127.0.0.1", ("::1", 0, 0), prefix=8),
    _adapter("eth0", "10.0.0.5", ("fd00::5", 0, 0), ("fe80::1", 0, 2)),
    _adapter("docker0", "172.17.0.1"),
    _adapter("br-0a1b2c", "172.18.0.1"),
    _adapter("veth12ab", "169.254.3.3"),
    _adapter("virbr0", "192.168.122.1"),
    _adapter("cni0", "10.244.0.1"),
    _adapter("flannel.1", "10.244.0.0"),
    _adapter("wlan0", "169.254.7.7", "192.168.1.20"),
]


def _inventory(hosts: dict[str, dict[str, object]]) -> Inventory:
    return Inventory.model_validate({"hosts": hosts})


async def _wait_until(predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


# --- choose_interfaces -------------------------------------------------------------------------


def test_wildcard_bind_skips_container_loopback_and_link_local() -> None:
    assert choose_interfaces(ADAPTERS, None, "0.0.0.0") == ["10.0.0.5", "192.168.1.20", "fd00::5"]
    assert choose_interfaces(ADAPTERS, [], "::") == ["10.0.0.5", "192.168.1.20", "fd00::5"]


def test_loopback_bind_is_dev_mode() -> None:
    assert choose_interfaces(ADAPTERS, None, "127.0.0.1") == ["127.0.0.1"]
    assert choose_interfaces(ADAPTERS, None, "localhost") == ["127.0.0.1"]


def test_specific_bind_is_used_alone() -> None:
    assert choose_interfaces(ADAPTERS, None, "192.168.1.20") == ["192.168.1.20"]


def test_configured_addresses_and_interfaces_are_always_kept() -> None:
    configured = ["docker0", "169.254.7.7", "fe80::1", "no-such-if0"]
    assert choose_interfaces(ADAPTERS, configured, "0.0.0.0") == [
        "172.17.0.1",
        "169.254.7.7",
        "fe80::1",
    ]


def test_no_usable_interface_is_empty() -> None:
    assert choose_interfaces([_adapter("docker0", "172.17.0.1")], None, "0.0.0.0") == []


def test_local_addresses_and_networks() -> None:
    assert local_addresses(ADAPTERS[:2]) == ("127.0.0.1", "10.0.0.5", "::1", "fd00::5", "fe80::1")
    assert "127.0.0.1" in local_addresses()
    networks = local_networks(ADAPTERS[1:2])
    assert preferred_address(["100.64.0.9", "10.0.0.77"], networks) == "10.0.0.77"
    assert preferred_address(["fd01::9", "100.64.0.9"], ()) == "100.64.0.9"
    assert preferred_address(["fd01::9"], ()) == "fd01::9"
    assert preferred_address([], networks) is None


# --- find_self_in_inventory --------------------------------------------------------------------


def test_find_self_by_address_tailscale_or_ssh_host() -> None:
    inventory = _inventory(
        {
            "gpu-a": {"ssh_host": "10.0.0.5"},
            "gpu-b": {"ssh_host": "10.0.0.6", "tailscale_ip": "100.64.0.6"},
        }
    )
    assert find_self_in_inventory(inventory, ["127.0.0.1", "10.0.0.5"]) == "gpu-a"
    assert find_self_in_inventory(inventory, ["10.0.0.6"]) == "gpu-b"
    assert find_self_in_inventory(inventory, ["100.64.0.6"]) == "gpu-b"
    assert find_self_in_inventory(inventory, ["192.0.2.1"]) is None


def test_find_self_ambiguous_names_the_hosts_and_port_disambiguates() -> None:
    inventory = _inventory(
        {
            "dev-1": {"ssh_host": "127.0.0.1", "p2p_port": 9001},
            "dev-2": {"ssh_host": "127.0.0.1", "p2p_port": 9002},
            "other": {"ssh_host": "10.9.9.9"},
        }
    )
    with pytest.raises(ConfigError, match=r"dev-1, dev-2.*--node-id"):
        find_self_in_inventory(inventory, ["127.0.0.1"])
    assert find_self_in_inventory(inventory, ["127.0.0.1"], port=9002) == "dev-2"
    assert find_self_in_inventory(inventory, ["127.0.0.1"], port=9999) is None


def test_find_self_normalizes_ipv6() -> None:
    inventory = _inventory({"v6": {"ssh_host": "FD00:0:0::5"}})
    assert find_self_in_inventory(inventory, ["fd00::5"]) == "v6"


# --- candidates from the inventory, seeds and adverts ------------------------------------------


def test_inventory_candidates_exclude_self_by_id_and_by_endpoint() -> None:
    inventory = _inventory(
        {
            "gpu-a": {"ssh_host": "10.0.0.5"},
            "alias-of-a": {"tailscale_ip": "10.0.0.5", "p2p_port": 8770, "ssh_host": "x"},
            "gpu-b": {"ssh_host": "h-b", "tailscale_ip": "100.64.0.2", "p2p_port": 9000},
        }
    )
    assert inventory_candidates(inventory, ADVERT) == [
        Candidate("100.64.0.2", 9000, "inventory", "gpu-b")
    ]


def test_parse_seed() -> None:
    assert parse_seed("host.example:8770") == ("host.example", 8770)
    assert parse_seed("[fd00::1]:9000") == ("fd00::1", 9000)
    for bad in ("host", ":80", "host:0", "host:x", "host:70000"):
        with pytest.raises(ConfigError, match="HOST:PORT"):
            parse_seed(bad)


def test_advert_txt_round_trip_and_filtering() -> None:
    props: dict[str, str | None] = dict(advert_properties(ADVERT))
    assert set(props) == {"id", "cluster", "version", "port"}
    peer = advert_from_txt(props, ["10.0.0.5"], 1)
    assert peer == ADVERT
    assert advert_from_txt({"cluster": "lab"}, ["10.0.0.1"], 80) is None
    assert advert_from_txt({"id": "x", "cluster": "lab", "port": "0"}, ["10.0.0.1"], 80) is None
    assert advert_from_txt({"id": "x", "cluster": "lab"}, ["10.0.0.1"], 80) is not None
    unlabelled = advert_from_txt({"id": "old", "port": "9000"}, ["10.0.0.8"], 80)
    assert unlabelled == Advert("old", "", "", 9000, ("10.0.0.8",))  # a release before cluster ids
    assert candidate_for(unlabelled, ADVERT) == Candidate("10.0.0.8", 9000, "mdns", "old")
    other = Advert("gpu-b", "lab", "0.1.0", 9000, ("100.64.0.2", "10.0.0.6"))
    networks = local_networks(ADAPTERS[1:2])
    assert candidate_for(other, ADVERT, networks) == Candidate("10.0.0.6", 9000, "mdns", "gpu-b")
    assert candidate_for(ADVERT, ADVERT, networks) is None
    assert candidate_for(Advert("gpu-c", "prod", "1", 1, ("10.0.0.7",)), ADVERT) is None
    assert candidate_for(Advert("gpu-c", "lab", "1", 1, ()), ADVERT) is None


# --- Discovery without mDNS --------------------------------------------------------------------


async def test_inventory_and_seeds_are_fed_and_refed(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="node.discovery.feed")
    inventory = _inventory(
        {
            "gpu-a": {"ssh_host": "10.0.0.5"},
            "gpu-b": {"ssh_host": "10.0.0.6"},
            "gpu-c": {"tailscale_ip": "100.64.0.7", "ssh_host": "c", "p2p_port": 9100},
        }
    )
    seeds = ["127.0.0.1:9001", "localhost:9002", "no-such-host.invalid:9003", "10.0.0.5:8770"]
    seen: list[Candidate] = []
    discovery = Discovery(
        ADVERT,
        seen.append,
        mdns=False,
        inventory=inventory,
        seeds=seeds,
        timeouts=FAST,
        refeed_interval_s=0.02,
    )
    async with discovery:
        expected = {
            Candidate("10.0.0.6", 8770, "inventory", "gpu-b"),
            Candidate("100.64.0.7", 9100, "inventory", "gpu-c"),
            Candidate("127.0.0.1", 9001, "seed"),
            Candidate("127.0.0.1", 9002, "seed"),
        }
        await _wait_until(lambda: all(seen.count(c) >= 3 for c in expected))
        assert not discovery.mdns_active
        assert discovery.mdns_peers() == {}
    assert {c.node_id for c in seen} == {"gpu-b", "gpu-c", None}  # never ourselves
    assert all(c.port != 9003 for c in seen)
    assert Candidate("10.0.0.5", 8770, "seed") not in seen  # a seed that is this node
    bad = [r for r in caplog.records if "no-such-host.invalid" in r.getMessage()]
    assert [r.levelno for r in bad[:2]] == [logging.WARNING, logging.DEBUG]
    assert sum(r.levelno == logging.WARNING for r in bad) == 1


async def test_failing_callback_does_not_stop_refeeding(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[Candidate] = []

    def explode(candidate: Candidate) -> None:
        calls.append(candidate)
        raise RuntimeError("membership bug")

    inventory = _inventory({"gpu-b": {"ssh_host": "10.0.0.6"}})
    async with Discovery(
        ADVERT,
        explode,
        mdns=False,
        inventory=inventory,
        seeds=[],
        timeouts=FAST,
        refeed_interval_s=0.02,
    ):
        await _wait_until(lambda: len(calls) >= 2)
    assert "candidate callback failed" in caplog.text


async def test_close_is_idempotent_and_irreversible() -> None:
    discovery = Discovery(ADVERT, print, mdns=False, inventory=None, seeds=[], timeouts=FAST)
    await discovery.close()  # closing an unopened one is fine
    with pytest.raises(RuntimeError, match="closed"):
        await discovery.__aenter__()
    other = Discovery(ADVERT, print, mdns=False, inventory=None, seeds=[], timeouts=FAST)
    async with other:
        pass
    await other.close()
    with pytest.raises(DiscoveryError):
        await other.update_advert(ADVERT)


def test_bad_seed_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="nonsense"):
        Discovery(ADVERT, print, mdns=False, inventory=None, seeds=["nonsense"], timeouts=FAST)


async def test_mdns_without_usable_interface_raises_and_leaves_nothing_open() -> None:
    discovery = Discovery(
        ADVERT,
        print,
        mdns=True,
        inventory=None,
        seeds=[],
        timeouts=FAST,
        interfaces=["203.0.113.9"],  # TEST-NET-3: not an address of this host
    )
    with pytest.raises(DiscoveryError, match="no usable mDNS interface"):
        await discovery.__aenter__()
    assert not discovery.mdns_active
    # the caller keeps running without mDNS
    async with Discovery(ADVERT, print, mdns=False, inventory=None, seeds=[], timeouts=FAST) as d:
        assert not d.mdns_active


async def test_a_seed_that_never_resolves_makes_discovery_degraded() -> None:
    checker = HealthChecker()
    async with Discovery(
        ADVERT,
        print,
        mdns=False,
        inventory=None,
        seeds=["no-such-host.invalid:9003"],
        timeouts=FAST,
        refeed_interval_s=0.02,
    ) as discovery:
        checker.add_check("discovery", discovery.loop_health.check)
        await _wait_until(lambda: discovery.loop_health.failing)
        component = await checker.run_check("discovery")
    assert component.status is HealthStatus.DEGRADED
    assert "no-such-host.invalid" in component.message


async def test_discovery_rounds_that_work_are_healthy() -> None:
    inventory = _inventory({"gpu-b": {"ssh_host": "10.0.0.6"}})
    async with Discovery(
        ADVERT,
        lambda candidate: None,
        mdns=False,
        inventory=inventory,
        seeds=["127.0.0.1:9001"],
        timeouts=FAST,
        refeed_interval_s=0.02,
    ) as discovery:
        await _wait_until(lambda: discovery.loop_health.rounds >= 3)
        result = await discovery.loop_health.check()
    assert result.status is HealthStatus.HEALTHY
    assert discovery.loop_health.consecutive_failures == 0
