"""`shoal serve` flags and `shoal dev-cluster`, run as the user runs them: real processes,
read through their HTTP API and their output."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from node.cli import app
from node.daemon import NodeDaemon
from tests.node.daemons import FAST_ELECTION, test_settings

ROOT = Path(__file__).resolve().parents[2]
START_LIVENESS_S = 60.0
STOP_LIVENESS_S = 30.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _free_ports(n: int) -> int:
    """The first of `n` consecutive ports free for TCP and UDP on loopback."""
    for _ in range(200):
        base = _free_port()
        if base + n > 65535:
            continue
        try:
            for port in range(base, base + n):
                for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
                    with socket.socket(socket.AF_INET, kind) as sock:
                        sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise AssertionError(f"no {n} consecutive free ports")


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=3) as response:
        return json.loads(response.read())


def _wait_for(what: str, probe: Callable[[], Any], *processes: subprocess.Popen[str]) -> Any:
    """Poll `probe` until it returns something truthy; fail naming `what` after the liveness
    bound (the time it took is printed), or at once with its output when a process exits."""
    started = time.monotonic()
    last: Any = None
    while time.monotonic() - started < START_LIVENESS_S:
        for process in processes:
            if process.poll() is not None:
                output = process.stdout.read() if process.stdout is not None else ""
                pytest.fail(f"{what}: {process.args} exited {process.returncode}:\n{output}")
        try:
            last = probe()
        except (OSError, urllib.error.URLError, ValueError) as exc:
            last = exc
        if last and not isinstance(last, Exception):
            print(f"{what}: {time.monotonic() - started:.2f} s")
            return last
        time.sleep(0.1)
    pytest.fail(f"{what}: not within {START_LIVENESS_S:g} s (last: {last!r})")


@contextmanager
def _process(*args: str) -> Iterator[subprocess.Popen[str]]:
    """`python -m node ARGS` with stdout and stderr merged; SIGTERM (then SIGKILL) at the end."""
    process = subprocess.Popen(
        [sys.executable, "-m", "node", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=STOP_LIVENESS_S)
            except subprocess.TimeoutExpired:
                process.kill()
        if process.stdout is not None:
            process.stdout.close()
        process.wait()


def _stop(process: subprocess.Popen[str], signum: int = signal.SIGTERM) -> str:
    process.send_signal(signum)
    output, _ = process.communicate(timeout=STOP_LIVENESS_S)
    return output


def test_serve_insecure_json_logs_and_advertise(tmp_path: Path) -> None:
    """--bind 0.0.0.0 --insecure serves (and warns), --log-format json writes one JSON object
    per line carrying the node id, --advertise is the address in /v1/status."""
    port = _free_port()
    args = ["serve", "--node-id", "a", "--data-dir", str(tmp_path / "a"), "--port", str(port)]
    args += ["--no-mdns", "--bind", "0.0.0.0", "--insecure", "--log-format", "json"]
    args += ["--advertise", "127.0.0.2"]
    with _process(*args) as process:
        status = _wait_for("status", lambda: _get(f"http://127.0.0.1:{port}/v1/status"), process)
        assert status["address"] == "127.0.0.2"
        assert status["node_id"] == "a"
        output = _stop(process)
    assert process.returncode == 0, output
    lines = [line for line in output.splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]  # every line is one JSON object
    assert {"time", "level", "logger", "node_id", "message"} <= set(records[0])
    warnings = [r for r in records if "WITHOUT authentication (--insecure)" in r["message"]]
    assert len(warnings) == 1
    assert warnings[0]["level"] == "WARNING"
    assert "0.0.0.0" in warnings[0]["message"]
    assert any(r["node_id"] == "a" for r in records)


def test_serve_voters_elect_one_coordinator_for_both(tmp_path: Path) -> None:
    """Two nodes started with --voters a,b elect one coordinator they both follow; without
    the flag each would be a one-voter cluster coordinating itself."""
    port_a, port_b = _free_port(), _free_port()
    common = ["--no-mdns", "--voters", "a,b"]
    a_args = ["serve", "--node-id", "a", "--data-dir", str(tmp_path / "a"), "--port", str(port_a)]
    b_args = ["serve", "--node-id", "b", "--data-dir", str(tmp_path / "b"), "--port", str(port_b)]
    b_args += ["--seed", f"127.0.0.1:{port_a}"]
    with _process(*a_args, *common) as a_process, _process(*b_args, *common) as b_process:

        def agreed() -> str | None:
            a = _get(f"http://127.0.0.1:{port_a}/v1/status")
            b = _get(f"http://127.0.0.1:{port_b}/v1/status")
            both = a["coordinator"] is not None and a["coordinator"] == b["coordinator"]
            return str(a["coordinator"]) if both and a["term"] == b["term"] else None

        coordinator = _wait_for("one coordinator for a and b", agreed, a_process, b_process)
        assert coordinator in ("a", "b")
        for port in (port_a, port_b):
            status = _get(f"http://127.0.0.1:{port}/v1/status")
            assert status["members"]["alive"] == 2
            assert not any("no voter set configured" in note for note in status["notes"])


def test_dev_cluster_starts_n_nodes_that_find_each_other_and_stops_them(tmp_path: Path) -> None:
    """`shoal dev-cluster --nodes 2` prints both URLs, the nodes form one cluster with one
    coordinator, and Ctrl-C (SIGINT) stops every node and exits 0."""
    base = _free_ports(2)
    data = tmp_path / "dev"
    args = ["dev-cluster", "--nodes", "2", "--base-port", str(base), "--data-dir", str(data)]
    with _process(*args) as process:
        urls = [f"http://127.0.0.1:{base + i}" for i in range(2)]

        def formed() -> bool:
            statuses = [_get(f"{url}/v1/status") for url in urls]
            coordinators = {s["coordinator"] for s in statuses}
            alive = all(s["members"]["alive"] == 2 for s in statuses)
            return alive and len(coordinators) == 1 and None not in coordinators

        try:
            _wait_for("dev cluster of 2 with one coordinator", formed, process)
        except pytest.fail.Exception as exc:
            logs = "".join(
                f"\n--- {log.name}:\n{log.read_text()[-3000:]}" for log in data.glob("*.log")
            )
            pytest.fail(f"{exc}{logs}")
        assert (data / "hosts.yaml").is_file()
        assert sorted(p.name for p in data.glob("dev-*.log")) == ["dev-1.log", "dev-2.log"]
        output = _stop(process, signal.SIGINT)
    assert process.returncode == 0, output
    for index, url in enumerate(urls, start=1):
        assert f"dev-{index}: {url}" in output
    for port in (base, base + 1):
        with socket.socket() as sock:
            sock.settimeout(1)
            with pytest.raises(ConnectionRefusedError):
                sock.connect(("127.0.0.1", port))


async def test_roles_json_prints_the_plan_document(tmp_path: Path) -> None:
    """`shoal roles --json`: the node's /v1/plan document as JSON; without --json a table."""
    settings = test_settings(tmp_path, "solo", **FAST_ELECTION)
    async with NodeDaemon(settings) as daemon:
        url = f"http://127.0.0.1:{daemon.port}"
        await asyncio.to_thread(_wait_for, "a plan", lambda: _get(f"{url}/v1/plan")["plan"])
        runner = CliRunner()
        result = await asyncio.to_thread(runner.invoke, app, ["roles", "--node", url, "--json"])
        assert result.exit_code == 0, result.output
        document = json.loads(result.output)
        assert document["type"] == "plan_announce"
        assert document["coordinator"] == "solo"
        assert list(document["plan"]["roles"]) == ["solo"]
        table = await asyncio.to_thread(runner.invoke, app, ["roles", "--node", url])
        assert table.exit_code == 0, table.output
        assert "by solo" in table.output
        with pytest.raises(ValueError, match="Expecting value"):
            json.loads(table.output)
