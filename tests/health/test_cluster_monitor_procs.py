"""cluster_monitor against daemons in their own processes: SIGKILL one, and --watch in tmux."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from health import ClusterMonitor, ClusterStatus
from tests.cluster.cluster import LoopbackCluster
from tests.cluster.fixtures import LoopbackClusterFactory
from tests.cluster.process import ClusterProcess
from tests.cluster.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
FAST_CONFIG = """\
cluster_name: {name}
timeouts:
  probe_interval_s: 0.1
  probe_timeout_s: 0.05
  indirect_probe_timeout_s: 0.1
  suspicion_s: 0.3
"""


def _start(cluster: LoopbackCluster) -> list[ClusterProcess]:
    """One `shoal serve` per host, each seeded with the first, with shrunk timeouts."""
    config = cluster.base_dir / "fast.yaml"
    config.write_text(FAST_CONFIG.format(name=f"mon{os.getpid()}"))
    seed = cluster.hosts[0].endpoint
    processes = []
    for index, host in enumerate(cluster.hosts):
        argv = [
            sys.executable, "-m", "node", "serve", "--node-id", host.name,
            "--port", str(host.port), "--data-dir", str(host.data_dir), "--no-mdns",
        ]  # fmt: skip
        if index:
            argv += ["--seed", seed]
        env = {"SHOAL_CONFIG": str(config)}
        processes.append(host.spawn(argv, env=env, cwd=ROOT, name="shoal"))
    return processes


def _status(url: str) -> ClusterStatus:
    async def ask() -> ClusterStatus:
        async with ClusterMonitor(nodes=[url], timeout_s=1.0) as monitor:
            return await monitor.get_cluster_status()

    return asyncio.run(ask())


def _when(url: str, ready: Callable[[ClusterStatus], bool]) -> Callable[[], ClusterStatus | None]:
    def probe() -> ClusterStatus | None:
        status = _status(url)
        return status if ready(status) else None

    return probe


def _all_alive(n: int) -> Callable[[ClusterStatus], bool]:
    return lambda status: len(status.nodes) == n and status.ok


def _row_state(status: ClusterStatus, node_id: str) -> str | None:
    row = status.node(node_id)
    return None if row is None else row.state


MONITOR_REPORTING_MODULES = (
    "import json, sys\n"
    "from health.cluster_monitor import main\n"
    "code = main(sys.argv[1:])\n"
    "sys.stderr.write('\\nMODULES ' + json.dumps(sorted(sys.modules)) + '\\n')\n"
    "sys.exit(code)\n"
)
"""`cluster_monitor ARGS...`, then the modules it loaded on stderr after `MODULES `."""


def test_a_killed_node_is_dead_in_the_json_and_exit_is_1(
    loopback_cluster: LoopbackClusterFactory,
) -> None:
    cluster = loopback_cluster(3)
    processes = _start(cluster)
    url = f"http://{cluster.hosts[0].endpoint}"
    wait_until(_when(url, _all_alive(3)), timeout_s=20, message="3 nodes alive")
    processes[2].kill()
    wait_until(
        _when(url, lambda status: _row_state(status, "h2") == "dead"),
        timeout_s=10,
        message="h2 dead in the views",
    )
    result = subprocess.run(
        [sys.executable, "-c", MONITOR_REPORTING_MODULES, "--node", url, "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=30,
        env={**os.environ, "SHOAL_CONFIG": ""},
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    # one status asks over urllib in threads: aiohttp (~1 G instructions to import) stays out
    modules = json.loads(result.stderr[result.stderr.rindex("\nMODULES ") + 9 :])
    assert [m for m in modules if m == "aiohttp" or m.startswith("aiohttp.")] == []
    nodes = {node["node_id"]: node for node in json.loads(result.stdout)["nodes"]}
    assert sorted(nodes) == ["h0", "h1", "h2"]
    assert nodes["h2"]["state"] == "dead"
    assert nodes["h2"]["error"] == "unreachable: connection refused"
    assert nodes["h2"]["port"] == cluster.hosts[2].port
    assert [nodes[n]["state"] for n in ("h0", "h1")] == ["alive", "alive"]
    assert all(nodes[n]["health"] == "healthy" for n in ("h0", "h1"))


class Tmux:
    """One tmux server on its own socket (-L), killed on close."""

    def __init__(self) -> None:
        self.socket = f"shoal-monitor-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.last_screen = ""

    def run(self, *args: str) -> str:
        # An explicit environment: the pane must size itself from tmux, not from a COLUMNS or
        # LINES that the test process may carry.
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
        result = subprocess.run(
            ["tmux", "-L", self.socket, *args], capture_output=True, text=True, timeout=10, env=env
        )
        if result.returncode != 0:
            raise OSError(f"tmux {shlex.join(args)}: {result.stderr.strip()}")
        return result.stdout

    def screen(self) -> str:
        self.last_screen = self.run("capture-pane", "-p", "-t", "monitor")
        return self.last_screen

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=10)


@pytest.fixture
def tmux() -> Iterator[Tmux]:
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed")
    server = Tmux()
    try:
        yield server
    finally:
        server.close()


def _wait_screen(tmux: Tmux, shows: Callable[[str], bool], what: str, timeout_s: float) -> str:
    """The pane's text once `shows(text)`; fails with the last screen after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        screen = tmux.screen()
        if shows(screen):
            return screen
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:g} s waiting for {what}; screen:\n{screen}")
        time.sleep(0.05)


def _row(screen: str, node_id: str) -> str:
    return next((line for line in screen.splitlines() if line.startswith(node_id + " ")), "")


def test_watch_in_tmux_redraws_when_a_node_dies_and_q_quits(
    loopback_cluster: LoopbackClusterFactory, tmux: Tmux, tmp_path: Path
) -> None:
    cluster = loopback_cluster(3)
    processes = _start(cluster)
    url = f"http://{cluster.hosts[0].endpoint}"
    wait_until(_when(url, _all_alive(3)), timeout_s=20, message="3 nodes alive")
    script = tmp_path / "watch.sh"
    script.write_text(
        f"cd {shlex.quote(str(ROOT))}\nunset COLUMNS LINES\n"
        f"SHOAL_CONFIG= {shlex.quote(sys.executable)} -m health.cluster_monitor "
        f"--node {url} --watch --interval 0.2\n"
        'echo "EXIT=$?"\n'
        "stty -a | tr ' ;' '\\n\\n' | grep -x -e icanon -e -icanon | sed 's/^/MODE=/'\n"
        "sleep 60\n"
    )
    tmux.run("new-session", "-d", "-x", "160", "-y", "50", "-s", "monitor", f"sh {script}")

    def rows_alive(screen: str) -> bool:
        # the coordinator's row carries a `*` after its name: not a column of its own
        rows = [_row(screen, name).replace(" * ", " ", 1) for name in ("h0", "h1", "h2")]
        states = [row.split()[3:4] for row in rows]
        return states == [["alive"]] * 3

    screen = _wait_screen(tmux, rows_alive, "3 alive nodes", 15)
    assert "q or Ctrl-C quits" in screen
    processes[2].kill()
    screen = _wait_screen(tmux, lambda s: " dead " in _row(s, "h2"), "h2 dead", 15)
    assert "unreachable: connection refused" in _row(screen, "h2")
    assert "nodes 2/3 alive" in screen
    assert "h2 unreachable" in screen or "h2 died" in screen  # recent failures
    assert sum(1 for line in screen.splitlines() if line.startswith("node ")) == 1  # in place
    tmux.run("send-keys", "-t", "monitor", "q")
    screen = _wait_screen(tmux, lambda s: "MODE=" in s, "the monitor to exit on q", 10)
    assert "EXIT=0" in screen
    assert "MODE=icanon" in screen  # cbreak mode undone
    assert "Traceback" not in screen
