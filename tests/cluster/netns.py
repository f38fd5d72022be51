"""Hosts as Linux network namespaces on one bridge, partitions as nft drop rules.

Layout of one cluster with run prefix P (`shl<pid>c<k>`): a switch namespace `P-sw` holding
bridge `br0` (multicast snooping off, so mDNS floods to every port); host namespaces `P-h<i>`,
each with `lo` and `eth0` at 198.18.0.<i+1>/24, 224.0.0.0/4 routed to `eth0`, joined to the
bridge by a veth whose other end is `h<i>` in the switch namespace. Nothing is created in the
root namespace. IPv6 addresses are not generated on the links, so only IPv4 crosses hosts and
the IPv4 drop rules are a complete partition.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import ClassVar

from tests.cluster.cluster import Cluster, HarnessError, Host

__all__ = [
    "NAME_TAG",
    "NetnsCluster",
    "list_namespaces",
    "netns_unavailable_reason",
    "remove_stale_namespaces",
]

NAME_TAG = "shl"
"""Every namespace of the harness is named `shl<owner pid>c<k>-...`."""

SUBNET = "198.18.0"
PARTITION_TABLE = "shoal_part"
DEFAULT_PORT = 8770
MAX_HOSTS = 250
_NAME = re.compile(rf"^{NAME_TAG}(\d+)c\d+-(sw|h\d+)$")
_cluster_numbers = itertools.count()
_ours: set[str] = set()  # namespaces of this process's open clusters
_COMMAND_TIMEOUT_S = 30.0


def netns_unavailable_reason() -> str | None:
    """Why netns clusters cannot run here (not root, no `ip`, no `nft`), or None if they can."""
    problems = []
    if os.geteuid() != 0:
        problems.append(f"running as uid {os.geteuid()}, not root")
    for tool, package in (("ip", "iproute2"), ("nft", "nftables")):
        if shutil.which(tool) is None:
            problems.append(f"`{tool}` not found (install {package})")
    return "; ".join(problems) or None


def _run(argv: Sequence[str], *, input_text: str | None = None, check: bool = True) -> str:
    try:
        result = subprocess.run(
            list(argv),
            input=input_text,
            capture_output=True,
            text=True,
            timeout=_COMMAND_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise HarnessError(f"{' '.join(argv)} failed: {exc}") from exc
    if check and result.returncode != 0:
        script = f"\ninput:\n{input_text}" if input_text else ""
        raise HarnessError(
            f"{' '.join(argv)} exited {result.returncode}: {result.stderr.strip()}{script}"
        )
    return result.stdout


def _ip_batch(ns: str, commands: Iterable[str]) -> None:
    _run(["ip", "-n", ns, "-batch", "-"], input_text="\n".join(commands) + "\n")


def list_namespaces() -> list[str]:
    """Names of all network namespaces (`ip netns list`)."""
    return [line.split()[0] for line in _run(["ip", "netns", "list"]).splitlines() if line.strip()]


def _namespace_pids(ns: str) -> list[int]:
    return [int(pid) for pid in _run(["ip", "netns", "pids", ns], check=False).split()]


def _remove_namespace(ns: str) -> None:
    # Processes keep a deleted namespace (and its links) alive, so they die first.
    for pid in _namespace_pids(ns):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    _run(["ip", "netns", "delete", ns], check=False)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_namespaces() -> list[str]:
    """Remove the harness namespaces whose owning process is dead; returns their names.

    Processes still inside them are killed first. Namespaces of live runs are left alone.
    """
    stale = []
    for ns in list_namespaces():
        match = _NAME.match(ns)
        if match is None or ns in _ours:
            continue
        owner = int(match.group(1))
        # Our own pid on a namespace we did not create: left by an earlier process with this pid.
        if owner == os.getpid() or not _pid_alive(owner):
            stale.append(ns)
    for ns in stale:
        _remove_namespace(ns)
    return stale


class NetnsCluster(Cluster):
    """N hosts, each a network namespace with its own address, on one bridge.

    Creating it removes stale namespaces of dead runs first; `close()` (or leaving the `with`
    block, or exit, SIGTERM, SIGINT) kills every spawned process and removes every namespace.
    """

    mode: ClassVar[str] = "netns"

    def __init__(self, n: int, base_dir: Path | None = None, *, port: int = DEFAULT_PORT) -> None:
        if not 1 <= n <= MAX_HOSTS:
            raise ValueError(f"a netns cluster has 1 to {MAX_HOSTS} hosts, got n={n}")
        reason = netns_unavailable_reason()
        if reason is not None:
            raise HarnessError(f"netns clusters need root, iproute2 and nftables: {reason}")
        super().__init__(base_dir)
        self.prefix = f"{NAME_TAG}{os.getpid()}c{next(_cluster_numbers)}"
        self.switch_ns = f"{self.prefix}-sw"
        self.namespaces: list[str] = []
        self._drops: dict[str, set[str]] = {}
        try:
            remove_stale_namespaces()
            self._create(n, port)
        except BaseException:
            self.close()
            raise

    def _add_namespace(self, ns: str) -> None:
        self.namespaces.append(ns)  # recorded first: close() removes it even if `add` half-failed
        _ours.add(ns)
        _run(["ip", "netns", "add", ns])

    def _create(self, n: int, port: int) -> None:
        self._add_namespace(self.switch_ns)
        _ip_batch(
            self.switch_ns,
            [
                "link set lo up",
                "link add br0 type bridge mcast_snooping 0",
                "link set br0 addrgenmode none",
                "link set br0 up",
            ],
        )
        hosts = []
        for i in range(n):
            ns = f"{self.prefix}-h{i}"
            address = f"{SUBNET}.{i + 1}"
            self._add_namespace(ns)
            _ip_batch(
                ns,
                [
                    "link set lo up",
                    f"link add eth0 type veth peer name h{i} netns {self.switch_ns}",
                    "link set eth0 addrgenmode none",
                    f"addr add {address}/24 dev eth0",
                    "link set eth0 up",
                    "route add 224.0.0.0/4 dev eth0",
                ],
            )
            hosts.append(self._make_host(i, address, port, ns))
        _ip_batch(
            self.switch_ns,
            [
                cmd
                for i in range(n)
                for cmd in (f"link set h{i} addrgenmode none", f"link set h{i} master br0 up")
            ],
        )
        self.hosts = tuple(hosts)

    def _check_hosts(self, hosts: Iterable[Host]) -> list[Host]:
        checked = list(hosts)
        for host in checked:
            if host.cluster is not self:
                raise ValueError(f"{host.name} ({host.ns}) is not a host of {self!r}")
        return checked

    def partition(self, *groups: Sequence[Host]) -> None:
        """Cut every group off from every other group, both ways; hosts in no group keep all links.

        Adds to any partition already in place. Packets are dropped silently on arrival (nft
        input chain), as on a cut link: senders see timeouts, not errors.
        """
        if len(groups) < 2:
            raise ValueError("partition needs at least two groups of hosts")
        checked = [self._check_hosts(group) for group in groups]
        names = [host.name for group in checked for host in group]
        if len(names) != len(set(names)):
            raise ValueError(f"a host is in more than one group: {sorted(names)}")
        for group_a, group_b in itertools.combinations(checked, 2):
            self._drop(group_a, group_b)
            self._drop(group_b, group_a)
        self._apply()

    def partition_one_way(self, src: Sequence[Host], dst: Sequence[Host]) -> None:
        """Drop what `src` hosts send to `dst` hosts; `dst` -> `src` still flows."""
        sources, destinations = self._check_hosts(src), self._check_hosts(dst)
        if {h.name for h in sources} & {h.name for h in destinations}:
            raise ValueError("a host cannot be cut off from itself")
        self._drop(sources, destinations)
        self._apply()

    def heal(self) -> None:
        """Remove every partition: all drop rules of all hosts."""
        for host in self.hosts:
            if host.name in self._drops:
                _run(self._nft(host), input_text=f"delete table inet {PARTITION_TABLE}\n")
        self._drops.clear()

    def _drop(self, senders: Sequence[Host], receivers: Sequence[Host]) -> None:
        for receiver in receivers:
            self._drops.setdefault(receiver.name, set()).update(s.address for s in senders)

    def _nft(self, host: Host) -> list[str]:
        assert host.ns is not None
        return ["ip", "netns", "exec", host.ns, "nft", "-f", "-"]

    def _apply(self) -> None:
        # "table; delete table; table {...}" replaces the rules atomically, and works whether
        # or not the table exists yet.
        for host in self.hosts:
            addresses = self._drops.get(host.name)
            if not addresses:
                continue
            script = (
                f"table inet {PARTITION_TABLE}\n"
                f"delete table inet {PARTITION_TABLE}\n"
                f"table inet {PARTITION_TABLE} {{\n"
                "  chain input {\n"
                "    type filter hook input priority filter; policy accept;\n"
                f"    ip saddr {{ {', '.join(sorted(addresses))} }} drop\n"
                "  }\n"
                "}\n"
            )
            _run(self._nft(host), input_text=script)

    def limit_rate(self, host: Host, rate_mbit: float, *, queue_ms: int = 1000) -> None:
        """Limit `host`'s link to `rate_mbit` each way (tbf on both ends of its veth).

        What it sends queues in its own qdisc, a pfifo_fast under the shaper as on a real host
        (TCP keeps that queue short, and a socket's SO_PRIORITY picks its band); what it
        receives queues at the switch's port in one FIFO of `queue_ms` at that rate (a bloated
        bottleneck buffer: forwarded packets carry no priority, and TCP senders fill it).
        Lifted by `unlimit_rate`, and with the namespaces when the cluster closes."""
        (host,) = self._check_hosts([host])
        assert host.ns is not None
        rate = ["rate", f"{rate_mbit:g}mbit", "burst", "32kb"]
        uplink = ["tc", "-n", host.ns, "qdisc", "replace", "dev", "eth0", "root", "handle", "1:"]
        _run([*uplink, "tbf", *rate, "latency", "50ms"])
        _run(["tc", "-n", host.ns, "qdisc", "add", "dev", "eth0", "parent", "1:1",
              "handle", "10:", "pfifo_fast"])  # fmt: skip
        port = f"h{self.hosts.index(host)}"
        _run(["tc", "-n", self.switch_ns, "qdisc", "replace", "dev", port, "root", "handle", "1:",
              "tbf", *rate, "latency", f"{queue_ms}ms"])  # fmt: skip

    def unlimit_rate(self, host: Host) -> None:
        """Remove `limit_rate` of `host` (nothing if it has none)."""
        (host,) = self._check_hosts([host])
        assert host.ns is not None
        index = self.hosts.index(host)
        for ns, dev in ((host.ns, "eth0"), (self.switch_ns, f"h{index}")):
            _run(["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"], check=False)

    def _teardown(self) -> None:
        for ns in reversed(self.namespaces):
            _remove_namespace(ns)
        left = set(self.namespaces) & set(list_namespaces())
        _ours.difference_update(set(self.namespaces) - left)
        if left:
            raise HarnessError(f"could not remove network namespaces {sorted(left)}")
