"""The multi-host harness itself: reachability, multicast, partitions, signals, cleanup."""

from __future__ import annotations

import ipaddress
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.cluster import (
    ClusterProcess,
    HarnessError,
    Host,
    LoopbackClusterFactory,
    NetnsCluster,
    NetnsClusterFactory,
    PartitionUnsupportedError,
    netns_unavailable_reason,
    remove_stale_namespaces,
    wait_until,
)
from tests.cluster.netns import list_namespaces

REPO_ROOT = Path(__file__).resolve().parents[2]
PROBE = [sys.executable, str(Path(__file__).with_name("netprobe.py"))]
NEGATIVE_GRACE_S = 0.3
"""How long a packet that must not arrive gets to arrive anyway, after a control packet did."""


def start_probe(host: Host, *, mcast: bool = True) -> ClusterProcess:
    argv = [*PROBE, "serve", str(host.port), *(["mcast"] if mcast else [])]
    proc = host.spawn(argv, name="probe")
    wait_until(lambda: "ready" in proc.log_text(), timeout_s=10, message=f"probe on {host.name}")
    return proc


def send_udp(src: Host, dst: Host, payload: str) -> None:
    src.run([*PROBE, "udp", dst.address, str(dst.port), payload])


def send_mcast(src: Host, payload: str) -> None:
    src.run([*PROBE, "mcast", payload])


def tcp_echo(src: Host, dst: Host, timeout_s: float = 3.0) -> bool:
    result = src.run(
        [*PROBE, "tcp-echo", dst.address, str(dst.port), "echo!", str(timeout_s)], check=False
    )
    return result.returncode == 0 and "echo!" in result.stdout


def received(probe: ClusterProcess, kind: str, src: Host, payload: str) -> bool:
    return f"{kind} from {src.address}: {payload}" in probe.log_text().splitlines()


def wait_received(probe: ClusterProcess, kind: str, src: Host, payload: str) -> None:
    wait_until(
        lambda: received(probe, kind, src, payload),
        timeout_s=5,
        message=f"{probe.host.name} receiving {kind} {payload!r} from {src.name}",
    )


def namespaces_with(prefix: str) -> list[str]:
    return [ns for ns in list_namespaces() if ns.startswith(prefix)]


def root_links() -> set[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True)
    return {line.split(":")[1].strip() for line in out.stdout.splitlines()}


def process_gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rpartition(")")[2].split()[0] in {"Z", "X"}


def process_stopped(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] in {"T", "t"}


@pytest.mark.netns
def test_hosts_get_addresses_and_reach_each_other_over_tcp(
    netns_cluster: NetnsClusterFactory,
) -> None:
    cluster = netns_cluster(3)
    other = netns_cluster(1)
    assert cluster.prefix != other.prefix
    assert [h.address for h in cluster.hosts] == ["198.18.0.1", "198.18.0.2", "198.18.0.3"]
    assert all(
        ipaddress.ip_address(h.address) in ipaddress.ip_network("198.18.0.0/24")
        for h in cluster.hosts
    )
    assert len(namespaces_with(cluster.prefix)) == 4  # three hosts and the switch
    for host in cluster.hosts:
        start_probe(host, mcast=False)
    for src in cluster.hosts:
        for dst in cluster.hosts:
            assert tcp_echo(src, dst), f"{src.name} -> {dst.name}"
    loopback = cluster.hosts[0].run(
        [*PROBE, "tcp-echo", "127.0.0.1", str(cluster.hosts[0].port), "lo", "3"]
    )
    assert "lo" in loopback.stdout


@pytest.mark.netns
def test_multicast_crosses_the_bridge(netns_cluster: NetnsClusterFactory) -> None:
    h0, h1, h2 = netns_cluster(3).hosts
    probes = [start_probe(h1), start_probe(h2)]
    send_mcast(h0, "mdns-ish")
    for probe in probes:
        wait_received(probe, "mcast", h0, "mdns-ish")


@pytest.mark.netns
def test_full_partition_blocks_both_ways_and_heal_restores(
    netns_cluster: NetnsClusterFactory,
) -> None:
    cluster = netns_cluster(3)
    h0, h1, h2 = cluster.hosts
    p0, p1, p2 = (start_probe(h) for h in cluster.hosts)
    cluster.partition([h0], [h1])

    send_udp(h0, h1, "cut-1")
    send_mcast(h0, "cut-2")
    send_udp(h1, h0, "cut-3")
    send_mcast(h1, "cut-4")
    wait_received(p2, "mcast", h0, "cut-2")  # h2 is on both sides: the controls
    wait_received(p2, "mcast", h1, "cut-4")
    assert tcp_echo(h0, h2)
    assert not tcp_echo(h0, h1, timeout_s=0.3)
    assert not tcp_echo(h1, h0, timeout_s=0.3)
    time.sleep(NEGATIVE_GRACE_S)
    assert not received(p1, "udp", h0, "cut-1")
    assert not received(p1, "mcast", h0, "cut-2")
    assert not received(p0, "udp", h1, "cut-3")
    assert not received(p0, "mcast", h1, "cut-4")

    cluster.heal()
    assert tcp_echo(h0, h1)
    assert tcp_echo(h1, h0)
    send_mcast(h0, "healed")
    wait_received(p1, "mcast", h0, "healed")


@pytest.mark.netns
def test_one_way_partition_blocks_one_direction_only(netns_cluster: NetnsClusterFactory) -> None:
    cluster = netns_cluster(3)
    h0, h1, _ = cluster.hosts
    p0, p1, p2 = (start_probe(h) for h in cluster.hosts)
    cluster.partition_one_way([h0], [h1])

    send_udp(h0, h1, "one-1")
    send_mcast(h0, "one-2")
    send_udp(h1, h0, "back-1")
    send_mcast(h1, "back-2")
    wait_received(p0, "udp", h1, "back-1")
    wait_received(p0, "mcast", h1, "back-2")
    wait_received(p2, "mcast", h0, "one-2")
    time.sleep(NEGATIVE_GRACE_S)
    assert not received(p1, "udp", h0, "one-1")
    assert not received(p1, "mcast", h0, "one-2")

    cluster.heal()
    send_udp(h0, h1, "one-3")
    wait_received(p1, "udp", h0, "one-3")


@pytest.mark.netns
def test_a_rate_limit_shapes_both_ends_of_a_link_and_lifts(
    netns_cluster: NetnsClusterFactory,
) -> None:
    cluster = netns_cluster(2)
    h0, h1 = cluster.hosts
    start_probe(h1)

    def qdiscs() -> tuple[str, str]:
        up = h0.run(["tc", "qdisc", "show", "dev", "eth0"]).stdout
        port = ["tc", "-n", cluster.switch_ns, "qdisc", "show", "dev", "h0"]
        return up, subprocess.run(port, capture_output=True, text=True, check=True).stdout

    cluster.limit_rate(h0, 20, queue_ms=500)
    up, down = qdiscs()
    for shaped in (up, down):
        assert "tbf 1: root" in shaped
        assert "rate 20Mbit" in shaped
    assert "pfifo_fast 10: parent 1:1" in up
    assert "lat 500ms" in down
    assert tcp_echo(h0, h1)
    cluster.unlimit_rate(h0)
    assert "tbf" not in "".join(qdiscs())
    cluster.unlimit_rate(h0)  # nothing to lift: no error


@pytest.mark.netns
def test_partition_rules_accumulate_and_reject_bad_groups(
    netns_cluster: NetnsClusterFactory,
) -> None:
    cluster = netns_cluster(3)
    h0, h1, h2 = cluster.hosts
    (stranger,) = netns_cluster(1).hosts
    cluster.heal()  # nothing to heal is fine
    cluster.partition([h0], [h1], [h2])
    rules = h0.run(["nft", "list", "table", "inet", "shoal_part"]).stdout
    assert h1.address in rules
    assert h2.address in rules
    with pytest.raises(ValueError, match="more than one group"):
        cluster.partition([h0, h1], [h1])
    with pytest.raises(ValueError, match="not a host of"):
        cluster.partition([h0], [stranger])
    with pytest.raises(ValueError, match="at least two groups"):
        cluster.partition([h0])
    cluster.heal()
    assert h0.run(["nft", "list", "tables"]).stdout.strip() == ""


@pytest.fixture(params=["loopback", pytest.param("netns", marks=pytest.mark.netns)])
def one_host(request: pytest.FixtureRequest) -> Host:
    factory: LoopbackClusterFactory | NetnsClusterFactory = request.getfixturevalue(
        f"{request.param}_cluster"
    )
    return factory(1).hosts[0]


def start_sleeper(host: Host) -> tuple[ClusterProcess, int]:
    proc = host.spawn([*PROBE, "sleeper"], name="sleeper")
    line = wait_until(
        lambda: next((ln for ln in proc.log_text().splitlines() if ln.startswith("ready")), None),
        timeout_s=10,
        message="sleeper ready",
    )
    return proc, int(line.split()[1])


def test_sigstop_sigcont_sigkill_reach_the_whole_process_group(one_host: Host) -> None:
    proc, child_pid = start_sleeper(one_host)
    proc.stop()
    wait_until(lambda: proc.is_stopped() and process_stopped(child_pid), timeout_s=5)
    proc.cont()
    wait_until(lambda: not proc.is_stopped() and not process_stopped(child_pid), timeout_s=5)
    assert proc.running()
    assert proc.kill() == -signal.SIGKILL
    assert not proc.running()
    wait_until(lambda: process_gone(child_pid), timeout_s=5, message="sleeper's child killed")


def test_loopback_hosts_have_own_ports_and_dirs_and_no_partitions(
    loopback_cluster: LoopbackClusterFactory,
) -> None:
    cluster = loopback_cluster(3)
    h0, h1, h2 = cluster.hosts
    assert len({h.port for h in cluster.hosts}) == 3
    assert {h.address for h in cluster.hosts} == {"127.0.0.1"}
    assert all(h.ns is None and h.data_dir.is_dir() for h in cluster.hosts)
    assert len({h.data_dir for h in cluster.hosts}) == 3
    probe = start_probe(h0, mcast=False)
    assert tcp_echo(h1, h0)
    send_udp(h2, h0, "loop")
    wait_until(lambda: "udp from 127.0.0.1: loop" in probe.log_text())
    with pytest.raises(PartitionUnsupportedError, match="netns_cluster"):
        cluster.partition([h0], [h1])
    with pytest.raises(PartitionUnsupportedError):
        cluster.partition_one_way([h0], [h1])
    with pytest.raises(PartitionUnsupportedError):
        cluster.heal()


def test_close_kills_processes_is_idempotent_and_final(
    loopback_cluster: LoopbackClusterFactory,
) -> None:
    cluster = loopback_cluster(1)
    proc, child_pid = start_sleeper(cluster.hosts[0])
    cluster.close()
    cluster.close()
    assert proc.returncode == -signal.SIGKILL
    wait_until(lambda: process_gone(child_pid), timeout_s=5)
    with pytest.raises(HarnessError, match="closed"):
        cluster.hosts[0].spawn(["true"])


@pytest.mark.netns
def test_cleanup_after_an_exception_inside_the_context_manager(tmp_path: Path) -> None:
    links_before = root_links()
    cluster = NetnsCluster(2, tmp_path)
    proc, child_pid = start_sleeper(cluster.hosts[1])

    def fail_inside() -> None:
        with cluster:
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        fail_inside()
    assert namespaces_with(cluster.prefix) == []
    assert proc.returncode == -signal.SIGKILL
    wait_until(lambda: process_gone(child_pid), timeout_s=5)
    assert root_links() == links_before


HOLDER = textwrap.dedent(
    """
    import signal, sys, time
    from pathlib import Path
    from tests.cluster import NetnsCluster
    # As in an interactive run (a background job of a script starts with SIGINT ignored).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    cluster = NetnsCluster(2, Path(sys.argv[1]))
    proc = cluster.hosts[1].spawn(["sleep", "600"])
    print(cluster.prefix, proc.pid, flush=True)
    time.sleep(600)
    """
)


@pytest.mark.netns
@pytest.mark.parametrize(
    "signum", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL], ids=lambda s: s.name
)
def test_cleanup_when_the_harness_process_is_signalled(tmp_path: Path, signum: int) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path)],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert holder.stdout is not None
    try:
        prefix, pid = holder.stdout.readline().split()
        assert len(namespaces_with(prefix)) == 3
        holder.send_signal(signum)
        assert holder.wait(timeout=20) == -signum
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    if signum == signal.SIGKILL:  # nothing ran in the holder: the next run sweeps up
        left = namespaces_with(prefix)
        assert len(left) == 3
        assert sorted(remove_stale_namespaces()) == sorted(left)
    assert namespaces_with(prefix) == []
    wait_until(lambda: process_gone(int(pid)), timeout_s=5, message="spawned process killed")


@pytest.mark.netns
def test_stale_namespaces_of_dead_runs_are_removed_and_live_ones_kept() -> None:
    finished = subprocess.Popen(["true"])
    finished.wait()
    owner = subprocess.Popen(["sleep", "600"])
    # c9999: a cluster number no real run reaches, so a reused pid cannot clash with a live run.
    stale, live = f"shl{finished.pid}c9999-h0", f"shl{owner.pid}c9999-h0"
    squatter = None
    try:
        for ns in (stale, live):
            subprocess.run(["ip", "netns", "add", ns], check=True)
        squatter = subprocess.Popen(["ip", "netns", "exec", stale, "sleep", "600"])
        wait_until(
            lambda: (
                subprocess.run(
                    ["ip", "netns", "pids", stale], capture_output=True, text=True
                ).stdout
            ),
            timeout_s=5,
        )
        removed = remove_stale_namespaces()
        assert stale in removed
        assert live not in removed
        assert squatter.wait(timeout=5) == -signal.SIGKILL
        assert stale not in list_namespaces()
        assert live in list_namespaces()
    finally:
        owner.kill()
        owner.wait()
        if squatter is not None:
            squatter.kill()
            squatter.wait()
        for ns in (stale, live):
            subprocess.run(["ip", "netns", "delete", ns], capture_output=True, check=False)


INNER_TEST = textwrap.dedent(
    """
    import sys
    from tests.cluster import wait_until

    def test_fails(loopback_cluster):
        host = loopback_cluster(1).hosts[0]
        proc = host.spawn([sys.executable, "-c", "print('da' + 'emon said hi')"])
        wait_until(lambda: "said" in proc.log_text())
        assert False, "inner failure"
    """
)


def test_a_failing_test_shows_the_tail_of_every_process_log(tmp_path: Path) -> None:
    (tmp_path / "test_inner.py").write_text(INNER_TEST)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.cluster.fixtures", "test_inner.py"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "loopback cluster 0 process logs" in result.stdout
    assert "daemon said hi" in result.stdout


NETNS_TESTS = textwrap.dedent(
    """
    import pytest

    def test_uses_the_fixture(netns_cluster):
        netns_cluster(2)

    @pytest.mark.netns
    def test_only_marked():
        pass
    """
)


def test_netns_unavailable_reason_names_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(shutil, "which", lambda _tool: None)
    reason = netns_unavailable_reason()
    assert reason is not None
    assert "uid 1000, not root" in reason
    assert "`ip` not found (install iproute2)" in reason
    assert "`nft` not found (install nftables)" in reason


@pytest.mark.parametrize("required", [False, True], ids=["skip", "required"])
def test_netns_tests_skip_with_a_reason_or_fail_when_required(
    tmp_path: Path, required: bool
) -> None:
    (tmp_path / "test_inner.py").write_text(NETNS_TESTS)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PATH": str(tmp_path / "no-tools")}
    env.pop("SHOAL_REQUIRE_NETNS", None)
    if required:
        env["SHOAL_REQUIRE_NETNS"] = "1"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-rsE", "-p", "tests.cluster.fixtures", "test_inner.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "netns tests need root and iproute2: `ip` not found" in result.stdout, result.stdout
    assert ("2 errors" if required else "2 skipped") in result.stdout, result.stdout
